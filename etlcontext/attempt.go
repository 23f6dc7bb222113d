package etlcontext

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/protocol"
)

// Runner is what a task process records about itself once it holds the
// lock: where it runs and how to tell it from any other process.
type Runner struct {
	Host        string
	HostID      string
	PID         int
	StartedAt   *time.Time
	StartTicks  uint64
	LogPath     string
	FenceWindow time.Duration
	// LockMode is how the task process holds its lock: "row" or "advisory".
	LockMode string
	// Release and Protocol are its release of dama and protocol.Version.
	Release  string
	Protocol int
}

// Recorded is what RecordRunner read of the task it recorded.
type Recorded struct {
	CancelRequested bool
	// Args and Checkpoint are as Payloads reads them.
	Args, Checkpoint json.RawMessage
}

// RecordRunner records the task process of run runID on context id and
// returns, in the same round trip, the task's arguments and whether it was
// cancelled in the meantime; ErrStaleRun when the run is no longer current,
// another task process is recorded, or the context has no INITIAL event.
// The same task process may record itself again until its command is
// recorded: a write whose reply was lost with its connection is made again.
func RecordRunner(ctx context.Context, db DB, id int64, runID string, r Runner) (Recorded, error) {
	var rec Recorded
	err := db.QueryRow(ctx, recordRunnerSQL,
		id, runID, r.Host, r.PID, r.StartedAt, r.LogPath, r.HostID, int64(r.StartTicks), r.FenceWindow, r.LockMode, r.Release, r.Protocol,
		protocol.EventCheckpoint, nil).Scan(&rec.CancelRequested, &rec.Args, &rec.Checkpoint)
	if errors.Is(err, pgx.ErrNoRows) {
		return Recorded{}, fmt.Errorf("record task process of task %d: %w", id, ErrStaleRun)
	}
	if err != nil {
		return Recorded{}, fmt.Errorf("record task process of task %d: %w", id, err)
	}
	return rec, nil
}

// recordRunnerSQL sets the run's key itself (keyedBy).
var recordRunnerSQL = keyedBy(14, `
		UPDATE data_manager.etl_contexts AS c
		   SET host = $3, pid = $4, process_started_at = $5, heartbeat_at = now(), log_path = $6,
		       host_id = $7, runner_start_ticks = $8, fence_window = $9, lock_lost_at = NULL, lock_mode = $10,
		       runner_release = $11, runner_protocol = $12
		  FROM k
		 WHERE c.etl_context_id = $1 AND c.run_id = $2::uuid AND c.etl_status = `+sqlRunning+`
		   AND (c.pid IS NULL OR (c.pid = $4 AND c.runner_start_ticks = $8 AND c.host_id IS NOT DISTINCT FROM $7 AND c.command_pgid IS NULL))
		   AND c.initial_event_id IS NOT NULL
		RETURNING c.cancel_requested_at IS NOT NULL, `+payloads("$13"))

// noRunner is the assignment that forgets what RecordRunner recorded.
const noRunner = `host = NULL, pid = NULL, process_started_at = NULL, heartbeat_at = NULL, host_id = NULL,
		       runner_start_ticks = NULL, fence_window = NULL, lock_lost_at = NULL, lock_mode = NULL,
		       runner_release = NULL, runner_protocol = NULL`

