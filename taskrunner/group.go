package taskrunner

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"syscall"
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
// next attempt. A process the runner may not signal (another user's: a
// setuid program the command ran, on cgroup v1 without CAP_KILL) is said
// once and not waited for, as stopDescendants does.
func (r *runner) emptyGroup(g *cgroup.Group) {
	nextReport := time.Now().Add(30 * time.Second)
	killed := map[int]bool{}
	for {
		pids, err := g.Procs()
		if err == nil && len(pids) == 0 {
			return
		}
		if slices.ContainsFunc(pids, func(pid int) bool { return !killed[pid] }) {
			// Killed once each: a process in uninterruptible sleep is not
			// frozen again every pass.
			err = cmp.Or(g.Kill(), err)
			for _, pid := range pids {
				killed[pid] = true
			}
		} else if len(pids) > 0 && !slices.ContainsFunc(pids, func(pid int) bool {
			return !errors.Is(syscall.Kill(pid, 0), syscall.EPERM)
		}) {
			r.logger.Warn("processes of the command may not be signalled (another user's): they are left running", "pids", pids)
			return
		}
		if time.Now().After(nextReport) {
			r.logger.Error("processes of the command survive SIGKILL; waiting for them before recording the outcome", "pids", pids, "error", err)
			nextReport = time.Now().Add(30 * time.Second)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// usageOf reads what the attempt's processes cost, once they are gone.
func (r *runner) usageOf(g *cgroup.Group) *protocol.Usage {
	u, err := g.Usage()
	if err != nil {
		r.logger.Warn("read what the attempt cost from its control group", "error", err)
		return nil
	}
	return new(u.Record())
}

// outOfMemory says that the kernel killed a process of the attempt for
// its memory, in the words of the kind's resources: its limit, or the
// host's (no limit of its own), and the peak where it was counted.
func outOfMemory(u *protocol.Usage) string {
	s := "out of memory"
	if u.MemoryLimit > 0 {
		s += ": limit " + config.ByteSize(u.MemoryLimit).String()
		if u.PeakMemory > 0 {
			s += ", peak " + config.ByteSize(u.PeakMemory).String()
		}
	}
	return s
}

// forksRefused says that the pids limit refused forks of the command's
// processes: a likely cause of a failure it did not explain.
func forksRefused(u *protocol.Usage, pids int64) string {
	return fmt.Sprintf("%d forks refused at resources.pids %d", u.ForksRefused, pids)
}
