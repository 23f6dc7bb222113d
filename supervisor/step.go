package supervisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// step is one short, idempotent step of a context's state machine. Unless
// holding (its task held its lock at the Work's last step), it takes a
// transaction slot: a start waits for its queue's lock inside its
// transaction, and the steps that complete ended tasks' jobs must find a
// connection (in bursts of 300 short tasks, their p90 fell from 184-303 ms
// to 79-126 ms).
//
// Most steps need the task's lock for a statement at a time: the first
// reads the task under it, and a start or a job's completion needs it no
// longer (a start takes it again, and starts only a task still as read).
// A step that must keep it while it decides (errNeedsLock) steps again in
// a transaction.
func (s *Supervisor) step(ctx context.Context, job *river.Job[TaskArgs], holding bool) error {
	logger := s.logger.With("etl_context_id", job.Args.ETLContextID, "job_id", job.ID, "job_attempt", job.Attempt)
	txDone := func() {}
	if !holding {
		if !s.take(ctx, s.txSlots) {
			return river.JobSnooze(0)
		}
		txDone = sync.OnceFunc(func() { <-s.txSlots })
	}
	defer txDone()
	err := s.stepIn(ctx, logger, nil, txDone, job)
	if !errors.Is(err, errNeedsLock) {
		return err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return s.transient(logger, fmt.Errorf("begin step of task %d: %w", job.Args.ETLContextID, err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	return s.stepIn(ctx, logger, tx, txDone, job)
}

// stepIn takes a step in tx, which keeps the task's lock until the step
// commits; with no tx, a step that would need that returns errNeedsLock.
func (s *Supervisor) stepIn(ctx context.Context, logger *slog.Logger, tx pgx.Tx, txDone func(), job *river.Job[TaskArgs]) error {
	id := job.Args.ETLContextID
	var db etlcontext.DB = s.pool
	if tx != nil {
		db = tx
	}
	c, js, err := etlcontext.LockStep(ctx, db, id, job.ID)
	if c != nil && fetchedAgain(job, js) {
		return errTakenOver
	}
	switch {
	case errors.Is(err, etlcontext.ErrLocked):
		return s.lockedElsewhere(job, c)
	case errors.Is(err, etlcontext.ErrNotFound):
		return river.JobCancel(err)
	case err != nil:
		return s.transient(logger, err)
	}

	if c.RiverJobID != nil && *c.RiverJobID != job.ID {
		// A job the task has left: dama retry gave it a new one meanwhile.
		return river.JobCancel(fmt.Errorf("task %d is stepped by job %d now", id, *c.RiverJobID))
	}
	if c.Status != etlcontext.StatusRunning {
		s.fence.forget(id)
	}
	switch c.Status {
	case etlcontext.StatusDone, etlcontext.StatusCancelled, etlcontext.StatusFailed:
		return s.settleFinished(ctx, logger, db, tx, job, c)
	case etlcontext.StatusRunning:
		if tx == nil {
			return errNeedsLock
		}
		return s.settleRunning(ctx, logger, tx, c)
	case etlcontext.StatusRetrying:
		if c.Attempt >= job.Attempt {
			// This River attempt's task attempt failed; let River back off.
			f := lastFailure(ctx, db, c)
			if !f.Died {
				s.metrics.failed(c, f)
			}
			return fmt.Errorf("attempt %d of task %d failed: %s", c.Attempt, id, f.Reason)
		}
	}

	return s.startAttempt(ctx, logger, db, tx, txDone, job, c)
}

// commit commits tx, if there is one.
func commit(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return nil
	}
	return tx.Commit(ctx)
}

// settleFinished settles the job of c, a finished context, to agree with it.
func (s *Supervisor) settleFinished(ctx context.Context, logger *slog.Logger, db etlcontext.DB, tx pgx.Tx, job *river.Job[TaskArgs], c *etlcontext.Context) error {
	id := c.ID
	s.finished(ctx, c)
	switch c.Status {
	case etlcontext.StatusDone:
		// River's completer settles the job, with others of a burst in one
		// statement; a DONE task stays DONE, its lock is not needed.
		if err := commit(ctx, tx); err != nil {
			return s.transient(logger, fmt.Errorf("commit the step of task %d: %w", id, err))
		}
		s.metrics.finished(c)
		return nil
	case etlcontext.StatusCancelled:
		s.metrics.finished(c)
		return river.JobCancel(fmt.Errorf("task %d was cancelled", id))
	case etlcontext.StatusFailed:
		f := lastFailure(ctx, db, c)
		if !f.Died {
			// A death, and the FAILED it led to, were counted when recorded.
			s.metrics.failed(c, f)
			s.metrics.finished(c)
		}
		failure := fmt.Errorf("task %d FAILED after %d attempts: %s", id, c.Attempt, f.Reason)
		if job.Attempt >= job.MaxAttempts {
			return failure
		}
		// Failed for good before its attempts were used up, or retried by
		// hand after it failed: River cannot discard a job early.
		return river.JobCancel(failure)
	}
	return fmt.Errorf("task %d is %s, not finished", id, c.Status)
}

// settleRunning decides a step of c, RUNNING while the step holds its lock:
// a launch that never got as far as a command is taken back; an attempt
// that may still run is waited out; one surely over is recorded as
// cancelled or dead.
func (s *Supervisor) settleRunning(ctx context.Context, logger *slog.Logger, tx pgx.Tx, c *etlcontext.Context) error {
	id := c.ID
	if c.PID == nil {
		cancel, err := etlcontext.CancelRequestedNow(ctx, tx, id)
		if err != nil {
			return s.transient(logger, err)
		}
		// Why this supervisor's launch failed, if it did: no task
		// process started to say why.
		failed, forget := s.spawnFailure(id)
		start, err := s.launcherOf(c).Starting(ctx, c, failed, cancel)
		switch {
		case err != nil:
			return s.transient(logger, err)
		case start.Hold:
			return errHold
		}
		if start.Why != "" {
			if err := s.warnUnfit(ctx, tx, c, start.Why, start.WhyIfUntold); err != nil {
				return s.transient(logger, err)
			}
		}
		again := max(time.Duration(s.cfg.PollInterval), start.Again)
		// The launch never got as far as a command, which says nothing
		// about the task: take it back without spending an attempt.
		if err := etlcontext.AbandonLaunch(ctx, tx, c); err != nil {
			return s.transient(logger, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return s.transient(logger, fmt.Errorf("commit abandoned launch of task %d: %w", id, err))
		}
		s.startedLate(id, nil)
		forget()
		if !cancel {
			s.reportLaunchFailure(ctx, logger, c, failed)
		}
		s.wakeWaiting(ctx, c.Queue)
		return river.JobSnooze(again)
	}
	// The attempt died, or lost its lock and is taking it again or stopping
	// its command: no new attempt may start before all of it is surely gone.
	wait, ended, err := s.attemptAlive(ctx, tx, c)
	if err != nil {
		return s.transient(logger, err)
	}
	if wait > 0 {
		if err := tx.Commit(ctx); err != nil {
			return s.transient(logger, fmt.Errorf("commit lock loss of task %d: %w", id, err))
		}
		return river.JobSnooze(wait)
	}
	cancelled, err := etlcontext.CancelRequestedNow(ctx, tx, id)
	if err != nil {
		return s.transient(logger, err)
	}
	// Asked to stop, and now surely stopped: the request's outcome. Else a
	// death, in its launcher's words when it has some (OOMKilled, Evicted: a
	// pod's), which may have been the last attempt's: the task is FAILED,
	// and River discards the job without another step.
	suffix, reason, what := protocol.EventError, cmp.Or(ended, "the task process exited without reporting a result"), "death"
	if cancelled {
		suffix, reason, what = protocol.EventCancelled, "cancel requested; the task process had exited or lost its lock", "cancellation"
	}
	if err := s.recordEnd(ctx, tx, c, suffix, reason); err != nil {
		return s.transient(logger, err)
	}
	after, err := etlcontext.Get(ctx, tx, id)
	if err != nil {
		return s.transient(logger, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return s.transient(logger, fmt.Errorf("commit %s of task %d: %w", what, id, err))
	}
	s.startedLate(id, cmp.Or(c.ProcessStartedAt, new(time.Now())))
	s.metrics.lockLosses.WithLabelValues(c.Queue, c.Kind).Inc()
	if !cancelled {
		s.metrics.attemptsFailed.WithLabelValues(c.Queue, c.Kind, failedLockLost).Inc()
	}
	if after.Status.Finished() {
		s.metrics.finished(after)
	}
	s.wakeWaiting(ctx, c.Queue)
	if cancelled {
		logger.Info("cancelled task's attempt is over", "attempt", c.Attempt)
		return river.JobCancel(fmt.Errorf("task %d was cancelled", id))
	}
	logger.Warn("task attempt died", "attempt", c.Attempt, "reason", reason)
	return fmt.Errorf("attempt %d of task %d died: %s", c.Attempt, id, reason)
}

// startAttempt launches an attempt of c, QUEUED, or RETRYING with River on
// a new attempt, unless it is to be cancelled, its kind is not configured
// here, the previous attempt lives on, or it must wait for a slot.
func (s *Supervisor) startAttempt(ctx context.Context, logger *slog.Logger, db etlcontext.DB, tx pgx.Tx, txDone func(), job *river.Job[TaskArgs], c *etlcontext.Context) error {
	id := c.ID
	if c.CancelRequestedAt != nil {
		if tx == nil {
			return errNeedsLock
		}
		if _, err := etlcontext.Append(ctx, tx, etlcontext.NewEvent{
			ContextID: id, Type: protocol.EventType(c.Kind, protocol.EventCancelled),
			Payload: map[string]any{"reason": "cancelled before it ran"}, RunID: c.RunID,
		}); err != nil {
			return s.transient(logger, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return s.transient(logger, fmt.Errorf("commit cancellation of task %d: %w", id, err))
		}
		c.Status = etlcontext.StatusCancelled
		s.metrics.finished(c)
		return river.JobCancel(fmt.Errorf("task %d was cancelled", id))
	}
	k, ok := s.cfg.Kind(c.Kind)
	if !ok {
		// Another supervisor serving this queue may run the kind.
		logger.Warn("kind not in this supervisor's configuration; leaving the task to another supervisor", "kind", c.Kind)
		return river.JobSnooze(time.Duration(s.cfg.PollInterval))
	}
	if s.cannotRunNow(c.Kind, k) {
		// Once a task process of this host said why it cannot run the
		// task (the task's reason), no other is started, which would say
		// it again, until the host can: a launch every poll_interval
		// would write a task process's lines to both logs each time.
		told, err := etlcontext.UnfitOn(ctx, db, id, c.Attempt+1, s.host)
		if err != nil {
			return s.transient(logger, err)
		}
		if told {
			return river.JobSnooze(time.Duration(s.cfg.PollInterval))
		}
	}
	if err := s.lingering(ctx, logger, db, tx, c); err != nil {
		return err
	}
	run, wait, err := s.start(ctx, db, job, c)
	switch {
	case errors.Is(err, etlcontext.ErrChanged) && tx == nil:
		// Decide again from what the task is now, under its lock.
		return errNeedsLock
	case errors.Is(err, etlcontext.ErrChanged):
		return errStepAgain
	case err != nil:
		return s.transient(logger, err)
	}
	if err := commit(ctx, tx); err != nil {
		return s.transient(logger, fmt.Errorf("commit start of task %d: %w", id, err))
	}
	if wait != etlcontext.WaitNone {
		// Parked until a slot frees (wakeWaiting).
		return river.JobSnooze(parkWaiting)
	}
	txDone()

	// The attempt counts as started once its task process holds its lock,
	// which it may report after the launch timeout.
	started := func(at time.Time) {
		s.mu.Lock()
		delete(s.spawnFailures, id)
		delete(s.launchFailures, id)
		s.mu.Unlock()
		s.metrics.attemptsStarted.WithLabelValues(c.Queue, c.Kind).Inc()
		if run.Attempt == 1 {
			s.metrics.lockedAfterSubmit(c, at)
		}
	}
	s.mu.Lock()
	s.pendingStarts[id] = started
	s.mu.Unlock()
	l, secrets := s.launcherOf(c), s.secrets(run.Key)
	if l != (hostLauncher{s}) {
		// The host's lock keeper serves this host's task processes only.
		secrets.Keeper = nil
	}
	outcome, err := l.Launch(ctx, Launch{Task: c, Run: run, Secrets: secrets, Logger: logger.With("attempt", run.Attempt)})
	if err != nil {
		// Nothing was started: the next look takes the launch back, and
		// says why (spawnFailure).
		s.mu.Lock()
		s.spawnFailures[id] = err.Error()
		s.mu.Unlock()
		outcome = LaunchExited
	}
	if outcome != LaunchPending {
		var at *time.Time
		if outcome == LaunchReady {
			at = new(time.Now())
		}
		s.startedLate(id, at)
	}
	switch outcome {
	case LaunchReady, LaunchPending, LaunchLocked:
		return errHold
	case LaunchRefused:
		s.retire(ctx)
	}
	// The runner exited before holding its lock (or, refused, wrote
	// nothing): the next look decides, or takes the launch back.
	return errStepAgain
}

// lingering returns the snooze of a task whose previous attempt lives on,
// as its processes, if it ran here, or its command's statements, which the
// server may run on after the client died; nil when nothing does.
func (s *Supervisor) lingering(ctx context.Context, logger *slog.Logger, db etlcontext.DB, tx pgx.Tx, c *etlcontext.Context) error {
	if c.RunID == nil {
		return nil
	}
	if c.HostID != nil && *c.HostID == s.hostID {
		procs, err := s.attemptProcesses(c).Processes()
		if err != nil || len(procs) > 0 {
			if err != nil {
				logger.Warn("look for the processes of the previous attempt; counting them alive", "error", err)
			} else {
				s.stopOrphans(c.ID)
			}
			return river.JobSnooze(time.Second)
		}
	}
	n, err := s.sessionsLeft(ctx, logger, db, c)
	switch {
	case err != nil:
		return s.transient(logger, err)
	case n == 0:
		return nil
	case tx == nil:
		return errNeedsLock
	}
	changed, err := etlcontext.MarkWaiting(ctx, tx, c.ID, etlcontext.WaitSessions)
	if err != nil {
		return s.transient(logger, err)
	}
	if changed {
		logger.Info("waiting for the previous attempt's database sessions to end", "sessions", n, "application_name", protocol.SessionName(*c.RunID))
	}
	if err := tx.Commit(ctx); err != nil {
		return s.transient(logger, fmt.Errorf("commit wait of task %d: %w", c.ID, err))
	}
	return river.JobSnooze(time.Second)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// transient reports an error that says nothing about the task: the step is
// tried again later without spending one of River's attempts.
func (s *Supervisor) transient(logger *slog.Logger, err error) error {
	s.metrics.stepErrors.Inc()
	logger.Warn("could not look after the task; trying again at the next poll", "error", err)
	return river.JobSnooze(time.Duration(s.cfg.PollInterval))
}

// start starts an attempt of c, read by a step of job, unless it must wait
// for a slot (etlcontext.StartIfFree).
func (s *Supervisor) start(ctx context.Context, db etlcontext.DB, job *river.Job[TaskArgs], c *etlcontext.Context) (etlcontext.Run, etlcontext.Wait, error) {
	q, ok := s.cfg.Queues[c.Queue]
	if !ok {
		return etlcontext.Run{}, etlcontext.WaitNone, fmt.Errorf("queue %s is not configured", c.Queue)
	}
	k, _ := s.cfg.Kind(c.Kind)
	if k.ConcurrencyKey != "" && c.ConcurrencyKey == nil {
		// Submitted without the key (before the kind had one): record it,
		// from the arguments, or "" when they lack the field.
		if _, err := etlcontext.DeriveConcurrencyKey(ctx, db, c.ID, k.ConcurrencyKey); err != nil {
			return etlcontext.Run{}, etlcontext.WaitNone, err
		}
	}
	return etlcontext.StartIfFree(ctx, db, etlcontext.Start{
		Read: c, Job: job.ID,
		QueueMax: q.MaxRunning, KindMax: k.MaxRunning, KeyMax: k.MaxRunningPerKey,
		Attempt: max(job.Attempt, c.Attempt+1), LaunchedBy: s.host,
	})
}

// maxSessionWait bounds how long after a run ended a supervisor waits for
// its sessions to end (protocol.SessionCheckOption) before it starts the next
// attempt anyway: a pooler keeps a server session under its client's name, a
// command may keep one open in a process that left its tree, and any role
// that can connect may name a session so.
const maxSessionWait = 10 * time.Minute

// sessionsLeft returns how many sessions of c's previous run
// (protocol.SessionName) are left on the server; none once the run ended
// maxSessionWait ago.
func (s *Supervisor) sessionsLeft(ctx context.Context, logger *slog.Logger, db etlcontext.DB, c *etlcontext.Context) (int, error) {
	name := protocol.SessionName(*c.RunID)
	n, overdue, err := etlcontext.RunSessions(ctx, db, c.ID, *c.RunID, name, maxSessionWait)
	if err == nil && n > 0 && overdue {
		logger.Warn("the previous attempt's database sessions are still there; starting the next attempt beside them", "sessions", n, "application_name", name, "waited_at_most", maxSessionWait)
		return 0, nil
	}
	return n, err
}
