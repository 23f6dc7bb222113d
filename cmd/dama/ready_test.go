package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/internal/testenv"
)

// TestReadyOnlyOnceTheSupervisorWorks: dama ready, a container's readiness
// probe, exits 0 only once the supervisor at the address holds its
// liveness lock, listens and fetches: not while it waits for its database,
// though it serves its metrics then, nor where no supervisor listens.
func TestReadyOnlyOnceTheSupervisorWorks(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(metricsConfig)
	addrOf := func(p *testenv.Proc) string {
		url := metricsURLRE.FindString(waitForLog(t, p, "serving metrics"))
		return strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/metrics")
	}
	oneLine := func(res testenv.Result, want string) {
		t.Helper()
		if res.Code != 1 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 || !strings.Contains(res.Stderr, want) {
			t.Errorf("dama ready: exit %d, stderr %q: want exit 1 and one line saying %q", res.Code, res.Stderr, want)
		}
	}

	// A server that refuses every connection: the supervisor waits for it.
	waiting := env.StartWith(cfg, []string{"DATABASE_URL=postgres://dama@127.0.0.1:1/dama?connect_timeout=1"}, nil, "supervisor", "--metrics-listen", "127.0.0.1:0")
	addr := addrOf(waiting)
	oneLine(env.Dama("", "ready", addr), "the supervisor on "+addr+" is not ready: it waits for the database")
	waiting.Kill(t, syscall.SIGTERM)
	select {
	case <-waiting.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the supervisor waiting for its database did not stop within 30s of SIGTERM")
	}
	oneLine(env.Dama("", "ready", addr), "no supervisor answers on "+addr)

	working := env.Start(cfg, "supervisor", "--metrics-listen", "127.0.0.1:0")
	addr = addrOf(working)
	working.WaitReady(t, time.Minute)
	if res := env.Dama("", "ready", addr); res.Code != 0 || res.Stdout != "ready\n" {
		t.Errorf("dama ready %s of a working supervisor: exit %d, stdout %q, stderr %q", addr, res.Code, res.Stdout, res.Stderr)
	}
}
