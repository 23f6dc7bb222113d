package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
)

// Bounds of the events a runner keeps in memory while the database is away.
// Past them, reported events other than checkpoints are dropped (and
// counted in a WARNING); a checkpoint is never dropped, but a newer one
// replaces an older one still waiting beyond the bound.
const (
	maxPendingEvents = 10000
	maxPendingBytes  = 64 << 20
)

// writer owns the runner's write connection. Every write goes through it in
// order, and none makes its caller wait: the runner's main loop, which
// watches the lock, cancellation and signals, only queues. The connection is
// re-made for as long as the runner lives; every statement has a deadline;
// events carry a sequence number, so that a write retried after a lost
// connection is stored once.
type writer struct {
	url, name string
	// heartbeat, when not zero, makes the connection a lock connection (see
	// connect): in advisory lock mode it holds the lock.
	heartbeat   time.Duration
	logger      *slog.Logger
	contextID   int64
	runID       string
	kind        string
	stmtTimeout time.Duration

	mu       sync.Mutex
	calls    []*writeCall // run before events
	events   []pendingEvent
	bytes    int
	overflow int // events beyond the bound, all checkpoints
	dropped  int
	nextSeq  int
	// eventErr is the last error that made the database refuse an event for
	// good; flush reports it.
	eventErr error
	idle     chan struct{} // closed and replaced when the queues empty

	wake       chan struct{}
	notify     chan *pgconn.Notification
	superseded chan struct{}
	supOnce    sync.Once
	conn       *pgx.Conn
	// connErr is why the current connection failed, for hooks.lost.
	connErr error
	hooks   writerHooks
	// submit records the children the command submits; nil refuses them.
	submit SubmitFunc
	// refusedChildren counts the children refused for good, guarded by mu.
	refusedChildren int
	// listenAlso holds the channels listened to since listenToo, guarded
	// by mu, listened to again on every new connection.
	alsoListen []string
}

// writerHooks let the runner act on the writer's connection: in advisory
// lock mode it is the connection that holds the lock.
type writerHooks struct {
	// resume runs first on every new connection but the first, after its
	// LISTENs and before anything else is sent on it. An error closes the
	// connection, to be made again; an error that says the run is no longer
	// current (see permanent) supersedes the run: nothing more is written.
	resume func(ctx context.Context, conn *pgx.Conn) error
	// lost is told when a connection the writer had made fails.
	lost func(err error)
}

type writeCall struct {
	// ctx is the caller's: a call whose caller gave up is skipped, or cut
	// short if it already runs.
	ctx     context.Context
	fn      func(context.Context, *pgx.Conn) error
	done    chan error
	started bool // guarded by writer.mu
	skipped bool // guarded by writer.mu
}

type pendingEvent struct {
	ev         etlcontext.NewEvent
	size       int
	checkpoint bool
	// child, when set, is submitted in the transaction that stores ev (a
	// SUBMITTED event, whose payload then names the child).
	child *Child
}

// SubmitFunc records child c in tx (its context, INITIAL event and River
// job) and returns its id, and whether it is new.
type SubmitFunc func(ctx context.Context, tx pgx.Tx, c Child) (id int64, created bool, err error)

func newWriter(url, name string, logger *slog.Logger, stmtTimeout time.Duration, hooks writerHooks) *writer {
	return &writer{
		url: url, name: name, logger: logger, stmtTimeout: stmtTimeout, hooks: hooks,
		idle:       make(chan struct{}),
		wake:       make(chan struct{}, 1),
		notify:     make(chan *pgconn.Notification, 16),
		superseded: make(chan struct{}),
	}
}

// bind names the run the writer writes for, once the lock is held.
func (w *writer) bind(contextID int64, runID, kind string) {
	w.mu.Lock()
	w.contextID, w.runID, w.kind = contextID, runID, kind
	w.mu.Unlock()
}

func (w *writer) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// event queues an event of the run; it never blocks.
func (w *writer) event(suffix string, payload, meta any, isError bool, size int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	checkpoint := suffix == etlcontext.EventCheckpoint
	if len(w.events)-w.overflow >= maxPendingEvents || w.bytes+size > maxPendingBytes {
		if !checkpoint {
			w.dropped++
			return
		}
		// Only the newest checkpoint matters to a retry: keep one beyond the
		// bound.
		if w.overflow > 0 {
			last := w.events[len(w.events)-1]
			w.bytes -= last.size
			w.events = w.events[:len(w.events)-1]
			w.overflow--
			w.dropped++
		}
		w.overflow++
	}
	w.nextSeq++
	seq := w.nextSeq
	runID := w.runID
	w.events = append(w.events, pendingEvent{
		ev: etlcontext.NewEvent{
			ContextID: w.contextID, Type: w.kind + ":" + suffix,
			Payload: payload, Meta: meta, Error: isError, RunID: &runID, Seq: &seq,
		},
		size: size, checkpoint: checkpoint,
	})
	w.bytes += size
	w.signal()
}

