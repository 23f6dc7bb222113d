package etlcontext

// The errors of a PostgreSQL connection, sorted by what cures them:
// waiting for the server (it restarts, fails over, is full or out of
// reach), trying the same request again (the server turned it away for
// now), or nothing (the request itself is refused). Every part of dama
// that rides out a database outage asks here, so that they all agree.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrCode is err's SQLSTATE, or "" when the server did not answer with one.
func ErrCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// ConnectionLost reports a SQLSTATE that ends the session or refuses one:
// class 08 (connection exception), 57P01 to 57P05 (the server shutting
// down or crashed, not accepting connections yet, the database dropped,
// the session idle too long) and 53300 (too many connections).
func ConnectionLost(code string) bool {
	return len(code) == 5 && (code[:2] == "08" || code[:3] == "57P" || code == "53300")
}

// RequestRefused reports a SQLSTATE that the request itself causes, which no
// retry cures: data the database cannot store (class 22), a broken
// constraint (23), a program limit (54), or one of dama's guards (class
// DM, raised by its triggers).
func RequestRefused(code string) bool {
	return len(code) == 5 && slices.Contains([]string{"22", "23", "54", "DM"}, code[:2])
}

// Unreachable reports an error of the connection rather than of the
// request: no answer came (a refused or failed dial, a timeout, a
// connection closed under the request), or the server ended or refused
// the session (ConnectionLost). A new connection, later, may well succeed.
// A connection the server refused for a reason waiting does not cure (a
// password, a missing database) is not unreachable.
func Unreachable(err error) bool {
	if code := ErrCode(err); code != "" {
		return ConnectionLost(code)
	}
	var (
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.Timeout(err) ||
		pgconn.SafeToRetry(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// Transient reports an error that a later try of the same request may not
// meet: the database is unreachable, or the server turned the request away
// for now (class 40, a serialization failure or deadlock; 53, short of
// resources; 57, a statement cancelled or the server shutting down;
// 25006, a server read-only for a switchover, or a standby).
func Transient(err error) bool {
	if Unreachable(err) {
		return true
	}
	code := ErrCode(err)
	if len(code) != 5 {
		return errors.Is(err, context.DeadlineExceeded)
	}
	return code == "25006" || slices.Contains([]string{"40", "53", "57"}, code[:2])
}

// WaitReachable runs try until it succeeds, fails for another reason than
// the database's reach (Unreachable) or a server that takes no writes yet
// (25006: a standby that a switchover's DNS or proxy names before its
// promotion), or ctx ends, a second apart, and says so on logger at the
// first failure and every 30th: what a program that starts during a
// restart or failover does, rather than exit.
func WaitReachable(ctx context.Context, logger *slog.Logger, try func() error) error {
	start := time.Now()
	for tries := 1; ; tries++ {
		err := try()
		if err == nil {
			if tries > 1 {
				logger.Info("database reachable", "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		// A try cut short by ctx (a SIGTERM) is no sign of the database.
		if ctx.Err() != nil || !Unreachable(err) && ErrCode(err) != "25006" {
			return err
		}
		if tries == 1 || tries%30 == 0 {
			logger.Warn("database unreachable; waiting for it", "error", err, "for", time.Since(start).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("database unreachable: %w", err)
		case <-time.After(time.Second):
		}
	}
}

// ConnectFailed returns err with its failed connection, if any, in one
// line: what was tried and each distinct answer. pgx's message names the
// address two or three times, and every attempt: with sslmode=prefer, its
// default, a server without TLS is tried twice, and the first refusal is
// noise. The chain is err's (Unreachable reads it); other errors are
// returned as they are.
func ConnectFailed(err error) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return err
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
			add("no answer in time")
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
	brief := fmt.Sprintf("connect to database %s on %s as %s: %s", ce.Config.Database, where, ce.Config.User, strings.Join(answers, "; "))
	return &connectError{msg: strings.Replace(err.Error(), ce.Error(), brief, 1), err: err}
}

// connectError is an error whose failed connection ConnectFailed said in
// one line.
type connectError struct {
	msg string
	err error
}

func (e *connectError) Error() string { return e.msg }
func (e *connectError) Unwrap() error { return e.err }
