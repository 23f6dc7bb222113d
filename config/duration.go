package config

import (
	"encoding/json"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a setting's length of time. A configuration file writes it
// as Go writes a duration ("90s", "1h30m"), or as a bare 0; a program
// converts it, config.Duration(90*time.Second), time.Duration(d).
type Duration time.Duration

// String writes d as Go writes a duration ("1h30m0s").
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML reads a duration with its unit, or a bare 0, which YAML
// reads as an integer and so would not decode as a time.Duration does.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		if n.Value == "0" || n.Value == "+0" || n.Value == "-0" {
			*d = 0
			return nil
		}
		return fmt.Errorf("line %d: %s has no unit: write a duration as 90s, 5m or 1h30m", n.Line, n.Value)
	}
	var s string
	if n.Kind != yaml.ScalarNode || n.Decode(&s) != nil {
		return fmt.Errorf("line %d: want a duration, as 90s, 5m or 1h30m", n.Line)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration: write one as 90s, 5m or 1h30m", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d as Go writes a duration, which UnmarshalYAML reads.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// MarshalJSON writes d as a string, as Go writes a duration.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }
