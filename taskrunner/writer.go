package taskrunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pgerr"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// Bounds of the events from the command's pipe that wait for the database
// in memory. At either bound the runner stops reading the pipe until some
// are written, so the command blocks on its next write: backpressure, not
// loss. PROGRESS and CHECKPOINT lines never wait: only the newest of each
// matters, and at the bounds it replaces the one still waiting, so a
// command that only reports its state never blocks.
const (
	maxPendingEvents = 1000
	maxPendingBytes  = 8 << 20
	// maxBatch bounds the events written in one statement.
	maxBatch = 256
	// maxBatchBytes bounds the payloads written in one statement (beyond
	// one event).
	maxBatchBytes = 1 << 20
)

// coalescing are the suffixes of which only the newest waiting event is
// kept.
var coalescing = map[string]bool{protocol.EventProgress: true, protocol.EventCheckpoint: true}

// writer owns the runner's write connection. Every write goes through it in
// order, and none makes its caller wait: the runner's main loop, which
// watches the lock, cancellation and signals, only queues. The connection is
// re-made for as long as the runner lives; every statement has a deadline;
// events carry a sequence number, so that a write retried after a lost
// connection is stored once.
type writer struct {
	url, name string
	// runKey is the run's key its sessions hold (Options.RunKey).
	runKey string
	// heartbeat, when not zero, makes the connection a lock connection (see
	// connect): in advisory lock mode it holds the lock.
	heartbeat   time.Duration
	logger      *slog.Logger
	contextID   int64
	runID       string
	kind        string
	stmtTimeout time.Duration

	mu     sync.Mutex
	calls  []*writeCall // run before events
	events []*pendingEvent
	// piped and pipedBytes count the waiting events from the pipe, against
	// the bounds.
	piped, pipedBytes int
	// latest is the newest waiting event of each coalescing suffix, and of
	// the replacements noted (replacedKey).
	latest map[string]*pendingEvent
	room   chan struct{} // closed and replaced when piped events leave
	// batchLimit is how many events go in one statement: maxBatch (0),
	// halved after a batch was cut short. singleThrough, when set, is the
	// last sequence number of a refused batch: up to it, events are
	// written one at a time to find the refused one.
	batchLimit, singleThrough int
	// goneCount counts the replaced events still in events.
	goneCount int
	nextSeq   int
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
	// busySaid is when sayBusy last logged; only the writer's goroutine
	// uses it.
	busySaid time.Time
	hooks    writerHooks
	// submit records the children the command submits; nil refuses them.
	submit SubmitFunc
	// refusedChildren counts the children refused for good, guarded by mu.
	refusedChildren int
	// listenAlso holds the channels listened to since listenToo, guarded
	// by mu, listened to again on every new connection.
	alsoListen []string
	// cancelHinted: a cancellation of this run was announced, and is yet
	// to be confirmed by the database's record (confirmCancel). Only the
	// writer's goroutine uses it.
	cancelHinted bool
	// confirmedAt is when confirmCancel last read the record, and ignored
	// counts the hints it found unrecorded since it last said so, at
	// ignoredSaid: a flood of false hints costs a read per
	// confirmInterval and a log line a minute.
	confirmedAt, ignoredSaid time.Time
	ignored                  int
	// wakeSet: a wake-up of signalIn is pending.
	wakeSet atomic.Bool
}

// confirmInterval is the least time between two reads of a hinted
// cancellation: how much later a cancellation may be carried out when a
// false one was announced just before.
const confirmInterval = 100 * time.Millisecond

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
	ev   etlcontext.NewEvent
	size int
	// piped events count against the bounds.
	piped bool
	// coalesce, when set, is the key under which a newer event replaces
	// this one while it waits.
	coalesce string
	// gone: replaced by a newer one before it was written.
	gone bool
	// writing: taken into a write; it can no longer be replaced.
	writing bool
	// attempted: sent at least once, so perhaps stored: nothing more may
	// be merged into it.
	attempted bool
	// replaced, when set, is what was replaced in reported lines; the
	// event's meta is made from it when it is written.
	replaced *replacedNote
	// fallback, when set, is the payload to store instead when the
	// database refuses this one for good: an outcome is never lost.
	fallback any
	// outcome: the attempt's outcome, whose loss flush reports.
	outcome bool
	// stoodIn: a WARNING standing in for an event the database refused.
	stoodIn bool
	// child, when set, is submitted in the transaction that stores ev (a
	// SUBMITTED event, whose payload then names the child).
	child *protocol.Child
}

// replacedNote adds up what was replaced in the pipe's lines and in the
// runner's own payloads since the last WARNING about it was written.
type replacedNote struct {
	lines    int
	replaced etlcontext.Replaced
	types    []string
}

