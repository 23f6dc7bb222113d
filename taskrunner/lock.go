package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/dama-etl/dama/internal/pgsession"
	"github.com/dama-etl/dama/protocol"
)

// lockState is what the lock keeper tells the runner's main loop.
type lockState int

const (
	lockHeld lockState = iota // (again, after a loss)
	// lockLost: the lock connection failed; the keeper takes it again.
	lockLost
	// lockSuperseded, final: the run is no longer current (or the context
	// finished): the command must stop.
	lockSuperseded
)

// lockKeeper holds the task's lock and tells the runner's main loop, through
// its state and the changed channel, when it is lost, taken again or
// superseded: a state, not a stream of events, so that whoever reports
// never waits. In row mode it owns a connection with the lock transaction
// left open on it, and watches it. In advisory mode the lock is a session
// lock on the writer's connection: the writer tells the keeper when that
// fails (lost) and has it take the lock again first on every new one
// (resume).
type lockKeeper struct {
	url       string
	runKey    string // see Options.RunKey
	contextID int64
	runID     string
	mode      config.LockMode
	heartbeat time.Duration
	logger    *slog.Logger
	w         *writer
	// dial makes the connection that holds the lock in advisory and host
	// modes (the writer's too).
	dial func(ctx context.Context) (dbConn, error)

	mu       sync.Mutex
	state    lockState
	stateErr error
	// losses counts the losses: one taken again before the main loop
	// looked still counts (in host mode the keeper takes it again in
	// milliseconds).
	losses  int
	changed chan struct{}

	// Row mode: the lock connection, its transaction, and its watch.
	conn *pgx.Conn
	tx   pgx.Tx
	ln   *pglisten.Listener[*pgx.Conn]
	// lastPID is the backend of the session that last held the lock (0 in
	// host mode: the keeper's).
	lastPID uint32
	// releasing is set by the first release.
	releasing atomic.Bool
}

func newLockKeeper(url string, contextID int64, runID string, mode config.LockMode, heartbeat time.Duration, logger *slog.Logger) *lockKeeper {
	return &lockKeeper{
		url: url, contextID: contextID, runID: runID, mode: mode, heartbeat: heartbeat, logger: logger,
		changed: make(chan struct{}, 1),
	}
}

func (k *lockKeeper) appName() string { return fmt.Sprintf("dama-task-lock:%d", k.contextID) }

// lock takes the context's lock on a new connection and returns the context
// under it (etlcontext.ErrLocked when another process holds it) and, in
// advisory mode, the connection, the task's only one, for the writer.
func (k *lockKeeper) lock(ctx context.Context) (*etlcontext.Context, dbConn, error) {
	cctx, cancel := context.WithTimeout(ctx, firstLockTimeout(k.heartbeat))
	defer cancel()
	if k.mode != config.LockModeRow {
		conn, err := k.dial(cctx)
		if err != nil {
			return nil, nil, err
		}
		// The database checks the protocol before the lock: a runner it
		// no longer accepts touches nothing.
		c, err := conn.lockSession(cctx, k.contextID)
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, nil, err
		}
		k.lastPID = conn.backendPID()
		return c, conn, nil
	}
	conn, err := connect(cctx, k.url, k.runKey, k.appName(), k.heartbeat)
	if err != nil {
		return nil, nil, err
	}
	// Before the lock's transaction, which keeps what it reads locked:
	// a runner the database no longer accepts touches nothing.
	var (
		c  *etlcontext.Context
		tx pgx.Tx
	)
	if err = etlcontext.CheckRunnerProtocol(cctx, conn, protocol.Version); err == nil {
		c, tx, err = lockOn(cctx, conn, k.contextID, k.runKey != "")
	}
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	k.conn, k.tx, k.lastPID = conn, tx, conn.PgConn().PID()
	return c, nil, nil
}

// lockOn opens the row-mode lock transaction on conn, left open: the
// context's advisory lock, then its INITIAL event row FOR UPDATE.
func lockOn(ctx context.Context, conn *pgx.Conn, id int64, byKey bool) (*etlcontext.Context, pgx.Tx, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("begin lock transaction: %w", err)
	}
	// The lock transaction stays idle for days: a server-wide idle timeout
	// would end it while the task runs on.
	if _, err := tx.Exec(ctx, "SET LOCAL idle_in_transaction_session_timeout = 0"); err != nil {
		return nil, nil, fmt.Errorf("disable idle timeout of lock transaction: %w", err)
	}
	if pgsession.ServerMajor(conn) >= 17 {
		if _, err := tx.Exec(ctx, "SET LOCAL transaction_timeout = 0"); err != nil {
			return nil, nil, fmt.Errorf("disable transaction timeout of lock transaction: %w", err)
		}
	}
	c, err := etlcontext.LockRow(ctx, tx, id, byKey)
	if err != nil {
		return nil, nil, err
	}
	// The server keeps the last query's portal, and with it a snapshot,
	// until the next statement: left alone for days, it would make every
	// CREATE INDEX CONCURRENTLY wait for the task to end. A statement
	// without parameters (simple protocol) runs without one.
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		return nil, nil, fmt.Errorf("end the lock query: %w", err)
	}
	return c, tx, nil
}

