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
// session it moves to, so the runner finds its attempt's processes in its
// own tree. Without the kernel's children lists it reads every process of
// the host instead, looking for the command's group and DAMA_RUN_ID.

// stopDescendants kills what remains of the attempt's processes and waits
// for them to be gone, however long that takes (uninterruptible sleep): the
// outcome is recorded, and the lock released, only once none is left to meet
// the next attempt. A process the runner may not signal or read (another
// user's: a setuid program the command ran) is said once and not waited for.
func (r *runner) stopDescendants(a hostproc.Attempt) {
	nextReport := time.Now().Add(30 * time.Second)
	unkillable := map[process]bool{}
	for {
		var (
			pids []int
			err  error
		)
		if r.subreaper {
			pids, err = r.killTree(unkillable)
		} else if pids, err = a.Processes(); len(pids) > 0 {
			_ = a.Signal(syscall.SIGKILL)
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

// process names a process by its pid and start time (0 when unreadable).
type process struct {
	pid   int
	ticks uint64
}

// killTree reaps the runner's exited children, sends SIGKILL to each live
// process below the runner but those in unkillable (to which it adds those
// it may not signal or read), and returns the runner's children left: the
// runner, their subreaper, has a child for as long as any process of the
// attempt lives (but below one it may not signal). A process that cannot be
// read is left to the next walk: the runner's child once its parent is killed.
func (r *runner) killTree(unkillable map[process]bool) ([]int, error) {
	self := os.Getpid()
	tree, _ := hostproc.Descendants(self)
	for _, st := range tree {
		if st.Zombie() {
			// Only a child of the runner's can be reaped here; a deeper one
			// is reparented to the runner when its parent is killed.
			_, _ = unix.Wait4(st.PID, nil, unix.WNOHANG, nil)
			continue
		}
		p := process{st.PID, st.StartTicks}
		if unkillable[p] || r.isKeeper(p) {
			continue
		}
		if err := signalExactly(st, syscall.SIGKILL); errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			r.markUnkillable(unkillable, p)
		}
	}
	kids, err := hostproc.Children(self)
	if err != nil {
		return nil, err
	}
	var left []int
	for _, pid := range kids {
		if st, serr := hostproc.ReadStat(pid); serr == nil {
			if p := (process{pid, st.StartTicks}); !unkillable[p] && !r.isKeeper(p) {
				left = append(left, pid)
			}
			continue
		}
		// Gone meanwhile, or another user's under hidepid, which cannot
		// be read: a signal 0 tells.
		switch kerr := syscall.Kill(pid, 0); {
		case errors.Is(kerr, syscall.ESRCH):
		case errors.Is(kerr, syscall.EPERM), errors.Is(kerr, syscall.EACCES):
			r.markUnkillable(unkillable, process{pid: pid})
		default:
			// A child of the runner's, unreaped: its pid is its own.
			_ = syscall.Kill(pid, syscall.SIGKILL)
			left = append(left, pid)
		}
	}
	return left, nil
}

// markUnkillable notes, and says once, that the runner may not stop p.
func (r *runner) markUnkillable(unkillable map[process]bool, p process) {
	if !unkillable[p] {
		unkillable[p] = true
		r.logger.Warn("a process of the command may not be signalled (another user's): it is left running", "pid", p.pid)
	}
}

// reapOrphans reaps the runner's exited children but skip (the command): a
// command's orphans that exited, else a zombie for each daemon it starts.
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
// reused since st was read has another start time. A pidfd holds the
// process from before that check on; where pidfds are refused (a kernel
// before 5.3, a seccomp filter) a plain kill follows the check. A process
// gone is no error.
func signalExactly(st hostproc.Stat, sig syscall.Signal) error {
	same := func() bool {
		now, err := hostproc.ReadStat(st.PID)
		return err == nil && now.StartTicks == st.StartTicks
	}
	fd, err := unix.PidfdOpen(st.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err == nil {
		defer unix.Close(fd)
		if !same() {
			return nil
		}
		err = unix.PidfdSendSignal(fd, sig, nil, 0)
		if err == nil || errors.Is(err, unix.ESRCH) {
			return nil
		}
		if errors.Is(err, unix.EPERM) && same() {
			// Refused by a filter, or another user's process: a plain kill
			// tells which.
			return ignoreGone(syscall.Kill(st.PID, sig))
		}
		return err
	}
	if !same() {
		return nil
	}
	return ignoreGone(syscall.Kill(st.PID, sig))
}

func ignoreGone(err error) error {
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}
