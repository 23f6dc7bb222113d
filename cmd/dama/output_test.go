package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

func TestEventsPipeSurvivesBadLines(t *testing.T) {
	testenv.LockModes(t, testEventsPipeSurvivesBadLines)
}

func testEventsPipeSurvivesBadLines(t *testing.T) {
	env := testenv.New(t)
	script := `echo 'not json' >&3
head -c 1100000 /dev/zero | tr '\0' a >&3; echo >&3
echo '{"type":"final","payload":{}}' >&3
echo '{"type":"progress","payload":{"done":1}}' >&3
echo '{"type":"rows_loaded","payload":{"rows":42}}' >&3`
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  pipe:
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `]
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	res := w.Dama(cfg, "submit", "pipe")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone {
		t.Fatalf("status %s, want DONE", got.Status)
	}
	events, err := etlcontext.Events(context.Background(), env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range events {
		types = append(types, e.Type)
	}
	want := []string{"pipe:INITIAL", "pipe:WARNING", "pipe:WARNING", "pipe:WARNING", "pipe:PROGRESS", "pipe:ROWS_LOADED", "pipe:FINAL"}
	if strings.Join(types, " ") != strings.Join(want, " ") {
		t.Fatalf("events %v, want %v", types, want)
	}
	if !strings.Contains(string(events[2].Meta), "exceeds the limit") || !strings.Contains(string(events[3].Meta), "reserved") {
		t.Errorf("warnings do not say what was wrong: %s / %s", events[2].Meta, events[3].Meta)
	}
}

func TestLogsFollowUntilTheTaskEnds(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	// 5 s: long enough to be seen running on a machine that stalls for a
	// while (a task of 2 s once was not).
	id := w.submit(50, 100)
	w.waitRunning(id)
	// Started while the task runs, it ends by itself when the task does,
	// having printed the whole log.
	res := w.Dama(w.cfg, "logs", "--follow", strconv.FormatInt(id, 10))
	if res.Code != 0 {
		t.Fatalf("dama logs --follow: exit %d: %s", res.Code, res.Stderr)
	}
	if got := w.task(id); got.Status != etlcontext.StatusDone {
		t.Errorf("dama logs --follow returned while the task was %s", got.Status)
	}
	for _, want := range []string{"command starting", fmt.Sprintf("context %d attempt 1: steps 0 to 50", id), fmt.Sprintf("context %d done", id)} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("followed log lacks %q:\n%s", want, res.Stdout)
		}
	}
}