// check makes sure, right before the command starts, that the lock is
// still held, and takes it again within grace if it was lost. It returns
// the losses counted up to the moment the lock was last seen held: any
// later one is the command's to ride out.
func (k *lockKeeper) check(ctx context.Context, grace time.Duration) (int, error) {
	if k.mode != config.LockModeRow {
		// The writer takes the lock again on a new connection before it
		// runs anything there: a ping that succeeds went over a connection
		// that holds the lock (in host mode, the keeper's lock session).
		gctx, cancel := context.WithTimeout(ctx, lockConnectTimeout(k.heartbeat)+grace)
		defer cancel()
		var losses int
		err := k.w.do(gctx, func(ctx context.Context, conn dbConn) error {
			_, losses, _ = k.get()
			return conn.Ping(ctx)
		})
		return losses, err
	}
	_, losses, _ := k.get()
	pctx, cancel := context.WithTimeout(ctx, lockConnectTimeout(k.heartbeat))
	_, err := k.tx.Exec(pctx, "SELECT 1")
	cancel()
	if err == nil {
		return losses, nil
	}
	k.logger.Warn("lock connection failed before the command started; taking the lock again", "error", err, "reconnect_grace", grace)
	rctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	_, losses, _ = k.get()
	ln := k.listener()
	ln.Close(ctx)
	if err := ln.Reopen(rctx); err != nil {
		return losses, err
	}
	k.logger.Info("lock taken again")
	return losses, nil
}

// set records the lock's state, but past lockSuperseded, and wakes the main loop.
func (k *lockKeeper) set(state lockState, err error) {
	k.mu.Lock()
	if k.state != lockSuperseded {
		k.state, k.stateErr = state, err
		if state == lockLost {
			k.losses++
		}
	}
	k.mu.Unlock()
	offer(k.changed, struct{}{})
}

// get returns the lock's state, the losses so far, and the state's cause.
func (k *lockKeeper) get() (lockState, int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.state, k.losses, k.stateErr
}

// holds reports whether the lock is held now.
func (k *lockKeeper) holds() bool {
	state, _, _ := k.get()
	return state == lockHeld
}

// release gives the lock back, once, waiting at most timeout for the
// server: row mode ends the lock transaction and its connection; advisory
// mode releases the session lock on the writer's connection, in host mode
// the keeper's, and with announce tells the supervisors that the task
// process ends in the same statement. It reports whether it announced.
func (k *lockKeeper) release(ctx context.Context, timeout time.Duration, announce bool) (bool, error) {
	if k.releasing.Swap(true) {
		return false, nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if k.mode != config.LockModeRow {
		if k.w == nil {
			return false, nil
		}
		err := k.w.do(rctx, func(ctx context.Context, conn dbConn) error {
			return conn.unlockSession(ctx, k.contextID, announce)
		})
		return announce && err == nil, err
	}
	if k.conn == nil {
		return false, nil
	}
	err := k.tx.Rollback(rctx)
	k.conn.Close(rctx)
	if err != nil && !k.conn.IsClosed() {
		return false, fmt.Errorf("end lock transaction: %w", err)
	}
	return false, nil
}

// watch watches the row-mode lock connection until ctx ends (the writer, in advisory mode).
func (k *lockKeeper) watch(ctx context.Context) {
	if k.mode != config.LockModeRow {
		return
	}
	_ = k.listener().Serve(ctx)
	// Not taken again from now on: an outage no longer waits for it.
	k.w.outage.forget("lock")
}

// listener is the row-mode lock connection's: connecting again takes the
// lock again, tried until the main loop ends it (after reconnect_grace) or
// the run is no longer current.
func (k *lockKeeper) listener() *pglisten.Listener[*pgx.Conn] {
	if k.ln != nil {
		return k.ln
	}
	k.ln = &pglisten.Listener[*pgx.Conn]{
		Connect: k.retake,
		Lost:    k.lost,
		Failed: func(err error) bool {
			if permanent(err) {
				k.set(lockSuperseded, err)
				return false
			}
			k.w.outage.lost("lock", err)
			return true
		},
		Reconnected: func() {
			k.set(lockHeld, nil)
			k.w.outage.back("lock")
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

// permanent reports an error that says the run is no longer current.
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
	k.endLostSession(cctx, conn)
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
func (k *lockKeeper) endLostSession(ctx context.Context, conn etlcontext.DB) {
	if k.lastPID == 0 {
		// Host mode: the keeper ends its own.
		return
	}
	if _, err := conn.Exec(ctx, `
		SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		 WHERE pid = $1 AND application_name = $2 AND datname = current_database()`,
		int32(k.lastPID), k.appName()); err != nil {
		k.logger.Warn("end the lost lock session", "backend_pid", k.lastPID, "error", err)
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

// lost is told that the connection holding the lock failed.
func (k *lockKeeper) lost(err error) {
	k.w.outage.lost("lock", err)
	k.set(lockLost, err)
}

// resume runs first on every new connection of an advisory- or host-mode
// writer: it takes the lock again and clears the loss mark. A permanent
// error supersedes the run; any other is tried on another connection.
func (k *lockKeeper) resume(ctx context.Context, conn dbConn) error {
	if k.releasing.Load() {
		// The runner is ending: a lock taken now would outlive it.
		return fmt.Errorf("task %d: the runner released its lock: %w", k.contextID, etlcontext.ErrStaleRun)
	}
	k.endLostSession(ctx, conn)
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
			err = errors.Join(err, conn.unlockSession(ctx, k.contextID, false))
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
	k.set(lockHeld, nil)
	k.w.outage.back("lock")
	return nil
}
