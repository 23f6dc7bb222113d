package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/jackc/pgx/v5"
)

// watch waits on the row-mode lock connection until ctx ends; when it
// fails, it takes the lock again, reporting each change (set). In advisory
// mode the writer does the watching.
func (k *lockKeeper) watch(ctx context.Context) {
	if k.mode != config.LockModeRow {
		return
	}
	_ = k.listener().Serve(ctx)
}

// listener is the row-mode lock connection's: connecting again takes the
// lock again under the same run, tried again until the runner's main loop
// ends it (reconnect_grace bounds the attempt: it stops the command and
// then ctx), or for good once the run is no longer current.
func (k *lockKeeper) listener() *pglisten.Listener[*pgx.Conn] {
	if k.ln != nil {
		return k.ln
	}
	k.ln = &pglisten.Listener[*pgx.Conn]{
		Connect: k.retake,
		Lost:    func(err error) { k.set(lockLost, err) },
		Failed: func(err error) bool {
			if permanent(err) {
				k.set(lockSuperseded, err)
				return false
			}
			k.logger.Warn("take the lock again", "error", err)
			return true
		},
		Reconnected: func() {
			k.logger.Info("lock taken again")
			k.set(lockHeld, nil)
		},
		// Short: the grace is what bounds the whole attempt, and a server
		// that is back should be found at once.
		RetryDelay: 500 * time.Millisecond,
		// The lock outlives the watch: release ends it.
		KeepOpen: true,
	}
	k.ln.Use(k.conn)
	return k.ln
}

// permanent reports an error after which the lock is never taken again:
// the run is no longer current.
func permanent(err error) bool {
	return errors.Is(err, etlcontext.ErrStaleRun) || errors.Is(err, etlcontext.ErrFinished) || errors.Is(err, etlcontext.ErrNotFound)
}

// retake takes the row-mode lock again, on a new connection.
func (k *lockKeeper) retake(ctx context.Context) (*pgx.Conn, error) {
	// Connecting to a silent server must fail fast, to be tried again; the
	// statements after it may wait for a write connection that is being
	// made again too.
	dctx, dcancel := context.WithTimeout(ctx, lockConnectTimeout(k.heartbeat))
	conn, err := connect(dctx, k.url, k.runKey, k.appName(), k.heartbeat)
	dcancel()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, stmtTimeout)
	defer cancel()
	ok := false
	defer func() {
		if !ok {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	k.endLostSession(cctx, conn, k.lastPID)
	c, tx, err := lockOn(cctx, conn, k.contextID, k.runKey != "")
	if err != nil {
		return nil, err
	}
	if err := k.current(c); err != nil {
		return nil, err
	}
	// Until a supervisor's mark of the loss is cleared, the loss counts: a
	// later loss must not be timed from this one.
	if err := k.w.do(cctx, func(ctx context.Context, conn dbConn) error {
		return etlcontext.ClearLockLost(ctx, conn, k.contextID, k.runID)
	}); err != nil {
		return nil, err
	}
	ok = true
	k.conn, k.tx, k.lastPID = conn, tx, conn.PgConn().PID()
	return conn, nil
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
		return fmt.Errorf("task %d is %s: %w", c.ID, c.Status, etlcontext.ErrFinished)
	}
	if c.Status != etlcontext.StatusRunning || c.RunID == nil || *c.RunID != k.runID {
		return fmt.Errorf("task %d is %s under run %s: %w", c.ID, c.Status, deref(c.RunID), etlcontext.ErrStaleRun)
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
		return fmt.Errorf("task %d: the runner released its lock: %w", k.contextID, etlcontext.ErrStaleRun)
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
