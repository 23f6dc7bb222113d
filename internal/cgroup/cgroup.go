// Package cgroup puts each task attempt on a host in a control group of its
// own, for three reasons. Limits: the kernel bounds the attempt's memory,
// CPUs and number of processes, and an attempt that allocates too much is
// killed alone, not the host's other tasks or dama. Cost: CPU time, peak
// memory, block IO and OOM kills are the kernel's own counters for the
// group, read once at the end, and they count every process that was in it,
// reaped or not. A set of processes: whatever the command forks, even a
// daemon that leaves its session with setsid, is born in the group and
// cannot leave it (its user may not write the group's files), so "every
// process is gone" is an empty group and "kill them all" is the group's, with
// no scan of /proc and no guess from process groups or sessions.
//
// A host with cgroup v2 (<root>/cgroup.controllers exists) gets it; any other
// gets cgroup v1, with the memory, cpu, cpuacct, pids, freezer and blkio
// controllers each mounted at <root>/<controller>. The cgroup files are
// written through runc's library, github.com/opencontainers/cgroups, which
// logs through logrus only on paths this package never takes on a host with
// /sys/fs/cgroup; it costs a binary 0.4 MB and no measurable init time.
//
// dama needs no root: it is enough that root made the parent and gave it to
// dama's user (v1, for each controller), or that systemd delegated the unit's
// cgroup (Delegate=yes; see Delegated). Open says which in one line when
// neither is so.
package cgroup

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/cgroups"

	"github.com/dama-etl/dama/protocol"
	"golang.org/x/sys/unix"
)

// Limits bound a group; a zero field is no limit. Memory limits RAM, not
// swap.
type Limits struct {
	Memory int64   // bytes
	CPU    float64 // CPUs, e.g. 1.5
	Pids   int64
}

// IsZero tells whether l limits nothing.
func (l Limits) IsZero() bool { return l == Limits{} }

// Usage is what a group's processes cost, from the kernel's counters. A
// counter whose controller the group lacks (on v2, one its parent does not
// enable for it) is 0: only CPU is counted by every v2 group. Block IO on v1
// is what the processes put through to disk themselves (reads, direct IO,
// fsync), not the page cache's later writeback, which v2 counts too (with
// its memory and io controllers).
type Usage struct {
	CPU         time.Duration // user+system of every process that was in the group
	PeakMemory  int64         // bytes; v1 memory.max_usage_in_bytes, v2 memory.peak
	ReadBytes   int64         // block IO
	WriteBytes  int64
	OOMKills    int64 // processes the kernel killed for the group's memory limit
	MemoryLimit int64 // the limit in force, 0 none
	PidsLimited int64 // forks refused by pids.max (pids.events max)
}

// Record is u as an attempt's record keeps it. A peak of 0 is one the
// kernel did not count (cgroup v2 before Linux 5.19, or no memory
// controller): left out, not recorded as 0.
func (u Usage) Record() protocol.Usage {
	return protocol.Usage{
		CPUSeconds: u.CPU.Seconds(), PeakMemory: u.PeakMemory, ReadBytes: u.ReadBytes, WriteBytes: u.WriteBytes,
		MemoryLimit: u.MemoryLimit, OOMKilled: u.OOMKills > 0, ForksRefused: u.PidsLimited,
	}
}

// v1Controllers are the v1 hierarchies a group is made in. The freezer
// comes first: made first and removed last, it is there while any part of
// the group is (Load), and its cgroup.procs is the set Kill freezes.
var v1Controllers = []string{"freezer", "memory", "cpu", "cpuacct", "pids", "blkio"}

// probed are the files a group needs to write, checked by Open in a probe
// group (those of them the kernel has).
var probed = []string{"tasks", "cgroup.procs", "memory.limit_in_bytes", "memory.max",
	"cpu.cfs_quota_us", "cpu.max", "pids.max", "freezer.state", "blkio.throttle.read_bps_device"}

