package taskrunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/keeper"
	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/dama-etl/dama/protocol"
)

// listenToo listens on channel from now on, on every connection. After a
// new one, a notification with an empty payload stands for those missed.
func (w *writer) listenToo(ctx context.Context, channel string) error {
	w.mu.Lock()
	w.alsoListen = append(w.alsoListen, channel)
	w.mu.Unlock()
	return w.do(ctx, func(ctx context.Context, conn dbConn) error {
		return listen(ctx, conn, []string{channel})
	})
}

// call queues fn ahead of the events and returns a channel that receives its
// result. fn may run again after a lost connection: it must be idempotent.
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
		// The writer stopped connecting.
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

// flush waits until everything queued so far, the sampled lines held back
// included, is written, or ctx ends. It reports the last outcome the
// database refused for good since the previous flush.
func (w *writer) flush(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.releaseHeld(sampled...)
	for len(w.calls) > 0 || len(w.events) > 0 {
		idle := w.idle
		w.mu.Unlock()
		select {
		case <-idle:
			w.mu.Lock()
		case <-w.superseded:
			w.mu.Lock()
			// dropStored may have found the queue written as the run
			// ended, which closed idle as well.
			if !w.endedByOwnWrite || len(w.calls) > 0 || len(w.events) > 0 {
				return etlcontext.ErrStaleRun
			}
		case <-ctx.Done():
			w.mu.Lock()
			return fmt.Errorf("%d events not written: %w", len(w.events), ctx.Err())
		}
	}
	err := w.eventErr
	w.eventErr = nil
	return err
}

