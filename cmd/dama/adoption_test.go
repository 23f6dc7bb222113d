package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

func TestTasksSurviveSupervisorKillAndAreAdopted(t *testing.T) {
	testenv.LockModes(t, testTasksSurviveSupervisorKillAndAreAdopted)
}

func testTasksSurviveSupervisorKillAndAreAdopted(t *testing.T) {
	w := newWorld(t, 10)
	first := w.Start(w.cfg, "supervisor")
	// Running until the test has seen them adopted, however slow the
	// machine.
	ids := []int64{w.submitHeld(20, 100), w.submitHeld(20, 100), w.submitHeld(20, 100)}
	pids := map[int64]int{}
	for _, id := range ids {
		pids[id] = *w.waitRunning(id).PID
	}

	// A crash: the supervisor's whole process group gets SIGKILL.
	if err := syscall.Kill(-first.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the supervisor to die", func() (bool, error) {
		return !testenv.Alive(first.Cmd.Process.Pid), nil
	})
	for _, id := range ids {
		if !testenv.Alive(pids[id]) {
			t.Fatalf("task process %d of context %d died with the supervisor", pids[id], id)
		}
		if !w.task(id).InitialEventLocked {
			t.Fatalf("context %d lost its lock with the supervisor", id)
		}
	}

	// The next supervisor on this host sees the first one's process gone
	// and adopts its tasks at once: its poll interval's rescue grace (2
	// minutes) would outlast the waits below.
	second := w.Start(w.WriteConfig(strings.Replace(sampleConfigFor(10), "poll_interval: 500ms", "poll_interval: 1m", 1)), "supervisor")
	second.WaitReady(t, time.Minute)
	w.release()
	for _, id := range ids {
		got := w.waitSettled(id, 60*time.Second)
		if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
			t.Errorf("context %d: %s after %d attempts, want DONE after 1", id, got.Status, got.Attempt)
		}
		if *got.PID != pids[id] {
			t.Errorf("context %d ran as pid %d, then %d: it was started again", id, pids[id], *got.PID)
		}
		if starts := w.starts(id); len(starts) != 1 {
			t.Errorf("context %d started %d times, want exactly once: %v", id, len(starts), starts)
		}
	}
	log, _ := os.ReadFile(second.Log)
	if strings.Contains(string(log), "spawned task process") {
		t.Errorf("the second supervisor spawned a task process; it should only adopt:\n%s", log)
	}
	if !strings.Contains(string(log), fmt.Sprintf("process %d of this host, is gone", first.Cmd.Process.Pid)) {
		t.Errorf("the second supervisor did not say why it took the tasks up at once:\n%s", log)
	}
}

func TestSecondTaskrunnerExitsWithoutWriting(t *testing.T) {
	testenv.LockModes(t, testSecondTaskrunnerExitsWithoutWriting)
}

func testSecondTaskrunnerExitsWithoutWriting(t *testing.T) {
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	// It does not end (and write its outcome) until the second
	// taskrunner has been refused, however slow the machine.
	id := w.submitHeld(20, 100)
	running := w.waitRunning(id)
	count := func() int {
		var n int
		if err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM data_manager.event_store WHERE etl_context_id = $1 AND type NOT IN ('sample:PROGRESS', 'sample:CHECKPOINT')`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	res := w.Dama(w.cfg, "taskrunner", "--context-id", strconv.FormatInt(id, 10), "--run-id", *running.RunID)
	if res.Code != protocol.ExitLocked {
		t.Fatalf("second taskrunner: exit %d, want %d; stderr: %s", res.Code, protocol.ExitLocked, res.Stderr)
	}
	if after := count(); after != before {
		t.Errorf("the second taskrunner wrote %d events", after-before)
	}
	if got := w.task(id); *got.PID != *running.PID || got.Status != etlcontext.StatusRunning {
		t.Errorf("the second taskrunner changed the context: pid %d -> %d, %s", *running.PID, *got.PID, got.Status)
	}

	w.release()
	w.waitSettled(id, 60*time.Second)
	res = w.Dama(w.cfg, "taskrunner", "--context-id", strconv.FormatInt(id, 10), "--run-id", *running.RunID)
	if res.Code != protocol.ExitFinished {
		t.Fatalf("taskrunner for a DONE context: exit %d, want %d; stderr: %s", res.Code, protocol.ExitFinished, res.Stderr)
	}
	if starts := w.starts(id); len(starts) != 1 {
		t.Errorf("starts: %v, want exactly one", starts)
	}
}

func TestJobFinalizedBehindDamasBackIsReconciled(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	id := w.submitHeld(30, 100)
	running := w.waitRunning(id)
	// What River's own rescuer does to a job stuck 'running' for an hour on
	// its last attempt, while the task is in fact alive.
	if _, err := w.Pool.Exec(context.Background(), `
		UPDATE river_job SET state = 'discarded', finalized_at = now() WHERE id = $1`, *running.RiverJobID); err != nil {
		t.Fatal(err)
	}
	w.release()
	got := w.waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusDone || *got.PID != *running.PID {
		t.Errorf("%s, pid %d -> %d; want DONE by the same process", got.Status, *running.PID, *got.PID)
	}
	if starts := w.starts(id); len(starts) != 1 {
		t.Errorf("starts: %v, want exactly one", starts)
	}
}

func TestSupervisorStopsOnSIGTERMWithoutTouchingTasks(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	sup := w.Start(w.cfg, "supervisor")
	id := w.submitHeld(20, 100)
	running := w.waitRunning(id)

	sup.Kill(t, syscall.SIGTERM)
	exited := make(chan error, 1)
	go func() { exited <- sup.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("supervisor exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("supervisor still running 30s after SIGTERM")
	}
	if !testenv.Alive(*running.PID) || !w.task(id).InitialEventLocked {
		t.Fatal("the task stopped with the supervisor")
	}
	w.Start(w.cfg, "supervisor").WaitReady(t, time.Minute)
	w.release()
	if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone || *got.PID != *running.PID {
		t.Errorf("%s by pid %v, want DONE by the adopted pid %d", got.Status, deref(got.PID), *running.PID)
	}
}
