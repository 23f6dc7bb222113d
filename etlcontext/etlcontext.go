// Package etlcontext reads and writes dama's domain tables,
// data_manager.etl_contexts and data_manager.event_store, which are the single
// source of truth for every task.
//
// A context's status is derived by the database from the events written to
// it: <kind>:FINAL makes it DONE, <kind>:ERROR makes it RETRYING (or FAILED
// when its attempts are used up), <kind>:CANCELLED makes it CANCELLED. The
// database refuses any event for a finished context and any event that does
// not carry the run id of the current attempt, so a task process that lost its
// lock can no longer write.
package etlcontext

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Status is the status of an ETL context.
type Status string

// The statuses of an ETL context. DONE, FAILED and CANCELLED are final.
const (
	StatusQueued    Status = "QUEUED"
	StatusRunning   Status = "RUNNING"
	StatusRetrying  Status = "RETRYING"
	StatusDone      Status = "DONE"
	StatusFailed    Status = "FAILED"
	StatusCancelled Status = "CANCELLED"
)

// Statuses lists every status, in the order a context goes through them.
var Statuses = []Status{StatusQueued, StatusRunning, StatusRetrying, StatusDone, StatusFailed, StatusCancelled}

// Finished reports whether s is final: a finished context never runs again.
func (s Status) Finished() bool {
	return s == StatusDone || s == StatusFailed || s == StatusCancelled
}

// Event type suffixes with a meaning to dama. A task may report any other
// upper-case suffix.
const (
	EventInitial    = "INITIAL"
	EventFinal      = "FINAL"
	EventError      = "ERROR"
	EventCancelled  = "CANCELLED"
	EventProgress   = "PROGRESS"
	EventCheckpoint = "CHECKPOINT"
	EventWarning    = "WARNING"
	// EventTimeout records that an attempt's command outran its kind's
	// timeout and was stopped; the attempt's ERROR follows.
	EventTimeout = "TIMEOUT"
	// EventRetried reopens a FAILED or CANCELLED context for a new attempt
	// (`dama retry`): the one event a finished context accepts.
	EventRetried = "RETRIED"
	// EventSubmitted records a child submitted by the task's command on its
	// events pipe, in the transaction that creates the child: only the
	// current attempt can submit one.
	EventSubmitted = "SUBMITTED"
	// EventCancelRequested records who asked a running task to stop; the
	// task process records its CANCELLED once it has.
	EventCancelRequested = "CANCEL_REQUESTED"
	// EventAwaiting records that the command of a kind with await_children
	// succeeded and the task now waits for its children to finish.
	EventAwaiting = "AWAITING"
)

// ErrorFinal is the field of an ERROR event's payload that, set to false,
// makes the context FAILED whatever attempts remain: the kind's policy
// says not to retry this failure (an exit code in fail_on_exit_codes, a
// timeout with on_timeout: fail).
const ErrorFinal = "retry"

// dama's advisory locks, all two-int keys (namespace, key), one namespace
// per kind of lock so that no two ever collide.
const (
	// LockNamespace is the first key of the lock a task process holds
	// (the second is the context id); it spells 'dama'. Key 0, which no
	// context id takes, serializes `dama migrate`.
	LockNamespace = 1684106593
	// queueLockNamespace, kindLockNamespace and keyLockNamespace make a
	// start race-free across supervisors: whoever starts a task, pauses a
	// queue or blocks a kind takes, for the rest of its transaction, the
	// lock (namespace, hashtext(name)) of the queue, then of the kind,
	// then of the kind's concurrency key; always in that order, so that no
	// two transactions wait for each other.
	queueLockNamespace = LockNamespace + 1
	// ClientLockNamespace keys the session lock each supervisor holds for
	// its life, by its River client id's hash (supervisor/liveness.go).
	ClientLockNamespace = LockNamespace + 2
	kindLockNamespace   = LockNamespace + 4
	keyLockNamespace    = LockNamespace + 5
	// scheduleLockNamespace, by hashtext(kind), serializes the taking of
	// a periodic kind's ticks (LockSchedule).
	scheduleLockNamespace = LockNamespace + 6
)

