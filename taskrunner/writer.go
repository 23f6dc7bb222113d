package taskrunner

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// Bounds of the command's events waiting in memory for the database. At
// either bound the runner stops reading the pipe, so the command blocks on
// its next write: backpressure, not loss. PROGRESS and CHECKPOINT lines
// never wait: at the bounds the newest replaces the one waiting, so a
// command that only reports its state never blocks.
const (
	maxPendingEvents = 1000
	maxPendingBytes  = 8 << 20
	// maxBatch and maxBatchBytes bound the events, and their payloads
	// (beyond one event), written in one statement.
	maxBatch      = 256
	maxBatchBytes = 1 << 20
)

// sampled are the suffixes that are sampled (writesample.go) and coalesce.
var sampled = []string{protocol.EventProgress, protocol.EventCheckpoint}

// writer owns the runner's write connection. Every write goes through it in
// order, and none makes its caller wait: the runner's main loop only queues.
// The connection is re-made for as long as the runner lives; every statement
// has a deadline; events carry a sequence number, so that a write retried
// after a lost connection is stored once.
type writer struct {
	url, name string
	runKey    string // Options.RunKey
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
	// the bounds; room is closed and replaced when one leaves.
	piped, pipedBytes int
	room              chan struct{}
	// latest is the newest waiting event of each coalescing key (a sampled
	// suffix, replacedKey) that a newer one may still replace.
	latest      map[string]*pendingEvent
	goneCount   int           // replaced events still in events
	sampleEvery time.Duration // config.ProgressInterval (writesample.go); 0 holds none
	samples     map[string]*sample
	progress    contextProgress
	// batchLimit is how many events go in one statement: maxBatch (0),
	// halved after a batch was cut short. singleThrough, when set, is the
	// last sequence number of a refused batch: up to it, events are
	// written one at a time to find the refused one.
	batchLimit, singleThrough int
	nextSeq                   int
	eventErr                  error         // why an outcome was refused for good, for flush
	idle                      chan struct{} // closed and replaced when the queues empty
	endedByOwnWrite           bool          // found over by writes whose replies were lost (dropStored)
	refusedChildren           int
	written                   int      // the events written so far, for outage
	alsoListen                []string // listenToo's channels, listened to on every new connection
	outage                    *outage  // the runner's, the lock keeper's too

	wake       chan struct{}
	notify     chan *pgconn.Notification
	superseded chan struct{}
	supOnce    sync.Once
	conn       dbConn
	dial       func(ctx context.Context) (dbConn, error) // makes the connections, if set; else to url
	connErr    error                                     // why the current connection failed, for hooks.lost
	hooks      writerHooks
	submit     SubmitFunc              // records the children the command submits; nil refuses them
	tail       atomic.Pointer[logTail] // the log file kept in the database (logtail.go), if any

	// Only the writer's goroutine uses these. busySaid is when sayBusy last
	// logged. cancelHinted: a cancellation of this run was announced, yet
	// to be confirmed by the database's record (confirmCancel), which last
	// read it at confirmedAt; ignored counts the hints it found unrecorded
	// since it last said so, at ignoredSaid: a flood of false hints costs a
	// read per confirmInterval and a log line a minute.
	busySaid                 time.Time
	cancelHinted             bool
	confirmedAt, ignoredSaid time.Time
	ignored                  int
	wakeSet                  atomic.Bool // a wake-up of signalIn is pending
}

// writerHooks let the runner act on the writer's connection (the lock's, in advisory mode).
type writerHooks struct {
	// resume runs first on every new connection but the first, after its
	// LISTENs and before anything else is sent on it. An error closes the
	// connection, to be made again; an error that says the run is no longer
	// current (see permanent) supersedes the run: nothing more is written.
	resume func(ctx context.Context, conn dbConn) error
	lost   func(err error) // told when a connection the writer had made fails
}