func (n *replacedNote) meta() map[string]any {
	return map[string]any{
		"problem": fmt.Sprintf("replaced %s that the database cannot store, in %d event(s) of type %s; stored with U+FFFD (numbers as strings)",
			n.replaced, n.lines, strings.Join(n.types, ", ")),
		"replaced": map[string]int{"nul": n.replaced.NUL, "invalid_utf8": n.replaced.InvalidUTF8, "surrogates": n.replaced.Surrogates, "numbers": n.replaced.Numbers, "huge_numbers": n.replaced.Huge},
	}
}

// replacedKey is the coalescing key of the WARNING about replacements.
const replacedKey = "\x00replaced"

// SubmitFunc records child c in tx (its context, INITIAL event and River
// job) and returns its id, and whether it is new.
type SubmitFunc func(ctx context.Context, tx pgx.Tx, c protocol.Child) (id int64, created bool, err error)

func newWriter(url, name string, logger *slog.Logger, stmtTimeout time.Duration, hooks writerHooks) *writer {
	return &writer{
		url: url, name: name, logger: logger, stmtTimeout: stmtTimeout, hooks: hooks,
		idle:       make(chan struct{}),
		room:       make(chan struct{}),
		latest:     make(map[string]*pendingEvent),
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

// event queues an event of the runner's own; it never blocks, and it is
// never dropped.
func (w *writer) event(suffix string, payload, meta any, isError bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.append(w.newEvent(suffix, payload, meta, isError))
}

// outcome queues the event that records the attempt's outcome, with the
// payload to store instead should the database refuse this one.
func (w *writer) outcome(suffix string, payload map[string]any, fallback map[string]any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.newEvent(suffix, payload, nil, false)
	e.fallback, e.outcome = fallback, true
	w.append(e)
}

// report queues an event the command reported. It waits while the bounds
// are reached, until ctx ends or the run is superseded, unless the event
// coalesces: then it replaces the waiting one of its suffix. replaced is
// what was replaced in the line, so that the database takes it.
func (w *writer) report(ctx context.Context, suffix string, payload json.RawMessage, meta any, isError bool, replaced etlcontext.Replaced) error {
	e := w.newEvent(suffix, payload, meta, false)
	e.ev.Error = isError
	e.piped = true
	if coalescing[suffix] {
		e.coalesce = suffix
		w.mu.Lock()
	} else if err := w.waitRoom(ctx, e.size); err != nil {
		return err
	}
	defer w.mu.Unlock()
	w.append(e)
	if replaced.Any() {
		w.noteReplaced(suffix, replaced)
	}
	return nil
}

// waitRoom returns, with w.mu held, once an event of size fits within the
// bounds; an event alone in the queue always fits.
func (w *writer) waitRoom(ctx context.Context, size int) error {
	for {
		w.mu.Lock()
		if !w.full(size) {
			return nil
		}
		room := w.room
		w.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err()
		case <-w.superseded:
			return etlcontext.ErrStaleRun
		}
	}
}

// compact drops the replaced events from the queue once they are half of
// it: a command that reports progress while the head waits (the database
// away) must not grow it; w.mu is held.
func (w *writer) compact() {
	if w.goneCount < 64 || w.goneCount < len(w.events)/2 {
		return
	}
	kept := w.events[:0]
	for _, e := range w.events {
		if !e.gone {
			kept = append(kept, e)
		}
	}
	clear(w.events[len(kept):])
	w.events = kept
	w.goneCount = 0
}

// full reports whether an event of size from the pipe would pass the
// bounds; w.mu is held. An event alone in the queue always fits.
func (w *writer) full(size int) bool {
	return w.piped > 0 && (w.piped >= maxPendingEvents || w.pipedBytes+size > maxPendingBytes)
}

// newEvent makes the next event of the run, its payload and meta cleaned
// for the database; w.mu is held or the event is not queued yet.
func (w *writer) newEvent(suffix string, payload, meta any, isError bool) *pendingEvent {
	e := &pendingEvent{ev: etlcontext.NewEvent{ContextID: w.contextID, Type: protocol.EventType(w.kind, suffix), Error: isError}}
	var replaced etlcontext.Replaced
	e.ev.Payload, replaced = cleanValue(payload)
	m, r := cleanValue(meta)
	e.ev.Meta, replaced = m, replaced.Add(r)
	e.size = 256 + len(asRaw(e.ev.Payload)) + len(asRaw(e.ev.Meta))
	if replaced.Any() {
		// Rare, and only of the runner's own text: noted beside the event.
		e.replaced = &replacedNote{lines: 1, replaced: replaced, types: []string{suffix}}
	}
	return e
}

// append numbers e and queues it; w.mu is held.
func (w *writer) append(e *pendingEvent) {
	if e.replaced != nil && e.coalesce != replacedKey {
		// Noted ahead of e: nothing may follow an outcome.
		note := e.replaced
		e.replaced = nil
		w.mergeReplaced(note)
	}
	runID := w.runID
	e.ev.RunID = &runID
	if e.child != nil {
		// Its key names its line now; other events are numbered when first
		// written, so that those a newer one replaced use up no number.
		w.number(e)
	}
	if e.coalesce != "" {
		// Only at the bounds: until then every report is kept.
		if old := w.latest[e.coalesce]; old != nil && !old.attempted && !old.gone && (e.coalesce == replacedKey || w.full(e.size)) {
			old.gone = true
			old.ev.Payload, old.ev.Meta, old.replaced = nil, nil, nil
			w.leave(old)
			w.goneCount++
			w.compact()
		}
		w.latest[e.coalesce] = e
	}
	if e.piped {
		w.piped++
		w.pipedBytes += e.size
	}
	w.events = append(w.events, e)
	w.signal()
}

// number gives e the run's next sequence number; w.mu is held.
func (w *writer) number(e *pendingEvent) {
	w.nextSeq++
	seq := w.nextSeq
	e.ev.Seq = &seq
}

// noteReplaced records that a reported line of type suffix needed
// replacing; w.mu is held. One WARNING stands for every replacement until
// it is written.
func (w *writer) noteReplaced(suffix string, r etlcontext.Replaced) {
	w.mergeReplaced(&replacedNote{lines: 1, replaced: r, types: []string{suffix}})
}

// replacedIn is noteReplaced for what is not itself queued: a failure
// line, a child, the runner's own text.
func (w *writer) replacedIn(what string, r etlcontext.Replaced) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.noteReplaced(what, r)
}

