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

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testConfig is dama.yaml with short intervals, and two more kinds on the
// same function: one with a timeout, one that is given little grace.
const testConfig = `
log_dir: {{dir}}/logs
poll_interval: 300ms
heartbeat_interval: 200ms
kill_grace: 1s
reconnect_grace: 0s
kinds:
  copy_rows:
    function: copy_rows
    retry: {delay: 200ms, backoff: fixed}
  copy_rows_timed:
    function: copy_rows
    timeout: 1s
    on_timeout: fail
  fan_out:
    function: fan_out
    await_children: true
    children: [copy_rows]
`

type world struct {
	*testenv.Env
	cfg       string
	startsDir string
}

func newWorld(t *testing.T) *world {
	env := testenv.New(t)
	w := &world{Env: env, cfg: env.WriteConfig(testConfig), startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return w
}

// supervisor starts sample-embedded's supervisor.
func (w *world) supervisor() *testenv.Proc {
	w.T.Helper()
	return w.StartProgram(w.SampleEmbedded, w.cfg, "supervisor")
}

// submit submits a task with `dama submit` on the same configuration: the
// dama binary accepts function kinds everywhere but in its supervisor.
func (w *world) submit(kind string, args map[string]any) int64 {
	w.T.Helper()
	if kind != "fan_out" {
		args["starts_dir"] = w.startsDir
	}
	b, _ := json.Marshal(args)
	res := w.Dama(w.cfg, "submit", kind, "--args", string(b))
	if res.Code != 0 {
		w.T.Fatalf("submit %s: exit %d: %s", kind, res.Code, res.Stderr)
	}
	return testenv.Atoi(w.T, res.Stdout)
}

func (w *world) task(id int64) etlcontext.Task {
	w.T.Helper()
	return w.Task(id)
}

func (w *world) waitFor(id int64, timeout time.Duration, what string, cond func(etlcontext.Task) bool) etlcontext.Task {
	w.T.Helper()
	return w.WaitForTask(id, timeout, what, cond)
}

// waitSettled waits for the task to be finished with its River job in
// the matching final state (a task failed for good before its last
// attempt has its job cancelled).
func (w *world) waitSettled(id int64) etlcontext.Task {
	w.T.Helper()
	return w.waitFor(id, time.Minute, "to finish with its job settled", func(t etlcontext.Task) bool {
		if !t.Status.Finished() || t.JobState == nil {
			return false
		}
		switch job := *t.JobState; t.Status {
		case etlcontext.StatusDone:
			return job == "completed"
		case etlcontext.StatusFailed:
			return job == "discarded" || job == "cancelled"
		}
		return *t.JobState == "cancelled"
	})
}

// starts returns what the function recorded at each start: pid, attempt,
// first row.
func (w *world) starts(id int64) [][3]int {
	w.T.Helper()
	data, err := os.ReadFile(filepath.Join(w.startsDir, strconv.FormatInt(id, 10)+".starts"))
	if err != nil && !os.IsNotExist(err) {
		w.T.Fatal(err)
	}
	var out [][3]int
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var s [3]int
		if _, err := fmt.Sscan(line, &s[0], &s[1], &s[2]); err != nil {
			w.T.Fatalf("starts line %q: %v", line, err)
		}
		out = append(out, s)
	}
	return out
}

// events returns the task's events by type (the kind's prefix cut), in
// order.
func (w *world) events(id int64) ([]string, map[string][]json.RawMessage) {
	w.T.Helper()
	events, err := etlcontext.Events(context.Background(), w.Pool, id)
	if err != nil {
		w.T.Fatal(err)
	}
	var types []string
	payloads := map[string][]json.RawMessage{}
	for _, e := range events {
		_, typ, _ := strings.Cut(e.Type, ":")
		types = append(types, typ)
		payloads[typ] = append(payloads[typ], e.Payload)
	}
	return types, payloads
}

func decode[T any](t *testing.T, raw json.RawMessage) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return v
}

type errorPayload struct {
	Reason  string `json:"reason"`
	Retry   *bool  `json:"retry"`
	LogTail string `json:"log_tail"`
}

