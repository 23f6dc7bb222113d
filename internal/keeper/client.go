package keeper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/dama-etl/dama/etlcontext"
)

// Conn is a task process's session with its host's keeper: it stands for
// a connection of the task process's own, holding the run's key, whose
// statements the keeper runs on its pool and whose lock it holds on its
// lock session for as long as the session lasts. Like a pgx.Conn, it
// serves one caller at a time.
type Conn struct {
	st      *stream
	typeMap *pgtype.Map
	// descs caches the descriptions of the statements sent.
	descMu sync.Mutex
	descs  map[string]*pgconn.StatementDescription

	mu      sync.Mutex // one request at a time
	replies chan *reply
	notes   chan *pgconn.Notification

	// listenMu guards verified, set once a Lock took the session's key,
	// and pending, the channels Listen was asked before: the keeper
	// passes on nothing until then, and Lock listens to them.
	listenMu sync.Mutex
	verified bool
	pending  []string

	closeOnce sync.Once
	closed    chan struct{}
	closeErr  error // set before closed is closed
}

// ErrClosed is what a request fails with once the session ended: the
// keeper ended it (its lock session failed, or it exited) or the
// connection broke.
var ErrClosed = errors.New("the session with the lock keeper ended")

// Dial connects to the keeper of socket, proves the secret (Secret) and
// checks the keeper's proof, and opens a session for context id's
// current run, whose key it gives. When no keeper serves the socket,
// it calls start, and tries again until ctx ends, calling start again
// every restartEvery while none serves (a keeper that was ending refused
// the one started meanwhile).
func Dial(ctx context.Context, socket string, secret []byte, id int64, runKey string, start func() error) (*Conn, error) {
	var started time.Time
	delay := 5 * time.Millisecond
	for {
		st, err := handshake(ctx, socket, secret)
		if err == nil {
			c := newConn(st)
			hello := &request{Op: opHello, Version: Version, ContextID: id, RunKey: runKey}
			if _, err := c.request(ctx, hello); err != nil {
				c.Close(context.WithoutCancel(ctx))
				return nil, fmt.Errorf("open a session with the lock keeper: %w", err)
			}
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to the lock keeper: %w", errors.Join(err, ctx.Err()))
		}
		if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT) {
			return nil, fmt.Errorf("connect to the lock keeper: %w", err)
		}
		if start != nil && time.Since(started) >= restartEvery {
			if err := start(); err != nil {
				return nil, fmt.Errorf("start a lock keeper: %w", err)
			}
			started = time.Now()
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// handshake connects to the keeper of socket and proves the secret. A
// keeper that closes the connection before its own proof is taken for
// one not there yet (ECONNREFUSED): it has as many connections that have
// proved nothing as it takes, or it is exiting.
func handshake(ctx context.Context, socket string, secret []byte) (*stream, error) {
	var nc net.Conn
	if err := viaDir(socket, func(addr string) (err error) {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "unix", addr)
		return err
	}); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	st, err := clientHandshake(nc, secret, deadline)
	if err != nil {
		nc.Close()
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
			return nil, fmt.Errorf("the keeper closed the connection unproven: %w", errors.Join(syscall.ECONNREFUSED, err))
		}
		return nil, err
	}
	return st, nil
}

// restartEvery spaces the keepers Dial starts.
const restartEvery = time.Second

// handshakeTimeout bounds a handshake, either side's: each says its part
// at once.
const handshakeTimeout = 5 * time.Second

func newConn(st *stream) *Conn {
	c := &Conn{
		st:      st,
		typeMap: pgtype.NewMap(),
		descs:   make(map[string]*pgconn.StatementDescription),
		replies: make(chan *reply, 1),
		notes:   make(chan *pgconn.Notification, notifyBuffer),
		closed:  make(chan struct{}),
	}
	go c.read()
	return c
}

// read receives the keeper's messages until the session ends.
func (c *Conn) read() {
	for {
		r := new(reply)
		if err := c.st.receive(r); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				// What a reader of the error needs: the connection ended.
				err = io.ErrUnexpectedEOF
			}
			c.end(fmt.Errorf("%w: %w", ErrClosed, err))
			return
		}
		if r.Notification != nil {
			select {
			case c.notes <- r.Notification:
			default:
				// Nobody reads them: the oldest makes way for a stand-in of
				// this one, as at the keeper.
				select {
				case <-c.notes:
				default:
				}
				select {
				case c.notes <- standIn(r.Notification):
				default:
				}
			}
			continue
		}
		select {
		case c.replies <- r:
		case <-c.closed:
			return
		}
	}
}

