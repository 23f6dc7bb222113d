package supervisor

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/etlcontext"
)

// watch is the supervisor's look at every task, once per poll interval, in
// one statement whose cost does not depend on how many tasks run: a
// running task's job is parked (snoozed for parkFor) and never fetched
// while its task process holds the lock, so a quiet task costs nothing.
// From pg_locks it finds the RUNNING contexts whose lock is free:
//
//   - in this supervisor's queues, their parked job is woken, so that a step
//     looks at the attempt (it died, lost its lock, or never started);
//   - on this host, whoever steps them, the processes their dead task
//     process left behind are stopped (see stopOrphans).
//
// It also wakes, in this supervisor's queues, the parked jobs whose context
// ended without the supervisors hearing of it (the runner's announcement
// was lost): a finished context, or a failed attempt.
//
// A task's exit is otherwise pushed, not polled: the supervisor reaps the
// runners it spawned and hears the others' NOTIFY (see listen).
func (s *Supervisor) watch(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, `
		WITH held AS (`+etlcontext.HeldLocks+`),
		free AS (
			SELECT c.etl_context_id, c.river_job_id, c.queue, c.host_id
			  FROM data_manager.etl_contexts AS c
			 WHERE c.etl_status = 'RUNNING'
			   AND (c.queue = ANY($1) OR c.host_id = $2)
			   AND c.etl_context_id NOT IN (SELECT etl_context_id FROM held)),
		ended AS (
			SELECT j.id
			  FROM river_job AS j
			  JOIN data_manager.etl_contexts AS c ON c.river_job_id = j.id
			 WHERE j.state IN ('scheduled', 'available')
			   AND j.queue = ANY($1)
			   AND j.kind = $3
			   AND j.scheduled_at > now()
			   AND j.scheduled_at <= now() + $4::interval
			   AND (c.etl_status IN ('DONE', 'FAILED', 'CANCELLED')
			        -- River's attempt counter lags one behind while the job
			        -- waits: the attempt it launched has failed.
			        OR (c.etl_status = 'RETRYING' AND c.attempt > j.attempt))),
		due AS (
			SELECT river_job_id AS id FROM free WHERE queue = ANY($1) AND river_job_id IS NOT NULL
			UNION
			SELECT id FROM ended),
		woken AS (`+wakeSQL+`)
		SELECT 'woken', id, queue FROM woken
		UNION ALL
		SELECT 'here', etl_context_id, queue FROM free WHERE host_id = $2`,
		// Twice the park: River times a snooze on the supervisor's clock,
		// this on the database's.
		s.cfg.QueueNames(), s.hostID, TaskArgs{}.Kind(), 2*parkFor)
	if err != nil {
		return fmt.Errorf("look for tasks whose lock is free: %w", err)
	}
	type found struct {
		what  string
		id    int64
		queue string
	}
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (found, error) {
		var f found
		err := row.Scan(&f.what, &f.id, &f.queue)
		return f, err
	})
	if err != nil {
		return fmt.Errorf("look for tasks whose lock is free: %w", err)
	}
	queues := map[string]bool{}
	var here []int64
	for _, f := range all {
		switch f.what {
		case "woken":
			queues[f.queue] = true
		case "here":
			here = append(here, f.id)
		}
	}
	for q := range queues {
		s.notifyQueue(ctx, q)
	}
	var errs []error
	for _, id := range here {
		c, err := etlcontext.Get(ctx, s.pool, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if c.PID == nil || runnerMayLive(c) {
			continue
		}
		if procs, err := s.attemptProcesses(c).Processes(); err != nil || len(procs) > 0 {
			s.stopOrphans(id)
		}
	}
	return errors.Join(errs...)
}
