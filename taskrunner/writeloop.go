package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/taskrunner/protocol"
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
	defer func() {
		if t := w.tailKept(); t != nil {
			t.close()
		}
		if w.conn != nil {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			w.conn.Close(closeCtx)
			cancel()
		}
	}()
	first := true
	if conn != nil {
		if err := listen(ctx, conn, channels); err != nil {
			w.logger.Warn("listen on the first connection", "error", err)
			w.connErr = err
			conn.Close(ctx)
		}
		w.conn = conn
		first = false
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		select {
		case <-w.superseded:
			// The run is over: wait for the runner to end.
			<-ctx.Done()
			return
		default:
		}
		if w.conn == nil || w.conn.IsClosed() {
			if w.conn != nil && w.hooks.lost != nil {
				w.hooks.lost(w.connErr)
			}
			if err := w.connect(ctx, channels, first); err != nil {
				if w.over() {
					continue
				}
				w.logger.Warn("connect write connection", "error", err, "retry_in", delay)
				// A queued write cuts the wait short: the lock keeper waits on
				// this connection to finish taking its lock again.
				select {
				case <-time.After(delay):
				case <-w.wake:
				case <-ctx.Done():
				}
				delay = min(delay*2, time.Second)
				continue
			}
			first = false
			delay = 100 * time.Millisecond
		}
		if w.serveOne(ctx) {
			continue
		}
		if w.cancelHinted && !w.confirmCancel(ctx) {
			continue
		}
		w.waitNotification(ctx)
	}
}

func (w *writer) connect(ctx context.Context, channels []string, first bool) error {
	w.conn = nil
	cctx, cancel := context.WithTimeout(ctx, w.stmtTimeout)
	defer cancel()
	conn, err := w.open(cctx)
	if err != nil {
		if permanent(err) {
			w.logger.Warn("this run is no longer current: nothing more is written", "error", err)
			w.supersede()
		}
		return err
	}
	w.mu.Lock()
	also := slices.Clone(w.alsoListen)
	w.mu.Unlock()
	if err := listen(cctx, conn, append(slices.Clone(channels), also...)); err != nil {
		conn.Close(ctx)
		return err
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
			return err
		}
	}
	w.conn = conn
	return nil
}

