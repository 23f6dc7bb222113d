package main

import (
	"context"
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
	"github.com/dama-etl/dama/taskrunner"
)

// newHostWorld is newWorld with lock_mode host, whatever
// DAMA_TEST_LOCK_MODE says.
func newHostWorld(t *testing.T, maxRunning int) *world {
	env := testenv.New(t)
	w := &world{Env: env, cfg: env.WriteConfig("lock_mode: host\n" + sampleConfigFor(maxRunning)), startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return w
}

// keeperPID returns the pid of the lock keeper serving the world's tasks,
// which it writes in its lock file, or 0 when none runs.
func (w *world) keeperPID() int {
	w.T.Helper()
	locks, _ := filepath.Glob(filepath.Join(w.Dir, "logs", ".keeper", "*.sock.lock"))
	for _, l := range locks {
		data, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && testenv.Alive(pid) {
			return pid
		}
	}
	return 0
}

// serverConns counts the world's database's client connections by
// application name prefix.
func (w *world) serverConns(prefix string) int {
	w.T.Helper()
	var n int
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_stat_activity
		 WHERE datname = current_database() AND backend_type = 'client backend' AND application_name LIKE $1 || '%'`, prefix).Scan(&n); err != nil {
		w.T.Fatal(err)
	}
	return n
}

// In host lock mode the task processes of a host hold no server connection
// of their own: one keeper holds their locks on one session and runs their
// writes on a pool of at most taskrunner.KeeperPoolSize.
func TestHostModeConnectionsDoNotGrowWithTasks(t *testing.T) {
	t.Parallel()
	const tasks = 12
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	// Each runs until the test lets them all end.
	script := `echo started >> "$0/started-$DAMA_ETL_CONTEXT_ID"; while [ ! -e ` + goFile + ` ]; do sleep 0.2; done`
	cfg := env.WriteConfig(`
lock_mode: host
log_dir: {{dir}}/logs
poll_interval: 500ms
queues:
  default: { max_running: ` + strconv.Itoa(tasks) + ` }
kinds:
  gate:
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `, "{{dir}}"]
    max_attempts: 1
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	ids := make([]int64, tasks)
	for i := range ids {
		ids[i] = w.submitOf("gate")
	}
	for _, id := range ids {
		w.waitFor(id, 30*time.Second, "to run its command holding its lock", func(tk etlcontext.Task) bool {
			_, err := os.Stat(filepath.Join(env.Dir, fmt.Sprintf("started-%d", id)))
			return tk.InitialEventLocked && err == nil
		})
	}
	if n := w.serverConns("dama-task"); n != 0 {
		t.Errorf("%d connections of task processes in host mode, want none", n)
	}
	if n := w.serverConns(taskrunner.KeeperLockName); n != 1 {
		t.Errorf("%d lock sessions of the keeper, want 1", n)
	}
	if n := w.serverConns(taskrunner.KeeperPoolName); n > taskrunner.KeeperPoolSize {
		t.Errorf("%d pool connections of the keeper, want at most %d", n, taskrunner.KeeperPoolSize)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone {
			t.Errorf("task %d: %s, want DONE", id, got.Status)
		}
	}
}

// The keeper's loss is ridden out like a database restart: killed, it
// takes every lock with it; the task processes start another and take
// their locks again through it under the same runs, and their commands
// never notice.
func TestAKilledKeeperIsRiddenOut(t *testing.T) {
	t.Parallel()
	w := newHostWorld(t, 4)
	w.Start(w.cfg, "supervisor")
	ids := []int64{w.submitHeld(40, 100), w.submitHeld(40, 100)}
	for _, id := range ids {
		w.waitFor(id, 30*time.Second, "to run its command holding its lock", func(tk etlcontext.Task) bool {
			return tk.InitialEventLocked && len(w.starts(id)) == 1
		})
	}
	first := w.keeperPID()
	if first == 0 {
		t.Fatal("no lock keeper runs")
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var second int
	testenv.Eventually(t, 20*time.Second, "another keeper to hold the locks again", func() (bool, error) {
		second = w.keeperPID()
		if second == 0 || second == first {
			return false, nil
		}
		for _, id := range ids {
			if !w.task(id).InitialEventLocked {
				return false, nil
			}
		}
		return true, nil
	})
	w.release()
	for _, id := range ids {
		got := w.waitSettled(id, 60*time.Second)
		if got.Status != etlcontext.StatusDone || got.Attempt != 1 || len(w.starts(id)) != 1 {
			t.Errorf("task %d: %s after %d attempts, starts %v: want DONE after a single start", id, got.Status, got.Attempt, w.starts(id))
		}
	}
	// The task process that started it ended, and left it running for
	// the next ones.
	if !testenv.Alive(second) {
		t.Errorf("the keeper %d ended with the task processes", second)
	}
}
