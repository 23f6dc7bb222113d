package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/taskrunner"
)

// Budget is what the configured max_running settings need of the server's
// connections, against what the server allows.
type Budget struct {
	// MaxTasks is the most tasks that run at once: the sum of the queues'
	// max_running (across every supervisor sharing the queues).
	MaxTasks int
	// RowMode and AdvisoryMode are the connections MaxTasks task processes
	// hold in each lock mode; Configured, with each kind's own lock_mode (a
	// queue counts at its most demanding kind), and this host's lock keeper
	// when a kind uses lock_mode host.
	RowMode, AdvisoryMode, Configured int
	// Supervisor is the most this supervisor holds itself: its pool, River's
	// listener, its liveness connection and its own.
	Supervisor int
	// ServerMax is the server's max_connections less the slots reserved for
	// superusers; InUse, the client connections open now.
	ServerMax, InUse int
}

// Enough reports whether the server allows the tasks and this supervisor.
func (b Budget) Enough() bool { return b.Configured+b.Supervisor <= b.ServerMax }

// ConnectionBudget computes the budget of cfg against the server.
func (s *Supervisor) ConnectionBudget(ctx context.Context) (Budget, error) {
	b := Budget{Supervisor: int(s.pool.Config().MaxConns) + 3}
	for name, q := range s.cfg.Queues {
		perTask := 0
		for _, k := range s.cfg.Kinds {
			if k.Queue == name {
				perTask = max(perTask, k.LockMode.ConnectionsPerTask())
			}
		}
		b.MaxTasks += q.MaxRunning
		b.RowMode += q.MaxRunning * config.LockModeRow.ConnectionsPerTask()
		b.AdvisoryMode += q.MaxRunning * config.LockModeAdvisory.ConnectionsPerTask()
		b.Configured += q.MaxRunning * perTask
	}
	for _, k := range s.cfg.Kinds {
		if k.LockMode == config.LockModeHost {
			b.Configured += taskrunner.KeeperConnections
			break
		}
	}
	// reserved_connections exists from PostgreSQL 16 on.
	err := s.pool.QueryRow(ctx, `
		SELECT current_setting('max_connections')::int
		       - current_setting('superuser_reserved_connections')::int
		       - coalesce(current_setting('reserved_connections', true)::int, 0),
		       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')`).Scan(&b.ServerMax, &b.InUse)
	if err != nil {
		return b, fmt.Errorf("read the server's connection limits: %w", err)
	}
	return b, nil
}

// reportOutageTolerance logs at start what a database restart or failover
// costs the running tasks, and the fence window.
func (s *Supervisor) reportOutageTolerance() {
	grace := time.Duration(*s.cfg.ReconnectGrace)
	kill := s.cfg.KillGrace
	for _, k := range s.cfg.Kinds {
		if k.KillGrace != nil {
			kill = max(kill, *k.KillGrace)
		}
	}
	fence := taskrunner.FenceWindow(time.Duration(s.cfg.HeartbeatInterval), grace, time.Duration(kill), time.Duration(s.cfg.PollInterval))
	if grace == 0 {
		s.logger.Info("reconnect_grace is 0s: a database restart or failover ends every running attempt, retried from its checkpoint", "fence_window", fence)
		return
	}
	s.logger.Info("a database restart or failover shorter than reconnect_grace keeps running tasks running; a longer one ends their attempts, retried from their checkpoints",
		"reconnect_grace", grace, "fence_window", fence)
}

// reportBudget logs the connection budget at start, as a warning when the
// server does not allow it: a task process that cannot connect spends no
// attempt, but waits for a free connection.
func (s *Supervisor) reportBudget(ctx context.Context) {
	b, err := s.ConnectionBudget(ctx)
	if err != nil {
		s.logger.Warn("connection budget", "error", err)
		return
	}
	args := []any{
		"max_tasks", b.MaxTasks, "need_row_mode", b.RowMode, "need_advisory_mode", b.AdvisoryMode,
		"need_as_configured", b.Configured, "supervisor", b.Supervisor,
		"server_max_connections", b.ServerMax, "in_use", b.InUse,
	}
	if !b.Enough() {
		s.logger.Warn("the server allows fewer connections than the tasks of max_running and this supervisor need: tasks beyond it wait for a free connection (no attempt is spent); raise max_connections, lower max_running, or use lock_mode: host", args...)
		return
	}
	s.logger.Info("connection budget", args...)
}
