package etlcontext_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

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
