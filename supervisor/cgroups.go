package supervisor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/cgroup"
)

// supervisorGroup is the supervisor's own leaf under the cgroup parent:
// the task processes and lock keepers it starts are born there, beside
// and not inside their attempts' groups, and a runner's thread that
// forked a command into its group goes back to a group dama may write.
const supervisorGroup = "supervisor"

// hostGroups returns where this host's attempts get a control group each
// (config.Config.CgroupParent, else the one systemd delegated to the
// supervisor's unit), having moved the supervisor into its leaf there;
// nil where there is none. A kind with resources needs one: the
// supervisor refuses to start without it, in a line that says what to
// grant.
func hostGroups(cfg *config.Config, logger *slog.Logger) (*cgroup.Tree, error) {
	if !cfg.Runs(config.RunnerHost) {
		return nil, nil
	}
	var bounded []string
	for _, name := range cfg.KindNames() {
		if k := cfg.Kinds[name]; k.Runner == config.RunnerHost && k.Resources != nil && !k.Resources.IsZero() {
			bounded = append(bounded, name)
		}
	}
	parent, delegated := cfg.CgroupParent, false
	if parent == "" {
		parent, delegated = cgroup.Delegated()
	}
	if parent == "" {
		if len(bounded) > 0 {
			return nil, fmt.Errorf("kind %s has resources, but no control group is given to dama: set cgroup_parent, or run the supervisor under systemd with Delegate=yes and DelegateSubgroup=supervisor (docs/configuration.md, Resources)", bounded[0])
		}
		return nil, nil
	}
	tree, err := cgroup.Open("", parent)
	if err == nil {
		err = tree.Join(supervisorGroup)
	}
	// Each kind's bounds, tried in a group of their own: a host whose
	// groups lack a controller would otherwise fail every attempt.
	for _, name := range bounded {
		if err != nil {
			break
		}
		res := cfg.Kinds[name].Resources
		var probe *cgroup.Group
		if probe, err = tree.New("probe-"+rand.Text(), cgroup.Limits{Memory: int64(res.Memory), CPU: res.CPU, Pids: res.Pids}); err == nil {
			err = probe.Delete()
		} else {
			err = fmt.Errorf("kind %s: resources: %w", name, err)
		}
	}
	switch {
	case err == nil:
		return tree, nil
	case delegated && len(bounded) == 0:
		logger.Warn("the control group systemd delegated is unusable: attempts run without one", "cgroup", parent, "error", err)
		return nil, nil
	case delegated:
		return nil, fmt.Errorf("the control group systemd delegated, %s: %w", parent, err)
	}
	return nil, fmt.Errorf("cgroup_parent: %w", err)
}

// emptyGroup empties and removes the control group of c's current attempt
// on this host, named by its run, whose task process is dead, having
// recorded what the attempt cost: GoneSurely once it is gone, or where it
// has none here (an attempt of a release or a host without groups). The
// kernel keeps the attempt's processes in it, whatever session they moved
// to, or user (but dama's own).
func (s *Supervisor) emptyGroup(ctx context.Context, c *etlcontext.Context) Gone {
	if s.groups == nil || c.RunID == nil {
		return GoneSurely
	}
	g, err := s.groups.Load(*c.RunID)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return GoneSurely
	case err != nil:
		s.logger.Warn("open the control group of a dead attempt; counting its processes alive", "etl_context_id", c.ID, "error", err)
		return GoneNot
	}
	switch pids, err := g.Procs(); {
	case err != nil:
		s.logger.Warn("read the control group of a dead attempt; counting its processes alive", "etl_context_id", c.ID, "error", err)
		return GoneNot
	case len(pids) > 0:
		if err := g.Kill(); err != nil {
			s.logger.Warn("stop what a dead attempt left running", "etl_context_id", c.ID, "pids", pids, "error", err)
		}
		return GoneNot
	}
	if u, err := g.Usage(); err == nil {
		if err := etlcontext.RecordAttemptCost(ctx, s.pool, c.ID, *c.RunID, u.Record()); err != nil {
			s.logger.Warn("record what a dead attempt cost", "etl_context_id", c.ID, "error", err)
		}
	}
	if err := g.Delete(); err != nil {
		s.logger.Warn("remove the control group of a dead attempt", "etl_context_id", c.ID, "error", err)
		return GoneNot
	}
	return GoneSurely
}
