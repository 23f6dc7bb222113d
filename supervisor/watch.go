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
// here; on this host, whoever steps them, it stops the processes their
// dead task process left behind (stopOrphans).
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
