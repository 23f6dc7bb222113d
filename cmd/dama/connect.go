package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/internal/pgerr"
	"github.com/dama-etl/dama/internal/pgsession"
	"github.com/dama-etl/dama/sql"
)

// connect opens a pool on DATABASE_URL and checks that the database answers
// and is migrated, so that either is one clear error before anything else.
func connect(ctx context.Context) (*pgxpool.Pool, string, error) {
	return connectSized(ctx, 0)
}

// connectSized is connect with a pool of at least minConns connections,
// unless DATABASE_URL sets pool_max_conns itself.
func connectSized(ctx context.Context, minConns int32) (*pgxpool.Pool, string, error) {
	url, err := databaseURL()
	if err != nil {
		return nil, "", err
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, "", fmt.Errorf("DATABASE_URL: %w", err)
	}
	if !strings.Contains(url, "pool_max_conns") {
		pcfg.MaxConns = max(pcfg.MaxConns, minConns)
	}
	// River's listener waits idle on one of these connections for hours.
	pcfg.AfterConnect = pgsession.KeepIdle
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, "", fmt.Errorf("connect to database: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("connect to database: %w", err)
	}
	return pool, url, nil
}

// connectMigrated is connect for the commands that need dama's schema.
func connectMigrated(ctx context.Context, minConns int32) (*pgxpool.Pool, string, error) {
	pool, url, err := connectSized(ctx, minConns)
	if err != nil {
		return nil, "", err
	}
	if err := sql.CheckMigrated(ctx, pool); err != nil {
		pool.Close()
		return nil, "", err
	}
	return pool, url, nil
}

// waitForDatabase is connectMigrated that waits, until ctx ends, for a
// database that restarts or fails over (a supervisor that systemd restarts
// meanwhile, say), reporting the wait: whatever pgerr.Unreachable says a
// later connection may cure, a full server among them. An unmigrated
// database, a malformed URL or a login the server refuses (a password, a
// missing database) is an error at once; a host name that does not
// resolve is waited for, as a failover's DNS change may need.
func waitForDatabase(ctx context.Context, logger *slog.Logger, minConns int32) (*pgxpool.Pool, string, error) {
	start := time.Now()
	for tries := 1; ; tries++ {
		pool, url, err := connectMigrated(ctx, minConns)
		if err == nil {
			if tries > 1 {
				logger.Info("database reachable", "waited", time.Since(start).Round(time.Millisecond))
			}
			return pool, url, nil
		}
		if !pgerr.Unreachable(err) {
			return nil, "", err
		}
		if tries == 1 || tries%30 == 0 {
			logger.Warn("database unreachable; waiting for it", "error", err, "for", time.Since(start).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return nil, "", fmt.Errorf("database unreachable: %w", err)
		case <-time.After(time.Second):
		}
	}
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("invalid etl context id %q: want a positive integer", s)
	}
	return id, nil
}

// openContext parses a context id argument and connects; the caller closes
// the pool.
func openContext(ctx context.Context, arg string) (int64, *pgxpool.Pool, error) {
	id, err := parseID(arg)
	if err != nil {
		return 0, nil, err
	}
	pool, _, err := connectMigrated(ctx, 0)
	if err != nil {
		return 0, nil, err
	}
	return id, pool, nil
}
