package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.yaml.in/yaml/v3"
)

// Load reads the configuration file at path and returns it with its
// defaults applied and validated (Parse), its Path set, and a relative
// LogDir made relative to the file.
func Load(path string) (*Config, error) {
	if path == "" {
		return nil, errors.New("no configuration file: pass --config or set DAMA_CONFIG (dama init writes a starter ./dama.yaml)")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("resolve configuration path %s: %w", path, err)
	}
	data, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("read configuration: %w", err)
	}
	return LoadData(abs, data)
}

// LoadData is Load of the file at path, whose bytes the caller read:
// data.
func LoadData(path string, data []byte) (*Config, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("resolve configuration path %s: %w", path, err)
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
// written as Go durations ("5s", "1m30s") or a bare 0 (Duration).
func Parse(data []byte) (*Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return nil, explainYAML(data, err)
	}
	out := cfg.WithDefaults()
	if err := out.Validate(); err != nil {
		return nil, err
	}
	return out, nil
}
