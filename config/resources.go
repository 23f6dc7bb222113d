package config

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Resources bound what each attempt of a host kind may use: its command
// and every process it starts run in a control group of their own, under
// cgroup_parent, so that a runaway attempt is stopped by the kernel before
// it starves its host (docs/configuration.md "Resources"). A zero field is
// no bound.
type Resources struct {
	// Memory bounds the attempt's memory (RSS and page cache), as 512MiB,
	// 2GiB or a number of bytes: past it the kernel kills a process of
	// the attempt, and the attempt says "out of memory". At least 4MiB.
	Memory ByteSize `yaml:"memory" json:"memory,omitempty"`
	// CPU bounds the attempt's CPU time, in CPUs: 1.5 is a core and a half
	// of every second. At least 0.01.
	CPU float64 `yaml:"cpu" json:"cpu,omitempty"`
	// Pids bounds the attempt's processes and threads at once: a fork past
	// it fails. At least 2.
	Pids int64 `yaml:"pids" json:"pids,omitempty"`
}

// IsZero reports whether r bounds nothing.
func (r Resources) IsZero() bool { return r == Resources{} }

func (r Resources) validate() error {
	switch {
	case r.Memory != 0 && r.Memory < 4<<20:
		return fmt.Errorf("resources.memory %s: at least 4MiB", r.Memory)
	case !(r.CPU >= 0) || (r.CPU > 0 && r.CPU < 0.01):
		return fmt.Errorf("resources.cpu %g: at least 0.01 (a hundredth of a CPU)", r.CPU)
	case r.CPU > 1<<16:
		return fmt.Errorf("resources.cpu %g: at most %d", r.CPU, 1<<16)
	case r.Pids < 0 || r.Pids == 1:
		// On cgroup v1 the thread that forks the command passes through
		// its group: the fork needs a second.
		return fmt.Errorf("resources.pids %d: at least 2", r.Pids)
	}
	return nil
}

// ByteSize is a number of bytes. A configuration file writes it as a
// number of bytes or with a binary unit: 512MiB, 2GiB, 1.5TiB.
type ByteSize int64

var (
	byteSizeRE    = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?) ?(B|KiB|MiB|GiB|TiB)?$`)
	byteSizeUnits = []string{"B", "KiB", "MiB", "GiB", "TiB"}
)

// ParseByteSize reads s as a ByteSize's configuration does.
func ParseByteSize(s string) (ByteSize, error) {
	m := byteSizeRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("%q is not a size: write one as 512MiB, 2GiB or a number of bytes", s)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	v *= float64(int64(1) << (10 * max(slices.Index(byteSizeUnits, m[2]), 0)))
	if err != nil || v >= 1<<62 {
		return 0, fmt.Errorf("%q: at most 4096PiB", s)
	}
	return ByteSize(v), nil
}

// String writes b with the largest binary unit that keeps it within a
// tenth: "2GiB", "1.5GiB", "4096B".
func (b ByteSize) String() string {
	v, unit := float64(b), 0
	for unit < len(byteSizeUnits)-1 && v >= 1024 {
		v /= 1024
		unit++
	}
	return strings.TrimSuffix(strconv.FormatFloat(v, 'f', 1, 64), ".0") + byteSizeUnits[unit]
}

// UnmarshalYAML reads a size as ParseByteSize does, or a number of bytes.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if n.Kind != yaml.ScalarNode || n.Decode(&s) != nil {
		return fmt.Errorf("line %d: want a size, as 512MiB or 2GiB", n.Line)
	}
	v, err := ParseByteSize(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = v
	return nil
}

// MarshalYAML writes b as ParseByteSize reads it.
func (b ByteSize) MarshalYAML() (any, error) { return int64(b), nil }
