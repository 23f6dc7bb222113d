package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// takenOver is a task whose held job another Work has fetched again (as
// River records it), while this test's supervisor's Work still holds it.
type takenOver struct {
	env    *testenv.Env
	ctx    context.Context
	id     int64
	job    int64
	goFile string // the task ends once this file exists
	stop   func()
	ran    chan error
}

func takeOver(t *testing.T) *takenOver {
	env := testenv.New(t)
	o := &takenOver{env: env, goFile: filepath.Join(env.Dir, "go"), ran: make(chan error, 1)}
	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  waiter: { command: ["/bin/sh", "-c", "while [ ! -e ` + o.goFile + ` ]; do sleep 0.2; done"] }
`))
	if err != nil {
		t.Fatal(err)
	}
	// No deadline: the waits bound the test, stretched on a slow machine
	// (testenv.Eventually), and this runs the supervisor.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	o.ctx = ctx
	s := newTestSupervisor(t, env, env.Pool, cfg)
	runCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	o.stop = stop
	go func() { o.ran <- s.Run(runCtx) }()
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if o.id, _, err = client.Submit(ctx, dama.SubmitParams{Kind: "waiter"}); err != nil {
		t.Fatal(err)
	}
	// The task ends with the test, whatever happens.
	t.Cleanup(func() {
		_ = os.WriteFile(o.goFile, nil, 0o644)
		testenv.Eventually(t, 30*time.Second, "the task to end", func() (bool, error) {
			c, err := etlcontext.Get(context.Background(), env.Pool, o.id)
			return err == nil && c.Status.Finished(), err
		})
	})
	testenv.Eventually(t, 30*time.Second, "the task's job to be held", func() (bool, error) {
		var locked bool
		err := env.Pool.QueryRow(ctx, `
			SELECT j.id, q.etl_status = 'RUNNING' AND q.pid IS NOT NULL AND q.initial_event_locked AND j.state = 'running'
			  FROM data_manager.dama_task_queue AS q JOIN river_job AS j ON j.id = q.river_job_id
			 WHERE q.etl_context_id = $1`, o.id).Scan(&o.job, &locked)
		return locked, err
	})
	// Another Work's fetch, as River records it.
	if _, err := env.Pool.Exec(ctx, `UPDATE river_job SET attempted_at = attempted_at + interval '1 second' WHERE id = $1`, o.job); err != nil {
		t.Fatal(err)
	}
	return o
}

// state is the job's state.
func (o *takenOver) state(t *testing.T) string {
	var st string
	if err := o.env.Pool.QueryRow(o.ctx, `SELECT state::text FROM river_job WHERE id = $1`, o.job).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// stopped waits for the supervisor to stop.
func (o *takenOver) stopped(t *testing.T) {
	var err error
	testenv.Eventually(t, 30*time.Second, "the supervisor to stop once the other Work was done with the job", func() (bool, error) {
		select {
		case err = <-o.ran:
			return true, nil
		default:
			return false, nil
		}
	})
	if err != nil {
		t.Fatalf("supervisor: %v", err)
	}
}

// TestATakenOverHoldWritesNothing: a Work whose held job was fetched again
// by another Work (rescued while its supervisor was cut off from the
// database) writes nothing over that one's job, even when its supervisor
// stops: it waits until the job no longer runs, so that what it returns
// changes nothing.
func TestATakenOverHoldWritesNothing(t *testing.T) {
	t.Parallel()
	o := takeOver(t)
	// Stopping, the supervisor would give its holds back.
	o.stop()
	if !testenv.Holds(3*time.Second, func() bool { return o.state(t) == "running" }) {
		t.Fatalf("the taken-over hold wrote over the other Work's job: %s", o.state(t))
	}
	// The other Work gives the job back (its own hold's end): the first
	// one returns, and its snooze changes nothing, attempt included.
	if _, err := o.env.Pool.Exec(o.ctx, `UPDATE river_job SET state = 'available' WHERE id = $1`, o.job); err != nil {
		t.Fatal(err)
	}
	o.stopped(t)
	var (
		st      string
		attempt int
	)
	if err := o.env.Pool.QueryRow(o.ctx, `SELECT state::text, attempt FROM river_job WHERE id = $1`, o.job).Scan(&st, &attempt); err != nil {
		t.Fatal(err)
	}
	if st != "available" || attempt != 1 {
		t.Errorf("job %s at attempt %d after the taken-over hold returned, want available at attempt 1 as the other Work left it", st, attempt)
	}
}

// TestATakenOverWorkCompletesNothing: a Work whose held job was fetched
// again by another Work writes nothing over that one's job when its task
// ends, though it is the one that sees the end (its runner's reaping pokes
// it): the other Work settles the job.
func TestATakenOverWorkCompletesNothing(t *testing.T) {
	t.Parallel()
	o := takeOver(t)
	if err := os.WriteFile(o.goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the task to end", func() (bool, error) {
		c, err := etlcontext.Get(o.ctx, o.env.Pool, o.id)
		return err == nil && c.Status == etlcontext.StatusDone, err
	})
	if !testenv.Holds(3*time.Second, func() bool { return o.state(t) == "running" }) {
		t.Fatalf("the taken-over Work wrote over the other Work's job: %s", o.state(t))
	}
	// The other Work completes the job; the first one returns, changing
	// nothing.
	if _, err := o.env.Pool.Exec(o.ctx, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, o.job); err != nil {
		t.Fatal(err)
	}
	o.stop()
	o.stopped(t)
	if st := o.state(t); st != "completed" {
		t.Errorf("job %s after the taken-over Work returned, want completed as the other Work left it", st)
	}
}

// A context may have two Works on one supervisor: its own job's and that of
// a job it left (dama retry while a killed supervisor held it; rescued, and
// fetched here again). Both are poked, and the end of one leaves the
// other's registered: in a run where the left job's Work ended after the
// other began, the task was DONE with its own job held for the half hour of
// a hold, for its pokes went nowhere.
func TestTheEndOfAContextsOtherWorkLeavesItsHoldPoked(t *testing.T) {
	s := &Supervisor{holds: map[int64][]chan struct{}{}}
	own := s.holding(1)
	left := s.holding(1)
	s.released(1, left)
	if !s.poke(1) {
		t.Fatal("no Work of context 1 to poke after the left job's Work ended")
	}
	select {
	case <-own:
	default:
		t.Fatal("the remaining Work of context 1 was not poked")
	}
	s.released(1, own)
	if s.poke(1) || len(s.holds) != 0 {
		t.Fatalf("Works still registered after both ended: %v", s.holds)
	}
}
