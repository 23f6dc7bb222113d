package keeper

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// notifyBuffer bounds the notifications waiting to be sent to a session
// (pass) or read from one (Conn.read).
const notifyBuffer = 64

// lockOpTimeout bounds an operation on the lock session.
const lockOpTimeout = 20 * time.Second

// maxTimeout bounds what a request may ask for.
const maxTimeout = time.Minute

// session serves one connection of a task process: its requests, one at a
// time, and the notifications of the channels it listens to.
type session struct {
	s    *server
	conn net.Conn
	// st is the session's stream once the handshake is done; only serve's
	// goroutine sets it, before anything else uses it.
	st *stream

	// Set by hello, then read only.
	contextID int64
	runKey    string
	// verified: the database took the session's key, as it took its
	// lock (takeLock); no statement runs for the session before.
	verified bool

	// lockGen is the lock session's generation when this session took its
	// lock.
	lockGen uint64

	// tx is the session's open transaction, on a connection of the pool
	// taken for it; depth counts its savepoints. Only serve's goroutine
	// uses them.
	tx    *pgxpool.Conn
	depth int

	mu       sync.Mutex
	channels map[string]bool
	// notes holds the notifications waiting to be sent; missed, the last
	// dropped of each channel.
	notes  chan *pgconn.Notification
	missed map[string]*pgconn.Notification
}

func (sess *session) serve(ctx context.Context) {
	defer sess.s.closed(sess)
	defer sess.conn.Close()
	// A connection that says nothing, or not the secret, is not kept: a
	// task process says its part at once.
	st, err := serverHandshake(sess.conn, sess.s.cfg.Secret, time.Now().Add(handshakeTimeout))
	// Its place among the unproven is free once the database took its
	// key, or it ended.
	proven := false
	defer func() {
		if !proven {
			<-sess.s.unproven
		}
	}()
	if err != nil {
		sess.s.logger.Debug("refused a connection", "error", err)
		return
	}
	sess.st = st
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	go sess.forward(fctx)
	defer func() {
		if sess.tx != nil {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			sess.dropTx(rctx)
		}
	}()
	// Nor one that does not prove its key, in its lock, at once: until
	// then its messages are small, and one lock is all it may ask.
	sess.conn.SetReadDeadline(time.Now().Add(verifyTimeout))
	for {
		var req request
		if err := sess.st.receive(&req); err != nil {
			return
		}
		if sess.contextID == 0 {
			err := sess.hello(&req)
			sess.reply(&reply{Err: toWire(err)})
			if err != nil {
				return
			}
			continue
		}
		r := sess.handle(ctx, &req)
		if !sess.verified {
			sess.reply(r)
			return
		}
		if !proven {
			proven = true
			<-sess.s.unproven
			sess.conn.SetReadDeadline(time.Time{})
			sess.st.limit.Store(int64(sess.s.cfg.MaxMessage))
		}
		if err := sess.reply(r); err != nil {
			return
		}
	}
}

// verifyTimeout bounds the time from a session's handshake to its proof
// of its key: its hello, then its lock, which a task process asks at once.
const verifyTimeout = 10 * time.Second

// reply sends r, or, when r is too large to send, the failure of its
// statement.
func (sess *session) reply(r *reply) error {
	err := sess.st.send(r)
	if errors.Is(err, errTooLarge) {
		err = sess.st.send(&reply{Err: &wireError{Kind: errStatement, Message: err.Error()}})
	}
	return err
}

// forward sends the notifications waiting for the session until ctx ends.
func (sess *session) forward(ctx context.Context) {
	for {
		select {
		case n := <-sess.notes:
			if err := sess.st.send(&reply{Notification: n}); err != nil {
				return
			}
			sess.mu.Lock()
			var missed []*pgconn.Notification
			if len(sess.notes) == 0 {
				missed = slices.Collect(maps.Values(sess.missed))
				clear(sess.missed)
			}
			sess.mu.Unlock()
			for _, n := range missed {
				if err := sess.st.send(&reply{Notification: standIn(n)}); err != nil {
					return
				}
			}
		case <-ctx.Done():
			return
		}
	}
}

// listens reports whether the session listens to n's channel; a
// cancellation only when it names the session's context.
func (sess *session) listens(n *pgconn.Notification) bool {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if !sess.channels[n.Channel] {
		return false
	}
	return n.Channel != protocol.CancelChannel || n.Payload == strconv.FormatInt(sess.contextID, 10)
}