// FinishedChannel is the channel on which the database announces, in the
// transaction that finishes it, every context that becomes DONE, FAILED or
// CANCELLED, with a Finished as its JSON payload.
const FinishedChannel = "dama_task_finished"

// Finished is the payload of a notification on FinishedChannel.
type Finished struct {
	ID     int64  `json:"etl_context_id"`
	Kind   string `json:"kind"`
	Queue  string `json:"queue"`
	Status Status `json:"status"`
	// ParentID is the context's parent (migration 12 on; nil for none).
	ParentID *int64 `json:"parent_context_id,omitempty"`
}

// Errors reported by the database's guards, recognisable with errors.Is.
var (
	// ErrNotFound: no context has that id.
	ErrNotFound = errors.New("etl context not found")
	// ErrLocked: another transaction holds the context's INITIAL event lock.
	ErrLocked = errors.New("etl context is locked by a running task")
	// ErrFinished: the context is finished and takes no more writes.
	ErrFinished = errors.New("etl context is finished")
	// ErrStaleRun: the write came from an attempt that is no longer current.
	ErrStaleRun = errors.New("write from an attempt that is no longer current")
)

// DB is what this package needs of a pgx connection, pool or transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Context is a row of data_manager.etl_contexts.
type Context struct {
	ID                int64
	ParentID          *int64
	Kind              string
	Queue             string
	Status            Status
	InitialEventID    *int64
	LatestEventID     *int64
	RiverJobID        *int64
	IdempotencyKey    *string
	MaxAttempts       int
	Attempt           int
	RunID             *string
	LaunchedBy        *string
	Host              *string
	PID               *int
	ProcessStartedAt  *time.Time
	LogPath           *string
	HeartbeatAt       *time.Time
	CancelRequestedAt *time.Time
	CreatedAt         time.Time
	StartedAt         *time.Time
	FinishedAt        *time.Time
	// HostID identifies the host the attempt's task process runs on (boot
	// id and pid namespace): its pids mean something only there.
	HostID *string
	// RunnerStartTicks, CommandPGID and CommandStartTicks identify the task
	// process and its command's process group on that host.
	RunnerStartTicks  *int64
	CommandPGID       *int
	CommandStartTicks *int64
	// FenceWindow is the longest the task process goes on after its lock is
	// released before its command is surely stopped.
	FenceWindow *time.Duration
	// LockLostAt is when a supervisor first found the lock free while the
	// context was RUNNING.
	LockLostAt *time.Time
	// DueAt is when the task may first start; ConcurrencyKey its kind's
	// concurrency key, from its arguments; WaitingFor and WaitingSince why
	// and since when a due task waits to start (WaitNone once it starts).
	DueAt          *time.Time
	ConcurrencyKey *string
	WaitingFor     Wait
	WaitingSince   *time.Time
}

const contextColumns = `c.etl_context_id, c.parent_context_id, c.kind, c.queue, c.etl_status,
	c.initial_event_id, c.latest_event_id, c.river_job_id, c.idempotency_key, c.max_attempts,
	c.attempt, c.run_id::text, c.launched_by, c.host, c.pid, c.process_started_at, c.log_path,
	c.heartbeat_at, c.cancel_requested_at, c.created_at, c.started_at, c.finished_at,
	c.host_id, c.runner_start_ticks, c.command_pgid, c.command_start_ticks, c.fence_window, c.lock_lost_at,
	c.due_at, c.concurrency_key, coalesce(c.waiting_for, ''), c.waiting_since`

