package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pgerr"
)

// finishedRecheck is how often a wait looks at the context while it waits
// for the announcement of its end, in case it missed it.
const finishedRecheck = 10 * time.Second

// Wait waits until context id is finished (DONE, FAILED or CANCELLED) and
// returns it as it finished. It waits on the database's announcement of
// the end (LISTEN dama_task_finished, sent in the transaction that ends
// the context), on a connection of its own, not by polling: it looks at
// the context once listening has begun, and again every 10 s in case an
// announcement was missed. It rides out a database that goes away (a
// restart, a failover) until ctx ends.
//
// It returns an error wrapping etlcontext.ErrNotFound for a context that
// does not exist, and one wrapping ctx's error when ctx ends first.
func (c *Client) Wait(ctx context.Context, id int64) (*etlcontext.Context, error) {
	w := &finishWatch{c: c}
	defer w.close(ctx)
	for {
		if err := w.listen(ctx); err != nil {
			return nil, fmt.Errorf("wait for etl context %d: %w", id, err)
		}
		if w.conn != nil {
			ec, err := etlcontext.Get(ctx, c.pool, id)
			switch {
			case err == nil && ec.Status.Finished():
				return ec, nil
			case err != nil && pgerr.Unreachable(err) && ctx.Err() == nil:
				w.unreachable = err
			case err != nil:
				return nil, fmt.Errorf("wait for etl context %d: %w", id, err)
			default:
				w.unreachable = nil
			}
		}
		w.wait(ctx, id)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("wait for etl context %d: %w", id, w.ended(ctx))
		}
	}
}

// finishWatch listens for the announcements of finished contexts on a
// connection of its own (a pooled one would keep listening for its next
// user), and opens another when it fails.
type finishWatch struct {
	c    *Client
	conn *pgx.Conn
	// unreachable is the error of the last try to reach the database, nil
	// once it answered.
	unreachable error
}

// listen makes sure the watch listens: it opens its connection when it has
// none. A database that cannot be reached is not an error (w.conn stays nil,
// and w.unreachable says why) unless ctx has ended.
func (w *finishWatch) listen(ctx context.Context) error {
	if w.conn != nil {
		return nil
	}
	conn, err := pgx.ConnectConfig(ctx, w.c.pool.Config().ConnConfig.Copy())
	if err == nil {
		if _, err = conn.Exec(ctx, "LISTEN "+etlcontext.FinishedChannel); err != nil {
			conn.Close(context.WithoutCancel(ctx))
			err = fmt.Errorf("listen for finished contexts: %w", err)
		}
	} else {
		err = fmt.Errorf("connect to wait for the end: %w", err)
	}
	switch {
	case err == nil:
		w.conn = conn
		return nil
	case pgerr.Unreachable(err) && ctx.Err() == nil:
		w.unreachable = err
		return nil
	}
	return err
}

// wait waits until the end of context id is announced, or finishedRecheck
// passes, or ctx ends. Without a connection it waits a second, for the
// database to come back. A connection that fails is dropped, for listen to
// open another.
func (w *finishWatch) wait(ctx context.Context, id int64) {
	if w.conn == nil {
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		return
	}
	wctx, cancel := context.WithTimeout(ctx, finishedRecheck)
	defer cancel()
	for {
		n, err := w.conn.WaitForNotification(wctx)
		if wctx.Err() != nil {
			return
		}
		if err != nil {
			w.conn.Close(context.WithoutCancel(ctx))
			w.conn, w.unreachable = nil, err
			return
		}
		var f etlcontext.Finished
		if json.Unmarshal([]byte(n.Payload), &f) == nil && f.ID == id {
			return
		}
	}
}

// ended is why a wait ended with ctx: ctx's error, and the database's when
// it could not be reached.
func (w *finishWatch) ended(ctx context.Context) error {
	if w.unreachable != nil {
		return fmt.Errorf("database unreachable: %w", errors.Join(w.unreachable, ctx.Err()))
	}
	return ctx.Err()
}

func (w *finishWatch) close(ctx context.Context) {
	if w.conn != nil {
		w.conn.Close(context.WithoutCancel(ctx))
	}
}
