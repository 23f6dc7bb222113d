package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
)

// Server-side TCP keepalives of the lock connection. A host that vanishes
// (power cut, partition) stops answering; without them the server would
// hold its lock until the kernel gives up on the socket, about 2h11m with
// Linux's defaults. With them the server ends the session, and so releases
// the lock, at most LockReleaseBound after the last packet it received.
// They apply to TCP connections only (not Unix sockets).
const (
	keepaliveIdle     = 10 * time.Second
	keepaliveInterval = 5 * time.Second
	keepaliveCount    = 3
	// LockReleaseBound is how long after a task's host went silent the
	// server releases its lock.
	LockReleaseBound = keepaliveIdle + keepaliveCount*keepaliveInterval
)

// fenceMargin covers what the bounds below do not: scheduling delays and
// the difference between the runner's clock rate and the database's.
const fenceMargin = 2 * time.Second

// lockPingTimeout bounds one check of the lock connection: a connection that
// went silent without a reset is noticed within heartbeat_interval plus this.
func lockPingTimeout(heartbeat time.Duration) time.Duration {
	return min(max(2*heartbeat, time.Second), 10*time.Second)
}

// FenceWindow is how long a supervisor on another host, which cannot look
// at the processes, waits after it first found a task's lock free (timed on
// the database's clock) before it starts a new attempt. A live task process
// runs its command for at most this long after its lock was released: it
// notices the loss within a heartbeat interval plus a ping's timeout, tries
// to take the lock again for reconnectGrace, then stops its command's
// process group (SIGTERM, SIGKILL after killGrace). A dead one's orphans
// are found by a supervisor of its host within pollInterval (twice that,
// for slack), which then holds the lock until they are gone.
func FenceWindow(heartbeat, reconnectGrace, killGrace, pollInterval time.Duration) time.Duration {
	return max(heartbeat+lockPingTimeout(heartbeat)+reconnectGrace+killGrace, 2*pollInterval) + fenceMargin
}

// lockState is what the lock keeper tells the runner's main loop.
type lockState int

const (
	// lockLost: the lock connection failed; the keeper is trying to take
	// the lock again.
	lockLost lockState = iota
	// lockRegained: the lock is held again, under the same run.
	lockRegained
	// lockSuperseded: the run is no longer current (or the context
	// finished): the command must stop.
	lockSuperseded
)

type lockEvent struct {
	state lockState
	err   error
}

// lockKeeper owns the lock connection and its transaction.
type lockKeeper struct {
	url       string
	contextID int64
	runID     string
	logger    *slog.Logger
	interval  time.Duration
	w         *writer

	conn *pgx.Conn
	tx   pgx.Tx
}

func (k *lockKeeper) appName() string { return fmt.Sprintf("dama-task-lock:%d", k.contextID) }

// lock takes the context's lock on a new connection: the INITIAL event row
// FOR UPDATE NOWAIT, then the advisory lock that makes it visible in
// pg_locks, in a transaction that stays open. It returns the context as it
// stands under the lock; etlcontext.ErrLocked when another process holds it.
func (k *lockKeeper) lock(ctx context.Context) (*etlcontext.Context, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*lockPingTimeout(k.interval))
	defer cancel()
	conn, err := connect(cctx, k.url, k.appName(), true)
	if err != nil {
		return nil, err
	}
	c, tx, err := lockOn(cctx, conn, k.contextID)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	k.conn, k.tx = conn, tx
	return c, nil
}

func lockOn(ctx context.Context, conn *pgx.Conn, id int64) (*etlcontext.Context, pgx.Tx, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("begin lock transaction: %w", err)
	}
	// The lock transaction stays idle for days: a server-wide idle timeout
	// would end it while the task runs on.
	if _, err := tx.Exec(ctx, "SET LOCAL idle_in_transaction_session_timeout = 0"); err != nil {
		return nil, nil, fmt.Errorf("disable idle timeout of lock transaction: %w", err)
	}
	if serverMajor(conn) >= 17 {
		if _, err := tx.Exec(ctx, "SET LOCAL transaction_timeout = 0"); err != nil {
			return nil, nil, fmt.Errorf("disable transaction timeout of lock transaction: %w", err)
		}
	}
	c, err := etlcontext.LockInitial(ctx, tx, id)
	if err != nil {
		return nil, nil, err
	}
	ok, err := etlcontext.TryAdvisoryLock(ctx, tx, c.ID)
	if err != nil {
		return nil, nil, err
	}
	if !ok {
		return nil, nil, fmt.Errorf("advisory lock of etl context %d: %w", id, etlcontext.ErrLocked)
	}
	return c, tx, nil
}

