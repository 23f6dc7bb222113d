package taskrunner

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/keeper"
)

// dbConn is a session the runner writes through: a connection of its own
// (row and advisory lock modes) or its session with the host's lock keeper
// (host lock mode), which runs its statements on the keeper's pool and
// holds its lock on the keeper's lock session for as long as the session
// lasts.
type dbConn interface {
	etlcontext.DB
	Begin(ctx context.Context) (pgx.Tx, error)
	Ping(ctx context.Context) error
	IsClosed() bool
	Close(ctx context.Context) error
	WaitForNotification(ctx context.Context) (*pgconn.Notification, error)
	// listen passes on channel's notifications from now on.
	listen(ctx context.Context, channel string) error
	// lockSession takes the context's lock for the session's life and
	// returns the context as it stands under it (etlcontext.LockSession).
	lockSession(ctx context.Context, id int64) (*etlcontext.Context, error)
	unlockSession(ctx context.Context, id int64) error
	// backendPID is the server's process of the session's lock, 0 when it
	// is not the runner's to end (the keeper's).
	backendPID() uint32
}

// pgxConn is a connection of the runner's own.
type pgxConn struct{ *pgx.Conn }

func (c pgxConn) listen(ctx context.Context, channel string) error {
	_, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	return err
}

func (c pgxConn) lockSession(ctx context.Context, id int64) (*etlcontext.Context, error) {
	return etlcontext.LockSession(ctx, c.Conn, id)
}

func (c pgxConn) unlockSession(ctx context.Context, id int64) error {
	return etlcontext.UnlockSession(ctx, c.Conn, id)
}

func (c pgxConn) backendPID() uint32 { return c.PgConn().PID() }

// keeperConn is a session with the host's lock keeper.
type keeperConn struct{ *keeper.Conn }

func (c keeperConn) listen(ctx context.Context, channel string) error { return c.Listen(ctx, channel) }

func (c keeperConn) lockSession(ctx context.Context, id int64) (*etlcontext.Context, error) {
	if err := c.Lock(ctx); err != nil {
		return nil, err
	}
	cur, err := etlcontext.Get(ctx, c, id)
	if err != nil {
		return nil, errors.Join(err, c.Unlock(ctx))
	}
	return cur, nil
}

func (c keeperConn) unlockSession(ctx context.Context, _ int64) error { return c.Unlock(ctx) }

func (keeperConn) backendPID() uint32 { return 0 }
