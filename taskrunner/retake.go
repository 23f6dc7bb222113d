package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/etlcontext"
)

// watch waits on the row-mode lock connection until it fails or ctx ends;
// when it fails, it takes the lock again, reporting each change (set). In
// advisory mode the writer does the watching.
func (k *lockKeeper) watch(ctx context.Context) {
	if k.mode != config.LockModeRow {
		return
	}
	for {
		// No LISTEN was issued on this connection: only its failure, or
		// ctx, ends the wait.
		err := k.conn.PgConn().WaitForNotification(ctx)
		if ctx.Err() != nil {
			return
		}
		k.set(lockLost, err)
		if err := k.retake(ctx); err != nil {
			if ctx.Err() == nil {
				k.set(lockSuperseded, err)
			}
			return
		}
		k.set(lockHeld, nil)
	}
}

// retake takes the row-mode lock again under the same run, retrying until
// ctx ends: the runner's main loop bounds the attempt with reconnect_grace
// (it stops the command and then ctx). It fails for good when the run is no
// longer current.
func (k *lockKeeper) retake(ctx context.Context) error {
	oldPID := k.conn.PgConn().PID()
	k.conn.Close(context.WithoutCancel(ctx))
	delay := 100 * time.Millisecond
	for {
		err := k.tryRetake(ctx, oldPID)
		switch {
		case err == nil:
			k.logger.Info("lock taken again")
			return nil
		case permanent(err):
			return err
		}
		k.logger.Warn("take the lock again", "error", err, "retry_in", delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
		// Short: the grace is what bounds the whole attempt, and a server
		// that is back should be found at once.
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// permanent reports an error after which the lock is never taken again:
// the run is no longer current.
func permanent(err error) bool {
	return errors.Is(err, etlcontext.ErrStaleRun) || errors.Is(err, etlcontext.ErrFinished) || errors.Is(err, etlcontext.ErrNotFound)
}

func (k *lockKeeper) tryRetake(ctx context.Context, oldPID uint32) error {
	// Connecting to a silent server must fail fast, to be tried again; the
	// statements after it may wait for a write connection that is being
	// made again too.
	dctx, dcancel := context.WithTimeout(ctx, lockConnectTimeout(k.heartbeat))
	conn, err := connect(dctx, k.url, k.runKey, k.appName(), k.heartbeat)
	dcancel()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, stmtTimeout)
	defer cancel()
	ok := false
	defer func() {
		if !ok {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	k.endLostSession(cctx, conn, oldPID)
	c, tx, err := lockOn(cctx, conn, k.contextID, k.runKey != "")
	if err != nil {
		return err
	}
	if err := k.current(c); err != nil {
		return err
	}
	// Until a supervisor's mark of the loss is cleared, the loss counts: a
	// later loss must not be timed from this one.
	if err := k.w.do(cctx, func(ctx context.Context, conn dbConn) error {
		return etlcontext.ClearLockLost(ctx, conn, k.contextID, k.runID)
	}); err != nil {
		return err
	}
	ok = true
	k.conn, k.tx = conn, tx
	return nil
}

// endLostSession ends the backend that held the lock before the connection
// failed, if it is still this task's: a connection that went silent may
// still hold the lock on the server until its keepalives give up.
func (k *lockKeeper) endLostSession(ctx context.Context, conn etlcontext.DB, oldPID uint32) {
	if oldPID == 0 {
		// Host mode: the keeper ends its own.
		return
	}
	if _, err := conn.Exec(ctx, `
		SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		 WHERE pid = $1 AND application_name = $2 AND datname = current_database()`,
		int32(oldPID), k.appName()); err != nil {
		k.logger.Warn("end the lost lock session", "backend_pid", oldPID, "error", err)
	}
}

// current checks that c, read under the lock, is still this run's.
func (k *lockKeeper) current(c *etlcontext.Context) error {
	if c.Status.Finished() {
		return fmt.Errorf("etl context %d is %s: %w", c.ID, c.Status, etlcontext.ErrFinished)
	}
	if c.Status != etlcontext.StatusRunning || c.RunID == nil || *c.RunID != k.runID {
		return fmt.Errorf("etl context %d is %s under run %s: %w", c.ID, c.Status, deref(c.RunID), etlcontext.ErrStaleRun)
	}
	return nil
}

// lost is the writer telling an advisory- or host-mode keeper that the
// connection holding the lock failed.
func (k *lockKeeper) lost(err error) { k.set(lockLost, err) }

// resume runs first on every new connection of an advisory- or host-mode
// writer:
// it takes the lock again under the same run and clears the loss mark. A
// permanent error (the run is no longer current) supersedes the run; any
// other is tried again on another connection.
func (k *lockKeeper) resume(ctx context.Context, conn dbConn) error {
	if k.releasing.Load() {
		// The runner is ending: a lock taken now would outlive it.
		return fmt.Errorf("etl context %d: the runner released its lock: %w", k.contextID, etlcontext.ErrStaleRun)
	}
	k.endLostSession(ctx, conn, k.lastPID)
	c, err := conn.lockSession(ctx, k.contextID)
	if errors.Is(err, etlcontext.ErrLocked) {
		// The lost session is still ending, or a supervisor looks at the
		// context for a moment, or another attempt holds it: which one,
		// the context says.
		cur, gerr := etlcontext.Get(ctx, conn, k.contextID)
		if gerr == nil {
			if cerr := k.current(cur); cerr != nil {
				err = cerr
			}
		}
	}
	if err == nil {
		if err = k.current(c); err != nil {
			err = errors.Join(err, conn.unlockSession(ctx, k.contextID))
		}
	}
	if err == nil {
		err = etlcontext.ClearLockLost(ctx, conn, k.contextID, k.runID)
	}
	if err != nil {
		if permanent(err) {
			k.set(lockSuperseded, err)
		}
		return err
	}
	k.lastPID = conn.backendPID()
	k.logger.Info("lock taken again")
	k.set(lockHeld, nil)
	return nil
}
