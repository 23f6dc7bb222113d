package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// TestATakenOverHoldWritesNothing: a Work whose held job was fetched again
// by another Work (rescued while its supervisor was cut off from the
// database) writes nothing over that one's job, even when its supervisor
// stops: it waits until the job no longer runs, so that what it returns
// changes nothing.
func TestATakenOverHoldWritesNothing(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  waiter: { command: ["/bin/sh", "-c", "while [ ! -e ` + goFile + ` ]; do sleep 0.05; done"] }
`))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := newTestSupervisor(t, env, env.Pool, cfg)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx) }()
	client, err := NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := client.Submit(ctx, SubmitParams{Kind: "waiter"})
	if err != nil {
		t.Fatal(err)
	}
	// The task ends with the test, whatever happens.
	t.Cleanup(func() {
		_ = os.WriteFile(goFile, nil, 0o644)
		testenv.Eventually(t, 30*time.Second, "the task to end", func() (bool, error) {
			c, err := etlcontext.Get(context.Background(), env.Pool, id)
			return err == nil && c.Status.Finished(), err
		})
	})

	var job int64
	testenv.Eventually(t, 30*time.Second, "the task's job to be held", func() (bool, error) {
		var locked bool
		err := env.Pool.QueryRow(ctx, `
			SELECT j.id, q.etl_status = 'RUNNING' AND q.pid IS NOT NULL AND q.initial_event_locked AND j.state = 'running'
			  FROM data_manager.dama_task_queue AS q JOIN river_job AS j ON j.id = q.river_job_id
			 WHERE q.etl_context_id = $1`, id).Scan(&job, &locked)
		return locked, err
	})
	// Another Work's fetch, as River records it.
	if _, err := env.Pool.Exec(ctx, `UPDATE river_job SET attempted_at = attempted_at + interval '1 second' WHERE id = $1`, job); err != nil {
		t.Fatal(err)
	}
	state := func() string {
		var st string
		if err := env.Pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, job).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	// Stopping, the supervisor would give its holds back.
	stop()
	if !testenv.Holds(3*time.Second, func() bool { return state() == "running" }) {
		t.Fatalf("the taken-over hold wrote over the other Work's job: %s", state())
	}
	// The other Work gives the job back (its own hold's end): the first
	// one returns, and its snooze changes nothing, attempt included.
	if _, err := env.Pool.Exec(ctx, `UPDATE river_job SET state = 'available' WHERE id = $1`, job); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("supervisor: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the supervisor did not stop once the other Work was done with the job")
	}
	var (
		st      string
		attempt int
	)
	if err := env.Pool.QueryRow(ctx, `SELECT state::text, attempt FROM river_job WHERE id = $1`, job).Scan(&st, &attempt); err != nil {
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
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	cfg, err := config.Load(env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 500ms
kinds:
  waiter: { command: ["/bin/sh", "-c", "while [ ! -e ` + goFile + ` ]; do sleep 0.05; done"] }
`))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := newTestSupervisor(t, env, env.Pool, cfg)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx) }()
	client, err := NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := client.Submit(ctx, SubmitParams{Kind: "waiter"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(goFile, nil, 0o644) })

	var job int64
	testenv.Eventually(t, 30*time.Second, "the task's job to be held", func() (bool, error) {
		var locked bool
		err := env.Pool.QueryRow(ctx, `
			SELECT j.id, q.etl_status = 'RUNNING' AND q.pid IS NOT NULL AND q.initial_event_locked AND j.state = 'running'
			  FROM data_manager.dama_task_queue AS q JOIN river_job AS j ON j.id = q.river_job_id
			 WHERE q.etl_context_id = $1`, id).Scan(&job, &locked)
		return locked, err
	})
	// Another Work's fetch, as River records it.
	if _, err := env.Pool.Exec(ctx, `UPDATE river_job SET attempted_at = attempted_at + interval '1 second' WHERE id = $1`, job); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the task to end", func() (bool, error) {
		c, err := etlcontext.Get(ctx, env.Pool, id)
		return err == nil && c.Status == etlcontext.StatusDone, err
	})
	state := func() string {
		var st string
		if err := env.Pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, job).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if !testenv.Holds(3*time.Second, func() bool { return state() == "running" }) {
		t.Fatalf("the taken-over Work wrote over the other Work's job: %s", state())
	}
	// The other Work completes the job; the first one returns, changing
	// nothing.
	if _, err := env.Pool.Exec(ctx, `UPDATE river_job SET state = 'completed', finalized_at = now() WHERE id = $1`, job); err != nil {
		t.Fatal(err)
	}
	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("supervisor: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the supervisor did not stop once the other Work was done with the job")
	}
	if st := state(); st != "completed" {
		t.Errorf("job %s after the taken-over Work returned, want completed as the other Work left it", st)
	}
}
