package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/sql"
	"github.com/dama-etl/dama/taskrunner"
	"github.com/dama-etl/dama/taskrunner/protocol"
	"github.com/jackc/pgx/v5"
)

const sampleConfig = `
log_dir: {{dir}}/logs
poll_interval: 500ms
heartbeat_interval: 200ms
kill_grace: 1s
progress_interval: 100ms
queues:
  etl: { max_running: %d }
kinds:
  sample:
    queue: etl
    command: ["{{sample}}"]
    max_attempts: 3
`

type world struct {
	*testenv.Env
	cfg       string
	startsDir string
}

func sampleConfigFor(maxRunning int) string { return fmt.Sprintf(sampleConfig, maxRunning) }

func newWorld(t *testing.T, maxRunning int) *world {
	env := testenv.New(t)
	w := &world{Env: env, cfg: env.WriteConfig(sampleConfigFor(maxRunning)), startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return w
}

// submit submits a sample task that records its starts, and returns its id.
func (w *world) submit(steps, stepMS int) int64 {
	w.T.Helper()
	args, _ := json.Marshal(map[string]any{"steps": steps, "step_ms": stepMS, "starts_dir": w.startsDir})
	res := w.Dama(w.cfg, "submit", "sample", "--args", string(args))
	if res.Code != 0 {
		w.T.Fatalf("submit: exit %d: %s", res.Code, res.Stderr)
	}
	return testenv.Atoi(w.T, res.Stdout)
}

// submitOf submits a task of kind with dama submit's other arguments,
// and returns its id.
func (w *world) submitOf(kind string, args ...string) int64 {
	w.T.Helper()
	res := w.Dama(w.cfg, append([]string{"submit", kind}, args...)...)
	if res.Code != 0 {
		w.T.Fatalf("submit %s: exit %d: %s", kind, res.Code, res.Stderr)
	}
	return testenv.Atoi(w.T, res.Stdout)
}

// waiterKind is the configuration of a kind "waiter" whose command runs
// until the file goFile exists.
func waiterKind(goFile string, maxAttempts int) string {
	return fmt.Sprintf(`
  waiter:
    command: ["/bin/sh", "-c", "while [ ! -e %s ]; do sleep 0.05; done"]
    max_attempts: %d
`, goFile, maxAttempts)
}

func (w *world) task(id int64) etlcontext.Task {
	w.T.Helper()
	return w.Task(id)
}

func (w *world) waitFor(id int64, timeout time.Duration, what string, cond func(etlcontext.Task) bool) etlcontext.Task {
	w.T.Helper()
	return w.WaitForTask(id, timeout, what, cond)
}

func (w *world) waitRunning(id int64) etlcontext.Task {
	w.T.Helper()
	return w.waitFor(id, 30*time.Second, "to run holding its lock", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && t.PID != nil && t.InitialEventLocked
	})
}

// waitSettled waits until the context is finished and its River job agrees.
func (w *world) waitSettled(id int64, timeout time.Duration) etlcontext.Task {
	w.T.Helper()
	return w.waitFor(id, timeout, "to finish with its job settled", func(t etlcontext.Task) bool {
		if !t.Status.Finished() || t.JobState == nil {
			return false
		}
		want := map[etlcontext.Status]string{etlcontext.StatusDone: "completed", etlcontext.StatusFailed: "discarded", etlcontext.StatusCancelled: "cancelled"}
		return *t.JobState == want[t.Status]
	})
}

// starts returns the lines the sample task wrote at each of its starts:
// "<pid> <attempt> <first step>".
func (w *world) starts(id int64) [][]string {
	w.T.Helper()
	data, err := os.ReadFile(filepath.Join(w.startsDir, strconv.FormatInt(id, 10)+".starts"))
	if err != nil && !os.IsNotExist(err) {
		w.T.Fatal(err)
	}
	var out [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line != "" {
			out = append(out, strings.Fields(line))
		}
	}
	return out
}

