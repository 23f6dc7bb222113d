package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/submit"
)

// Bounds of the wait until a periodic kind's next tick: the floor keeps a
// supervisor whose clock runs ahead from spinning, and the ceiling catches
// up on a clock jump or a host that slept.
const (
	minTickWait = 100 * time.Millisecond
	maxTickWait = time.Minute
)

// TickKey is the idempotency key of the task a periodic kind's tick
// submits: a second submission for the same tick, whoever makes it, returns
// the first.
func TickKey(kind string, tick time.Time) string {
	return "dama:schedule:" + kind + ":" + tick.UTC().Format(time.RFC3339)
}

// scheduleLoop takes the ticks of periodic kind name until ctx ends.
func (s *Supervisor) scheduleLoop(ctx context.Context, name string, k config.Kind, sched *config.Schedule) {
	for {
		wait, err := s.takeTick(ctx, name, k, sched)
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("take a tick of the schedule", "kind", name, "error", err)
			wait = time.Duration(s.cfg.PollInterval)
		}
		if !sleep(ctx, min(max(wait, minTickWait), maxTickWait)) {
			return
		}
	}
}

// takeTick takes kind name's latest tick unless a supervisor took it
// already, and returns how long until the next. The tick, its task and the
// kind's schedule row are written in one transaction under the kind's
// schedule lock: one task per tick, however many supervisors run, and ticks
// missed while none ran give one task.
func (s *Supervisor) takeTick(ctx context.Context, name string, k config.Kind, sched *config.Schedule) (time.Duration, error) {
	var now, next time.Time
	// The wait until the next tick is counted from the transaction's start,
	// when the database's clock was read: what it then took (queued behind
	// the other supervisors' ticks) comes off it, or every supervisor would
	// wake that much late, and a tick none took before the next be folded.
	began := time.Now()
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		row, ok, dbNow, err := etlcontext.LockSchedule(ctx, tx, name)
		if err != nil {
			return err
		}
		now, next = dbNow, sched.Next(dbNow)
		rec := etlcontext.Schedule{
			Kind: name, Spec: sched.Spec, Timezone: sched.Zone, Overlap: string(k.Overlap),
			NextTick: &next, UpdatedBy: s.host,
		}
		if !ok || row.Spec != sched.Spec || row.Timezone != sched.Zone {
			// Like cron, a new or changed schedule starts with its next
			// tick, not with one from before it existed.
			rec.LastTick, rec.LastOutcome = now, etlcontext.TickBaseline
			if ok {
				// Two supervisors that disagree reset each other's ticks, and
				// none is taken until they agree.
				s.logger.Warn("schedule changed: ticks count from now", "kind", name, "schedule", sched.Spec, "timezone", sched.Zone,
					"previous_schedule", row.Spec, "previous_timezone", row.Timezone, "previous_by", row.UpdatedBy)
			}
			s.logger.Info("schedule taken up", "kind", name, "schedule", sched.Spec, "timezone", sched.Zone, "next_tick", next)
			return etlcontext.RecordTick(ctx, tx, rec)
		}
		tick := sched.Latest(row.LastTick, now)
		if tick.IsZero() {
			return nil
		}
		rec.LastTick = tick
		if k.Overlap == config.OverlapSkip {
			n, err := etlcontext.Unfinished(ctx, tx, name)
			if err != nil {
				return err
			}
			if n > 0 {
				rec.LastOutcome = etlcontext.TickSkipped
				s.logger.Info("tick skipped: a task of the kind is unfinished", "kind", name, "tick", tick, "unfinished", n)
				return etlcontext.RecordTick(ctx, tx, rec)
			}
		}
		// The tick's key is one of dama's own, which dama.Client.SubmitTx refuses.
		params := submit.Params{Kind: name, Args: []byte(k.ScheduleArgs), IdempotencyKey: TickKey(name, tick)}
		id, _, err := s.submit.Tx(ctx, tx, params)
		if err != nil {
			return err
		}
		rec.LastOutcome, rec.LastContextID = etlcontext.TickSubmitted, &id
		s.logger.Info("tick submitted a task", "kind", name, "tick", tick, "etl_context_id", id)
		return etlcontext.RecordTick(ctx, tx, rec)
	})
	if err != nil {
		return 0, fmt.Errorf("kind %s: %w", name, err)
	}
	if next.IsZero() {
		return maxTickWait, nil
	}
	return next.Sub(now) - time.Since(began), nil
}