func scanContext(row pgx.Row) (*Context, error) {
	var c Context
	err := row.Scan(&c.ID, &c.ParentID, &c.Kind, &c.Queue, &c.Status,
		&c.InitialEventID, &c.LatestEventID, &c.RiverJobID, &c.IdempotencyKey, &c.MaxAttempts,
		&c.Attempt, &c.RunID, &c.LaunchedBy, &c.Host, &c.PID, &c.ProcessStartedAt, &c.LogPath,
		&c.HeartbeatAt, &c.CancelRequestedAt, &c.CreatedAt, &c.StartedAt, &c.FinishedAt,
		&c.HostID, &c.RunnerStartTicks, &c.CommandPGID, &c.CommandStartTicks, &c.FenceWindow, &c.LockLostAt,
		&c.DueAt, &c.ConcurrencyKey, &c.WaitingFor, &c.WaitingSince)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// Get reads context id.
func Get(ctx context.Context, db DB, id int64) (*Context, error) {
	c, err := scanContext(db.QueryRow(ctx, `SELECT `+contextColumns+` FROM data_manager.etl_contexts AS c WHERE c.etl_context_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("etl context %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read etl context %d: %w", id, err)
	}
	return c, nil
}

// ErrIdempotencyKeyOtherKind is returned by Create for an idempotency key
// that a context of another kind holds: a key names one submission, and
// answering with another kind's task would hand the caller a task it did
// not ask for.
var ErrIdempotencyKeyOtherKind = errors.New("idempotency key belongs to a task of another kind")

// NewContext is a context to create, QUEUED, as submission does.
type NewContext struct {
	Kind        string
	Queue       string
	MaxAttempts int
	// IdempotencyKey, when not empty, makes Create return the context that
	// holds it, if any, instead of creating one.
	IdempotencyKey string
	// ParentID, when not 0, makes the context a child of that one.
	ParentID       int64
	ConcurrencyKey *string
	// DueAt delays the first start until then; zero or past means now.
	DueAt time.Time
}

// Create inserts context c and returns its id; created is false when c's
// idempotency key was taken already, and id is then the context holding it,
// which must be of c's kind (ErrIdempotencyKeyOtherKind otherwise). The
// caller writes the context's INITIAL event and River job in the same
// transaction.
func Create(ctx context.Context, db DB, c NewContext) (id int64, created bool, err error) {
	var key, parent, dueAt any
	if c.IdempotencyKey != "" {
		key = c.IdempotencyKey
	}
	if c.ParentID != 0 {
		parent = c.ParentID
	}
	if !c.DueAt.IsZero() {
		dueAt = c.DueAt
	}
	err = db.QueryRow(ctx, `
		INSERT INTO data_manager.etl_contexts (parent_context_id, kind, queue, max_attempts, idempotency_key,
		                                       concurrency_key, due_at)
		VALUES ($1, $2, $3, $4, $5, $6, greatest(now(), coalesce($7, now())))
		ON CONFLICT (idempotency_key) DO NOTHING
		RETURNING etl_context_id`, parent, c.Kind, c.Queue, c.MaxAttempts, key, c.ConcurrencyKey, dueAt).Scan(&id)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return id, true, nil
	case errors.As(err, &pgErr) && pgErr.Code == "23503" && pgErr.ConstraintName == "etl_contexts_parent_context_id_fkey":
		return 0, false, fmt.Errorf("parent etl context %d does not exist", c.ParentID)
	case !errors.Is(err, pgx.ErrNoRows):
		return 0, false, fmt.Errorf("insert etl context: %w", err)
	}
	// The key's unique index made a concurrent insert of it wait for its
	// holder to commit; this statement's snapshot, newer than that commit,
	// sees the holder (under REPEATABLE READ the insert fails instead), so
	// two submissions of one key with different kinds never both succeed.
	var kind string
	err = db.QueryRow(ctx, `SELECT etl_context_id, kind FROM data_manager.etl_contexts WHERE idempotency_key = $1`, key).Scan(&id, &kind)
	if err != nil {
		return 0, false, fmt.Errorf("read etl context of idempotency key %q: %w", c.IdempotencyKey, err)
	}
	if kind != c.Kind {
		return 0, false, fmt.Errorf("%w: %q is the key of etl context %d, of kind %s", ErrIdempotencyKeyOtherKind, c.IdempotencyKey, id, kind)
	}
	return id, false, nil
}

// The lock of a context is the advisory lock (LockNamespace, id): every task
// process holds it for as long as it lives, whatever its lock mode (row mode
// also locks the INITIAL event row FOR UPDATE, in the same transaction), and
// whoever judges or changes a context that may be running (a supervisor's
// step, `dama cancel`) takes it first. A held lock is visible in pg_locks,
// which is how the view and the supervisors see, without trying it, which
// tasks run. Trying it never fails with an error, so nothing fills the
// server's log while tasks run.

// Lock takes the lock of context id for the rest of tx, without waiting,
// and returns the context as it stands once the lock is held. It returns
// ErrLocked when a task process (or, for a moment, a supervisor) holds it.
func Lock(ctx context.Context, tx pgx.Tx, id int64) (*Context, error) {
	ok, err := tryXactLock(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("lock etl context %d: %w", id, ErrLocked)
	}
	// Read once the lock is held: a task process that released it just
	// before has committed everything it wrote.
	return Get(ctx, tx, id)
}

// LockRow takes, for the rest of tx, the lock of context id and then its
// INITIAL event row FOR UPDATE: the lock of a row-mode task process, held
// in a transaction left open for the task's life. It returns ErrLocked when
// another process holds either.
//
// byKey says that tx's session holds its run's key (RunKeySetting): the
// row is then locked through data_manager.lock_initial_event (migration
// 19), the only way for a member of dama_task, which may lock no other row
// of event_store, when the role may call it. Otherwise it is locked
// directly, as a task process launched by an earlier release, which sets
// no key, does on a schema not yet migrated.
//
// What tx keeps locked for the task's life is part of the contract between
// releases (README "Releases and upgrades"): the advisory lock, the row,
// and so event_store and its indexes (ROW SHARE), but nothing
// of etl_contexts, so that a later release's migration may add a column to
// etl_contexts while this task runs.
func LockRow(ctx context.Context, tx pgx.Tx, id int64, byKey bool) (*Context, error) {
	ok, err := tryXactLock(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("lock etl context %d: %w", id, ErrLocked)
	}
	// Found by event_store's own index, without reading etl_contexts: the
	// function reads it in a subtransaction rolled back. Whoever locks the
	// row holds the advisory lock first, so NOWAIT does not fail here
	// unless something outside dama locks the row.
	lockSQL := `SELECT event_id FROM data_manager.event_store
		 WHERE etl_context_id = $1 AND type LIKE '%:INITIAL'
		   FOR UPDATE NOWAIT`
	if byKey {
		// A role that may not call the function (one of an earlier setup's,
		// with rights of its own on event_store) locks directly, as may the
		// one on a schema not yet migrated.
		var may bool
		if err := tx.QueryRow(ctx, `
			SELECT coalesce(has_function_privilege(to_regprocedure('data_manager.lock_initial_event(bigint)'), 'EXECUTE'), false)`).Scan(&may); err != nil {
			return nil, fmt.Errorf("lock initial event of etl context %d: %w", id, err)
		}
		if may {
			lockSQL = `SELECT data_manager.lock_initial_event($1)`
		}
	}
	var eventID *int64
	err = tx.QueryRow(ctx, lockSQL, id).Scan(&eventID)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || err == nil && eventID == nil:
		return nil, fmt.Errorf("lock initial event of etl context %d: %w", id, ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("lock initial event of etl context %d: %w", id, classify(err))
	}
	// The context is read in a savepoint rolled back at once: the table
	// lock the read takes on etl_contexts goes with it, while the locks
	// taken before the savepoint stay.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("read etl context %d: %w", id, err)
	}
	c, err := Get(ctx, sp, id)
	if rerr := sp.Rollback(ctx); rerr != nil && err == nil {
		err = fmt.Errorf("read etl context %d: %w", id, rerr)
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// LockSession takes the lock of context id for the life of conn's session,
// with no transaction left open (advisory lock mode), and returns the
// context as it stands once the lock is held; ErrLocked when another
// process holds it. The lock lasts until UnlockSession or the session's end.
func LockSession(ctx context.Context, conn *pgx.Conn, id int64) (*Context, error) {
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2::int)`, LockNamespace, id).Scan(&ok); err != nil {
		return nil, fmt.Errorf("take session lock of etl context %d: %w", id, err)
	}
	if !ok {
		return nil, fmt.Errorf("take session lock of etl context %d: %w", id, ErrLocked)
	}
	c, err := Get(ctx, conn, id)
	if err != nil {
		return nil, errors.Join(err, UnlockSession(ctx, conn, id))
	}
	return c, nil
}

// UnlockSession releases the session lock LockSession took on conn.
func UnlockSession(ctx context.Context, conn *pgx.Conn, id int64) error {
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1, $2::int)`, LockNamespace, id); err != nil {
		return fmt.Errorf("release session lock of etl context %d: %w", id, err)
	}
	return nil
}

func tryXactLock(ctx context.Context, tx pgx.Tx, id int64) (bool, error) {
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1, $2::int)`, LockNamespace, id).Scan(&ok); err != nil {
		return false, fmt.Errorf("take lock of etl context %d: %w", id, err)
	}
	return ok, nil
}

