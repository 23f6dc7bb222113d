package taskrunner

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pglisten"
)

// listenToo listens on channel from now on, on this connection and every
// later one. After a new connection, a notification with channel and an
// empty payload stands for those that may have been missed meanwhile.
func (w *writer) listenToo(ctx context.Context, channel string) error {
	w.mu.Lock()
	w.alsoListen = append(w.alsoListen, channel)
	w.mu.Unlock()
	return w.do(ctx, func(ctx context.Context, conn dbConn) error {
		return listen(ctx, conn, []string{channel})
	})
}

// call queues fn ahead of the events and returns a channel that receives its
// result. fn may run more than once (after a lost connection): it must be
// idempotent.
func (w *writer) call(fn func(context.Context, dbConn) error) <-chan error {
	return w.enqueue(context.Background(), fn).done
}

func (w *writer) enqueue(ctx context.Context, fn func(context.Context, dbConn) error) *writeCall {
	c := &writeCall{ctx: ctx, fn: fn, done: make(chan error, 1)}
	w.mu.Lock()
	w.calls = append(w.calls, c)
	w.mu.Unlock()
	w.signal()
	return c
}

// do is call, waiting for the result until ctx ends. When ctx ends first,
// fn is skipped if it has not started, and otherwise waited for: it runs
// under ctx, so it ends at once, and it never runs after do returned.
func (w *writer) do(ctx context.Context, fn func(context.Context, dbConn) error) error {
	c := w.enqueue(ctx, fn)
	var err error
	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
		err = ctx.Err()
	case <-w.superseded:
		// Nothing more runs for this run (the writer stopped connecting).
		err = etlcontext.ErrStaleRun
	}
	w.mu.Lock()
	started := c.started
	c.skipped = !started
	w.mu.Unlock()
	if started {
		return <-c.done
	}
	return err
}

// supersede stops the writer for good: the run is no longer current.
func (w *writer) supersede() {
	w.supOnce.Do(func() { close(w.superseded) })
}

// over reports whether the writer was superseded.
func (w *writer) over() bool {
	select {
	case <-w.superseded:
		return true
	default:
		return false
	}
}

// flush waits until everything queued so far is written, or ctx ends,
// the sampled lines held back included. It reports the last event the
// database refused for good since the previous flush.
func (w *writer) flush(ctx context.Context) error {
	w.mu.Lock()
	w.releaseAll()
	w.mu.Unlock()
	for {
		w.mu.Lock()
		empty := len(w.calls) == 0 && len(w.events) == 0
		idle := w.idle
		eventErr := w.eventErr
		if empty {
			w.eventErr = nil
		}
		w.mu.Unlock()
		if empty {
			return eventErr
		}
		select {
		case <-idle:
		case <-w.superseded:
			// What was queued may have been found written as the run
			// ended (dropStored), which emptied the queue and closed idle
			// as well.
			w.mu.Lock()
			written := w.endedByOwnWrite && len(w.calls) == 0 && len(w.events) == 0
			w.mu.Unlock()
			if !written {
				return etlcontext.ErrStaleRun
			}
		case <-ctx.Done():
			w.mu.Lock()
			n := len(w.events)
			w.mu.Unlock()
			return fmt.Errorf("%d events not written: %w", n, ctx.Err())
		}
	}
}

// run serves the queues and delivers notifications until ctx ends. conn,
// when not nil, is the writer's first connection, made by the caller (in
// advisory lock mode, the one that took the lock); otherwise the writer
// makes it.
func (w *writer) run(ctx context.Context, conn dbConn, channels ...string) {
	first := conn == nil
	l := &pglisten.Listener[dbConn]{
		Connect: func(ctx context.Context) (dbConn, error) {
			c, err := w.connect(ctx, channels, first)
			first = first && err != nil
			return c, err
		},
		Look:   w.serveAll,
		Notify: func(_ context.Context, n *pgconn.Notification) error { w.hear(n); return nil },
		// A queued write cuts any wait short, the wait to connect again
		// included: the lock keeper waits on this connection to finish
		// taking its lock again.
		Wake: w.wake,
		Lost: func(err error) {
			if w.connErr != nil {
				err = w.connErr
			}
			if w.hooks.lost != nil {
				w.hooks.lost(err)
			}
		},
		Failed: func(err error) bool {
			if w.connErr != nil {
				// Why the connection closed, which Lost was told too.
				err, w.connErr = w.connErr, nil
			}
			if w.over() {
				return false
			}
			w.logger.Warn("write connection failed; connecting again", "error", err)
			return true
		},
		// Kept while a superseded run waits for its runner to end.
		KeepOpen: true,
	}
	defer func() {
		if t := w.tailKept(); t != nil {
			t.close()
		}
		l.Close(ctx)
	}()
	if conn != nil {
		if err := listen(ctx, conn, channels); err != nil {
			w.logger.Warn("listen on the first connection", "error", err)
			w.connErr = err
			conn.Close(ctx)
		}
		w.conn = conn
		l.Use(conn)
	}
	_ = l.Serve(ctx)
	// The run is over: wait for the runner to end.
	<-ctx.Done()
}

