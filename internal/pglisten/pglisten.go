// Package pglisten is dama's one loop around a connection it waits on: it
// keeps the connection open, hands its notifications on, does what is
// queued for it between two waits, and connects again when it fails.
//
// A notification is a hint: what it announces is looked up (Look) once
// the connection is open, so that nothing announced while no connection
// listened is missed, and again every Recheck. A connection with no
// channels is kept and watched all the same: one that holds a lock.
package pglisten

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrStop, returned by Look or Notify, ends Serve with no error.
var ErrStop = errors.New("stop listening")

// errClosed is the failure of a connection found closed between two waits.
var errClosed = errors.New("the connection closed")

// Conn is a connection a Listener waits on: a *pgx.Conn, or a session that
// passes a connection's notifications on (a task process's session with
// its host's lock keeper).
type Conn interface {
	WaitForNotification(ctx context.Context) (*pgconn.Notification, error)
	IsClosed() bool
	Close(ctx context.Context) error
}

// Listener is one connection and what to do with it. Connect is required;
// the rest is optional.
type Listener[C Conn] struct {
	// Connect opens a connection of the listener's own (a pooled one would
	// keep listening for its next user), listening on its channels
	// (Listen) and ready for Look.
	Connect func(ctx context.Context) (C, error)
	// Look is called with the connection once it is open, before any
	// notification is handed on, again every Recheck, and after each
	// receive from Wake: it looks at what the notifications announce, or
	// does on the connection what was queued.
	Look func(ctx context.Context, conn C) error
	// Notify handles a notification; nil ignores them.
	Notify func(ctx context.Context, n *pgconn.Notification) error
	// Wake, when not nil, cuts a wait short: on the connection, to Look,
	// or between two tries to connect, to try at once.
	Wake <-chan struct{}
	// Recheck, above 0, is how often Look is called again, whatever
	// notifications arrive meanwhile.
	Recheck time.Duration
	// RetryDelay is the longest wait between two tries to connect after a
	// failure: the first try is at once when the connection had lasted at
	// least RetryDelay; otherwise each try waits twice as long as the one
	// before, from 100ms (or RetryDelay, if less) up to RetryDelay. A Wake
	// hurries a try, but not to within 100ms of the one before. 0 means
	// 1s.
	RetryDelay time.Duration
	// Lost is told that a connection that was open failed, once it is
	// closed, before Failed.
	Lost func(err error)
	// Failed is told each failure (to connect, of the connection, or an
	// error of Look or Notify), and says whether to connect again; nil
	// means always. The connection is closed either way.
	Failed func(err error) bool
	// Reconnected is told each connection after the first.
	Reconnected func()
	// KeepOpen leaves the connection open when ctx ends Serve, for the
	// caller to use or close: the connection that holds a lock outlives
	// the watch of it.
	KeepOpen bool

	conn      C
	open      bool
	connected bool
	// openedAt is when Connect last opened one (Use's age is unknown: its
	// loss is tried again at once); delay, the last wait before a try to
	// connect, is not reset by a connection that fails soon after it opened.
	openedAt time.Time
	delay    time.Duration
}

// Listen listens on channels on conn, as a Connect does.
func Listen(ctx context.Context, conn *pgx.Conn, channels ...string) error {
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("listen on %s: %w", ch, err)
		}
	}
	return nil
}

// Use makes conn, a first connection its caller made, the listener's.
func (l *Listener[C]) Use(conn C) { l.conn, l.open, l.connected = conn, true, true }

// Open opens the listener's connection, if it has none, without Look: the
// first connection of a caller that reports its failure itself.
func (l *Listener[C]) Open(ctx context.Context) error {
	if l.open {
		return nil
	}
	conn, err := l.Connect(ctx)
	if err != nil {
		return err
	}
	if l.connected && l.Reconnected != nil {
		l.Reconnected()
	}
	l.Use(conn)
	l.openedAt = time.Now()
	return nil
}