const (
	cpuPeriod = 100000 // µs: the CFS period a CPU limit is a quota of
	// noThrottle (bytes a second) throttles nothing; but without a
	// throttle rule for a device v1 counts none of a group's IO to it.
	noThrottle = 1 << 40
)

// Tree is the subtree under which dama makes its groups: parent under the
// hierarchy at root.
type Tree struct {
	root, parent string
	version      int
	ctrls        []string // v1Controllers, or v2's one hierarchy: ""
}

// Open opens the tree parent under the cgroup hierarchy at root ("" is
// /sys/fs/cgroup); parent is a path like "/dama", on v1 the same under each
// controller. Open makes parent when it may and probes that groups with
// limits can be made under it. On v2 it also enables memory, cpu, pids and
// io for parent's children when it may (not while parent has processes of
// its own: Join does then).
func Open(root, parent string) (*Tree, error) {
	t, err := Lookup(root, parent)
	if err != nil {
		return nil, err
	}
	for c, dir := range t.paths("") {
		if _, err := os.Stat(filepath.Join(t.root, c, "cgroup.procs")); err != nil {
			return nil, fmt.Errorf("open cgroup tree: no cgroup v2 at %s and no v1 %s controller at %s", t.root, c, filepath.Join(t.root, c))
		}
		err := os.MkdirAll(dir, 0o755)
		if err == nil && t.version == 2 {
			_ = t.enableControllers()
			// Needed to move a process between two groups under it (Join,
			// and CLONE_INTO_CGROUP from the supervisor's leaf).
			err = writable(dir, "cgroup.procs", "cgroup.subtree_control")
		}
		if err == nil {
			var probe string
			if probe, err = os.MkdirTemp(dir, ".probe-"); err == nil {
				err = writable(probe, probed...)
				_ = os.Remove(probe)
			}
		}
		if err != nil {
			return nil, t.notWritable(cmp.Or(c, "cgroup2"), err)
		}
	}
	return t, nil
}

// Lookup returns the tree parent under root as Open does, but neither
// makes nor probes parent: for a task process, whose supervisor opened it
// (a probe costs a launch 1.5 ms on v1, a directory made and removed in
// each controller).
func Lookup(root, parent string) (*Tree, error) {
	t := &Tree{root: cmp.Or(root, "/sys/fs/cgroup"), parent: parent, version: 2, ctrls: []string{""}}
	if !strings.HasPrefix(parent, "/") || parent == "/" || filepath.Clean(parent) != parent {
		return nil, fmt.Errorf("open cgroup tree: parent %q is not a clean absolute path below the root", parent)
	}
	if _, err := os.Stat(filepath.Join(t.root, "cgroup.controllers")); err != nil {
		t.version, t.ctrls = 1, v1Controllers
	}
	return t, nil
}

// writable checks that this process's effective user may write those of
// files in dir that exist.
func writable(dir string, files ...string) error {
	if _, err := os.Stat(dir); err != nil {
		return err
	}
	for _, f := range files {
		err := unix.Faccessat(unix.AT_FDCWD, filepath.Join(dir, f), unix.W_OK, unix.AT_EACCESS)
		if err != nil && err != unix.ENOENT {
			return &os.PathError{Op: "write", Path: filepath.Join(dir, f), Err: err}
		}
	}
	return nil
}

// notWritable is Open's one line saying what root has to grant.
func (t *Tree) notWritable(what string, err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	// The group and what moves processes, not its own limits.
	dir, files, systemd := filepath.Join(t.root, t.parent), "{,/cgroup.procs,/cgroup.subtree_control,/cgroup.threads}",
		", or use Delegate=yes with DelegateSubgroup=supervisor under systemd"
	if t.version == 1 {
		dir, files, systemd = filepath.Join(t.root, "{"+strings.Join(v1Controllers, ",")+"}", t.parent), "{,/tasks,/cgroup.procs}", ""
	}
	uid := os.Geteuid()
	return fmt.Errorf("cgroup parent %s is not writable by uid %d (%s: %w); as root run: mkdir -p %s && chown %d %s%s%s",
		t.parent, uid, what, err, dir, uid, dir, files, systemd)
}