// open makes a connection for the writer.
func (w *writer) open(ctx context.Context) (dbConn, error) {
	if take := w.takeFirst; take != nil {
		w.takeFirst = nil
		if conn := take(ctx); conn != nil {
			return pgxConn{conn}, nil
		}
	}
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

// serveEvents writes the events at the head of the queue: a child alone,
// in its transaction, or else up to batchLimit events (and maxBatchBytes)
// in one statement, ending at an outcome.
func (w *writer) serveEvents(ctx context.Context) bool {
	w.mu.Lock()
	for len(w.events) > 0 && w.events[0].gone {
		w.events = w.events[1:]
		w.goneCount--
	}
	if len(w.events) == 0 {
		w.markIdle()
		w.mu.Unlock()
		return true
	}
	if e := w.events[0]; e.child != nil {
		e.writing, e.attempted = true, true
		w.mu.Unlock()
		return w.serveChild(ctx, e)
	}
	limit := w.batchLimit
	if limit == 0 {
		limit = maxBatch
	}
	if w.singleThrough > 0 {
		limit = 1
	}
	var (
		batch []*pendingEvent
		evs   []etlcontext.NewEvent
		bytes int
	)
	for _, e := range w.events {
		if e.gone {
			continue
		}
		if e.child != nil || len(batch) == limit || (len(batch) > 0 && bytes+e.size > maxBatchBytes) {
			break
		}
		e.writing, e.attempted = true, true
		if e.ev.Seq == nil {
			w.number(e)
		}
		if e.replaced != nil {
			e.ev.Meta = e.replaced.meta()
		}
		batch = append(batch, e)
		evs = append(evs, e.ev)
		bytes += e.size
		if e.fallback != nil {
			// Nothing is written in the statement of an outcome after it.
			break
		}
	}
	w.mu.Unlock()

	err := w.exec(ctx, func(ctx context.Context, conn dbConn) error {
		return etlcontext.AppendEvents(ctx, conn, evs)
	})
	if w.retry(ctx, err) {
		w.mu.Lock()
		for _, e := range batch {
			e.writing = false
		}
		// A batch cut short (a timeout, a server short of memory) is
		// smaller next time.
		w.batchLimit = max(1, len(batch)/2)
		w.mu.Unlock()
		return true
	}
	last := *batch[len(batch)-1].ev.Seq
	switch {
	case err == nil:
	case errors.Is(err, etlcontext.ErrStaleRun) || errors.Is(err, etlcontext.ErrFinished):
		w.logger.Warn("the database refused an event: this run is no longer current", "type", evs[0].Type, "error", err)
		w.supersede()
	case len(batch) > 1:
		// One of them is refused: find which, one at a time, up to the
		// batch's last.
		w.mu.Lock()
		w.singleThrough = last
		for _, e := range batch {
			e.writing = false
		}
		w.mu.Unlock()
		return true
	case batch[0].fallback != nil:
		// The outcome must be recorded: the plainest one is.
		w.logger.Warn("the database refused the outcome; recording it without its details", "type", evs[0].Type, "error", err)
		w.mu.Lock()
		batch[0].ev.Payload, batch[0].fallback = batch[0].fallback, nil
		batch[0].writing = false
		w.mu.Unlock()
		return true
	case !batch[0].outcome && !batch[0].stoodIn:
		// A WARNING saying so takes its place, under its sequence number.
		w.logger.Warn("the database refused an event; a WARNING stands in for it", "type", evs[0].Type, "error", err)
		w.mu.Lock()
		e := batch[0]
		e.ev.Meta = map[string]any{"problem": "the database refused this event: " + err.Error(), "type": e.ev.Type}
		e.ev.Type, e.ev.Payload, e.ev.Error = protocol.EventType(w.kind, protocol.EventWarning), nil, false
		e.stoodIn, e.writing = true, false
		w.mu.Unlock()
		return true
	default:
		w.logger.Error("the database refused an event for good", "type", evs[0].Type, "error", err)
		if batch[0].outcome {
			w.mu.Lock()
			w.eventErr = fmt.Errorf("store %s: %w", evs[0].Type, err)
			w.mu.Unlock()
		}
	}
	w.mu.Lock()
	if err == nil {
		w.batchLimit = min(maxBatch, 2*max(w.batchLimit, 1))
	}
	if last >= w.singleThrough {
		w.singleThrough = 0
	}
	// The batch, and the replaced events among it, leave from the head.
	for len(w.events) > 0 && (w.events[0].writing || w.events[0].gone) {
		e := w.events[0]
		if e.gone {
			w.goneCount--
		}
		w.forget(e)
		w.events = w.events[1:]
	}
	w.markIdle()
	w.mu.Unlock()
	return true
}

// dropStored drops from the head of the queue the events an earlier write
// stored although its reply was lost (its connection was cut as it
// committed), as conn shows: the run may be over by that very write, its
// outcome, which is then written, not lost.
func (w *writer) dropStored(ctx context.Context, conn dbConn) bool {
	w.mu.Lock()
	var last *pendingEvent
	for _, e := range w.events {
		if e.gone {
			continue
		}
		if !e.attempted || e.child != nil || e.ev.Seq == nil || e.ev.RunID == nil {
			break
		}
		last = e
	}
	var ev etlcontext.NewEvent
	if last != nil {
		ev = last.ev
	}
	w.mu.Unlock()
	if last == nil {
		return false
	}
	// A write is one statement, and takes the queue's head: its last
	// event stored, so is every event before it.
	stored, err := etlcontext.EventStored(ctx, conn, ev.ContextID, *ev.RunID, *ev.Seq)
	if err != nil {
		w.logger.Warn("look whether an earlier write of the events committed", "error", err)
	}
	if !stored {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.events) > 0 {
		e := w.events[0]
		if e.gone {
			w.goneCount--
		} else if e.order > last.order {
			break
		}
		w.forget(e)
		w.events = w.events[1:]
	}
	w.endedByOwnWrite = true
	w.markIdle()
	return true
}

// forget drops e, written or refused, from the bookkeeping; w.mu is held.
func (w *writer) forget(e *pendingEvent) {
	if e.coalesce != "" && w.latest[e.coalesce] == e {
		delete(w.latest, e.coalesce)
	}
	if !e.gone {
		w.leave(e)
	}
}

// serveChild submits the child of e with its SUBMITTED event.
func (w *writer) serveChild(ctx context.Context, e *pendingEvent) bool {
	var refused error
	err := w.exec(ctx, func(ctx context.Context, conn dbConn) error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			refused = nil
			if w.submit == nil {
				refused = errors.New("this task process cannot submit children")
				return refused
			}
			id, created, err := w.submit(ctx, tx, *e.child)
			if err != nil {
				refused = err
				return err
			}
			ev := e.ev
			ev.Payload = map[string]any{"child_id": id, "kind": e.child.Kind, "idempotency_key": e.child.IdempotencyKey, "created": created}
			_, err = etlcontext.Append(ctx, tx, ev)
			return err
		})
	})
	again := w.retry(ctx, err)
	switch {
	case again:
		return true
	case refused != nil && classifyWriteError(refused, w.conn) != statementError:
		w.sayBusy("submit child: the database refused it for now; it is tried again", refused)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		return true
	case refused != nil:
		// The child is refused for good (an unknown kind, arguments that
		// lack the kind's concurrency key): the line is recorded as a
		// WARNING in its place, under the same sequence number.
		w.logger.Warn("submit child", "kind", e.child.Kind, "error", refused)
		w.mu.Lock()
		w.refusedChildren++
		e.ev.Type = protocol.EventType(w.kind, protocol.EventWarning)
		e.ev.Meta = map[string]any{"problem": "submit " + e.child.Kind + " child: " + refused.Error()}
		e.child = nil
		e.writing = false
		w.mu.Unlock()
		return true
	case errors.Is(err, etlcontext.ErrStaleRun) || errors.Is(err, etlcontext.ErrFinished):
		w.logger.Warn("the database refused an event: this run is no longer current", "type", e.ev.Type, "error", err)
		w.supersede()
	case err != nil:
		// Its SUBMITTED event, not the child, was refused: the child is
		// not submitted (one transaction), and a WARNING says so.
		w.logger.Warn("store event", "type", e.ev.Type, "error", err)
		w.mu.Lock()
		w.refusedChildren++
		e.ev.Type = protocol.EventType(w.kind, protocol.EventWarning)
		e.ev.Meta = map[string]any{"problem": "submit " + e.child.Kind + " child: " + err.Error()}
		e.child, e.stoodIn, e.writing = nil, true, false
		w.mu.Unlock()
		return true
	}
	w.mu.Lock()
	w.events = w.events[1:]
	w.forget(e)
	w.markIdle()
	w.mu.Unlock()
	return true
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
