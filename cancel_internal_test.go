package dama

import (
	"context"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// A task that is not running is cancelled by RequestCancel (the status
// page's cancel) as soon as its lock is free, not at its next step, which
// for a task waiting out a retry's backoff may be hours later.
func TestRequestCancelOfAWaitingTaskOutwaitsAMomentaryLock(t *testing.T) {
	env, client := newTestClient(t)
	ctx := context.Background()
	id, _, err := client.Submit(ctx, SubmitParams{Kind: "sample"})
	if err != nil {
		t.Fatal(err)
	}
	// The lock is held as a supervisor's step holds it.
	holder, err := env.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1, $2::int)`, protocol.LockNamespace, id); err != nil {
		t.Fatal(err)
	}
	type result struct {
		status etlcontext.Status
		err    error
	}
	done := make(chan result, 1)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	go func() {
		status, err := client.RequestCancel(rctx, id)
		done <- result{status, err}
	}()
	testenv.Eventually(t, 30*time.Second, "the cancellation to be requested", func() (bool, error) {
		var n int
		err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.event_store WHERE etl_context_id = $1 AND type LIKE '%:CANCEL_REQUESTED'`, id).Scan(&n)
		return n == 1, err
	})
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1, $2::int)`, protocol.LockNamespace, id); err != nil {
		t.Fatal(err)
	}
	var got result
	select {
	case got = <-done:
	case <-rctx.Done():
		t.Fatal("RequestCancel did not return once the lock was free")
	}
	if got.err != nil || got.status != etlcontext.StatusCancelled {
		t.Fatalf("RequestCancel: %s, %v; want CANCELLED", got.status, got.err)
	}
	var job string
	if err := env.Pool.QueryRow(ctx, `SELECT j.state::text FROM river_job AS j JOIN data_manager.etl_contexts AS c ON c.river_job_id = j.id WHERE c.etl_context_id = $1`, id).Scan(&job); err != nil {
		t.Fatal(err)
	}
	if job != "cancelled" {
		t.Errorf("River job %s, want cancelled", job)
	}
}
