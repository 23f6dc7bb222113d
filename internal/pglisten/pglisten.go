// Package pglisten keeps a PostgreSQL connection of its own open, listening
// on channels, connects again when it fails, and hands its notifications
// on. A notification is a hint: what it announces is looked up (Look) once
// listening has begun on each connection, so that nothing announced while
// no connection listened is missed, and again every Recheck. A connection
// with no channels is kept and watched all the same: a connection that
// holds a session lock. (A task process's writer listens on the
// connection it writes on instead: a connection of its own per task is
// what lock_mode advisory saves.)
package pglisten

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrStop, returned by Look or Notify, ends Serve with no error.
var ErrStop = errors.New("stop listening")

// Listener is one listening connection and what to do with what it
// hears. Connect and Notify are required; the rest is optional.
type Listener struct {
	// Connect opens a connection of the listener's own: a pooled one would
	// keep listening for its next user.
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// Channels are listened to on every connection.
	Channels []string
	// Look is called with the connection once listening has begun on
	// it, before any notification is handed on, and every Recheck: it
	// looks at what the notifications announce, or at the connection
	// itself. nil means nothing to look at.
	Look func(ctx context.Context, conn *pgx.Conn) error
	// Notify handles a notification; nil for a listener of no channels.
	Notify func(ctx context.Context, n *pgconn.Notification) error
	// Recheck, above 0, is how often Look is called again, whatever
	// notifications arrive meanwhile; 0 means only on a new connection.
	Recheck time.Duration
	// RetryDelay spaces the tries to connect again after a failure: the
	// first try is at once when the connection had served (at most once
	// per RetryDelay), and then one every RetryDelay. 0 means 1s.
	RetryDelay time.Duration
	// Failed is told each failure (to connect, to listen, of the
	// connection, or an error of Look or Notify), and says whether to
	// connect again after RetryDelay; nil means always. The connection is
	// dropped either way.
	Failed func(err error) bool
	// Reconnected, when set, is told each connection after the first.
	Reconnected func()

	conn      *pgx.Conn
	connected bool
}

// Open opens the listener's connection, if it has none, and listens on it:
// the first connection of a caller that reports its failure itself. It
// does not Look.
func (l *Listener) Open(ctx context.Context) error {
	if l.conn != nil {
		return nil
	}
	conn, err := l.Connect(ctx)
	if err != nil {
		return err
	}
	for _, ch := range l.Channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return fmt.Errorf("listen on %s: %w", ch, err)
		}
	}
	if l.connected && l.Reconnected != nil {
		l.Reconnected()
	}
	l.conn, l.connected = conn, true
	return nil
}

// Serve hands notifications on until ctx ends (it then returns nil), Look
// or Notify returns ErrStop (nil), or Failed says not to go on (the
// failure). It opens the connection when there is none, and again after
// each failure.
func (l *Listener) Serve(ctx context.Context) error {
	defer l.Close(ctx)
	var atOnce time.Time // when a connection was last tried again at once
	for {
		served, err := l.serve(ctx)
		switch {
		case errors.Is(err, ErrStop), ctx.Err() != nil:
			return nil
		case l.Failed != nil && !l.Failed(err):
			return err
		}
		l.Close(ctx)
		if served && time.Since(atOnce) >= cmpOr(l.RetryDelay, time.Second) {
			// A connection that served fails: the next one is tried at
			// once (a session lock is missing meanwhile), then no faster
			// than RetryDelay, however often the server ends them.
			atOnce = time.Now()
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(cmpOr(l.RetryDelay, time.Second)):
		}
	}
}

// serve serves one connection until it fails; served reports that it got
// as far as waiting for notifications.
func (l *Listener) serve(ctx context.Context) (served bool, err error) {
	if err := l.Open(ctx); err != nil {
		return false, err
	}
	look := func() error {
		if l.Look == nil {
			return nil
		}
		return l.Look(ctx, l.conn)
	}
	if err := look(); err != nil {
		return false, err
	}
	// Looks come every Recheck however many notifications arrive between
	// them: every task's end is announced on one channel.
	nextLook := time.Now().Add(l.Recheck)
	for {
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if l.Recheck > 0 {
			wctx, cancel = context.WithDeadline(ctx, nextLook)
		}
		n, err := l.conn.WaitForNotification(wctx)
		timedOut := wctx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return true, ctx.Err()
		case n != nil && err == nil:
			// Handed on even when the deadline passed meanwhile: pgx
			// gives a notification it had read already.
			if l.Notify != nil {
				if err := l.Notify(ctx, n); err != nil {
					return true, err
				}
			}
		case !timedOut:
			return true, fmt.Errorf("wait on the connection: %w", err)
		}
		if timedOut || (l.Recheck > 0 && !time.Now().Before(nextLook)) {
			err := look()
			// From the look's end: a slow look is not followed by another
			// at once.
			nextLook = time.Now().Add(l.Recheck)
			if err != nil {
				return true, err
			}
		}
	}
}

// Close closes the listener's connection, if open.
func (l *Listener) Close(ctx context.Context) {
	if l.conn != nil {
		l.conn.Close(context.WithoutCancel(ctx))
		l.conn = nil
	}
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
