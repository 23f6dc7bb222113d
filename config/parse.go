package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Load reads the configuration file at path and returns it with its
// defaults applied and validated (Parse), its Path set, and a relative
// LogDir made relative to the file.
func Load(path string) (*Config, error) {
	if path == "" {
		return nil, errors.New("no configuration file: pass --config or set DAMA_CONFIG")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("resolve configuration path %s: %w", path, err)
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("read configuration: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("configuration %s: %w", abs, err)
	}
	cfg.Path = abs
	if !filepath.IsAbs(cfg.LogDir) {
		cfg.LogDir = filepath.Join(filepath.Dir(abs), cfg.LogDir)
	}
	return cfg, nil
}

// Parse decodes a configuration document, applies its defaults
// (WithDefaults) and validates it (Validate). Unknown fields are errors,
// so that a misspelt setting is not silently ignored; durations are
// written as Go durations ("5s", "1m30s").
func Parse(data []byte) (*Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(unitZeroDurations(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("parse YAML: %w", err)
	}
	out := cfg.WithDefaults()
	if err := out.Validate(); err != nil {
		return nil, err
	}
	return out, nil
}

// The settings that hold durations, by where they are: at the top, in a
// kind, in a kind's retry policy.
var (
	topDurations   = []string{"poll_interval", "heartbeat_interval", "kill_grace", "reconnect_grace", "progress_interval", "log_tail_interval", "retention"}
	kindDurations  = []string{"kill_grace", "timeout"}
	retryDurations = []string{"delay", "max_delay"}
)

// unitZeroDurations returns data with every duration written as a bare
// zero ("kill_grace: 0"), which YAML reads as an integer and so would not
// decode into a time.Duration, written "0s" instead, as dama always read
// it. Nothing else changes, so an error's line and column stay those of
// the file; data YAML cannot read is returned as it is, for the decoder to
// report.
func unitZeroDurations(data []byte) []byte {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return data
	}
	var zeros []*yaml.Node
	find := func(m *yaml.Node, keys []string) {
		for _, k := range keys {
			if v := mappingValue(m, k); v != nil && v.Kind == yaml.ScalarNode && v.Tag == "!!int" &&
				(v.Value == "0" || v.Value == "+0" || v.Value == "-0") {
				zeros = append(zeros, v)
			}
		}
	}
	top := doc.Content[0]
	find(top, topDurations)
	if kinds := mappingValue(top, "kinds"); kinds != nil && kinds.Kind == yaml.MappingNode {
		for i := 1; i < len(kinds.Content); i += 2 {
			k := kinds.Content[i]
			find(k, kindDurations)
			find(mappingValue(k, "retry"), retryDurations)
		}
	}
	if len(zeros) == 0 {
		return data
	}
	lines := strings.SplitAfter(string(data), "\n")
	// From the last, so that a patch leaves the columns of those before it
	// on the same line as they were.
	slices.SortFunc(zeros, func(a, b *yaml.Node) int {
		return cmp.Or(cmp.Compare(b.Line, a.Line), cmp.Compare(b.Column, a.Column))
	})
	for _, z := range zeros {
		if z.Line < 1 || z.Line > len(lines) {
			continue
		}
		line := lines[z.Line-1]
		// Columns count characters from 1.
		at := len(line)
		if runes := []rune(line); z.Column-1 <= len(runes) {
			at = len(string(runes[:z.Column-1]))
		}
		if end := at + len(z.Value); strings.HasPrefix(line[at:], z.Value) {
			lines[z.Line-1] = line[:end] + "s" + line[end:]
		}
	}
	return []byte(strings.Join(lines, ""))
}

// mappingValue is the value of key in mapping m, nil when there is none.
func mappingValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}
