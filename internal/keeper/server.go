package keeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/etlcontext"
)

// Config configures a keeper (Serve).
type Config struct {
	// Socket is the path of the socket the keeper listens on; its
	// directory must exist, belong to the keeper's user and be closed to
	// others (Dir makes it so). The keeper holds Socket+".lock" while it
	// runs, one keeper per socket, and writes its pid in it.
	Socket string
	// Secret is what the keeper and its task processes prove to each other
	// they know before anything else is said (stream.go): their
	// supervisor's random protocol.Secrets.Keeper; required.
	Secret []byte
	// ConnectLock opens the lock session: a connection of the keeper's
	// own, probed when silent, which holds the locks of all the sessions.
	ConnectLock func(ctx context.Context) (*pgx.Conn, error)
	// Pool runs the sessions' statements, each with the session's run
	// key. Its MaxConns bounds the server connections the keeper opens
	// beside its lock session.
	Pool *pgxpool.Config
	// IdleExit is how long the keeper runs on with no session before it
	// exits. 0 means 1 minute.
	IdleExit time.Duration
	// MaxMessage bounds, in bytes, one message of a session either way
	// once its hello is taken: a statement's parameters or its rows. 0
	// means 64 MiB, what a task process takes too, and the most it may
	// be; the least is 64 KiB, which any notification fits in. A test sets
	// less than 64 MiB, to make a reply too large without 64 MiB of it.
	MaxMessage int
	// Logger receives the keeper's log lines; nil discards them.
	Logger *slog.Logger
	// Ready, when set, is closed once the keeper listens.
	Ready chan<- struct{}
}

// DefaultIdleExit is Config.IdleExit's default.
const DefaultIdleExit = time.Minute

// ErrRunning is what Serve fails with when another keeper serves the
// socket.
var ErrRunning = errors.New("another lock keeper serves this socket")

// server is a running keeper.
type server struct {
	cfg    Config
	logger *slog.Logger
	pool   *pgxpool.Pool
	lock   *lockSession

	mu       sync.Mutex
	sessions map[*session]struct{}
	// holders maps each locked context to the session that holds it: a
	// session lock is re-entrant on the lock session, so the keeper, not
	// the server, keeps a second session of the same context out.
	holders map[int64]*session
	idle    time.Time
	// unproven holds a token for each connection that has not proved the
	// secret and its key yet.
	unproven chan struct{}
}

// maxUnproven bounds the connections that have not proved the secret and
// their key yet, each held at most handshakeTimeout + verifyTimeout,
// against a process of the user that opens connections and proves
// nothing. A task process proves both in its first three round trips
// (handshake, hello, lock), so even all of a host's task processes
// dialling again at once, after a keeper's restart, pass through them in
// turn (a connection refused for it is dialled again: Dial).
const maxUnproven = 64

