package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// signalHandled reports whether pid has no SIGTERM pending: its handler
// took it.
func signalHandled(pid int) (bool, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return true, nil // gone: nothing pending
	}
	const sigterm = 1 << (syscall.SIGTERM - 1)
	for line := range strings.SplitSeq(string(data), "\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || (name != "SigPnd" && name != "ShdPnd") {
			continue
		}
		bits, err := strconv.ParseUint(strings.TrimSpace(value), 16, 64)
		if err != nil {
			return false, err
		}
		if bits&sigterm != 0 {
			return false, nil
		}
	}
	return true, nil
}

func spawned(id int64) *regexp.Regexp {
	return regexp.MustCompile(`msg="spawned task process" etl_context_id=` + strconv.FormatInt(id, 10) + ` .*pid=(\d+)`)
}

// signalWorld is a supervisor whose one kind appends its task process's
// PID to a file each time its command starts.
type signalWorld struct {
	*world
	starts string
	sup    *testenv.Proc
}

func newSignalWorld(t *testing.T) *signalWorld {
	env := testenv.New(t)
	starts := filepath.Join(env.Dir, "starts")
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 200ms
kinds:
  marked:
    command: ["/bin/sh", "-c", "echo $PPID >> ` + starts + `"]
    max_attempts: 3
`)
	w := &world{Env: env, cfg: cfg}
	sup := w.Start(cfg, "supervisor")
	sup.WaitReady(t, 30*time.Second)
	return &signalWorld{world: w, starts: starts, sup: sup}
}

// waitBlocked waits until the task process of context id (spawned by the
// supervisor) waits for a lock in a statement matching one of queries, and returns
// its PID.
func (w *signalWorld) waitBlocked(t *testing.T, id int64, queries ...string) int {
	t.Helper()
	var runner int
	testenv.Eventually(t, 30*time.Second, "the task process to wait for a lock", func() (bool, error) {
		err := w.Pool.QueryRow(context.Background(), `
			SELECT a.pid FROM pg_stat_activity AS a
			 WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'
			   AND a.query LIKE ANY($1)`, queries).Scan(new(int))
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		log, err := os.ReadFile(w.sup.Log)
		if m := spawned(id).FindSubmatch(log); m != nil {
			runner, _ = strconv.Atoi(string(m[1]))
			return true, nil
		}
		return false, err
	})
	return runner
}

// readsCompatibility are the statements of a task process that read the
// schema's compatibility: the lock's, which checks it (lock_run), or in row
// mode a statement of its own, before the lock's transaction.
var readsCompatibility = []string{"%data_manager.compatibility%", "%data_manager.lock_run(%"}

// terminate sends SIGTERM to pid and waits until its handler took it.
func terminate(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the task process to take the signal", func() (bool, error) { return signalHandled(pid) })
}

// assertGivenBack checks that context id ended DONE at attempt 1, with one
// attempt recorded, and that its command started once, not under the
// signalled task process.
func (w *signalWorld) assertGivenBack(t *testing.T, id int64, signalled int) {
	t.Helper()
	got := w.waitSettled(id, time.Minute)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s at attempt %d, want DONE at attempt 1: the signalled launch spent no attempt", got.Status, got.Attempt)
	}
	var attempts int
	if err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM data_manager.etl_attempts WHERE etl_context_id = $1`, id).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 {
		t.Errorf("%d attempts recorded in etl_attempts, want 1", attempts)
	}
	data, err := os.ReadFile(w.starts)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(data))
	if len(lines) != 1 || lines[0] == strconv.Itoa(signalled) {
		t.Errorf("the command started under task processes %v; want once, not under the signalled one (%d)", lines, signalled)
	}
}

// A task process told to stop before its command starts gives the launch
// back: its command never starts and no attempt is spent.
func TestSIGTERMBeforeTheCommandStartsGivesTheLaunchBack(t *testing.T) {
	testenv.LockModes(t, testSIGTERMBeforeTheCommandStartsGivesTheLaunchBack)
}

func testSIGTERMBeforeTheCommandStartsGivesTheLaunchBack(t *testing.T) {
	w := newSignalWorld(t)
	// The task process blocks on its first read, of the schema's
	// compatibility, before it records anything.
	ctx := context.Background()
	tx, err := w.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE data_manager.compatibility IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	res := w.Dama(w.cfg, "submit", "marked")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	runner := w.waitBlocked(t, id, readsCompatibility...)
	terminate(t, runner)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	w.assertGivenBack(t, id, runner)
}

// A task process told to stop while it records itself, its attempt begun
// but its command not started, withdraws its record: the launch is given
// back, and the attempt is none.
func TestSIGTERMWhileTheTaskProcessRecordsItselfGivesTheLaunchBack(t *testing.T) {
	testenv.LockModes(t, testSIGTERMWhileTheTaskProcessRecordsItselfGivesTheLaunchBack)
}

func testSIGTERMWhileTheTaskProcessRecordsItselfGivesTheLaunchBack(t *testing.T) {
	w := newSignalWorld(t)
	ctx := context.Background()
	compat, err := w.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer compat.Rollback(ctx)
	if _, err := compat.Exec(ctx, `LOCK TABLE data_manager.compatibility IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	res := w.Dama(w.cfg, "submit", "marked")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	w.waitBlocked(t, id, readsCompatibility...)
	// Then on the statement that records it, once it is let through.
	row, err := w.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer row.Rollback(ctx)
	if _, err := row.Exec(ctx, `SELECT 1 FROM data_manager.etl_contexts WHERE etl_context_id = $1 FOR UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	if err := compat.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	runner := w.waitBlocked(t, id, "%SET host = $3, pid = $4%")
	terminate(t, runner)
	if err := row.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	w.assertGivenBack(t, id, runner)
}
