package supervisor

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/taskrunner"
)

// lockedElsewhere decides a step that found the lock of c held, by c as
// it stands: by a RUNNING context's task process, whoever started it, and
// the job is held (adoption, from any host); or by someone looking at the
// context for a moment (`dama cancel`, a supervisor stopping orphans).
func (s *Supervisor) lockedElsewhere(job *river.Job[TaskArgs], c *etlcontext.Context) error {
	id := c.ID
	if c.RiverJobID != nil && *c.RiverJobID != job.ID {
		// Left for another job (dama retry): hold nothing.
		return river.JobCancel(fmt.Errorf("task %d is stepped by job %d now", id, *c.RiverJobID))
	}
	if c.Status == etlcontext.StatusRunning {
		// Held again by its task process: a later loss is timed anew.
		if c.LockLostAt == nil {
			s.fence.forget(id)
		}
		if c.PID != nil {
			s.startedLate(id, cmp.Or(c.ProcessStartedAt, new(time.Now())))
		}
		return errHold
	}
	return river.JobSnooze(time.Second)
}

// attemptAlive tells, for c RUNNING with a free lock and a recorded task
// process, how long to wait before looking again (0: every process of the
// attempt is surely gone), with what its launcher knows of it. Where its
// launcher cannot tell, that is the fencing window since this supervisor
// first found the lock free, on its own monotonic clock (the database's, or
// the wall clock, can jump).
func (s *Supervisor) attemptAlive(ctx context.Context, tx pgx.Tx, c *etlcontext.Context) (wait time.Duration, ended string, err error) {
	const recheck = time.Second
	// An attempt that ran on this host is looked at here, whatever its
	// kind's runner says now.
	gone, ended := hostLauncher{s}.Gone(ctx, c)
	if l := s.launcherOf(c); gone == GoneUnknown && l != (hostLauncher{s}) {
		gone, ended = l.Gone(ctx, c)
	}
	switch gone {
	case GoneNot:
		return recheck, ended, nil
	case GoneSurely:
		s.fence.forget(c.ID)
		return 0, ended, nil
	}
	mark, err := etlcontext.MarkLockLost(ctx, tx, c.ID)
	if err != nil {
		return 0, ended, err
	}
	freeFor := s.fence.freeFor(c.ID, mark)
	window := taskrunner.FenceWindow(time.Duration(s.cfg.HeartbeatInterval), time.Duration(*s.cfg.ReconnectGrace), time.Duration(s.cfg.KillGrace), time.Duration(s.cfg.PollInterval))
	if c.FenceWindow != nil {
		window = *c.FenceWindow
	}
	if freeFor < window {
		return min(window-freeFor, recheck), ended, nil
	}
	s.fence.forget(c.ID)
	return 0, ended, nil
}

// attemptProcesses names the processes of c's current attempt on this host.
func (s *Supervisor) attemptProcesses(c *etlcontext.Context) hostproc.Attempt {
	a := hostproc.Attempt{Marker: protocol.RunIDEnv + "=" + deref(c.RunID)}
	if c.CommandPGID != nil {
		a.PGID = *c.CommandPGID
	}
	if c.CommandStartTicks != nil {
		a.LeaderStartTicks = uint64(*c.CommandStartTicks)
	}
	return a
}

// recordEnd ends the current attempt of c, surely over, with an event of
// suffix in the attempt's name: an ERROR for a death, a CANCELLED for a
// cancel requested meanwhile. The caller holds the lock.
func (s *Supervisor) recordEnd(ctx context.Context, tx pgx.Tx, c *etlcontext.Context, suffix, reason string) error {
	payload := map[string]any{"reason": reason, etlcontext.DetectedBy: s.host}
	if c.PID != nil {
		payload["pid"] = *c.PID
	}
	if c.Host != nil {
		payload["host"] = *c.Host
	}
	_, err := etlcontext.Append(ctx, tx, etlcontext.NewEvent{
		ContextID: c.ID,
		Type:      protocol.EventType(c.Kind, suffix),
		Payload:   payload,
		RunID:     c.RunID,
	})
	return err
}

// lastFailure returns what the context's latest ERROR or CANCELLED event says.
func lastFailure(ctx context.Context, db etlcontext.DB, c *etlcontext.Context) etlcontext.Failure {
	f, err := etlcontext.LastFailure(ctx, db, c.ID, c.Kind)
	if err != nil || f.Reason == "" {
		f.Reason = "no error recorded"
	}
	return f
}

// warnUnfit records why this host could not start c's attempt in a WARNING
// (etlcontext.UnfitHostMeta): once per attempt and reason, and with ifUntold
// only if the task process said nothing.
func (s *Supervisor) warnUnfit(ctx context.Context, tx pgx.Tx, c *etlcontext.Context, why string, ifUntold bool) error {
	reason, _ := etlcontext.CleanText(etlcontext.UnfitPrefix + why)
	warned, err := etlcontext.WarnedThisAttempt(ctx, tx, c.ID, reason)
	if err == nil && !warned && ifUntold {
		var told string
		told, err = etlcontext.LatestUnfitHost(ctx, tx, c.ID, c.Attempt)
		warned = told != ""
	}
	if err != nil || warned {
		return err
	}
	_, err = etlcontext.Append(ctx, tx, etlcontext.NewEvent{
		ContextID: c.ID, Type: protocol.EventType(c.Kind, protocol.EventWarning), RunID: c.RunID,
		Payload: map[string]any{"reason": reason, "host": s.host},
		Meta:    map[string]any{etlcontext.UnfitHostMeta: reason},
	})
	return err
}

// spawnFailure returns why this supervisor could not spawn the task
// process of context id ("" if it could), and forget forgets it.
func (s *Supervisor) spawnFailure(id int64) (why string, forget func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spawnFailures[id], func() {
		s.mu.Lock()
		delete(s.spawnFailures, id)
		s.mu.Unlock()
	}
}

// reportLaunchFailure logs a launch that was taken back: as an error the
// first time a context's launch fails for a given reason, then at debug level.
func (s *Supervisor) reportLaunchFailure(ctx context.Context, logger *slog.Logger, c *etlcontext.Context, reason string) {
	if reason == "" {
		reason = "the task process stopped before it took its lock (see " +
			protocol.LogPath(s.cfg.LogDir, c.ID) + " on " + deref(c.LaunchedBy) + ")"
		// The task process says why once per attempt, not at every launch.
		if warning, err := etlcontext.LatestUnfitHost(ctx, s.pool, c.ID, c.Attempt); err == nil && warning != "" {
			reason = warning
		}
	}
	s.mu.Lock()
	repeated := s.launchFailures[c.ID] == reason
	s.launchFailures[c.ID] = reason
	s.mu.Unlock()
	if repeated {
		logger.Debug("could not start the task again; no attempt spent", "reason", reason)
		return
	}
	logger.Error("could not start the task; no attempt spent: it is tried again every poll_interval, or as its launcher says", "reason", reason)
}
