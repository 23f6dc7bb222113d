package supervisor

import (
	"context"
	"errors"

	"github.com/dama-etl/dama/etlcontext"
)

// watch is the supervisor's look at every task, once per poll interval, in
// one statement that writes nothing (etlcontext.Watch). It finds the
// contexts whose lock is free while they are RUNNING, or while their job
// still runs: in this supervisor's queues, it pokes their Work, if it runs
// here, or else marks and times the loss of their lock, in one more
// statement; on this host, whoever steps them, it stops the processes
// their dead task process left behind (stopOrphans).
func (s *Supervisor) watch(ctx context.Context) error {
	w, err := etlcontext.Watch(ctx, s.pool, s.cfg.QueueNames(), s.hostID)
	if err != nil {
		return err
	}
	var elsewhere []int64
	for _, id := range w.Look {
		if !s.poke(id) {
			elsewhere = append(elsewhere, id)
		}
	}
	var errs []error
	if len(elsewhere) > 0 {
		// The fencing window runs from here for a task whose job this
		// supervisor may get later: a dead supervisor's, once rescued.
		lost, err := etlcontext.MarkLocksLost(ctx, s.pool, elsewhere)
		errs = append(errs, err)
		for _, l := range lost {
			s.fence.freeFor(l.ID, l.Mark)
		}
	}
	if w.Woken > 0 {
		for _, q := range s.cfg.QueueNames() {
			s.notifyQueue(ctx, q)
		}
	}
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