// submitChild queues the submission of c, stored in order with the events
// as a SUBMITTED event of the run in the same transaction: the database's
// fence on the event refuses the child of a run that is no longer current.
//
// A child is never dropped, whatever the bounds on pending events: it is
// work, not telemetry.
func (w *writer) submitChild(c Child, size int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nextSeq++
	seq, runID := w.nextSeq, w.runID
	c.ParentID = w.contextID
	if c.IdempotencyKey == "" {
		c.IdempotencyKey = fmt.Sprintf("dama:child:%d:%s:%d", w.contextID, runID, seq)
	} else {
		c.IdempotencyKey = fmt.Sprintf("dama:child:%d:%s", w.contextID, c.IdempotencyKey)
	}
	w.events = append(w.events, pendingEvent{
		ev: etlcontext.NewEvent{
			ContextID: w.contextID, Type: w.kind + ":" + etlcontext.EventSubmitted, RunID: &runID, Seq: &seq,
		},
		size: size, child: &c,
	})
	w.bytes += size
	w.signal()
}

// refused returns how many children were refused for good.
func (w *writer) refused() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refusedChildren
}

// transient reports whether the database refused a write for a reason
// that passes: a deadlock, a serialization failure, a lock or statement
// timeout, a server shutting down.
func transient(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "40") || strings.HasPrefix(pgErr.Code, "57") || pgErr.Code == "55P03" || strings.HasPrefix(pgErr.Code, "53")
}

// listenToo listens on channel from now on, on this connection and every
// later one. After a new connection, a notification with channel and an
// empty payload stands for those that may have been missed meanwhile.
func (w *writer) listenToo(ctx context.Context, channel string) error {
	w.mu.Lock()
	w.alsoListen = append(w.alsoListen, channel)
	w.mu.Unlock()
	return w.do(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		return w.listen(ctx, conn, []string{channel})
	})
}

// call queues fn ahead of the events and returns a channel that receives its
// result. fn may run more than once (after a lost connection): it must be
// idempotent.
func (w *writer) call(fn func(context.Context, *pgx.Conn) error) <-chan error {
	return w.enqueue(context.Background(), fn).done
}