// watch checks the lock connection every interval and, when it fails, tries
// to take the lock again until ctx ends, reporting each change on events.
func (k *lockKeeper) watch(ctx context.Context, events chan<- lockEvent) {
	ticker := time.NewTicker(k.interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		pingCtx, cancel := context.WithTimeout(ctx, lockPingTimeout(k.interval))
		_, err := k.tx.Exec(pingCtx, "SELECT 1")
		cancel()
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		send(ctx, events, lockEvent{state: lockLost, err: err})
		if err := k.retake(ctx); err != nil {
			if ctx.Err() == nil {
				send(ctx, events, lockEvent{state: lockSuperseded, err: err})
			}
			return
		}
		send(ctx, events, lockEvent{state: lockRegained})
	}
}

func send(ctx context.Context, ch chan<- lockEvent, e lockEvent) {
	select {
	case ch <- e:
	case <-ctx.Done():
	}
}

// retake takes the lock again under the same run, retrying until ctx ends:
// the runner's main loop bounds the attempt with reconnect_grace (it stops
// the command and then ctx). It fails for good when the run is no longer
// current.
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
		case errors.Is(err, etlcontext.ErrStaleRun), errors.Is(err, etlcontext.ErrFinished), errors.Is(err, etlcontext.ErrNotFound):
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

func (k *lockKeeper) tryRetake(ctx context.Context, oldPID uint32) error {
	// Connecting to a silent server must fail fast, to be tried again; the
	// statements after it may wait for a write connection that is being
	// made again too.
	dctx, dcancel := context.WithTimeout(ctx, 2*lockPingTimeout(k.interval))
	conn, err := connect(dctx, k.url, k.appName(), true)
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
	// A connection that went silent may still hold the lock on the server
	// until its keepalives give up: end it, if it is still this task's.
	if _, err := conn.Exec(cctx, `
		SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		 WHERE pid = $1 AND application_name = $2 AND datname = current_database()`,
		int32(oldPID), k.appName()); err != nil {
		k.logger.Warn("end the lost lock session", "backend_pid", oldPID, "error", err)
	}
	c, tx, err := lockOn(cctx, conn, k.contextID)
	if err != nil {
		return err
	}
	if c.Status.Finished() {
		return fmt.Errorf("etl context %d is %s: %w", c.ID, c.Status, etlcontext.ErrFinished)
	}
	if c.Status != etlcontext.StatusRunning || c.RunID == nil || *c.RunID != k.runID {
		return fmt.Errorf("etl context %d is %s under run %s: %w", c.ID, c.Status, deref(c.RunID), etlcontext.ErrStaleRun)
	}
	// Until a supervisor's mark of the loss is cleared, the loss counts: a
	// later loss must not be timed from this one.
	if err := k.w.do(cctx, func(ctx context.Context, conn *pgx.Conn) error {
		return etlcontext.ClearLockLost(ctx, conn, k.contextID, k.runID)
	}); err != nil {
		return err
	}
	ok = true
	k.conn, k.tx = conn, tx
	return nil
}

// release ends the lock transaction, waiting at most timeout for the server.
func (k *lockKeeper) release(ctx context.Context, timeout time.Duration) error {
	if k.conn == nil {
		return nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	err := k.tx.Rollback(rctx)
	k.conn.Close(rctx)
	if err != nil && !k.conn.IsClosed() {
		return fmt.Errorf("end lock transaction: %w", err)
	}
	return nil
}

// serverMajor returns the server's major version, 0 when unknown.
func serverMajor(conn *pgx.Conn) int {
	v := conn.PgConn().ParameterStatus("server_version")
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(v)
	}
	n, _ := strconv.Atoi(v[:end])
	return n
}

// connect opens a connection named for pg_stat_activity, so that an operator
// can tell a task's lock connection from its write connection. A lock
// connection asks the server for keepalives, so that the server releases
// the lock of a host that vanished.
func connect(ctx context.Context, url, name string, lock bool) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = name
	if lock {
		cfg.RuntimeParams["tcp_keepalives_idle"] = strconv.Itoa(int(keepaliveIdle.Seconds()))
		cfg.RuntimeParams["tcp_keepalives_interval"] = strconv.Itoa(int(keepaliveInterval.Seconds()))
		cfg.RuntimeParams["tcp_keepalives_count"] = strconv.Itoa(keepaliveCount)
		// Data the server sent that stays unacknowledged this long also ends
		// the session.
		cfg.RuntimeParams["tcp_user_timeout"] = strconv.Itoa(int(LockReleaseBound.Milliseconds()))
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect as %s: %w", name, err)
	}
	return conn, nil
}
