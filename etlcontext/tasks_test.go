package etlcontext_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
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
		{"before the newest two", etlcontext.TaskQuery{Before: ids[2]}, []int64{ids[1], ids[0]}},
		{"one status, before", etlcontext.TaskQuery{Statuses: byStatus(etlcontext.StatusQueued), Before: ids[3]}, []int64{ids[0]}},
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

// The counts by status stop at their cap; the finished tasks are counted
// per minute and hour, by status.
func TestCountsByStatusAndFinishedPerHour(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	var ids []int64
	for range 4 {
		ids = append(ids, newContext(t, env, 3))
	}
	for _, id := range ids[:2] {
		if err := appendEvent(env, id, "k:FINAL", startAttempt(t, env, id)); err != nil {
			t.Fatal(err)
		}
	}
	for upTo, want := range map[int]map[etlcontext.Status]int{
		10: {etlcontext.StatusQueued: 2, etlcontext.StatusDone: 2},
		1:  {etlcontext.StatusQueued: 1, etlcontext.StatusDone: 1},
	} {
		got, err := etlcontext.CountByStatus(ctx, env.Pool, etlcontext.TaskQuery{Kind: "k", Statuses: []etlcontext.Status{etlcontext.StatusFailed}, Limit: 1}, upTo)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range etlcontext.Statuses {
			if got[st] != want[st] {
				t.Errorf("up to %d: %d %s, want %d (all: %v)", upTo, got[st], st, want[st], got)
			}
		}
	}
	if got, err := etlcontext.CountByStatus(ctx, env.Pool, etlcontext.TaskQuery{Kind: "another"}, 10); err != nil || got[etlcontext.StatusQueued]+got[etlcontext.StatusDone] != 0 {
		t.Errorf("another kind's counts: %v, %v; want none", got, err)
	}
	for _, per := range []string{"minute", "hour"} {
		spans, err := etlcontext.FinishedPer(ctx, env.Pool, etlcontext.TaskQuery{Kind: "k"}, per, time.Now().Add(-24*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		done := 0
		for _, s := range spans {
			done += s.Done
			if s.Failed != 0 || s.Cancelled != 0 || s.At.After(time.Now()) {
				t.Errorf("per %s: %+v, want only DONE, in the past", per, s)
			}
		}
		if done != 2 || len(spans) > 2 {
			t.Errorf("per %s: %d DONE in %d spans, want 2 in at most 2", per, done, len(spans))
		}
	}
	if _, err := etlcontext.FinishedPer(ctx, env.Pool, etlcontext.TaskQuery{}, "week", time.Now()); err == nil {
		t.Error("per week: no error")
	}
}