// HeldLocks is a query, usable as a CTE, of the ids of the contexts whose
// lock is held in the current database, read from pg_locks: reading takes
// no lock and fails nothing.
const HeldLocks = `SELECT l.objid::bigint AS etl_context_id
	  FROM pg_catalog.pg_locks AS l
	 WHERE l.locktype = 'advisory'
	   AND l.granted
	   AND l.classid = 1684106593::oid
	   AND l.objsubid = 2
	   AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())`

// Event is a row of data_manager.event_store.
type Event struct {
	ID        int64           `json:"event_id"`
	ContextID int64           `json:"etl_context_id"`
	Type      string          `json:"type"`
	Payload   json.RawMessage `json:"payload"`
	Meta      json.RawMessage `json:"meta"`
	Error     bool            `json:"error"`
	Attempt   int             `json:"attempt"`
	RunID     *string         `json:"run_id"`
	CreatedAt time.Time       `json:"created_at"`
}

// NewEvent is an event to append to a context.
type NewEvent struct {
	ContextID int64
	// Type is the full type, <kind>:<SUFFIX>.
	Type    string
	Payload any
	Meta    any
	Error   bool
	// RunID is the current attempt's run id; nil only for a context that has
	// never started.
	RunID *string
	// Seq, when set, numbers the event within its run: an event appended
	// again with the same run id and Seq (a write retried after a lost
	// connection) is stored once.
	Seq *int
}

