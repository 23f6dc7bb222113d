package taskrunner

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
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
func (k *lockKeeper) lock(ctx context.Context) (*etlcontext.Context, dbConn, error) {
	cctx, cancel := context.WithTimeout(ctx, firstLockTimeout(k.heartbeat))
	defer cancel()
	if k.mode != config.LockModeRow {
		conn, err := k.dial(cctx)
		if err != nil {
			return nil, nil, err
		}
		// Before the lock: a runner the database no longer accepts
		// touches nothing.
		if err := etlcontext.CheckRunnerProtocol(cctx, conn, protocol.Version); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, nil, err
		}
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
	if err := etlcontext.CheckRunnerProtocol(cctx, conn, protocol.Version); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	c, tx, err := lockOn(cctx, conn, k.contextID, k.runKey != "")
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	k.conn, k.tx, k.lastPID = conn, tx, conn.PgConn().PID()
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
// yet, so the runner may simply wait. It returns the losses counted up to
// the moment the lock was last seen held: any later one is the command's
// to ride out.
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
	return losses, ln.Reopen(rctx)
}

// set records the lock's state and wakes the main loop; a superseded run
// stays superseded.
func (k *lockKeeper) set(state lockState, err error) {
	k.mu.Lock()
	if k.state != lockSuperseded {
		k.state, k.stateErr = state, err
		if state == lockLost {
			k.losses++
		}
	}
	k.mu.Unlock()
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

// get returns the lock's state, how many times the lock was lost so far,
// and what caused the state.
func (k *lockKeeper) get() (lockState, int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.state, k.losses, k.stateErr
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
	if k.mode != config.LockModeRow {
		if k.w == nil {
			return nil
		}
		return k.w.do(rctx, func(ctx context.Context, conn dbConn) error {
			return conn.unlockSession(ctx, k.contextID)
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
	setKeepalives(cfg, heartbeat)
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

// setKeepalives, with heartbeat > 0, asks the server for keepalives on
// cfg's connections, so that it releases the locks of a host that
// vanished, and has the kernel probe them (see connect).
func setKeepalives(cfg *pgx.ConnConfig, heartbeat time.Duration) {
	if heartbeat <= 0 {
		return
	}
	cfg.RuntimeParams["tcp_keepalives_idle"] = strconv.Itoa(int(keepaliveIdle.Seconds()))
	cfg.RuntimeParams["tcp_keepalives_interval"] = strconv.Itoa(int(keepaliveInterval.Seconds()))
	cfg.RuntimeParams["tcp_keepalives_count"] = strconv.Itoa(keepaliveCount)
	// Data the server sent that stays unacknowledged this long also ends
	// the session.
	cfg.RuntimeParams["tcp_user_timeout"] = strconv.Itoa(int(LockReleaseBound.Milliseconds()))
	cfg.DialFunc = probingDialer(heartbeat).DialContext
}
