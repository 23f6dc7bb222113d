package keeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pglisten"
)

// lockSession is the keeper's lock session: one connection that holds the
// session locks of every task process the keeper serves and listens to
// the channels they listen to. One goroutine (run, a pglisten.Listener)
// owns it: it waits on the connection, so that a failure is noticed at
// once (and a silence within the connection's probes), and runs the
// sessions' operations between two waits.
type lockSession struct {
	connect func(ctx context.Context) (*pgx.Conn, error)
	logger  *slog.Logger
	// lost is told when the connection failed, with every lock on it.
	lost func(error)
	// notify is handed each notification.
	notify func(*pgconn.Notification)

	mu       sync.Mutex
	ops      []*lockOp
	channels map[string]bool
	wake     chan struct{}
	// ended is closed once run returned: nothing more is answered.
	ended chan struct{}
}

type lockOpKind int

const (
	opKindLock lockOpKind = iota
	opKindUnlock
	opKindListen
	opKindPing
	// opKindReset ends the lock session, and every lock on it.
	opKindReset
)

type lockOp struct {
	kind    lockOpKind
	id      int64
	gen     uint64
	channel string
	ctx     context.Context
	done    chan lockResult

	// mu is held while the operation runs, and guards abandoned (its
	// caller gave up waiting before it ran: it never runs) and answered
	// (it ran: its caller gets its result, even one that gave up
	// meanwhile). So a lock is never taken for nobody, nor a lock
	// released late, after its context's next session took it.
	mu        sync.Mutex
	abandoned bool
	answered  bool
}

// answer runs op with run, unless its caller gave up, and hands it the
// result.
func (l *lockSession) answer(op *lockOp, run func() lockResult) {
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.abandoned {
		return
	}
	op.answered = true
	op.done <- run()
}

type lockResult struct {
	gen uint64
	err error
}

func newLockSession(connect func(context.Context) (*pgx.Conn, error), logger *slog.Logger, lost func(error), notify func(*pgconn.Notification)) *lockSession {
	return &lockSession{connect: connect, logger: logger, lost: lost, notify: notify,
		channels: make(map[string]bool), wake: make(chan struct{}, 1), ended: make(chan struct{})}
}

// lock takes context id's session lock and returns the generation of the
// connection that holds it.
func (l *lockSession) lock(ctx context.Context, id int64) (uint64, error) {
	return l.do(ctx, &lockOp{kind: opKindLock, id: id})
}

// unlock releases context id's session lock, if the connection of
// generation gen, which took it, still holds it.
func (l *lockSession) unlock(ctx context.Context, id int64, gen uint64) error {
	_, err := l.do(ctx, &lockOp{kind: opKindUnlock, id: id, gen: gen})
	return err
}

// listen listens to channel from now on, on this connection and every
// later one.
func (l *lockSession) listen(ctx context.Context, channel string) error {
	_, err := l.do(ctx, &lockOp{kind: opKindListen, channel: channel})
	return err
}

// ping checks that the lock session is open.
func (l *lockSession) ping(ctx context.Context) error {
	_, err := l.do(ctx, &lockOp{kind: opKindPing})
	return err
}

// reset ends the lock session, and with it every lock it holds: their
// sessions end, and their task processes take them again through a new
// one.
func (l *lockSession) reset() {
	ctx, cancel := context.WithTimeout(context.Background(), lockOpTimeout)
	defer cancel()
	l.do(ctx, &lockOp{kind: opKindReset})
}

func (l *lockSession) do(ctx context.Context, op *lockOp) (uint64, error) {
	op.ctx, op.done = ctx, make(chan lockResult, 1)
	l.mu.Lock()
	l.ops = append(l.ops, op)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	select {
	case r := <-op.done:
		return r.gen, r.err
	case <-l.ended:
		return 0, fmt.Errorf("%w: the keeper is ending", ErrUnavailable)
	case <-ctx.Done():
	}
	op.mu.Lock()
	defer op.mu.Unlock()
	if op.answered {
		r := <-op.done
		return r.gen, r.err
	}
	op.abandoned = true
	return 0, ctx.Err()
}

func (l *lockSession) take() []*lockOp {
	l.mu.Lock()
	defer l.mu.Unlock()
	ops := l.ops
	l.ops = nil
	return ops
}