// Append writes an event and returns its id. The database derives the
// context's status from it and refuses it with ErrFinished or ErrStaleRun.
func Append(ctx context.Context, db DB, e NewEvent) (int64, error) {
	// Cleaned here too, whoever the caller: no bytes may make a write fail.
	payload, _, err := cleanPayload(e.Payload)
	if err != nil {
		return 0, fmt.Errorf("encode payload of %s event: %w", e.Type, err)
	}
	meta, _, err := cleanPayload(e.Meta)
	if err != nil {
		return 0, fmt.Errorf("encode meta of %s event: %w", e.Type, err)
	}
	var id int64
	err = db.QueryRow(ctx, `
		WITH ins AS (
			INSERT INTO data_manager.event_store (etl_context_id, type, payload, meta, error, run_id, seq)
			VALUES ($1, $2, $3, $4, $5, $6::uuid, $7)
			ON CONFLICT (etl_context_id, run_id, seq) WHERE seq IS NOT NULL DO NOTHING
			RETURNING event_id)
		SELECT event_id FROM ins
		UNION ALL
		SELECT event_id FROM data_manager.event_store
		 WHERE $7::int IS NOT NULL AND etl_context_id = $1 AND run_id = $6::uuid AND seq = $7
		 LIMIT 1`, e.ContextID, e.Type, payload, meta, e.Error, e.RunID, e.Seq).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("append %s event to etl context %d: %w", e.Type, e.ContextID, classify(err))
	}
	return id, nil
}

