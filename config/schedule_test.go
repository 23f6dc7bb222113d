package config_test

import (
	"testing"
	"time"

	"github.com/dama-etl/dama/config"
)

func TestScheduleDefaultsAndArgs(t *testing.T) {
	cfg, err := config.Parse([]byte(`
log_dir: /l
kinds:
  nightly:
    command: [x]
    schedule: "30 2 * * *"
    timezone: Europe/Paris
    schedule_args: {region: eu, full: true}
    concurrency_key: region
  serial:
    command: [x]
    schedule: "*/5 * * * * *"
    overlap: queue
`))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := cfg.Kind("nightly")
	if n.Overlap != config.OverlapSkip || string(n.ScheduleArgs) != `{"full":true,"region":"eu"}` {
		t.Errorf("nightly: overlap %q, args %s", n.Overlap, n.ScheduleArgs)
	}
	s, _ := cfg.Kind("serial")
	if s.MaxRunning != 1 || string(s.ScheduleArgs) != "{}" {
		t.Errorf("serial: max_running %d, args %s", s.MaxRunning, s.ScheduleArgs)
	}
}

func TestScheduleTicks(t *testing.T) {
	s, err := config.ParseSchedule("30 2 * * *", "Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	at := func(v string) time.Time {
		t.Helper()
		ts, err := time.Parse(time.RFC3339, v)
		if err != nil {
			t.Fatal(err)
		}
		return ts
	}
	// 02:30 in Paris is 01:30 UTC in winter.
	if got, want := s.Next(at("2026-11-22T00:00:00Z")), at("2026-11-22T01:30:00Z"); !got.Equal(want) {
		t.Errorf("Next = %v, want %v", got, want)
	}
	cases := []struct{ after, now, want string }{
		// Three ticks missed: only the last.
		{"2026-11-19T01:30:00Z", "2026-11-22T09:00:00Z", "2026-11-22T01:30:00Z"},
		// The tick itself is in (after, now].
		{"2026-11-21T01:30:00Z", "2026-11-22T01:30:00Z", "2026-11-22T01:30:00Z"},
		// None since.
		{"2026-11-22T01:30:00Z", "2026-11-22T09:00:00Z", ""},
		// A year missed.
		{"2025-11-01T00:00:00Z", "2026-11-22T09:00:00Z", "2026-11-22T01:30:00Z"},
	}
	for _, c := range cases {
		got := s.Latest(at(c.after), at(c.now))
		if c.want == "" {
			if !got.IsZero() {
				t.Errorf("Latest(%s, %s) = %v, want none", c.after, c.now, got)
			}
			continue
		}
		if !got.Equal(at(c.want)) {
			t.Errorf("Latest(%s, %s) = %v, want %s", c.after, c.now, got, c.want)
		}
	}
	secs, err := config.ParseSchedule("*/2 * * * * *", "")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := secs.Latest(at("2026-01-01T00:00:00Z"), at("2026-11-22T10:00:03Z")), at("2026-11-22T10:00:02Z"); !got.Equal(want) {
		t.Errorf("seconds: Latest = %v, want %v", got, want)
	}
}
