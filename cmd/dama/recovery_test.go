package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

func TestKilledTaskIsRetriedFromItsCheckpoint(t *testing.T) {
	testenv.LockModes(t, testKilledTaskIsRetriedFromItsCheckpoint)
}

func testKilledTaskIsRetriedFromItsCheckpoint(t *testing.T) {
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	// It runs until the test has killed it, and its retry until the end.
	id := w.submitHeld(40, 50)
	w.waitRunning(id)
	running := w.waitFor(id, 30*time.Second, "to record a checkpoint past step 5", func(etlcontext.Task) bool {
		cp, err := etlcontext.LatestPayload(context.Background(), w.Pool, id, protocol.EventCheckpoint)
		var c struct {
			NextStep int `json:"next_step"`
		}
		return err == nil && cp != nil && json.Unmarshal(cp, &c) == nil && c.NextStep >= 5
	})
	firstStarts := w.starts(id)
	if len(firstStarts) != 1 {
		t.Fatalf("starts before the kill: %v", firstStarts)
	}
	commandPID, _ := strconv.Atoi(firstStarts[0][0])

	if err := syscall.Kill(*running.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Within(t, 10*time.Second, "the command to die with its runner", func() (bool, error) {
		return !testenv.Alive(commandPID), nil
	})

	w.release()
	got := w.waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Fatalf("after the kill: %s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	starts := w.starts(id)
	if len(starts) != 2 {
		t.Fatalf("starts: %v, want 2", starts)
	}
	if resumedAt, _ := strconv.Atoi(starts[1][2]); resumedAt < 5 || starts[1][1] != "2" {
		t.Errorf("second start %v: want attempt 2 resuming at step >= 5", starts[1])
	}
	events, err := etlcontext.Events(context.Background(), w.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	var sawDeath bool
	for _, e := range events {
		if e.Type == "sample:ERROR" && e.Attempt == 1 && strings.Contains(string(e.Payload), "without reporting a result") {
			sawDeath = true
		}
	}
	if !sawDeath {
		t.Errorf("no ERROR event recording the death of attempt 1")
	}
}

func TestFailingCommandIsRetriedThenFailed(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  boom:
    command: ["/bin/sh", "-c", "echo about to fail; echo boom >&2; exit 7"]
    max_attempts: 2
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	res := w.Dama(cfg, "submit", "boom")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	// River backs off between attempts (1s after the first).
	got := w.waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusFailed || got.Attempt != 2 {
		t.Fatalf("%s after %d attempts, want FAILED after 2", got.Status, got.Attempt)
	}
	events, err := etlcontext.Events(context.Background(), env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	var errorsSeen int
	for _, e := range events {
		if e.Type != "boom:ERROR" {
			continue
		}
		errorsSeen++
		var p struct {
			ExitCode int    `json:"exit_code"`
			LogTail  string `json:"log_tail"`
		}
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			t.Fatal(err)
		}
		if p.ExitCode != 7 || !strings.Contains(p.LogTail, "boom") {
			t.Errorf("ERROR event %s: want exit code 7 and the log tail", e.Payload)
		}
	}
	if errorsSeen != 2 {
		t.Errorf("%d ERROR events, want one per attempt (2)", errorsSeen)
	}
	logs := w.Dama(cfg, "logs", strconv.FormatInt(id, 10))
	if logs.Code != 0 || countLines(logs.Stdout, "about to fail") != 2 {
		t.Errorf("dama logs: exit %d, output:\n%s", logs.Code, logs.Stdout)
	}
}

func TestNothingIsLostWhateverIsKilled(t *testing.T) {
	testenv.LockModes(t, testNothingIsLostWhateverIsKilled)
}

func testNothingIsLostWhateverIsKilled(t *testing.T) {
	w := newWorld(t, 6)
	var ids []int64
	for range 30 {
		ids = append(ids, w.submit(15, 60))
	}
	sups := []*testenv.Proc{w.Start(w.cfg, "supervisor"), w.Start(w.cfg, "supervisor")}
	killedRunners := map[int64]bool{}
	allDone := func() bool {
		var open int
		if err := w.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM data_manager.dama_task_queue WHERE etl_status <> 'DONE' OR job_state IS DISTINCT FROM 'completed'`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		return open == 0
	}
	// Chaos: every 1.5s a supervisor is crashed and replaced, and every
	// other round a task process is crashed too.
	for round := 0; round < 12 && !allDone(); round++ {
		time.Sleep(1500 * time.Millisecond) // deliberately: the rhythm of the crashes
		i := round % len(sups)
		_ = syscall.Kill(-sups[i].Cmd.Process.Pid, syscall.SIGKILL)
		sups[i] = w.Start(w.cfg, "supervisor")
		if round%2 == 0 {
			var id int64
			var pid int
			err := w.Pool.QueryRow(context.Background(), `
				SELECT etl_context_id, pid FROM data_manager.dama_task_queue
				 WHERE etl_status = 'RUNNING' AND initial_event_locked ORDER BY random() LIMIT 1`).Scan(&id, &pid)
			if err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
				killedRunners[id] = true
			}
		}
	}
	// Then calm: everything must settle, at the machine's pace: a task
	// settles at least every 3 minutes (a retry may wait out a fencing
	// window, about 2 minutes here).
	testenv.Drains(t, 3*time.Minute, "every task DONE with its job completed", func() (int, error) {
		var (
			n       int
			summary *string
		)
		err := w.Pool.QueryRow(context.Background(), `
			SELECT count(*), string_agg(etl_context_id || ':' || etl_status || '/' || coalesce(job_state, '-') || '@' || attempt, ' ')
			  FROM data_manager.dama_task_queue WHERE etl_status <> 'DONE' OR job_state IS DISTINCT FROM 'completed'`).Scan(&n, &summary)
		if err != nil {
			return -1, err
		}
		return n, fmt.Errorf("unsettled: %s", deref(summary))
	})
	for _, id := range ids {
		got := w.task(id)
		// No attempt started its command twice, and the last start is the
		// attempt that finished. (A supervisor killed between recording a
		// launch and spawning the runner spends an attempt that never
		// starts: attempts may exceed starts.)
		seen := map[string]bool{}
		starts := w.starts(id)
		for _, s := range starts {
			if seen[s[1]] {
				t.Errorf("context %d: attempt %s started twice: %v", id, s[1], starts)
			}
			seen[s[1]] = true
		}
		if len(starts) == 0 || starts[len(starts)-1][1] != strconv.Itoa(got.Attempt) {
			t.Errorf("context %d: DONE by attempt %d, starts %v", id, got.Attempt, starts)
		}
		if killedRunners[id] {
			continue
		}
		events, err := etlcontext.Events(context.Background(), w.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events {
			if e.Type == "sample:ERROR" && !strings.Contains(string(e.Payload), "never took its lock") {
				t.Errorf("context %d was never killed, yet attempt %d failed: %s", id, e.Attempt, e.Payload)
			}
		}
	}
	t.Logf("%d task processes killed; every task DONE with its job completed", len(killedRunners))
}

// An outcome slow to be written while the task keeps its lock (a host's
// burst of exits on a busy server) is waited for past reconnect_grace: the
// task is not run again.
func TestASlowOutcomeIsWaitedForWhileTheLockHolds(t *testing.T) {
	testenv.LockModes(t, testASlowOutcomeIsWaitedForWhileTheLockHolds)
}

func testASlowOutcomeIsWaitedForWhileTheLockHolds(t *testing.T) {
	w := newWorld(t, 10)
	w.cfg = w.WriteConfig(strings.Replace(sampleConfigFor(10), "kill_grace: 1s", "kill_grace: 1s\nreconnect_grace: 1s", 1))
	w.Start(w.cfg, "supervisor")
	id := w.submitHeld(1, 10)
	running := w.waitRunning(id)
	ctx := context.Background()
	tx, err := w.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// The outcome's write waits for this transaction.
	if _, err := tx.Exec(ctx, `SELECT 1 FROM data_manager.etl_contexts WHERE etl_context_id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	w.release()
	// reconnect_grace and a statement's 10 s, and more.
	if !testenv.Holds(13*time.Second, func() bool { return testenv.Alive(*running.PID) }) {
		t.Fatal("the task process gave up on its outcome while it held its lock")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}
	if starts := w.starts(id); len(starts) != 1 {
		t.Errorf("started %d times, want once: %v", len(starts), starts)
	}
}

// A database whose default isolation is REPEATABLE READ runs tasks: dama's
// sessions ask for READ COMMITTED, which its functions need to read what
// committed before their locks.
func TestADefaultOfRepeatableReadRunsTasks(t *testing.T) {
	testenv.LockModes(t, testADefaultOfRepeatableReadRunsTasks)
}

func testADefaultOfRepeatableReadRunsTasks(t *testing.T) {
	w := newWorld(t, 10)
	if _, err := w.Pool.Exec(context.Background(), `
		DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L', current_database(), 'repeatable read'); END $$`); err != nil {
		t.Fatal(err)
	}
	w.Start(w.cfg, "supervisor")
	id := w.submit(1, 10)
	if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}
}
