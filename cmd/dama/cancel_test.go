package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

func TestCancel(t *testing.T) { testenv.LockModes(t, testCancel) }

func testCancel(t *testing.T) {
	w := newWorld(t, 10)

	queued := w.submit(5, 10)
	res := w.Dama(w.cfg, "cancel", strconv.FormatInt(queued, 10))
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "CANCELLED" {
		t.Fatalf("cancel queued task: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	if got := w.task(queued); got.Status != etlcontext.StatusCancelled || deref(got.JobState) != "cancelled" {
		t.Errorf("cancelled queued task: %s, job %v", got.Status, deref(got.JobState))
	}

	w.Start(w.cfg, "supervisor")
	// Held until cancelled: on a stalled machine (a --slow run's fork/exec
	// took 450 ms) a task of 20 s ended before its cancel.
	id := w.submitHeld(200, 100)
	running := w.waitRunning(id)
	w.waitFor(id, 20*time.Second, "to start its command", func(etlcontext.Task) bool { return len(w.starts(id)) == 1 })
	commandPID, _ := strconv.Atoi(w.starts(id)[0][0])
	res = w.Dama(w.cfg, "cancel", strconv.FormatInt(id, 10))
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "CANCELLED" {
		t.Fatalf("cancel running task: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	w.waitSettled(id, 30*time.Second)
	testenv.Within(t, 10*time.Second, "the task's processes to end", func() (bool, error) {
		return !testenv.Alive(*running.PID) && !testenv.Alive(commandPID), nil
	})

	res = w.Dama(w.cfg, "cancel", strconv.FormatInt(id, 10))
	if res.Code != 0 {
		t.Errorf("cancelling a cancelled task again: exit %d: %s", res.Code, res.Stderr)
	}
}

// The orphans of a cancelled attempt are stopped: a task whose task
// process was SIGKILLed, leaving its command's worker behind, is recorded
// CANCELLED only once that worker is gone.
func TestCancelledAttemptsOrphansAreStopped(t *testing.T) {
	testenv.LockModes(t, testCancelledAttemptsOrphansAreStopped)
}

func testCancelledAttemptsOrphansAreStopped(t *testing.T) {
	env := testenv.New(t)
	w := newBeatWorld(t, env, "")
	w.Start(w.cfg, "supervisor")
	id := w.submit()
	running := (&world{Env: env}).waitRunning(id)
	testenv.Eventually(t, 20*time.Second, "the worker to beat", func() (bool, error) { return len(w.beats(id)[1]) >= 3, nil })
	if err := syscall.Kill(*running.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now().UnixNano()
	res := env.Dama(w.cfg, "cancel", strconv.FormatInt(id, 10))
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "CANCELLED" {
		t.Fatalf("cancel: exit %d, %s %s", res.Code, res.Stdout, res.Stderr)
	}
	got := (&world{Env: env}).waitSettled(id, time.Minute)
	if got.Status != etlcontext.StatusCancelled || got.FinishedAt == nil {
		t.Fatalf("%s, want CANCELLED", got.Status)
	}
	beats := w.beats(id)[1]
	if len(beats) == 0 || slices.Max(beats) < killedAt {
		t.Fatalf("the worker did not outlive its task process: the test proves nothing")
	}
	// Every beat before the outcome was recorded, and none after.
	if last := slices.Max(beats); last >= got.FinishedAt.UnixNano() {
		t.Errorf("the worker beat %s after the task was recorded CANCELLED", time.Duration(last-got.FinishedAt.UnixNano()))
	}
	// And it is gone, not merely quiet.
	attempt := hostproc.Attempt{Marker: protocol.RunIDEnv + "=" + *running.RunID}
	testenv.Within(t, 10*time.Second, "no process of the cancelled attempt left", func() (bool, error) {
		pids, err := attempt.Processes()
		return len(pids) == 0, err
	})
}

// A notification is a hint, never an order: a role with no grants at all
// that announces the cancellation of a running task does not stop it.
func TestAnAnnouncedCancellationStopsNothingUnlessRecorded(t *testing.T) {
	testenv.LockModes(t, testAnAnnouncedCancellationStopsNothingUnlessRecorded)
}

func testAnAnnouncedCancellationStopsNothingUnlessRecorded(t *testing.T) {
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:` + waiterKind(goFile, 1))
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("waiter")
	w.waitFor(id, 30*time.Second, "to run its command", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && t.InitialEventLocked && t.CommandPGID != nil
	})

	ctx := context.Background()
	intruder, err := pgx.Connect(ctx, env.NewLogin())
	if err != nil {
		t.Fatal(err)
	}
	defer intruder.Close(ctx)
	for range 50 {
		if _, err := intruder.Exec(ctx, `SELECT pg_notify($1, $2)`, protocol.CancelChannel, strconv.FormatInt(id, 10)); err != nil {
			t.Fatalf("notify as a role with no grants: %v", err)
		}
	}
	taskLog := filepath.Join(env.Dir, "logs", fmt.Sprintf("%d.log", id))
	testenv.Eventually(t, 30*time.Second, "the task process to hear the announcement", func() (bool, error) {
		log, err := os.ReadFile(taskLog)
		if strings.Contains(string(log), "stopping command") {
			return false, fmt.Errorf("the task process stopped its command:\n%s", log)
		}
		return strings.Contains(string(log), "ignored announced cancellations that the database does not record"), err
	})
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := w.waitSettled(id, time.Minute)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s at attempt %d, want DONE at attempt 1: an announcement is no cancellation", got.Status, got.Attempt)
	}
}

// A command that writes events as fast as they are stored keeps its task
// process's writer busy without end: a cancellation still reaches it,
// between two rounds of writes.
func TestCancelReachesATaskThatWritesWithoutPause(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  endless:
    command: ["/bin/sh", "-c", "exec yes '{\"type\":\"rows\",\"payload\":1}' >&3"]
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("endless")
	w.waitRunning(id)
	testenv.Eventually(t, 30*time.Second, "rows stored", func() (bool, error) {
		var n int
		err := w.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM (SELECT 1 FROM data_manager.event_store
			 WHERE etl_context_id = $1 AND type = 'endless:ROWS' LIMIT 1000) AS r`, id).Scan(&n)
		return n == 1000, err
	})
	if res := w.Dama(cfg, "cancel", strconv.FormatInt(id, 10)); res.Code != 0 {
		t.Fatalf("cancel: exit %d: %s", res.Code, res.Stderr)
	}
	if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusCancelled {
		t.Errorf("%s, want CANCELLED", got.Status)
	}
}