// lockConnName is the application name of the session that holds context
// id's lock: in host lock mode, the keeper's, which holds every task's.
func (w *world) lockConnName(id int64) string {
	if w.LockMode == config.LockModeHost {
		return taskrunner.KeeperLockName
	}
	return fmt.Sprintf("dama-task-lock:%d", id)
}

// terminateLock ends the lock connection of context id's task process, as a
// network failure or a DBA would.
func (w *world) terminateLock(id int64) {
	w.T.Helper()
	if _, err := w.Pool.Exec(context.Background(), `
		SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		 WHERE application_name = $1 AND datname = current_database()`,
		w.lockConnName(id)); err != nil {
		w.T.Fatal(err)
	}
}

// noSecondStartWhileAlive fails the test if starts() changes while pid runs.
func noSecondStartWhileAlive(t *testing.T, pid int, starts func() []string) {
	t.Helper()
	before := strings.Join(starts(), " ")
	deadline := time.Now().Add(30 * time.Second)
	for testenv.Alive(pid) {
		if now := strings.Join(starts(), " "); now != before {
			t.Fatalf("a second copy started while the first (pid %d) still ran: starts %s", pid, now)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lock-less command %d still runs after 30s", pid)
		}
		time.Sleep(10 * time.Millisecond) // deliberately: watches that nothing starts while pid lives
	}
}

