package supervisor

import (
	"context"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
)

// prunedWhat are the values of dama_pruned_total's label.
func prunedWhat() []string { return []string{"tasks", "events", "attempts", "jobs"} }

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
	ticker := time.NewTicker(pruneEvery(time.Duration(s.cfg.Retention), time.Duration(s.cfg.PollInterval)))
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

// prune removes the finished tasks older than retention, and returns what
// it removed.
func (s *Supervisor) prune(ctx context.Context) (etlcontext.Pruned, error) {
	p, err := etlcontext.Prune(ctx, s.pool, time.Duration(s.cfg.Retention), etlcontext.PruneLimits{})
	for what, n := range map[string]int64{"tasks": p.Tasks, "events": p.Events, "attempts": p.Attempts, "jobs": p.Jobs} {
		s.metrics.pruned.WithLabelValues(what).Add(float64(n))
	}
	return p, err
}

// jobRetention is how long River's cleaner is to keep finalized jobs that
// it keeps riverDefault by default: past the configuration's retention and
// a pruneEvery, so that a finished task's job goes with the task rather
// than before it (the view's job columns would go blank). With every task
// kept (a negative retention) River's defaults apply, as before retention.
// River's cleaner runs on its elected leader, with the leader's periods,
// for every job of the database.
func jobRetention(cfg *config.Config, riverDefault time.Duration) time.Duration {
	if cfg.Retention < 0 {
		return riverDefault
	}
	return max(riverDefault, time.Duration(cfg.Retention)+pruneEvery(time.Duration(cfg.Retention), time.Duration(cfg.PollInterval)))
}
