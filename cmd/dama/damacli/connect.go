package damacli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pgsession"
	"github.com/dama-etl/dama/sql"
)

// connect opens a pool on DATABASE_URL of at least minConns connections,
// unless the URL sets pool_max_conns, and checks that the database
// answers: a failure is one clear error before anything else.
func connect(ctx context.Context, minConns int32, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, string, error) {
	// From the environment only, so that credentials never appear in a
	// process listing.
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return nil, "", errors.New("DATABASE_URL is not set")
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, "", badURL(url, err)
	}
	if !strings.Contains(url, "pool_max_conns") {
		pcfg.MaxConns = max(pcfg.MaxConns, minConns)
	}
	// River's listener waits idle on one of these connections for hours.
	pcfg.AfterConnect = pgsession.KeepIdle
	pgsession.ReadCommitted(pcfg.ConnConfig)
	for _, c := range configure {
		c(pcfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, "", connectFailed(err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, "", connectFailed(err)
	}
	return pool, url, nil
}

// connectMigrated is connect for the commands that need dama's schema.
func connectMigrated(ctx context.Context, minConns int32, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, string, error) {
	pool, url, err := connect(ctx, minConns, configure...)
	if err != nil {
		return nil, "", err
	}
	if err := sql.CheckMigrated(ctx, pool); err != nil {
		pool.Close()
		return nil, "", err
	}
	return pool, url, nil
}

// waitForDatabase is connectMigrated that waits, until ctx ends and
// reporting the wait, for a database that restarts or fails over: for
// whatever etlcontext.Unreachable says a later connection may cure (a full
// server, a host name that does not resolve yet after a failover). An
// unmigrated database, a malformed URL or a refused login is an error at once.
func waitForDatabase(ctx context.Context, logger *slog.Logger, minConns int32, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, string, error) {
	var (
		pool *pgxpool.Pool
		url  string
	)
	err := etlcontext.WaitReachable(ctx, logger, func() (err error) {
		pool, url, err = connectMigrated(ctx, minConns, configure...)
		return err
	})
	return pool, url, err
}

// closeIdle closes a pool's connections idle for 30s, within a minute,
// unless the URL sets pool_max_conn_idle_time or pool_health_check_period:
// a supervisor whose tasks are quiet keeps the few its loops use, not the
// most they needed at once (pgxpool's default keeps them 30 minutes).
func closeIdle(c *pgxpool.Config) {
	if !strings.Contains(c.ConnString(), "pool_max_conn_idle_time") {
		c.MaxConnIdleTime = 30 * time.Second
	}
	if !strings.Contains(c.ConnString(), "pool_health_check_period") {
		c.HealthCheckPeriod = 30 * time.Second
	}
}

// badURL says what is wrong with DATABASE_URL, url, that pgx refused with
// err, whose message masks the password but reads a misspelt scheme as a
// keyword/value string.
func badURL(url string, err error) error {
	if scheme, _, ok := strings.Cut(url, "://"); ok && urlScheme.MatchString(scheme) && scheme != "postgres" && scheme != "postgresql" {
		return fmt.Errorf("DATABASE_URL's scheme %s is not postgres:// or postgresql://", quoteArg(scheme))
	}
	return fmt.Errorf("DATABASE_URL: %w", err)
}

// urlScheme is RFC 3986's scheme: what precedes :// in a keyword/value
// string (password=a://b) is not one, and is not shown.
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// connectFailed describes err, a failed connection, in one line
// (etlcontext.ConnectFailed).
func connectFailed(err error) error {
	if errors.As(err, new(*pgconn.ConnectError)) {
		return etlcontext.ConnectFailed(err)
	}
	return fmt.Errorf("connect to database: %w", err)
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("invalid task id %q: want a positive integer", s)
	}
	return id, nil
}
