package dama

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
)

// ErrUnknownQueue is returned for a queue that neither the client's
// configuration nor the database knows.
var ErrUnknownQueue = errors.New("unknown queue")

// PauseQueue pauses queue: once it returns, none of its tasks starts, on
// any supervisor, until ResumeQueue; its running tasks go on, and
// submissions wait. Pausing a paused queue returns the pause in force.
func (c *Client) PauseQueue(ctx context.Context, queue, reason string) (etlcontext.QueuePause, error) {
	if err := checkReason(reason); err != nil {
		return etlcontext.QueuePause{}, fmt.Errorf("pause queue %s: %w", queue, err)
	}
	if err := c.checkQueue(ctx, queue); err != nil {
		return etlcontext.QueuePause{}, err
	}
	return etlcontext.PauseQueue(ctx, c.pool, queue, reason, c.actor)
}

// maxReason bounds the reason of a pause or a block, shown on every page
// and in every listing.
const maxReason = 1024

// checkReason refuses a reason the database cannot store, or too long to
// show.
func checkReason(reason string) error {
	switch {
	case strings.ContainsRune(reason, 0) || !utf8.ValidString(reason):
		return errors.New("the reason must be UTF-8 text without NUL")
	case len(reason) > maxReason:
		return fmt.Errorf("the reason is %d bytes: at most %d", len(reason), maxReason)
	}
	return nil
}

// ResumeQueue lifts the pause of queue; the tasks that waited start at
// once, within the queue's limits. It reports whether the queue was paused.
func (c *Client) ResumeQueue(ctx context.Context, queue string) (bool, error) {
	if err := c.checkQueue(ctx, queue); err != nil {
		return false, err
	}
	return etlcontext.ResumeQueue(ctx, c.pool, queue, c.actor)
}

// BlockKind blocks kind, giving the reason: once it returns, none of its
// tasks starts, on any supervisor, until UnblockKind; submissions wait.
// Blocking a blocked kind returns the block in force.
func (c *Client) BlockKind(ctx context.Context, kind, reason string) (etlcontext.KindBlock, error) {
	if strings.TrimSpace(reason) == "" {
		return etlcontext.KindBlock{}, errors.New("block kind: a reason is required")
	}
	if err := checkReason(reason); err != nil {
		return etlcontext.KindBlock{}, fmt.Errorf("block kind %s: %w", kind, err)
	}
	if err := c.checkKind(ctx, kind); err != nil {
		return etlcontext.KindBlock{}, err
	}
	return etlcontext.BlockKind(ctx, c.pool, kind, reason, c.actor)
}

// UnblockKind lifts the block of kind; its tasks that waited start at once,
// within their limits. It reports whether the kind was blocked.
func (c *Client) UnblockKind(ctx context.Context, kind string) (bool, error) {
	if err := c.checkKind(ctx, kind); err != nil {
		return false, err
	}
	return etlcontext.UnblockKind(ctx, c.pool, kind, c.actor)
}

// QueueStats reads data_manager.dama_queue_stats: per queue and kind, the
// tasks queued, scheduled, running and retrying, those finished in the last
// 24 hours, the oldest due task's wait, and the pauses and blocks.
func (c *Client) QueueStats(ctx context.Context) ([]etlcontext.QueueStat, error) {
	return etlcontext.QueueStats(ctx, c.pool)
}

// checkQueue refuses a name that is no queue: not in the client's
// configuration, or, without one, never seen by the database.
func (c *Client) checkQueue(ctx context.Context, queue string) error {
	if !config.ValidName(queue) {
		return fmt.Errorf("%w %q: want letters, digits, '_', '.', '-', starting with a letter", ErrUnknownQueue, queue)
	}
	if c.cfg != nil {
		if _, ok := c.cfg.Queues[queue]; !ok {
			return fmt.Errorf("%w %q: the configuration has %v", ErrUnknownQueue, queue, c.cfg.QueueNames())
		}
		return nil
	}
	known, err := etlcontext.KnownQueue(ctx, c.pool, queue)
	if err != nil || known {
		return err
	}
	return fmt.Errorf("%w %q: no task was ever submitted to it (give the configuration to name a queue before its first task)", ErrUnknownQueue, queue)
}

// checkKind is checkQueue for a kind.
func (c *Client) checkKind(ctx context.Context, kind string) error {
	if !config.ValidName(kind) {
		return fmt.Errorf("%w %q: want letters, digits, '_', '.', '-', starting with a letter", ErrUnknownKind, kind)
	}
	if c.cfg != nil {
		// The configuration's, or one a supervisor published: a lookup by
		// name, never a scan.
		if _, ok := c.cfg.Kind(kind); ok {
			return nil
		}
		published, err := etlcontext.Published(ctx, c.pool, kind)
		if err != nil || published {
			return err
		}
		return fmt.Errorf("%w %q: the configuration has %v, and no supervisor published it", ErrUnknownKind, kind, c.cfg.KindNames())
	}
	known, err := etlcontext.KnownKind(ctx, c.pool, kind)
	if err != nil || known {
		return err
	}
	return fmt.Errorf("%w %q: no supervisor published it, and no task of it was ever submitted (give the configuration to name a kind before its first task)", ErrUnknownKind, kind)
}

// Schedules reads data_manager.dama_schedules: per periodic kind, the last
// tick taken and what it did, the status of the task it submitted, and the
// next tick.
func (c *Client) Schedules(ctx context.Context) ([]etlcontext.Schedule, error) {
	return etlcontext.Schedules(ctx, c.pool)
}