func (c *Conn) end(err error) {
	c.closeOnce.Do(func() {
		c.closeErr = err
		close(c.closed)
		c.st.conn.Close()
	})
}

// Close ends the session: the keeper releases its lock.
func (c *Conn) Close(context.Context) error {
	c.end(fmt.Errorf("%w: closed", ErrClosed))
	return nil
}

// IsClosed reports whether the session ended.
func (c *Conn) IsClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// replySlack is how long past a request's deadline its reply may take: the
// keeper ends the request at that deadline and says so, the session kept.
const replySlack = 5 * time.Second

// request sends req and waits for its reply until ctx ends, which ends the
// session: an answer may still come, and a session is one request at a
// time. A request that reaches its deadline first waits replySlack more
// for the keeper's answer: that it never sent the statement, every
// connection of its being busy (a thousand tasks ending at once), keeps
// the session, for that is not a lost lock. Any other late answer ends it:
// a statement cut short may have committed, which a new session looks at.
func (c *Conn) request(ctx context.Context, req *request) (*reply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.IsClosed() {
		return nil, c.closeErr
	}
	req.Timeout = maxTimeout
	if d, ok := ctx.Deadline(); ok {
		req.Timeout = time.Until(d)
	}
	if req.Timeout <= 0 {
		return nil, context.DeadlineExceeded
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := c.st.send(req); errors.Is(err, errTooLarge) {
		return nil, err
	} else if err != nil {
		c.end(fmt.Errorf("%w: %w", ErrClosed, err))
		return nil, c.closeErr
	}
	select {
	case r := <-c.replies:
		return r, r.Err.err()
	case <-c.closed:
		// The keeper may answer, then end the session (a lock that
		// did not take the key): the answer is read first.
		select {
		case r := <-c.replies:
			return r, r.Err.err()
		default:
		}
		return nil, c.closeErr
	case <-ctx.Done():
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t := time.NewTimer(replySlack)
		defer t.Stop()
		select {
		case r := <-c.replies:
			if r.Err == nil || r.Err.Kind == errBusy {
				return r, r.Err.err()
			}
		case <-c.closed:
			return nil, c.closeErr
		case <-t.C:
		}
	}
	c.end(fmt.Errorf("%w: %w", ErrClosed, ctx.Err()))
	return nil, ctx.Err()
}

// do is request for a request whose reply says nothing but its error.
func (c *Conn) do(ctx context.Context, req *request) error {
	_, err := c.request(ctx, req)
	return err
}

// Lock has the keeper hold the session's context's lock for as long as
// the session lasts, in the statement etlcontext.LockRunSQL, which checks
// the session's key and that the database accepts task processes of
// protocol before it takes the lock: read its rows, the context under the
// lock, with etlcontext.ScanLockRun. It fails with an error wrapping
// etlcontext.ErrLocked when another session of the keeper holds the lock.
// No statement runs for a session before its first Lock, and the keeper
// ends a session whose first Lock did not take its key. Lock listens to
// the channels Listen was asked before it, once the keeper took the key
// and before it returns.
func (c *Conn) Lock(ctx context.Context, protocol int) (pgx.Rows, error) {
	r, err := c.request(ctx, &request{Op: opLock, Protocol: protocol})
	if err == nil || errors.Is(err, etlcontext.ErrLocked) {
		c.listenMu.Lock()
		c.verified = true
		pending := c.pending
		c.pending = nil
		c.listenMu.Unlock()
		for _, ch := range pending {
			if lerr := c.Listen(ctx, ch); lerr != nil {
				return c.rows(nil, lerr)
			}
		}
	}
	return c.rows(r, err)
}

// Unlock has the keeper release the session's context's lock, and with
// announce tell the supervisors that the task process ends
// (protocol.ExitedChannel), in the same statement.
func (c *Conn) Unlock(ctx context.Context, announce bool) error {
	return c.do(ctx, &request{Op: opUnlock, Announce: announce})
}

// Listen has the keeper pass on channel's notifications from now on; on
// a session whose key the keeper has yet to take, from its Lock on, which
// listens before it returns: a task process that reads what it waits for
// after its Lock misses no notification of it.
func (c *Conn) Listen(ctx context.Context, channel string) error {
	c.listenMu.Lock()
	if !c.verified {
		if !slices.Contains(c.pending, channel) {
			c.pending = append(c.pending, channel)
		}
		c.listenMu.Unlock()
		return nil
	}
	c.listenMu.Unlock()
	return c.do(ctx, &request{Op: opListen, Channel: channel})
}

// Ping checks that the keeper serves and holds its lock session.
func (c *Conn) Ping(ctx context.Context) error { return c.do(ctx, &request{Op: opPing}) }

// WaitForNotification waits for a notification of a channel listened to,
// until ctx ends or the session does.
func (c *Conn) WaitForNotification(ctx context.Context) (*pgconn.Notification, error) {
	select {
	case n := <-c.notes:
		return n, nil
	default:
	}
	select {
	case n := <-c.notes:
		return n, nil
	case <-c.closed:
		return nil, c.closeErr
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// describe returns the description of sql, asking the keeper the first
// time.
func (c *Conn) describe(ctx context.Context, sql string) (*pgconn.StatementDescription, error) {
	c.descMu.Lock()
	sd, ok := c.descs[sql]
	c.descMu.Unlock()
	if ok {
		return sd, nil
	}
	r, err := c.request(ctx, &request{Op: opDescribe, SQL: sql})
	if err != nil {
		return nil, err
	}
	sd = &pgconn.StatementDescription{SQL: sql, ParamOIDs: r.ParamOIDs, Fields: r.Fields}
	c.descMu.Lock()
	if len(c.descs) >= maxDescriptions {
		clear(c.descs)
	}
	c.descs[sql] = sd
	c.descMu.Unlock()
	return sd, nil
}

// maxDescriptions bounds the descriptions a session keeps.
const maxDescriptions = 256

// Query runs sql with args and returns its rows, all read.
func (c *Conn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return c.rows(c.exec(ctx, sql, args))
}

// rows are the rows of r, the reply to a statement, or its error.
func (c *Conn) rows(r *reply, err error) (pgx.Rows, error) {
	if err == nil {
		for _, values := range r.Rows {
			// rows index a row's values by its fields.
			if len(values) != len(r.Fields) {
				err = fmt.Errorf("%w: a row of %d values for %d fields", ErrClosed, len(values), len(r.Fields))
				c.end(err)
				break
			}
		}
	}
	if err != nil {
		return &rows{err: err, m: c.typeMap, closed: true}, err
	}
	return &rows{fields: r.Fields, data: r.Rows, tag: pgconn.NewCommandTag(r.Tag), m: c.typeMap}, nil
}

// QueryRow runs sql with args; its row is read by Scan.
func (c *Conn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rs, _ := c.Query(ctx, sql, args...)
	return (*row)(rs.(*rows))
}

// Exec runs sql with args.
func (c *Conn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r, err := c.exec(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.NewCommandTag(r.Tag), nil
}

func (c *Conn) exec(ctx context.Context, sql string, args []any) (*reply, error) {
	if len(args) > 0 {
		if rw, ok := args[0].(pgx.QueryRewriter); ok {
			var err error
			sql, args, err = rw.RewriteQuery(ctx, nil, sql, args[1:])
			if err != nil {
				return nil, fmt.Errorf("rewrite query: %w", err)
			}
		}
	}
	sd, err := c.describe(ctx, sql)
	if err != nil {
		return nil, err
	}
	var eqb pgx.ExtendedQueryBuilder
	if err := eqb.Build(c.typeMap, sd, args); err != nil {
		return nil, err
	}
	return c.request(ctx, &request{Op: opExec, SQL: sql, ParamOIDs: sd.ParamOIDs,
		Params: eqb.ParamValues, ParamFormats: eqb.ParamFormats, ResultFormats: eqb.ResultFormats})
}

// Begin opens a transaction that holds the run's key, on a connection the
// keeper sets aside for it until it ends.
func (c *Conn) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := c.do(ctx, &request{Op: opBegin}); err != nil {
		return nil, err
	}
	return &tx{c: c}, nil
}
