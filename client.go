package dama

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pglisten"
	"github.com/dama-etl/dama/internal/submit"
	"github.com/dama-etl/dama/protocol"
)

// Client submits and cancels tasks. It does not run them: that is the
// Supervisor's work.
type Client struct {
	pool   *pgxpool.Pool
	cfg    *config.Config
	river  *river.Client[pgx.Tx]
	submit *submit.Submitter
	// actor is who the client's actions are recorded as done by.
	actor string
}

// NewClient returns a client that submits tasks of the kinds in cfg, given
// its defaults (cfg itself is left as it is). A client with a nil cfg can
// cancel tasks but not submit them.
func NewClient(pool *pgxpool.Pool, cfg *config.Config) (*Client, error) {
	if cfg != nil {
		cfg = cfg.WithDefaults()
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("configuration: %w", err)
		}
	}
	// A River client that works no job: it cancels a task's job (the
	// database inserts the jobs).
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	return &Client{pool: pool, cfg: cfg, river: rc, submit: submit.New(cfg), actor: defaultActor()}, nil
}

// defaultActor names who acts, for the record: user@host.
func defaultActor() string {
	name, host := "unknown", "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		host = h
	}
	return name + "@" + host
}

// WithActor returns a copy of the client whose actions (cancel, retry,
// pause, resume, block, unblock) are recorded as done by actor, not by the
// user running the program (user@host): a program acting for others (a web
// page, a chat bot) names the person. An empty actor keeps the client's.
func (c *Client) WithActor(actor string) *Client {
	cp := *c
	if actor != "" {
		cp.actor = actor
	}
	return &cp
}

// SubmitParams describe a task to submit.
type SubmitParams struct {
	// Kind must be one of the configuration's kinds.
	Kind string
	// Args is the task's arguments, a JSON object stored as the payload of
	// the INITIAL event and handed to the command as DAMA_ARGS; default {}.
	Args json.RawMessage
	// IdempotencyKey, when set, makes Submit return the context of an
	// earlier submission of the kind with the same key instead of creating
	// one (ErrIdempotencyKeyOtherKind for another kind's key). Keys starting
	// with "dama:" are refused (ErrReservedIdempotencyKey).
	IdempotencyKey string
	// ParentID makes the new context a child of another.
	ParentID int64
	// ScheduledAt delays the task's first start until then (the view's
	// due_at); zero or past means now.
	ScheduledAt time.Time
}

// ErrUnknownKind is returned by Submit for a kind the configuration does not
// name.
var ErrUnknownKind = submit.ErrUnknownKind

// ErrIdempotencyKeyOtherKind is returned by Submit for an idempotency key
// that a task of another kind was submitted with.
var ErrIdempotencyKeyOtherKind = etlcontext.ErrIdempotencyKeyOtherKind

// reservedKeyPrefix starts the idempotency keys dama makes for its own
// submissions (schedule ticks, children): taken by a user's submission,
// such a key would hand a tick or a child the user's task instead.
const reservedKeyPrefix = "dama:"

// ErrReservedIdempotencyKey is returned by Submit for an idempotency key
// starting with "dama:", which dama keeps for its own submissions.
var ErrReservedIdempotencyKey = errors.New(`idempotency keys starting with "` + reservedKeyPrefix + `" are reserved for dama's own submissions`)

// Submit records a new QUEUED context with its INITIAL event and its River
// job, in one transaction. created is false when the idempotency key
// matched an earlier submission.
func (c *Client) Submit(ctx context.Context, p SubmitParams) (id int64, created bool, err error) {
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		id, created, err = c.SubmitTx(ctx, tx, p)
		return err
	})
	return id, created, err
}

