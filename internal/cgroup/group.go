package cgroup

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	cgroupfs "github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
	"github.com/opencontainers/cgroups/fscommon"
	"golang.org/x/sys/unix"
)

// Group is one attempt's control group.
type Group struct {
	tree   *Tree
	name   string
	dirs   []string // v1 one a controller, in v1Controllers' order; v2 one
	member string   // the directory whose cgroup.procs lists the members
	m      cgroups.Manager
}

func (t *Tree) group(name string) *Group {
	g := &Group{tree: t, name: name}
	paths := map[string]string{}
	for c, dir := range t.paths(name) {
		g.dirs, paths[c] = append(g.dirs, dir), dir
	}
	g.member = g.dirs[0]
	// Neither NewManager fails but for a nil Resources, or v1 given v2's.
	cg := &cgroups.Cgroup{Resources: &cgroups.Resources{}}
	if g.m, _ = fs2.NewManager(cg, g.member); t.version == 1 {
		g.m, _ = cgroupfs.NewManager(cg, paths)
	}
	return g
}

// Name is the group's name under the parent.
func (g *Group) Name() string { return g.name }

// Start starts cmd with its first process inside g, so that nothing it
// forks escapes: on v2 by cloning it there (SysProcAttr.UseCgroupFD, clone3
// with CLONE_INTO_CGROUP); on v1, where membership is a thread's, by moving
// the calling OS thread into g, forking, and moving the thread back to the
// cgroups it came from, which this process must be able to write (Join).
// The caller must have locked its goroutine to its OS thread
// (runtime.LockOSThread): the runtime then makes new threads from another,
// so none is born in g.
func (g *Group) Start(cmd *exec.Cmd) error {
	if err := g.start(cmd); err != nil {
		return fmt.Errorf("start in cgroup %s: %w", g.name, err)
	}
	return nil
}

func (g *Group) start(cmd *exec.Cmd) error {
	if g.tree.version == 2 {
		fd, err := unix.Open(g.member, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var attr syscall.SysProcAttr // a copy: the caller's may serve other commands
		if cmd.SysProcAttr != nil {
			attr = *cmd.SysProcAttr
		}
		attr.UseCgroupFD, attr.CgroupFD = true, fd
		cmd.SysProcAttr = &attr
		return cmd.Start()
	}
	runtime.LockOSThread() // a no-op for a caller that did, a guard for one that did not
	tid := strconv.Itoa(unix.Gettid())
	here, err := cgroups.ParseCgroupFile("/proc/thread-self/cgroup")
	var back []string
	for _, c := range v1Controllers {
		back = append(back, filepath.Join(g.tree.root, c, here[c]))
		if err == nil {
			err = writable(back[len(back)-1], "tasks") // first: a thread that could not leave g would stay
		}
	}
	in := 0
	for ; err == nil && in < len(g.dirs); in++ {
		err = cgroups.WriteFile(g.dirs[in], "tasks", tid)
	}
	if err == nil {
		err = cmd.Start()
	}
	var stuck error
	for i := range in {
		stuck = cmp.Or(stuck, cgroups.WriteFile(back[i], "tasks", tid))
	}
	if stuck != nil {
		// The thread stays in g, locked to its goroutine, to end with it;
		// the command would share g with it: it goes.
		if err == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return cmp.Or(err, stuck)
	}
	runtime.UnlockOSThread()
	return err
}

// Procs returns the pids of the processes in g and in the groups below it
// (which a command of dama's own user may make, and move into); none once
// g is gone. The calling process is never listed: on v1 its forking
// thread passes through g during Start.
func (g *Group) Procs() ([]int, error) {
	pids, err := cgroups.GetAllPids(g.member)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list cgroup %s: %w", g.name, err)
	}
	self := os.Getpid()
	out := pids[:0]
	for _, p := range pids {
		if p != self {
			out = append(out, p)
		}
	}
	return out, nil
}

