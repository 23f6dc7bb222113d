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

// TestLocksExcludeEachOtherAndShowInTheView checks the three ways to hold a
// context's lock (a step's Lock, a row-mode task's LockRow, an
// advisory-mode task's LockRun): each excludes the others, fails with
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
		"LockRun": func() (func(), error) {
			conn, err := env.Pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := etlcontext.LockRun(ctx, conn.Conn(), id, protocol.Version, nil); err != nil {
				conn.Release()
				return nil, err
			}
			return func() {
				if err := etlcontext.UnlockSession(ctx, conn.Conn(), id, false); err != nil {
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
