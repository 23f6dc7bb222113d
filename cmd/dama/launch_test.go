package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

func TestAHostThatCannotLaunchSpendsNoAttempt(t *testing.T) {
	testenv.LockModes(t, testAHostThatCannotLaunchSpendsNoAttempt)
}

// tried returns a condition that holds once the supervisors tried task id
// n times: each try is a step of its job, whose start River records.
func (w *world) tried(id int64, n int) func() (bool, error) {
	seen := map[time.Time]bool{}
	return func() (bool, error) {
		var at time.Time
		err := w.Pool.QueryRow(context.Background(), `
			SELECT j.attempted_at FROM river_job AS j JOIN data_manager.etl_contexts AS c ON c.river_job_id = j.id
			 WHERE c.etl_context_id = $1 AND j.attempted_at IS NOT NULL`, id).Scan(&at)
		seen[at] = true
		return len(seen) >= n, err
	}
}

func testAHostThatCannotLaunchSpendsNoAttempt(t *testing.T) {
	env := testenv.New(t)
	// The first task's log file is a directory: no process of this host
	// can write it.
	blocker := filepath.Join(env.Dir, "logs", "1.log")
	if err := os.MkdirAll(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 200ms
kinds:
  sample: { command: ["{{sample}}"], max_attempts: 1 }
  missing: { command: ["/nonexistent/etl"], max_attempts: 1 }
`)
	w := &world{Env: env, cfg: cfg}
	sup := w.Start(cfg, "supervisor")
	res := w.Dama(cfg, "submit", "sample")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	id := testenv.Atoi(t, res.Stdout)
	if id != 1 {
		t.Fatalf("the first task is %d, want 1, whose log file is a directory", id)
	}
	testenv.Eventually(t, 20*time.Second, "the supervisor to report the failed launch", func() (bool, error) {
		log, err := os.ReadFile(sup.Log)
		return strings.Count(string(log), "could not start the task") >= 1, err
	})
	// Several launches later (one a poll): still QUEUED, no attempt
	// spent, one error line.
	tries := func(id int64) func() (bool, error) { return w.tried(id, 6) }
	testenv.Eventually(t, 30*time.Second, "several more launches of the task", tries(id))
	// Each try shows RUNNING, attempt 1 from its start until the launch is
	// taken back a moment later; between tries the task is QUEUED with no
	// attempt spent. A spent attempt would leave it FAILED (max_attempts
	// 1), never QUEUED again.
	testenv.Eventually(t, 10*time.Second, "the task QUEUED between tries, with no attempt spent", func() (bool, error) {
		got := w.task(id)
		return got.Status == etlcontext.StatusQueued && got.Attempt == 0, fmt.Errorf("%s, attempt %d", got.Status, got.Attempt)
	})
	log, _ := os.ReadFile(sup.Log)
	if n := strings.Count(string(log), `level=ERROR msg="could not start the task`); n != 1 {
		t.Errorf("the repeated launch failure was logged as an error %d times, want once", n)
	}
	// The status says why, though no task process started to.
	if got := w.Dama(cfg, "status", fmt.Sprint(id)).Stdout; !strings.Contains(got, "this host cannot run the task: open the log file "+blocker+": is a directory") {
		t.Errorf("dama status 1 does not say why the task cannot start:\n%s", got)
	}
	// The operator repairs the host: the task runs, as its first attempt.
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("after the repair: %s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}

	// A kind whose executable this host lacks: the task process says why
	// in a WARNING, and the launch is taken back.
	res = w.Dama(cfg, "submit", "missing")
	if res.Code != 0 {
		t.Fatalf("submit: %s", res.Stderr)
	}
	missing := testenv.Atoi(t, res.Stdout)
	testenv.Eventually(t, 20*time.Second, "a WARNING saying this host cannot run the task", func() (bool, error) {
		events, err := etlcontext.Events(context.Background(), w.Pool, missing)
		for _, e := range events {
			if e.Type == "missing:WARNING" && strings.Contains(string(e.Payload), "/nonexistent/etl") {
				return true, nil
			}
		}
		return false, err
	})
	// Several launches later: still one WARNING.
	testenv.Eventually(t, 30*time.Second, "several more launches of the task", tries(missing))
	if got := w.task(missing); got.Status.Finished() || got.Attempt > 1 {
		t.Errorf("a missing executable spent the task's attempt: %s, attempt %d", got.Status, got.Attempt)
	}
	events, err := etlcontext.Events(context.Background(), w.Pool, missing)
	if err != nil {
		t.Fatal(err)
	}
	warnings := 0
	for _, e := range events {
		if e.Type == "missing:WARNING" {
			warnings++
		}
	}
	if warnings != 1 {
		t.Errorf("%d WARNING events for the missing executable, want one for the attempt", warnings)
	}
	log, _ = os.ReadFile(sup.Log)
	if n := strings.Count(string(log), `level=ERROR msg="could not start the task`); n != 2 {
		t.Errorf("the two tasks' repeated launch failures were logged as errors %d times, want once each", n)
	}
}

func TestNoConnectionForTheTaskProcessSpendsNoAttempt(t *testing.T) {
	testenv.LockModes(t, testNoConnectionForTheTaskProcessSpendsNoAttempt)
}

func testNoConnectionForTheTaskProcessSpendsNoAttempt(t *testing.T) {
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	ctx := context.Background()
	// dama runs as a role whose connection limit the test sets; a
	// superuser would not be limited.
	for _, q := range []string{
		`CREATE ROLE dama_limited LOGIN`,
		`GRANT pg_read_all_data, pg_write_all_data TO dama_limited`,
	} {
		if _, err := env.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	limited, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	limited.User = url.User("dama_limited")
	w := &world{Env: env, cfg: env.WriteConfig(sampleConfigFor(10)), startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	sup := env.StartWith(w.cfg, []string{"DATABASE_URL=" + limited.String()}, nil, "supervisor")
	// Warm the supervisor up, then allow the role no connection beyond
	// those it holds: the next task process cannot connect.
	warm := w.submit(1, 10)
	w.waitSettled(warm, 30*time.Second)
	if pid := w.keeperPID(); pid != 0 {
		// Host lock mode: the next task process's lock keeper, not the
		// one left idle, is to find no connection.
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, "the idle lock keeper's connections to end", func() (bool, error) {
			return w.serverConns("dama-keeper") == 0, nil
		})
	}
	var held int
	if err := env.Pool.QueryRow(ctx, `
		SELECT count(*) FROM pg_stat_activity WHERE usename = 'dama_limited'`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Pool.Exec(ctx, fmt.Sprintf(`ALTER ROLE dama_limited CONNECTION LIMIT %d`, held)); err != nil {
		t.Fatal(err)
	}
	id := w.submit(5, 50)
	testenv.Eventually(t, 30*time.Second, "the supervisor to report the failed launch", func() (bool, error) {
		log, err := os.ReadFile(sup.Log)
		return strings.Contains(string(log), "could not start the task"), err
	})
	if got := w.task(id); got.Status.Finished() || got.Attempt > 1 || len(w.starts(id)) != 0 {
		t.Fatalf("with no connection for its task process: %s, attempt %d, starts %v", got.Status, got.Attempt, w.starts(id))
	}
	if _, err := env.Pool.Exec(ctx, `ALTER ROLE dama_limited CONNECTION LIMIT -1`); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, 30*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("once connections are free: %s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}
}