// enableControllers enables for the parent's children those of memory, cpu,
// pids and io the parent has.
func (t *Tree) enableControllers() error {
	have, err := cgroups.ReadFile(t.dir(""), "cgroup.controllers")
	enable := slices.DeleteFunc(strings.Fields(have), func(c string) bool { return !slices.Contains([]string{"memory", "cpu", "pids", "io"}, c) })
	if err != nil || len(enable) == 0 {
		return err
	}
	return cgroups.WriteFile(t.dir(""), "cgroup.subtree_control", "+"+strings.Join(enable, " +"))
}

// Version is the cgroup version of the tree's hierarchy, 1 or 2.
func (t *Tree) Version() int { return t.version }

// Parent is the tree's parent, as given to Open.
func (t *Tree) Parent() string { return t.parent }

// dir is the v2 directory of the group name, or of the parent for "".
func (t *Tree) dir(name string) string { return filepath.Join(t.root, t.parent, name) }

// paths yields the directories of the group name (the parent's for ""),
// by controller: v1's in v1Controllers' order (cpu's and cpuacct's may be
// one), v2's one under "".
func (t *Tree) paths(name string) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for _, c := range t.ctrls {
			if !yield(c, filepath.Join(t.root, c, t.parent, name)) {
				return
			}
		}
	}
}

// checkName refuses a group name that is not one path element.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("cgroup name %q is not one path element", name)
	}
	return nil
}

// New makes a fresh group name (a run id: one path element) under the
// parent with limits l. It fails if the group exists: a group is never
// reused (on v2 one that went through cgroup.kill kills whatever is later
// cloned into it). On v2 a limit whose controller the parent does not
// enable for its children is refused.
func (t *Tree) New(name string, l Limits) (*Group, error) {
	if err := checkName(name); err != nil {
		return nil, fmt.Errorf("make cgroup: %w", err)
	}
	quota := math.Round(l.CPU * cpuPeriod)
	if l.Memory < 0 || l.Pids < 0 || !(l.CPU >= 0 && l.CPU < 1e6) || (l.CPU > 0 && quota < 1000) {
		return nil, fmt.Errorf("make cgroup %s: limits %+v out of range (CPU at least 0.01)", name, l)
	}
	g := t.group(name)
	r := &cgroups.Resources{Memory: l.Memory, CpuQuota: int64(quota)}
	if l.CPU > 0 {
		r.CpuPeriod = cpuPeriod
	}
	if l.Pids > 0 {
		r.PidsLimit = &l.Pids
	}
	var err error
	for i, dir := range g.dirs {
		// EEXIST past the first: cpu and cpuacct may be one hierarchy.
		if err = os.Mkdir(dir, 0o755); err != nil && (i == 0 || !errors.Is(err, fs.ErrExist)) {
			g.dirs = g.dirs[:i]
			break
		}
		err = nil
	}
	if err == nil && t.version == 2 {
		var have string
		have, err = cgroups.ReadFile(g.member, "cgroup.controllers")
		for _, c := range []struct {
			name string
			set  bool
		}{{"memory", l.Memory > 0}, {"cpu", l.CPU > 0}, {"pids", l.Pids > 0}} {
			if err == nil && c.set && !slices.Contains(strings.Fields(have), c.name) {
				err = fmt.Errorf("a %s limit needs the %[1]s controller, which %s does not enable", c.name, filepath.Join(t.dir(""), "cgroup.subtree_control"))
			}
		}
	} else if err == nil {
		r.BlkioThrottleReadBpsDevice, r.BlkioThrottleWriteBpsDevice = disks(), disks()
	}
	if err == nil {
		err = g.m.Set(r)
	}
	if err != nil {
		if len(g.dirs) > 0 {
			_ = g.Delete()
		}
		return nil, fmt.Errorf("make cgroup %s: %w", name, err)
	}
	return g, nil
}

