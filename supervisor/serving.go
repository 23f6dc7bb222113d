package supervisor

import (
	"context"
	"os"
	"slices"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/version"
)

// servesEvery is how often a supervisor records that it serves: only the
// last sighting of one that is gone depends on it, as whether one serves
// is its liveness lock (migration 36).
const servesEvery = 30 * time.Second

// serves records in data_manager.supervisors that this supervisor serves.
func (s *Supervisor) serves(ctx context.Context) {
	modes, pods := []string{}, []string{}
	for _, name := range s.cfg.KindNames() {
		k := s.cfg.Kinds[name]
		if m := string(k.LockMode); !slices.Contains(modes, m) {
			modes = append(modes, m)
		}
		if k.Runner == config.RunnerKubernetes {
			pods = append(pods, name)
		}
	}
	slices.Sort(modes)
	err := etlcontext.SupervisorServes(ctx, s.pool, etlcontext.Supervisor{
		ClientID: s.river.ID(), Host: s.host, HostID: new(s.hostID), PID: new(os.Getpid()), Release: new(version.Release),
		LockModes: modes, Queues: s.cfg.QueueNames(), Kinds: s.cfg.KindNames(), PodKinds: pods,
	})
	if err != nil && ctx.Err() == nil {
		s.logger.Warn("record that this supervisor serves; dama supervisors may not list it", "error", err)
	}
}

// stopsServing records in data_manager.supervisors that this supervisor stopped.
func (s *Supervisor) stopsServing(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := etlcontext.SupervisorStops(ctx, s.pool, s.river.ID()); err != nil {
		s.logger.Warn("record that this supervisor stopped; dama supervisors lists it as lost", "error", err)
	}
}
