package supervisor

import (
	"context"
	"errors"

	"github.com/dama-etl/dama/internal/etlcontext"
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
	// Twice the park: River times a snooze on the supervisor's clock, the
	// watch on the database's.
	w, err := etlcontext.Watch(ctx, s.pool, s.cfg.QueueNames(), s.hostID, 2*parkFor)
	if err != nil {
		return err
	}
	for _, q := range w.WokenQueues {
		s.notifyQueue(ctx, q)
	}
	var errs []error
	for _, id := range w.FreeHere {
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
