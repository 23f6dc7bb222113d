package dama

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/dama-etl/dama/etlcontext"
)

// Retry runs a FAILED or CANCELLED task again: a new attempt, given the
// task's latest checkpoint in DAMA_CHECKPOINT like any retry, with the
// kind's max_attempts more attempts. The context is reopened (QUEUED, its
// attempt number and events kept, a RETRIED event naming who) and given a
// new River job, in one transaction. It needs the configuration naming the
// kind.
func (c *Client) Retry(ctx context.Context, id int64) error {
	if c.cfg == nil {
		return errors.New("retry needs a configuration naming the kinds")
	}
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		ec, err := etlcontext.Lock(ctx, tx, id)
		if errors.Is(err, etlcontext.ErrLocked) {
			return fmt.Errorf("task %d is running or being looked at: %w", id, err)
		}
		if err != nil {
			return err
		}
		kind, ok := c.cfg.Kind(ec.Kind)
		if !ok {
			return fmt.Errorf("%w %q: the configuration has %v", ErrUnknownKind, ec.Kind, c.cfg.KindNames())
		}
		maxAttempts := ec.Attempt + kind.MaxAttempts
		if err := etlcontext.Reopen(ctx, tx, ec, maxAttempts, c.actor); err != nil {
			return err
		}
		if ec.RiverJobID != nil {
			// The old job may still wait, parked, for a step to settle it
			// (no supervisor heard the task end): it must not step the
			// context again beside the new one.
			if _, err := c.river.JobCancelTx(ctx, tx, *ec.RiverJobID); err != nil && !errors.Is(err, river.ErrNotFound) {
				return fmt.Errorf("cancel the previous River job %d: %w", *ec.RiverJobID, err)
			}
		}
		_, err = etlcontext.EnqueueJob(ctx, tx, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("retry task %d: %w", id, err)
	}
	return nil
}
