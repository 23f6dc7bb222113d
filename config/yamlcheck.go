package config

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// explainYAML returns the error of decoding the configuration data into
// a Config, err, in the configuration's words where checkNode finds them.
func explainYAML(data []byte, err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("the configuration is empty: want settings, as log_dir: /var/lib/dama/logs")
	}
	var doc yaml.Node
	if serr := yaml.Unmarshal(data, &doc); serr != nil {
		msg, _ := strings.CutPrefix(serr.Error(), "yaml: ")
		return fmt.Errorf("not YAML: %s", msg)
	}
	if cerr := checkNode(&doc, reflect.TypeFor[Config](), ""); cerr != nil {
		return cerr
	}
	msg, _ := strings.CutPrefix(err.Error(), "yaml: unmarshal errors:\n  ")
	msg, _ = strings.CutPrefix(msg, "yaml: ")
	return errors.New(strings.ReplaceAll(msg, "\n  ", "; "))
}

// checkNode returns where the YAML node n does not fit t, the Go type it
// is decoded into, in the configuration's words: the line, the setting's
// path (kinds.load.command) and the form it takes. yaml's own errors name
// Go types (field max_runing not found in type config.Queue).
func checkNode(n *yaml.Node, t reflect.Type, path string) error {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		return checkNode(n.Content[0], t, path)
	}
	if n.Kind == yaml.AliasNode {
		// Not followed: aliases of aliases grow exponentially, which the
		// decoder refuses (and then says so) and a walk would not.
		return nil
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if reflect.PointerTo(t).Implements(reflect.TypeFor[yaml.Unmarshaler]()) {
		err := n.Decode(reflect.New(t).Interface())
		if err == nil {
			return nil
		}
		msg, _ := strings.CutPrefix(err.Error(), fmt.Sprintf("line %d: ", n.Line))
		return fmt.Errorf("line %d: %s: %s", n.Line, path, msg)
	}
	if t.Kind() == reflect.Pointer {
		return checkNode(n, t.Elem(), path)
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return wrongForm(n, path, "settings, as {name: value}")
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, value := n.Content[i], n.Content[i+1]
			if key.Kind != yaml.ScalarNode {
				return wrongForm(key, path, "a setting's name")
			}
			if key.Tag == "!!merge" {
				// <<: *defaults, whose settings the decoder checks.
				continue
			}
			field, ok := fieldOf(t, key.Value)
			if !ok {
				return unknownKey(key, t, path)
			}
			if err := checkNode(value, field.Type, join(path, key.Value)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return wrongForm(n, path, "names, each with its settings, as {name: {...}}")
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if key := n.Content[i]; key.Kind != yaml.ScalarNode {
				return wrongForm(key, path, "a name")
			}
			if err := checkNode(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return wrongForm(n, path, "a list, as "+exampleList(path, t.Elem()))
		}
		for i, item := range n.Content {
			if err := checkNode(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			return wrongForm(n, path, "a string")
		}
	case reflect.Int, reflect.Int64, reflect.Bool:
		// What the decoder takes (yes for true, 0x10 for 16) passes.
		if n.Kind != yaml.ScalarNode || n.Decode(reflect.New(t).Interface()) != nil {
			if t.Kind() == reflect.Bool {
				return wrongForm(n, path, "true or false")
			}
			return wrongForm(n, path, "a whole number")
		}
	}
	return nil
}

// fieldOf returns t's field that the YAML key name sets.
func fieldOf(t reflect.Type, name string) (reflect.StructField, bool) {
	for f := range t.Fields() {
		if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); f.IsExported() && tag == name && tag != "-" {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func unknownKey(key *yaml.Node, t reflect.Type, path string) error {
	best, bestDist := "", 3
	for f := range t.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		if d := editDistance(key.Value, tag); d < bestDist {
			best, bestDist = tag, d
		}
	}
	err := fmt.Sprintf("line %d: %s is not a setting", key.Line, join(path, key.Value))
	if best != "" {
		err += fmt.Sprintf(" (did you mean %s?)", join(path, best))
	}
	return errors.New(err)
}

func wrongForm(n *yaml.Node, path, want string) error {
	got := "a list"
	switch n.Kind {
	case yaml.MappingNode:
		got = "a mapping"
	case yaml.ScalarNode:
		got = strconv.Quote(truncate(n.Value, 40))
	}
	if path == "" {
		return fmt.Errorf("line %d: the configuration is %s: want settings, as log_dir: /var/lib/dama/logs", n.Line, got)
	}
	return fmt.Errorf("line %d: %s: want %s, not %s", n.Line, path, want, got)
}

func exampleList(path string, elem reflect.Type) string {
	switch {
	case elem.Kind() == reflect.Int:
		return "[1, 2]"
	case strings.HasSuffix(path, ".command"):
		return `["/opt/etl/tool", "--verbose"]`
	}
	return "[A, B]"
}

// join appends key to path, quoted unless it is a plain name.
func join(path, key string) string {
	if strings.TrimLeft(key, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "" || key == "" {
		key = strconv.Quote(key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "..."
	}
	return s
}

// editDistance is the Levenshtein distance of a and b, in bytes: a
// misspelt setting is suggested its nearest name.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
