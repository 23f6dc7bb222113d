package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pgsession"
	"github.com/dama-etl/dama/taskrunner/protocol"
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

// A task process's lock connection is watched without a single statement:
// the runner waits on it, so a backend ended by the server (a restart,
// pg_terminate_backend) is noticed at once, and the kernel probes it when it
// has been silent for heartbeat_interval (TCP keepalive, client side), so a
// connection that went silent without a reset fails within LockSilenceBound.
// Nothing is sent to the server while all is well: a running task costs it
// no transaction and no statement.
const lockProbeCount = 3

// lockProbeIdle is how long the lock connection stays silent before the
// kernel probes it: heartbeat_interval, in the kernel's whole seconds.
func lockProbeIdle(heartbeat time.Duration) time.Duration {
	return max(heartbeat.Round(time.Second), time.Second)
}

// lockProbeInterval spaces the probes: half the idle time, within [1s, 5s].
func lockProbeInterval(heartbeat time.Duration) time.Duration {
	return min(max((heartbeat/2).Round(time.Second), time.Second), 5*time.Second)
}

// LockSilenceBound is how long after its lock connection went silent a task
// process notices: the idle time plus lockProbeCount unanswered probes.
func LockSilenceBound(heartbeat time.Duration) time.Duration {
	return lockProbeIdle(heartbeat) + lockProbeCount*lockProbeInterval(heartbeat)
}

// lockConnectTimeout bounds making a lock connection and taking the lock on
// it, so that a silent server is given up on and tried again.
func lockConnectTimeout(heartbeat time.Duration) time.Duration {
	return min(max(4*heartbeat, 2*time.Second), 20*time.Second)
}

// FenceWindow is how long a supervisor on another host, which cannot look
// at the processes, waits after it first found a task's lock free (timed on
// the database's clock) before it starts a new attempt. A live task process
// runs its command for at most this long after its lock was released: it
// notices the loss within LockSilenceBound, tries to take the lock again for
// reconnectGrace, then stops its command's process group (SIGTERM, SIGKILL
// after killGrace). A dead one's orphans are found by a supervisor of its
// host within pollInterval (twice that, for slack), which then holds the
// lock until they are gone.
func FenceWindow(heartbeat, reconnectGrace, killGrace, pollInterval time.Duration) time.Duration {
	return max(LockSilenceBound(heartbeat)+reconnectGrace+killGrace, 2*pollInterval) + fenceMargin
}

// lockState is what the lock keeper tells the runner's main loop.
type lockState int

const (
	// lockHeld: the lock is held (again, after a loss).
	lockHeld lockState = iota
	// lockLost: the lock connection failed; the keeper is trying to take
	// the lock again.
	lockLost
	// lockSuperseded: the run is no longer current (or the context
	// finished): the command must stop. It is final.
	lockSuperseded
)

