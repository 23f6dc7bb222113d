package etlcontext_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// Prune removes finished tasks older than its cutoff with everything of
// theirs, and nothing else: not a running task, not a finished one
// younger than the cutoff, not a parent while it has a child left.
func TestPruneRemovesOnlyOldFinishedTasks(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	finish := func(id int64) {
		t.Helper()
		run := startAttempt(t, env, id)
		for _, typ := range []string{"k:PROGRESS", "k:FINAL"} {
			if err := appendEvent(env, id, typ, run); err != nil {
				t.Fatal(err)
			}
		}
	}
	child := func(parent int64) int64 {
		t.Helper()
		id := newContext(t, env, 1)
		if _, err := env.Pool.Exec(ctx, `UPDATE data_manager.etl_contexts SET parent_context_id = $2 WHERE etl_context_id = $1`, id, parent); err != nil {
			t.Fatal(err)
		}
		return id
	}
	old := []int64{newContext(t, env, 1), newContext(t, env, 1), newContext(t, env, 1)}
	for _, id := range old {
		finish(id)
	}
	running := newContext(t, env, 1)
	startAttempt(t, env, running)
	queued := newContext(t, env, 1)
	// A finished parent with a running child, and one whose child is done.
	parentOfRunning, parentOfDone := newContext(t, env, 1), newContext(t, env, 1)
	finish(parentOfRunning)
	finish(parentOfDone)
	runningChild, doneChild := child(parentOfRunning), child(parentOfDone)
	startAttempt(t, env, runningChild)
	finish(doneChild)
	// Those are older than olderThan once the database's clock says so;
	// the next is younger.
	const olderThan = 2 * time.Second
	testenv.Eventually(t, 30*time.Second, "the finished tasks to be older than 2s", func() (bool, error) {
		var old bool
		err := env.Pool.QueryRow(ctx, `SELECT max(finished_at) < now() - interval '2s' FROM data_manager.etl_contexts`).Scan(&old)
		return old, err
	})
	young := newContext(t, env, 1)
	finish(young)

	var total etlcontext.Pruned
	for {
		// Two at a time: the parent of the done child goes once its child
		// went, in a later call.
		p, err := etlcontext.Prune(ctx, env.Pool, olderThan, 2)
		if err != nil {
			t.Fatal(err)
		}
		total = total.Add(p)
		if p.Tasks < 2 {
			break
		}
	}
	var left []int64
	rows, err := env.Pool.Query(ctx, `SELECT etl_context_id FROM data_manager.etl_contexts ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	want := []int64{running, queued, parentOfRunning, runningChild, young}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Errorf("contexts left %v, want %v (running, queued, the parent of a running child and its child, the young)", left, want)
	}
	// Each removed task had INITIAL, PROGRESS and FINAL, and one attempt.
	if total.Tasks != 5 || total.Events != 15 {
		t.Errorf("pruned %+v, want 5 tasks and their 15 events", total)
	}
	var orphans int
	if err := env.Pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM data_manager.event_store e WHERE NOT EXISTS (SELECT 1 FROM data_manager.etl_contexts c WHERE c.etl_context_id = e.etl_context_id))
		     + (SELECT count(*) FROM data_manager.etl_attempts a WHERE NOT EXISTS (SELECT 1 FROM data_manager.etl_contexts c WHERE c.etl_context_id = a.etl_context_id))`).Scan(&orphans); err != nil {
		t.Fatal(err)
	}
	if orphans != 0 {
		t.Errorf("%d events or attempts left of removed tasks", orphans)
	}
	// Outside Prune, events are still never deleted, a finished task's
	// neither.
	if _, err := env.Pool.Exec(ctx, `DELETE FROM data_manager.event_store WHERE etl_context_id = $1`, young); err == nil {
		t.Error("a plain DELETE of a finished task's events was accepted")
	}
	// Nor, with the setting, a running task's.
	tx, err := env.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT set_config('dama.pruning', 'on', true)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM data_manager.event_store WHERE etl_context_id = $1`, running); err == nil {
		t.Error("a running task's events were deleted")
	}
}