type writeCall struct {
	// ctx is the caller's: a call whose caller gave up is skipped, or cut
	// short if it already runs.
	ctx              context.Context
	fn               func(context.Context, dbConn) error
	done             chan error
	started, skipped bool // guarded by writer.mu
}

type pendingEvent struct {
	ev    etlcontext.NewEvent
	size  int
	piped bool // counts against the bounds
	// coalesce, when set, is the key under which a newer event replaces
	// this one while it waits.
	coalesce string
	gone     bool // replaced by a newer one before it was written
	// attempted: sent at least once, so perhaps stored: it can no longer
	// be replaced, nor anything merged into it.
	attempted bool
	// replaced, when set, is what was replaced in reported lines; the
	// event's meta is made from it when it is written.
	replaced *replacedNote
	// fallback, when set, is the payload to store instead when the
	// database refuses this one for good: an outcome is never lost.
	fallback any
	outcome  bool // the attempt's outcome, whose loss flush reports
	stoodIn  bool // a WARNING standing in for an event the database refused
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
	w := &writer{
		url: url, name: name, logger: logger, stmtTimeout: stmtTimeout, hooks: hooks,
		idle:       make(chan struct{}),
		room:       make(chan struct{}),
		latest:     make(map[string]*pendingEvent),
		samples:    map[string]*sample{protocol.EventProgress: {}, protocol.EventCheckpoint: {}},
		wake:       make(chan struct{}, 1),
		notify:     make(chan *pgconn.Notification, 16),
		superseded: make(chan struct{}),
	}
	w.outage = &outage{logger: logger, reports: w.reports, down: map[string]bool{}}
	return w
}

// reports returns how many events were written so far, and how many wait.
func (w *writer) reports() (written, waiting int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written, len(w.events) - w.goneCount
}

// bind names the run the writer writes for, once the lock is held.
func (w *writer) bind(contextID int64, runID, kind string) {
	w.mu.Lock()
	w.contextID, w.runID, w.kind = contextID, runID, kind
	w.mu.Unlock()
}

func (w *writer) signal() {
	offer(w.wake, struct{}{})
}

// offer sends v on ch unless ch is full, and reports whether it did.
func offer[T any](ch chan<- T, v T) bool {
	select {
	case ch <- v:
		return true
	default:
		return false
	}
}

// event queues an event of the runner's own; it never blocks, nor is
// dropped. It follows every line the command reported before it, held
// ones too: a STALLED event is the task's latest until the command
// reports again.
func (w *writer) event(suffix string, payload, meta any, isError bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.releaseHeld(sampled...)
	w.append(w.newEvent(suffix, payload, meta, isError))
}

// outcome queues the attempt's outcome, and fallback to store should it be refused.
func (w *writer) outcome(suffix string, payload, fallback protocol.Outcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// The newest checkpoint is stored before the outcome.
	w.releaseHeld(sampled...)
	e := w.newEvent(suffix, payload, nil, false)
	e.fallback, e.outcome = fallback, true
	w.append(e)
}

// report queues an event the command reported; replaced is what its line
// needed replacing. It waits while the bounds are reached, until ctx ends or
// the run is superseded, unless the event coalesces: then it is sampled
// (writesample.go), and at the bounds replaces the waiting one.
func (w *writer) report(ctx context.Context, suffix string, payload json.RawMessage, meta any, isError bool, replaced etlcontext.Replaced) error {
	e := w.newEvent(suffix, payload, meta, isError)
	e.piped = true
	if slices.Contains(sampled, suffix) {
		e.coalesce = suffix
		w.mu.Lock()
	} else if err := w.waitRoom(ctx, e.size); err != nil {
		return err
	}
	defer w.mu.Unlock()
	w.noteReplaced(suffix, replaced)
	switch {
	case e.coalesce == "":
		w.releaseHeld(protocol.EventCheckpoint)
	case w.hold(e):
		return nil
	}
	w.append(e)
	return nil
}

// waitRoom returns, with w.mu held, once an event of size fits the bounds.
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

