package config

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"go.yaml.in/yaml/v3"
)

// Overlap says what a periodic kind's tick does while an earlier task of
// the kind has not finished.
type Overlap string

// The overlaps.
const (
	// OverlapSkip, the default, submits no task while one of the kind is
	// queued, running or retrying.
	OverlapSkip Overlap = "skip"
	// OverlapQueue submits the tick's task, which starts once the earlier
	// ones have finished: the kind's max_running is 1.
	OverlapQueue Overlap = "queue"
	// OverlapAllow submits the tick's task, which may run beside the
	// earlier ones (within max_running).
	OverlapAllow Overlap = "allow"
)

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Schedule is a parsed cron schedule in its time zone.
type Schedule struct {
	spec cron.Schedule
	loc  *time.Location
	// Spec and Zone are the expression and time zone as written.
	Spec string
	Zone string
}

// maxTickGap bounds the backwards search for a missed tick: cron gives up
// finding a tick past five years too.
const maxTickGap = 5 * 366 * 24 * time.Hour

// ParseSchedule parses a cron expression ("*/15 * * * *", five fields from
// the minute or six from the second, or a descriptor such as "@daily"; not
// "@every") in the named time zone ("" means UTC).
func ParseSchedule(spec, zone string) (*Schedule, error) {
	if zone == "" {
		zone = "UTC"
	}
	if zone == "Local" {
		// time.LoadLocation reads "Local" as the host's own zone, on which
		// supervisors on different hosts need not agree.
		return nil, fmt.Errorf("timezone %q: want an IANA name such as Europe/Paris, not the host's zone", zone)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("timezone %q: %w", zone, err)
	}
	if strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=") {
		return nil, fmt.Errorf("schedule %q: set the time zone with timezone, not in the expression", spec)
	}
	if strings.HasPrefix(strings.TrimSpace(spec), "@every") {
		// An interval has no ticks on the clock, so supervisors that start
		// at different times could not agree on them.
		return nil, fmt.Errorf("schedule %q: @every is not supported; write the interval as a cron expression", spec)
	}
	s, err := cronParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", spec, err)
	}
	return &Schedule{spec: s, loc: loc, Spec: spec, Zone: zone}, nil
}

// Next returns the first tick after t (zero if none within five years).
func (s *Schedule) Next(t time.Time) time.Time { return s.spec.Next(t.In(s.loc)) }

// Latest returns the last tick in (after, now], or zero when there is none:
// when several ticks were missed, only the last is returned.
func (s *Schedule) Latest(after, now time.Time) time.Time {
	first := s.Next(after)
	if first.IsZero() || first.After(now) {
		return time.Time{}
	}
	// Find a window (now-w, now] holding a tick, doubling w, then walk it.
	from := after
	for w := time.Second; w < maxTickGap; w *= 2 {
		start := now.Add(-w)
		if !start.After(after) {
			break
		}
		// A zero Next says no tick within five years of start, not one
		// in the window: the last tick may come before start.
		if n := s.Next(start); !n.IsZero() && !n.After(now) {
			from = start
			break
		}
	}
	var last time.Time
	for t := s.Next(from); !t.IsZero() && !t.After(now); t = s.Next(t) {
		last = t
	}
	return last
}

// ScheduleOf returns kind k's parsed schedule, nil when it has none.
func (k Kind) ScheduleOf() (*Schedule, error) {
	if k.Schedule == "" {
		return nil, nil
	}
	return ParseSchedule(k.Schedule, k.Timezone)
}

// JSONObject is a JSON object written as a YAML mapping.
type JSONObject json.RawMessage

// MarshalJSON returns o's JSON text.
func (o JSONObject) MarshalJSON() ([]byte, error) { return json.RawMessage(o).MarshalJSON() }

// UnmarshalYAML converts a YAML mapping to its JSON text.
func (o *JSONObject) UnmarshalYAML(node *yaml.Node) error {
	var v map[string]any
	if node.Kind != yaml.MappingNode || node.Decode(&v) != nil {
		// yaml's error names Go's types: a key that is a list or a
		// mapping cannot be a JSON object's.
		return fmt.Errorf("line %d: want a mapping of names to values, as {region: eu}", node.Line)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("line %d: not representable as JSON: %w", node.Line, err)
	}
	*o = b
	return nil
}