// countLines counts the lines of s equal to line.
func countLines(s, line string) int {
	n := 0
	for _, l := range strings.Split(s, "\n") {
		if l == line {
			n++
		}
	}
	return n
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestTasksSurviveSupervisorKillAndAreAdopted(t *testing.T) {
	testenv.LockModes(t, testTasksSurviveSupervisorKillAndAreAdopted)
}

func testTasksSurviveSupervisorKillAndAreAdopted(t *testing.T) {
	w := newWorld(t, 10)
	first := w.Start(w.cfg, "supervisor")
	ids := []int64{w.submit(30, 100), w.submit(30, 100), w.submit(30, 100)}
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

	second := w.Start(w.cfg, "supervisor")
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
}

func TestKilledTaskIsRetriedFromItsCheckpoint(t *testing.T) {
	testenv.LockModes(t, testKilledTaskIsRetriedFromItsCheckpoint)
}

func testKilledTaskIsRetriedFromItsCheckpoint(t *testing.T) {
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	id := w.submit(40, 50)
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
	testenv.Eventually(t, 10*time.Second, "the command to die with its runner", func() (bool, error) {
		return !testenv.Alive(commandPID), nil
	})

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

func TestSecondTaskrunnerExitsWithoutWriting(t *testing.T) {
	testenv.LockModes(t, testSecondTaskrunnerExitsWithoutWriting)
}

func testSecondTaskrunnerExitsWithoutWriting(t *testing.T) {
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	id := w.submit(20, 100)
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

	w.waitSettled(id, 60*time.Second)
	res = w.Dama(w.cfg, "taskrunner", "--context-id", strconv.FormatInt(id, 10), "--run-id", *running.RunID)
	if res.Code != protocol.ExitFinished {
		t.Fatalf("taskrunner for a DONE context: exit %d, want %d; stderr: %s", res.Code, protocol.ExitFinished, res.Stderr)
	}
	if starts := w.starts(id); len(starts) != 1 {
		t.Errorf("starts: %v, want exactly one", starts)
	}
}

func TestTwoSupervisorsShareTheQueueWithinMaxRunning(t *testing.T) {
	t.Parallel()
	const maxRunning = 3
	w := newWorld(t, maxRunning)
	var ids []int64
	for range 12 {
		ids = append(ids, w.submit(6, 60))
	}

	// Sample the number of running tasks while two supervisors work.
	stop := make(chan struct{})
	var (
		mu         sync.Mutex
		maxSeen    int
		sampleErr  error
		sampleDone = make(chan struct{})
	)
	go func() {
		defer close(sampleDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			var n int
			err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM data_manager.etl_contexts WHERE etl_status = 'RUNNING'`).Scan(&n)
			mu.Lock()
			if err != nil && sampleErr == nil {
				sampleErr = err
			}
			maxSeen = max(maxSeen, n)
			mu.Unlock()
		}
	}()
	w.Start(w.cfg, "supervisor")
	w.Start(w.cfg, "supervisor")
	for _, id := range ids {
		if got := w.waitSettled(id, 90*time.Second); got.Status != etlcontext.StatusDone {
			t.Errorf("context %d: %s", id, got.Status)
		}
	}
	close(stop)
	<-sampleDone
	if sampleErr != nil {
		t.Fatal(sampleErr)
	}
	if maxSeen > maxRunning || maxSeen == 0 {
		t.Errorf("saw %d tasks running at once, want between 1 and max_running %d", maxSeen, maxRunning)
	}
	for _, id := range ids {
		if starts := w.starts(id); len(starts) != 1 {
			t.Errorf("context %d started %d times: %v", id, len(starts), starts)
		}
	}
}

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
	id := w.submit(200, 100)
	running := w.waitRunning(id)
	w.waitFor(id, 20*time.Second, "to start its command", func(etlcontext.Task) bool { return len(w.starts(id)) == 1 })
	commandPID, _ := strconv.Atoi(w.starts(id)[0][0])
	res = w.Dama(w.cfg, "cancel", strconv.FormatInt(id, 10))
	if res.Code != 0 || strings.TrimSpace(res.Stdout) != "CANCELLED" {
		t.Fatalf("cancel running task: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	w.waitSettled(id, 30*time.Second)
	testenv.Eventually(t, 10*time.Second, "the task's processes to end", func() (bool, error) {
		return !testenv.Alive(*running.PID) && !testenv.Alive(commandPID), nil
	})

	res = w.Dama(w.cfg, "cancel", strconv.FormatInt(id, 10))
	if res.Code != 0 {
		t.Errorf("cancelling a cancelled task again: exit %d: %s", res.Code, res.Stderr)
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

// terminateLockConn ends the task's lock connection on the server and
// fails unless exactly one was ended.
func (w *world) terminateLockConn(id int64) {
	w.T.Helper()
	var terminated int
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		 WHERE application_name = $1 AND datname = current_database()`, w.lockConnName(id)).Scan(&terminated); err != nil {
		w.T.Fatal(err)
	}
	if terminated != 1 {
		w.T.Fatalf("terminated %d lock connections, want 1", terminated)
	}
}

func TestLockConnectionLossIsRiddenOut(t *testing.T) {
	testenv.LockModes(t, testLockConnectionLossIsRiddenOut)
}

func testLockConnectionLossIsRiddenOut(t *testing.T) {
	w := newWorld(t, 10)
	// As a member of dama_task, which writes only with its run's key: the
	// connections made again hold it too.
	w.StartWith(w.cfg, []string{"DAMA_TASK_DATABASE_URL=" + w.NewLogin(sql.RoleTask)}, nil, "supervisor")
	id := w.submit(40, 100)
	w.waitRunning(id)
	w.waitFor(id, 20*time.Second, "to start its command", func(etlcontext.Task) bool { return len(w.starts(id)) == 1 })
	w.terminateLockConn(id)
	// The task process takes its lock again under the same run; the
	// command never notices.
	testenv.Eventually(t, 15*time.Second, "the lock to be held again", func() (bool, error) {
		var n int
		err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			 WHERE application_name = $1 AND datname = current_database()`, w.lockConnName(id)).Scan(&n)
		return n == 1 && w.task(id).InitialEventLocked, err
	})
	// The re-taken lock holds no snapshot while idle: a long-lived one
	// would make CREATE INDEX CONCURRENTLY (migration 5) wait for the task
	// to end. (Row mode's lock is a transaction left open, which could;
	// advisory mode's session writes the task's events too, and holds a
	// snapshot only while each runs.)
	testenv.Eventually(t, 15*time.Second, "the re-taken lock's session to hold no snapshot while idle", func() (bool, error) {
		var free bool
		err := w.Pool.QueryRow(context.Background(), `SELECT backend_xmin IS NULL FROM pg_stat_activity
			 WHERE application_name = $1 AND datname = current_database() AND state <> 'active'`, w.lockConnName(id)).Scan(&free)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return free, err
	})
	got := w.waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 || len(w.starts(id)) != 1 {
		t.Errorf("%s after %d attempts, starts %v: want DONE after a single start", got.Status, got.Attempt, w.starts(id))
	}
}

func TestLockConnectionLossWithoutGraceStopsTheCommand(t *testing.T) {
	testenv.LockModes(t, testLockConnectionLossWithoutGraceStopsTheCommand)
}

func testLockConnectionLossWithoutGraceStopsTheCommand(t *testing.T) {
	env := testenv.New(t)
	w := &world{Env: env, cfg: env.WriteConfig(strings.Replace(sampleConfigFor(10), "kill_grace: 1s", "kill_grace: 1s\nreconnect_grace: 0s", 1)),
		startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	w.Start(w.cfg, "supervisor")
	id := w.submit(100, 100)
	running := w.waitRunning(id)
	w.waitFor(id, 20*time.Second, "to start its command", func(etlcontext.Task) bool { return len(w.starts(id)) == 1 })
	commandPID, _ := strconv.Atoi(w.starts(id)[0][0])
	w.terminateLockConn(id)
	testenv.Eventually(t, 15*time.Second, "the command and its runner to stop", func() (bool, error) {
		return !testenv.Alive(commandPID) && !testenv.Alive(*running.PID), nil
	})
	got := w.waitSettled(id, 90*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("%s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	a := w.Dama(w.cfg, "submit", "sample", "--idempotency-key", "nightly-2026-11-21")
	b := w.Dama(w.cfg, "submit", "sample", "--idempotency-key", "nightly-2026-11-21", "--args", `{"steps": 99}`)
	if a.Code != 0 || b.Code != 0 || a.Stdout != b.Stdout {
		t.Fatalf("two submissions with one key: %q (%d) and %q (%d)", a.Stdout, a.Code, b.Stdout, b.Code)
	}
	var contexts, jobs int
	if err := w.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM data_manager.etl_contexts), (SELECT count(*) FROM river_job)`).Scan(&contexts, &jobs); err != nil {
		t.Fatal(err)
	}
	if contexts != 1 || jobs != 1 {
		t.Errorf("%d contexts and %d jobs, want 1 and 1", contexts, jobs)
	}

	parent := testenv.Atoi(t, a.Stdout)
	child := w.Dama(w.cfg, "submit", "sample", "--parent", strconv.FormatInt(parent, 10))
	if child.Code != 0 {
		t.Fatalf("submit a child: %s", child.Stderr)
	}
	if got := w.task(testenv.Atoi(t, child.Stdout)); got.ParentID == nil || *got.ParentID != parent {
		t.Errorf("child's parent_context_id %v, want %d", deref(got.ParentID), parent)
	}

	var listed []etlcontext.Task
	res := w.Dama(w.cfg, "status", "--json", "--status", "queued", "--limit", "1")
	if err := json.Unmarshal([]byte(res.Stdout), &listed); err != nil || len(listed) != 1 || listed[0].ID != testenv.Atoi(t, child.Stdout) {
		t.Errorf("status --status queued --limit 1: %v %+v (stderr %s), want the newest task alone", err, listed, res.Stderr)
	}
	res = w.Dama(w.cfg, "status", "--json", "--status", "done")
	if err := json.Unmarshal([]byte(res.Stdout), &listed); err != nil || len(listed) != 0 {
		t.Errorf("status --status done: %v %+v, want none", err, listed)
	}
}

// A key names one submission of one kind: reusing it with another kind is an
// error, not the other kind's task, and keys starting with dama: are dama's
// own (schedule ticks, children).
func TestIdempotencyKeyOfAnotherKindOrDamasOwnIsRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	cfg := w.WriteConfig(sampleConfigFor(10) + `
  other:
    queue: etl
    command: ["{{sample}}"]
`)
	first := w.Dama(cfg, "submit", "sample", "--idempotency-key", "K")
	if first.Code != 0 {
		t.Fatalf("submit: exit %d: %s", first.Code, first.Stderr)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"another kind", []string{"submit", "other", "--idempotency-key", "K"},
			`dama: submit other task: idempotency key belongs to a task of another kind: "K" is the key of etl context ` + strings.TrimSpace(first.Stdout) + `, of kind sample`},
		{"a child's key", []string{"submit", "sample", "--idempotency-key", "dama:child:" + strings.TrimSpace(first.Stdout) + ":part-1"},
			`dama: submit sample task: idempotency key "dama:child:` + strings.TrimSpace(first.Stdout) + `:part-1": idempotency keys starting with "dama:" are reserved for dama's own submissions`},
		{"a tick's key", []string{"submit", "sample", "--idempotency-key", "dama:schedule:sample:2026-11-21T02:00:00Z"}, `are reserved for dama's own submissions`},
		{"bare prefix", []string{"submit", "sample", "--idempotency-key", "dama:"}, `are reserved for dama's own submissions`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := w.Dama(cfg, c.args...)
			lines := strings.Split(strings.TrimRight(res.Stderr, "\n"), "\n")
			if res.Code != 1 || len(lines) != 1 || !strings.Contains(lines[0], c.want) || res.Stdout != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want 1, nothing on stdout, one line with %q", res.Code, res.Stdout, res.Stderr, c.want)
			}
		})
	}
	if again := w.Dama(cfg, "submit", "sample", "--idempotency-key", "K"); again.Code != 0 || again.Stdout != first.Stdout {
		t.Errorf("same kind again: exit %d, stdout %q, stderr %q; want 0 and %q", again.Code, again.Stdout, again.Stderr, first.Stdout)
	}
	var contexts, jobs int
	if err := w.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM data_manager.etl_contexts), (SELECT count(*) FROM river_job)`).Scan(&contexts, &jobs); err != nil {
		t.Fatal(err)
	}
	if contexts != 1 || jobs != 1 {
		t.Errorf("%d contexts and %d jobs, want 1 and 1", contexts, jobs)
	}
}

func TestBadInputIsOneLineAndWritesNothing(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	unreachable := *w.Env
	unreachable.URL = "postgres://nobody@127.0.0.1:1/none?connect_timeout=2"
	cases := []struct {
		name string
		env  *testenv.Env
		cfg  string
		args []string
		want string
	}{
		{"unknown kind", w.Env, w.cfg, []string{"submit", "nope"}, "unknown kind"},
		{"malformed JSON", w.Env, w.cfg, []string{"submit", "sample", "--args", "{oops"}, "not valid JSON"},
		{"missing config", w.Env, "", []string{"submit", "sample"}, "no configuration file"},
		{"config not found", w.Env, filepath.Join(w.Dir, "absent.yaml"), []string{"submit", "sample"}, "read configuration"},
		{"unreachable database", &unreachable, w.cfg, []string{"submit", "sample"}, "connect to database"},
		{"bad id", w.Env, w.cfg, []string{"status", "x"}, "invalid etl context id"},
		{"unknown id", w.Env, w.cfg, []string{"events", "12345"}, "not found"},
		{"unknown flag", w.Env, w.cfg, []string{"submit", "sample", "--nope"}, "unknown flag"},
		{"unknown parent", w.Env, w.cfg, []string{"submit", "sample", "--parent", "999"}, "parent etl context 999 does not exist"},
		{"negative delay", w.Env, w.cfg, []string{"submit", "sample", "--delay", "-1s"}, "must not be negative"},
		{"a number read back far longer", w.Env, w.cfg, []string{"submit", "sample", "--args", `{"n": 1e70}`}, "write them in full, or as strings"},
		{"NUL in arguments", w.Env, w.cfg, []string{"submit", "sample", "--args", `{"s": "a\u0000b"}`}, "cannot store"},
		{"arguments too large", w.Env, w.cfg, []string{"submit", "sample", "--args", `{"blob": "` + strings.Repeat("x", 100<<10) + `"}`}, "DAMA_ARGS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := c.env.Dama(c.cfg, c.args...)
			lines := strings.Split(strings.TrimRight(res.Stderr, "\n"), "\n")
			if res.Code == 0 || len(lines) != 1 || !strings.Contains(lines[0], c.want) || res.Stdout != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want non-zero, nothing on stdout, one line mentioning %q", res.Code, res.Stdout, res.Stderr, c.want)
			}
		})
	}
	var contexts, jobs int
	if err := w.Pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM data_manager.etl_contexts), (SELECT count(*) FROM river_job)`).Scan(&contexts, &jobs); err != nil {
		t.Fatal(err)
	}
	if contexts != 0 || jobs != 0 {
		t.Errorf("bad input wrote %d contexts and %d jobs", contexts, jobs)
	}
}