// WithdrawRunner takes back what RecordRunner recorded for run runID of
// context id, whose task process pid was told to stop before it started its
// command: the context is again a launch with no task process, which a
// supervisor takes back without spending an attempt. It fails with
// ErrStaleRun when the run is no longer current, or its command was
// recorded.
func WithdrawRunner(ctx context.Context, db DB, id int64, runID string, pid int) error {
	// The database deletes the attempt begun (etl_attempts_withdrawn).
	tag, err := db.Exec(ctx, `
		UPDATE data_manager.etl_contexts SET `+noRunner+`
		 WHERE etl_context_id = $1 AND run_id = $2::uuid AND etl_status = `+sqlRunning+`
		   AND pid = $3 AND command_pgid IS NULL`, id, runID, pid)
	if err != nil {
		return fmt.Errorf("withdraw task process of task %d: %w", id, classify(err))
	}
	if tag.RowsAffected() == 0 {
		// Withdrawn already, by this call made again after its reply was
		// lost, or the run is over.
		var withdrawn bool
		err := db.QueryRow(ctx, `
			SELECT pid IS NULL FROM data_manager.etl_contexts
			 WHERE etl_context_id = $1 AND run_id = $2::uuid AND etl_status = `+sqlRunning, id, runID).Scan(&withdrawn)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("withdraw task process of task %d: %w", id, err)
		}
		if !withdrawn {
			return fmt.Errorf("withdraw task process of task %d: %w", id, ErrStaleRun)
		}
	}
	return nil
}

// RecordCommand records the command's process group, so that a supervisor
// on the same host can find the command's descendants after the task
// process died. startTicks 0 means unknown.
func RecordCommand(ctx context.Context, db DB, id int64, runID string, pgid int, startTicks uint64) error {
	tag, err := db.Exec(ctx, recordCommandSQL, id, runID, pgid, orNull(int64(startTicks)), nil)
	if err != nil {
		return fmt.Errorf("record command of task %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("record command of task %d: %w", id, ErrStaleRun)
	}
	return nil
}

// recordCommandSQL sets the run's key itself (keyedBy).
var recordCommandSQL = keyedBy(5, `
		UPDATE data_manager.etl_contexts SET command_pgid = $3, command_start_ticks = $4
		  FROM k
		 WHERE etl_context_id = $1 AND run_id = $2::uuid AND etl_status = `+sqlRunning)

// updateRun makes the assignment set, its parameters from $3 on, on context
// id while run runID is its running one, and fails with ErrStaleRun when it
// is not; what names it in errors.
func updateRun(ctx context.Context, db DB, what string, id int64, runID, set string, args ...any) error {
	tag, err := db.Exec(ctx, `
		UPDATE data_manager.etl_contexts SET `+set+`
		 WHERE etl_context_id = $1 AND run_id = $2::uuid AND etl_status = `+sqlRunning,
		append([]any{id, runID}, args...)...)
	if err != nil {
		return fmt.Errorf("%s of task %d: %w", what, id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s of task %d: %w", what, id, ErrStaleRun)
	}
	return nil
}

// RequestCancel marks context id for cancellation (what its task process
// reads when it reconnects), if it is not finished, and records a
// CANCEL_REQUESTED event naming by; it returns the context's status. The
// caller announces the request to the task process in the same
// transaction: both or neither.
func RequestCancel(ctx context.Context, tx pgx.Tx, id int64, by string) (Status, error) {
	by, err := WithRole(ctx, tx, by)
	if err != nil {
		return "", err
	}
	var (
		status Status
		kind   string
		runID  *string
	)
	// The row lock taken here keeps the run from changing before the event
	// is written with its run id.
	err = tx.QueryRow(ctx, `
		UPDATE data_manager.etl_contexts SET cancel_requested_at = coalesce(cancel_requested_at, now())
		 WHERE etl_context_id = $1 AND NOT data_manager.is_finished(etl_status)
		RETURNING etl_status, kind, run_id::text`, id).Scan(&status, &kind, &runID)
	if errors.Is(err, pgx.ErrNoRows) {
		err = tx.QueryRow(ctx, `SELECT etl_status FROM data_manager.etl_contexts WHERE etl_context_id = $1`, id).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", fmt.Errorf("request cancellation of task %d: %w", id, ErrNotFound)
		}
	}
	if err != nil {
		return "", fmt.Errorf("request cancellation of task %d: %w", id, err)
	}
	if status.Finished() {
		return status, nil
	}
	_, err = Append(ctx, tx, NewEvent{
		ContextID: id,
		Type:      protocol.EventType(kind, protocol.EventCancelRequested),
		Payload:   map[string]any{"by": by},
		RunID:     runID,
	})
	return status, err
}

// CancelRequested reports whether run runID was asked to stop; ErrStaleRun
// means the run is no longer current. A task process asks after it
// reconnected, for a cancellation announced while it was away.
func CancelRequested(ctx context.Context, db DB, id int64, runID string) (bool, error) {
	var (
		requested, current bool
		status, run        string
	)
	// What is current when this run is not, for the runner's log.
	err := db.QueryRow(ctx, `
		SELECT cancel_requested_at IS NOT NULL, coalesce(run_id = $2::uuid AND etl_status = `+sqlRunning+`, false),
		       etl_status, coalesce(run_id::text, 'none')
		  FROM data_manager.etl_contexts WHERE etl_context_id = $1`, id, runID).Scan(&requested, &current, &status, &run)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("read cancellation of task %d: it no longer exists: %w", id, ErrStaleRun)
	}
	if err != nil {
		return false, fmt.Errorf("read cancellation of task %d: %w", id, err)
	}
	if !current {
		return false, fmt.Errorf("read cancellation of task %d, %s under run %s: %w", id, status, run, ErrStaleRun)
	}
	return requested, nil
}

