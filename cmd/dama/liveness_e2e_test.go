package main

import (
	"context"
	"fmt"
	"os"
	"slices"
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

// livenessLockNamespace is the first key of a supervisor's liveness lock
// (supervisor's clientLockNamespace); the second is hashtext(client id).
const livenessLockNamespace = protocol.LockNamespace + 2

// queueLockNamespace is the first key of a queue's max_running lock
// (supervisor's queueLockNamespace); the second is hashtext(queue).
const queueLockNamespace = protocol.LockNamespace + 1

// rescueGrace is what a supervisor with sampleConfig's 500ms poll interval
// waits before rescuing a step whose supervisor's liveness lock is missing:
// max(2*poll_interval, 10s).
const rescueGrace = 10 * time.Second

const rescuedLine = "a supervisor stopped looking after a task: any supervisor may take it up now"

// stepTimeout is River's timeout of a step, for a supervisor with the
// default launch timeout (supervisor's stepTimeout: 10s + 20s).
const stepTimeout = 30 * time.Second

// holdQueue holds the max_running lock of the queue "etl" (what a step takes
// before it starts an attempt) on a connection of the test's until the
// returned function (or the test's end) releases it: a step of a QUEUED
// task blocks there, its River job 'running', for as long as the test likes.
func (w *world) holdQueue() (release func()) {
	w.T.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, w.URL)
	if err != nil {
		w.T.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext('etl'))`, queueLockNamespace); err != nil {
		w.T.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { conn.Close(ctx) }) }
	w.T.Cleanup(release)
	return release
}

// stepSnapshot is what a rescue of a running job would change.
type stepSnapshot struct {
	State       string
	Attempt     int
	AttemptedBy []string
	AttemptedAt time.Time
}

func (w *world) job(jobID int64) stepSnapshot {
	w.T.Helper()
	var s stepSnapshot
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT state, attempt, coalesce(attempted_by, '{}'), coalesce(attempted_at, 'epoch')
		  FROM river_job WHERE id = $1`, jobID).Scan(&s.State, &s.Attempt, &s.AttemptedBy, &s.AttemptedAt); err != nil {
		w.T.Fatalf("read job %d: %v", jobID, err)
	}
	return s
}

// waitStepBlocked waits until the job of context id is 'running' and a step
// waits for its queue's lock, and returns the client running it.
func (w *world) waitStepBlocked(id int64) (jobID int64, client string) {
	w.T.Helper()
	testenv.Eventually(w.T, 30*time.Second, "a step to block on its queue's lock", func() (bool, error) {
		t := w.task(id)
		if t.RiverJobID == nil {
			return false, nil
		}
		jobID = *t.RiverJobID
		j := w.job(jobID)
		var blocked bool
		err := w.Pool.QueryRow(context.Background(), `
			SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			                WHERE datname = current_database() AND wait_event_type = 'Lock'
			                  AND query LIKE '%data_manager.start_attempt(%')`).Scan(&blocked)
		if j.State != "running" || len(j.AttemptedBy) == 0 || !blocked {
			return false, err
		}
		client = j.AttemptedBy[len(j.AttemptedBy)-1]
		return true, nil
	})
	return jobID, client
}

// livenessHeld reports whether client's liveness lock is held, by whichever
// session: what other supervisors look at before rescuing its steps.
func (w *world) livenessHeld(client string) bool {
	w.T.Helper()
	var held bool
	if err := w.Pool.QueryRow(context.Background(), `
		SELECT EXISTS (SELECT 1 FROM pg_locks
		                WHERE locktype = 'advisory' AND granted AND objsubid = 2
		                  AND classid = $1::oid AND objid = hashtext($2)::oid
		                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`,
		livenessLockNamespace, client).Scan(&held); err != nil {
		w.T.Fatal(err)
	}
	return held
}

// appConns counts (or, with terminate, ends) this database's connections
// named name; PostgreSQL keeps the first 63 bytes of an application_name.
func (w *world) appConns(name string, terminate bool) int {
	w.T.Helper()
	q := `SELECT count(*) FROM pg_stat_activity WHERE application_name = left($1, 63) AND datname = current_database()`
	if terminate {
		q = `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = left($1, 63) AND datname = current_database()`
	}
	var n int
	if err := w.Pool.QueryRow(context.Background(), q, name).Scan(&n); err != nil {
		w.T.Fatal(err)
	}
	return n
}