func TestAFunctionReportsFailsAndResumesFromItsCheckpoint(t *testing.T) {
	w := newWorld(t)
	w.supervisor()
	id := w.submit("copy_rows", map[string]any{"rows": 6, "step_ms": 50, "fail_at": 3})
	got := w.waitSettled(id)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Fatalf("task %s at attempt %d: want DONE at attempt 2", got.Status, got.Attempt)
	}
	if s := w.starts(id); len(s) != 2 || s[0][1] != 1 || s[0][2] != 0 || s[1][1] != 2 || s[1][2] != 2 {
		t.Errorf("starts (pid attempt first-row): %v, want attempt 1 from row 0, then attempt 2 from row 2", s)
	}
	_, payloads := w.events(id)
	errs := payloads[protocol.EventError]
	if len(errs) != 1 {
		t.Fatalf("%d ERROR events, want 1", len(errs))
	}
	if e := decode[errorPayload](t, errs[0]); e.Reason != "source connection reset at row 3" || e.Retry != nil {
		t.Errorf("ERROR reason %q, retry %v: want the function's error, retried", e.Reason, e.Retry)
	}
	if p := decode[map[string]int](t, got.Progress); p["step"] != 6 || p["of"] != 6 {
		t.Errorf("progress %s, want step 6 of 6", got.Progress)
	}
	copied := payloads["ROWS_COPIED"]
	if len(copied) != 1 || decode[map[string]int](t, copied[0])["resumed_from"] != 2 {
		t.Errorf("ROWS_COPIED events %s, want one resumed from row 2", copied)
	}
	t.Logf("attempt 1 failed at row 3 with the function's error; attempt 2 resumed from row 2 and finished 6/6")
}

// TestWhatAFunctionStartsIsNotTheTask: a process the function starts gets
// none of dama's environment but DAMA_RUN_ID (by which the runner finds
// it): not the task's arguments, nor the role that would make this program
// a function process again.
func TestWhatAFunctionStartsIsNotTheTask(t *testing.T) {
	w := newWorld(t)
	w.supervisor()
	envFile := filepath.Join(w.Dir, "env")
	id := w.submit("copy_rows", map[string]any{"rows": 1, "step_ms": 10, "env_file": envFile})
	if got := w.waitSettled(id); got.Status != etlcontext.StatusDone {
		t.Fatalf("task %s, want DONE", got.Status)
	}
	data, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	var dama []string
	for _, kv := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(kv, "DAMA_") {
			dama = append(dama, kv)
		}
	}
	if len(dama) != 1 || !strings.HasPrefix(dama[0], protocol.RunIDEnv+"=") {
		t.Errorf("a process the function started got %v: want %s alone", dama, protocol.RunIDEnv)
	}
}

func TestNoRetryFailsForGoodAndAPanicIsRecorded(t *testing.T) {
	w := newWorld(t)
	w.supervisor()
	final := w.submit("copy_rows", map[string]any{"rows": 5, "step_ms": 20, "fail_at": 2, "fail_for_good": true})
	panicky := w.submit("copy_rows", map[string]any{"rows": 5, "step_ms": 20, "panic_at": 2})

	if got := w.waitSettled(final); got.Status != etlcontext.StatusFailed || got.Attempt != 1 {
		t.Errorf("NoRetry task %s at attempt %d: want FAILED at attempt 1", got.Status, got.Attempt)
	}
	_, payloads := w.events(final)
	if e := decode[errorPayload](t, payloads[protocol.EventError][0]); e.Reason != "source connection reset at row 2" || e.Retry == nil || *e.Retry {
		t.Errorf("NoRetry ERROR reason %q, retry %v: want the function's error, retry false", e.Reason, e.Retry)
	}

	if got := w.waitSettled(panicky); got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("panicking task %s at attempt %d: want DONE at attempt 2", got.Status, got.Attempt)
	}
	_, payloads = w.events(panicky)
	e := decode[errorPayload](t, payloads[protocol.EventError][0])
	if !strings.HasPrefix(e.Reason, "panic: row 2: unexpected NULL (at main.copyRows ") || !strings.Contains(e.LogTail, "main.copyRows") {
		t.Errorf("panic ERROR reason %q, log tail %q: want the panic, where it happened, and its stack", e.Reason, e.LogTail)
	}
}

