package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

const pauseConfig = `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 4 }
  other: { max_running: 4 }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
  elsewhere: { queue: other, command: ["{{sample}}"] }
`

// A paused queue starts nothing while its running task goes on to DONE and
// another queue runs as usual; dama queues counts what waits; resuming
// starts the waiting tasks at once, each once.
func TestPausedQueueStartsNothingUntilResumed(t *testing.T) {
	t.Parallel()
	w, client := queueWorld(t, pauseConfig)
	w.Start(w.cfg, "supervisor")
	running := w.submitKind(client, "sample", 15, 100, nil)
	w.waitRunning(running)

	res := w.Dama(w.cfg, "pause", "etl", "--reason", "warehouse maintenance")
	if res.Code != 0 || !strings.Contains(res.Stdout, "queue etl paused") || !strings.Contains(res.Stdout, "warehouse maintenance") {
		t.Fatalf("pause: exit %d, %q %q", res.Code, res.Stdout, res.Stderr)
	}
	var waiting []int64
	for range 3 {
		waiting = append(waiting, w.submitKind(client, "sample", 1, 10, nil))
	}
	unpaused := w.submitKind(client, "elsewhere", 1, 10, nil)
	for _, id := range waiting {
		w.waitFor(id, 20*time.Second, "to wait for its paused queue", func(t etlcontext.Task) bool {
			return t.WaitingFor != nil && *t.WaitingFor == string(etlcontext.WaitQueuePaused)
		})
	}
	if got := w.waitSettled(unpaused, 30*time.Second); got.Status != etlcontext.StatusDone {
		t.Fatalf("the task of the other queue: %s", got.Status)
	}
	if got := w.waitSettled(running, 30*time.Second); got.Status != etlcontext.StatusDone {
		t.Fatalf("the task running when the queue was paused: %s, want DONE", got.Status)
	}
	// Its slot is free now: a poll interval or two later, still nothing of
	// the paused queue has started.
	testenv.Holds(5*300*time.Millisecond, func() bool {
		for _, id := range waiting {
			if got := w.task(id); got.Status != etlcontext.StatusQueued || got.Attempt != 0 {
				t.Fatalf("context %d of the paused queue: %s, attempt %d", id, got.Status, got.Attempt)
			}
		}
		return true
	})
	res = w.Dama(w.cfg, "queues")
	if res.Code != 0 {
		t.Fatalf("queues: %s", res.Stderr)
	}
	line := lineWith(res.Stdout, "etl ", "sample")
	if f := strings.Fields(line); len(f) < 11 || f[2] != "3" || f[6] != "1" || !strings.Contains(line, `yes: "warehouse maintenance"`) {
		t.Errorf("dama queues, want etl sample with 3 queued, 1 done and the pause:\n%s", res.Stdout)
	}
	var stats []etlcontext.QueueStat
	res = w.Dama(w.cfg, "queues", "--json")
	if err := json.Unmarshal([]byte(res.Stdout), &stats); err != nil {
		t.Fatal(err)
	}
	for _, s := range stats {
		if deref(s.Queue) == "etl" && deref(s.Kind) == "sample" && (!s.Paused || s.OldestWaiting == nil || *s.OldestWaiting < time.Second) {
			t.Errorf("dama_queue_stats: %+v, want paused with its oldest task waiting over a second", s)
		}
	}

	res = w.Dama(w.cfg, "resume", "etl")
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "queue etl resumed" {
		t.Fatalf("resume: exit %d, %q %q", res.Code, res.Stdout, res.Stderr)
	}
	for _, id := range waiting {
		if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone {
			t.Errorf("context %d: %s after resume", id, got.Status)
		}
	}
	w.startedOnce(append(waiting, running, unpaused))
	if res := w.Dama(w.cfg, "resume", "etl"); res.Code != 0 || !strings.Contains(res.Stdout, "was not paused") {
		t.Errorf("resume again: exit %d, %q", res.Code, res.Stdout)
	}
}