// lockKeeper holds the task's lock and tells the runner's main loop, through
// its state and the changed channel, when it is lost, taken again or
// superseded. A state rather than a stream of events: the main loop only
// needs the latest, and whoever reports never waits for it.
//
// In row mode it owns a connection of its own, with the lock transaction
// left open on it, and watches it (watch). In advisory mode the lock is a
// session lock on the writer's connection, which the writer watches: the
// writer tells the keeper when that connection fails (lost) and has the
// keeper take the lock again first thing on every new one (resume).
type lockKeeper struct {
	url       string
	runKey    string // see Options.RunKey
	contextID int64
	runID     string
	mode      config.LockMode
	heartbeat time.Duration
	logger    *slog.Logger
	w         *writer

	mu       sync.Mutex
	state    lockState
	stateErr error
	changed  chan struct{}

	// Row mode: the lock connection and its transaction.
	conn *pgx.Conn
	tx   pgx.Tx
	// Advisory mode: the backend of the session that last held the lock.
	lastPID uint32
	// released is set by the first release (the runner's goroutine only);
	// releasing too, for the writer's goroutine to read.
	released  bool
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
// as it stands under the lock; etlcontext.ErrLocked when another process
// holds it. In advisory mode the connection is returned too, for the
// writer to adopt: it is the task's only connection.
func (k *lockKeeper) lock(ctx context.Context) (*etlcontext.Context, *pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, lockConnectTimeout(k.heartbeat))
	defer cancel()
	conn, err := connect(cctx, k.url, k.runKey, k.appName(), k.heartbeat)
	if err != nil {
		return nil, nil, err
	}
	// Before the lock: a runner the database no longer accepts touches
	// nothing.
	if err := etlcontext.CheckRunnerProtocol(cctx, conn, protocol.Version); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	if k.mode == config.LockModeAdvisory {
		c, err := etlcontext.LockSession(cctx, conn, k.contextID)
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, nil, err
		}
		k.lastPID = conn.PgConn().PID()
		return c, conn, nil
	}
	c, tx, err := lockOn(cctx, conn, k.contextID, k.runKey != "")
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	k.conn, k.tx = conn, tx
	return c, nil, nil
}

// lockOn opens the row-mode lock transaction on conn: the context's
// advisory lock, then its INITIAL event row FOR UPDATE, in a transaction
// that stays open.
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
	// CREATE INDEX CONCURRENTLY wait for the task to end.
	if err := dropSnapshot(ctx, tx); err != nil {
		return nil, nil, err
	}
	return c, tx, nil
}

// dropSnapshot ends the portal of the transaction's last query, which
// holds a snapshot: a statement without parameters (simple protocol) runs
// without one.
func dropSnapshot(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		return fmt.Errorf("end the lock query: %w", err)
	}
	return nil
}

// check makes sure, right before the command starts, that the lock is
// still held, and takes it again within grace if it was lost: nothing runs
// yet, so the runner may simply wait.
func (k *lockKeeper) check(ctx context.Context, grace time.Duration) error {
	if k.mode == config.LockModeAdvisory {
		// The writer takes the lock again on a new connection before it
		// runs anything there: a ping that succeeds went over a connection
		// that holds the lock.
		gctx, cancel := context.WithTimeout(ctx, lockConnectTimeout(k.heartbeat)+grace)
		defer cancel()
		return k.w.do(gctx, func(ctx context.Context, conn *pgx.Conn) error { return conn.Ping(ctx) })
	}
	pctx, cancel := context.WithTimeout(ctx, lockConnectTimeout(k.heartbeat))
	_, err := k.tx.Exec(pctx, "SELECT 1")
	cancel()
	if err == nil {
		return nil
	}
	k.logger.Warn("lock connection failed before the command started; taking the lock again", "error", err, "reconnect_grace", grace)
	rctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	return k.retake(rctx)
}