// SubmitTx is Submit inside the caller's transaction: the task exists
// exactly when tx commits. It works in a savepoint, so that a refused
// submission (an unknown parent, say) leaves tx usable.
func (c *Client) SubmitTx(ctx context.Context, tx pgx.Tx, p SubmitParams) (id int64, created bool, err error) {
	if strings.HasPrefix(p.IdempotencyKey, reservedKeyPrefix) {
		return 0, false, fmt.Errorf("submit %s task: idempotency key %q: %w", p.Kind, p.IdempotencyKey, ErrReservedIdempotencyKey)
	}
	if len(p.IdempotencyKey) > protocol.MaxIdempotencyKey {
		return 0, false, fmt.Errorf("submit %s task: idempotency key of %d bytes: at most %d", p.Kind, len(p.IdempotencyKey), protocol.MaxIdempotencyKey)
	}
	return c.submit.Tx(ctx, tx, submit.Params(p))
}

// ErrAlreadyFinished is returned by Cancel for a context that finished
// before it could be cancelled.
var ErrAlreadyFinished = errors.New("already finished")

// ErrCancelPending is returned by Cancel when its wait ended after the
// cancellation was requested but before it was recorded: the task is
// cancelled once it has surely stopped, which for a task process gone or
// cut off may take its fencing window.
var ErrCancelPending = errors.New("cancellation requested, not yet recorded")

// Cancel cancels context id and waits, as Wait does, until ctx ends, for
// it to be CANCELLED. A context that is not running is cancelled at once,
// with its River job. A running one is asked to stop: its task process, on
// whichever host, stops its command (SIGTERM, then SIGKILL after the kill
// grace) and records the cancellation.
func (c *Client) Cancel(ctx context.Context, id int64) (etlcontext.Status, error) {
	var (
		requested   bool
		status      etlcontext.Status
		done        bool
		result      error
		unreachable error
	)
	look := func(ctx context.Context) error {
		var err error
		status, done, err = c.tryCancel(ctx, id, &requested)
		switch {
		case done:
			result = err
			return pglisten.ErrStop
		case err != nil:
			return err
		}
		unreachable = nil
		return nil
	}
	err := c.finishListener(id, look, &unreachable).Serve(ctx)
	switch {
	case done:
		return status, result
	case requested && ctx.Err() != nil:
		// Once the cancellation is requested, a wait that ends for any
		// reason says so: the request stands.
		s := status
		if s == "" {
			s = "unfinished"
		}
		return status, fmt.Errorf("cancel task %d: still %s when the wait ended; it is CANCELLED once its attempt has surely stopped: %w", id, s, ErrCancelPending)
	case err != nil:
		return status, err
	case unreachable != nil:
		return status, fmt.Errorf("cancel task %d: database unreachable: %w", id, unreachable)
	}
	return status, fmt.Errorf("cancel task %d: still %s: %w", id, status, ctx.Err())
}

// RequestCancel is Cancel without the wait, on no connection of its own:
// it returns the status once the context is CANCELLED or, running, asked
// to stop, and an error for a context finished otherwise.
//
// A context that is not running but whose lock is held (a supervisor's
// step holds it for a moment) is looked at again until it is cancelled or
// ctx ends: otherwise a task waiting out a retry's backoff would be
// cancelled only at its next step, maybe hours later. When ctx ends first,
// the request stands and RequestCancel returns the status with no error.
func (c *Client) RequestCancel(ctx context.Context, id int64) (etlcontext.Status, error) {
	requested := false
	for {
		status, done, err := c.tryCancel(ctx, id, &requested)
		if requested && ctx.Err() != nil {
			return status, nil
		}
		if err != nil || done || status == etlcontext.StatusRunning {
			return status, err
		}
		select {
		case <-ctx.Done():
			return status, nil
		case <-time.After(requestRecheck):
		}
	}
}

// requestRecheck is how often RequestCancel looks again at a context that is
// not running and whose lock is held.
const requestRecheck = 50 * time.Millisecond

