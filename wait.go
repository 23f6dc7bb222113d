package dama

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pgerr"
	"github.com/dama-etl/dama/internal/pglisten"
)

// finishedRecheck is how often a wait looks at the context while it waits
// for the announcement of its end, in case it missed it.
const finishedRecheck = 10 * time.Second

// finishedHinted is the least time between two looks that announcements
// of the context's end ask for.
const finishedHinted = 100 * time.Millisecond

// Wait waits until context id is finished (DONE, FAILED or CANCELLED) and
// returns it as it finished. It waits on the database's announcement of
// the end (LISTEN dama_task_finished, sent in the transaction that ends
// the context), on a connection of its own, not by polling: it looks at
// the context once listening has begun, and again every 10 s in case an
// announcement was missed. It rides out a database that goes away (a
// restart, a failover) until ctx ends.
//
// It returns an error wrapping ErrNotFound for a context that
// does not exist, and one wrapping ctx's error when ctx ends first.
func (c *Client) Wait(ctx context.Context, id int64) (*etlcontext.Context, error) {
	var (
		finished    *etlcontext.Context
		unreachable error
	)
	look := func(ctx context.Context) error {
		ec, err := etlcontext.Get(ctx, c.pool, id)
		switch {
		case err != nil:
			return err
		case ec.Status.Finished():
			finished = ec
			return pglisten.ErrStop
		}
		unreachable = nil
		return nil
	}
	err := c.finishListener(id, look, &unreachable).Serve(ctx)
	switch {
	case finished != nil:
		return finished, nil
	case err != nil:
		return nil, fmt.Errorf("wait for task %d: %w", id, err)
	case unreachable != nil:
		return nil, fmt.Errorf("wait for task %d: database unreachable: %w", id, errors.Join(unreachable, ctx.Err()))
	}
	return nil, fmt.Errorf("wait for task %d: %w", id, ctx.Err())
}

// finishListener listens, on a connection of its own, for the
// announcements of finished contexts, and calls look once listening has
// begun on each connection, on each announcement of context id's end, and
// every finishedRecheck in case one was missed. A failure that waiting may
// cure (pgerr.Transient: an outage, a server short of resources or
// read-only for a switchover) is ridden out, and kept in *unreachable; any
// other ends the listener's Serve.
func (c *Client) finishListener(id int64, look func(context.Context) error, unreachable *error) *pglisten.Listener[*pgx.Conn] {
	// Anyone who can connect may announce context id's end: an
	// announcement asks for a look (through wake, the one way to it
	// besides Recheck) finishedHinted after the last one ended at the
	// soonest, so a flood of them makes a look per finishedHinted.
	var (
		looked time.Time
		// armed: a look was asked for and has yet to come.
		armed bool
	)
	wake := make(chan struct{}, 1)
	return &pglisten.Listener[*pgx.Conn]{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			conn, err := pgx.ConnectConfig(ctx, c.pool.Config().ConnConfig.Copy())
			if err != nil {
				return nil, fmt.Errorf("connect to wait for the end: %w", err)
			}
			if err := pglisten.Listen(ctx, conn, etlcontext.FinishedChannel); err != nil {
				conn.Close(ctx)
				return nil, err
			}
			return conn, nil
		},
		Look: func(ctx context.Context, _ *pgx.Conn) error {
			armed = false
			defer func() { looked = time.Now() }()
			return look(ctx)
		},
		Notify: func(ctx context.Context, n *pgconn.Notification) error {
			var f etlcontext.Finished
			if !armed && json.Unmarshal([]byte(n.Payload), &f) == nil && f.ID == id {
				armed = true
				time.AfterFunc(time.Until(looked.Add(finishedHinted)), func() {
					select {
					case wake <- struct{}{}:
					default:
					}
				})
			}
			return nil
		},
		Wake:    wake,
		Recheck: finishedRecheck,
		Failed: func(err error) bool {
			if pgerr.Transient(err) {
				*unreachable = err
				return true
			}
			return false
		},
	}
}
