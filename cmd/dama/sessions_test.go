package main

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// sessionWatch records, as often as it can, the runs whose commands have
// a session on the test's database (named by protocol.SessionName), and
// every moment two runs had one at once.
type sessionWatch struct {
	mu       sync.Mutex
	overlaps []string
	// seen holds, per run's name, when its last session was last seen.
	seen map[string]time.Time
}

func watchSessions(t *testing.T, env *testenv.Env) *sessionWatch {
	t.Helper()
	w := &sessionWatch{seen: map[string]time.Time{}}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Every 10 ms: an overlap lasts as long as a statement runs on.
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var names []string
			err := env.Pool.QueryRow(ctx, `
				SELECT coalesce(array_agg(DISTINCT application_name), '{}')
				  FROM pg_stat_activity
				 WHERE datname = current_database() AND application_name LIKE 'dama-run:%'`).Scan(&names)
			if err != nil {
				continue
			}
			w.mu.Lock()
			now := time.Now()
			for _, n := range names {
				w.seen[n] = now
			}
			if len(names) > 1 {
				w.overlaps = append(w.overlaps, strings.Join(names, " and "))
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		stop()
		<-done
	})
	return w
}

// check fails t for every moment two runs had a session at once.
func (w *sessionWatch) check(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, o := range w.overlaps {
		if i == 5 {
			t.Errorf("... and %d more", len(w.overlaps)-5)
			break
		}
		t.Errorf("two attempts' sessions at once: %s", o)
	}
}

// killMidStatement waits until a run of task id other than before has a
// session running a statement that starts with prefix, SIGKILLs its task
// process, and returns the run's session name and when it was killed.
func killMidStatement(t *testing.T, w *world, id int64, before, prefix string) (string, time.Time) {
	t.Helper()
	var (
		pid  int
		name string
	)
	testenv.Eventually(t, time.Minute, "task "+strconv.FormatInt(id, 10)+"'s next attempt to run "+prefix, func() (bool, error) {
		tk := w.task(id)
		if tk.PID == nil || tk.RunID == nil || protocol.SessionName(*tk.RunID) == before {
			return false, nil
		}
		pid, name = *tk.PID, protocol.SessionName(*tk.RunID)
		var n int
		err := w.Pool.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			 WHERE application_name = $1 AND state = 'active' AND query ILIKE $2 || '%'`, name, prefix).Scan(&n)
		return n > 0, err
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return name, time.Now()
}

// A retry never meets the attempt before it on the database, though a
// statement of a dead client runs on until the server notices: an ETL
// load (sh, then pgbench filling its tables in one statement on the
// server) whose task process is SIGKILLed mid-load three times never has
// two loads on the database at once, and ends with all its rows. Each
// command's sessions are named by its run (PGAPPNAME), their server ends
// a statement whose client died within a second
// (client_connection_check_interval, in PGOPTIONS), and the next attempt
// starts only once no session of the run before is left.
func TestAKilledLoadIsNeverRetriedBesideItself(t *testing.T) {
	testenv.LockModes(t, testAKilledLoadIsNeverRetriedBesideItself)
}

func testAKilledLoadIsNeverRetriedBesideItself(t *testing.T) {
	pgbench, err := testenv.PGBin("pgbench")
	if err != nil {
		t.Skip(err)
	}
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  load:
    command: ["/bin/sh", "-c", "` + pgbench + ` -i -s 3 -I dtGvp -q \"$DATABASE_URL\"; echo loaded"]
    pass_env: [DATABASE_URL]
    max_attempts: 4
    retry: { backoff: fixed, delay: 1s }
`)
	w := &world{Env: env, cfg: cfg}
	watch := watchSessions(t, env)
	w.Start(cfg, "supervisor")
	id := w.submitOf("load")
	var run string
	for range 3 {
		run, _ = killMidStatement(t, w, id, run, "insert into pgbench_accounts")
	}
	got := w.waitSettled(id, 3*time.Minute)
	if got.Status != etlcontext.StatusDone || got.Attempt != 4 {
		t.Errorf("the load: %s at attempt %d, want DONE at 4", got.Status, got.Attempt)
	}
	var rows int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbench_accounts`).Scan(&rows); err != nil || rows != 300_000 {
		t.Errorf("pgbench_accounts holds %d rows (%v), want 300,000", rows, err)
	}
	watch.check(t)
}

// The same with a statement that would run for a minute and a half
// (pg_sleep, in psql): the server ends it within seconds of its client's
// death, and only then does the next attempt start.
func TestAStatementOfADeadAttemptEndsBeforeTheRetry(t *testing.T) {
	testenv.LockModes(t, testAStatementOfADeadAttemptEndsBeforeTheRetry)
}

func testAStatementOfADeadAttemptEndsBeforeTheRetry(t *testing.T) {
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  sleeper:
    # The first attempt's statement would run 90 s; the next ones' 1 s.
    command: ["/bin/sh", "-c", "psql -X -v ON_ERROR_STOP=1 \"$DATABASE_URL\" -c \"select pg_sleep(case when $DAMA_ATTEMPT = 1 then 90 else 1 end)\""]
    pass_env: [DATABASE_URL]
    max_attempts: 3
`)
	w := &world{Env: env, cfg: cfg}
	watch := watchSessions(t, env)
	w.Start(cfg, "supervisor")
	id := w.submitOf("sleeper")
	first, killed := killMidStatement(t, w, id, "", "select pg_sleep")
	got := w.waitSettled(id, 3*time.Minute)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("the task: %s at attempt %d, want DONE at 2", got.Status, got.Attempt)
	}
	watch.check(t)
	watch.mu.Lock()
	last := watch.seen[first]
	watch.mu.Unlock()
	// Well under the 90 s the statement would have run: the server ended
	// it, whatever the machine's speed.
	if lived := last.Sub(killed); lived > time.Minute {
		t.Errorf("the dead attempt's session lived %s after its task process was killed: its server did not end its statement", lived.Round(time.Second))
	}
}