// tryCancel cancels the context if nobody holds its lock, or else asks its
// runner to stop it; done reports that the context is finished.
func (c *Client) tryCancel(ctx context.Context, id int64, requested *bool) (status etlcontext.Status, done bool, err error) {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return "", false, fmt.Errorf("begin cancellation of task %d: %w", id, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	ec, err := etlcontext.Lock(ctx, tx, id)
	if errors.Is(err, etlcontext.ErrLocked) {
		// A task process (or, for a moment, a supervisor) holds the lock.
		_ = tx.Rollback(ctx)
		return c.requestCancel(ctx, id, requested)
	}
	if err != nil {
		return "", false, err
	}
	if ec.Status.Finished() {
		return ec.Status, true, finishedError(ec.ID, ec.Status)
	}
	if ec.Status == etlcontext.StatusRunning && ec.PID != nil {
		// Its task process is gone or lost its lock, but its command may
		// still run, on another host for up to its fencing window: a
		// supervisor records the cancellation once the attempt is surely
		// over, so that a retry cannot meet it.
		_ = tx.Rollback(ctx)
		return c.requestCancel(ctx, id, requested)
	}
	// Nobody runs the task and nobody can start it while the lock is held
	// here: cancel it now, with its job.
	by, err := etlcontext.WithRole(ctx, tx, c.actor)
	if err != nil {
		return ec.Status, false, err
	}
	if _, err := etlcontext.Append(ctx, tx, etlcontext.NewEvent{
		ContextID: id,
		Type:      protocol.EventType(ec.Kind, protocol.EventCancelled),
		Payload:   map[string]any{"reason": "cancelled while not running", "by": by},
		RunID:     ec.RunID,
	}); err != nil {
		return ec.Status, false, err
	}
	if ec.RiverJobID != nil {
		if _, err := c.river.JobCancelTx(ctx, tx, *ec.RiverJobID); err != nil && !errors.Is(err, river.ErrNotFound) {
			return ec.Status, false, fmt.Errorf("cancel River job %d: %w", *ec.RiverJobID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return ec.Status, false, fmt.Errorf("commit cancellation of task %d: %w", id, err)
	}
	return etlcontext.StatusCancelled, true, nil
}

// requestCancel marks the context for cancellation and notifies its runner;
// a runner away from the database then reads the mark when it reconnects.
func (c *Client) requestCancel(ctx context.Context, id int64, requested *bool) (etlcontext.Status, bool, error) {
	var status etlcontext.Status
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if *requested {
			cur, err := etlcontext.Get(ctx, tx, id)
			if err != nil {
				return err
			}
			status = cur.Status
			return nil
		}
		var err error
		if status, err = etlcontext.RequestCancel(ctx, tx, id, c.actor); err != nil || status.Finished() {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, protocol.CancelChannel, strconv.FormatInt(id, 10)); err != nil {
			return fmt.Errorf("announce cancellation of task %d: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return status, false, err
	}
	*requested = true
	if status.Finished() {
		return status, true, finishedError(id, status)
	}
	return status, false, nil
}

func finishedError(id int64, s etlcontext.Status) error {
	if s == etlcontext.StatusCancelled {
		return nil
	}
	return fmt.Errorf("task %d is %s: %w", id, s, ErrAlreadyFinished)
}

// finishedRecheck is how often a wait looks at the context in case it
// missed the announcement of its end; finishedHinted is the least time
// between two looks that announcements ask for.
const (
	finishedRecheck = 10 * time.Second
	finishedHinted  = 100 * time.Millisecond
)

// Wait waits until context id is finished (DONE, FAILED or CANCELLED) and
// returns it as it finished. It waits, on a connection of its own, for the
// announcement of the end (LISTEN dama_task_finished, sent in the
// transaction that ends the context), looking at the context once
// listening has begun and every 10 s in case one was missed. It rides out
// a database that goes away (a restart, a failover) until ctx ends.
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

// finishListener listens for the ends of contexts, calling look as Wait
// says: once listening has begun on each connection, on each announcement
// of context id's end, and every finishedRecheck. A failure that waiting
// may cure (etlcontext.Transient: an outage, a server short of resources
// or read-only for a switchover) is ridden out, and kept in *unreachable.
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
			if etlcontext.Transient(err) {
				*unreachable = err
				return true
			}
			return false
		},
	}
}
