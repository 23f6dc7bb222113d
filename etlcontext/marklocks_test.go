package etlcontext_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// MarkLocksLost takes the lock only of the tasks it is given. Two RUNNING
// tasks whose task process took its lock and let it go;
// the watch asks about the first alone: the second's lock must not be
// taken by the statement (its owner's step would read it held, and a
// runner taking it again would be turned away).
func TestMarkLocksLostTakesOnlyTheLocksItIsAskedAbout(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	var ids []int64
	for range 2 {
		id, _, err := etlcontext.CreateTask(ctx, env.Pool, etlcontext.NewTask{Kind: "k", Queue: "q", MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		run := env.Launch(id)
		if _, err := env.Pool.Exec(ctx, `UPDATE data_manager.etl_contexts SET pid = 4242 WHERE etl_context_id = $1 AND run_id = $2::uuid`, id, run.ID); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := env.Pool.Exec(ctx, `ANALYZE data_manager.etl_contexts`); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		// The plan a small table gets once the statement is cached (a
		// generic plan, a sequential scan): the planner orders the filter
		// by cost, the CASE before the ANY.
		if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_indexscan = off; SET LOCAL enable_bitmapscan = off`); err != nil {
			return err
		}
		lost, err := etlcontext.MarkLocksLost(ctx, tx, ids[:1])
		if err != nil {
			return err
		}
		if len(lost) != 1 || lost[0].ID != ids[0] {
			t.Errorf("marked %v, want task %d alone", lost, ids[0])
		}
		var held []int64
		if err := tx.QueryRow(ctx, `
			SELECT coalesce(array_agg(objid::text::bigint ORDER BY objid::text::bigint), '{}') FROM pg_locks
			 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND classid = $1::bigint::oid AND objsubid = 2`,
			int64(protocol.LockNamespace)).Scan(&held); err != nil {
			return err
		}
		if len(held) != 1 || held[0] != ids[0] {
			t.Errorf("the statement holds the locks of tasks %v; want task %d's alone", held, ids[0])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
