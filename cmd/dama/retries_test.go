package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// waitFinished waits for the context to be finished with its job
// finalized, and returns it.
func (w *world) waitFinished(id int64, timeout time.Duration) etlcontext.Task {
	w.T.Helper()
	return w.waitFor(id, timeout, "to finish with its job finalized", func(t etlcontext.Task) bool {
		return t.Status.Finished() && t.JobState != nil &&
			(*t.JobState == "completed" || *t.JobState == "discarded" || *t.JobState == "cancelled")
	})
}

// attemptGaps returns, for each attempt after the first, how long after the
// previous attempt's ERROR event its task process started.
func (w *world) attemptGaps(id int64) []time.Duration {
	w.T.Helper()
	rows, err := w.Pool.Query(context.Background(), `
		SELECT a.started_at - e.created_at
		  FROM data_manager.etl_attempts AS a
		  JOIN data_manager.event_store AS e
		    ON e.etl_context_id = a.etl_context_id AND e.attempt = a.attempt - 1 AND e.type LIKE '%:ERROR'
		 WHERE a.etl_context_id = $1
		 ORDER BY a.attempt`, id)
	if err != nil {
		w.T.Fatal(err)
	}
	defer rows.Close()
	var gaps []time.Duration
	for rows.Next() {
		var d time.Duration
		if err := rows.Scan(&d); err != nil {
			w.T.Fatal(err)
		}
		gaps = append(gaps, d)
	}
	if err := rows.Err(); err != nil {
		w.T.Fatal(err)
	}
	return gaps
}

// A kind's retry policy spaces its attempts: fixed waits its delay after
// every failure, exponential doubles it; the seed's "5 minutes later, at
// most twice" is retry: {max_attempts: 3, backoff: fixed, delay: 5m}.
func TestRetryPolicySpacesAttempts(t *testing.T) {
	t.Parallel()
	w, client := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 10 }
kinds:
  fixed:
    queue: etl
    command: ["/bin/sh", "-c", "exit 1"]
    retry: { max_attempts: 3, backoff: fixed, delay: 2s }
  doubling:
    queue: etl
    command: ["/bin/sh", "-c", "exit 1"]
    retry: { max_attempts: 3, backoff: exponential, delay: 1s, max_delay: 10s }
