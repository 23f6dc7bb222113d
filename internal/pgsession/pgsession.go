// Package pgsession prepares the sessions dama keeps open for a long time
// (a task's lock and writes, a supervisor's pool, liveness lock and
// listener) against server settings that would end them.
package pgsession

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

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
