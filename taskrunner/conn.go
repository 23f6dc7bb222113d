package taskrunner

import (
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/keeper"
	"github.com/dama-etl/dama/internal/pgsession"
	"github.com/dama-etl/dama/protocol"
)

// dbConn is a session the runner writes through: a connection of its own,
// or in host lock mode its session with the host's lock keeper, which runs
// its statements on a pool and holds its lock while the session lasts.
type dbConn interface {
	etlcontext.DB
	Begin(ctx context.Context) (pgx.Tx, error)
	Ping(ctx context.Context) error
	IsClosed() bool
	Close(ctx context.Context) error
	WaitForNotification(ctx context.Context) (*pgconn.Notification, error)
	// listen passes on channel's notifications from now on.
	listen(ctx context.Context, channel string) error
	// lockSession takes the context's lock for the session's life, once
	// the database accepts this release's protocol, and returns the
	// context as it stands under it (etlcontext.LockRun).
	lockSession(ctx context.Context, id int64) (*etlcontext.Context, error)
	// unlockSession releases it, and with announce tells the supervisors
	// that the task process ends.
	unlockSession(ctx context.Context, id int64, announce bool) error
	// backendPID is the server's process of the session's lock, 0 when it
	// is not the runner's to end (the keeper's).
	backendPID() uint32
}

// pgxConn is a connection of the runner's own.
type pgxConn struct{ *pgx.Conn }

func (c pgxConn) listen(ctx context.Context, channel string) error {
	_, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	return err
}

func (c pgxConn) lockSession(ctx context.Context, id int64) (*etlcontext.Context, error) {
	// The session holds the run's key since it connected.
	return etlcontext.LockRun(ctx, c.Conn, id, protocol.Version, nil)
}

func (c pgxConn) unlockSession(ctx context.Context, id int64, announce bool) error {
	return etlcontext.UnlockSession(ctx, c.Conn, id, announce)
}

func (c pgxConn) backendPID() uint32 { return c.PgConn().PID() }

// keeperConn is a session with the host's lock keeper.
type keeperConn struct{ *keeper.Conn }

func (c keeperConn) listen(ctx context.Context, channel string) error { return c.Listen(ctx, channel) }

func (c keeperConn) lockSession(ctx context.Context, id int64) (*etlcontext.Context, error) {
	rows, err := c.Lock(ctx, protocol.Version)
	return etlcontext.ScanLockRun(id, rows, err)
}

func (c keeperConn) unlockSession(ctx context.Context, _ int64, announce bool) error {
	return c.Unlock(ctx, announce)
}

func (keeperConn) backendPID() uint32 { return 0 }

// connect opens a connection named for pg_stat_activity (an operator tells the
// lock's from the writer's), holding runKey, when set, with keepalives.
func connect(ctx context.Context, url, runKey, name string, heartbeat time.Duration) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.RuntimeParams["application_name"] = name
	pgsession.ReadCommitted(cfg)
	if runKey != "" {
		// In the startup packet: no statement log shows it.
		cfg.RuntimeParams[etlcontext.RunKeySetting] = runKey
	}
	setKeepalives(cfg, heartbeat)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, etlcontext.ConnectFailed(err))
	}
	if err := pgsession.KeepIdle(ctx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return conn, nil
}

// setKeepalives, with heartbeat > 0, asks the server for keepalives, so that
// it releases the locks of a host that vanished, and has the kernel probe
// too, so that the runner notices a server gone silent.
func setKeepalives(cfg *pgx.ConnConfig, heartbeat time.Duration) {
	if heartbeat <= 0 {
		return
	}
	pgsession.EndWhenSilent(cfg)
	cfg.DialFunc = probingDialer(heartbeat).DialContext
}

// fenceMargin covers what the bounds below do not: scheduling delays and
// the difference between the runner's clock rate and the database's.
const fenceMargin = 2 * time.Second

// A task process's lock connection is watched without a single statement:
// a backend ended by the server is noticed at once, and the kernel probes
// a connection silent for heartbeat_interval (TCP keepalive), so that one
// gone silent fails within LockSilenceBound. A running task costs the
// server no statement.
const lockProbeCount = 3

// lockProbeIdle is heartbeat_interval in the kernel's whole seconds.
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

// lockConnectTimeout bounds taking the lock on a new connection: a silent server is tried again.
func lockConnectTimeout(heartbeat time.Duration) time.Duration {
	return min(max(4*heartbeat, 2*time.Second), 20*time.Second)
}

// firstLockTimeout bounds the first take of the lock. Nothing runs yet, so
// a slow start is waited on like any statement, rather than given up on as
// a silent server: a CI host at load 17 on 2 cores took 1.7 s to start a
// lock keeper and 2.3 s to open a session with it. Past the supervisor's
// launch timeout (10 s too) a step may give the launch back, under the
// lock: the runner then finds its run is no longer current, and exits.
func firstLockTimeout(heartbeat time.Duration) time.Duration {
	return max(lockConnectTimeout(heartbeat), stmtTimeout)
}

// FenceWindow is how long a supervisor on another host, which cannot look
// at the processes, waits after it first found a task's lock free (on the
// database's clock) before it starts a new attempt. A live task process
// notices the loss within LockSilenceBound, tries to take the lock again for
// reconnectGrace, then stops its command (SIGKILL after killGrace); a dead
// one's orphans are found by a supervisor of its host within pollInterval
// (twice that, for slack), which holds the lock until they are gone.
func FenceWindow(heartbeat, reconnectGrace, killGrace, pollInterval time.Duration) time.Duration {
	return max(LockSilenceBound(heartbeat)+reconnectGrace+killGrace, 2*pollInterval) + fenceMargin
}

// probingDialer dials TCP connections that the kernel probes after
// heartbeat of silence and gives up on after LockSilenceBound without an
// answer, to a probe or a write (TCP_USER_TIMEOUT).
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