func (l *lockSession) run(ctx context.Context) {
	var (
		gen  uint64
		last backend
	)
	ln := &pglisten.Listener[*pgx.Conn]{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			conn, b, err := l.open(ctx, last)
			if err != nil {
				l.logger.Warn("open the lock session", "error", err)
				l.answerAll(fmt.Errorf("%w: %v", ErrUnavailable, err))
				return nil, err
			}
			last = b
			gen++
			return conn, nil
		},
		Look:   func(_ context.Context, conn *pgx.Conn) error { return l.applyAll(conn, gen) },
		Notify: func(_ context.Context, n *pgconn.Notification) error { l.notify(n); return nil },
		// An operation queued cuts any wait short.
		Wake: l.wake,
		// Every lock on the connection is gone with it.
		Lost: l.lost,
	}
	defer close(l.ended)
	defer l.answerAll(fmt.Errorf("%w: the keeper is ending", ErrUnavailable))
	_ = ln.Serve(ctx)
}

// answerAll fails every operation queued with err.
func (l *lockSession) answerAll(err error) {
	for _, op := range l.take() {
		l.answer(op, func() lockResult { return lockResult{err: err} })
	}
}

// applyAll runs the operations queued on conn, of generation gen. A reset
// fails the connection, and the listener makes another.
func (l *lockSession) applyAll(conn *pgx.Conn, gen uint64) error {
	reset := false
	for _, op := range l.take() {
		if reset {
			// The connection is about to go: what it would hold now would
			// be lost at once.
			l.answer(op, func() lockResult {
				return lockResult{err: fmt.Errorf("%w: the lock session is ending", ErrUnavailable)}
			})
			continue
		}
		reset = op.kind == opKindReset
		l.answer(op, func() lockResult { return lockResult{gen: gen, err: l.apply(conn, gen, op)} })
	}
	if reset {
		return errors.New("a lock could not be released")
	}
	return nil
}

// backend names a server process: by its pid and its start, since pids
// are reused (another host's keeper has the same application name).
type backend struct {
	pid   int32
	start time.Time
}

// open connects the lock session, ends the backend of the one before it
// if it is still there (a connection that went silent may hold its locks
// on the server until its keepalives give up), and listens to the
// channels.
func (l *lockSession) open(ctx context.Context, last backend) (*pgx.Conn, backend, error) {
	cctx, cancel := context.WithTimeout(ctx, lockOpTimeout)
	defer cancel()
	conn, err := l.connect(cctx)
	if err != nil {
		return nil, backend{}, err
	}
	var self backend
	if err := conn.QueryRow(cctx, `SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&self.pid, &self.start); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, backend{}, fmt.Errorf("read the lock session's backend: %w", err)
	}
	if last.pid != 0 {
		if _, err := conn.Exec(cctx, `
			SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			 WHERE pid = $1 AND backend_start = $2 AND datname = current_database()`,
			last.pid, last.start); err != nil {
			l.logger.Warn("end the lost lock session", "backend_pid", last.pid, "error", err)
		}
	}
	l.mu.Lock()
	var channels []string
	for ch := range l.channels {
		channels = append(channels, ch)
	}
	l.mu.Unlock()
	for _, ch := range channels {
		if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, backend{}, fmt.Errorf("listen on %s: %w", ch, err)
		}
	}
	return conn, self, nil
}

// apply runs op on conn, of generation gen.
func (l *lockSession) apply(conn *pgx.Conn, gen uint64, op *lockOp) error {
	// Not the caller's context: once it runs, it runs to its end.
	ctx, cancel := context.WithTimeout(context.Background(), lockOpTimeout)
	defer cancel()
	switch op.kind {
	case opKindLock:
		return etlcontext.TryLockSession(ctx, conn, op.id)
	case opKindUnlock:
		if op.gen != gen {
			// Taken on a connection that is gone, and the lock with it.
			return nil
		}
		return etlcontext.UnlockSession(ctx, conn, op.id)
	case opKindListen:
		l.mu.Lock()
		known := l.channels[op.channel]
		l.mu.Unlock()
		if known {
			return nil
		}
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{op.channel}.Sanitize()); err != nil {
			return fmt.Errorf("listen on %s: %w", op.channel, err)
		}
		l.mu.Lock()
		l.channels[op.channel] = true
		l.mu.Unlock()
		return nil
	case opKindPing:
		return conn.Ping(ctx)
	case opKindReset:
		return nil
	}
	return fmt.Errorf("unknown lock operation %d", op.kind)
}
