package main

import (
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