// startTwoSupervisors starts two supervisors while the event store is
// locked, waits for one of them to block in a step of context id, and
// returns that one (A, with its client id and the job) and the other (B).
func (w *world) startTwoSupervisors(id int64) (a, b *testenv.Proc, client string, jobID int64) {
	w.T.Helper()
	sups := []*testenv.Proc{w.Start(w.cfg, "supervisor"), w.Start(w.cfg, "supervisor")}
	for _, p := range sups {
		p.WaitReady(w.T, 30*time.Second)
	}
	jobID, client = w.waitStepBlocked(id)
	for i, p := range sups {
		if log, _ := os.ReadFile(p.Log); strings.Contains(string(log), "client_id="+client) {
			return p, sups[1-i], client, jobID
		}
	}
	w.T.Fatalf("neither supervisor's log names client %s", client)
	return nil, nil, "", 0
}

// allowConnections lets new connections into the test's database, or keeps
// them out (existing ones carry on). PostgreSQL takes that from a session on
// another database only: the server's, TEST_DATABASE_URL.
func (w *world) allowConnections(allow bool) {
	w.T.Helper()
	ctx := context.Background()
	var name string
	if err := w.Pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		w.T.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		w.T.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s WITH ALLOW_CONNECTIONS %t", pgx.Identifier{name}.Sanitize(), allow)); err != nil {
		w.T.Fatal(err)
	}
}

// A live supervisor whose connections to the database fail keeps its steps:
// its listener's failure leaves its liveness lock alone, and when its
// liveness connection fails and it cannot take its lock back for a few
// seconds (longer than the poll interval the others used to rescue within),
// the others wait out the grace, by which time it has its lock back: they
// never "rescue" its step in flight.
func TestLiveSupervisorKeepsItsStepsWhenItsConnectionsFail(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	id := w.submit(5, 100)
	release := w.holdQueue()
	a, b, client, jobID := w.startTwoSupervisors(id)
	before := w.job(jobID)
	unchanged := func(what string) {
		t.Helper()
		if now := w.job(jobID); now.State != before.State || now.Attempt != before.Attempt ||
			!slices.Equal(now.AttemptedBy, before.AttemptedBy) || !now.AttemptedAt.Equal(before.AttemptedAt) {
			t.Fatalf("%s: A's live step was taken from it: job %+v, was %+v", what, now, before)
		}
		if log, _ := os.ReadFile(b.Log); strings.Contains(string(log), rescuedLine) {
			t.Fatalf("%s: B rescued A's live step:\n%s", what, log)
		}
	}

	// The listener fails: it reconnects after a second, and the liveness
	// lock must be held all along.
	if n := w.appConns("dama-supervisor-listen:"+client, true); n != 1 {
		t.Fatalf("terminated %d listening connections of A, want 1", n)
	}
	since := time.Now()
	testenv.EventuallyEvery(t, 20*time.Millisecond, 15*time.Second, "A's listening connection to come back, its liveness lock held all along", func() (bool, error) {
		if !w.livenessHeld(client) {
			t.Fatalf("A's liveness lock went missing %s after its listening connection failed", time.Since(since))
		}
		return time.Since(since) >= 2*time.Second && w.appConns("dama-supervisor-listen:"+client, false) == 1, nil
	})
	unchanged("after the listener failed")

	// The liveness connection fails, and the database refuses new
	// connections for 3s: A's lock is truly missing all that time.
	w.allowConnections(false)
	t.Cleanup(func() { w.allowConnections(true) })
	if n := w.appConns("dama-supervisor-liveness:"+client, true); n != 1 {
		t.Fatalf("terminated %d liveness connections of A, want 1", n)
	}
	lost := time.Now()
	testenv.Within(t, 5*time.Second, "A's liveness lock to go", func() (bool, error) {
		return !w.livenessHeld(client), nil
	})
	if !testenv.Holds(3*time.Second-time.Since(lost), func() bool {
		unchanged("while A's liveness lock was missing")
		return !w.livenessHeld(client)
	}) {
		t.Fatal("A took its liveness lock back while the database refused connections")
	}
	w.allowConnections(true)
	// Before the grace B gives A runs out: what the product promises.
	testenv.Within(t, rescueGrace-time.Since(lost), "A to take its liveness lock back within B's grace", func() (bool, error) {
		return w.livenessHeld(client) && w.appConns("dama-supervisor-liveness:"+client, false) == 1, nil
	})
	t.Logf("A took its liveness lock back %s after losing it", time.Since(lost))
	// B keeps its hands off past the grace it gave A.
	testenv.Holds(rescueGrace+time.Second-time.Since(lost), func() bool {
		unchanged("after A took its liveness lock back")
		return true
	})
	unchanged("at the end of the window")
	// The step's timeout must not have cut the window short. River times
	// it from the step's start, just after it fetched the job and set
	// attempted_at by the database's clock: measured from there, not from
	// when the test saw the step blocked, which is later by as much as the
	// machine is slow.
	var stepAge time.Duration
	if err := w.Pool.QueryRow(context.Background(), `SELECT clock_timestamp() - $1`, before.AttemptedAt).Scan(&stepAge); err != nil {
		t.Fatal(err)
	}
	if stepAge >= stepTimeout {
		t.Fatalf("the checks ended %s after the step began, past its %s timeout: the step may have timed out", stepAge.Round(time.Millisecond), stepTimeout)
	}
	if log, _ := os.ReadFile(a.Log); !strings.Contains(string(log), "database connection back; other supervisors see this one alive again") {
		t.Errorf("A's log does not record taking its lock back:\n%s", log)
	}

	release()
	got := w.waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}
	if starts := w.starts(id); len(starts) != 1 {
		t.Errorf("starts: %v, want exactly one", starts)
	}
}