// AppendEvents writes events of one context and run in one statement, in
// order: as Append, one round trip for many. The first event's context and
// run id stand for all. An event the database refuses fails them all.
func AppendEvents(ctx context.Context, db DB, events []NewEvent) error {
	if len(events) == 0 {
		return nil
	}
	types := make([]string, len(events))
	payloads := make([]*string, len(events))
	metas := make([]*string, len(events))
	errs := make([]bool, len(events))
	seqs := make([]*int32, len(events))
	for i, e := range events {
		payload, _, err := cleanPayload(e.Payload)
		if err != nil {
			return fmt.Errorf("encode payload of %s event: %w", e.Type, err)
		}
		meta, _, err := cleanPayload(e.Meta)
		if err != nil {
			return fmt.Errorf("encode meta of %s event: %w", e.Type, err)
		}
		types[i], errs[i] = e.Type, e.Error
		if payload != nil {
			p := string(payload)
			payloads[i] = &p
		}
		if meta != nil {
			m := string(meta)
			metas[i] = &m
		}
		if e.Seq != nil {
			s := int32(*e.Seq)
			seqs[i] = &s
		}
	}
	first := events[0]
	_, err := db.Exec(ctx, `
		INSERT INTO data_manager.event_store (etl_context_id, type, payload, meta, error, run_id, seq)
		SELECT $1, e.type, e.payload::jsonb, e.meta::jsonb, e.error, $2::uuid, e.seq
		  FROM unnest($3::text[], $4::text[], $5::text[], $6::boolean[], $7::int[])
		       WITH ORDINALITY AS e(type, payload, meta, error, seq, n)
		 ORDER BY e.n
		ON CONFLICT (etl_context_id, run_id, seq) WHERE seq IS NOT NULL DO NOTHING`,
		first.ContextID, first.RunID, types, payloads, metas, errs, seqs)
	if err != nil {
		return fmt.Errorf("append %d events to etl context %d: %w", len(events), first.ContextID, classify(err))
	}
	return nil
}

func marshalNullable(v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		if len(v) == 0 {
			return nil, nil
		}
		return v, nil
	}
	return json.Marshal(v)
}

// Events returns the events of context id in the order they were written.
func Events(ctx context.Context, db DB, id int64) ([]Event, error) {
	rows, err := db.Query(ctx, `
		SELECT event_id, etl_context_id, type, payload, meta, error, attempt, run_id::text, created_at
		  FROM data_manager.event_store
		 WHERE etl_context_id = $1
		 ORDER BY event_id`, id)
	if err != nil {
		return nil, fmt.Errorf("read events of etl context %d: %w", id, err)
	}
	return collectEvents(rows, id)
}

// TruncatedKey marks a JSON value read cut short: in its place stands
// {"dama_truncated": {"bytes": <its size as text>, "head": "<its first
// characters>"}}.
const TruncatedKey = "dama_truncated"

// boundedJSON is SQL that reads the jsonb expression expr as itself when its
// text is at most the parameter limit long, and else as the TruncatedKey
// marker holding its size and its first limit characters.
func boundedJSON(expr, limit string) string {
	return fmt.Sprintf(`CASE WHEN %[1]s IS NULL OR %[2]s <= 0 OR octet_length(%[1]s::text) <= %[2]s THEN %[1]s
		ELSE jsonb_build_object('%[3]s', jsonb_build_object('bytes', octet_length(%[1]s::text), 'head', left(%[1]s::text, %[2]s))) END`,
		expr, limit, TruncatedKey)
}

// RecentEvents returns the newest limit events of context id, oldest first,
// each payload and meta read up to maxPayload bytes (0: whole; see
// TruncatedKey).
func RecentEvents(ctx context.Context, db DB, id int64, limit, maxPayload int) ([]Event, error) {
	rows, err := db.Query(ctx, `
		SELECT * FROM (
			SELECT event_id, etl_context_id, type, `+boundedJSON("payload", "$3::int")+`, `+boundedJSON("meta", "$3::int")+`,
			       error, attempt, run_id::text, created_at
			  FROM data_manager.event_store
			 WHERE etl_context_id = $1
			 ORDER BY event_id DESC
			 LIMIT $2) AS e
		 ORDER BY event_id`, id, limit, maxPayload)
	if err != nil {
		return nil, fmt.Errorf("read events of etl context %d: %w", id, err)
	}
	return collectEvents(rows, id)
}

