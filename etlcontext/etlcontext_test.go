package etlcontext_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/taskrunner/protocol"
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

// TestLocksExcludeEachOtherAndShowInTheView checks the three ways to hold a
// context's lock (a step's Lock, a row-mode task's LockRow, an
// advisory-mode task's LockSession): each excludes the others, fails with
// ErrLocked rather than waiting, and shows in the view while held.
func TestLocksExcludeEachOtherAndShowInTheView(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id := newContext(t, env, 3)
	locked := func() bool {
		tasks, err := etlcontext.Tasks(ctx, env.Pool, etlcontext.TaskQuery{ID: id})
		if err != nil || len(tasks) != 1 {
			t.Fatalf("read view: %v (%d rows)", err, len(tasks))
		}
		return tasks[0].InitialEventLocked
	}
	inTx := func(lock func(pgx.Tx) error) func() (release func(), err error) {
		return func() (func(), error) {
			tx, err := env.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := lock(tx); err != nil {
				tx.Rollback(ctx)
				return nil, err
			}
			return func() { tx.Rollback(ctx) }, nil
		}
	}
	ways := map[string]func() (func(), error){
		"Lock": inTx(func(tx pgx.Tx) error { _, err := etlcontext.Lock(ctx, tx, id); return err }),
		"LockRow": inTx(func(tx pgx.Tx) error {
			c, err := etlcontext.LockRow(ctx, tx, id, false)
			if err == nil && c.ID != id {
				t.Errorf("LockRow returned context %d", c.ID)
			}
			return err
		}),
		"LockSession": func() (func(), error) {
			conn, err := env.Pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := etlcontext.LockSession(ctx, conn.Conn(), id); err != nil {
				conn.Release()
				return nil, err
			}
			return func() {
				if err := etlcontext.UnlockSession(ctx, conn.Conn(), id); err != nil {
					t.Error(err)
				}
				conn.Release()
			}, nil
		},
	}
	for holder, hold := range ways {
		if locked() {
			t.Fatalf("view shows a lock before %s", holder)
		}
		release, err := hold()
		if err != nil {
			t.Fatalf("%s: %v", holder, err)
		}
		if !locked() {
			t.Errorf("view does not show the lock %s holds", holder)
		}
		for other, try := range ways {
			if rel, err := try(); !errors.Is(err, etlcontext.ErrLocked) {
				if rel != nil {
					rel()
				}
				t.Errorf("%s while %s holds the lock: got %v, want ErrLocked", other, holder, err)
			}
		}
		release()
		if locked() {
			t.Errorf("view still shows the lock after %s released it", holder)
		}
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

// TestCancelRequestIsANoteBesideTheRun: a cancellation request names who
// asked, and leaves the run's latest event (an AWAITING parent keeps its
// queue slot free); a task process cannot write one.
func TestCancelRequestIsANoteBesideTheRun(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id := newContext(t, env, 1)
	runID := startAttempt(t, env, id)
	if err := appendEvent(env, id, "k:AWAITING", runID); err != nil {
		t.Fatal(err)
	}
	var status etlcontext.Status
	err := pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		var err error
		status, err = etlcontext.RequestCancel(ctx, tx, id, "alice@host")
		return err
	})
	if err != nil || status != etlcontext.StatusRunning {
		t.Fatalf("RequestCancel: %s, %v; want RUNNING", status, err)
	}
	tasks, err := etlcontext.Tasks(ctx, env.Pool, etlcontext.TaskQuery{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if got := tasks[0]; got.LatestEventType == nil || *got.LatestEventType != "k:AWAITING" || got.CancelRequestedAt == nil {
		t.Errorf("after the request: latest event %v, cancel requested at %v; want k:AWAITING, and a time", got.LatestEventType, got.CancelRequestedAt)
	}
	var role string
	if err := env.Pool.QueryRow(ctx, `SELECT session_user`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	by, err := etlcontext.LatestPayload(ctx, env.Pool, id, protocol.EventCancelRequested)
	if err != nil || string(by) != `{"by": "alice@host (database role `+role+`)"}` {
		t.Errorf("CANCEL_REQUESTED payload %s, %v", by, err)
	}
	seq := 7
	_, err = etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:CANCEL_REQUESTED", RunID: &runID, Seq: &seq, Payload: map[string]string{"by": "forged"}})
	if err == nil {
		t.Error("a numbered CANCEL_REQUESTED (a task process's) was stored")
	}
	// A finished context is left as it is.
	if err := appendEvent(env, id, "k:FINAL", runID); err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		var err error
		status, err = etlcontext.RequestCancel(ctx, tx, id, "bob@host")
		return err
	})
	if err != nil || status != etlcontext.StatusDone {
		t.Errorf("RequestCancel of a DONE context: %s, %v; want DONE", status, err)
	}
	err = pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
		_, err := etlcontext.RequestCancel(ctx, tx, 999999, "bob@host")
		return err
	})
	if !errors.Is(err, etlcontext.ErrNotFound) {
		t.Errorf("RequestCancel of no context: %v, want ErrNotFound", err)
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

// A task process whose record's reply was lost records itself again, and
// that is no second attempt; another process cannot.
func TestRecordRunnerMayBeRepeatedByTheSameProcess(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id := newContext(t, env, 3)
	runID := startAttempt(t, env, id)
	rec := etlcontext.Runner{Host: "a", HostID: "host-a", PID: 4242, StartTicks: 77, LogPath: "/l"}
	for i := range 2 {
		if _, err := etlcontext.RecordRunner(ctx, env.Pool, id, runID, rec); err != nil {
			t.Fatalf("record %d: %v", i+1, err)
		}
	}
	other := rec
	other.PID = 4243
	if _, err := etlcontext.RecordRunner(ctx, env.Pool, id, runID, other); !errors.Is(err, etlcontext.ErrStaleRun) {
		t.Errorf("another process's record: %v, want ErrStaleRun", err)
	}
	var attempts int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.etl_attempts WHERE etl_context_id = $1`, id).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 {
		t.Errorf("%d attempts recorded, want 1", attempts)
	}
}

// A command's own WARNING, whatever it says, is never taken for the task
// process's report of an unfit host.
func TestACommandsWarningIsNoUnfitHost(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	id := newContext(t, env, 3)
	runID := startAttempt(t, env, id)
	reason := "this host cannot run the task: find command of kind k: not found"
	seq := 1
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:WARNING", RunID: &runID, Seq: &seq, Payload: map[string]string{"reason": reason}}); err != nil {
		t.Fatal(err)
	}
	if seen, err := etlcontext.WarnedThisAttempt(ctx, env.Pool, id, reason); err != nil || seen {
		t.Errorf("after a command's WARNING: WarnedThisAttempt %v, %v; want false", seen, err)
	}
	if got, err := etlcontext.LatestUnfitHost(ctx, env.Pool, id, 1); err != nil || got != "" {
		t.Errorf("after a command's WARNING: LatestUnfitHost %q, %v; want none", got, err)
	}
	seq = 2
	if _, err := etlcontext.Append(ctx, env.Pool, etlcontext.NewEvent{ContextID: id, Type: "k:WARNING", RunID: &runID, Seq: &seq,
		Payload: map[string]string{"reason": reason}, Meta: map[string]string{etlcontext.UnfitHostMeta: reason}}); err != nil {
		t.Fatal(err)
	}
	if seen, err := etlcontext.WarnedThisAttempt(ctx, env.Pool, id, reason); err != nil || !seen {
		t.Errorf("after the task process's WARNING: WarnedThisAttempt %v, %v; want true", seen, err)
	}
	if got, err := etlcontext.LatestUnfitHost(ctx, env.Pool, id, 1); err != nil || got != reason {
		t.Errorf("after the task process's WARNING: LatestUnfitHost %q, %v; want %q", got, err, reason)
	}
}
