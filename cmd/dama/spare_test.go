package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/etlcontext"
	"github.com/dama-etl/dama/internal/scalebench"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/taskrunner"
)

// sparePID returns the pid of the spare task process of the supervisor
// sup, its child waiting for a launch, once it runs; it fails the test
// after 30s.
func sparePID(t *testing.T, sup *testenv.Proc, other int) int {
	t.Helper()
	var pid int
	testenv.Eventually(t, 30*time.Second, "the supervisor's spare task process", func() (bool, error) {
		pid = spareOf(sup.Cmd.Process.Pid)
		return pid != 0 && pid != other, nil
	})
	return pid
}

// spareOf returns the pid of the child of ppid started as a spare, or 0.
func spareOf(ppid int) int {
	for _, pid := range scalebench.Children(ppid) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmdline), "\x00--spare-fd\x00") && testenv.Alive(pid) {
			return pid
		}
	}
	return 0
}

// spareConns waits until the spare's connections made ahead are open:
// those of a runner of the configuration's lock mode.
func (w *world) spareConns(cfgPath string) config.LockMode {
	w.T.Helper()
	cfg, err := config.Load(cfgPath)
	if err != nil {
		w.T.Fatal(err)
	}
	mode := cfg.WithDefaults().LockMode
	testenv.Eventually(w.T, 30*time.Second, "the spare's connections", func() (bool, error) {
		n := w.spareConnCount()
		return n == mode.ConnectionsPerTask(), nil
	})
	return mode
}