// Serve waits on the connection, opened as needed, and hands notifications
// on until ctx ends or Look or Notify returns ErrStop (it then returns
// nil), or Failed says not to go on (it returns the failure).
func (l *Listener[C]) Serve(ctx context.Context) error {
	if !l.KeepOpen {
		defer l.Close(ctx)
	}
	for {
		if err := l.Reopen(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		err := l.serve(ctx)
		if errors.Is(err, ErrStop) || ctx.Err() != nil {
			return nil
		}
		l.Close(ctx)
		if l.Lost != nil {
			l.Lost(err)
		}
		if l.Failed != nil && !l.Failed(err) {
			return err
		}
	}
}

// Reopen returns nil once the listener has a connection, trying Connect
// again after each failure that Failed allows (see RetryDelay). It returns
// the failure Failed does not allow, or ctx's error.
func (l *Listener[C]) Reopen(ctx context.Context) error {
	if l.open {
		return nil
	}
	retry := cmp.Or(l.RetryDelay, time.Second)
	next := func() { l.delay = min(max(2*l.delay, minRetry), retry) }
	if time.Since(l.openedAt) >= retry {
		l.delay = 0
	} else {
		// It failed soon after it opened: a server that takes connections
		// and ends them at once is no faster to connect to than one that
		// refuses them.
		next()
	}
	tried := l.openedAt
	for {
		if l.delay > 0 {
			if err := l.pause(ctx, tried); err != nil {
				return err
			}
		}
		tried = time.Now()
		err := l.Open(ctx)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case l.Failed != nil && !l.Failed(err):
			return err
		}
		next()
	}
}

const minRetry = 100 * time.Millisecond

// pause waits l.delay before a try to connect, or less after a Wake, but
// at least until minRetry after the last try (tried).
func (l *Listener[C]) pause(ctx context.Context, tried time.Time) error {
	t := time.NewTimer(l.delay)
	defer t.Stop()
	wake := l.Wake
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case <-wake:
			// Hurried, once: a flood of wakes against a server refusing
			// connections makes no storm of tries.
			wake = nil
			t.Reset(time.Until(tried.Add(minRetry)))
		}
	}
}

func (l *Listener[C]) serve(ctx context.Context) error {
	if err := l.look(ctx); err != nil {
		return err
	}
	// Looks come every Recheck however many notifications arrive between
	// them: every task's end is announced on one channel.
	nextLook := time.Now().Add(l.Recheck)
	done, cancel := context.WithCancel(ctx)
	cancel()
	for {
		if l.conn.IsClosed() {
			return errClosed
		}
		n, woken, interrupted, err := l.wait(ctx, nextLook)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil:
			// Handed on even when the deadline passed meanwhile: pgx
			// gives a notification it had read already. So are the others
			// it has read (while Look ran statements), which a wait on a
			// done context returns without waiting.
			for ; n != nil && l.Notify != nil; n, _ = l.conn.WaitForNotification(done) {
				if err := l.Notify(ctx, n); err != nil {
					return err
				}
			}
		case !interrupted:
			// Closed whatever the error: pgconn keeps a connection whose
			// read timed out, and a kernel that gave up on a silent
			// server reports a timeout too.
			return fmt.Errorf("wait on the connection: %w", err)
		}
		recheck := l.Recheck > 0 && !time.Now().Before(nextLook)
		if woken || recheck {
			err := l.look(ctx)
			if recheck {
				// From the look's end: a slow look is not followed by
				// another at once.
				nextLook = time.Now().Add(l.Recheck)
			}
			if err != nil {
				return err
			}
		}
	}
}

// wait waits on the connection for a notification until the next Recheck
// or a receive from Wake (interrupted); woken reports a receive from Wake
// during the wait, even one too late to interrupt it.
func (l *Listener[C]) wait(ctx context.Context, nextLook time.Time) (n *pgconn.Notification, woken, interrupted bool, err error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if l.Recheck > 0 {
		var cancelDeadline context.CancelFunc
		wctx, cancelDeadline = context.WithDeadline(wctx, nextLook)
		defer cancelDeadline()
	}
	var wake atomic.Bool
	if l.Wake != nil {
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			select {
			case <-l.Wake:
				// Noted even after the wait returned: what it asks for is
				// looked at next.
				wake.Store(true)
				cancel()
			case <-stop:
			}
		}()
		defer func() { woken = wake.Load() }()
		defer func() { close(stop); <-done }()
	}
	n, err = l.conn.WaitForNotification(wctx)
	interrupted = wctx.Err() != nil && ctx.Err() == nil &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
	return n, wake.Load(), interrupted, err
}

func (l *Listener[C]) look(ctx context.Context) error {
	if l.Look == nil {
		return nil
	}
	return l.Look(ctx, l.conn)
}

// Close closes the listener's connection, if open, waiting at most 2s for
// the server.
func (l *Listener[C]) Close(ctx context.Context) {
	if l.open {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		l.conn.Close(cctx)
		cancel()
		var zero C
		l.conn, l.open = zero, false
	}
}
