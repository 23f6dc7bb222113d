package supervisor

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
)

// runnerMayLive reports whether c's task process, on this host, may still
// run: an error reading it, or no recorded start time, counts as alive.
func runnerMayLive(c *etlcontext.Context) bool {
	if c.RunnerStartTicks == nil {
		return true
	}
	alive, err := hostproc.Alive(*c.PID, uint64(*c.RunnerStartTicks))
	return alive || err != nil
}

// maxOrphanStoppers bounds the orphan stoppers running at once: each holds a
// pool connection (with the context's lock) until its orphans are gone.
const maxOrphanStoppers = 4

// stopOrphans stops, in the background and once at a time per context, the
// processes that a dead task process of context id left behind on this
// host: SIGTERM, then SIGKILL after kill_grace. It holds the context's lock
// until they are gone, so that no supervisor, on any host, judges the
// attempt over before.
func (s *Supervisor) stopOrphans(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx := s.orphanCtx
	if s.stopping[id] || ctx == nil || ctx.Err() != nil {
		return
	}
	s.stopping[id] = true
	s.orphans.Go(func() {
		defer func() {
			s.mu.Lock()
			delete(s.stopping, id)
			s.mu.Unlock()
		}()
		select {
		case s.orphanSlots <- struct{}{}:
			defer func() { <-s.orphanSlots }()
		case <-ctx.Done():
			return
		}
		if err := s.stopOrphansLocked(ctx, id); err != nil && ctx.Err() == nil {
			s.logger.Error("stop the processes of a dead attempt", "etl_context_id", id, "error", err)
		}
	})
}

func (s *Supervisor) stopOrphansLocked(ctx context.Context, id int64) error {
	// The step that found the orphans may hold the lock a moment longer.
	var (
		tx  pgx.Tx
		c   *etlcontext.Context
		err error
	)
	for try := 0; ; try++ {
		tx, err = s.pool.Begin(ctx)
		if err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		if c, err = etlcontext.Lock(ctx, tx, id); err == nil {
			break
		}
		_ = tx.Rollback(ctx)
		switch {
		case !errors.Is(err, etlcontext.ErrLocked):
			return err
		case try == 30:
			return nil // a task process, or a step that will look again
		case !sleep(ctx, 100*time.Millisecond):
			return ctx.Err()
		}
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// The lock may be held for long: the server keeps the last query's
	// portal, and its snapshot, until the next statement, which would make
	// CREATE INDEX CONCURRENTLY wait for it.
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		return fmt.Errorf("end the lock query: %w", err)
	}
	if c.HostID == nil || *c.HostID != s.hostID || c.PID == nil || runnerMayLive(c) {
		return nil
	}
	a := s.attemptProcesses(c)
	pids, err := a.Processes()
	if err == nil && len(pids) == 0 {
		return nil
	}
	logger := s.logger.With("etl_context_id", id, "attempt", c.Attempt)
	logger.Warn("the task process is gone but processes of its attempt live on; stopping them", "pids", pids, "kill_grace", s.cfg.KillGrace)
	if err := a.Signal(syscall.SIGTERM); err != nil {
		logger.Warn("signal the processes of a dead attempt", "signal", "SIGTERM", "error", err)
	}
	// However long that takes: a process in uninterruptible sleep dies late.
	deadline := time.Now().Add(time.Duration(s.cfg.KillGrace))
	nextReport := time.Now().Add(30 * time.Second)
	for {
		if !sleep(ctx, 100*time.Millisecond) {
			return fmt.Errorf("processes %v still alive: %w", pids, ctx.Err())
		}
		pids, err = a.Processes()
		if err == nil && len(pids) == 0 {
			logger.Info("the processes of the dead attempt are gone")
			return nil
		}
		if time.Now().After(deadline) {
			if err := a.Signal(syscall.SIGKILL); err != nil {
				logger.Warn("signal the processes of a dead attempt", "signal", "SIGKILL", "error", err)
			}
		}
		if time.Now().After(nextReport) {
			logger.Error("processes of a dead attempt survive SIGKILL; the task waits for them", "pids", pids, "error", err)
			nextReport = time.Now().Add(30 * time.Second)
		}
	}
}