// maxServedPerLook bounds the writes and calls of one look (serveAll).
const maxServedPerLook = 64

// serveAll confirms a hinted cancellation, and runs the calls and writes
// the events queued, until nothing is left to do, maxServedPerLook are
// done, or the connection failed (the listener then makes it again).
func (w *writer) serveAll(ctx context.Context, conn dbConn) error {
	if w.cancelHinted {
		w.confirmCancel(ctx)
	}
	for served := 0; !conn.IsClosed(); served++ {
		if w.over() {
			return pglisten.ErrStop
		}
		if served == maxServedPerLook {
			// Back after the notifications that wait: a command that
			// writes as fast as it is written must not hold off a
			// cancellation, nor leave them to pile up.
			w.signal()
			return nil
		}
		if !w.serveOne(ctx) {
			return nil
		}
	}
	return nil
}

func (w *writer) connect(ctx context.Context, channels []string, first bool) (dbConn, error) {
	cctx, cancel := context.WithTimeout(ctx, w.stmtTimeout)
	defer cancel()
	conn, err := w.open(cctx)
	if err != nil {
		if permanent(err) {
			w.logger.Warn("this run is no longer current: nothing more is written", "error", err)
			w.supersede()
		}
		return nil, err
	}
	w.mu.Lock()
	also := slices.Clone(w.alsoListen)
	w.mu.Unlock()
	if err := listen(cctx, conn, append(slices.Clone(channels), also...)); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	for _, ch := range also {
		select {
		case w.notify <- &pgconn.Notification{Channel: ch}:
		default:
		}
	}
	if !first && w.hooks.resume != nil {
		if err := w.hooks.resume(cctx, conn); err != nil {
			if permanent(err) {
				if w.dropStored(cctx, conn) {
					w.logger.Info("a write whose reply was lost was stored; the run is over", "reason", err)
				} else {
					w.logger.Warn("this run is no longer current: nothing more is written", "error", err)
				}
				w.supersede()
			}
			conn.Close(ctx)
			return nil, err
		}
	}
	w.conn = conn
	return conn, nil
}

// open makes a connection for the writer.
func (w *writer) open(ctx context.Context) (dbConn, error) {
	if w.dial != nil {
		return w.dial(ctx)
	}
	conn, err := connect(ctx, w.url, w.runKey, w.name, w.heartbeat)
	if err != nil {
		return nil, err
	}
	return pgxConn{conn}, nil
}

func listen(ctx context.Context, conn dbConn, channels []string) error {
	for _, ch := range channels {
		if err := conn.listen(ctx, ch); err != nil {
			return fmt.Errorf("listen on %s: %w", ch, err)
		}
	}
	return nil
}

// serveOne runs the next call or writes the next event; it reports false
// when there was nothing to do.
func (w *writer) serveOne(ctx context.Context) bool {
	w.mu.Lock()
	switch {
	case len(w.calls) > 0:
		c := w.calls[0]
		if c.skipped {
			w.calls = w.calls[1:]
			w.markIdle()
			w.mu.Unlock()
			return true
		}
		c.started = true
		w.mu.Unlock()
		callCtx, stop := context.WithCancel(c.ctx)
		defer context.AfterFunc(ctx, stop)()
		defer stop()
		err := w.exec(callCtx, c.fn)
		if callCtx.Err() == nil && w.retry(ctx, err) {
			w.mu.Lock()
			if c.ctx.Err() == nil {
				c.started = false
				w.mu.Unlock()
				return true
			}
			// Its caller gave up meanwhile and waits for this answer.
			w.calls = w.calls[1:]
			w.markIdle()
			w.mu.Unlock()
			c.done <- c.ctx.Err()
			return true
		}
		w.mu.Lock()
		w.calls = w.calls[1:]
		w.markIdle()
		w.mu.Unlock()
		c.done <- err
		return true
	case len(w.events) > 0:
		w.mu.Unlock()
		return w.serveEvents(ctx)
	}
	w.mu.Unlock()
	return w.serveProgress(ctx) || w.serveTail(ctx)
}

// markIdle wakes flush when the queues are empty; w.mu is held.
func (w *writer) markIdle() {
	if len(w.calls) == 0 && len(w.events) == 0 {
		close(w.idle)
		w.idle = make(chan struct{})
	}
}

func (w *writer) exec(ctx context.Context, fn func(context.Context, dbConn) error) error {
	sctx, cancel := context.WithTimeout(ctx, w.stmtTimeout)
	defer cancel()
	return fn(sctx, w.conn)
}