// Serve runs a keeper until ctx ends or it has had no session for
// cfg.IdleExit.
func Serve(ctx context.Context, cfg Config) error {
	if cfg.IdleExit == 0 {
		cfg.IdleExit = DefaultIdleExit
	}
	if cfg.MaxMessage == 0 {
		cfg.MaxMessage = maxMessage
	}
	if len(cfg.Secret) == 0 {
		return errors.New("a keeper needs a secret")
	}
	if cfg.MaxMessage < minMessage || cfg.MaxMessage > maxMessage {
		// Beyond either end a session would end on its first large
		// notification or reply rather than fail that one statement.
		return fmt.Errorf("a keeper's MaxMessage is %d bytes: want %d to %d", cfg.MaxMessage, minMessage, maxMessage)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	lockFile, lockID, err := lockSocket(cfg.Socket)
	if err != nil {
		return err
	}
	defer lockFile.Close()
	ln, bound, err := listenSocket(cfg.Socket)
	if err != nil {
		return err
	}
	defer func() {
		// Removed before the lock file is let go, if it is still this
		// keeper's: the next keeper finds no socket of this one.
		if id := fileID(cfg.Socket); id != nil && bound != nil && *id == *bound {
			os.Remove(cfg.Socket)
		}
		ln.Close()
	}()
	// A session's statements may change their connection's state for
	// the next session that uses it: a transaction, or a statement whose
	// text is not one of etlcontext's that set the run's key themselves,
	// is any statement the task process sent (session.exec), and may
	// leave a setting (SET, set_config(…, false), search_path, a role), a
	// temporary table or function, a prepared statement or cursor, a
	// LISTEN, a session advisory lock. Such a connection is reset before
	// the pool hands it out again; the others cost nothing more.
	pcfg := cfg.Pool.Copy()
	pcfg.AfterRelease = resetChanged(pcfg.AfterRelease, pcfg.AfterConnect)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("make the keeper's pool: %w", err)
	}
	defer pool.Close()

	s := &server{
		cfg: cfg, logger: logger, pool: pool,
		sessions: make(map[*session]struct{}),
		holders:  make(map[int64]*session),
		unproven: make(chan struct{}, maxUnproven),
		idle:     time.Now(),
	}
	ctx, cancel := context.WithCancel(ctx)
	s.lock = newLockSession(cfg.ConnectLock, logger, s.lockLost, s.notify)
	go s.lock.run(ctx)
	defer func() { <-s.lock.ended }()
	defer cancel()

	if cfg.Ready != nil {
		close(cfg.Ready)
	}
	logger.Info("lock keeper serves", "socket", cfg.Socket, "pid", os.Getpid())
	idle := make(chan struct{})
	defer func() {
		select {
		case <-idle:
			// Nobody needs this keeper's name again: a supervisor's
			// start names a keeper of its own. Removed while held.
			if id := fileID(cfg.Socket + ".lock"); id != nil && *id == *lockID {
				os.Remove(cfg.Socket + ".lock")
			}
		default:
		}
	}()
	go s.watch(ctx, ln, bound, lockID, idle)
	s.accept(ctx, ln)
	return nil
}

// accept serves each connection of the keeper's user in a session of
// its own until ctx ends or ln is closed, then ends every session and
// waits for them.
func (s *server) accept(ctx context.Context, ln *net.UnixListener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	defer s.closeSessions()
	var refusing bool
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			s.logger.Warn("accept", "error", err)
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return
			}
			continue
		}
		if err := checkPeer(conn); err != nil {
			s.logger.Warn("refused a connection", "error", err)
			conn.Close()
			continue
		}
		select {
		case s.unproven <- struct{}{}:
		default:
			conn.Close()
			if !refusing {
				s.logger.Warn("refused connections: too many have not opened their session yet", "at_most", maxUnproven)
			}
			refusing = true
			continue
		}
		refusing = false
		sess := &session{s: s, conn: conn, notes: make(chan *pgconn.Notification, notifyBuffer),
			channels: make(map[string]bool), missed: make(map[string]*pgconn.Notification)}
		s.mu.Lock()
		s.sessions[sess] = struct{}{}
		s.mu.Unlock()
		wg.Go(func() { sess.serve(ctx) })
	}
}