// EventOf returns event eventID of context id, its payload and meta each
// read up to maxPayload bytes (0: whole; see TruncatedKey).
func EventOf(ctx context.Context, db DB, id, eventID int64, maxPayload int) (Event, error) {
	rows, err := db.Query(ctx, `
		SELECT event_id, etl_context_id, type, `+boundedJSON("payload", "$3::int")+`, `+boundedJSON("meta", "$3::int")+`,
		       error, attempt, run_id::text, created_at
		  FROM data_manager.event_store
		 WHERE etl_context_id = $1 AND event_id = $2`, id, eventID, maxPayload)
	if err != nil {
		return Event{}, fmt.Errorf("read event %d of etl context %d: %w", eventID, id, err)
	}
	events, err := collectEvents(rows, id)
	if err != nil {
		return Event{}, err
	}
	if len(events) == 0 {
		return Event{}, fmt.Errorf("event %d of etl context %d: %w", eventID, id, ErrNotFound)
	}
	return events[0], nil
}

func collectEvents(rows pgx.Rows, id int64) ([]Event, error) {
	events, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) {
		var e Event
		err := row.Scan(&e.ID, &e.ContextID, &e.Type, &e.Payload, &e.Meta, &e.Error, &e.Attempt, &e.RunID, &e.CreatedAt)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("read events of etl context %d: %w", id, err)
	}
	return events, nil
}

// LatestPayload returns the payload of the newest event of context id with
// the given suffix (CHECKPOINT, PROGRESS, ...), or nil when there is none.
func LatestPayload(ctx context.Context, db DB, id int64, suffix string) (json.RawMessage, error) {
	var payload json.RawMessage
	err := db.QueryRow(ctx, `
		SELECT e.payload
		  FROM data_manager.event_store AS e
		  JOIN data_manager.etl_contexts AS c USING (etl_context_id)
		 WHERE e.etl_context_id = $1 AND e.type = c.kind || ':' || $2
		 ORDER BY e.event_id DESC
		 LIMIT 1`, id, suffix).Scan(&payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read latest %s of etl context %d: %w", suffix, id, err)
	}
	return payload, nil
}

// Payloads returns, in one round trip, the task's arguments (the INITIAL
// event's payload) and its latest CHECKPOINT payload (nil when there is
// none).
func Payloads(ctx context.Context, db DB, id int64) (args, checkpoint json.RawMessage, err error) {
	err = db.QueryRow(ctx, `
		SELECT i.payload,
		       (SELECT e.payload FROM data_manager.event_store AS e
		         WHERE e.etl_context_id = c.etl_context_id AND e.type = c.kind || ':' || $2
		         ORDER BY e.event_id DESC LIMIT 1)
		  FROM data_manager.etl_contexts AS c
		  JOIN data_manager.event_store AS i ON i.event_id = c.initial_event_id
		 WHERE c.etl_context_id = $1`, id, EventCheckpoint).Scan(&args, &checkpoint)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, fmt.Errorf("read arguments of etl context %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read arguments and checkpoint of etl context %d: %w", id, err)
	}
	return args, checkpoint, nil
}

// classify maps the SQLSTATEs of dama's guards and of NOWAIT to this
// package's sentinel errors, keeping the database's message.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "55P03": // lock_not_available
		return fmt.Errorf("%w: %s", ErrLocked, pgErr.Message)
	case "DMFIN":
		return fmt.Errorf("%w: %s", ErrFinished, pgErr.Message)
	case "DMRUN":
		return fmt.Errorf("%w: %s", ErrStaleRun, pgErr.Message)
	}
	return err
}
