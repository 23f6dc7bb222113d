package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/dama-etl/dama/internal/etlcontext"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// TaskArgs are the arguments of the one River job that follows a context
// through its whole life. The task's own arguments live in the context's
// INITIAL event, not in the job. data_manager.create_task (migration 24)
// inserts a submission's job with the same arguments.
type TaskArgs struct {
	ETLContextID int64 `json:"etl_context_id"`
	// TaskKind is the task's kind, for the kind's retry policy (NextRetry);
	// empty in the jobs of releases before it, which then back off as
	// River does by default.
	TaskKind string `json:"kind,omitempty"`
}

// Kind is the River job kind of every dama task.
func (TaskArgs) Kind() string { return etlcontext.JobKind }

// fetchCooldown is the River clients' FetchCooldown. River sends at most
// one insert notification per queue per FetchCooldown from a client; its
// default (100ms) would leave tasks submitted in a burst waiting for the
// supervisors' next fetch poll.
const fetchCooldown = 10 * time.Millisecond

// newRiverClient returns an insert-only River client on pool: a Client's
// retries insert their tasks' new jobs with it.
func newRiverClient(pool *pgxpool.Pool) (*river.Client[pgx.Tx], error) {
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{FetchCooldown: fetchCooldown})
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	return rc, nil
}

// enqueueJob inserts, in tx, the River job that steps context id, of kind,
// and records it as the context's job: a context has exactly one job.
func enqueueJob(ctx context.Context, rc *river.Client[pgx.Tx], tx pgx.Tx, id int64, kind string, opts *river.InsertOpts) (int64, error) {
	res, err := rc.InsertTx(ctx, tx, TaskArgs{ETLContextID: id, TaskKind: kind}, opts)
	if err != nil {
		return 0, fmt.Errorf("enqueue River job: %w", err)
	}
	if err := etlcontext.SetJob(ctx, tx, id, res.Job.ID); err != nil {
		return 0, err
	}
	return res.Job.ID, nil
}