// pass queues n for the session, never waiting: a session that does not
// read its notifications gets one with an empty payload in place of
// those it missed.
func (sess *session) pass(n *pgconn.Notification) {
	select {
	case sess.notes <- n:
	default:
		sess.mu.Lock()
		sess.missed[n.Channel] = n
		sess.mu.Unlock()
		// A notification is sent after the missed are noted: the
		// forwarder, woken by none, would sit on them.
		select {
		case sess.notes <- standIn(n):
		default:
		}
	}
}

// standIn is the notification that stands for n and the others of its
// channel that were dropped: an empty payload, which the task process
// reads as "look again"; a cancellation is passed to its context's
// session only, and kept whole.
func standIn(n *pgconn.Notification) *pgconn.Notification {
	if n.Channel == protocol.CancelChannel {
		return n
	}
	return &pgconn.Notification{Channel: n.Channel}
}

// hello opens the session for the run whose key it gives; the database
// checks the key as the session takes its lock, its first request.
func (sess *session) hello(req *request) error {
	switch {
	case req.Op != opHello:
		return fmt.Errorf("%w: a session begins with its hello", ErrRefused)
	case req.Version != Version:
		return fmt.Errorf("%w: protocol version %d, this keeper speaks %d", ErrRefused, req.Version, Version)
	case req.ContextID <= 0:
		return fmt.Errorf("%w: task %d", ErrRefused, req.ContextID)
	case req.RunKey == "":
		return fmt.Errorf("%w: a session needs its run's key", ErrRefused)
	}
	sess.contextID, sess.runKey = req.ContextID, req.RunKey
	return nil
}

func (sess *session) handle(ctx context.Context, req *request) *reply {
	rctx, cancel := context.WithTimeout(ctx, min(max(req.Timeout, time.Second), maxTimeout))
	defer cancel()
	if !sess.verified && req.Op != opLock {
		// Not even a listen or a ping: nothing for a key not taken.
		return &reply{Err: &wireError{Kind: errRefused, Message: "a session takes its lock, which checks its key, before anything else"}}
	}
	switch req.Op {
	case opDescribe:
		return sess.describe(rctx, req)
	case opExec:
		return sess.exec(rctx, req)
	case opBegin:
		return &reply{Err: toWire(sess.begin(rctx, req.Depth))}
	case opCommit, opRollback:
		return &reply{Err: toWire(sess.end(rctx, req.Op == opCommit, req.Depth))}
	case opLock:
		return sess.takeLock(rctx, req.Protocol)
	case opUnlock:
		return &reply{Err: toWire(sess.releaseLock(rctx, req.Announce))}
	case opListen:
		return &reply{Err: toWire(sess.listen(rctx, req.Channel))}
	case opPing:
		return &reply{Err: toWire(sess.s.lock.ping(rctx))}
	}
	return &reply{Err: &wireError{Kind: errStatement, Message: fmt.Sprintf("unknown request %d", req.Op)}}
}

// describe asks the server for the types of a statement's parameters and
// results, on any connection: the task process encodes its arguments with
// them.
func (sess *session) describe(ctx context.Context, req *request) *reply {
	var sd *pgconn.StatementDescription
	// Parsed, not run: the connection is as it was.
	err := sess.onConn(ctx, false, func(ctx context.Context, pc *pgconn.PgConn) error {
		var err error
		sd, err = pc.Prepare(ctx, "", req.SQL, nil)
		return err
	})
	if err != nil {
		return &reply{Err: toWire(err)}
	}
	return &reply{ParamOIDs: sd.ParamOIDs, Fields: sd.Fields}
}

// onConn runs fn on the session's transaction's connection, or on one of
// the pool's, reset once released when fn may change its state.
func (sess *session) onConn(ctx context.Context, changes bool, fn func(context.Context, *pgconn.PgConn) error) error {
	if sess.tx != nil {
		return fn(ctx, sess.tx.Conn().PgConn())
	}
	conn, err := sess.s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errNoConnection, err)
	}
	defer conn.Release()
	if changes {
		markChanged(conn)
	}
	return fn(ctx, conn.Conn().PgConn())
}

// changedKey marks, in a pooled connection's CustomData, that a statement
// of a session ran on it that may have changed its state.
const changedKey = "dama-keeper-changed"

func markChanged(conn *pgxpool.Conn) { conn.Conn().PgConn().CustomData()[changedKey] = true }

