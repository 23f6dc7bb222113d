package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// terminalConfig has the sample task, and one that fails for good at once.
const terminalConfig = `
log_dir: {{dir}}/logs
poll_interval: 500ms
kill_grace: 1s
kinds:
  sample:
    command: ["{{sample}}"]
  fragile:
    command: ["{{sample}}"]
    max_attempts: 1
  flaky:
    command: ["{{sample}}"]
    retry: {delay: 200ms, backoff: fixed}
`

func sampleArgs(t *testing.T, steps, stepMS int, extra map[string]any) string {
	t.Helper()
	args := map[string]any{"steps": steps, "step_ms": stepMS}
	for k, v := range extra {
		args[k] = v
	}
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestSubmitWaitExitsWithTheTaskOutcome: `dama submit --wait` prints the id
// at once, follows the task, and exits 0 only for DONE; FAILED and
// CANCELLED exit 2 and 3 with the last error on stderr; an interrupted wait
// leaves the task running.
func TestSubmitWaitExitsWithTheTaskOutcome(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(terminalConfig)
	env.Start(cfg, "supervisor")

	res := env.Dama(cfg, "submit", "sample", "--wait", "--args", sampleArgs(t, 3, 100, nil))
	if res.Code != 0 || strings.Count(res.Stdout, "\n") != 1 || !strings.Contains(res.Stderr, "DONE attempt 1/3") {
		t.Errorf("DONE task: exit %d, stdout %q, stderr %q: want 0, the id alone, and the status on stderr", res.Code, res.Stdout, res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	if res.Stderr != "" && strings.Contains(res.Stderr, "\033") {
		t.Errorf("stderr is not a terminal but got escape sequences: %q", res.Stderr)
	}

	// Off a terminal, a line per change of status or attempt.
	res = env.Dama(cfg, "submit", "flaky", "--wait", "--args", sampleArgs(t, 20, 100, map[string]any{"fail_at": 2}))
	if res.Code != 0 || !strings.Contains(res.Stderr, "DONE attempt 2/3") {
		t.Errorf("task retried once: exit %d, stderr %q: want 0 and DONE at attempt 2", res.Code, res.Stderr)
	}
	var seen []string
	for _, line := range strings.Split(strings.TrimSpace(res.Stderr), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			t.Fatalf("stderr line %q: want task ID KIND STATUS attempt N/M", line)
		}
		key := f[3] + " " + f[5]
		if len(seen) > 0 && seen[len(seen)-1] == key {
			t.Errorf("stderr %q: %q printed twice in a row", res.Stderr, key)
		}
		seen = append(seen, key)
	}
	if !slices.Contains(seen, "RETRYING 1/3") && !slices.Contains(seen, "RUNNING 2/3") {
		t.Errorf("lines %v: want the second attempt shown", seen)
	}

	res = env.Dama(cfg, "submit", "fragile", "--wait", "--args", sampleArgs(t, 3, 50, map[string]any{"fail_at": 2}))
	lines := strings.Split(strings.TrimSpace(res.Stderr), "\n")
	if last := lines[len(lines)-1]; res.Code != exitTaskFailed || !strings.HasPrefix(last, "dama: task ") || !strings.HasSuffix(last, "FAILED at attempt 1/1: exit 3: failing at step 2 as asked") {
		t.Errorf("FAILED task: exit %d, stderr %q: want %d and the last error", res.Code, res.Stderr, exitTaskFailed)
	}

	waiter := env.Start(cfg, "submit", "sample", "--wait", "--args", sampleArgs(t, 200, 100, nil))
	running := waitForLog(t, waiter, "RUNNING")
	cancelled := idFromLog(t, running)
	// Cancelled once its command runs (it has reported progress): the
	// reason is then the request's.
	w := &world{Env: env}
	w.waitFor(cancelled, 30*time.Second, "to report progress", func(t etlcontext.Task) bool { return t.Progress != nil })
	if res := env.Dama(cfg, "cancel", strconv.FormatInt(cancelled, 10)); res.Code != 0 {
		t.Fatalf("cancel: exit %d: %s", res.Code, res.Stderr)
	}
	waitExit(t, waiter)
	out, _ := os.ReadFile(waiter.Log)
	if code := waiter.Cmd.ProcessState.ExitCode(); code != exitTaskCancelled || !strings.Contains(string(out), "CANCELLED at attempt 1/3: cancel requested") {
		t.Errorf("CANCELLED task: exit %d, output %q: want %d and the reason", code, out, exitTaskCancelled)
	}

	// Runs on after its waiter is interrupted, for as long as the test looks.
	waiter = env.Start(cfg, "submit", "sample", "--wait", "--args", sampleArgs(t, 1, 100, map[string]any{"until_file": filepath.Join(env.Dir, "never")}))
	interrupted := idFromLog(t, waitForLog(t, waiter, "RUNNING"))
	waiter.Kill(t, syscall.SIGINT)
	waitExit(t, waiter)
	out, _ = os.ReadFile(waiter.Log)
	if code := waiter.Cmd.ProcessState.ExitCode(); code != exitTaskUnknown || !strings.Contains(string(out), "stopped waiting; task "+strconv.FormatInt(interrupted, 10)+" goes on") {
		t.Errorf("interrupted wait: exit %d, output %q: want %d and the task going on", code, out, exitTaskUnknown)
	}
	if got := w.task(interrupted); got.Status != etlcontext.StatusRunning {
		t.Errorf("after the wait was interrupted the task is %s, want RUNNING", got.Status)
	}
	t.Logf("DONE task %d exit 0; retried task: %v; FAILED exit %d; CANCELLED task %d exit %d; interrupted wait on task %d exit %d, task still RUNNING",
		id, seen, exitTaskFailed, cancelled, exitTaskCancelled, interrupted, exitTaskUnknown)
}

// TestSubmitWaitRidesOutADatabaseRestart: the database stopped (pg_ctl stop
// -m fast, every connection cut) for 4 s while `dama submit --wait` follows
// a task: the wait goes on, and exits 0 once the task is DONE, at attempt
// 1, its process having run through the outage.
func TestSubmitWaitRidesOutADatabaseRestart(t *testing.T) {
	testenv.LockModes(t, testSubmitWaitRidesOutADatabaseRestart)
}

func testSubmitWaitRidesOutADatabaseRestart(t *testing.T) {
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	cfg := env.WriteConfig(terminalConfig)
	env.Start(cfg, "supervisor")
	w := &world{Env: env}

	waiter := env.Start(cfg, "submit", "sample", "--wait", "--args", sampleArgs(t, 100, 100, nil))
	id := idFromLog(t, waitForLog(t, waiter, "RUNNING"))
	before := w.waitFor(id, 30*time.Second, "to report progress", func(t etlcontext.Task) bool { return t.Progress != nil && t.PID != nil })
	srv.Restart(t, 4*time.Second)
	select {
	case <-waiter.Done():
		out, _ := os.ReadFile(waiter.Log)
		t.Fatalf("the wait ended during the outage: exit %d, output %q", waiter.Cmd.ProcessState.ExitCode(), out)
	default:
	}
	waitExit(t, waiter)
	out, _ := os.ReadFile(waiter.Log)
	after := w.task(id)
	if code := waiter.Cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(string(out), "DONE attempt 1/3") {
		t.Fatalf("wait across the outage: exit %d, output %q: want 0 and DONE at attempt 1", code, out)
	}
	if after.Status != etlcontext.StatusDone || after.Attempt != 1 || *after.PID != *before.PID {
		t.Errorf("task %d after the outage: %s at attempt %d, pid %d (was %d): want DONE at attempt 1 by the same process", id, after.Status, after.Attempt, *after.PID, *before.PID)
	}
	t.Logf("task %d DONE at attempt 1 by pid %d across a 4 s outage; the wait exited 0", id, *after.PID)
}

// waitExit waits at most a minute for p to exit.
func waitExit(t *testing.T, p *testenv.Proc) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		t.Fatalf("%v still runs after a minute", p.Cmd.Args)
	}
}

