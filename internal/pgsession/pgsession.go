// Package pgsession prepares the sessions dama keeps open for a long time
// (a task's lock and writes, a supervisor's pool, liveness lock and
// listener) against server settings that would end them.
package pgsession

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server-side TCP keepalives. Without them the server holds the session
// of a host that vanished, and its locks, until the kernel gives up on the
// socket, about 2h11m with Linux's defaults; with them it ends the session
// at most ReleaseBound after the last packet it received.
const (
	keepaliveIdle     = 10 * time.Second
	keepaliveInterval = 5 * time.Second
	keepaliveCount    = 3
	// ReleaseBound is how long after a host went silent the server ends
	// its sessions that EndWhenSilent prepared, releasing their locks.
	ReleaseBound = keepaliveIdle + keepaliveCount*keepaliveInterval
)

// ReadCommitted makes, in cfg, READ COMMITTED the session's isolation,
// whatever the database's or role's default: dama's functions read, after
// they take a lock, what committed before it (lock_run, lock_step,
// start_attempt), and refuse a snapshot older than that.
func ReadCommitted(cfg *pgx.ConnConfig) {
	cfg.RuntimeParams["default_transaction_isolation"] = "read committed"
}

// EndWhenSilent asks the server, in cfg, to end the session within
// ReleaseBound of its client going silent: a task's lock connection, a
// supervisor's liveness connection.
func EndWhenSilent(cfg *pgx.ConnConfig) {
	cfg.RuntimeParams["tcp_keepalives_idle"] = strconv.Itoa(int(keepaliveIdle.Seconds()))
	cfg.RuntimeParams["tcp_keepalives_interval"] = strconv.Itoa(int(keepaliveInterval.Seconds()))
	cfg.RuntimeParams["tcp_keepalives_count"] = strconv.Itoa(keepaliveCount)
	// Data the server sent that stays unacknowledged this long also ends
	// the session.
	cfg.RuntimeParams["tcp_user_timeout"] = strconv.Itoa(int(ReleaseBound.Milliseconds()))
}

// ServerMajor returns the major version of conn's server, 0 when unknown.
func ServerMajor(conn *pgx.Conn) int {
	v := conn.PgConn().ParameterStatus("server_version")
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(v)
	}
	n, _ := strconv.Atoi(v[:end])
	return n
}

// KeepIdle turns off, for conn's session, the server's idle_session_timeout
// (PostgreSQL 14+): dama's sessions wait idle for hours by design, and one
// ended by the server would cost a task its advisory lock, or a supervisor
// its liveness lock.
func KeepIdle(ctx context.Context, conn *pgx.Conn) error {
	if ServerMajor(conn) < 14 {
		return nil
	}
	if _, err := conn.Exec(ctx, "SET idle_session_timeout = 0"); err != nil {
		return fmt.Errorf("disable idle_session_timeout: %w", err)
	}
	return nil
}
