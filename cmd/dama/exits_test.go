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

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/testenv"
)

// A process the command started that left its process group and session
// and dropped DAMA_RUN_ID (a daemon, double-forked) is still the attempt's:
// the task process, its subreaper, kills it before it records the outcome,
// so no process of the attempt outlives the task.
func TestADaemonOfTheCommandEndsWithTheTask(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	// The daemon writes its pid, then sleeps; the command exits once the
	// test, which has read the daemon meanwhile, creates the file go.
	script := `setsid env -u DAMA_RUN_ID /bin/sh -c 'echo $$ > "$0/daemon"; exec sleep 1000' "$0" &
while [ ! -e "$0/go" ]; do sleep 0.2; done`
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  daemonizing:
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `, "{{dir}}"]
    max_attempts: 1
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("daemonizing")
	var daemon int
	testenv.Eventually(t, time.Minute, "the daemon to start", func() (bool, error) {
		b, err := os.ReadFile(filepath.Join(env.Dir, "daemon"))
		daemon, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return daemon > 0, err
	})
	st, err := hostproc.ReadStat(daemon)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Only that process: its pid may be another's by now.
		if now, err := hostproc.ReadStat(daemon); err == nil && now.StartTicks == st.StartTicks {
			_ = syscall.Kill(daemon, syscall.SIGKILL)
		}
	})
	if err := os.WriteFile(filepath.Join(env.Dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := w.waitSettled(id, time.Minute)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Fatalf("%s at attempt %d, want DONE at attempt 1", got.Status, got.Attempt)
	}
	// Dead, not a zombie of the task process's (which has exited too).
	if testenv.Alive(daemon) {
		t.Errorf("the command's daemon (pid %d, its own session, no DAMA_RUN_ID) outlived the task", daemon)
	}
}

// Daemons of the command that exit while it runs are reaped by the task
// process, their subreaper: a command that starts many leaves no zombies.
func TestExitedDaemonsOfARunningCommandAreReaped(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	// Twenty daemons, orphaned at once (their parent subshell exits), that
	// exit once the test has seen them; then the command waits.
	script := `i=0; while [ $i -lt 20 ]; do (setsid /bin/sh -c 'while [ ! -e "$0/reap" ]; do sleep 0.2; done' "$0" &); i=$((i+1)); done
touch "$0/started"
while [ ! -e ` + goFile + ` ]; do sleep 0.2; done`
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  spawner:
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `, "{{dir}}"]
    max_attempts: 1
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("spawner")
	running := w.waitRunning(id)
	testenv.Eventually(t, time.Minute, "the daemons to start", func() (bool, error) {
		_, err := os.Stat(filepath.Join(env.Dir, "started"))
		return err == nil, nil
	})
	// They are the task process's children now, not init's.
	testenv.Eventually(t, 30*time.Second, "the orphans to be the task process's children", func() (bool, error) {
		kids, err := hostproc.Children(*running.PID)
		return len(kids) > 1, fmt.Errorf("children %v, %v", kids, err)
	})
	if err := os.WriteFile(filepath.Join(env.Dir, "reap"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Once they exited, the task process has no child but the command
	// (and, in host lock mode, the lock keeper it started): it reaped them.
	cmd := w.waitFor(id, 30*time.Second, "to record its command", func(t etlcontext.Task) bool { return t.CommandPGID != nil })
	testenv.Eventually(t, 30*time.Second, "the exited orphans to be reaped", func() (bool, error) {
		kids, err := hostproc.Children(*running.PID)
		kids = slices.DeleteFunc(kids, func(pid int) bool { return pid == w.keeperPID() })
		return slices.Equal(kids, []int{*cmd.CommandPGID}), fmt.Errorf("children %v (the command is %d), %v", kids, *cmd.CommandPGID, err)
	})
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone {
		t.Errorf("%s, want DONE", got.Status)
	}
}

// A command that wrote no failure line has its last line of output as its
// attempt's reason, led by its exit; never an earlier attempt's line,
// though the log is the task's, appended to: an attempt that wrote nothing
// says how it ended alone. Of a line a progress bar redrew (\r), what it
// drew last; of one without a newline, not the task process's line after.
func TestAFailuresReasonIsItsAttemptsLastLine(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	script := `case "$DAMA_ATTEMPT" in
1) echo "reading chunk 1"; echo "chunk 4: upstream file is corrupt" >&2; exit 3 ;;
2) exit 4 ;;
esac
printf 'copying 1%%\rcopying 2%%\rfatal: disk full'; exit 5`
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  failing:
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `]
    retry: {max_attempts: 3, delay: 1s, backoff: fixed}
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("failing")
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusFailed || got.Attempt != 3 {
		t.Fatalf("task %d: %s at attempt %d, want FAILED at 3", id, got.Status, got.Attempt)
	}
	shown := w.Dama(cfg, "status", strconv.FormatInt(id, 10)).Stdout
	first := lineWith(shown, "  1  ", "FAILED")
	second := lineWith(shown, "  2  ", "FAILED")
	if !strings.HasSuffix(first, " 3     exit 3: chunk 4: upstream file is corrupt") || !strings.HasSuffix(second, " 4     command exited with code 4") {
		t.Errorf("the attempts, want the first's last line and the second's exit alone:\n%s", shown)
	}
	if f := lineWith(shown, "Reason:"); !strings.HasSuffix(f, "exit 5: fatal: disk full") {
		t.Errorf("the task's reason %q, want the last attempt's last words", f)
	}
	// Its ERROR's log tail is its own attempt's too.
	var tail string
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT payload->>'log_tail' FROM data_manager.event_store
		 WHERE etl_context_id = $1 AND type = 'failing:ERROR' ORDER BY event_id DESC LIMIT 1`, id).Scan(&tail); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tail, "fatal: disk full") || strings.Contains(tail, "chunk") {
		t.Errorf("the last attempt's log tail %q, want its own output alone", tail)
	}
}
