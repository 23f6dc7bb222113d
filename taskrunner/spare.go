package taskrunner

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/etlcontext"
)

// Preconnected holds the connections a spare task process made before its
// launch (see protocol.SpareFD and Preconnect), for the runner it becomes
// to take over: a fresh server session costs milliseconds to start and
// more to read its first statements' catalogs, which a launch then does
// not wait for.
type Preconnected struct {
	heartbeat time.Duration
	mu        sync.Mutex // the lock's and the writer's goroutines take theirs
	// lock and write are the connections made: in row mode both, in
	// advisory mode lock alone; nil once taken, or when one could not be
	// made.
	lock, write *pgx.Conn
	// lockErr and writeErr are why a connection could not be made.
	lockErr, writeErr error
}

// The names of a spare's connections in pg_stat_activity, its lock
// connection's and (in row mode) its write connection's, until its launch
// names them as the runner's.
const (
	SpareLockConnName  = "dama-task-spare-lock"
	SpareWriteConnName = "dama-task-spare"
)

// takeTimeout bounds the statement that names a connection made ahead,
// which also finds out whether it still works: one that does not is
// closed, and a new one made.
const takeTimeout = time.Second

// Preconnect makes, for a spare, the connections a runner of lock mode
// mode makes first, holding runKey (the key of the run the spare will be,
// made before the run) and probed every heartbeat as the runner's are, on
// which it runs a runner's first reads (etlcontext.WarmRunner).
// Host mode makes none: a keeper session names its context as it opens.
// What cannot be made now is made at the launch.
func Preconnect(ctx context.Context, url, runKey string, mode config.LockMode, heartbeat time.Duration) *Preconnected {
	p := &Preconnected{heartbeat: heartbeat}
	if mode == config.LockModeHost {
		return p
	}
	open := func(name string) (*pgx.Conn, error) {
		conn, err := connect(ctx, url, runKey, name, heartbeat)
		if err == nil {
			if err = etlcontext.WarmRunner(ctx, conn); err != nil {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				conn.Close(cctx)
				cancel()
				conn = nil
			}
		}
		return conn, err
	}
	p.lock, p.lockErr = open(SpareLockConnName)
	if mode == config.LockModeRow {
		p.write, p.writeErr = open(SpareWriteConnName)
	}
	return p
}

// Close closes the connections not taken.
func (p *Preconnected) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range []*pgx.Conn{p.lock, p.write} {
		if c != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			c.Close(ctx)
			cancel()
		}
	}
	p.lock, p.write = nil, nil
}

// take returns the connection made ahead for the lock (write false) or
// the writes, named name, if there is one and it works; nil otherwise,
// with why the one made ahead does not. It takes at most takeTimeout,
// whatever ctx allows.
func (p *Preconnected) take(ctx context.Context, write bool, name string) (*pgx.Conn, error) {
	if p == nil {
		return nil, nil
	}
	var conn *pgx.Conn
	p.mu.Lock()
	if write {
		conn, p.write = p.write, nil
	} else {
		conn, p.lock = p.lock, nil
	}
	p.mu.Unlock()
	if conn == nil {
		return nil, nil
	}
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), takeTimeout)
	defer cancel()
	// One round trip, as the statement a fresh connection's startup packet
	// spares.
	if _, err := conn.Exec(tctx, "SELECT set_config('application_name', $1, false)", pgx.QueryExecModeExec, name); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		conn.Close(cctx)
		cancel()
		return nil, err
	}
	return conn, nil
}

// keep drops the connections a runner of lock mode mode has no use for:
// all of them when they are probed on another heartbeat than the
// runner's (the configuration changed since the spare started: the
// runner's fencing window would not hold for them) or in host mode (its
// lock is the keeper's, never its own session's); the write connection
// in advisory mode. A runner of another lock mode than the spare's takes
// what it needs of the rest: they differ only by their names, which it
// sets. It returns why a connection it would use could not be made
// ahead.
func (p *Preconnected) keep(heartbeat time.Duration, mode config.LockMode) error {
	if p == nil {
		return nil
	}
	if p.heartbeat != heartbeat || mode == config.LockModeHost {
		p.Close()
		return nil
	}
	if mode == config.LockModeRow {
		return errors.Join(p.lockErr, p.writeErr)
	}
	p.mu.Lock()
	write := p.write
	p.write = nil
	p.mu.Unlock()
	if write != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		write.Close(ctx)
		cancel()
	}
	return p.lockErr
}