func (w *writer) mergeReplaced(n *replacedNote) {
	if old := w.latest[replacedKey]; old != nil && !old.attempted && !old.gone {
		old.replaced.lines += n.lines
		old.replaced.replaced = old.replaced.replaced.Add(n.replaced)
		for _, t := range n.types {
			if !slices.Contains(old.replaced.types, t) {
				old.replaced.types = append(old.replaced.types, t)
			}
		}
		return
	}
	e := &pendingEvent{ev: etlcontext.NewEvent{ContextID: w.contextID, Type: protocol.EventType(w.kind, protocol.EventWarning)}, size: 512, coalesce: replacedKey, replaced: n}
	w.append(e)
}

// leave accounts for e leaving the queue (written or replaced); w.mu is
// held.
func (w *writer) leave(e *pendingEvent) {
	if !e.piped {
		return
	}
	e.piped = false
	w.piped--
	w.pipedBytes -= e.size
	close(w.room)
	w.room = make(chan struct{})
}

// cleanValue encodes v for the database, replacing what it would refuse.
func cleanValue(v any) (json.RawMessage, etlcontext.Replaced) {
	var raw []byte
	switch v := v.(type) {
	case nil:
		return nil, etlcontext.Replaced{}
	case json.RawMessage:
		raw = v
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			// The runner's own values always encode; say so rather than lose
			// the event.
			raw, _ = json.Marshal(map[string]string{"unencodable": err.Error()})
		}
	}
	if len(raw) == 0 {
		return nil, etlcontext.Replaced{}
	}
	clean, r, err := etlcontext.CleanJSON(raw)
	if err != nil {
		text, _ := etlcontext.CleanText(string(raw))
		clean, _ = json.Marshal(map[string]string{"not_json": text})
		r.InvalidUTF8++
	}
	return clean, r
}

func asRaw(v any) json.RawMessage {
	raw, _ := v.(json.RawMessage)
	return raw
}

// submitChild queues the submission of c, stored in order with the events
// as a SUBMITTED event of the run in the same transaction: the database's
// fence on the event refuses the child of a run that is no longer current.
// It waits for room as report does: a child is work, never dropped.
func (w *writer) submitChild(ctx context.Context, c protocol.Child) error {
	size := 256 + len(c.Args) + len(c.Kind) + len(c.IdempotencyKey)
	if err := w.waitRoom(ctx, size); err != nil {
		return err
	}
	defer w.mu.Unlock()
	c.ParentID = w.contextID
	e := &pendingEvent{ev: etlcontext.NewEvent{ContextID: w.contextID, Type: protocol.EventType(w.kind, protocol.EventSubmitted)}, size: size, child: &c, piped: true}
	w.append(e)
	// The key needs the sequence number append gave.
	if c.IdempotencyKey == "" {
		c.IdempotencyKey = fmt.Sprintf("dama:child:%d:%s%s:%d", w.contextID, protocol.AutoKeyPrefix, w.runID, *e.ev.Seq)
	} else {
		c.IdempotencyKey = fmt.Sprintf("dama:child:%d:%s", w.contextID, c.IdempotencyKey)
	}
	return nil
}

