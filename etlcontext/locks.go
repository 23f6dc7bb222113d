package etlcontext

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/protocol"
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

// LockStep is Lock for a step of River job job, in one statement
// (data_manager.lock_step, migration 38): db may be a transaction, which
// then keeps the lock, or not, and the lock goes with the statement. From
// the same read, it also returns whether job runs and since when (its last
// fetch), by which a Work tells whether another one has taken its job over.
// When another holds the lock, it returns ErrLocked with the context and
// the job as they stand.
func LockStep(ctx context.Context, db DB, id, job int64) (*Context, JobState, error) {
	type read struct {
		HeldElsewhere bool
		Context
		jobRow
	}
	r, err := collectOne[read](ctx, db, `
		SELECT s.held_elsewhere, `+contextColumns+`, coalesce(s.job_running, false), s.job_attempted_at
		  FROM data_manager.lock_step($1, $2) AS s, LATERAL (SELECT (s.task).*) AS c
		 WHERE c.etl_context_id IS NOT NULL`, id, job)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, JobState{}, fmt.Errorf("task %d: %w", id, ErrNotFound)
	case err != nil:
		return nil, JobState{}, fmt.Errorf("lock and read task %d: %w", id, err)
	case r.HeldElsewhere:
		return &r.Context, r.state(), fmt.Errorf("lock task %d: %w", id, ErrLocked)
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
	// Whether the role may call the function, in the statement that takes
	// the advisory lock.
	var locked, may bool
	if err := tx.QueryRow(ctx, `
		SELECT pg_try_advisory_xact_lock($1, $2::int),
		       coalesce(has_function_privilege(to_regprocedure('data_manager.lock_initial_event(bigint)'), 'EXECUTE'), false)`,
		protocol.LockNamespace, id).Scan(&locked, &may); err != nil {
		return nil, fmt.Errorf("take lock of task %d: %w", id, err)
	}
	if !locked {
		return nil, fmt.Errorf("lock task %d: %w", id, ErrLocked)
	}
	// Found by event_store's own index, without reading etl_contexts: the
	// function reads it in a subtransaction rolled back. Whoever locks the
	// row holds the advisory lock first, so NOWAIT does not fail here
	// unless something outside dama locks the row.
	lockSQL := `SELECT event_id FROM data_manager.event_store
		 WHERE etl_context_id = $1 AND type LIKE '%:INITIAL'
		   FOR UPDATE NOWAIT`
	if byKey && may {
		lockSQL = `SELECT data_manager.lock_initial_event($1)`
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

// LockRunSQL takes the lock of context $1 for the life of the session and
// reads the context under it (data_manager.lock_run, migration 37): for a
// task process of protocol $2, and, when $3 is not NULL, holding the key
// $3 of the context's current run. LockRun reads its rows.
const LockRunSQL = `SELECT ` + contextColumns + ` FROM data_manager.lock_run($1, $2, $3) AS c`

// LockRun takes the lock of context id for the life of conn's session, with
// no transaction left open (advisory and host lock modes), and returns the
// context as it stands once the lock is held, in one statement. It fails,
// before taking the lock, with ErrProtocolRefused when the database no
// longer accepts task processes of protocol, and, given key, with
// ErrStaleRun when key is not that of the context's current run; with
// ErrLocked when another process holds the lock, and ErrNotFound. The lock
// lasts until UnlockSession or the session's end. conn must be a
// connection: a pool would hand the lock to its next user.
func LockRun(ctx context.Context, conn DB, id int64, protocol int, key *string) (*Context, error) {
	rows, err := conn.Query(ctx, LockRunSQL, id, protocol, key)
	return ScanLockRun(id, rows, err)
}

// ScanLockRun reads what LockRunSQL answered for context id (rows, or err):
// as LockRun.
func ScanLockRun(id int64, rows pgx.Rows, err error) (*Context, error) {
	if err != nil {
		return nil, fmt.Errorf("lock task %d: %w", id, classify(err))
	}
	c, err := pgx.CollectOneRow(rows, pgx.RowToStructByPos[Context])
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("lock task %d: %w", id, ErrLocked)
	case err != nil:
		return nil, fmt.Errorf("lock task %d: %w", id, classify(err))
	}
	return &c, nil
}

// UnlockSession releases the session lock LockRun took on conn, and, with
// announce, tells the supervisors that the task process ends
// (protocol.ExitedChannel) in the same statement, once the lock is free.
func UnlockSession(ctx context.Context, conn DB, id int64, announce bool) error {
	sql := `SELECT pg_advisory_unlock($1, $2::int)`
	args := []any{protocol.LockNamespace, id}
	if announce {
		sql += `, pg_notify($3, $2::text)`
		args = append(args, protocol.ExitedChannel)
	}
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("release session lock of task %d: %w", id, err)
	}
	return nil
}

// Announce tells the supervisors that the task process of context id ends
// (protocol.ExitedChannel), once it released its lock.
func Announce(ctx context.Context, db DB, id int64) error {
	if _, err := db.Exec(ctx, "SELECT pg_notify($1, $2)", protocol.ExitedChannel, strconv.FormatInt(id, 10)); err != nil {
		return fmt.Errorf("announce the end of task %d's task process: %w", id, err)
	}
	return nil
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
