package supervisor

import (
	"context"
	"errors"

	"github.com/dama-etl/dama/etlcontext"
)

// watch is the supervisor's look at every task, once per poll interval, in
// one statement that writes nothing: a running task's job is held by a
// Work that waits on no connection, so a quiet task costs nothing. From
// pg_locks it finds the contexts whose lock is free while they are
// RUNNING, or while their job still runs:
//
//   - in this supervisor's queues, their Work, if it runs here, is poked,
//     so that a step looks at the attempt (it died, lost its lock, never
//     started, or ended unheard);
//   - on this host, whoever steps them, the processes their dead task
//     process left behind are stopped (see stopOrphans).
//
// A task's exit is otherwise pushed, not polled: the supervisor reaps the
// runners it spawned and hears the others' NOTIFY (see listen).
func (s *Supervisor) watch(ctx context.Context) error {
	w, err := etlcontext.Watch(ctx, s.pool, s.cfg.QueueNames(), s.hostID)
	if err != nil {
		return err
	}
	for _, id := range w.Look {
		s.poke(id)
	}
	if w.Woken > 0 {
		for _, q := range s.cfg.QueueNames() {
			s.notifyQueue(ctx, q)
		}
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