func TestJobFinalizedBehindDamasBackIsReconciled(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	id := w.submit(30, 100)
	running := w.waitRunning(id)
	// What River's own rescuer does to a job stuck 'running' for an hour on
	// its last attempt, while the task is in fact alive.
	if _, err := w.Pool.Exec(context.Background(), `
		UPDATE river_job SET state = 'discarded', finalized_at = now() WHERE id = $1`, *running.RiverJobID); err != nil {
		t.Fatal(err)
	}
	got := w.waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusDone || *got.PID != *running.PID {
		t.Errorf("%s, pid %d -> %d; want DONE by the same process", got.Status, *running.PID, *got.PID)
	}
	if starts := w.starts(id); len(starts) != 1 {
		t.Errorf("starts: %v, want exactly one", starts)
	}
}

func TestFreedSlotIsTakenWithoutWaitingForThePoll(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 60s
queues:
  one: { max_running: 1 }
kinds:
  sample:
    queue: one
    command: ["{{sample}}"]
`)
	w := &world{Env: env, cfg: cfg, startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	w.Start(cfg, "supervisor")
	first := w.submit(10, 100)
	w.waitRunning(first)
	second := w.submit(10, 100)
	// The second task is snoozed for the 60s poll interval while the queue is
	// full; only the wake on the first task's exit starts it sooner.
	for _, id := range []int64{first, second} {
		if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone {
			t.Fatalf("context %d: %s", id, got.Status)
		}
	}
}

func TestSupervisorStopsOnSIGTERMWithoutTouchingTasks(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	sup := w.Start(w.cfg, "supervisor")
	id := w.submit(100, 100)
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
	w.Start(w.cfg, "supervisor")
	if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone || *got.PID != *running.PID {
		t.Errorf("%s by pid %v, want DONE by the adopted pid %d", got.Status, deref(got.PID), *running.PID)
	}
}

func TestDelayedSubmission(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	res := w.Dama(w.cfg, "submit", "sample", "--delay", "3s", "--args", `{"steps": 1, "step_ms": 1}`)
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	var delay float64
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT extract(epoch FROM j.scheduled_at - c.created_at)
		  FROM data_manager.etl_contexts AS c JOIN river_job AS j ON j.id = c.river_job_id
		 WHERE c.etl_context_id = $1`, id).Scan(&delay); err != nil {
		t.Fatal(err)
	}
	if delay < 2.5 {
		t.Fatalf("job scheduled %.2fs after submission, want about 3s", delay)
	}
	got := w.waitSettled(id, 30*time.Second)
	if got.Status != etlcontext.StatusDone || got.StartedAt.Sub(got.CreatedAt) < 2500*time.Millisecond {
		t.Errorf("%s, started %s after submission; want DONE, started no earlier than the delay", got.Status, got.StartedAt.Sub(got.CreatedAt))
	}
}