// waitingForASession runs a task whose first attempt is SIGKILLed while
// the test holds a session named by its run, as a statement its server
// runs on would be, and returns once the task waits for it (waiting_for
// sessions) without a new attempt, with the held session.
func waitingForASession(t *testing.T) (*world, int64, etlcontext.Task, *pgx.Conn) {
	t.Helper()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  once:
    command: ["/bin/sh", "-c", "[ $DAMA_ATTEMPT -gt 1 ] || exec sleep 600"]
    max_attempts: 2
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("once")
	running := w.waitRunning(id)
	conf, err := pgx.ParseConfig(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	conf.RuntimeParams["application_name"] = protocol.SessionName(*running.RunID)
	held, err := pgx.ConnectConfig(context.Background(), conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Close(context.Background()) })
	if err := syscall.Kill(*running.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	w.waitFor(id, time.Minute, "to wait for the sessions of its run before", func(tk etlcontext.Task) bool {
		return tk.WaitingFor != nil && *tk.WaitingFor == string(etlcontext.WaitSessions) || tk.Attempt > 1
	})
	if tk := w.task(id); tk.Status != etlcontext.StatusRetrying || *tk.RunID != *running.RunID || tk.Attempt != 1 {
		t.Fatalf("%s, run %s, attempt %d, while a session of run %s is left: want RETRYING with no new attempt", tk.Status, *tk.RunID, tk.Attempt, *running.RunID)
	}
	return w, id, running, held
}

// The next attempt waits for every session of the run before, however
// long it lasts: here one the test holds under the run's name. The task
// shows why it waits (waiting_for sessions), and starts once the session
// is gone.
func TestARetryWaitsForTheSessionsOfTheRunBefore(t *testing.T) {
	testenv.LockModes(t, testARetryWaitsForTheSessionsOfTheRunBefore)
}

func testARetryWaitsForTheSessionsOfTheRunBefore(t *testing.T) {
	w, id, _, held := waitingForASession(t)
	held.Close(context.Background())
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("once the session is gone: %s at attempt %d, want DONE at 2", got.Status, got.Attempt)
	}
}

// Not for ever, though: 10 minutes after the run ended (by the database's
// clock, here moved back), the next attempt starts beside the session
// left, which a pooler or any role may hold under the run's name.
func TestARetryWaitsForTheSessionsOfTheRunBeforeTenMinutesAtMost(t *testing.T) {
	t.Parallel()
	w, id, running, _ := waitingForASession(t)
	if _, err := w.Pool.Exec(context.Background(), `
		UPDATE data_manager.etl_attempts SET ended_at = ended_at - interval '11 minutes'
		 WHERE etl_context_id = $1 AND run_id = $2`, id, *running.RunID); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("with the session still held, 11 minutes after the run ended: %s at attempt %d, want DONE at 2", got.Status, got.Attempt)
	}
}
