package keeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

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

// lockOp is an operation of a session on the lock session's connection.
type lockOp struct {
	// run carries it out on conn, of generation gen.
	run func(ctx context.Context, conn *pgx.Conn, gen uint64) error
	// reset ends the lock session, and every lock on it, once run.
	reset bool
	done  chan lockResult

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

// lock takes context id's session lock for a task process of protocol
// that holds key, in one statement (etlcontext.LockRunSQL), and returns
// the generation of the connection that ran it and what it answered: the
// context's row under the lock, none when another process holds it.
func (l *lockSession) lock(ctx context.Context, id int64, key string, protocol int) (uint64, *pgconn.Result, error) {
	var res *pgconn.Result
	gen, err := l.do(ctx, &lockOp{run: func(ctx context.Context, conn *pgx.Conn, _ uint64) error {
		res = conn.PgConn().ExecParams(ctx, etlcontext.LockRunSQL,
			[][]byte{strconv.AppendInt(nil, id, 10), strconv.AppendInt(nil, int64(protocol), 10), []byte(key)},
			[]uint32{pgtype.Int8OID, pgtype.Int4OID, pgtype.TextOID}, nil, []int16{pgtype.BinaryFormatCode}).Read()
		return res.Err
	}})
	return gen, res, err
}

// unlock releases context id's session lock, if the connection of
// generation gen, which took it, still holds it, and with announce tells
// the supervisors that its task process ends, in the same statement.
func (l *lockSession) unlock(ctx context.Context, id int64, gen uint64, announce bool) error {
	_, err := l.do(ctx, &lockOp{run: func(ctx context.Context, conn *pgx.Conn, connGen uint64) error {
		if connGen != gen {
			// Taken on a connection that is gone, and the lock with it.
			if announce {
				return etlcontext.Announce(ctx, conn, id)
			}
			return nil
		}
		return etlcontext.UnlockSession(ctx, conn, id, announce)
	}})
	return err
}

// announce tells the supervisors that context id's task process ends.
func (l *lockSession) announce(ctx context.Context, id int64) error {
	_, err := l.do(ctx, &lockOp{run: func(ctx context.Context, conn *pgx.Conn, _ uint64) error {
		return etlcontext.Announce(ctx, conn, id)
	}})
	return err
}

// listen listens to channel from now on, on this connection and every
// later one.
func (l *lockSession) listen(ctx context.Context, channel string) error {
	_, err := l.do(ctx, &lockOp{run: func(ctx context.Context, conn *pgx.Conn, _ uint64) error {
		l.mu.Lock()
		known := l.channels[channel]
		l.mu.Unlock()
		if known {
			return nil
		}
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return fmt.Errorf("listen on %s: %w", channel, err)
		}
		l.mu.Lock()
		l.channels[channel] = true
		l.mu.Unlock()
		return nil
	}})
	return err
}

// ping checks that the lock session is open.
func (l *lockSession) ping(ctx context.Context) error {
	_, err := l.do(ctx, &lockOp{run: func(ctx context.Context, conn *pgx.Conn, _ uint64) error {
		return conn.Ping(ctx)
	}})
	return err
}

// reset ends the lock session, and every lock it holds, as a failure of
// its connection would.
func (l *lockSession) reset() {
	ctx, cancel := context.WithTimeout(context.Background(), lockOpTimeout)
	defer cancel()
	l.do(ctx, &lockOp{reset: true, run: func(context.Context, *pgx.Conn, uint64) error { return nil }})
}

func (l *lockSession) do(ctx context.Context, op *lockOp) (uint64, error) {
	op.done = make(chan lockResult, 1)
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
		reset = op.reset
		l.answer(op, func() lockResult {
			// Not the caller's context: once it runs, it runs to its end.
			ctx, cancel := context.WithTimeout(context.Background(), lockOpTimeout)
			defer cancel()
			return lockResult{gen: gen, err: op.run(ctx, conn, gen)}
		})
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
	channels := slices.Collect(maps.Keys(l.channels))
	l.mu.Unlock()
	for _, ch := range channels {
		if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, backend{}, fmt.Errorf("listen on %s: %w", ch, err)
		}
	}
	return conn, self, nil
}