`)
	w.Start(w.cfg, "supervisor")
	fixed := w.submitKind(client, "fixed", 1, 1, nil)
	doubling := w.submitKind(client, "doubling", 1, 1, nil)
	for _, id := range []int64{fixed, doubling} {
		if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusFailed || got.Attempt != 3 {
			t.Fatalf("context %d: %s at attempt %d, want FAILED at 3", id, got.Status, got.Attempt)
		}
	}
	gaps := w.attemptGaps(fixed)
	t.Logf("fixed 2s: %v", gaps)
	if len(gaps) != 2 || gaps[0] < 2*time.Second || gaps[1] < 2*time.Second {
		t.Errorf("fixed backoff of 2s: attempts started %v after the previous failure", gaps)
	}
	gaps = w.attemptGaps(doubling)
	t.Logf("exponential from 1s: %v", gaps)
	if len(gaps) != 2 || gaps[0] < time.Second || gaps[1] < 2*time.Second {
		t.Errorf("exponential backoff from 1s: attempts started %v after the previous failure, want at least 1s then 2s", gaps)
	}
}

// An exit code the kind says not to retry fails the task at once, whatever
// attempts remain; dama retry then runs it again from its checkpoint.
func TestExitCodesThatAreNotRetriedAndDamaRetry(t *testing.T) {
	t.Parallel()
	w, client := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 10 }
kinds:
  sample:
    queue: etl
    command: ["{{sample}}"]
    max_attempts: 3
    fail_on_exit_codes: [3]
  picky:
    queue: etl
    command: ["/bin/sh", "-c", "exit 1"]
    max_attempts: 3
    retry_on_exit_codes: [75]
`)
	w.Start(w.cfg, "supervisor")
	// sample-etl exits 3 at step 2 of its first attempt.
	id := w.submitKind(client, "sample", 4, 20, map[string]any{"fail_at": 2})
	picky := w.submitKind(client, "picky", 1, 1, nil)
	for _, c := range []int64{id, picky} {
		if got := w.waitFinished(c, 30*time.Second); got.Status != etlcontext.StatusFailed || got.Attempt != 1 {
			t.Fatalf("context %d: %s at attempt %d, want FAILED at attempt 1 of 3", c, got.Status, got.Attempt)
		}
	}
	events, err := etlcontext.Events(context.Background(), w.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	last := events[len(events)-1]
	var payload map[string]any
	if err := json.Unmarshal(last.Payload, &payload); err != nil || last.Type != "sample:ERROR" || payload["exit_code"] != float64(3) || payload["retry"] != false {
		t.Fatalf("last event %s %s, want sample:ERROR with exit_code 3 and retry false", last.Type, last.Payload)
	}

	for _, bad := range [][]string{{"retry", "999999"}, {"retry", "x"}} {
		if res := w.Dama(w.cfg, bad...); res.Code == 0 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 {
			t.Errorf("dama %v: exit %d, stderr %q; want one line and a failure", bad, res.Code, res.Stderr)
		}
	}
	res := w.Dama(w.cfg, "retry", fmt.Sprint(id))
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "QUEUED" {
		t.Fatalf("retry: exit %d, %q %q", res.Code, res.Stdout, res.Stderr)
	}
	got := w.waitSettled(id, 30*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 || got.MaxAttempts != 4 {
		t.Fatalf("after dama retry: %s at attempt %d of %d, want DONE at attempt 2 of 4", got.Status, got.Attempt, got.MaxAttempts)
	}
	starts := w.starts(id)
	if len(starts) != 2 || starts[1][1] != "2" || starts[1][2] != "2" {
		t.Errorf("starts %v, want a second attempt resuming at step 2 (its checkpoint)", starts)
	}
	events, err = etlcontext.Events(context.Background(), w.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	var retried int
	for _, e := range events {
		if e.Type == "sample:RETRIED" {
			retried++
			if !strings.Contains(string(e.Payload), `"previous_status": "FAILED"`) || !strings.Contains(string(e.Payload), `"by"`) {
				t.Errorf("RETRIED payload %s", e.Payload)
			}
		}
	}
	if retried != 1 {
		t.Errorf("%d RETRIED events, want 1", retried)
	}
	if res := w.Dama(w.cfg, "retry", fmt.Sprint(id)); res.Code == 0 || !strings.Contains(res.Stderr, "only a FAILED or CANCELLED task") {
		t.Errorf("retry of a DONE task: exit %d, %q", res.Code, res.Stderr)
	}
	if got := w.task(id); got.Status != etlcontext.StatusDone {
		t.Errorf("a refused retry changed the task: %s", got.Status)
	}
}

// A command that outruns its kind's timeout has its process group stopped
// (SIGKILL after the kind's kill_grace, here, since it ignores SIGTERM),
// with a TIMEOUT event; on_timeout says whether the task is retried.
func TestTimeoutStopsTheCommand(t *testing.T) { testenv.LockModes(t, testTimeoutStopsTheCommand) }

func testTimeoutStopsTheCommand(t *testing.T) {
	w, client := queueWorld(t, `
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  etl: { max_running: 10 }
kinds:
  stubborn:
    queue: etl
    command: ["/bin/sh", "-c", "trap '' TERM; sleep 60"]
    max_attempts: 3
    timeout: 1s
    on_timeout: fail
    kill_grace: 500ms
  patient:
    queue: etl
    command: ["/bin/sh", "-c", "sleep 60"]
    max_attempts: 2
    retry: { backoff: fixed, delay: 100ms }
    timeout: 1s
`)
	w.Start(w.cfg, "supervisor")
	stubborn := w.submitKind(client, "stubborn", 1, 1, nil)
	patient := w.submitKind(client, "patient", 1, 1, nil)
	// Not watched running: a busy machine may run its whole second and
	// a half before the test looks.
	got := w.waitFinished(stubborn, 30*time.Second)
	if got.Status != etlcontext.StatusFailed || got.Attempt != 1 {
		t.Fatalf("stubborn: %s at attempt %d, want FAILED at attempt 1 (on_timeout: fail)", got.Status, got.Attempt)
	}
	var (
		ran, timeoutAfter time.Duration
		pid               int
	)
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT a.ended_at - a.started_at, t.created_at - a.started_at, a.pid
		  FROM data_manager.etl_attempts AS a
		  JOIN data_manager.event_store AS t ON t.etl_context_id = a.etl_context_id AND t.type = 'stubborn:TIMEOUT'
		 WHERE a.etl_context_id = $1`, stubborn).Scan(&ran, &timeoutAfter, &pid); err != nil {
		t.Fatalf("read the attempt and its TIMEOUT event: %v", err)
	}
	t.Logf("stubborn: TIMEOUT %s after the start, attempt ended after %s", timeoutAfter, ran)
	if timeoutAfter < time.Second || ran < 1500*time.Millisecond || ran > 20*time.Second {
		t.Errorf("TIMEOUT %s and end %s after the start; want the timeout at 1s and the end after the 500ms kill grace", timeoutAfter, ran)
	}
	testenv.Eventually(t, 10*time.Second, "the task process to be gone", func() (bool, error) {
		return !testenv.Alive(pid), nil
	})
	if procs := w.Dama(w.cfg, "status", fmt.Sprint(stubborn)); !strings.Contains(procs.Stdout, "FAILED") {
		t.Errorf("dama status:\n%s", procs.Stdout)
	}
	got = w.waitSettled(patient, 30*time.Second)
	if got.Status != etlcontext.StatusFailed || got.Attempt != 2 {
		t.Fatalf("patient: %s at attempt %d, want FAILED after both attempts timed out (on_timeout: retry)", got.Status, got.Attempt)
	}
	var timeouts int
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM data_manager.event_store WHERE etl_context_id = $1 AND type = 'patient:TIMEOUT'`, patient).Scan(&timeouts); err != nil || timeouts != 2 {
		t.Errorf("%d TIMEOUT events (%v), want one per attempt", timeouts, err)
	}
}

// dama retry of a task that ended while no supervisor ran (its job still
// parked, waiting for a step to settle it) cancels that job: one job, not
// two, steps the task from then on.
func TestRetryBeforeAnySupervisorSettledTheTaskLeavesOneJob(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:` + waiterKind(goFile, 2))
	w := &world{Env: env, cfg: cfg}
	sup := w.Start(cfg, "supervisor")
	id := w.submitOf("waiter")
	running := w.waitFor(id, 30*time.Second, "to run its command", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && t.InitialEventLocked && t.CommandPGID != nil
	})
	sup.Kill(t, syscall.SIGKILL)
	waitExit(t, sup)
	if res := w.Dama(cfg, "cancel", strconv.FormatInt(id, 10)); res.Code != 0 {
		t.Fatalf("cancel: exit %d, %s", res.Code, res.Stderr)
	}
	jobState := func(job int64) string {
		t.Helper()
		var state string
		if err := env.Pool.QueryRow(context.Background(), `SELECT state::text FROM river_job WHERE id = $1`, job).Scan(&state); err != nil {
			t.Fatal(err)
		}
		return state
	}
	old := *running.RiverJobID
	if state := jobState(old); state == "cancelled" || state == "completed" || state == "discarded" {
		t.Fatalf("the cancelled task's job is %s before any supervisor stepped it: the test proves nothing", state)
	}
	if res := w.Dama(cfg, "retry", strconv.FormatInt(id, 10)); res.Code != 0 {
		t.Fatalf("retry: exit %d, %s", res.Code, res.Stderr)
	}
	// Cancelled at once when it was parked; when the killed supervisor
	// left it in a step, its rescue finds it is no longer the task's.
	if state := jobState(old); state != "cancelled" && state != "running" {
		t.Errorf("after dama retry, the previous job is %s, want cancelled", state)
	}
	w.Start(cfg, "supervisor")
	testenv.Eventually(t, time.Minute, "the previous job to be cancelled", func() (bool, error) { return jobState(old) == "cancelled", nil })
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := w.waitSettled(id, time.Minute)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 || *got.RiverJobID == old {
		t.Errorf("%s at attempt %d with job %d, want DONE at attempt 2 with a new job", got.Status, got.Attempt, *got.RiverJobID)
	}
}
