package damacli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
func waitForDatabase(ctx context.Context, logger *slog.Logger, minConns int32) (*pgxpool.Pool, string, error) {
	var (
		pool *pgxpool.Pool
		url  string
	)
	err := etlcontext.WaitReachable(ctx, logger, func() (err error) {
		pool, url, err = connectMigrated(ctx, minConns)
		return err
	})
	return pool, url, err
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

// connectError is a failed connection in one line, its chain pgx's (which
// etlcontext.Unreachable reads).
type connectError struct {
	msg string
	err error
}

func (e *connectError) Error() string { return e.msg }
func (e *connectError) Unwrap() error { return e.err }

// connectFailed describes err, a failed connection: what was tried and
// each distinct answer. pgx's message names every attempt: with
// sslmode=prefer, its default, a server without TLS is tried twice, and
// the first refusal is noise.
func connectFailed(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return fmt.Errorf("connect to database: %w", err)
	}
	var answers []string
	add := func(a string) {
		if !slices.Contains(answers, a) {
			answers = append(answers, a)
		}
	}
	attempts := []error{errors.Unwrap(ce)}
	if joined, ok := attempts[0].(interface{ Unwrap() []error }); ok {
		attempts = joined.Unwrap()
	}
	tls := false
	for _, a := range attempts {
		var pgErr *pgconn.PgError
		var errno syscall.Errno
		var dnsErr *net.DNSError
		switch {
		case a == nil:
		case errors.As(a, &dnsErr):
			add(fmt.Sprintf("host %s: %s", dnsErr.Name, dnsErr.Err))
		case errors.As(a, &pgErr):
			add(fmt.Sprintf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code))
		case strings.Contains(a.Error(), "tls error: server refused TLS connection"):
			tls = true
		case errors.As(a, &errno):
			add(errno.Error())
		case errors.Is(a, context.DeadlineExceeded):
			add("no answer within 10s")
		default:
			add(a.Error())
		}
	}
	if len(answers) == 0 && tls {
		add("the server refused TLS")
	}
	where := ce.Config.Host
	if !strings.HasPrefix(where, "/") {
		where = net.JoinHostPort(where, strconv.Itoa(int(ce.Config.Port)))
	}
	return &connectError{
		msg: fmt.Sprintf("connect to database %s on %s as %s: %s", ce.Config.Database, where, ce.Config.User, strings.Join(answers, "; ")),
		err: err,
	}
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("invalid task id %q: want a positive integer", s)
	}
	return id, nil
}
