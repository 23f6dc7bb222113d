package scalebench_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/config"
)

// params are the benchmark's settings, from the environment (scripts/bench.sh
// scale sets the first two from its arguments).
type params struct {
	sizes []int             // DAMA_BENCH_SIZES: "50,500" (0: the idle cost)
	modes []config.LockMode // DAMA_BENCH_MODES: "row,advisory"
	// window is how long the steady state is measured (DAMA_BENCH_WINDOW,
	// 60s), after settle (DAMA_BENCH_SETTLE, 15s: at least 11s, so that
	// the bench's own connections' statistics, which an idle backend
	// reports within 10s, are in before the window opens).
	window, settle time.Duration
	// probes is how many submit→lock samples are taken at 0 and at N
	// running (DAMA_BENCH_PROBES, 40); floorSamples, of each floor
	// (DAMA_BENCH_FLOOR_SAMPLES, 100).
	probes, floorSamples int
	// adoptWait bounds the wait for the new supervisor to adopt the tasks
	// after the old one was SIGKILLed (DAMA_BENCH_ADOPT_WAIT): by default the
	// rescue grace of a dead supervisor's steps, max(2 x poll_interval, 10s),
	// plus two poll intervals (docs/architecture.md: a dead supervisor's step is rescued
	// within that) plus 5s.
	adoptWait time.Duration
	// startDeadline bounds the wait for all N to hold their lock
	// (DAMA_BENCH_START_DEADLINE, 10m).
	startDeadline time.Duration
}

func loadParams() (params, error) {
	poll := time.Duration(config.DefaultPollInterval)
	p := params{
		window: 60 * time.Second, settle: 15 * time.Second,
		probes: 40, floorSamples: 100,
		adoptWait:     max(2*poll, 10*time.Second) + 2*poll + 5*time.Second,
		startDeadline: 10 * time.Minute,
	}
	for _, s := range strings.Split(envOr("DAMA_BENCH_SIZES", "50,500"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			return p, fmt.Errorf("DAMA_BENCH_SIZES: %q is not a number of tasks", s)
		}
		p.sizes = append(p.sizes, n)
	}
	for _, s := range strings.Split(envOr("DAMA_BENCH_MODES", "row,advisory"), ",") {
		m := config.LockMode(strings.TrimSpace(s))
		if !m.Valid() {
			return p, fmt.Errorf("DAMA_BENCH_MODES: %q is not a lock mode (row, advisory, host)", s)
		}
		p.modes = append(p.modes, m)
	}
	for name, d := range map[string]*time.Duration{
		"DAMA_BENCH_WINDOW": &p.window, "DAMA_BENCH_SETTLE": &p.settle,
		"DAMA_BENCH_ADOPT_WAIT": &p.adoptWait, "DAMA_BENCH_START_DEADLINE": &p.startDeadline,
	} {
		if v := os.Getenv(name); v != "" {
			parsed, err := time.ParseDuration(v)
			if err != nil || parsed <= 0 {
				return p, fmt.Errorf("%s: %q is not a positive duration", name, v)
			}
			*d = parsed
		}
	}
	for name, n := range map[string]*int{"DAMA_BENCH_PROBES": &p.probes, "DAMA_BENCH_FLOOR_SAMPLES": &p.floorSamples} {
		if v := os.Getenv(name); v != "" {
			parsed, err := strconv.Atoi(v)
			if err != nil || parsed < 1 {
				return p, fmt.Errorf("%s: %q is not a positive number", name, v)
			}
			*n = parsed
		}
	}
	return p, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// helpers are the benchmark's own binaries.
type helpers struct{ quiet, floor, hostinit string }

func buildHelpers(tb testing.TB) helpers {
	dir := tb.TempDir()
	h := helpers{quiet: filepath.Join(dir, "quiet"), floor: filepath.Join(dir, "floor"), hostinit: filepath.Join(dir, "hostinit")}
	for _, bin := range []string{h.quiet, h.floor, h.hostinit} {
		cmd := exec.Command("go", "build", "-o", bin, "./"+filepath.Base(bin))
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("build %s: %v\n%s", filepath.Base(bin), err, out)
		}
	}
	return h
}
