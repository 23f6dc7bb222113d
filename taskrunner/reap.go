package taskrunner

import (
	"errors"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/internal/hostproc"
)

// The runner is its command's subreaper (hostproc.BecomeSubreaper): every
// process the command starts stays below the runner, whatever group or
// session it moves to, so the runner finds its attempt's processes by
// walking its own tree, at the cost of that tree. Without the kernel's
// children lists it reads every process of the host instead, looking for
// the command's group and DAMA_RUN_ID.

// stopDescendants kills what remains of the attempt's processes and waits
// for them to be gone, however long that takes (a process in uninterruptible
// sleep dies late): the outcome is recorded, and the lock released, only
// once no process of the attempt is left to meet the next one.
func (r *runner) stopDescendants(a hostproc.Attempt) {
	nextReport := time.Now().Add(30 * time.Second)
	for {
		var (
			pids []int
			err  error
		)
		if r.subreaper {
			pids, err = r.killTree()
		} else {
			if pids, err = a.Processes(); len(pids) > 0 {
				_ = a.Signal(syscall.SIGKILL)
			}
		}
		if err == nil && len(pids) == 0 {
			return
		}
		if time.Now().After(nextReport) {
			r.logger.Error("processes of the command survive SIGKILL; waiting for them before recording the outcome", "pids", pids, "error", err)
			nextReport = time.Now().Add(30 * time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// killTree reaps the runner's exited children, sends SIGKILL to each live
// process below the runner, and returns those it found alive.
func (r *runner) killTree() ([]int, error) {
	tree, err := hostproc.Descendants(os.Getpid())
	var live []int
	for _, st := range tree {
		if st.Zombie() {
			// Only a child of the runner's can be reaped here; a deeper one
			// is reparented to the runner when its parent is killed.
			_, _ = unix.Wait4(st.PID, nil, unix.WNOHANG, nil)
			continue
		}
		live = append(live, st.PID)
		signalExactly(st, syscall.SIGKILL)
	}
	return live, err
}

// reapOrphans reaps the runner's exited children but skip (the command,
// which its own wait reaps): descendants of the command orphaned, then
// exited, while it runs. Without it a command that starts daemons would
// leave the runner a zombie each.
func (r *runner) reapOrphans(skip int) {
	kids, err := hostproc.Children(os.Getpid())
	if err != nil {
		return
	}
	for _, pid := range kids {
		if pid == skip {
			continue
		}
		if st, err := hostproc.ReadStat(pid); err == nil && st.Zombie() {
			_, _ = unix.Wait4(pid, nil, unix.WNOHANG, nil)
		}
	}
}

// signalExactly sends sig to the process st names, and to no other: a pid
// reused since st was read (its process reaped by its parent, a descendant
// of the runner's) has another start time. A pidfd holds the process from
// before that check on; a kernel without pidfds (before 5.3) gets a plain
// kill after it.
func signalExactly(st hostproc.Stat, sig syscall.Signal) {
	fd, err := unix.PidfdOpen(st.PID, 0)
	if errors.Is(err, unix.ENOSYS) {
		if now, err := hostproc.ReadStat(st.PID); err == nil && now.StartTicks == st.StartTicks {
			_ = syscall.Kill(st.PID, sig)
		}
		return
	}
	if err != nil {
		return // gone
	}
	defer unix.Close(fd)
	if now, err := hostproc.ReadStat(st.PID); err != nil || now.StartTicks != st.StartTicks {
		return
	}
	_ = unix.PidfdSendSignal(fd, sig, nil, 0)
}
