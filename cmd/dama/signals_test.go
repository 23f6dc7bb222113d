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

// A task process told to stop before its command starts gives the launch
// back: its command never starts and no attempt is spent.
func TestSIGTERMBeforeTheCommandStartsGivesTheLaunchBack(t *testing.T) {
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
	testenv.Eventually(t, 30*time.Second, "the supervisor to start", func() (bool, error) {
		log, err := os.ReadFile(sup.Log)
		return strings.Contains(string(log), "supervisor started"), err
	})
	// The task process blocks on its first read, of the schema's
	// compatibility, before it records anything.
	ctx := context.Background()
	tx, err := env.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `LOCK TABLE data_manager.compatibility IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	res := w.Dama(cfg, "submit", "marked")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	var runner int
	testenv.Eventually(t, 30*time.Second, "the task process to wait for the lock", func() (bool, error) {
		err := env.Pool.QueryRow(ctx, `
			SELECT a.pid FROM pg_stat_activity AS a
			 WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'
			   AND a.query LIKE '%data_manager.compatibility%'`).Scan(new(int))
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		log, err := os.ReadFile(sup.Log)
		if m := spawned(id).FindSubmatch(log); m != nil {
			runner, _ = strconv.Atoi(string(m[1]))
			return true, nil
		}
		return false, err
	})
	if err := syscall.Kill(runner, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the task process to take the signal", func() (bool, error) { return signalHandled(runner) })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	got := w.waitSettled(id, time.Minute)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s at attempt %d, want DONE at attempt 1: the signalled launch spent no attempt", got.Status, got.Attempt)
	}
	data, err := os.ReadFile(starts)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(data))
	if len(lines) != 1 || lines[0] == strconv.Itoa(runner) {
		t.Errorf("the command started under task processes %v; want once, not under the signalled one (%d)", lines, runner)
	}
}