// TestAFunctionTaskIsAdoptedAfterItsSupervisorIsKilled: the function's
// task runs on through a kill -9 of the program that started it, is
// adopted by the next, holds its lock throughout, and finishes once.
func TestAFunctionTaskIsAdoptedAfterItsSupervisorIsKilled(t *testing.T) {
	w := newWorld(t)
	first := w.supervisor()
	// It runs until the test has seen it through the kill.
	release := filepath.Join(w.Dir, "release")
	id := w.submit("copy_rows", map[string]any{"rows": 30, "step_ms": 100, "until_file": release})
	running := w.waitFor(id, 30*time.Second, "to run and report progress", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && t.InitialEventLocked && t.Progress != nil
	})
	first.Kill(t, syscall.SIGKILL)
	<-first.Done()

	// The lock proves the task runs: a second runner for it, started as
	// the supervisor starts one, exits at once.
	res, log := w.runner(id, *running.RunID)
	if res != protocol.ExitLocked || !strings.Contains(log, "another process holds the lock of this task") {
		t.Errorf("second runner: exit %d, log %q: want %d (ExitLocked) because another process holds the lock", res, log, protocol.ExitLocked)
	}
	if now := w.task(id); now.Status != etlcontext.StatusRunning || !now.InitialEventLocked || *now.PID != *running.PID {
		t.Fatalf("after the supervisor's kill: %s, locked %v, pid %v: want RUNNING and locked by pid %d", now.Status, now.InitialEventLocked, now.PID, *running.PID)
	}

	// The next supervisor is up before the task may end: it is adopted.
	next := w.supervisor()
	testenv.Eventually(t, time.Minute, "the next supervisor to start", func() (bool, error) {
		log, err := os.ReadFile(next.Log)
		return strings.Contains(string(log), "supervisor started"), err
	})
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := w.waitSettled(id)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("task %s at attempt %d: want DONE at attempt 1", got.Status, got.Attempt)
	}
	if s := w.starts(id); len(s) != 1 {
		t.Errorf("starts %v: want one", s)
	}
	t.Logf("runner pid %d ran through the kill -9 of its supervisor; a second runner exited %d; DONE at attempt 1 under the next supervisor", *running.PID, res)
}

// Both processes of a function's task, its runner and the function's own,
// name the task in a process listing: pid to task at a glance.
func TestAFunctionsProcessesNameTheirTask(t *testing.T) {
	w := newWorld(t)
	w.supervisor()
	release := filepath.Join(w.Dir, "release")
	id := w.submit("copy_rows", map[string]any{"rows": 1, "step_ms": 10, "until_file": release})
	running := w.waitFor(id, 30*time.Second, "to run and report progress", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && t.PID != nil && t.Progress != nil
	})
	names := "\x00--context-id\x00" + strconv.FormatInt(id, 10) + "\x00"
	for what, pid := range map[string]int{"runner": *running.PID, "function process": w.starts(id)[0][0]} {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains(string(cmdline), names) {
			t.Errorf("the %s's command line %q (%v): want it to name task %d", what, cmdline, err, id)
		}
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id); got.Status != etlcontext.StatusDone {
		t.Errorf("task %s, want DONE", got.Status)
	}
}

// runner starts sample-embedded as the runner of context id, as a
// supervisor would, and returns its exit code and its log.
func (w *world) runner(id int64, runID string) (int, string) {
	w.T.Helper()
	launch := protocol.Launch{ContextID: id, RunID: runID, LockMode: config.LockModeRow}
	if w.LockMode != "" {
		launch.LockMode = w.LockMode
	}
	p := w.StartProgramWith(w.SampleEmbedded, w.cfg, []string{protocol.ProcessEnv + "=" + protocol.ProcessRunner}, launch.Args()...)
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		w.T.Fatal("the second runner did not exit within 30s")
	}
	log, err := os.ReadFile(p.Log)
	if err != nil {
		w.T.Fatal(err)
	}
	return p.Cmd.ProcessState.ExitCode(), string(log)
}