// ClearLockLost forgets when a supervisor found the lock of run runID free:
// the task process holds it again. Until this is recorded, a supervisor
// times the fencing window from its first sight of the free lock, so a task
// process counts itself unlocked until it has cleared the mark.
func ClearLockLost(ctx context.Context, db DB, id int64, runID string) error {
	return updateRun(ctx, db, "clear lock loss", id, runID, `lock_lost_at = NULL, heartbeat_at = now()`)
}

// MarkLockLost records, unless already recorded, that the lock of context
// id's current run was found free, and returns when that was first
// recorded, on the database's clock: for display, never for timing, as a
// clock of the database's may jump. The caller holds the lock.
func MarkLockLost(ctx context.Context, db DB, id int64) (mark time.Time, err error) {
	err = db.QueryRow(ctx, `
		UPDATE data_manager.etl_contexts SET lock_lost_at = coalesce(lock_lost_at, clock_timestamp())
		 WHERE etl_context_id = $1
		RETURNING lock_lost_at`, id).Scan(&mark)
	if err != nil {
		return time.Time{}, fmt.Errorf("record lock loss of task %d: %w", id, err)
	}
	return mark, nil
}

// Loss is a task's lock found free, and the mark of that loss
// (MarkLockLost).
type Loss struct {
	ID   int64
	Mark time.Time
}

// MarkLocksLost returns the marks of the losses of those of ids that are
// RUNNING with a task process recorded (it took its lock), marking, as
// MarkLockLost does, those whose lock it finds free by taking it for the
// statement: so that a supervisor may time a loss before any step of the
// task. A lock found free in pg_locks would not do: a task process that
// took it again since, with no mark to clear, would keep the mark of a loss
// it never had. A mark found is one the task process has not cleared, and
// so counts itself unlocked for. A task whose row another transaction
// holds is left for the next look: the watch waits on nobody.
func MarkLocksLost(ctx context.Context, db DB, ids []int64) ([]Loss, error) {
	// The CASE keeps the lock to the tasks asked about, whatever order the
	// planner gives the conditions.
	lost, err := collect[Loss](ctx, db, `
		WITH free AS (
			SELECT c.etl_context_id FROM data_manager.etl_contexts AS c
			 WHERE c.etl_context_id = ANY($1) AND c.etl_status = `+sqlRunning+`
			   AND c.pid IS NOT NULL AND c.lock_lost_at IS NULL
			   FOR NO KEY UPDATE SKIP LOCKED),
		marked AS (
			UPDATE data_manager.etl_contexts AS c SET lock_lost_at = clock_timestamp()
			  FROM free
			 WHERE c.etl_context_id = free.etl_context_id
			   AND CASE WHEN c.etl_context_id = ANY($1) THEN pg_try_advisory_xact_lock($2, c.etl_context_id::int) END
			RETURNING c.etl_context_id, c.lock_lost_at)
		SELECT * FROM marked
		UNION ALL
		SELECT c.etl_context_id, c.lock_lost_at FROM data_manager.etl_contexts AS c
		 WHERE c.etl_context_id = ANY($1) AND c.etl_status = `+sqlRunning+` AND c.lock_lost_at IS NOT NULL`, ids, protocol.LockNamespace)
	if err != nil {
		return nil, fmt.Errorf("record lock loss of %d tasks: %w", len(ids), err)
	}
	return lost, nil
}

