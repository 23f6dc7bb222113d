// Package submit submits the tasks of a configuration's kinds: it checks
// them as the configuration says and makes them with etlcontext.CreateTask,
// in the caller's transaction. dama.Client, the schedules and a task
// process submitting children all submit through it, as data_manager.submit
// does in SQL. It needs no River client (the database inserts the job),
// which keeps the task process's own program small.
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

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
)

// ErrUnknownKind is returned for a kind the configuration does not name.
var ErrUnknownKind = errors.New("unknown kind")

// Params describe a task to submit (dama.SubmitParams).
type Params struct {
	Kind           string
	Args           json.RawMessage
	IdempotencyKey string
	ParentID       int64
	ScheduledAt    time.Time
}

// Submitter submits tasks of the kinds of a configuration.
type Submitter struct {
	cfg *config.Config
}

// New returns a Submitter of cfg's kinds (cfg with its defaults applied and
// validated).
func New(cfg *config.Config) *Submitter { return &Submitter{cfg: cfg} }

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
	if err := protocol.CheckArgs(args); err != nil {
		return 0, false, err
	}
	switch {
	case replaced.Refused():
		return 0, false, fmt.Errorf("arguments hold %s, which the database cannot store", replaced)
	case replaced.Any():
		// Stored as a string, it would not be what was submitted: the task
		// gets what it was given, or nothing.
		return 0, false, fmt.Errorf("arguments hold %d number(s) the database would give back far longer than written (1e100 as 101 digits): write them in full, or as strings", replaced.Huge)
	}
	if k := p.IdempotencyKey; strings.ContainsRune(k, 0) || !utf8.ValidString(k) {
		return 0, false, errors.New("idempotency key: want UTF-8 text without NUL")
	}
	err = pgx.BeginFunc(ctx, tx, func(tx pgx.Tx) error {
		id, created, err = etlcontext.CreateTask(ctx, tx, etlcontext.NewTask{
			Kind: p.Kind, Args: args, Queue: kind.Queue, MaxAttempts: kind.MaxAttempts, IdempotencyKey: p.IdempotencyKey,
			ParentID: p.ParentID, ConcurrencyField: kind.ConcurrencyKey, RunAt: p.ScheduledAt,
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