// Kill sends SIGKILL to every process in g and below it, and returns once each has it
// pending; no error when g is empty or gone. The processes leave g as the
// kernel ends them, a moment later: a caller that needs them gone polls
// Procs until it is empty. On v2 the kernel signals them all (cgroup.kill,
// Linux 5.14). On v1 (and older v2) Kill freezes g, signals each process and
// thaws g, so that none forks in between; as v1 cannot freeze a group whose
// processes keep forking, Kill repeats until a pass finds none it has not
// signalled (then none can fork: a process with SIGKILL pending cannot).
// Signalling another user's processes on v1 needs root or CAP_KILL;
// cgroup.kill needs only the right to write the file.
func (g *Group) Kill() error {
	if g.tree.version == 2 {
		err := cgroups.WriteFile(g.member, "cgroup.kill", "1")
		if err == nil || g.gone() {
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("kill cgroup %s: %w", g.name, err)
		}
		// Linux before 5.14 has no cgroup.kill: freeze and kill, as on v1.
	}
	signalled := map[int]bool{}
	for fresh := true; fresh; {
		_ = g.m.Freeze(cgroups.Frozen) // it may fail: then the next pass finds what forked meanwhile
		pids, err := g.Procs()
		fresh = false
		for _, pid := range pids {
			if !signalled[pid] {
				fresh, signalled[pid] = true, true
				if e := unix.Kill(pid, unix.SIGKILL); e != nil && e != unix.ESRCH {
					err = cmp.Or(err, e)
				}
			}
		}
		if err = cmp.Or(err, g.m.Freeze(cgroups.Thawed)); err != nil && !g.gone() {
			return fmt.Errorf("kill cgroup %s: %w", g.name, err)
		}
	}
	return nil
}

// Usage reads what g's processes cost so far.
func (g *Group) Usage() (Usage, error) {
	if g.gone() {
		return Usage{}, fmt.Errorf("read cgroup %s: %w", g.name, fs.ErrNotExist)
	}
	st, err := g.m.Stats(&cgroups.StatsOptions{Controllers: cgroups.CPU | cgroups.Memory | cgroups.IO})
	if err != nil {
		return Usage{}, fmt.Errorf("read cgroup %s: %w", g.name, err)
	}
	u := Usage{
		CPU:        time.Duration(st.CpuStats.CpuUsage.TotalUsage),
		PeakMemory: int64(st.MemoryStats.Usage.MaxUsage),
	}
	if limit := st.MemoryStats.Usage.Limit; limit < 1<<62 { // v1's none is 2^63 less a page, v2's "max" 2^64-1
		u.MemoryLimit = int64(limit)
	}
	disks := disks()
	for _, e := range st.BlkioStats.IoServiceBytesRecursive {
		if !slices.ContainsFunc(disks, func(d *cgroups.ThrottleDevice) bool { return d.Major == int64(e.Major) && d.Minor == int64(e.Minor) }) {
			// A device stacked on a disk (LVM, dm-crypt, md): its IO is
			// counted again at the disk.
			continue
		}
		switch e.Op {
		case "Read":
			u.ReadBytes += int64(e.Value)
		case "Write":
			u.WriteBytes += int64(e.Value)
		}
	}
	ooms, err := g.m.OOMKillCount()
	limited, perr := fscommon.GetValueByKey(g.m.Path("pids"), "pids.events", "max")
	for _, e := range []error{err, perr} {
		if e != nil && !errors.Is(e, fs.ErrNotExist) {
			return Usage{}, fmt.Errorf("read cgroup %s: %w", g.name, e)
		}
	}
	u.OOMKills, u.PidsLimited = int64(ooms), int64(limited)
	return u, nil
}

// Delete removes g, which must be empty; no error when it is gone.
func (g *Group) Delete() error {
	pids, err := g.Procs()
	if err == nil && len(pids) > 0 {
		err = fmt.Errorf("%d processes are in it", len(pids))
	}
	for i := len(g.dirs) - 1; i >= 0 && err == nil; i-- {
		err = cgroups.RemovePath(g.dirs[i])
	}
	if err != nil {
		return fmt.Errorf("delete cgroup %s: %w", g.name, err)
	}
	return nil
}

func (g *Group) gone() bool {
	_, err := os.Stat(g.member)
	return errors.Is(err, fs.ErrNotExist)
}
