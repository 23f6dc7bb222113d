package taskrunner

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
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
	// sampleEvery is the least time between two queued lines of a sampled
	// suffix (config.ProgressInterval, see writesample.go); 0 queues every
	// line. samples holds what each sampled suffix holds back, and progress
	// the newest progress not yet on the context.
	sampleEvery time.Duration
	samples     map[string]*sample
	progress    contextProgress
	// tail is the attempt's log file, kept in the database (logtail.go);
	// nil keeps none. Set under mu, then used by the writer's goroutine.
	tail *logTail
	room chan struct{} // closed and replaced when piped events leave
	// batchLimit is how many events go in one statement: maxBatch (0),
	// halved after a batch was cut short. singleThrough, when set, is the
	// last sequence number of a refused batch: up to it, events are
	// written one at a time to find the refused one.
	batchLimit, singleThrough int
	// goneCount counts the replaced events still in events.
	goneCount int
	// appended numbers the events queued, in order; plainOrder is the
	// number of the last one that does not coalesce.
	appended, plainOrder int64
	nextSeq              int
	// eventErr is the last error that made the database refuse an event for
	// good; flush reports it.
	eventErr error
	idle     chan struct{} // closed and replaced when the queues empty

	wake       chan struct{}
	notify     chan *pgconn.Notification
	superseded chan struct{}
	supOnce    sync.Once
	// endedByOwnWrite: the run was found over by writes of its own whose
	// replies were lost (dropStored), which emptied the queue; guarded by
	// mu.
	endedByOwnWrite bool
	conn            dbConn
	// dial, when set, makes the writer's connections (host lock mode);
	// otherwise they are the writer's own, to url.
	dial func(ctx context.Context) (dbConn, error)
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
	resume func(ctx context.Context, conn dbConn) error
	// lost is told when a connection the writer had made fails.
	lost func(err error)
}

type writeCall struct {
	// ctx is the caller's: a call whose caller gave up is skipped, or cut
	// short if it already runs.
	ctx     context.Context
	fn      func(context.Context, dbConn) error
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
	// order is its place among the events queued (writer.appended).
	order int64
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
		samples:    make(map[string]*sample),
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
