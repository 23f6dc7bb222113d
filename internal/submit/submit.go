// Package submit records tasks: a context, its INITIAL event and the River
// job that steps it, in one transaction. The supervisor's Client, its
// schedules and a task process submitting its command's children all
// submit through it, so that a task is made one way whoever makes it; it
// needs River's insert and no more, which keeps the task process's own
// program (cmd/dama-taskrunner) small.
package submit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/jsonb"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// TaskArgs are the arguments of the one River job that follows a context
// through its whole life. The task's own arguments live in the context's
// INITIAL event, not in the job.
type TaskArgs struct {
	ETLContextID int64 `json:"etl_context_id"`
	// TaskKind is the task's kind, for the kind's retry policy (NextRetry);
	// empty in the jobs of releases before it, which then back off as
	// River does by default.
	TaskKind string `json:"kind,omitempty"`
}

// Kind is the River job kind of every dama task.
func (TaskArgs) Kind() string { return etlcontext.JobKind }

// FetchCooldown is the River clients' FetchCooldown. River sends at most
// one insert notification per queue per FetchCooldown from a client; its
// default (100ms) would leave tasks submitted in a burst waiting for the
// supervisors' next fetch poll.
const FetchCooldown = 10 * time.Millisecond

// NewRiverClient returns an insert-only River client on pool (nil: only
// its transactions' inserts, *Tx).
func NewRiverClient(pool *pgxpool.Pool) (*river.Client[pgx.Tx], error) {
	rc, err := river.NewClient(riverpgxv5.New(pool), &river.Config{FetchCooldown: FetchCooldown})
	if err != nil {
		return nil, fmt.Errorf("create River client: %w", err)
	}
	return rc, nil
}

// EnqueueJob inserts, in tx, the River job that steps context id, of kind,
// and records it as the context's job: a context has exactly one job.
func EnqueueJob(ctx context.Context, rc *river.Client[pgx.Tx], tx pgx.Tx, id int64, kind string, opts *river.InsertOpts) (int64, error) {
	res, err := rc.InsertTx(ctx, tx, TaskArgs{ETLContextID: id, TaskKind: kind}, opts)
	if err != nil {
		return 0, fmt.Errorf("enqueue River job: %w", err)
	}
	if err := etlcontext.SetJob(ctx, tx, id, res.Job.ID); err != nil {
		return 0, err
	}
	return res.Job.ID, nil
}

// ErrUnknownKind is returned for a kind the configuration does not name.
var ErrUnknownKind = errors.New("unknown kind")

// Params describe a task to submit (supervisor.SubmitParams).
type Params struct {
	Kind           string
	Args           json.RawMessage
	IdempotencyKey string
	ParentID       int64
	ScheduledAt    time.Time
}

// Submitter submits tasks of the kinds of a configuration.
type Submitter struct {
	cfg   *config.Config
	river *river.Client[pgx.Tx]
}

// New returns a Submitter of cfg's kinds (cfg with its defaults applied and
// validated) that inserts jobs with rc.
func New(cfg *config.Config, rc *river.Client[pgx.Tx]) *Submitter {
	return &Submitter{cfg: cfg, river: rc}
}

// Tx submits p in tx, in a savepoint, so that a refused submission (an
// unknown parent, say) leaves tx usable. It takes any idempotency key:
// refusing the keys dama keeps for its own submissions is the caller's
// part. created is false when an earlier submission with the same key
// stands, whose id is returned.
func (s *Submitter) Tx(ctx context.Context, tx pgx.Tx, p Params) (id int64, created bool, err error) {
	if s.cfg == nil {
		return 0, false, errors.New("submit needs a configuration naming the kinds")
	}
	kind, ok := s.cfg.Kind(p.Kind)
	if !ok {
		return 0, false, fmt.Errorf("%w %q: the configuration has %v", ErrUnknownKind, p.Kind, s.cfg.KindNames())
	}
	args := p.Args
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	_, replaced, err := etlcontext.CleanJSON(args)
	if err != nil {
		return 0, false, errors.New("arguments are not valid JSON")
	}
	switch {
	case replaced.Refused():
		return 0, false, fmt.Errorf("arguments hold %s, which the database cannot store", replaced)
	case replaced.Any():
		// Stored as a string, it would not be what was submitted: the task
		// gets what it was given, or nothing.
		return 0, false, fmt.Errorf("arguments hold %d number(s) the database would give back far longer than written (1e100 as 101 digits): write them in full, or as strings", replaced.Huge)
	}
	// Measured as the database gives them back, which is what the task gets.
	if n := jsonb.TextLen(args); n > protocol.MaxEnvPayload {
		return 0, false, fmt.Errorf("arguments are %d bytes as stored; a task receives them in DAMA_ARGS, which holds at most %d", n, protocol.MaxEnvPayload)
	}
	if k := p.IdempotencyKey; strings.ContainsRune(k, 0) || !utf8.ValidString(k) {
		return 0, false, errors.New("idempotency key: want UTF-8 text without NUL")
	}
	concurrencyKey, err := kind.ConcurrencyKeyOf(args)
	if err != nil {
		return 0, false, fmt.Errorf("submit %s task: %w", p.Kind, err)
	}

	err = pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
		id, created, err = etlcontext.Create(ctx, tx, etlcontext.NewContext{
			Kind: p.Kind, Queue: kind.Queue, MaxAttempts: kind.MaxAttempts, IdempotencyKey: p.IdempotencyKey,
			ParentID: p.ParentID, ConcurrencyKey: concurrencyKey, DueAt: p.ScheduledAt,
		})
		if err != nil || !created {
			// An existing context of the key stands as it is.
			return err
		}
		if _, err := etlcontext.Append(ctx, tx, etlcontext.NewEvent{
			ContextID: id,
			Type:      protocol.EventType(p.Kind, protocol.EventInitial),
			Payload:   args,
		}); err != nil {
			return err
		}
		_, err := EnqueueJob(ctx, s.river, tx, id, p.Kind, &river.InsertOpts{
			Queue:       kind.Queue,
			MaxAttempts: kind.MaxAttempts,
			ScheduledAt: p.ScheduledAt,
		})
		return err
	})
	if err != nil {
		return 0, false, fmt.Errorf("submit %s task: %w", p.Kind, err)
	}
	return id, created, nil
}

// Child submits, in tx, a child that a task's command asked for; its key,
// made by the task process, is one of dama's own.
func (s *Submitter) Child(ctx context.Context, tx pgx.Tx, child protocol.Child) (int64, bool, error) {
	return s.Tx(ctx, tx, Params{
		Kind: child.Kind, Args: child.Args, IdempotencyKey: child.IdempotencyKey, ParentID: child.ParentID,
	})
}
