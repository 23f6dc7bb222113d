package etlcontext_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// Prune removes whole trees of finished tasks older than its cutoff with
// everything of theirs, and nothing else: not a running task, not a
// finished one younger than the cutoff, not a finished parent while a child
// of it runs, nor a finished child while its parent runs.
func TestPruneRemovesOnlyOldFinishedTrees(t *testing.T) {
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
	// A finished parent with a running child; one whose children are done
	// (one of them with a child of its own); a running parent whose child
	// is done.
	parentOfRunning, parentOfDone, runningParent := newContext(t, env, 1), newContext(t, env, 1), newContext(t, env, 1)
	finish(parentOfRunning)
	finish(parentOfDone)
	startAttempt(t, env, runningParent)
	runningChild, doneChild, childOfRunning := child(parentOfRunning), child(parentOfDone), child(runningParent)
	doneGrandchild := child(doneChild)
	startAttempt(t, env, runningChild)
	finish(doneChild)
	finish(doneGrandchild)
	finish(childOfRunning)
	// Those are older than olderThan once the database's clock says so;
	// the next is younger, through the prune's transactions however slow
	// the machine: 10 s.
	const olderThan = 10 * time.Second
	testenv.Eventually(t, time.Minute, "the finished tasks to be older than 10s", func() (bool, error) {
		var old bool
		err := env.Pool.QueryRow(ctx, `SELECT max(finished_at) < now() - interval '10s' FROM data_manager.etl_contexts`).Scan(&old)
		return old, err
	})
	young := newContext(t, env, 1)
	finish(young)

	// Two tasks a transaction: the tree of three goes alone.
	total, err := etlcontext.Prune(ctx, env.Pool, olderThan, etlcontext.PruneLimits{Tasks: 2})
	if err != nil {
		t.Fatal(err)
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
	want := []int64{running, queued, parentOfRunning, runningParent, runningChild, childOfRunning, young}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Errorf("contexts left %v, want %v (running, queued, the trees with a running member, the young)", left, want)
	}
	// Each removed task had INITIAL, PROGRESS and FINAL.
	if total.Tasks != 6 || total.Events != 18 {
		t.Errorf("pruned %+v, want 6 tasks and their 18 events", total)
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
	// neither, even with the setting remove_tasks uses.
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
	// remove_tasks itself refuses a part of a tree, or a running task.
	for _, ids := range [][]int64{{childOfRunning}, {runningChild}, {parentOfRunning}} {
		if _, err := env.Pool.Exec(ctx, `SELECT data_manager.remove_tasks($1)`, ids); err == nil {
			t.Errorf("remove_tasks(%v) was accepted", ids)
		}
	}
}
