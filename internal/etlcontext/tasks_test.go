package etlcontext_test

import (
	"context"
	"slices"
	"testing"

	"github.com/dama-etl/dama/internal/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

func TestTasksSelectsByIDStatusAndLimitNewestFirst(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	// ids[0] QUEUED, ids[1] RUNNING with two PROGRESS events, ids[2] DONE,
	// ids[3] QUEUED.
	ids := []int64{newContext(t, env, 3), newContext(t, env, 3), newContext(t, env, 3), newContext(t, env, 3)}
	run := startAttempt(t, env, ids[1])
	for _, step := range []int{1, 2} {
		if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: ids[1], Type: "k:PROGRESS", RunID: &run, Payload: map[string]int{"step": step}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := appendEvent(env, ids[1], "k:CHECKPOINT", run); err != nil {
		t.Fatal(err)
	}
	run = startAttempt(t, env, ids[2])
	if err := appendEvent(env, ids[2], "k:FINAL", run); err != nil {
		t.Fatal(err)
	}

	byStatus := func(s ...etlcontext.Status) []etlcontext.Status { return s }
	for _, tc := range []struct {
		name string
		q    etlcontext.TaskQuery
		want []int64
	}{
		{"all", etlcontext.TaskQuery{}, []int64{ids[3], ids[2], ids[1], ids[0]}},
		{"newest 2", etlcontext.TaskQuery{Limit: 2}, []int64{ids[3], ids[2]}},
		{"by id", etlcontext.TaskQuery{ID: ids[1], Limit: 50}, []int64{ids[1]}},
		{"by id and another status", etlcontext.TaskQuery{ID: ids[1], Statuses: byStatus(etlcontext.StatusQueued)}, nil},
		{"one status", etlcontext.TaskQuery{Statuses: byStatus(etlcontext.StatusQueued)}, []int64{ids[3], ids[0]}},
		{"one status, newest 1", etlcontext.TaskQuery{Statuses: byStatus(etlcontext.StatusQueued), Limit: 1}, []int64{ids[3]}},
		{"two statuses", etlcontext.TaskQuery{Statuses: byStatus(etlcontext.StatusRunning, etlcontext.StatusDone), Limit: 50}, []int64{ids[2], ids[1]}},
		{"no such status", etlcontext.TaskQuery{Statuses: byStatus(etlcontext.StatusFailed)}, nil},
	} {
		tasks, err := etlcontext.Tasks(ctx, env.Pool, tc.q)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got []int64
		for _, task := range tasks {
			got = append(got, task.ID)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: ids %v, want %v", tc.name, got, tc.want)
		}
	}

	tasks, err := etlcontext.Tasks(ctx, env.Pool, etlcontext.TaskQuery{ID: ids[1]})
	if err != nil || len(tasks) != 1 {
		t.Fatalf("read running task: %v (%d rows)", err, len(tasks))
	}
	if got := tasks[0]; string(got.Progress) != `{"step": 2}` || got.LatestEventType == nil || *got.LatestEventType != "k:CHECKPOINT" || got.InitialEventLocked {
		t.Errorf("running task: progress %s, latest event %v, locked %t; want the second PROGRESS, the CHECKPOINT, unlocked",
			got.Progress, got.LatestEventType, got.InitialEventLocked)
	}
}
