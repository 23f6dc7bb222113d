package etlcontext

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// TickOutcome is what a periodic kind's tick did, as stored in
// schedules.last_outcome.
type TickOutcome string

// The outcomes of a tick.
const (
	// TickBaseline: the schedule was first seen, or changed; the tick
	// submitted nothing and later ticks count from it.
	TickBaseline  TickOutcome = "baseline"
	TickSubmitted TickOutcome = "submitted"
	// TickSkipped: a task of the kind was unfinished and the kind's
	// overlap is skip.
	TickSkipped TickOutcome = "skipped"
)

// Schedule is a periodic kind's row in data_manager.dama_schedules.
type Schedule struct {
	Kind          string      `json:"kind"`
	Spec          string      `json:"schedule"`
	Timezone      string      `json:"timezone"`
	Overlap       string      `json:"overlap"`
	LastTick      time.Time   `json:"last_tick"`
	LastOutcome   TickOutcome `json:"last_outcome"`
	LastContextID *int64      `json:"last_context_id,omitempty"`
	LastStatus    *Status     `json:"last_status,omitempty"`
	NextTick      *time.Time  `json:"next_tick,omitempty"`
	UpdatedBy     string      `json:"updated_by"`
	UpdatedAt     time.Time   `json:"updated_at"`
}

// LockSchedule takes, for the rest of tx, the lock under which kind's ticks
// are taken (waiting for another supervisor's tick to commit), and returns
// the kind's schedule row (ok false when it has none yet) and the
// database's clock, by which ticks are taken, whatever the supervisors'.
func LockSchedule(ctx context.Context, tx pgx.Tx, kind string) (s Schedule, ok bool, now time.Time, err error) {
	// A lock rather than the row's: the first row does not exist yet. now()
	// is the transaction's start, whenever it is read.
	err = tx.QueryRow(ctx, `SELECT now() FROM (SELECT pg_advisory_xact_lock($1, hashtext($2))) AS l`,
		scheduleLockNamespace, kind).Scan(&now)
	if err != nil {
		return Schedule{}, false, now, fmt.Errorf("lock schedule of %s: %w", kind, err)
	}
	s, err = collectOne[Schedule](ctx, tx, `
		SELECT kind, schedule, timezone, overlap, last_tick, last_outcome, last_context_id, NULL, next_tick, updated_by, updated_at
		  FROM data_manager.schedules WHERE kind = $1`, kind)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Schedule{}, false, now, nil
	case err != nil:
		return Schedule{}, false, now, fmt.Errorf("read schedule of %s: %w", kind, err)
	}
	return s, true, now, nil
}

// RecordTick records, in the transaction that locked it, that s.LastTick
// was taken with s.LastOutcome.
func RecordTick(ctx context.Context, tx pgx.Tx, s Schedule) error {
	_, err := tx.Exec(ctx, `
		INSERT INTO data_manager.schedules AS s (kind, schedule, timezone, overlap, last_tick, last_outcome, last_context_id,
		                                         next_tick, updated_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (kind) DO UPDATE SET
		       schedule = excluded.schedule, timezone = excluded.timezone, overlap = excluded.overlap,
		       last_tick = excluded.last_tick, last_outcome = excluded.last_outcome,
		       last_context_id = coalesce(excluded.last_context_id, s.last_context_id),
		       next_tick = excluded.next_tick, updated_by = excluded.updated_by, updated_at = now()`,
		s.Kind, s.Spec, s.Timezone, s.Overlap, s.LastTick, s.LastOutcome, s.LastContextID, s.NextTick, s.UpdatedBy)
	if err != nil {
		return fmt.Errorf("record tick %s of %s: %w", s.LastTick.Format(time.RFC3339), s.Kind, err)
	}
	return nil
}

// Unfinished counts the contexts of kind that are not finished.
func Unfinished(ctx context.Context, db DB, kind string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `
		SELECT count(*) FROM data_manager.etl_contexts
		 WHERE kind = $1 AND etl_status IN (`+sqlQueued+`, `+sqlRunning+`, `+sqlRetrying+`)`, kind).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count unfinished %s tasks: %w", kind, err)
	}
	return n, nil
}

// Schedules lists the rows of data_manager.dama_schedules by kind.
func Schedules(ctx context.Context, db DB) ([]Schedule, error) {
	list, err := collect[Schedule](ctx, db, `
		SELECT kind, schedule, timezone, overlap, last_tick, last_outcome, last_context_id, last_status, next_tick,
		       updated_by, updated_at
		  FROM data_manager.dama_schedules ORDER BY kind`)
	if err != nil {
		return nil, fmt.Errorf("read schedules: %w", err)
	}
	return list, nil
}
