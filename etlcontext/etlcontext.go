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
//
// Its functions are dama's own door to the tables, for the supervisor, the
// task process and the dama command; a program uses package dama's Client,
// whose checks come first, and the database's roles and triggers hold
// against anyone else. Its statements follow dama's schema and River's,
// release by release, with no promise of compatibility.
package etlcontext

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dama-etl/dama/protocol"
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

// The statuses as SQL literals, for the statements that name them: written
// into the statement rather than passed as parameters, so that the planner
// matches the partial indexes whose predicates name them.
const (
	sqlQueued    = "'" + string(StatusQueued) + "'"
	sqlRunning   = "'" + string(StatusRunning) + "'"
	sqlRetrying  = "'" + string(StatusRetrying) + "'"
	sqlDone      = "'" + string(StatusDone) + "'"
	sqlFailed    = "'" + string(StatusFailed) + "'"
	sqlCancelled = "'" + string(StatusCancelled) + "'"
	// For IN: the final statuses, and those of a task that waits to run.
	sqlFinished = "(" + sqlDone + ", " + sqlFailed + ", " + sqlCancelled + ")"
	sqlDue      = "(" + sqlQueued + ", " + sqlRetrying + ")"
)

// Finished reports whether s is final: a finished context never runs again.
func (s Status) Finished() bool {
	return s == StatusDone || s == StatusFailed || s == StatusCancelled
}

// dama's advisory locks, all two-int keys (namespace, key), one namespace
// per kind of lock so that no two ever collide; a task process's is
// protocol.LockNamespace.
const (
	// queueLockNamespace, kindLockNamespace and keyLockNamespace make a
	// start race-free across supervisors (StartIfFree, hold); migration
	// 38's start_attempt spells them out.
	queueLockNamespace = protocol.LockNamespace + 1
	// ClientLockNamespace keys the session lock each supervisor holds for
	// its life, by its River client id's hash (supervisor/liveness.go).
	ClientLockNamespace = protocol.LockNamespace + 2
	kindLockNamespace   = protocol.LockNamespace + 4
	keyLockNamespace    = protocol.LockNamespace + 5
	// scheduleLockNamespace, by hashtext(kind), serializes the taking of
	// a periodic kind's ticks (LockSchedule).
	scheduleLockNamespace = protocol.LockNamespace + 6
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
	ErrNotFound = errors.New("task not found")
	// ErrLocked: another transaction holds the context's INITIAL event lock.
	ErrLocked = errors.New("task is locked by a running task")
	// ErrFinished: the context is finished and takes no more writes.
	ErrFinished = errors.New("task is finished")
	// ErrStaleRun: the write came from an attempt that is no longer current.
	ErrStaleRun = errors.New("write from an attempt that is no longer current")
)

// DB is what this package needs of a pgx connection, pool or transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Context is a row of data_manager.etl_contexts, its fields in the order of
// contextColumns.
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
	// DueAt is when the task may first start; WaitingFor and WaitingSince
	// why and since when a due task waits (WaitNone once it starts).
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

// Get reads context id.
func Get(ctx context.Context, db DB, id int64) (*Context, error) {
	c, err := collectOne[Context](ctx, db, `SELECT `+contextColumns+` FROM data_manager.etl_contexts AS c WHERE c.etl_context_id = $1`, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("task %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read task %d: %w", id, err)
	}
	return &c, nil
}

// collect runs query and returns its rows, each scanned into the exported
// fields of a T: the columns follow the fields' order.
func collect[T any](ctx context.Context, db DB, query string, args ...any) ([]T, error) {
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[T])
}

// collectOne is collect for the first row: pgx.ErrNoRows when there is none.
func collectOne[T any](ctx context.Context, db DB, query string, args ...any) (T, error) {
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		var zero T
		return zero, err
	}
	return pgx.CollectOneRow(rows, pgx.RowToStructByPos[T])
}

// orNull is v, or nil (SQL's NULL) when v is its type's zero value.
func orNull[T comparable](v T) any {
	var zero T
	if v == zero {
		return nil
	}
	return v
}

// ErrIdempotencyKeyOtherKind is returned by CreateTask for an idempotency
// key that a context of another kind holds: answering with another kind's
// task would hand the caller a task it did not ask for.
var ErrIdempotencyKeyOtherKind = errors.New("idempotency key belongs to a task of another kind")

// ErrRefused is returned for a submission the database refuses as it is
// (data_manager.create_task's checks, SQLSTATE DMARG): arguments too long,
// without the kind's concurrency key, an unknown parent or queue.
var ErrRefused = errors.New("submission refused")

// ErrUnpublishedKind is returned by data_manager.submit for a kind no
// supervisor has published in data_manager.kinds (SQLSTATE DMKND).
var ErrUnpublishedKind = errors.New("kind not published")

// NewTask is a task to make: CreateTask makes its context (QUEUED), its
// INITIAL event holding Args, and its River job.
type NewTask struct {
	Kind string
	// Args are the task's arguments, a JSON value as CleanJSON accepts it;
	// empty means {}.
	Args        json.RawMessage
	Queue       string
	MaxAttempts int
	// IdempotencyKey, when not empty, makes CreateTask return the context
	// that holds it, if any, instead of making a task.
	IdempotencyKey string
	// ParentID, when not 0, makes the task a child of that one.
	ParentID int64
	// ConcurrencyField is the kind's concurrency_key: the field of Args
	// that holds the task's concurrency key.
	ConcurrencyField string
	// RunAt delays the first start until then; zero or past means now.
	RunAt time.Time
}

// CreateTask makes task t with data_manager.create_task (migration 24),
// which every submission goes through, dama's and SQL's alike, and returns
// its context's id; created is false when t's idempotency key was taken
// already, and id is then the context holding it, which must be of t's kind
// (ErrIdempotencyKeyOtherKind otherwise).
func CreateTask(ctx context.Context, db DB, t NewTask) (id int64, created bool, err error) {
	var runAt any
	if !t.RunAt.IsZero() {
		runAt = t.RunAt
	}
	err = db.QueryRow(ctx, `SELECT etl_context_id, created FROM data_manager.create_task($1, $2, $3, $4, $5, $6, $7, $8)`,
		t.Kind, cmp.Or(string(t.Args), "{}"), orNull(t.IdempotencyKey), t.Queue, t.MaxAttempts, orNull(t.ConcurrencyField), runAt,
		orNull(t.ParentID)).Scan(&id, &created)
	if err != nil {
		return 0, false, classify(err)
	}
	return id, created, nil
}

// refusal is a submission the database refused, said as it says it: the
// sentinel is for errors.Is only.
type refusal struct {
	msg string
	is  error
}

func (r refusal) Error() string        { return r.msg }
func (r refusal) Is(target error) bool { return target == r.is }

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
	case "DMPRO":
		return fmt.Errorf("%w: %s", ErrProtocolRefused, pgErr.Message)
	case "DMNOT":
		return fmt.Errorf("%w: %s", ErrNotFound, pgErr.Message)
	case "DMKEY":
		return fmt.Errorf("%w: %s", ErrIdempotencyKeyOtherKind, strings.TrimPrefix(pgErr.Message, ErrIdempotencyKeyOtherKind.Error()+": "))
	case "DMKND":
		return refusal{pgErr.Message, ErrUnpublishedKind}
	case "DMARG":
		return refusal{pgErr.Message, ErrRefused}
	}
	return err
}