func TestNoSecondCopyWhileALockLessCommandIsStopping(t *testing.T) {
	testenv.LockModes(t, testNoSecondCopyWhileALockLessCommandIsStopping)
}

func testNoSecondCopyWhileALockLessCommandIsStopping(t *testing.T) {
	env := testenv.New(t)
	// The command ignores SIGTERM (and its sleep inherits that), so after its
	// runner loses the lock it lingers for the whole kill grace.
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
heartbeat_interval: 200ms
kill_grace: 3s
reconnect_grace: 0s
kinds:
  stubborn:
    command: ["/bin/sh", "-c", "trap '' TERM; echo $$ $DAMA_ATTEMPT >> {{dir}}/starts; if [ $DAMA_ATTEMPT = 1 ]; then sleep 60; fi"]
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	res := w.Dama(cfg, "submit", "stubborn")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	w.waitRunning(id)
	startLines := func() []string {
		data, _ := os.ReadFile(filepath.Join(env.Dir, "starts"))
		return strings.Fields(string(data))
	}
	testenv.Eventually(t, 20*time.Second, "the command to start", func() (bool, error) { return len(startLines()) == 2, nil })
	oldPID, _ := strconv.Atoi(startLines()[0])

	w.terminateLock(id)
	noSecondStartWhileAlive(t, oldPID, startLines)
	if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("%s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
}

// onOtherHost runs a command in a UTS namespace of its own, where the host
// name is name: a second host, as far as dama can tell.
func onOtherHost(t *testing.T, name string) []string {
	t.Helper()
	if out, err := exec.Command("unshare", "--uts", "true").CombinedOutput(); err != nil {
		t.Skipf("a second host name needs unshare --uts (root): %v %s", err, out)
	}
	return []string{"unshare", "--uts", "sh", "-c", `hostname "$0" && exec "$@"`, name}
}

func TestAdoptionAndRetryAcrossHosts(t *testing.T) {
	testenv.LockModes(t, testAdoptionAndRetryAcrossHosts)
}

func testAdoptionAndRetryAcrossHosts(t *testing.T) {
	env := testenv.New(t)
	// In host lock mode one session holds the locks of all the host's
	// tasks: the adopted task holds its own, so that only the orphaned
	// task's lock is lost.
	mode, adoptedMode := "", ""
	if env.LockMode == config.LockModeHost {
		mode, adoptedMode = "lock_mode: host", "lock_mode: advisory"
	}
	cfg := env.WriteConfig(mode + `
log_dir: {{dir}}/logs
poll_interval: 300ms
heartbeat_interval: 200ms
kill_grace: 5s
reconnect_grace: 0s
kinds:
  stubborn:
    command: ["/bin/sh", "-c", "trap '' TERM; echo $$ $DAMA_ATTEMPT >> {{dir}}/starts-$DAMA_ETL_CONTEXT_ID; sleep 8"]
  stubborn_too:
    command: ["/bin/sh", "-c", "trap '' TERM; echo $$ $DAMA_ATTEMPT >> {{dir}}/starts-$DAMA_ETL_CONTEXT_ID; sleep 8"]
    ` + adoptedMode + `
`)
	w := &world{Env: env, cfg: cfg}
	other := onOtherHost(t, "dama-other-host")
	startLines := func(id int64) []string {
		data, _ := os.ReadFile(filepath.Join(env.Dir, fmt.Sprintf("starts-%d", id)))
		return strings.Fields(string(data))
	}
	submit := func(kind string) int64 {
		res := w.Dama(cfg, "submit", kind)
		if res.Code != 0 {
			t.Fatalf("submit: %s", res.Stderr)
		}
		return testenv.Atoi(t, res.Stdout)
	}

	remote := env.StartWrapped(cfg, other, "supervisor")
	adopted, orphaned := submit("stubborn_too"), submit("stubborn")
	for _, id := range []int64{adopted, orphaned} {
		if got := w.waitRunning(id); deref(got.Host) != "dama-other-host" {
			t.Fatalf("context %d runs on %v, want dama-other-host", id, deref(got.Host))
		}
		testenv.Eventually(t, 20*time.Second, "the command to start", func() (bool, error) { return len(startLines(id)) == 2, nil })
	}
	if err := syscall.Kill(-remote.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The orphaned task loses its lock while its command ignores SIGTERM:
	// it runs on for the kill grace, and this host cannot see its process.
	w.terminateLock(orphaned)
	oldPID, _ := strconv.Atoi(startLines(orphaned)[0])
	w.Start(cfg, "supervisor")
	noSecondStartWhileAlive(t, oldPID, func() []string { return startLines(orphaned) })

	if got := w.waitSettled(adopted, 60*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 || len(startLines(adopted)) != 2 {
		t.Errorf("adopted task: %s after %d attempts, starts %v; want DONE after a single start", got.Status, got.Attempt, startLines(adopted))
	}
	got := w.waitSettled(orphaned, 60*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("orphaned task: %s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	host, _ := os.Hostname()
	if deref(got.Host) != host {
		t.Errorf("the retry ran on %v, want this host %s", deref(got.Host), host)
	}
}

func TestMigrateTwiceAtOnce(t *testing.T) {
	t.Parallel()
	env := testenv.NewUnmigrated(t)
	cfg := env.WriteConfig(sampleConfigFor(10))
	if res := env.Dama(cfg, "submit", "sample"); res.Code == 0 || !strings.Contains(res.Stderr, "not migrated: run dama migrate") {
		t.Fatalf("submit on an unmigrated database: exit %d, stderr %q", res.Code, res.Stderr)
	}
	results := make(chan testenv.Result, 2)
	for range 2 {
		go func() { results <- env.Dama(cfg, "migrate") }()
	}
	for range 2 {
		if res := <-results; res.Code != 0 {
			t.Errorf("concurrent dama migrate: exit %d: %s", res.Code, res.Stderr)
		}
	}
	if res := env.Dama(cfg, "migrate"); res.Code != 0 {
		t.Errorf("dama migrate on a migrated database: exit %d: %s", res.Code, res.Stderr)
	}
	if res := env.Dama(cfg, "submit", "sample"); res.Code != 0 || testenv.Atoi(t, res.Stdout) != 1 {
		t.Errorf("submit after migrate: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
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
	// Then calm: everything must settle.
	testenv.Eventually(t, 90*time.Second, "every task DONE with its job completed", func() (bool, error) {
		if allDone() {
			return true, nil
		}
		var summary string
		err := w.Pool.QueryRow(context.Background(), `
			SELECT string_agg(etl_context_id || ':' || etl_status || '/' || coalesce(job_state, '-') || '@' || attempt, ' ')
			  FROM data_manager.dama_task_queue WHERE etl_status <> 'DONE' OR job_state IS DISTINCT FROM 'completed'`).Scan(&summary)
		return false, fmt.Errorf("unsettled: %s (%v)", summary, err)
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

func TestLogsFollowUntilTheTaskEnds(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	w.Start(w.cfg, "supervisor")
	id := w.submit(20, 100)
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
	for _, want := range []string{"command started", fmt.Sprintf("context %d attempt 1: steps 0 to 20", id), fmt.Sprintf("context %d done", id)} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("followed log lacks %q:\n%s", want, res.Stdout)
		}
	}
}

func TestSupervisorLeavesKindsItDoesNotRunToOthers(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	narrow := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
queues: { etl: {} }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
`)
	wide := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
queues: { etl: {} }
kinds:
  sample: { queue: etl, command: ["{{sample}}"] }
  other: { queue: etl, command: ["/bin/true"] }
`)
	w := &world{Env: env, cfg: wide}
	narrowSup := env.Start(narrow, "supervisor")
	res := env.Dama(wide, "submit", "other")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	testenv.Eventually(t, 20*time.Second, "the narrow supervisor to pass the task over", func() (bool, error) {
		log, err := os.ReadFile(narrowSup.Log)
		return strings.Contains(string(log), "leaving the task to another supervisor"), err
	})
	if got := w.task(id); got.Status != etlcontext.StatusQueued || got.Attempt != 0 {
		t.Fatalf("a supervisor without the kind touched the task: %s, attempt %d", got.Status, got.Attempt)
	}
	env.Start(wide, "supervisor")
	if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}
}
