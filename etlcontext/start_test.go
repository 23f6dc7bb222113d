package etlcontext_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// A start decided from a read starts the task only if it is still as read:
// a second start from the same read (another Work's, or a step's that read
// before the first started it) starts nothing. A start beyond the queue's
// bound records why the task waits, and starts nothing.
func TestAStartFromAStaleReadStartsNothing(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	task := func() (*etlcontext.Context, int64) {
		t.Helper()
		id, _, err := etlcontext.CreateTask(ctx, env.Pool, etlcontext.NewTask{Kind: "k", Queue: "q", MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		c, err := etlcontext.Get(ctx, env.Pool, id)
		if err != nil {
			t.Fatal(err)
		}
		return c, *c.RiverJobID
	}
	start := func(c *etlcontext.Context, job int64) (etlcontext.Run, etlcontext.Wait, error) {
		return etlcontext.StartIfFree(ctx, env.Pool, etlcontext.Start{Read: c, Job: job, QueueMax: 1, Attempt: 1, LaunchedBy: "test"})
	}

	c, job := task()
	run, wait, err := start(c, job)
	if err != nil || wait != etlcontext.WaitNone || run.ID == "" || run.Key == "" || run.Attempt != 1 {
		t.Fatalf("first start: %+v, %q, %v; want a run of attempt 1", run, wait, err)
	}
	if again, wait, err := start(c, job); !errors.Is(err, etlcontext.ErrChanged) || wait != etlcontext.WaitNone || again.ID != "" {
		t.Errorf("second start from the same read: %+v, %q, %v; want ErrChanged", again, wait, err)
	}
	if now, err := etlcontext.Get(ctx, env.Pool, c.ID); err != nil || now.Status != etlcontext.StatusRunning || now.RunID == nil || *now.RunID != run.ID {
		t.Errorf("task after both starts: %+v, %v; want RUNNING under the first start's run %s", now, err, run.ID)
	}

	other, otherJob := task()
	if run, wait, err := start(other, otherJob); err != nil || wait != etlcontext.WaitQueueFull || run.ID != "" {
		t.Errorf("start beyond the queue's bound: %+v, %q, %v; want queue_full", run, wait, err)
	}
	if now, err := etlcontext.Get(ctx, env.Pool, other.ID); err != nil || now.Status != etlcontext.StatusQueued || now.WaitingFor != etlcontext.WaitQueueFull {
		t.Errorf("task that must wait: %+v, %v; want QUEUED, waiting for queue_full", now, err)
	}
}

// A step's lock and read, and a start, must read what committed before
// their locks: under a snapshot older than those (REPEATABLE READ,
// SERIALIZABLE) they refuse to run, and change nothing.
func TestAStepRefusesASnapshotOlderThanItsLocks(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id, _, err := etlcontext.CreateTask(ctx, env.Pool, etlcontext.NewTask{Kind: "k", Queue: "q", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := etlcontext.Get(ctx, env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		err := pgx.BeginTxFunc(ctx, env.Pool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
			_, _, err := etlcontext.LockStep(ctx, tx, id, *c.RiverJobID)
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "lock_step needs READ COMMITTED") {
			t.Errorf("LockStep under %s: %v; want refused, READ COMMITTED named", iso, err)
		}
		err = pgx.BeginTxFunc(ctx, env.Pool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
			_, _, err := etlcontext.StartIfFree(ctx, tx, etlcontext.Start{Read: c, Job: *c.RiverJobID, QueueMax: 1, Attempt: 1, LaunchedBy: "test"})
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "start_attempt needs READ COMMITTED") {
			t.Errorf("StartIfFree under %s: %v; want refused, READ COMMITTED named", iso, err)
		}
	}
	if now, err := etlcontext.Get(ctx, env.Pool, id); err != nil || now.Status != etlcontext.StatusQueued || now.WaitingFor != etlcontext.WaitNone {
		t.Errorf("task after the refused starts: %+v, %v; want QUEUED, waiting for nothing", now, err)
	}
}