// TestAFunctionThatIgnoresCancellationIsStopped: cancelling cancels the
// function's context; one that sleeps through it is killed after
// kill_grace, as is one past its kind's timeout. Nothing of either is left.
func TestAFunctionThatIgnoresCancellationIsStopped(t *testing.T) {
	w := newWorld(t)
	w.supervisor()
	polite := w.submit("copy_rows", map[string]any{"rows": 1000, "step_ms": 50})
	stubborn := w.submit("copy_rows", map[string]any{"rows": 1000, "step_ms": 50, "ignore_cancel": true})
	timed := w.submit("copy_rows_timed", map[string]any{"rows": 1000, "step_ms": 50, "ignore_cancel": true})
	for _, id := range []int64{polite, stubborn} {
		w.waitFor(id, 30*time.Second, "to report progress", func(t etlcontext.Task) bool { return t.Progress != nil })
		if res := w.Dama(w.cfg, "cancel", strconv.FormatInt(id, 10)); res.Code != 0 {
			t.Fatalf("cancel %d: exit %d: %s", id, res.Code, res.Stderr)
		}
	}
	// The polite function returns when its ctx is cancelled (exit 1); the
	// others are killed (-1).
	wantExit := map[int64]int{polite: 1, stubborn: -1, timed: -1}
	for id, want := range map[int64]etlcontext.Status{polite: etlcontext.StatusCancelled, stubborn: etlcontext.StatusCancelled, timed: etlcontext.StatusFailed} {
		got := w.waitSettled(id)
		if got.Status != want || got.Attempt != 1 {
			t.Errorf("task %d %s at attempt %d: want %s at attempt 1", id, got.Status, got.Attempt, want)
		}
		_, payloads := w.events(id)
		outcome := payloads[protocol.EventCancelled]
		if want == etlcontext.StatusFailed {
			outcome = payloads[protocol.EventError]
		}
		if len(outcome) != 1 || decode[map[string]any](t, outcome[0])["exit_code"] != float64(wantExit[id]) {
			t.Errorf("task %d: outcome %s, want exit_code %d", id, outcome, wantExit[id])
		}
		for _, s := range w.starts(id) {
			if testenv.Alive(s[0]) {
				t.Errorf("task %d: its function process %d is still alive", id, s[0])
			}
		}
	}
	types, payloads := w.events(timed)
	if !strings.Contains(strings.Join(types, " "), protocol.EventTimeout) {
		t.Errorf("timed task's events %v: want a TIMEOUT", types)
	}
	if e := decode[errorPayload](t, payloads[protocol.EventError][0]); !strings.Contains(e.Reason, "timed out") {
		t.Errorf("timed task's ERROR reason %q: want the timeout", e.Reason)
	}
}

// TestAFunctionSubmitsChildrenAndAwaitsThem: fan_out submits three
// copy_rows children and is DONE when they all are.
func TestAFunctionSubmitsChildrenAndAwaitsThem(t *testing.T) {
	w := newWorld(t)
	w.supervisor()
	parent := w.submit("fan_out", map[string]any{"parts": 3, "rows": 4})
	got := w.waitSettled(parent)
	if got.Status != etlcontext.StatusDone || got.Children[etlcontext.StatusDone] != 3 {
		t.Fatalf("parent %s, children %+v: want DONE with 3 children DONE", got.Status, got.Children)
	}
	types, _ := w.events(parent)
	if n := strings.Count(strings.Join(types, " "), protocol.EventSubmitted); n != 3 {
		t.Errorf("parent's events %v: want 3 SUBMITTED", types)
	}
}

// TestTheDamaSupervisorRefusesFunctionKinds: the dama binary cannot run a
// function; it says so in one line rather than taking the kind's tasks.
func TestTheDamaSupervisorRefusesFunctionKinds(t *testing.T) {
	w := newWorld(t)
	res := w.Dama(w.cfg, "supervisor")
	if res.Code == 0 || strings.Count(strings.TrimSpace(res.Stderr), "\n") != 0 || !strings.Contains(res.Stderr, "unregistered function") {
		t.Errorf("dama supervisor: exit %d, stderr %q: want one line about the unregistered function", res.Code, res.Stderr)
	}
}

// TestAnUnknownTaskProcessRoleIsRefused: a program told to be a task
// process it does not know exits, rather than running its normal main (a
// whole supervisor).
func TestAnUnknownTaskProcessRoleIsRefused(t *testing.T) {
	w := newWorld(t)
	p := w.StartProgramWith(w.SampleEmbedded, w.cfg, []string{protocol.ProcessEnv + "=janitor"}, "supervisor")
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("sample-embedded with an unknown task process role still runs after 30s")
	}
	log, _ := os.ReadFile(p.Log)
	if code := p.Cmd.ProcessState.ExitCode(); code != protocol.ExitSetup || !strings.Contains(string(log), `DAMA_TASK_PROCESS="janitor"`) {
		t.Errorf("exit %d, output %q: want %d and the role refused", code, log, protocol.ExitSetup)
	}
}
