package taskrunner

import (
	"fmt"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/cgroup"
	"github.com/dama-etl/dama/protocol"
)

// newGroup makes the attempt's control group under Options.CgroupParent,
// bounded by its kind's resources; nil without a parent. The runner
// stays out of it: the kernel's OOM killer, a freeze or a kill of the
// group never reach the runner or the host's lock keeper.
func (r *runner) newGroup() (*cgroup.Group, error) {
	if r.opts.CgroupParent == "" {
		return nil, nil
	}
	var limits cgroup.Limits
	if res := r.kind.Resources; res != nil {
		limits = cgroup.Limits{Memory: int64(res.Memory), CPU: res.CPU, Pids: res.Pids}
	}
	tree, err := cgroup.Lookup("", r.opts.CgroupParent)
	if err != nil {
		return nil, err
	}
	return tree.New(r.opts.RunID, limits)
}

// emptyGroup kills the processes of the attempt's group until none is
// left, however long that takes (uninterruptible sleep): the outcome is
// recorded, and the lock released, only once none is left to meet the
// next attempt.
func (r *runner) emptyGroup(g *cgroup.Group) {
	nextReport := time.Now().Add(30 * time.Second)
	for {
		err := g.Kill()
		pids, perr := g.Procs()
		if err == nil && perr == nil && len(pids) == 0 {
			// Those that were the runner's children, or became them as
			// their subreaper's, are zombies now.
			r.reapOrphans(0)
			return
		}
		if time.Now().After(nextReport) {
			r.logger.Error("processes of the command survive SIGKILL; waiting for them before recording the outcome", "pids", pids, "error", cmpErr(err, perr))
			nextReport = time.Now().Add(30 * time.Second)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// usageOf reads what the attempt's processes cost, once they are gone.
func (r *runner) usageOf(g *cgroup.Group) *protocol.Usage {
	u, err := g.Usage()
	if err != nil {
		r.logger.Warn("read what the attempt cost from its control group", "error", err)
		return nil
	}
	return &protocol.Usage{
		CPUSeconds: u.CPU.Seconds(), PeakMemory: u.PeakMemory, ReadBytes: u.ReadBytes, WriteBytes: u.WriteBytes,
		MemoryLimit: u.MemoryLimit, OOMKilled: u.OOMKills > 0,
	}
}

// outOfMemory says that the kernel killed a process of the attempt for
// its memory limit, in the words of the kind's resources.
func outOfMemory(u *protocol.Usage) string {
	return fmt.Sprintf("out of memory: limit %s, peak %s", config.ByteSize(u.MemoryLimit), config.ByteSize(u.PeakMemory))
}