// waitForLog waits for p's output to hold want and returns it.
func waitForLog(t *testing.T, p *testenv.Proc, want string) string {
	t.Helper()
	var out []byte
	testenv.Eventually(t, 30*time.Second, "output "+strconv.Quote(want), func() (bool, error) {
		var err error
		out, err = os.ReadFile(p.Log)
		return strings.Contains(string(out), want), err
	})
	return string(out)
}

// idFromLog reads the id that submit printed first.
func idFromLog(t *testing.T, out string) int64 {
	t.Helper()
	id, err := strconv.ParseInt(strings.SplitN(out, "\n", 2)[0], 10, 64)
	if err != nil {
		t.Fatalf("output %q does not start with an id", out)
	}
	return id
}

// onTerminal runs dama under a pseudo-terminal (util-linux's script) for at
// most timeout and returns what it wrote there.
func onTerminal(t *testing.T, env *testenv.Env, cfg string, size string, timeout time.Duration, args ...string) string {
	t.Helper()
	quoted := make([]string, 0, len(args)+1)
	for _, a := range append([]string{env.DamaBin}, args...) {
		quoted = append(quoted, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	// size is "COLS ROWS".
	cols, rows, _ := strings.Cut(size, " ")
	cmd := exec.Command("timeout", "-s", "INT", strconv.Itoa(int(timeout.Seconds())), "script", "-qec", "stty cols "+cols+" rows "+rows+" && exec "+strings.Join(quoted, " "), "/dev/null")
	cmd.Env = env.Environ(cfg)
	out, _ := cmd.Output()
	return string(out)
}

// TestProgressBarsOnATerminal: on a terminal, `submit --wait` redraws one
// line with a bar, and `status --watch` redraws the screen with bars.
func TestProgressBarsOnATerminal(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(terminalConfig)
	env.Start(cfg, "supervisor")

	out := onTerminal(t, env, cfg, "200 50", 60*time.Second, "submit", "sample", "--wait", "--args", sampleArgs(t, 10, 200, nil))
	for _, want := range []string{clearLine + "task ", "RUNNING attempt 1/3 [", "%", "DONE attempt 1/3 [####################] 100% 10/10"} {
		if !strings.Contains(out, want) {
			t.Errorf("submit --wait on a terminal wrote %q: want %q in it", out, want)
		}
	}

	res := env.Dama(cfg, "submit", "sample", "--args", sampleArgs(t, 100, 100, nil))
	id := testenv.Atoi(t, res.Stdout)
	w := &world{Env: env}
	w.waitFor(id, 30*time.Second, "to report progress", func(t etlcontext.Task) bool { return t.Progress != nil })
	// A wide terminal shows the whole table.
	out = onTerminal(t, env, cfg, "200 50", 10*time.Second, "status", "--watch", "--interval", "200ms")
	if n := strings.Count(out, clearScreen); n < 2 || !strings.Contains(out, "/100") || !strings.Contains(out, "[#") {
		t.Errorf("status --watch on a terminal: %d screens in %q: want at least 2, with a bar", n, out)
	}
	// A narrow one gets lines cut to its width, and no more lines than it
	// has rows: nothing wraps or scrolls away.
	for range 6 {
		env.Dama(cfg, "submit", "sample", "--args", sampleArgs(t, 100, 100, nil))
	}
	out = onTerminal(t, env, cfg, "40 6", 10*time.Second, "status", "--watch", "--interval", "200ms")
	screens := strings.Split(out, clearScreen)
	if len(screens) < 3 {
		t.Fatalf("status --watch on a 40x6 terminal: %q: want at least 2 screens", out)
	}
	for _, screen := range screens[1 : len(screens)-1] {
		lines := strings.Split(strings.TrimRight(screen, "\r\n"), "\r\n")
		if len(lines) > 6 {
			t.Errorf("a screen of %d lines on a terminal of 6 rows: %q", len(lines), screen)
		}
		for _, line := range lines {
			if n := len([]rune(line)); n > 39 {
				t.Errorf("a line of %d columns on a terminal of 40: %q", n, line)
			}
		}
	}
}

// TestStatusWatchWithoutATerminal prints plain tables until interrupted,
// then exits 0.
func TestStatusWatchWithoutATerminal(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(terminalConfig)
	env.Dama(cfg, "submit", "sample")
	p := env.Start(cfg, "status", "--watch", "--interval", "200ms")
	testenv.Eventually(t, 30*time.Second, "three tables", func() (bool, error) {
		out, err := os.ReadFile(p.Log)
		return strings.Count(string(out), "--- ") >= 3, err
	})
	p.Kill(t, syscall.SIGINT)
	waitExit(t, p)
	err := p.Wait()
	out, _ := os.ReadFile(p.Log)
	if err != nil || strings.Contains(string(out), "\033") || !strings.Contains(string(out), "QUEUED") {
		t.Errorf("status --watch: %v, output %q: want exit 0, plain tables with the task", err, out)
	}
}

// TestJSONLogsAndCompletion: --log-format json makes the supervisor log one
// JSON object per line; the CLI completes kinds and queues.
func TestJSONLogsAndCompletion(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(terminalConfig)
	sup := env.Start(cfg, "supervisor", "--log-format", "json")
	var lines []string
	testenv.Eventually(t, 30*time.Second, "the supervisor's start in its log", func() (bool, error) {
		out, err := os.ReadFile(sup.Log)
		lines = strings.Split(strings.TrimSpace(string(out)), "\n")
		return strings.Contains(string(out), "supervisor started"), err
	})
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["msg"] == nil || rec["level"] == nil {
			t.Errorf("log line %q: want a JSON object with msg and level (%v)", line, err)
		}
	}
	// Its last line, the error it stops on, is JSON too.
	res := env.Dama(filepath.Join(env.Dir, "missing.yaml"), "supervisor", "--log-format", "json")
	var rec map[string]any
	if err := json.Unmarshal([]byte(res.Stderr), &rec); res.Code == 0 || err != nil || rec["level"] != "ERROR" || !strings.HasPrefix(fmt.Sprint(rec["msg"]), "dama: ") {
		t.Errorf("supervisor --log-format json with a missing configuration: exit %d, stderr %q: want one JSON error line", res.Code, res.Stderr)
	}
	if res := env.Dama(cfg, "supervisor", "--log-format", "xml"); res.Code == 0 || !strings.Contains(res.Stderr, `--log-format "xml"`) {
		t.Errorf("--log-format xml: exit %d, stderr %q: want it refused", res.Code, res.Stderr)
	}

	res = env.Dama(cfg, "__complete", "submit", "")
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, "flaky\nfragile\nsample\n") {
		t.Errorf("completion of submit: exit %d, stdout %q: want the kinds", res.Code, res.Stdout)
	}
	res = env.Dama(cfg, "__complete", "pause", "")
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, "default\n") {
		t.Errorf("completion of pause: exit %d, stdout %q: want the queues", res.Code, res.Stdout)
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if res := env.Dama("", "completion", shell); res.Code != 0 || !strings.Contains(res.Stdout, "dama") {
			t.Errorf("completion %s: exit %d, %d bytes", shell, res.Code, len(res.Stdout))
		}
	}
}
