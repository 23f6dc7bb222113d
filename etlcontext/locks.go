package etlcontext

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dama-etl/dama/protocol"
	"github.com/jackc/pgx/v5"
)

// The lock of a context is the advisory lock (protocol.LockNamespace, id):
// every task process holds it for as long as it lives, whatever its lock
// mode (row mode also locks the INITIAL event row FOR UPDATE), and whoever
// judges or changes a context that may be running (a supervisor's step,
// `dama cancel`) takes it first. The view and the supervisors see in
// pg_locks, without trying it, which tasks run; trying it never fails with
// an error, so nothing fills the server's log while tasks run.

// Lock takes the lock of context id for the rest of tx, without waiting,
// and returns the context as it stands once the lock is held. It returns
// ErrLocked when a task process (or, for a moment, a supervisor) holds it.
func Lock(ctx context.Context, tx pgx.Tx, id int64) (*Context, error) {
	if err := lockXact(ctx, tx, id); err != nil {
		return nil, err
	}
	// Read once the lock is held: a task process that released it just
	// before has committed everything it wrote.
	return Get(ctx, tx, id)
}

// LockStep is Lock for a step of River job job: from the same read, it
// also returns whether job runs and since when (its last fetch), by which
// a Work tells whether another one has taken its job over.
func LockStep(ctx context.Context, tx pgx.Tx, id, job int64) (*Context, JobState, error) {
	if err := lockXact(ctx, tx, id); err != nil {
		return nil, JobState{}, err
	}
	type read struct {
		Context
		jobRow
	}
	r, err := collectOne[read](ctx, tx, `
		SELECT `+contextColumns+`, coalesce(j.state = `+jobRunning+`, false), j.attempted_at
		  FROM data_manager.etl_contexts AS c
		  LEFT JOIN river_job AS j ON j.id = $2
		 WHERE c.etl_context_id = $1`, id, job)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, JobState{}, fmt.Errorf("task %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, JobState{}, fmt.Errorf("read task %d: %w", id, err)
	}
	return &r.Context, r.state(), nil
}

// JobState is whether a River job runs, and since when: its last fetch.
type JobState struct {
	Running     bool
	AttemptedAt time.Time
}

// jobRow is a JobState as read, its time NULL for a job never fetched.
type jobRow struct {
	Running     bool
	AttemptedAt *time.Time
}

func (j jobRow) state() JobState {
	if j.AttemptedAt == nil {
		return JobState{Running: j.Running}
	}
	return JobState{Running: j.Running, AttemptedAt: *j.AttemptedAt}
}

// LockRow takes, for the rest of tx, the lock of context id and then its
// INITIAL event row FOR UPDATE: the lock of a row-mode task process, held
// in a transaction left open for the task's life. It returns ErrLocked when
// another process holds either.
//
// byKey says that tx's session holds its run's key (RunKeySetting): the row
// is then locked through data_manager.lock_initial_event (migration 19),
// the only way for a member of dama_task, which may lock no other row of
// event_store. Otherwise, or when the role may not call the function (one
// of an earlier setup's, with rights of its own on event_store, or on a
// schema not yet migrated), it is locked directly.
//
// What tx keeps locked for the task's life is part of the contract between
// releases (docs/operations.md "Releases and upgrades"): the advisory lock,
// the row, and so event_store and its indexes (ROW SHARE), but nothing of
// etl_contexts, so that a later release's migration may add a column to
// etl_contexts while this task runs.
func LockRow(ctx context.Context, tx pgx.Tx, id int64, byKey bool) (*Context, error) {
	if err := lockXact(ctx, tx, id); err != nil {
		return nil, err
	}
	// Found by event_store's own index, without reading etl_contexts: the
	// function reads it in a subtransaction rolled back. Whoever locks the
	// row holds the advisory lock first, so NOWAIT does not fail here
	// unless something outside dama locks the row.
	lockSQL := `SELECT event_id FROM data_manager.event_store
		 WHERE etl_context_id = $1 AND type LIKE '%:INITIAL'
		   FOR UPDATE NOWAIT`
	if byKey {
		var may bool
		if err := tx.QueryRow(ctx, `
			SELECT coalesce(has_function_privilege(to_regprocedure('data_manager.lock_initial_event(bigint)'), 'EXECUTE'), false)`).Scan(&may); err != nil {
			return nil, fmt.Errorf("lock initial event of task %d: %w", id, err)
		}
		if may {
			lockSQL = `SELECT data_manager.lock_initial_event($1)`
		}
	}
	var eventID *int64
	err := tx.QueryRow(ctx, lockSQL, id).Scan(&eventID)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && eventID == nil:
		return nil, fmt.Errorf("lock initial event of task %d: %w", id, ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("lock initial event of task %d: %w", id, classify(err))
	}
	// The context is read in a savepoint rolled back at once: the table
	// lock the read takes on etl_contexts goes with it, while the locks
	// taken before the savepoint stay.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("read task %d: %w", id, err)
	}
	c, err := Get(ctx, sp, id)
	if rerr := sp.Rollback(ctx); rerr != nil && err == nil {
		return nil, fmt.Errorf("read task %d: %w", id, rerr)
	}
	return c, err
}