// watch closes the listener, and so ends Serve, once the keeper has had
// no session for IdleExit, or once its socket or lock file is no longer
// the one it holds (removed, or replaced by another process): task
// processes would not find it, and a second keeper might serve beside it.
func (s *server) watch(ctx context.Context, ln *net.UnixListener, socket, lock *[2]uint64, idleExit chan<- struct{}) {
	defer ln.Close()
	t := time.NewTicker(min(s.cfg.IdleExit/4, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if id := fileID(s.cfg.Socket); socket == nil || id == nil || *id != *socket {
			s.logger.Warn("lock keeper exits: its socket was removed or replaced", "socket", s.cfg.Socket)
			return
		}
		if id := fileID(s.cfg.Socket + ".lock"); lock == nil || id == nil || *id != *lock {
			s.logger.Warn("lock keeper exits: its lock file was removed or replaced", "lock", s.cfg.Socket+".lock")
			return
		}
		s.mu.Lock()
		if len(s.sessions) == 0 && time.Since(s.idle) >= s.cfg.IdleExit {
			// No session opens from here on: one that connects now finds the
			// socket closed and starts another keeper.
			close(idleExit)
			ln.Close()
			s.mu.Unlock()
			s.logger.Info("lock keeper exits: no session", "idle_exit", s.cfg.IdleExit)
			return
		}
		s.mu.Unlock()
	}
}

// closed forgets sess, and releases its lock.
func (s *server) closed(sess *session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	if len(s.sessions) == 0 {
		s.idle = time.Now()
	}
	s.mu.Unlock()
	if !s.holds(sess) {
		return
	}
	// The session stays the holder until its lock is released: the next
	// session of its context is refused the lock meanwhile, as the server
	// still holds it. One that cannot be released ends the lock session,
	// and every lock with it, rather than hold it for nobody.
	delay := 100 * time.Millisecond
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), lockOpTimeout)
		err := s.lock.unlock(ctx, sess.contextID, sess.lockGen, false)
		cancel()
		if err == nil || errors.Is(err, ErrUnavailable) {
			// Released, or gone with its lock session (or the keeper).
			break
		}
		if try == 5 {
			s.logger.Error("the lock of a session that ended cannot be released: ending the lock session", "etl_context_id", sess.contextID, "error", err)
			s.lock.reset()
			break
		}
		s.logger.Warn("release the lock of a session that ended", "etl_context_id", sess.contextID, "error", err, "retry_in", delay)
		time.Sleep(delay)
		delay *= 2
	}
	s.drop(sess)
}

// closeSessions ends every session.
func (s *server) closeSessions() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sess := range s.sessions {
		sess.conn.Close()
	}
}

// lockLost is told that the lock session failed, and with it every lock
// it held: the sessions whose lock it held end, so that their task
// processes know it and take their lock again through a new one. The
// others end too: their notifications were lost with it.
func (s *server) lockLost(err error) {
	s.mu.Lock()
	n := len(s.holders)
	clear(s.holders)
	s.mu.Unlock()
	s.logger.Warn("lock session lost; its sessions end", "locks", n, "error", err)
	s.closeSessions()
}

// notify passes notification n on to the sessions that listen to its
// channel: a cancellation to its context's session only.
func (s *server) notify(n *pgconn.Notification) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sess := range s.sessions {
		if sess.listens(n) {
			sess.pass(n)
		}
	}
}

// take records that sess holds its context's lock from now on; it fails
// when another session does.
func (s *server) take(sess *session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.holders[sess.contextID]; ok && h != sess {
		return fmt.Errorf("task %d: another session of the lock keeper holds it: %w", sess.contextID, etlcontext.ErrLocked)
	}
	s.holders[sess.contextID] = sess
	return nil
}

// holds reports whether sess holds its context's lock.
func (s *server) holds(sess *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sess.contextID != 0 && s.holders[sess.contextID] == sess
}

// drop records that sess no longer holds its lock.
func (s *server) drop(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holders[sess.contextID] == sess {
		delete(s.holders, sess.contextID)
	}
}

// unavailable reports whether err says the keeper could not reach the
// server, as opposed to the server refusing the statement.
func unavailable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return etlcontext.ConnectionLost(pgErr.Code)
	}
	return etlcontext.Unreachable(err) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.EPIPE)
}

// toWire turns err into what the session is told.
func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, errNoConnection):
		return &wireError{Kind: errBusy, Message: err.Error()}
	case unavailable(err):
		// One line: pgx names a failed connection's address several times.
		return &wireError{Kind: errUnavailable, Message: etlcontext.ConnectFailed(err).Error()}
	case errors.As(err, &pgErr):
		return &wireError{Kind: errStatement, Message: err.Error(), PgError: pgErr}
	case errors.Is(err, etlcontext.ErrLocked):
		return &wireError{Kind: errLocked, Message: err.Error()}
	case errors.Is(err, ErrRefused), errors.Is(err, etlcontext.ErrStaleRun):
		return &wireError{Kind: errRefused, Message: err.Error()}
	}
	return &wireError{Kind: errStatement, Message: err.Error()}
}