// refused returns how many children were refused for good.
func (w *writer) refused() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refusedChildren
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
		if w.cancelHinted && !w.confirmCancel(ctx) {
			continue
		}
		w.waitNotification(ctx)
	}
}

func (w *writer) connect(ctx context.Context, listen []string, first bool) error {
	w.conn = nil
	cctx, cancel := context.WithTimeout(ctx, w.stmtTimeout)
	defer cancel()
	conn, err := connect(cctx, w.url, w.runKey, w.name, w.heartbeat)
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
		w.mu.Unlock()
		return w.serveEvents(ctx)
	}
	w.mu.Unlock()
	return false
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

	err := w.exec(ctx, func(ctx context.Context, conn *pgx.Conn) error {
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
	err := w.exec(ctx, func(ctx context.Context, conn *pgx.Conn) error {
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
		w.hear(n)
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

// hear passes notification n on to the runner. A cancellation is a hint,
// which anyone who can connect may send: one naming this run's context is
// noted, and passed on only once the database's record confirms it
// (confirmCancel); others are ignored. The rest are wake-ups whose
// receiver reads the database itself: when one is already waiting, n adds
// nothing, so a flood of them costs nothing.
func (w *writer) hear(n *pgconn.Notification) {
	if n.Channel == protocol.CancelChannel {
		w.mu.Lock()
		id := w.contextID
		w.mu.Unlock()
		if id != 0 && n.Payload == strconv.FormatInt(id, 10) {
			w.cancelHinted = true
		}
		return
	}
	select {
	case w.notify <- n:
	default:
	}
}

// confirmCancel reads whether the run's cancellation is recorded, as hinted,
// and if so passes it on to the runner. It reports whether the writer may
// wait for the next notification: false when the connection failed, to be
// made again (which reads the record anew: hooks.resume).
func (w *writer) confirmCancel(ctx context.Context) bool {
	if wait := confirmInterval - time.Since(w.confirmedAt); wait > 0 {
		w.signalIn(wait)
		return true
	}
	w.confirmedAt = time.Now()
	w.mu.Lock()
	id, runID := w.contextID, w.runID
	w.mu.Unlock()
	var requested bool
	err := w.exec(ctx, func(ctx context.Context, conn *pgx.Conn) (err error) {
		requested, err = etlcontext.CancelRequested(ctx, conn, id, runID)
		return err
	})
	switch {
	case err == nil && !requested:
		w.cancelHinted = false
		w.ignored++
		if time.Since(w.ignoredSaid) >= time.Minute {
			w.logger.Warn("ignored announced cancellations that the database does not record", "count", w.ignored)
			w.ignored, w.ignoredSaid = 0, time.Now()
		}
	case err == nil:
		select {
		case w.notify <- &pgconn.Notification{Channel: protocol.CancelChannel, Payload: strconv.FormatInt(id, 10)}:
			w.cancelHinted = false
		default:
			// The runner has yet to take what waits: look again soon.
			w.signalIn(confirmInterval)
		}
	case permanent(err):
		w.cancelHinted = false
	case w.conn.IsClosed():
		return false
	default:
		w.sayBusy("read the announced cancellation; tried again in a second", err)
		w.signalIn(time.Second)
	}
	return true
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
		w.sayBusy("the server refused a write for now; it is kept and tried again", err)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		return true
	}
	return false
}

// sayBusy logs a write refused for now, tried again every second: once a
// minute while the refusal lasts, so that a server read-only for an hour
// does not fill the task's log.
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
	// connectionLost: the connection broke or timed out, or the server ended
	// the session.
	connectionLost
	// serverBusy: the server is short of resources (disk, memory),
	// cancelled the statement (statement_timeout) or rolled it back
	// (serialization failure, deadlock); the connection is fine.
	serverBusy
)

func classifyWriteError(err error, conn *pgx.Conn) writeError {
	if code := pgerr.Code(err); code != "" {
		switch {
		case conn == nil || conn.IsClosed(), pgerr.ConnectionLost(code):
			return connectionLost
		case pgerr.Refused(code):
			// The write itself is refused: what the database cannot
			// store, or one of dama's guards.
			return statementError
		}
		// Anything else says nothing of the write: the server is short
		// of resources, cut it short, rolled it back, is read-only for
		// a switchover, lacks a grant being restored, or failed
		// inside. The same write may pass next time.
		return serverBusy
	}
	if conn == nil || conn.IsClosed() || pgerr.Unreachable(err) || errors.Is(err, context.DeadlineExceeded) {
		return connectionLost
	}
	return statementError
}