// LockSession takes the lock of context id for the life of conn's session,
// with no transaction left open (advisory lock mode), and returns the
// context as it stands once the lock is held; ErrLocked when another
// process holds it. The lock lasts until UnlockSession or the session's end.
func LockSession(ctx context.Context, conn DB, id int64) (*Context, error) {
	if err := TryLockSession(ctx, conn, id); err != nil {
		return nil, err
	}
	c, err := Get(ctx, conn, id)
	if err != nil {
		return nil, errors.Join(err, UnlockSession(ctx, conn, id))
	}
	return c, nil
}

// TryLockSession takes the session lock of context id on conn, which must
// be a connection (a pool would hand the lock to its next user), or fails
// with ErrLocked: LockSession without the read, for a lock keeper that
// holds the locks of many task processes on one session (host lock mode).
func TryLockSession(ctx context.Context, conn DB, id int64) error {
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2::int)`, protocol.LockNamespace, id).Scan(&ok); err != nil {
		return fmt.Errorf("take session lock of task %d: %w", id, err)
	}
	if !ok {
		return fmt.Errorf("take session lock of task %d: %w", id, ErrLocked)
	}
	return nil
}

// UnlockSession releases the session lock LockSession took on conn.
func UnlockSession(ctx context.Context, conn DB, id int64) error {
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1, $2::int)`, protocol.LockNamespace, id); err != nil {
		return fmt.Errorf("release session lock of task %d: %w", id, err)
	}
	return nil
}

// HoldsKeyOf reports whether key is the key of context id's current run,
// which must be RUNNING: how a lock keeper knows that a process asking it
// to hold a context's lock is that run's task process. The key is held
// (RunKeySetting) for the one statement that asks, which must be its own
// transaction: db is not one.
func HoldsKeyOf(ctx context.Context, db DB, id int64, key string) (bool, error) {
	var ok bool
	// The materialized CTE sets the key before holds_key_of reads it.
	if err := db.QueryRow(ctx, `
		WITH k AS MATERIALIZED (SELECT set_config($2, $3, true))
		SELECT data_manager.holds_key_of($1) FROM k`, id, RunKeySetting, key).Scan(&ok); err != nil {
		return false, fmt.Errorf("check the run key of task %d: %w", id, err)
	}
	return ok, nil
}

// lockXact takes the lock of context id for the rest of tx, or fails with
// ErrLocked.
func lockXact(ctx context.Context, tx pgx.Tx, id int64) error {
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, $2::int)`, protocol.LockNamespace, id).Scan(&ok); err != nil {
		return fmt.Errorf("take lock of task %d: %w", id, err)
	}
	if !ok {
		return fmt.Errorf("lock task %d: %w", id, ErrLocked)
	}
	return nil
}