// spareConnCount counts the connections of spares.
func (w *world) spareConnCount() int {
	w.T.Helper()
	var n int
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_stat_activity
		 WHERE datname = current_database() AND application_name IN ($1, $2)`,
		taskrunner.SpareLockConnName, taskrunner.SpareWriteConnName).Scan(&n); err != nil {
		w.T.Fatal(err)
	}
	return n
}

// A supervisor keeps a task process started ahead of its launch: the next
// task runs in it, with its log and its lock as in a task process started
// for it, and another is started for the task after. The spare holds the
// connections of a runner, named for what they are; it exits unused when
// its supervisor dies, and when it is told to stop.
func TestATaskStartsInTheSupervisorsSpare(t *testing.T) {
	testenv.LockModes(t, testATaskStartsInTheSupervisorsSpare)
}

func testATaskStartsInTheSupervisorsSpare(t *testing.T) {
	w := newWorld(t, 4)
	sup := w.Start(w.cfg, "supervisor")
	spare := sparePID(t, sup, 0)
	mode := w.spareConns(w.cfg)

	// Held running until the test has looked: a plain run's machine once
	// stalled (a fork/exec took 500 ms) for the 2 s the task ran.
	id := w.submitHeld(20, 100)
	running := w.waitRunning(id)
	if *running.PID != spare {
		t.Fatalf("task %d runs in process %d, want the spare %d", id, *running.PID, spare)
	}
	if mode != config.LockModeHost {
		if n := w.serverConns(fmt.Sprintf("dama-task-lock:%d", id)); n != 1 {
			t.Errorf("%d connections named for task %d's lock, want 1", n, id)
		}
	}
	w.release()
	if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Fatalf("task %d: %s after %d attempts, want DONE after 1", id, got.Status, got.Attempt)
	}
	taskLog, err := os.ReadFile(filepath.Join(w.Dir, "logs", fmt.Sprintf("%d.log", id)))
	if err != nil || !strings.Contains(string(taskLog), "command starting") || !strings.Contains(string(taskLog), fmt.Sprintf("context %d done", id)) {
		t.Errorf("the spare's task log lacks its runner's and its command's lines (%v):\n%s", err, taskLog)
	}
	if starts := w.starts(id); len(starts) != 1 {
		t.Errorf("task %d started %d times, want once: %v", id, len(starts), starts)
	}

	next := sparePID(t, sup, spare)
	w.spareConns(w.cfg)
	// Told to stop, a spare exits: it has no task to stop.
	if err := syscall.Kill(next, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "a spare told to stop to exit", func() (bool, error) { return !testenv.Alive(next), nil })

	// Its supervisor dead, a spare exits, and its connections close.
	last := sparePID(t, sup, next)
	sup.Kill(t, syscall.SIGKILL)
	testenv.Eventually(t, 10*time.Second, "the spare of a dead supervisor to exit", func() (bool, error) { return !testenv.Alive(last), nil })
	testenv.Eventually(t, 10*time.Second, "the spare's connections to close", func() (bool, error) {
		return w.spareConnCount() == 0, nil
	})
}

// A spare's connections may die while it waits (a server restart, a flow
// dropped without a reset): its launch finds out in at most a second,
// connects afresh, and the task runs in it all the same.
func TestASpareWhoseConnectionsDiedRunsItsTask(t *testing.T) {
	testenv.LockModes(t, testASpareWhoseConnectionsDiedRunsItsTask)
}

func testASpareWhoseConnectionsDiedRunsItsTask(t *testing.T) {
	for _, fault := range []string{"terminated", "silenced"} {
		t.Run(fault, func(t *testing.T) {
			srv := testenv.NewServer(t)
			env := testenv.NewOn(t, srv)
			w := &world{Env: env, cfg: env.WriteConfig(sampleConfigFor(4)), startsDir: filepath.Join(env.Dir, "starts")}
			if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
				t.Fatal(err)
			}
			sup := w.Start(w.cfg, "supervisor")
			spare := sparePID(t, sup, 0)
			if w.spareConns(w.cfg) == config.LockModeHost {
				t.Skip("a spare makes no connection ahead in host lock mode")
			}
			switch fault {
			case "terminated":
				if _, err := env.Pool.Exec(context.Background(), `
					SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					 WHERE application_name IN ($1, $2)`, taskrunner.SpareLockConnName, taskrunner.SpareWriteConnName); err != nil {
					t.Fatal(err)
				}
			case "silenced":
				testenv.SilenceConnection(t, env.Pool, taskrunner.SpareLockConnName)
			}
			id := w.submit(2, 50)
			got := w.waitSettled(id, 60*time.Second)
			var pid int
			if got.PID != nil {
				pid = *got.PID
			}
			if got.Status != etlcontext.StatusDone || got.Attempt != 1 || pid != spare {
				t.Fatalf("task %d: %s after %d attempts in process %d, want DONE after 1 in the spare %d", id, got.Status, got.Attempt, pid, spare)
			}
			if starts := w.starts(id); len(starts) != 1 {
				t.Errorf("task %d started %d times, want once: %v", id, len(starts), starts)
			}
		})
	}
}

// A spare connects for the lock mode of most kinds; a task of another
// mode runs in it all the same, on connections of its own mode. A
// supervisor that stops lets its spare go.
func TestASpareRunsATaskOfAnotherLockMode(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
lock_mode: advisory
log_dir: {{dir}}/logs
poll_interval: 500ms
queues:
  etl: { max_running: 4 }
kinds:
  first: { queue: etl, command: ["{{sample}}"] }
  second: { queue: etl, command: ["{{sample}}"] }
  rows: { queue: etl, command: ["{{sample}}"], lock_mode: row }
  hosted: { queue: etl, command: ["{{sample}}"], lock_mode: host }
`)
	w := &world{Env: env, cfg: cfg, startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	sup := w.Start(cfg, "supervisor")
	spare := sparePID(t, sup, 0)
	testenv.Eventually(t, 30*time.Second, "the spare's advisory-mode connection", func() (bool, error) {
		return w.serverConns(taskrunner.SpareLockConnName) == 1, nil
	})
	id := w.submitOf("rows", "--args", fmt.Sprintf(`{"steps": 20, "step_ms": 100, "starts_dir": %q}`, w.startsDir))
	running := w.waitRunning(id)
	if *running.PID != spare {
		t.Fatalf("task %d runs in process %d, want the spare %d", id, *running.PID, spare)
	}
	for _, name := range []string{fmt.Sprintf("dama-task-lock:%d", id), fmt.Sprintf("dama-task:%d", id)} {
		if n := w.serverConns(name); n != 1 {
			t.Errorf("%d connections named %s, want 1 (row mode's two)", n, name)
		}
	}
	if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Fatalf("task %d: %s after %d attempts, want DONE after 1", id, got.Status, got.Attempt)
	}
	// A host-mode task holds its lock through the keeper, never through
	// the advisory-mode connection the spare made ahead.
	next := sparePID(t, sup, spare)
	var spareBackend int
	testenv.Eventually(t, 30*time.Second, "the next spare's advisory-mode connection", func() (bool, error) {
		err := w.Pool.QueryRow(context.Background(), `
			SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`,
			taskrunner.SpareLockConnName).Scan(&spareBackend)
		return err == nil, err
	})
	id = w.submitOf("hosted", "--args", fmt.Sprintf(`{"steps": 100, "step_ms": 100, "starts_dir": %q}`, w.startsDir))
	if running := w.waitRunning(id); *running.PID != next {
		t.Fatalf("task %d runs in process %d, want the spare %d", id, *running.PID, next)
	}
	for _, name := range []string{fmt.Sprintf("dama-task-lock:%d", id), fmt.Sprintf("dama-task:%d", id)} {
		if n := w.serverConns(name); n != 0 {
			t.Errorf("%d connections named %s while a host-mode task runs in the spare, want 0", n, name)
		}
	}
	// The connection it has no use for is closed as the task starts (its
	// server process may outlive the close by moments), not kept for the
	// task's 10s.
	testenv.Eventually(t, 5*time.Second, "the spare's unused connection to close", func() (bool, error) {
		var open bool
		err := w.Pool.QueryRow(context.Background(), `
			SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, spareBackend).Scan(&open)
		return !open, err
	})
	if n := w.serverConns(taskrunner.KeeperLockName); n != 1 {
		t.Errorf("%d keeper lock sessions, want 1", n)
	}
	if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Fatalf("task %d: %s after %d attempts, want DONE after 1", id, got.Status, got.Attempt)
	}
	next = sparePID(t, sup, next)
	sup.Kill(t, syscall.SIGTERM)
	testenv.Eventually(t, 30*time.Second, "the stopped supervisor's spare to exit", func() (bool, error) { return !testenv.Alive(next), nil })
}