// resetChanged is the pool's AfterRelease: it resets a connection that
// markChanged marked, as it was when made (DISCARD ALL, then
// afterConnect again), and keeps it; one it cannot reset is closed. Then
// next, the AfterRelease the pool was given, if any.
func resetChanged(next func(*pgx.Conn) bool, afterConnect func(context.Context, *pgx.Conn) error) func(*pgx.Conn) bool {
	return func(conn *pgx.Conn) bool {
		if data := conn.PgConn().CustomData(); data[changedKey] != nil {
			delete(data, changedKey)
			ctx, cancel := context.WithTimeout(context.Background(), resetTimeout)
			defer cancel()
			// The keeper's own statements on the pool are unnamed, so
			// that pgx keeps no prepared statement that this discards.
			if err := conn.PgConn().Exec(ctx, "DISCARD ALL").Close(); err != nil {
				return false
			}
			if afterConnect != nil && afterConnect(ctx, conn) != nil {
				return false
			}
		}
		return next == nil || next(conn)
	}
}

// resetTimeout bounds the reset of a connection that goes back to the pool.
const resetTimeout = 10 * time.Second

// errNoConnection: no connection of the pool came free before the
// request's deadline; its statement was never sent.
var errNoConnection = errors.New("every connection of the lock keeper is busy")

// exec runs a statement: in the session's transaction, or else in one of
// its own that holds the run's key, sent with the statement in one round
// trip, or set by the statement itself (etlcontext.KeyParam).
func (sess *session) exec(ctx context.Context, req *request) *reply {
	if len(req.Params) != len(req.ParamOIDs) {
		msg := fmt.Sprintf("parameters: %d values where %d are expected", len(req.Params), len(req.ParamOIDs))
		return &reply{Err: &wireError{Kind: errStatement, Message: msg}}
	}
	keyed := false
	if i, ok := etlcontext.KeyParam(req.SQL); ok && i < len(req.Params) {
		// The statement sets the key itself, first: the session's.
		req.Params[i], keyed = []byte(sess.runKey), true
	}
	var res *pgconn.Result
	// Only etlcontext's own statements that set the key are known to
	// leave the connection as they found it.
	err := sess.onConn(ctx, !keyed, func(ctx context.Context, pc *pgconn.PgConn) error {
		if sess.tx != nil || keyed {
			res = pc.ExecParams(ctx, req.SQL, req.Params, req.ParamOIDs, req.ParamFormats, req.ResultFormats).Read()
			return res.Err
		}
		b := &pgconn.Batch{}
		b.ExecParams("SELECT pg_catalog.set_config($1, $2, true)", [][]byte{[]byte(etlcontext.RunKeySetting), []byte(sess.runKey)}, []uint32{25, 25}, nil, nil)
		b.ExecParams(req.SQL, req.Params, req.ParamOIDs, req.ParamFormats, req.ResultFormats)
		results, err := pc.ExecBatch(ctx, b).ReadAll()
		if err != nil {
			return err
		}
		if len(results) != 2 {
			return fmt.Errorf("%d results of a statement", len(results))
		}
		res = results[1]
		return res.Err
	})
	if err != nil {
		if sess.tx != nil && sess.tx.Conn().IsClosed() {
			// The transaction died with its connection: the task process's
			// next Begin starts afresh.
			sess.dropTx(ctx)
		}
		return &reply{Err: toWire(err)}
	}
	return &reply{Fields: res.FieldDescriptions, Rows: rowsOf(res.Rows), Tag: res.CommandTag.String()}
}

// begin opens the session's transaction, holding the run's key, or a
// savepoint in it.
func (sess *session) begin(ctx context.Context, depth int) error {
	if depth > 0 {
		if sess.tx == nil || depth != sess.depth+1 {
			return fmt.Errorf("savepoint %d in a transaction at depth %d", depth, sess.depth)
		}
		if _, err := sess.tx.Exec(ctx, "SAVEPOINT "+savepoint(depth)); err != nil {
			return err
		}
		sess.depth = depth
		return nil
	}
	if sess.tx != nil {
		// One whose end failed: it is over for its task process.
		sess.dropTx(ctx)
	}
	conn, err := sess.s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Whatever the task process sends in it.
	markChanged(conn)
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		conn.Release()
		return err
	}
	sess.tx, sess.depth = conn, 0
	if err := conn.Conn().PgConn().ExecParams(ctx, "SELECT pg_catalog.set_config($1, $2, true)",
		[][]byte{[]byte(etlcontext.RunKeySetting), []byte(sess.runKey)}, []uint32{pgtype.TextOID, pgtype.TextOID}, nil, nil).Read().Err; err != nil {
		sess.dropTx(ctx)
		return err
	}
	return nil
}