// set records the lock's state and wakes the main loop; a superseded run
// stays superseded.
func (k *lockKeeper) set(state lockState, err error) {
	k.mu.Lock()
	if k.state != lockSuperseded {
		k.state, k.stateErr = state, err
	}
	k.mu.Unlock()
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

// current returns the lock's state and what caused it.
func (k *lockKeeper) get() (lockState, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.state, k.stateErr
}

// watch waits on the row-mode lock connection until it fails or ctx ends;
// when it fails, it takes the lock again, reporting each change (set). In
// advisory mode the writer does the watching.
func (k *lockKeeper) watch(ctx context.Context) {
	if k.mode == config.LockModeAdvisory {
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
	if err := k.w.do(cctx, func(ctx context.Context, conn *pgx.Conn) error {
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
func (k *lockKeeper) endLostSession(ctx context.Context, conn *pgx.Conn, oldPID uint32) {
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

// lost is the writer telling an advisory-mode keeper that the connection
// holding the lock failed.
func (k *lockKeeper) lost(err error) { k.set(lockLost, err) }

// resume runs first on every new connection of an advisory-mode writer:
// it takes the lock again under the same run and clears the loss mark. A
// permanent error (the run is no longer current) supersedes the run; any
// other is tried again on another connection.
func (k *lockKeeper) resume(ctx context.Context, conn *pgx.Conn) error {
	if k.releasing.Load() {
		// The runner is ending: a lock taken now would outlive it.
		return fmt.Errorf("etl context %d: the runner released its lock: %w", k.contextID, etlcontext.ErrStaleRun)
	}
	k.endLostSession(ctx, conn, k.lastPID)
	c, err := etlcontext.LockSession(ctx, conn, k.contextID)
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
			err = errors.Join(err, etlcontext.UnlockSession(ctx, conn, k.contextID))
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
	k.lastPID = conn.PgConn().PID()
	k.logger.Info("lock taken again")
	k.set(lockHeld, nil)
	return nil
}

// release gives the lock back, once, waiting at most timeout for the
// server: row mode ends the lock transaction and its connection; advisory
// mode releases the session lock on the writer's connection.
func (k *lockKeeper) release(ctx context.Context, timeout time.Duration) error {
	if k.released {
		return nil
	}
	k.released = true
	k.releasing.Store(true)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if k.mode == config.LockModeAdvisory {
		if k.w == nil {
			return nil
		}
		return k.w.do(rctx, func(ctx context.Context, conn *pgx.Conn) error {
			return etlcontext.UnlockSession(ctx, conn, k.contextID)
		})
	}
	if k.conn == nil {
		return nil
	}
	err := k.tx.Rollback(rctx)
	k.conn.Close(rctx)
	if err != nil && !k.conn.IsClosed() {
		return fmt.Errorf("end lock transaction: %w", err)
	}
	return nil
}

// connect opens a connection named for pg_stat_activity, so that an operator
// can tell a task's lock connection from its write connection, holding
// runKey, when set, for the rest of the session. With
// heartbeat > 0 it asks the server for keepalives, so that the server
// releases the lock of a host that vanished, and has the kernel probe it,
// so that the runner notices a server that went silent (a lost write
// connection would lose cancellations).
func connect(ctx context.Context, url, runKey, name string, heartbeat time.Duration) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = name
	if runKey != "" {
		// In the startup packet: no statement log shows it.
		cfg.RuntimeParams[etlcontext.RunKeySetting] = runKey
	}
	if heartbeat > 0 {
		cfg.RuntimeParams["tcp_keepalives_idle"] = strconv.Itoa(int(keepaliveIdle.Seconds()))
		cfg.RuntimeParams["tcp_keepalives_interval"] = strconv.Itoa(int(keepaliveInterval.Seconds()))
		cfg.RuntimeParams["tcp_keepalives_count"] = strconv.Itoa(keepaliveCount)
		// Data the server sent that stays unacknowledged this long also ends
		// the session.
		cfg.RuntimeParams["tcp_user_timeout"] = strconv.Itoa(int(LockReleaseBound.Milliseconds()))
		cfg.DialFunc = probingDialer(heartbeat).DialContext
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect as %s: %w", name, err)
	}
	if err := pgsession.KeepIdle(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return conn, nil
}

// probingDialer dials TCP connections that the kernel probes after
// heartbeat of silence and gives up on after LockSilenceBound without an
// answer, whether it waited for a probe's or for a write's
// acknowledgement (TCP_USER_TIMEOUT). Unix sockets cannot go silent.
func probingDialer(heartbeat time.Duration) *net.Dialer {
	bound := LockSilenceBound(heartbeat)
	return &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     lockProbeIdle(heartbeat),
			Interval: lockProbeInterval(heartbeat),
			Count:    lockProbeCount,
		},
		Control: func(network, _ string, rc syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				return nil
			}
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(bound.Milliseconds()))
			}); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("set TCP_USER_TIMEOUT: %w", serr)
			}
			return nil
		},
	}
}