// full reports whether an event of size from the pipe would pass the
// bounds; w.mu is held. An event alone in the queue always fits.
func (w *writer) full(size int) bool {
	return w.piped > 0 && (w.piped >= maxPendingEvents || w.pipedBytes+size > maxPendingBytes)
}

// newEvent makes an event of the run, its payload and meta cleaned for the database.
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

// append queues e; w.mu is held. At the bounds, a coalescing e replaces
// the waiting one of its key; until then every report is kept.
func (w *writer) append(e *pendingEvent) {
	if e.replaced != nil && e.coalesce != replacedKey {
		// Noted ahead of e: nothing may follow an outcome.
		w.mergeReplaced(e.replaced)
		e.replaced = nil
	}
	e.ev.RunID = new(w.runID)
	switch e.coalesce {
	case "":
		// The checkpoint waiting before e is no longer replaced: what was
		// reported after a checkpoint is never stored before it.
		delete(w.latest, protocol.EventCheckpoint)
	case protocol.EventProgress:
		// The event sets the context's progress.
		w.progress.payload, w.progress.setAt, w.progress.due = nil, time.Now(), false
		w.progress.gen++
	}
	if s := w.samples[e.coalesce]; s != nil {
		s.queuedAt = time.Now()
	}
	if e.coalesce != "" {
		// mergeReplaced appends a WARNING only when none may be merged into.
		if old := w.latest[e.coalesce]; old != nil && !old.attempted && w.full(e.size) {
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

// compact drops the replaced events once they are half the queue: progress
// reported while the database is away must not grow it; w.mu is held.
func (w *writer) compact() {
	if w.goneCount < 64 || w.goneCount < len(w.events)/2 {
		return
	}
	w.events = slices.DeleteFunc(w.events, func(e *pendingEvent) bool { return e.gone })
	w.goneCount = 0
}

// noteReplaced records r, if anything, replaced in a line of type what;
// w.mu is held. One WARNING stands for every replacement until written.
func (w *writer) noteReplaced(what string, r etlcontext.Replaced) {
	if r.Any() {
		w.mergeReplaced(&replacedNote{lines: 1, replaced: r, types: []string{what}})
	}
}

// replacedIn is noteReplaced for what is not itself queued (a failure, a child).
func (w *writer) replacedIn(what string, r etlcontext.Replaced) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.noteReplaced(what, r)
}

func (w *writer) mergeReplaced(n *replacedNote) {
	if old := w.latest[replacedKey]; old != nil && !old.attempted {
		old.replaced.lines += n.lines
		old.replaced.replaced = old.replaced.replaced.Add(n.replaced)
		for _, t := range n.types {
			if !slices.Contains(old.replaced.types, t) {
				old.replaced.types = append(old.replaced.types, t)
			}
		}
		return
	}
	e := w.newEvent(protocol.EventWarning, nil, nil, false)
	e.size, e.coalesce, e.replaced = 512, replacedKey, n
	w.append(e)
}

// leave accounts for e leaving the queue, written or replaced; w.mu is held.
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
			// The runner's own values always encode; rather than lose the event.
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

// submitChild queues c, submitted in order with a SUBMITTED event, in one
// transaction: the event's fence refuses the child of a run no longer
// current. It waits for room as report does: a child is never dropped.
func (w *writer) submitChild(ctx context.Context, c protocol.Child) error {
	size := 256 + len(c.Args) + len(c.Kind) + len(c.IdempotencyKey)
	if err := w.waitRoom(ctx, size); err != nil {
		return err
	}
	defer w.mu.Unlock()
	w.releaseHeld(protocol.EventCheckpoint)
	c.ParentID = w.contextID
	e := w.newEvent(protocol.EventSubmitted, nil, nil, false)
	e.size, e.child, e.piped = size, &c, true
	// Numbered now, for its key; other events are numbered when first
	// written, so that those a newer one replaced use up no number.
	w.nextSeq++
	e.ev.Seq = new(w.nextSeq)
	w.append(e)
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
