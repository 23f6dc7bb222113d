package etlcontext_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// newContext inserts a QUEUED context of kind "k" with its INITIAL event, as
// submission does.
func newContext(t *testing.T, env *testenv.Env, maxAttempts int) int64 {
	t.Helper()
	ctx := context.Background()
	var id int64
	if err := env.Pool.QueryRow(ctx, `
		INSERT INTO data_manager.etl_contexts (kind, queue, max_attempts) VALUES ('k', 'q', $1)
		RETURNING etl_context_id`, maxAttempts).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:INITIAL", Payload: map[string]int{"n": 1}}); err != nil {
		t.Fatal(err)
	}
	return id
}

// startAttempt moves the context to RUNNING with a new run id, as a
// supervisor's launch does, and returns the run id.
func startAttempt(t *testing.T, env *testenv.Env, id int64) string {
	t.Helper()
	var runID string
	if err := env.Pool.QueryRow(context.Background(), `
		UPDATE data_manager.etl_contexts SET etl_status = 'RUNNING', attempt = attempt + 1, run_id = gen_random_uuid()
		 WHERE etl_context_id = $1 RETURNING run_id::text`, id).Scan(&runID); err != nil {
		t.Fatal(err)
	}
	return runID
}

func status(t *testing.T, env *testenv.Env, id int64) etlcontext.Status {
	t.Helper()
	c, err := etlcontext.Get(context.Background(), env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	return c.Status
}

func appendEvent(env *testenv.Env, id int64, typ string, runID string) error {
	_, err := etlcontext.Append(context.Background(), env.Pool, etlcontext.NewEvent{ContextID: id, Type: typ, RunID: &runID, Payload: map[string]int{"x": 1}})
	return err
}

func TestStatusFollowsEvents(t *testing.T) {
	env := testenv.New(t)
	id := newContext(t, env, 3)
	if got := status(t, env, id); got != etlcontext.StatusQueued {
		t.Fatalf("new context is %s, want QUEUED", got)
	}
	run1 := startAttempt(t, env, id)
	if err := appendEvent(env, id, "k:PROGRESS", run1); err != nil {
		t.Fatal(err)
	}
	if err := appendEvent(env, id, "k:ERROR", run1); err != nil {
		t.Fatal(err)
	}
	if got := status(t, env, id); got != etlcontext.StatusRetrying {
		t.Fatalf("after an ERROR with attempts left: %s, want RETRYING", got)
	}
	run2 := startAttempt(t, env, id)
	if err := appendEvent(env, id, "k:FINAL", run2); err != nil {
		t.Fatal(err)
	}
	c, err := etlcontext.Get(context.Background(), env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != etlcontext.StatusDone || c.FinishedAt == nil || c.Attempt != 2 {
		t.Fatalf("after FINAL: status %s, finished_at %v, attempt %d; want DONE, set, 2", c.Status, c.FinishedAt, c.Attempt)
	}
	events, err := etlcontext.Events(context.Background(), env.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	if last := events[len(events)-1]; *c.LatestEventID != last.ID || last.Attempt != 2 {
		t.Errorf("latest_event_id %d, last event %d of attempt %d", *c.LatestEventID, last.ID, last.Attempt)
	}
	if !events[2].Error {
		t.Errorf("the ERROR event is not flagged error")
	}
}

func TestErrorOnLastAttemptFails(t *testing.T) {
	env := testenv.New(t)
	id := newContext(t, env, 1)
	run := startAttempt(t, env, id)
	if err := appendEvent(env, id, "k:ERROR", run); err != nil {
		t.Fatal(err)
	}
	if got := status(t, env, id); got != etlcontext.StatusFailed {
		t.Fatalf("ERROR on the last attempt: %s, want FAILED", got)
	}
}

func TestFinishedContextIsNeverReopened(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id := newContext(t, env, 3)
	run := startAttempt(t, env, id)
	if err := appendEvent(env, id, "k:FINAL", run); err != nil {
		t.Fatal(err)
	}
	if err := appendEvent(env, id, "k:PROGRESS", run); !errors.Is(err, etlcontext.ErrFinished) {
		t.Errorf("event after DONE: got %v, want ErrFinished", err)
	}
	for _, stmt := range []string{
		`UPDATE data_manager.etl_contexts SET etl_status = 'RUNNING' WHERE etl_context_id = $1`,
		`UPDATE data_manager.etl_contexts SET etl_status = 'QUEUED' WHERE etl_context_id = $1`,
		`UPDATE data_manager.etl_contexts SET attempt = 7, run_id = gen_random_uuid() WHERE etl_context_id = $1`,
	} {
		if _, err := env.Pool.Exec(ctx, stmt, id); err == nil {
			t.Errorf("%s: accepted on a DONE context", stmt)
		}
	}
	if got := status(t, env, id); got != etlcontext.StatusDone {
		t.Fatalf("status %s after the refused updates, want DONE", got)
	}
}

func TestWritesFromAStaleAttemptAreRejected(t *testing.T) {
	env := testenv.New(t)
	id := newContext(t, env, 3)
	run1 := startAttempt(t, env, id)
	if err := appendEvent(env, id, "k:ERROR", run1); err != nil {
		t.Fatal(err)
	}
	run2 := startAttempt(t, env, id)
	for _, typ := range []string{"k:PROGRESS", "k:FINAL", "k:CHECKPOINT"} {
		if err := appendEvent(env, id, typ, run1); !errors.Is(err, etlcontext.ErrStaleRun) {
			t.Errorf("%s from the previous attempt: got %v, want ErrStaleRun", typ, err)
		}
	}
	if err := appendEvent(env, id, "k:PROGRESS", run2); err != nil {
		t.Errorf("event from the current attempt: %v", err)
	}
	if _, err := etlcontext.Append(context.Background(), env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:PROGRESS"}); !errors.Is(err, etlcontext.ErrStaleRun) {
		t.Errorf("event without a run id on a started context: got %v, want ErrStaleRun", err)
	}
}

func TestEventGuards(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id := newContext(t, env, 3)
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:INITIAL"}); err == nil {
		t.Error("a second INITIAL event was accepted")
	}
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "other:PROGRESS"}); err == nil {
		t.Error("an event of another kind was accepted")
	}
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:FINAL"}); err == nil {
		t.Error("FINAL on a context that never started was accepted")
	}
	if _, err := env.Pool.Exec(ctx, `UPDATE data_manager.etl_contexts SET etl_status = 'DONE' WHERE etl_context_id = $1`, id); err == nil {
		t.Error("QUEUED -> DONE without running was accepted")
	}
	if _, err := env.Pool.Exec(ctx, `UPDATE data_manager.event_store SET payload = '{}' WHERE etl_context_id = $1`, id); err == nil {
		t.Error("an event was edited")
	}
}

