package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/sql"
	"github.com/dama-etl/dama/taskrunner"
)

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
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("the lock-less command %d to end, and nothing to start meanwhile", pid), func() (bool, error) {
		if now := strings.Join(starts(), " "); now != before {
			t.Fatalf("a second copy started while the first (pid %d) still ran: starts %s", pid, now)
		}
		return !testenv.Alive(pid), nil
	})
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
	id := w.submitHeld(40, 100)
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
	w.release()
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
	testenv.Within(t, 15*time.Second, "the command and its runner to stop", func() (bool, error) {
		return !testenv.Alive(commandPID) && !testenv.Alive(*running.PID), nil
	})
	got := w.waitSettled(id, 90*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("%s after %d attempts, want DONE after 2", got.Status, got.Attempt)
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
