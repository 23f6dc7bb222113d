package supervisor

import (
	"context"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
)

// pruneBatch bounds the tasks one transaction of the retention removes:
// each transaction is short and locks few rows, so that it never holds up
// the tasks running beside it.
const pruneBatch = 500

// prunedWhat are the values of dama_pruned_total's label.
var prunedWhat = []string{"tasks", "events", "attempts", "jobs"}

// pruneEvery is how often a supervisor removes the finished tasks older
// than retention: a quarter of it, within the poll interval and an hour,
// so that a task outlives its retention by at most that much.
func pruneEvery(retention, poll time.Duration) time.Duration {
	return min(max(retention/4, poll), time.Hour)
}

// pruneLoop removes the finished tasks older than the configuration's
// retention, every pruneEvery, until ctx ends. Every supervisor does it:
// they skip the tasks another one is removing.
func (s *Supervisor) pruneLoop(ctx context.Context) {
	if s.cfg.Retention < 0 {
		return
	}
	ticker := time.NewTicker(pruneEvery(s.cfg.Retention, s.cfg.PollInterval))
	defer ticker.Stop()
	for {
		if p, err := s.prune(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("remove the finished tasks older than retention", "error", err, "removed", p.Tasks)
		} else if p.Tasks > 0 {
			s.logger.Info("removed the finished tasks older than retention", "retention", s.cfg.Retention,
				"tasks", p.Tasks, "events", p.Events, "attempts", p.Attempts, "jobs", p.Jobs)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// prune removes, batch after batch, the finished tasks older than
// retention, and returns what it removed.
func (s *Supervisor) prune(ctx context.Context) (etlcontext.Pruned, error) {
	var total etlcontext.Pruned
	for ctx.Err() == nil {
		p, err := etlcontext.Prune(ctx, s.pool, s.cfg.Retention, pruneBatch)
		total = total.Add(p)
		for what, n := range map[string]int64{"tasks": p.Tasks, "events": p.Events, "attempts": p.Attempts, "jobs": p.Jobs} {
			s.metrics.pruned.WithLabelValues(what).Add(float64(n))
		}
		if err != nil || p.Tasks < pruneBatch {
			return total, err
		}
	}
	return total, ctx.Err()
}

// jobRetention is how long River's cleaner is to keep finalized jobs that
// it keeps riverDefault by default: past the configuration's retention
// and a pruneEvery, so that a finished task's job goes with the task
// rather than before it (the view's job columns would go blank), and
// forever (-1) when every task is kept. The cleaner of another program's
// River client on the same tables keeps its own periods.
func jobRetention(cfg *config.Config, riverDefault time.Duration) time.Duration {
	if cfg.Retention < 0 {
		return -1
	}
	return max(riverDefault, cfg.Retention+pruneEvery(cfg.Retention, cfg.PollInterval))
}