// A supervisor killed with SIGKILL in the middle of a step loses its
// liveness lock for good: another supervisor of its host, which finds its
// process gone, rescues the step at once, without spending an attempt, and
// the task runs once. (One of another host waits the grace:
// TestRescueWaitsOutTheGraceAndForgets.)
func TestDeadSupervisorsStepIsRescued(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 10)
	id := w.submit(5, 100)
	release := w.holdQueue()
	a, b, client, jobID := w.startTwoSupervisors(id)

	if err := syscall.Kill(-a.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "A's liveness lock to go", func() (bool, error) {
		return !w.livenessHeld(client), nil
	})
	// The rescue gives the step back: the job is no longer running under
	// A's attempt.
	stuck := w.job(jobID)
	testenv.Eventually(t, 30*time.Second, "B to rescue A's step", func() (bool, error) {
		j := w.job(jobID)
		return j.State != "running" || !j.AttemptedAt.Equal(stuck.AttemptedAt), nil
	})
	// B says so in a user's words, naming the task.
	said := fmt.Sprintf(`msg="%s; no attempt spent" etl_context_id=%d job_id=%d why="its supervisor, process %d of this host, is gone"`, rescuedLine, id, jobID, a.Cmd.Process.Pid)
	testenv.Eventually(t, 10*time.Second, "B to log the rescue", func() (bool, error) {
		log, _ := os.ReadFile(b.Log)
		return strings.Contains(string(log), said), fmt.Errorf("B's log, want %s:\n%s", said, log)
	})
	// B fetches it again, spending no attempt. (Its step finds the context's
	// lock held: A's backend, blocked on the queue's lock, still holds it
	// until the test lets go and the server finds A gone. So B looks again
	// every second.)
	testenv.Eventually(t, 10*time.Second, "B to take the step over", func() (bool, error) {
		j := w.job(jobID)
		return j.Attempt <= 1 && len(j.AttemptedBy) >= 2 && j.AttemptedBy[len(j.AttemptedBy)-1] != client, nil
	})

	release()
	got := w.waitSettled(id, 60*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("%s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}
	if starts := w.starts(id); len(starts) != 1 {
		t.Errorf("starts: %v, want exactly one", starts)
	}
}