// The seed's worry: pausing and resuming quickly, many times, while two
// supervisors start tasks, never starts a task twice nor exceeds the
// queue's bound, and every task ends DONE.
func TestPauseResumeStormStartsEachTaskOnce(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	w, client := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 3 }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
`)
	var ids []int64
	for range 24 {
		ids = append(ids, w.submitKind(client, "sample", 2, 20+rng.IntN(60), nil))
	}
	running := w.sample(`SELECT 'etl', count(*) FROM data_manager.etl_contexts WHERE etl_status = 'RUNNING'`)
	w.Start(w.cfg, "supervisor")
	w.Start(w.cfg, "supervisor")
	ctx := context.Background()
	// Every start is committed under the queue's lock, which a pause waits
	// for: once PauseQueue returns, the count of tasks ever started holds
	// still until the resume.
	startedSoFar := func() int {
		var n int
		if err := w.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.etl_contexts WHERE attempt > 0`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	toggles := 0
	for done := false; !done; toggles++ {
		if _, err := client.PauseQueue(ctx, "etl", "storm"); err != nil {
			t.Fatal(err)
		}
		// Paused for a random while, in which nothing may start.
		before := startedSoFar()
		if !testenv.Holds(time.Duration(rng.IntN(40))*time.Millisecond, func() bool { return startedSoFar() == before }) {
			t.Fatalf("%d tasks started while the queue was paused", startedSoFar()-before)
		}
		if _, err := client.ResumeQueue(ctx, "etl"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond) // deliberately: the operator's random rhythm
		var unfinished int
		if err := w.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.etl_contexts WHERE etl_status NOT IN ('DONE', 'FAILED', 'CANCELLED')`).Scan(&unfinished); err != nil {
			t.Fatal(err)
		}
		done = unfinished == 0
		if toggles > 3000 {
			t.Fatalf("%d tasks unfinished after %d pauses and resumes", unfinished, toggles)
		}
	}
	t.Logf("%d pauses and resumes", toggles)
	for _, id := range ids {
		if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
			t.Errorf("context %d: %s at attempt %d, want DONE at 1", id, got.Status, got.Attempt)
		}
	}
	if m := running.finish(t)["etl"]; m > 3 {
		t.Errorf("saw %d tasks running at once, want at most max_running 3", m)
	}
	w.startedOnce(ids)
}

// A blocked kind keeps its submissions and starts none of them, shows the
// block and its reason, and starts them once unblocked; other kinds of the
// queue run meanwhile.
func TestBlockedKindKeepsItsTasks(t *testing.T) {
	t.Parallel()
	w, client := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 4 }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
  loader: { queue: etl, command: ["{{sample}}"] }
`)
	for _, args := range [][]string{{"block", "loader"}, {"block", "loader", "--reason", " "}, {"block", "nosuchkind", "--reason", "x"}, {"pause", "nosuchqueue"},
		{"pause", "etl", "--reason", "bad \xff byte"}, {"block", "loader", "--reason", "bad \xfe byte"}, {"pause", "etl", "--reason", strings.Repeat("r", 2000)}} {
		res := w.Dama(w.cfg, args...)
		if res.Code == 0 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 || res.Stdout != "" {
			t.Errorf("dama %v: exit %d, stdout %q, stderr %q; want one line on stderr and a failure", args, res.Code, res.Stdout, res.Stderr)
		}
	}
	stats, err := client.QueueStats(context.Background())
	if err != nil || len(stats) != 0 {
		t.Fatalf("a refused command wrote something: %+v, %v", stats, err)
	}
	res := w.Dama(w.cfg, "block", "loader", "--reason", "upstream sends bad files")
	if res.Code != 0 {
		t.Fatalf("block: %s", res.Stderr)
	}
	w.Start(w.cfg, "supervisor")
	blocked := []int64{w.submitKind(client, "loader", 1, 10, nil), w.submitKind(client, "loader", 1, 10, nil)}
	other := w.submitKind(client, "sample", 1, 10, nil)
	if got := w.waitSettled(other, 30*time.Second); got.Status != etlcontext.StatusDone {
		t.Fatalf("the task of the kind not blocked: %s", got.Status)
	}
	for _, id := range blocked {
		w.waitFor(id, 20*time.Second, "to wait for its blocked kind", func(t etlcontext.Task) bool {
			return t.Status == etlcontext.StatusQueued && t.WaitingFor != nil && *t.WaitingFor == string(etlcontext.WaitKindBlocked)
		})
	}
	res = w.Dama(w.cfg, "status")
	if got := strings.Count(res.Stdout, "waiting: its kind is blocked since"); got != 2 {
		t.Errorf("dama status shows %d tasks waiting for their blocked kind, want 2:\n%s", got, res.Stdout)
	}
	res = w.Dama(w.cfg, "queues")
	if line := lineWith(res.Stdout, "loader"); !strings.Contains(line, `yes: "upstream sends bad files"`) || strings.Fields(line)[2] != "2" {
		t.Errorf("dama queues, want loader with 2 queued and its block:\n%s", res.Stdout)
	}
	var reason string
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT block_reason FROM data_manager.dama_queue_stats WHERE kind = 'loader' AND blocked`).Scan(&reason); err != nil || reason != "upstream sends bad files" {
		t.Errorf("dama_queue_stats block_reason %q, %v", reason, err)
	}
	res = w.Dama(w.cfg, "unblock", "loader")
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "kind loader unblocked" {
		t.Fatalf("unblock: exit %d, %q %q", res.Code, res.Stdout, res.Stderr)
	}
	for _, id := range blocked {
		if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone {
			t.Errorf("context %d: %s after unblock", id, got.Status)
		}
	}
	w.startedOnce(append(blocked, other))
}
