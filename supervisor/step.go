package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/shirou/gopsutil/v3/process"

	"github.com/dama-etl/dama/etlcontext"
)

// queueLockNamespace keys the transaction-level advisory lock that makes the
// max_running check of a queue race-free across supervisors.
const queueLockNamespace = etlcontext.LockNamespace + 1

// step is one short, idempotent step of a context's state machine.
func (s *Supervisor) step(ctx context.Context, job *river.Job[TaskArgs], depth int) error {
	id := job.Args.ETLContextID
	logger := s.logger.With("etl_context_id", id, "job_id", job.ID, "job_attempt", job.Attempt)

	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return s.transient(logger, fmt.Errorf("begin step of etl context %d: %w", id, err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	c, err := etlcontext.LockInitial(ctx, tx, id)
	switch {
	case errors.Is(err, etlcontext.ErrLocked):
		// A live task process holds the lock, whoever started it: adopt it.
		return river.JobSnooze(s.cfg.PollInterval.D())
	case errors.Is(err, etlcontext.ErrNotFound):
		return river.JobCancel(err)
	case err != nil:
		return s.transient(logger, err)
	}

	switch c.Status {
	case etlcontext.StatusDone:
		// Completing in the step's own transaction settles the job now,
		// rather than at River's next batch of completions (up to 250ms).
		if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
			return s.transient(logger, fmt.Errorf("complete job of etl context %d: %w", id, err))
		}
		if err := tx.Commit(ctx); err != nil {
			return s.transient(logger, fmt.Errorf("commit completion of etl context %d: %w", id, err))
		}
		return nil
	case etlcontext.StatusCancelled:
		return river.JobCancel(fmt.Errorf("etl context %d was cancelled", id))
	case etlcontext.StatusFailed:
		failure := fmt.Errorf("etl context %d FAILED after %d attempts: %s", id, c.Attempt, lastError(ctx, tx, c))
		if job.Attempt >= job.MaxAttempts {
			return failure
		}
		// The job was retried by hand after the context failed for good.
		return river.JobCancel(failure)
	case etlcontext.StatusRunning:
		// RUNNING recorded but the lock is free: the attempt's process is
		// gone without reporting a result, or it lost its lock connection and
		// is still stopping its command. No new attempt may start before
		// that command is surely gone.
		over, err := s.attemptOver(ctx, tx, c)
		if err != nil {
			return s.transient(logger, err)
		}
		if !over {
			return river.JobSnooze(time.Second)
		}
		reason := "the task process exited without reporting a result"
		if c.PID == nil {
			reason = "the task process never took its lock"
		}
		if err := s.recordDeath(ctx, tx, c, reason); err != nil {
			return s.transient(logger, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return s.transient(logger, fmt.Errorf("commit death of etl context %d: %w", id, err))
		}
		logger.Warn("task attempt died", "attempt", c.Attempt, "reason", reason)
		return fmt.Errorf("attempt %d of etl context %d died: %s", c.Attempt, id, reason)
	case etlcontext.StatusRetrying:
		if c.Attempt >= job.Attempt {
			// This River attempt's task attempt failed; let River back off.
			reason := lastError(ctx, tx, c)
			return fmt.Errorf("attempt %d of etl context %d failed: %s", c.Attempt, id, reason)
		}
	}

	// QUEUED, or RETRYING and River has moved on to a new attempt: launch.
	if c.CancelRequestedAt != nil {
		if _, err := etlcontext.Append(ctx, tx, etlcontext.NewEvent{
			ContextID: id, Type: c.Kind + ":" + etlcontext.EventCancelled,
			Payload: map[string]any{"reason": "cancelled before it ran"}, RunID: c.RunID,
		}); err != nil {
			return s.transient(logger, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return s.transient(logger, fmt.Errorf("commit cancellation of etl context %d: %w", id, err))
		}
		return river.JobCancel(fmt.Errorf("etl context %d was cancelled", id))
	}
	if _, ok := s.cfg.Kind(c.Kind); !ok {
		// Only configured kinds run here. Another supervisor serving this
		// queue may run the kind: leave the task to it, spending nothing.
		logger.Warn("kind not in this supervisor's configuration; leaving the task to another supervisor", "kind", c.Kind)
		return river.JobSnooze(s.cfg.PollInterval.D())
	}
	full, err := s.queueFull(ctx, tx, c.Queue)
	if err != nil {
		return s.transient(logger, err)
	}
	if full {
		return river.JobSnooze(s.cfg.PollInterval.D())
	}
	var (
		runID   string
		attempt int
	)
	if err := tx.QueryRow(ctx, `
		UPDATE data_manager.etl_contexts
		   SET etl_status = 'RUNNING', attempt = $2, run_id = gen_random_uuid(), launched_by = $3,
		       started_at = coalesce(started_at, now()),
		       host = NULL, pid = NULL, process_started_at = NULL, heartbeat_at = NULL
		 WHERE etl_context_id = $1
		RETURNING run_id::text, attempt`, id, max(job.Attempt, c.Attempt+1), s.host).Scan(&runID, &attempt); err != nil {
		return s.transient(logger, fmt.Errorf("start attempt of etl context %d: %w", id, err))
	}
	if err := tx.Commit(ctx); err != nil {
		return s.transient(logger, fmt.Errorf("commit start of etl context %d: %w", id, err))
	}

	outcome, err := s.launch(ctx, logger.With("attempt", attempt), c, runID)
	if err != nil {
		// Nothing was started: the next step finds RUNNING with a free lock
		// and records the failed launch.
		logger.Error("launch task process", "error", err)
		return river.JobSnooze(0)
	}
	switch outcome {
	case launchReady, launchPending:
		return river.JobSnooze(s.cfg.PollInterval.D())
	case launchLocked:
		// Someone else holds the lock: that process is the task.
		return river.JobSnooze(s.cfg.PollInterval.D())
	default:
		// The runner exited before holding its lock; what it recorded (or
		// failed to) decides, so look again.
		if depth < 2 {
			return s.step(ctx, job, depth+1)
		}
		return river.JobSnooze(s.cfg.PollInterval.D())
	}
}

// attemptOver reports whether the attempt of c, RUNNING with a free lock, can
// no longer be running its command. A runner that never recorded its pid
// never starts one (it finds its launch superseded). A runner on this host is
// looked up by pid and process start time, so a reused pid is not mistaken
// for it. A runner elsewhere stops its command within heartbeat_interval of
// losing its lock plus kill_grace; its last heartbeat tells when that is.
func (s *Supervisor) attemptOver(ctx context.Context, tx pgx.Tx, c *etlcontext.Context) (bool, error) {
	if c.PID == nil {
		return true, nil
	}
	if c.Host != nil && *c.Host == s.host && c.ProcessStartedAt != nil {
		return !processAlive(ctx, *c.PID, *c.ProcessStartedAt), nil
	}
	if c.HeartbeatAt == nil {
		return true, nil
	}
	window := s.cfg.HeartbeatInterval.D() + s.cfg.KillGrace.D() + 2*time.Second
	var over bool
	if err := tx.QueryRow(ctx, `SELECT $1::timestamptz < now() - $2::interval`, *c.HeartbeatAt, window).Scan(&over); err != nil {
		return false, fmt.Errorf("age heartbeat of etl context %d: %w", c.ID, err)
	}
	return over, nil
}

// processAlive reports whether the process pid that started at startedAt
// (millisecond precision, as recorded) still runs.
func processAlive(ctx context.Context, pid int, startedAt time.Time) bool {
	p, err := process.NewProcessWithContext(ctx, int32(pid))
	if err != nil {
		return false
	}
	ms, err := p.CreateTimeWithContext(ctx)
	if err != nil || ms != startedAt.UnixMilli() {
		return false
	}
	statuses, err := p.StatusWithContext(ctx)
	if err != nil {
		return false
	}
	return !slices.Contains(statuses, process.Zombie)
}

// transient reports an error that says nothing about the task (the database
// is unreachable, a statement timed out): the step is tried again later
// without spending one of River's attempts, which count task attempts.
func (s *Supervisor) transient(logger *slog.Logger, err error) error {
	logger.Warn("step failed; trying again", "error", err)
	return river.JobSnooze(s.cfg.PollInterval.D())
}

// queueFull takes the queue's advisory lock for the rest of tx and reports
// whether the queue already runs max_running tasks.
func (s *Supervisor) queueFull(ctx context.Context, tx pgx.Tx, queue string) (bool, error) {
	q, ok := s.cfg.Queues[queue]
	if !ok {
		return false, fmt.Errorf("queue %s is not configured", queue)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, queueLockNamespace, queue); err != nil {
		return false, fmt.Errorf("lock queue %s: %w", queue, err)
	}
	var running int
	if err := tx.QueryRow(ctx, `
		SELECT count(*) FROM data_manager.etl_contexts WHERE queue = $1 AND etl_status = 'RUNNING'`,
		queue).Scan(&running); err != nil {
		return false, fmt.Errorf("count running tasks of queue %s: %w", queue, err)
	}
	return running >= q.MaxRunning, nil
}

// recordDeath ends the current attempt of c with an ERROR written in the
// attempt's name (the caller holds the lock, so no process of that attempt
// is alive). The database makes the context RETRYING or, when its attempts
// are used up, FAILED.
func (s *Supervisor) recordDeath(ctx context.Context, tx pgx.Tx, c *etlcontext.Context, reason string) error {
	payload := map[string]any{"reason": reason, "detected_by": s.host}
	if c.PID != nil {
		payload["pid"] = *c.PID
	}
	if c.Host != nil {
		payload["host"] = *c.Host
	}
	_, err := etlcontext.Append(ctx, tx, etlcontext.NewEvent{
		ContextID: c.ID,
		Type:      c.Kind + ":" + etlcontext.EventError,
		Payload:   payload,
		RunID:     c.RunID,
	})
	return err
}

// lastError returns the reason recorded by the context's latest ERROR event.
func lastError(ctx context.Context, db etlcontext.DB, c *etlcontext.Context) string {
	var reason *string
	err := db.QueryRow(ctx, `
		SELECT coalesce(payload->>'reason', payload::text)
		  FROM data_manager.event_store
		 WHERE etl_context_id = $1 AND type = $2
		 ORDER BY event_id DESC LIMIT 1`, c.ID, c.Kind+":"+etlcontext.EventError).Scan(&reason)
	if err != nil || reason == nil {
		return "no error recorded"
	}
	return strings.TrimSpace(*reason)
}
