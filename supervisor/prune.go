package supervisor

import (
	"context"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
)

// pruneEvery is how often a supervisor removes the finished tasks older
// than retention: a quarter of it, within the poll interval and an hour,
// so that a task outlives its retention by at most that much.
func pruneEvery(cfg *config.Config) time.Duration {
	return min(max(time.Duration(cfg.Retention)/4, time.Duration(cfg.PollInterval)), time.Hour)
}

// prune removes the finished tasks older than the configuration's
// retention. Every supervisor does it, every pruneEvery: they skip the
// tasks another one is removing.
func (s *Supervisor) prune(ctx context.Context) {
	p, err := etlcontext.Prune(ctx, s.pool, time.Duration(s.cfg.Retention), etlcontext.PruneLimits{})
	for what, n := range map[string]int64{"tasks": p.Tasks, "events": p.Events, "attempts": p.Attempts, "jobs": p.Jobs} {
		s.metrics.pruned.WithLabelValues(what).Add(float64(n))
	}
	if err != nil && ctx.Err() == nil {
		s.logger.Warn("remove the finished tasks older than retention", "error", err, "removed", p.Tasks)
	} else if p.Tasks > 0 {
		s.logger.Info("removed the finished tasks older than retention", "retention", s.cfg.Retention,
			"tasks", p.Tasks, "events", p.Events, "attempts", p.Attempts, "jobs", p.Jobs)
	}
}

// jobRetention is how long River's cleaner is to keep finalized jobs that
// it keeps riverDefault by default: past the configuration's retention and
// a pruneEvery, so that a finished task's job goes with the task rather
// than before it (the view's job columns would go blank). With every task
// kept (a negative retention) River's defaults apply. River's cleaner runs
// on its elected leader, with the leader's periods, for every job of the
// database.
func jobRetention(cfg *config.Config, riverDefault time.Duration) time.Duration {
	if cfg.Retention < 0 {
		return riverDefault
	}
	return max(riverDefault, time.Duration(cfg.Retention)+pruneEvery(cfg))
}