// Run is a launch StartIfFree prepared.
type Run struct {
	// ID is the run id, which the task process's events carry.
	ID string
	// Key opens the run's rows to its task process (RunKeySetting): only
	// the task process launched learns it. The context keeps its SHA-256.
	Key     string
	Attempt int
}

// RunKeySetting is the session setting in which a task process holds its
// run's key: a member of dama_task may write only the rows of the run whose
// key its session holds (migration 19).
const RunKeySetting = "dama.run_key"

// newRunKey returns a new run's key (32 random bytes, in hex) and its
// SHA-256, which the context keeps.
func newRunKey() (key string, hash []byte) {
	secret := make([]byte, 32)
	rand.Read(secret) // never fails: crypto/rand crashes the program instead
	key = hex.EncodeToString(secret)
	sum := sha256.Sum256([]byte(key))
	return key, sum[:]
}

// AbandonLaunch takes back the launch of c, RUNNING but without a recorded
// task process (none ever started its command): the context returns to the
// status it had, with its attempt number, so that the failed launch spends
// no attempt, and, before its first attempt, no start. The caller holds
// the lock.
func AbandonLaunch(ctx context.Context, db DB, c *Context) error {
	status := StatusRetrying
	if c.Attempt <= 1 {
		status = StatusQueued
	}
	tag, err := db.Exec(ctx, `
		UPDATE data_manager.etl_contexts
		   SET etl_status = $3, attempt = attempt - 1, started_at = CASE WHEN attempt > 1 THEN started_at END
		 WHERE etl_context_id = $1 AND run_id = $2::uuid AND etl_status = `+sqlRunning+` AND pid IS NULL`,
		c.ID, c.RunID, status)
	if err != nil {
		return fmt.Errorf("abandon launch of task %d: %w", c.ID, classify(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("abandon launch of task %d: %w", c.ID, ErrStaleRun)
	}
	return nil
}

// Reopen makes c, FAILED or CANCELLED, QUEUED again for a new attempt
// (`dama retry`), allowing it attempts up to maxAttempts in all: its
// RETRIED event, naming by, makes the database reopen it, keeping its
// attempt number, run id and checkpoints. The caller holds the lock.
func Reopen(ctx context.Context, db DB, c *Context, maxAttempts int, by string) error {
	if c.Status != StatusFailed && c.Status != StatusCancelled {
		return fmt.Errorf("task %d is %s: only a FAILED or CANCELLED task can be retried", c.ID, c.Status)
	}
	by, err := WithRole(ctx, db, by)
	if err != nil {
		return err
	}
	_, err = Append(ctx, db, NewEvent{
		ContextID: c.ID,
		Type:      protocol.EventType(c.Kind, protocol.EventRetried),
		Payload:   map[string]any{"by": by, "previous_status": c.Status, "max_attempts": maxAttempts},
		RunID:     c.RunID,
	})
	return err
}

// Attempt is a row of data_manager.etl_attempts, with how it ended.
type Attempt struct {
	Attempt   int        `json:"attempt"`
	RunID     string     `json:"run_id"`
	Host      *string    `json:"host"`
	PID       *int       `json:"pid"`
	LockMode  *string    `json:"lock_mode"`
	Release   *string    `json:"runner_release"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at"`
	// Outcome is DONE, FAILED or CANCELLED; nil while the attempt runs.
	Outcome *string `json:"outcome"`
	// Reason, Exit, ExitCode and LogTail come from the event that ended
	// the attempt (its ERROR or CANCELLED), when it says; Reason is led by
	// how the command ended (Exit) when it is the command's words.
	Reason   *string `json:"reason"`
	Exit     *string `json:"exit"`
	ExitCode *int    `json:"exit_code"`
	LogTail  *string `json:"log_tail"`
	// What the attempt cost, from its control group; nil where it had
	// none (protocol.Usage).
	CPUSeconds  *float64 `json:"cpu_seconds"`
	PeakMemory  *int64   `json:"peak_memory_bytes"`
	ReadBytes   *int64   `json:"io_read_bytes"`
	WriteBytes  *int64   `json:"io_write_bytes"`
	MemoryLimit *int64   `json:"memory_limit_bytes"`
	OOMKilled   *bool    `json:"oom_killed"`
}

// RecentAttempts returns the newest limit attempts of context id (0: all),
// oldest first, each reason and log tail cut to maxText characters (0:
// whole).
func RecentAttempts(ctx context.Context, db DB, id int64, limit, maxText int) ([]Attempt, error) {
	attempts, err := collect[Attempt](ctx, db, `
		SELECT * FROM (
		SELECT a.attempt, a.run_id::text, a.host, a.pid, a.lock_mode, a.runner_release,
		       a.started_at, a.ended_at, a.outcome,
		       CASE WHEN $5 > 0 THEN left(e.payload->>'reason', $5) ELSE e.payload->>'reason' END,
		       left(e.payload->>'exit', 512),
		       -- A command may write its own ERROR, with anything in it; the
		       -- cast is nested, for SQL does not promise to evaluate AND's
		       -- operands in order.
		       CASE WHEN jsonb_typeof(e.payload->'exit_code') = 'number' THEN
		            CASE WHEN abs((e.payload->>'exit_code')::numeric) < 2147483648
		                 THEN (e.payload->>'exit_code')::numeric::int END END,
		       CASE WHEN $5 > 0 THEN right(e.payload->>'log_tail', $5) ELSE e.payload->>'log_tail' END,
		       a.cpu_seconds, a.peak_memory_bytes, a.io_read_bytes, a.io_write_bytes, a.memory_limit_bytes, a.oom_killed
		  FROM data_manager.etl_attempts AS a
		  JOIN data_manager.etl_contexts AS c USING (etl_context_id)
		  LEFT JOIN LATERAL (
			SELECT payload FROM data_manager.event_store AS e
			 WHERE e.etl_context_id = a.etl_context_id AND e.run_id = a.run_id
			   AND e.type IN (c.kind || ':' || $2, c.kind || ':' || $3)
			 ORDER BY e.event_id DESC
			 LIMIT 1) AS e ON true
		 WHERE a.etl_context_id = $1
		 ORDER BY a.started_at DESC, a.attempt DESC
		 LIMIT CASE WHEN $4 > 0 THEN $4 END) AS a
		 ORDER BY started_at, attempt`, id, protocol.EventError, protocol.EventCancelled, limit, maxText)
	if err != nil {
		return nil, fmt.Errorf("read attempts of task %d: %w", id, err)
	}
	for _, a := range attempts {
		if a.Reason != nil && a.Exit != nil {
			code := ""
			if a.ExitCode != nil {
				code = strconv.Itoa(*a.ExitCode)
			}
			*a.Reason = failedWith(*a.Reason, code, *a.Exit)
		}
	}
	return attempts, nil
}

// UnfitHostMeta is the meta key of the WARNING a task process writes when
// its host cannot run the task, holding the reason: a key a command's own
// lines cannot set, so that their WARNINGs are never taken for it.
const UnfitHostMeta = "unfit_host"

// UnfitPrefix opens the reason of an unfit host's WARNING.
const UnfitPrefix = "this host cannot run the task: "

// WarnedThisAttempt reports whether the current attempt of context id
// already has the WARNING of an unfit host (UnfitHostMeta) with this
// reason: a condition that every launch meets (a host that lacks the
// kind's executable) is reported once per attempt, not at every launch.
func WarnedThisAttempt(ctx context.Context, db DB, id int64, reason string) (bool, error) {
	var seen bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (
			SELECT 1
			  FROM data_manager.event_store AS e
			  JOIN data_manager.etl_contexts AS c ON c.etl_context_id = e.etl_context_id
			 WHERE e.etl_context_id = $1 AND e.type = c.kind || ':' || $3
			   AND e.attempt = c.attempt AND e.meta->>$4 = $2)`, id, reason, protocol.EventWarning, UnfitHostMeta).Scan(&seen)
	if err != nil {
		return false, fmt.Errorf("read the warnings of task %d: %w", id, err)
	}
	return seen, nil
}

// LatestUnfitHost returns the reason of the newest unfit-host WARNING
// (UnfitHostMeta) of attempt of context id, "" when there is none.
func LatestUnfitHost(ctx context.Context, db DB, id int64, attempt int) (string, error) {
	var reason string
	err := db.QueryRow(ctx, `
		SELECT coalesce(e.meta->>$4, '')
		  FROM data_manager.event_store AS e
		  JOIN data_manager.etl_contexts AS c ON c.etl_context_id = e.etl_context_id
		 WHERE e.etl_context_id = $1 AND e.attempt = $2 AND e.type = c.kind || ':' || $3
		   AND e.meta ? $4
		 ORDER BY e.event_id DESC LIMIT 1`, id, attempt, protocol.EventWarning, UnfitHostMeta).Scan(&reason)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("read the warnings of task %d: %w", id, err)
	}
	return reason, nil
}

// UnfitOn reports whether host said, in an unfit-host WARNING of attempt
// of context id, that it cannot run the task.
func UnfitOn(ctx context.Context, db DB, id int64, attempt int, host string) (bool, error) {
	var told bool
	err := db.QueryRow(ctx, `
		SELECT EXISTS (SELECT FROM data_manager.event_store AS e
		                 JOIN data_manager.etl_contexts AS c ON c.etl_context_id = e.etl_context_id
		                WHERE e.etl_context_id = $1 AND e.attempt = $2 AND e.type = c.kind || ':' || $3
		                  AND e.meta ? $4 AND e.payload->>'host' = $5)`,
		id, attempt, protocol.EventWarning, UnfitHostMeta, host).Scan(&told)
	if err != nil {
		return false, fmt.Errorf("read the warnings of task %d: %w", id, err)
	}
	return told, nil
}

// CancelRequestedNow reads whether a cancel of context id was requested,
// locking its row until the caller's transaction ends: a request cannot
// slip in between this answer and the outcome the caller records.
func CancelRequestedNow(ctx context.Context, tx pgx.Tx, id int64) (bool, error) {
	var requested bool
	if err := tx.QueryRow(ctx, `
		SELECT cancel_requested_at IS NOT NULL FROM data_manager.etl_contexts
		 WHERE etl_context_id = $1 FOR NO KEY UPDATE`, id).Scan(&requested); err != nil {
		return false, fmt.Errorf("read cancellation of task %d: %w", id, err)
	}
	return requested, nil
}

// WithRole names who acts: by, as the caller tells it (a user and host, or
// the name the status page was given), and the database role the caller's
// session logged in as, which the caller does not choose.
func WithRole(ctx context.Context, db DB, by string) (string, error) {
	var named string
	if err := db.QueryRow(ctx, `SELECT $1 || ' (database role ' || session_user || ')'`, by).Scan(&named); err != nil {
		return "", fmt.Errorf("read the database role: %w", err)
	}
	return named, nil
}

// RunSessions counts the sessions of the server, in any of its databases,
// whose application_name is name, those of run runID's command of context
// id (protocol.SessionName), and reports whether that run ended longer than
// bound ago (or has no recorded end). Any role reads another's
// application_name in pg_stat_activity (not its backend_type, nor when it
// started).
func RunSessions(ctx context.Context, db DB, id int64, runID, name string, bound time.Duration) (n int, overdue bool, err error) {
	if err := db.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE application_name = $3),
		       coalesce((SELECT a.ended_at < now() - $4::interval FROM data_manager.etl_attempts AS a
		                  WHERE a.etl_context_id = $1 AND a.run_id = $2), true)`,
		id, runID, name, bound).Scan(&n, &overdue); err != nil {
		return 0, false, fmt.Errorf("count the sessions of run %s of task %d: %w", runID, id, err)
	}
	return n, overdue, nil
}

// KindCost is what a kind's attempts that ended in the last 24 hours cost,
// where they had a control group (Attempt's cost).
type KindCost struct {
	Kind       string
	Attempts   int64
	CPUSeconds float64
	// In floating point: a sum of bigints may overflow one.
	PeakMemory float64
	ReadBytes  float64
	WriteBytes float64
	OOMKilled  int64
}

// KindCosts reads the cost of the attempts that ended in the last 24
// hours, by kind.
func KindCosts(ctx context.Context, db DB) ([]KindCost, error) {
	costs, err := collect[KindCost](ctx, db, `
		SELECT c.kind, count(*), coalesce(sum(a.cpu_seconds), 0), coalesce(max(a.peak_memory_bytes), 0)::float8,
		       coalesce(sum(a.io_read_bytes::float8), 0), coalesce(sum(a.io_write_bytes::float8), 0),
		       count(*) FILTER (WHERE a.oom_killed)
		  FROM data_manager.etl_attempts AS a
		  JOIN data_manager.etl_contexts AS c USING (etl_context_id)
		 WHERE a.ended_at > now() - interval '24 hours' AND a.cpu_seconds IS NOT NULL
		 GROUP BY c.kind
		 ORDER BY c.kind`)
	if err != nil {
		return nil, fmt.Errorf("read the cost of attempts: %w", err)
	}
	return costs, nil
}

// RecordAttemptCost records what attempt runID of context id cost, read
// by a supervisor from the control group of an attempt whose task process
// died before its outcome: the attempt's end, recorded later, keeps it.
func RecordAttemptCost(ctx context.Context, db DB, id int64, runID string, u protocol.Usage) error {
	_, err := db.Exec(ctx, `
		UPDATE data_manager.etl_attempts
		   SET cpu_seconds = $3, peak_memory_bytes = nullif($4, 0), io_read_bytes = $5, io_write_bytes = $6,
		       memory_limit_bytes = nullif($7, 0), oom_killed = $8
		 WHERE etl_context_id = $1 AND run_id = $2::uuid`,
		id, runID, u.CPUSeconds, u.PeakMemory, u.ReadBytes, u.WriteBytes, u.MemoryLimit, u.OOMKilled)
	if err != nil {
		return fmt.Errorf("record what attempt %s of task %d cost: %w", runID, id, err)
	}
	return nil
}

// RunningRuns returns those of runIDs (uuids) that are the current run of
// a running task.
func RunningRuns(ctx context.Context, db DB, runIDs []string) ([]string, error) {
	var live []string
	rows, err := db.Query(ctx, `
		SELECT run_id::text FROM data_manager.etl_contexts
		 WHERE run_id = ANY($1::uuid[]) AND etl_status = `+sqlRunning, runIDs)
	if err == nil {
		live, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		return nil, fmt.Errorf("read which runs are running: %w", err)
	}
	return live, nil
}