// end commits or rolls back the session's transaction, or releases or
// rolls back to a savepoint of it. The transaction's connection goes back
// to the pool either way.
func (sess *session) end(ctx context.Context, commit bool, depth int) error {
	if sess.tx == nil {
		return errors.New("no transaction is open")
	}
	if depth > 0 {
		// As pgx: a savepoint is over once released or rolled back to,
		// whatever the server said, and one already over ends nothing.
		if depth > sess.depth {
			return fmt.Errorf("savepoint %d is over", depth)
		}
		stmt := "RELEASE SAVEPOINT " + savepoint(depth)
		if !commit {
			stmt = "ROLLBACK TO SAVEPOINT " + savepoint(depth)
		}
		_, err := sess.tx.Exec(ctx, stmt)
		sess.depth = depth - 1
		return err
	}
	stmt := "COMMIT"
	if !commit {
		stmt = "ROLLBACK"
	}
	tag, err := sess.tx.Exec(ctx, stmt)
	conn := sess.tx
	sess.tx, sess.depth = nil, 0
	if err != nil {
		// Neither ended for sure: the connection is not reused.
		conn.Conn().Close(context.WithoutCancel(ctx))
	}
	conn.Release()
	if err == nil && commit && tag.String() == "ROLLBACK" {
		return errors.New("commit unexpectedly resulted in rollback")
	}
	return err
}

func savepoint(depth int) string { return "sp_" + strconv.Itoa(depth) }

// dropTx rolls back the session's transaction and gives its connection
// back (closed, if the rollback failed).
func (sess *session) dropTx(ctx context.Context) {
	if _, err := sess.tx.Exec(ctx, "ROLLBACK"); err != nil {
		sess.tx.Conn().Close(context.WithoutCancel(ctx))
	}
	sess.tx.Release()
	sess.tx, sess.depth = nil, 0
}

// takeLock takes the session's context's lock on the lock session, once
// the database took the session's key and the task process's protocol,
// and answers the context's row under the lock: none when another process
// holds it. The session becomes its holder only once the database took
// its key: a session with a wrong key never keeps the rightful one out.
func (sess *session) takeLock(ctx context.Context, protocol int) *reply {
	gen, res, err := sess.s.lock.lock(ctx, sess.contextID, sess.runKey, protocol)
	if err != nil {
		return &reply{Err: toWire(err)}
	}
	// Taken or not, the key was checked.
	sess.verified = true
	if len(res.Rows) == 0 {
		return &reply{Fields: res.FieldDescriptions}
	}
	if err := sess.s.take(sess); err != nil {
		// Another session holds it, and the lock session's lock, which is
		// re-entrant, was taken once more for this one: once less now.
		uctx, cancel := context.WithTimeout(context.Background(), lockOpTimeout)
		defer cancel()
		if uerr := sess.s.lock.unlock(uctx, sess.contextID, gen, false); uerr != nil && !errors.Is(uerr, ErrUnavailable) {
			sess.s.lock.reset()
		}
		return &reply{Err: toWire(err)}
	}
	if err := sess.held(gen); err != nil {
		return &reply{Err: toWire(err)}
	}
	return &reply{Fields: res.FieldDescriptions, Rows: rowsOf(res.Rows)}
}

// held records that the session holds its lock, taken on the lock
// session's connection of generation gen.
func (sess *session) held(gen uint64) error {
	sess.lockGen = gen
	if !sess.s.holds(sess) {
		// The lock session failed while the lock was being taken, and
		// forgot the holders: this lock, taken on the next one, is held
		// for nobody unless released here.
		uctx, cancel := context.WithTimeout(context.Background(), lockOpTimeout)
		defer cancel()
		if uerr := sess.s.lock.unlock(uctx, sess.contextID, gen, false); uerr != nil && !errors.Is(uerr, ErrUnavailable) {
			sess.s.lock.reset()
		}
		return fmt.Errorf("%w: the lock session was lost while the lock was taken", ErrUnavailable)
	}
	return nil
}

// releaseLock releases the session's context's lock, and with announce
// tells the supervisors that its task process ends, in the same statement.
func (sess *session) releaseLock(ctx context.Context, announce bool) error {
	if !sess.s.holds(sess) {
		if announce {
			return sess.s.lock.announce(ctx, sess.contextID)
		}
		return nil
	}
	// Dropped once released: failed, the session's end tries again.
	if err := sess.s.lock.unlock(ctx, sess.contextID, sess.lockGen, announce); err != nil {
		return err
	}
	sess.s.drop(sess)
	return nil
}

// listen passes on channel's notifications to the session from now on.
func (sess *session) listen(ctx context.Context, channel string) error {
	if err := sess.s.lock.listen(ctx, channel); err != nil {
		return err
	}
	sess.mu.Lock()
	sess.channels[channel] = true
	sess.mu.Unlock()
	return nil
}