// run serves the queues and notifications until ctx ends; conn, if any, is the first connection.
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
		// A queued write cuts any wait short, to connect again included:
		// the lock keeper waits on this connection to take its lock again.
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
			w.outage.lost("writes", err)
			return true
		},
		Reconnected: func() { w.outage.back("writes") },
		// Kept while a superseded run waits for its runner to end.
		KeepOpen: true,
	}
	defer func() {
		if t := w.tail.Load(); t != nil {
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

// serveAll confirms a hinted cancellation, and serves the queues until
// they are empty, maxServedPerLook are done, or the connection failed.
func (w *writer) serveAll(ctx context.Context, conn dbConn) error {
	if w.cancelHinted {
		w.confirmCancel(ctx)
	}
	for served := 0; !conn.IsClosed(); served++ {
		if w.over() {
			return pglisten.ErrStop
		}
		if served == maxServedPerLook {
			// Back after the notifications: a command that writes as fast
			// as it is written must not hold off a cancellation.
			w.signal()
			return nil
		}
		if !w.serveOne(ctx) {
			return nil
		}
	}
	return nil
}

// hear passes notification n on to the runner. A cancellation is a hint
// anyone who can connect may send: one naming this run's context is passed
// on once the database's record confirms it (confirmCancel). The rest are
// wake-ups whose receiver reads the database: the ends of contexts that are
// not this one's children are dropped, lest a flood of them crowd out one
// that is, and when one is already waiting, n adds nothing.
func (w *writer) hear(n *pgconn.Notification) {
	w.mu.Lock()
	id := w.contextID
	w.mu.Unlock()
	switch n.Channel {
	case protocol.CancelChannel:
		if id != 0 && n.Payload == strconv.FormatInt(id, 10) {
			w.cancelHinted = true
			// Confirmed by the writer's next look.
			w.signal()
		}
		return
	case etlcontext.FinishedChannel:
		var f etlcontext.Finished
		// An empty payload stands for announcements missed while the
		// connection was made again.
		if n.Payload != "" && json.Unmarshal([]byte(n.Payload), &f) == nil && (f.ParentID == nil || *f.ParentID != id) {
			return
		}
	}
	offer(w.notify, n)
}

// confirmInterval is the least time between two reads of a hinted
// cancellation: the most a false one just before may delay a true one.
const confirmInterval = 100 * time.Millisecond

// confirmCancel passes a hinted cancellation on to the runner once it reads
// it recorded. A new connection reads the record anew (hooks.resume).
func (w *writer) confirmCancel(ctx context.Context) {
	if wait := confirmInterval - time.Since(w.confirmedAt); wait > 0 {
		w.signalIn(wait)
		return
	}
	w.confirmedAt = time.Now()
	w.mu.Lock()
	id, runID := w.contextID, w.runID
	w.mu.Unlock()
	var requested bool
	err := w.exec(ctx, func(ctx context.Context, conn dbConn) (err error) {
		requested, err = etlcontext.CancelRequested(ctx, conn, id, runID)
		return err
	})
	confirmed := &pgconn.Notification{Channel: protocol.CancelChannel, Payload: strconv.FormatInt(id, 10)}
	switch {
	case err == nil && !requested:
		w.cancelHinted = false
		w.ignored++
		if time.Since(w.ignoredSaid) >= time.Minute {
			w.logger.Warn("ignored announced cancellations that the database does not record", "count", w.ignored)
			w.ignored, w.ignoredSaid = 0, time.Now()
		}
	case err == nil && offer(w.notify, confirmed):
		w.cancelHinted = false
	case err == nil:
		// The runner has yet to take what waits: look again soon.
		w.signalIn(confirmInterval)
	case permanent(err):
		w.cancelHinted = false
	case w.conn.IsClosed():
	default:
		w.sayBusy("read the announced cancellation; tried again in a second", err)
		w.signalIn(time.Second)
	}
}

// signalIn wakes the writer's loop after d; one wake-up waits at a time.
func (w *writer) signalIn(d time.Duration) {
	if w.wakeSet.CompareAndSwap(false, true) {
		time.AfterFunc(d, func() {
			w.wakeSet.Store(false)
			w.signal()
		})
	}
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
	if err := listen(cctx, conn, slices.Concat(channels, also)); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	for _, ch := range also {
		offer(w.notify, &pgconn.Notification{Channel: ch})
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

// serveOne runs the next call or write; it reports false when there was none.
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
		w.serveCall(ctx, c)
		return true
	case len(w.events) > 0:
		w.mu.Unlock()
		return w.serveEvents(ctx)
	}
	w.mu.Unlock()
	return w.serveProgress(ctx) || w.serveTail(ctx)
}

// serveCall runs c, started, under its caller's ctx and the writer's.
func (w *writer) serveCall(ctx context.Context, c *writeCall) {
	callCtx, stop := context.WithCancel(c.ctx)
	defer context.AfterFunc(ctx, stop)()
	defer stop()
	err := w.exec(callCtx, c.fn)
	if callCtx.Err() == nil && w.retry(ctx, err) {
		w.mu.Lock()
		if c.ctx.Err() == nil {
			c.started = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		// Its caller gave up meanwhile and waits for this answer.
		err = c.ctx.Err()
	}
	w.mu.Lock()
	w.calls = w.calls[1:]
	w.markIdle()
	w.mu.Unlock()
	c.done <- err
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
	err := fn(sctx, w.conn)
	if err == nil {
		w.outage.wrote()
	}
	return err
}

// retry reports whether the write that failed with err is to be tried
// again: after a failure of the connection (dropped, to be made again), or
// when the server refused it for now (the connection, which may hold the
// lock, is kept).
func (w *writer) retry(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	switch classifyWriteError(err, w.conn) {
	case connectionLost:
		// The write is kept and tried again on a new connection.
		w.outage.lost("writes", err)
		w.connErr = err
		w.conn.Close(context.WithoutCancel(ctx))
		return true
	case serverBusy:
		w.sayBusy("the server refused a write for now; it is kept and tried again", err)
		pause(ctx, time.Second)
		return true
	}
	return false
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// sayBusy logs a write refused for now once a minute, so that a server
// read-only for an hour does not fill the task's log.
func (w *writer) sayBusy(msg string, err error) {
	if now := time.Now(); now.Sub(w.busySaid) >= time.Minute {
		w.logger.Warn(msg, "error", err)
		w.busySaid = now
	}
}

type writeError int

const (
	// statementError: the write itself is wrong; trying again would not help.
	statementError writeError = iota
	// connectionLost: the connection broke or timed out, or its session ended.
	connectionLost
	// serverBusy: the server refused the write for now (see
	// classifyWriteError); the connection is fine.
	serverBusy
)

func classifyWriteError(err error, conn dbConn) writeError {
	if errors.Is(err, keeper.ErrUnavailable) {
		// The keeper could not reach the server; its lock session is fine.
		return serverBusy
	}
	if code := etlcontext.ErrCode(err); code != "" {
		switch {
		case conn == nil || conn.IsClosed(), etlcontext.ConnectionLost(code):
			return connectionLost
		case etlcontext.RequestRefused(code):
			// What the database cannot store, or one of dama's guards.
			return statementError
		}
		// Anything else says nothing of the write: the server is short
		// of resources, cut it short, rolled it back, is read-only for
		// a switchover, lacks a grant being restored, or failed
		// inside. The same write may pass next time.
		return serverBusy
	}
	if conn == nil || conn.IsClosed() || etlcontext.Unreachable(err) || errors.Is(err, context.DeadlineExceeded) {
		return connectionLost
	}
	return statementError
}