func (w *writer) enqueue(ctx context.Context, fn func(context.Context, *pgx.Conn) error) *writeCall {
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
func (w *writer) do(ctx context.Context, fn func(context.Context, *pgx.Conn) error) error {
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

// flush waits until everything queued so far is written, or ctx ends. It
// reports the last event the database refused for good since the previous
// flush.
func (w *writer) flush(ctx context.Context) error {
	for {
		w.mu.Lock()
		empty := len(w.calls) == 0 && len(w.events) == 0 && w.dropped == 0
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
			return etlcontext.ErrStaleRun
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
func (w *writer) run(ctx context.Context, conn *pgx.Conn, listen ...string) {
	defer func() {
		if w.conn != nil {
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			w.conn.Close(closeCtx)
			cancel()
		}
	}()
	first := true
	if conn != nil {
		if err := w.listen(ctx, conn, listen); err != nil {
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
			if err := w.connect(ctx, listen, first); err != nil {
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
		w.waitNotification(ctx)
	}
}

func (w *writer) connect(ctx context.Context, listen []string, first bool) error {
	w.conn = nil
	cctx, cancel := context.WithTimeout(ctx, w.stmtTimeout)
	defer cancel()
	conn, err := connect(cctx, w.url, w.name, w.heartbeat)
	if err != nil {
		return err
	}
	w.mu.Lock()
	also := slices.Clone(w.alsoListen)
	w.mu.Unlock()
	if err := w.listen(cctx, conn, append(slices.Clone(listen), also...)); err != nil {
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
			conn.Close(ctx)
			if permanent(err) {
				w.logger.Warn("this run is no longer current: nothing more is written", "error", err)
				w.supersede()
			}
			return err
		}
	}
	w.conn = conn
	return nil
}

func (w *writer) listen(ctx context.Context, conn *pgx.Conn, channels []string) error {
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
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
		e := w.events[0]
		w.mu.Unlock()
		var refused error
		err := w.exec(ctx, func(ctx context.Context, conn *pgx.Conn) error {
			if e.child == nil {
				_, err := etlcontext.Append(ctx, conn, e.ev)
				return err
			}
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
		case refused != nil && transient(refused):
			w.logger.Warn("submit child: the database refused it for now; it is tried again", "kind", e.child.Kind, "error", refused)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
			return true
		case refused != nil:
			w.mu.Lock()
			w.refusedChildren++
			w.mu.Unlock()
			// The child is refused for good (an unknown kind, arguments that
			// lack the kind's concurrency key): the line is recorded as a
			// WARNING in its place, under the same sequence number.
			w.logger.Warn("submit child", "kind", e.child.Kind, "error", refused)
			w.mu.Lock()
			w.events[0].child = nil
			w.events[0].ev.Type = w.kind + ":" + etlcontext.EventWarning
			w.events[0].ev.Meta = map[string]any{"problem": "submit " + e.child.Kind + " child: " + refused.Error()}
			w.mu.Unlock()
			return true
		case errors.Is(err, etlcontext.ErrStaleRun) || errors.Is(err, etlcontext.ErrFinished):
			w.logger.Warn("the database refused an event: this run is no longer current", "type", e.ev.Type, "error", err)
			w.supersede()
		case err != nil:
			w.logger.Warn("store event", "type", e.ev.Type, "error", err)
			w.mu.Lock()
			w.eventErr = fmt.Errorf("store %s: %w", e.ev.Type, err)
			w.mu.Unlock()
		}
		w.mu.Lock()
		w.events = w.events[1:]
		w.bytes -= e.size
		if w.overflow > len(w.events) {
			w.overflow = len(w.events)
		}
		w.markIdle()
		w.mu.Unlock()
		return true
	case w.dropped > 0:
		n := w.dropped
		w.dropped = 0
		w.mu.Unlock()
		// Reported in order, after what was kept.
		w.event(etlcontext.EventWarning, nil, map[string]any{
			"problem": fmt.Sprintf("%d events dropped: more than %d events or %d bytes waited for the database", n, maxPendingEvents, maxPendingBytes),
		}, false, 256)
		return true
	}
	w.mu.Unlock()
	return false
}

// markIdle wakes flush when the queues are empty; w.mu is held.
func (w *writer) markIdle() {
	if len(w.calls) == 0 && len(w.events) == 0 && w.dropped == 0 {
		close(w.idle)
		w.idle = make(chan struct{})
	}
}

func (w *writer) exec(ctx context.Context, fn func(context.Context, *pgx.Conn) error) error {
	sctx, cancel := context.WithTimeout(ctx, w.stmtTimeout)
	defer cancel()
	return fn(sctx, w.conn)
}

// waitNotification waits for a notification until a write is queued.
func (w *writer) waitNotification(ctx context.Context) {
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
	case ctx.Err() != nil, errors.Is(err, context.Canceled):
	default:
		// Closed whatever the error: pgconn keeps a connection whose read
		// timed out, and a kernel that gave up on a silent server reports a
		// timeout too.
		w.connErr = err
		w.logger.Warn("write connection failed while listening", "error", err)
		w.conn.Close(context.WithoutCancel(ctx))
	}
}

// retry reports whether the write that failed with err is to be tried
// again: after a failure of the connection (dropped, to be made again), or
// after the server refused it for want of resources or cut it short (kept:
// in advisory lock mode it holds the lock).
func (w *writer) retry(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	switch classifyWriteError(err, w.conn) {
	case connectionLost:
		w.logger.Warn("write connection lost; the write is kept and tried again", "error", err)
		w.connErr = err
		w.conn.Close(context.WithoutCancel(ctx))
		return true
	case serverBusy:
		w.logger.Warn("the server refused a write for now; it is kept and tried again", "error", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		return true
	}
	return false
}

type writeError int

const (
	// statementError: the write itself is wrong; trying again would not help.
	statementError writeError = iota
	// connectionLost: the connection broke or timed out, or the server ended
	// the session.
	connectionLost
	// serverBusy: the server is short of resources (disk, memory) or
	// cancelled the statement (statement_timeout); the connection is fine.
	serverBusy
)

func classifyWriteError(err error, conn *pgx.Conn) writeError {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case conn.IsClosed(), pgErr.Code[:2] == "08", pgErr.Code == "53300":
			return connectionLost
		case pgErr.Code[:3] == "57P": // admin_shutdown, crash_shutdown, cannot_connect_now, idle_session_timeout...
			return connectionLost
		case pgErr.Code[:2] == "53", pgErr.Code == "57014":
			return serverBusy
		}
		return statementError
	}
	if conn.IsClosed() || pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded) {
		return connectionLost
	}
	return statementError
}
