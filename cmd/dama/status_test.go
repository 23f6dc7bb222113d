package main

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/dama-etl/dama/internal/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

func TestHumanDurations(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second:                     "0s",
		0:                                "0s",
		999 * time.Millisecond:           "0s",
		45 * time.Second:                 "45s",
		12*time.Minute + 5*time.Second:   "12m5s",
		3*time.Hour + 12*time.Minute + 9: "3h12m",
		51*time.Hour + 59*time.Minute:    "2d3h",
	} {
		if got := human(d); got != want {
			t.Errorf("human(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestLocalTimes(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 15, 4, 5, 0, time.Local)
	if got := localTime(now.Add(-time.Hour).UTC(), now); got != "14:04:05" {
		t.Errorf("an hour ago: %q, want the local time of day", got)
	}
	if got := localTime(now.AddDate(0, 0, -1).UTC(), now); got != "2026-11-24 15:04:05" {
		t.Errorf("a day ago: %q, want the local date and time", got)
	}
}

// etaRE is the time a running task's progress says it has left.
var etaRE = regexp.MustCompile(`\d+% \d+/\d+ ETA (?:(\d+)m)?(\d+)s`)

// dama status draws a task's progress as a bar with its percentage and,
// while it runs, the time it has left at its pace, and how long it has
// run; once it is DONE, the whole bar and how long it took.
func TestStatusDrawsProgressAndTimeLeft(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(terminalConfig)
	env.Start(cfg, "supervisor")
	w := &world{Env: env, cfg: cfg}
	// 100 steps of 150ms: 15 s in all.
	id := testenv.Atoi(t, env.Dama(cfg, "submit", "sample", "--args", sampleArgs(t, 100, 150, nil)).Stdout)
	w.waitFor(id, 30*time.Second, "to report progress over two seconds", func(t etlcontext.Task) bool {
		p, ok := etlcontext.ParseProgress(t.Progress)
		return ok && p.Fraction >= 0.15 && p.Fraction < 0.6
	})
	var row string
	testenv.Eventually(t, 10*time.Second, "dama status to show the time left", func() (bool, error) {
		row = lineWith(env.Dama(cfg, "status", strconv.FormatInt(id, 10)).Stdout, "RUNNING")
		return etaRE.MatchString(row), nil
	})
	// Its steps sleep 150ms each: at its pace, even on a slow machine,
	// what is left takes seconds, not minutes.
	m := etaRE.FindStringSubmatch(row)
	minutes, _ := strconv.Atoi(m[1])
	seconds, _ := strconv.Atoi(m[2])
	if left := 60*minutes + seconds; left < 1 || left > 120 {
		t.Errorf("a task with 15 s of work, part done: %ds left in %q, want 1 to 120", left, row)
	}
	if !regexp.MustCompile(`\s(\d+m)?\d+s\s+sample:`).MatchString(row) || !regexp.MustCompile(`\[#+\.+\]`).MatchString(row) {
		t.Errorf("the running task's row %q: want how long it has run, in seconds, and a bar", row)
	}
	w.waitSettled(id, time.Minute)
	row = lineWith(env.Dama(cfg, "status", strconv.FormatInt(id, 10)).Stdout, "DONE")
	if !regexp.MustCompile(`\s(1[5-9]s|[2-5]\ds|\d+m\d+s)\s+sample:FINAL \d\d:\d\d:\d\d\s+\[#{20}\] 100% 100/100$`).MatchString(row) {
		t.Errorf("the finished task's row %q: want it took 15 s or more, its FINAL's local time, a full bar, and no time left", row)
	}
}