// disks are rules that throttle nothing for the host's hardware block
// devices (/sys/block/*/device). Loop, device-mapper and md devices are left
// out: their IO reaches a disk, and is counted there, once.
func disks() []*cgroups.ThrottleDevice {
	var rules []*cgroups.ThrottleDevice
	devs, _ := filepath.Glob("/sys/block/*/device")
	for _, d := range devs {
		var major, minor int64
		b, err := os.ReadFile(filepath.Join(d, "../dev"))
		if _, serr := fmt.Sscanf(string(b), "%d:%d", &major, &minor); err == nil && serr == nil {
			rules = append(rules, cgroups.NewThrottleDevice(major, minor, noThrottle))
		}
	}
	return rules
}

// Load opens the existing group name, for a supervisor checking on the
// attempt of a runner that died; errors.Is(err, fs.ErrNotExist) when there
// is none.
func (t *Tree) Load(name string) (*Group, error) {
	err := checkName(name)
	if err == nil {
		g := t.group(name)
		if _, err = os.Stat(g.member); err == nil {
			return g, nil
		}
	}
	return nil, fmt.Errorf("load cgroup %s: %w", name, err)
}

// Groups returns the names of the groups under the parent.
func (t *Tree) Groups() ([]string, error) {
	var dir string
	for _, d := range t.paths("") {
		dir = d // v1: the freezer's, whose groups are made first and removed last
		break
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list cgroup %s: %w", t.parent, err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// Join moves the calling process, all its threads, into the leaf group
// name under the parent, made if need be: the supervisor's own. What it
// starts afterwards (runners, the lock keeper) is born there, in a group a
// v1 runner's forking thread may move back to. On v2 a parent with
// processes of its own may not enable controllers for its children (no
// internal processes), so Join does then: memory, cpu, pids and io, those
// the parent has.
func (t *Tree) Join(name string) error {
	err := checkName(name)
	if err == nil && t.version == 1 {
		err = t.group(name).m.Apply(os.Getpid()) // each made if need be, the pid written to its cgroup.procs
	} else if err == nil {
		if err = os.Mkdir(t.dir(name), 0o755); err == nil || errors.Is(err, fs.ErrExist) {
			err = cgroups.WriteCgroupProc(t.dir(name), os.Getpid())
		}
		if err == nil {
			err = t.enableControllers()
		}
	}
	if err != nil {
		return fmt.Errorf("join cgroup %s: %w", name, err)
	}
	return nil
}

// Delegated returns the cgroup systemd delegated to this process's unit,
// the parent to give Open, and true when this process runs on cgroup v2 in
// that unit's subgroup DelegateSubgroup=supervisor (systemd 254), of a
// group systemd marks delegated (Delegate=yes: the trusted.delegate or
// user.delegate attribute) and this process may write; false otherwise,
// a root process in any other unit or session included. Only with the
// subgroup may the unit's group enable controllers for its children and
// still take the supervisor back at a restart, when attempts' groups hold
// processes below it (a group with controllers enabled for its children
// takes no process of its own).
func Delegated() (string, bool) { return delegated("/sys/fs/cgroup") }

// delegated is Delegated on the cgroup v2 hierarchy mounted at root.
func delegated(root string) (string, bool) {
	own, err := cgroups.ParseCgroupFile("/proc/self/cgroup")
	if _, serr := os.Stat(root + "/cgroup.controllers"); serr != nil {
		err = serr
	}
	unit := filepath.Dir(own[""])
	if err != nil || filepath.Base(own[""]) != "supervisor" || unit == "/" || unit == "." {
		return "", false
	}
	dir := filepath.Join(root, unit)
	marked := false
	for _, attr := range []string{"trusted.delegate", "user.delegate"} {
		var v [8]byte
		n, err := unix.Getxattr(dir, attr, v[:])
		marked = marked || (err == nil && string(v[:n]) == "1")
	}
	if !marked || writable(dir, "cgroup.procs", "cgroup.subtree_control") != nil {
		return "", false
	}
	return unit, true
}
