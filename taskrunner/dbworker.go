package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// dbWorker owns the runner's second connection, over which every write goes.
// A pgx connection serves one caller at a time, and the same connection also
// listens for cancellation: between writes the worker waits for
// notifications, and a write wakes it.
type dbWorker struct {
	url    string
	name   string
	logger *slog.Logger
	listen []string

	conn   *pgx.Conn
	jobs   chan dbJob
	wake   chan struct{}
	notify chan *pgconn.Notification
}

type dbJob struct {
	fn   func(context.Context, *pgx.Conn) error
	done chan error
}

func newDBWorker(ctx context.Context, url, name string, logger *slog.Logger, listen ...string) (*dbWorker, error) {
	w := &dbWorker{
		url:    url,
		name:   name,
		logger: logger,
		listen: listen,
		jobs:   make(chan dbJob, 64),
		wake:   make(chan struct{}, 1),
		notify: make(chan *pgconn.Notification, 16),
	}
	if err := w.connect(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *dbWorker) connect(ctx context.Context) error {
	conn, err := connect(ctx, w.url, w.name)
	if err != nil {
		return err
	}
	for _, ch := range w.listen {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			conn.Close(ctx)
			return fmt.Errorf("listen on %s: %w", ch, err)
		}
	}
	w.conn = conn
	return nil
}

// do runs fn on the worker's connection and returns its error. A broken
// connection is replaced once before fn is run again.
func (w *dbWorker) do(ctx context.Context, fn func(context.Context, *pgx.Conn) error) error {
	j := dbJob{fn: fn, done: make(chan error, 1)}
	// Queue first, wake second: whichever wait consumes the wake-up, the
	// loop's next look at the queue finds the job.
	select {
	case w.jobs <- j:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
	select {
	case err := <-j.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run serves jobs and delivers notifications until ctx ends.
func (w *dbWorker) run(ctx context.Context) {
	defer func() {
		if w.conn != nil {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			w.conn.Close(closeCtx)
			cancel()
		}
	}()
	for {
		select {
		case j := <-w.jobs:
			j.done <- w.runJob(ctx, j)
			continue
		case <-ctx.Done():
			return
		default:
		}
		if w.conn == nil || w.conn.IsClosed() {
			if err := w.reconnect(ctx); err != nil {
				return
			}
		}
		waitCtx, cancel := context.WithCancel(ctx)
		stop := make(chan struct{})
		go func() {
			select {
			case <-w.wake:
				cancel()
			case <-stop:
			}
		}()
		n, err := w.conn.WaitForNotification(waitCtx)
		close(stop)
		cancel()
		switch {
		case err == nil:
			select {
			case w.notify <- n:
			default:
				w.logger.Warn("notification dropped", "channel", n.Channel, "payload", n.Payload)
			}
		case ctx.Err() != nil:
			return
		case errors.Is(err, context.Canceled):
			// Woken for a job.
		default:
			w.logger.Warn("write connection failed while listening", "error", err)
		}
	}
}

func (w *dbWorker) runJob(ctx context.Context, j dbJob) error {
	if w.conn == nil || w.conn.IsClosed() {
		if err := w.reconnect(ctx); err != nil {
			return err
		}
	}
	err := j.fn(ctx, w.conn)
	if err != nil && w.conn.IsClosed() && ctx.Err() == nil {
		w.logger.Warn("write connection lost; reconnecting", "error", err)
		if rerr := w.reconnect(ctx); rerr != nil {
			return errors.Join(err, rerr)
		}
		err = j.fn(ctx, w.conn)
	}
	return err
}

// reconnect retries for a while with backoff: a task that runs for days
// should not fail because its write connection was reset once.
func (w *dbWorker) reconnect(ctx context.Context) error {
	if w.conn != nil {
		w.conn.Close(ctx)
		w.conn = nil
	}
	delay := 100 * time.Millisecond
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := w.connect(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reconnect write connection: %w", err)
		}
		w.logger.Warn("reconnect write connection", "error", err, "retry_in", delay)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
		delay = min(delay*2, 5*time.Second)
	}
}