func TestARetriedNumberedWriteIsStoredOnce(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id := newContext(t, env, 3)
	runID := startAttempt(t, env, id)
	write := func(suffix string, seq int) (int64, error) {
		return etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{
			ContextID: id, Type: "k:" + suffix, Payload: map[string]int{"seq": seq}, RunID: &runID, Seq: &seq,
		})
	}
	// A write whose first try committed but whose answer was lost is sent
	// again after the reconnect: the same event, stored once.
	first, err := write("PROGRESS", 1)
	if err != nil {
		t.Fatal(err)
	}
	again, err := write("PROGRESS", 1)
	if err != nil || again != first {
		t.Errorf("retried write: event %d, %v; want the first one, %d", again, err, first)
	}
	final, err := write("FINAL", 2)
	if err != nil {
		t.Fatal(err)
	}
	// Retrying the write that finished the context is not refused.
	if again, err := write("FINAL", 2); err != nil || again != final {
		t.Errorf("retried FINAL: event %d, %v; want %d", again, err, final)
	}
	var n int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.event_store WHERE etl_context_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 || status(t, env, id) != etlcontext.StatusDone {
		t.Errorf("%d events, status %s; want INITIAL, PROGRESS, FINAL and DONE", n, status(t, env, id))
	}
}

// Events are never deleted, and a context reaches an outcome only through
// its events, whoever asks: here the tables' owner.
func TestHistoryIsKept(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id := newContext(t, env, 3)
	run := startAttempt(t, env, id)
	for _, stmt := range []string{
		`DELETE FROM data_manager.event_store WHERE etl_context_id = $1`,
		`DELETE FROM data_manager.etl_contexts WHERE etl_context_id = $1`,
		`UPDATE data_manager.etl_contexts SET etl_status = 'DONE' WHERE etl_context_id = $1`,
		`UPDATE data_manager.etl_contexts SET etl_status = 'FAILED' WHERE etl_context_id = $1`,
		`UPDATE data_manager.etl_contexts SET etl_status = 'CANCELLED' WHERE etl_context_id = $1`,
		`UPDATE data_manager.etl_contexts SET etl_status = 'RETRYING' WHERE etl_context_id = $1`,
	} {
		if _, err := env.Pool.Exec(ctx, stmt, id); err == nil {
			t.Errorf("%s: accepted", stmt)
		}
	}
	if _, err := env.Pool.Exec(ctx, `TRUNCATE data_manager.event_store`); err == nil {
		t.Error("TRUNCATE of event_store: accepted")
	}
	if got := status(t, env, id); got != etlcontext.StatusRunning {
		t.Fatalf("status %s after the refused statements, want RUNNING", got)
	}
	// The same outcome through its event is taken.
	if err := appendEvent(env, id, "k:FINAL", run); err != nil {
		t.Fatal(err)
	}
	if got := status(t, env, id); got != etlcontext.StatusDone {
		t.Errorf("status %s after FINAL, want DONE", got)
	}
}
