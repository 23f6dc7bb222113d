package supervisor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"slices"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/cgroup"
	"github.com/dama-etl/dama/internal/runas"
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
		k := cfg.Kinds[name]
		if id, rerr := runas.Resolve(k.User, k.Group); rerr == nil && id == nil {
			// The groups are dama's user's: so would they be its command's.
			logger.Warn("a kind's command runs as dama's own user: it may lift its resources and leave its control group; give the kind a user of its own", "kind", name)
		}
		probe, perr := tree.New("probe-"+rand.Text(), cgroup.Limits{Memory: int64(k.Resources.Memory), CPU: k.Resources.CPU, Pids: k.Resources.Pids})
		if perr == nil {
			perr = probe.Delete()
		}
		if perr != nil {
			err = fmt.Errorf("kind %s: resources: %w", name, perr)
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

// runIDRE matches a run id: a group's name under the tree that is not the
// supervisor's own.
var runIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// sweepGroups stops what is left in the groups of this host's tree whose
// run is no running task's, and removes them: an attempt whose task
// process died while no supervisor of this host looked, retried or
// settled elsewhere since, which Gone, asked of current runs only, never
// sees. Once, at the start.
func (s *Supervisor) sweepGroups(ctx context.Context) {
	names, err := s.groups.Groups()
	if err != nil {
		s.logger.Warn("list the attempts' control groups", "error", err)
		return
	}
	runs := slices.DeleteFunc(names, func(name string) bool { return !runIDRE.MatchString(name) })
	live, err := etlcontext.RunningRuns(ctx, s.pool, runs)
	if err != nil {
		s.logger.Warn("list the attempts' control groups", "error", err)
		return
	}
	for _, run := range runs {
		if slices.Contains(live, run) {
			continue
		}
		g, err := s.groups.Load(run)
		if err != nil {
			continue
		}
		pids, _ := g.Procs()
		had := len(pids) > 0
		for deadline := time.Now().Add(5 * time.Second); len(pids) > 0 && time.Now().Before(deadline); pids, _ = g.Procs() {
			_ = g.Kill()
			sleep(ctx, 20*time.Millisecond)
		}
		if err := g.Delete(); err != nil {
			s.logger.Warn("remove the control group of a finished attempt", "run_id", run, "error", err)
		} else if had {
			s.logger.Info("stopped what a finished attempt left running", "run_id", run)
		}
	}
}
