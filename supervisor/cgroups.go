package supervisor

import (
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
	var bounded string
	for _, name := range cfg.KindNames() {
		if k := cfg.Kinds[name]; k.Runner == config.RunnerHost && k.Resources != nil && !k.Resources.IsZero() {
			bounded = name
			break
		}
	}
	parent, delegated := cfg.CgroupParent, false
	if parent == "" {
		parent, delegated = cgroup.Delegated()
	}
	if parent == "" {
		if bounded != "" {
			return nil, fmt.Errorf("kind %s has resources, but no control group is given to dama: set cgroup_parent, or run the supervisor under systemd with Delegate=yes (docs/configuration.md, Resources)", bounded)
		}
		return nil, nil
	}
	tree, err := cgroup.Open("", parent)
	if err == nil {
		err = tree.Join(supervisorGroup)
	}
	switch {
	case err == nil:
		return tree, nil
	case delegated && bounded == "":
		logger.Warn("the control group systemd delegated is unusable: attempts run without one", "cgroup", parent, "error", err)
		return nil, nil
	}
	return nil, fmt.Errorf("cgroup_parent: %w", err)
}

// attemptGroup returns the control group of c's current attempt on this
// host, named by its run; nil where it has none here (an attempt of a
// release or a host without groups), which /proc then answers for.
func (s *Supervisor) attemptGroup(c *etlcontext.Context) *cgroup.Group {
	if s.groups == nil || c.RunID == nil {
		return nil
	}
	g, err := s.groups.Load(*c.RunID)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.logger.Warn("open the control group of an attempt", "etl_context_id", c.ID, "error", err)
		}
		return nil
	}
	return g
}
