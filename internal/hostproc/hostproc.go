// Package hostproc identifies this host and the processes of a task attempt
// on it, from /proc, so that a supervisor can tell for sure whether any
// process of an earlier attempt still lives.
//
// A host is identified by its boot id and its PID namespace (two containers
// with one host name differ by namespace), so a pid recorded under one host
// id means the same process only under that id. A process is identified by
// its pid and its start time in clock ticks since boot, which is exact,
// unlike a wall-clock start time rounded to seconds.
//
// Every answer errs on the side of "alive": a process that cannot be read is
// not proof of death.
package hostproc

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ID returns this host's identity: "<boot id>/<pid namespace inode>".
func ID() (string, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return "", fmt.Errorf("read pid namespace: %w", err)
	}
	// ns reads "pid:[4026531836]".
	ns = strings.TrimSuffix(strings.TrimPrefix(ns, "pid:["), "]")
	return strings.TrimSpace(string(boot)) + "/" + ns, nil
}

// Stat is what /proc/<pid>/stat says of a process that matters here.
type Stat struct {
	PID        int
	State      byte
	PPID       int
	PGID       int
	StartTicks uint64
}

// ErrGone reports a process that does not exist.
var ErrGone = errors.New("no such process")

// procError is the failure to read what of process pid: ErrGone when the
// process does not exist.
func procError(pid int, what string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("process %d: %w", pid, ErrGone)
	}
	return fmt.Errorf("read %s of process %d: %w", what, pid, err)
}

// ReadStat reads /proc/<pid>/stat; it returns ErrGone when the process does
// not exist.
func ReadStat(pid int) (Stat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, procError(pid, "stat", err)
	}
	return parseStat(pid, data)
}

// parseStat parses a stat line. The command name, in parentheses, may
// itself hold spaces and parentheses: the fields start after the last ')'.
func parseStat(pid int, data []byte) (Stat, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return Stat{}, fmt.Errorf("parse stat of process %d: no command name", pid)
	}
	// Fields from 3 (state) on; starttime is field 22, pgrp field 5.
	f := strings.Fields(string(data[end+1:]))
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("parse stat of process %d: %d fields", pid, len(f))
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgid, err2 := strconv.Atoi(f[2])
	ticks, err3 := strconv.ParseUint(f[19], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return Stat{}, fmt.Errorf("parse stat of process %d: %w", pid, err)
	}
	return Stat{PID: pid, State: f[0][0], PPID: ppid, PGID: pgid, StartTicks: ticks}, nil
}

// Self returns this process's stat.
func Self() (Stat, error) { return ReadStat(os.Getpid()) }

// Zombie reports a process that has exited and waits to be reaped.
func (s Stat) Zombie() bool { return s.State == 'Z' || s.State == 'X' }

// Alive reports whether the process pid that started at startTicks still
// runs. A pid reused by another process is not alive. An error reading the
// process is returned with alive true: it is no proof of death.
func Alive(pid int, startTicks uint64) (bool, error) {
	st, err := ReadStat(pid)
	switch {
	case errors.Is(err, ErrGone):
		return false, nil
	case err != nil:
		return true, err
	}
	return st.StartTicks == startTicks && !st.Zombie(), nil
}

// Attempt names the processes of one task attempt on this host.
type Attempt struct {
	// PGID is the command's process group, 0 when unknown.
	PGID int
	// LeaderStartTicks is the start time of the group's leader, the command.
	LeaderStartTicks uint64
	// Marker is an environment entry (NAME=value) unique to the attempt,
	// which the command's descendants inherit; empty means none.
	Marker string
}

// Processes returns the live processes of the attempt: the members of its
// process group (unless the group's id now belongs to a new group), and any
// process whose environment carries the marker, such as a descendant that
// left the group with setsid. An error reading a process that may belong
// to the attempt is returned beside what was found; the caller must then
// treat the attempt as alive.
func (a Attempt) Processes() ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	groupReused := false
	if a.PGID > 0 {
		leader, err := ReadStat(a.PGID)
		switch {
		case errors.Is(err, ErrGone):
		case err != nil:
			return nil, err
		default:
			// The kernel never hands out a pid still in use as a process
			// group id: a leader with another start time means every member
			// of the old group is gone. An unknown start time proves nothing.
			groupReused = a.LeaderStartTicks != 0 && leader.StartTicks != a.LeaderStartTicks
		}
	}
	var (
		found []int
		errs  []error
	)
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		st, err := ReadStat(pid)
		if err != nil && !errors.Is(err, ErrGone) {
			errs = append(errs, err)
		}
		switch {
		case err != nil || st.Zombie():
			// Gone, unreadable (as errs says) or exited.
		case a.PGID > 0 && !groupReused && st.PGID == a.PGID:
			found = append(found, pid)
		// Only the command and what it started carry the marker, and none
		// of them started before the command: reading the environment of
		// every older process (the server's backends, other tasks) would
		// make each of many tasks ending at once read the whole process
		// table.
		case a.Marker != "" && (a.LeaderStartTicks == 0 || st.StartTicks >= a.LeaderStartTicks):
			if hasEnv(pid, a.Marker) {
				found = append(found, pid)
			}
		}
	}
	return found, errors.Join(errs...)
}

// hasEnv reports whether the environment of pid holds entry. Another
// user's process's environment is unreadable: a command of a kind's user
// that left its group is not found once its task process is gone
// (docs/security.md).
func hasEnv(pid int, entry string) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	for kv := range bytes.SplitSeq(data, []byte{0}) {
		if string(kv) == entry {
			return true
		}
	}
	return false
}

// Signal sends sig to every live process of the attempt: to the whole group
// at once only while its leader is verifiably the attempt's command, so
// that a process group id reused by someone else is never signalled as a
// whole; otherwise to each process alone, after its group is read again.
func (a Attempt) Signal(sig syscall.Signal) error {
	pids, err := a.Processes()
	leaderOurs := false
	if a.PGID > 0 && a.LeaderStartTicks > 0 {
		if st, serr := ReadStat(a.PGID); serr == nil && st.StartTicks == a.LeaderStartTicks && !st.Zombie() {
			leaderOurs = true
		}
	}
	if leaderOurs {
		_ = syscall.Kill(-a.PGID, sig)
	}
	for _, pid := range pids {
		if st, serr := ReadStat(pid); serr != nil || leaderOurs && st.PGID == a.PGID {
			continue
		}
		_ = syscall.Kill(pid, sig)
	}
	return err
}

// clockTicks is USER_HZ, the unit of start times in /proc: 100 on every
// Linux architecture that dama runs on.
const clockTicks = 100

// StartTime converts a start time in clock ticks since boot to wall-clock
// time, to within one tick (10 ms): comparisons use the ticks.
//
// Start times count from boot on CLOCK_BOOTTIME, so the boot's wall-clock
// time is now less that clock. /proc/stat's btime would do, but it is
// truncated to the second: every start would read up to a second early.
func StartTime(ticks uint64) (time.Time, error) {
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, fmt.Errorf("read the time since boot: %w", err)
	}
	sinceBoot := time.Duration(ts.Nano())
	return now.Add(-sinceBoot).Add(time.Duration(ticks) * time.Second / clockTicks).Round(0), nil
}

// Tracer returns the pid of a process tracing one of pid's threads
// (ptrace), 0 when none does: each thread's TracerPid, as a tracer may
// attach to any thread, and the process's status shows only its first's.
func Tracer(pid int) (int, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	threads, err := os.ReadDir(dir)
	if err != nil {
		return 0, procError(pid, "threads", err)
	}
	for _, th := range threads {
		data, err := os.ReadFile(dir + "/" + th.Name() + "/status")
		if err != nil {
			if err = procError(pid, "status", err); errors.Is(err, ErrGone) {
				continue // the thread ended since it was listed
			}
			return 0, err
		}
		_, v, ok := strings.Cut(string(data), "\nTracerPid:")
		v, _, _ = strings.Cut(v, "\n")
		tracer, err := strconv.Atoi(strings.TrimSpace(v))
		switch {
		case !ok:
			return 0, fmt.Errorf("status of process %d: no TracerPid", pid)
		case err != nil:
			return 0, fmt.Errorf("status of process %d: TracerPid %q", pid, v)
		case tracer != 0:
			return tracer, nil
		}
	}
	return 0, nil
}

// CloseInheritedOnExec marks every descriptor of this process above 2
// close-on-exec, so that what its starter left open (a harness's pipe, a
// shell's redirection) reaches none of the programs it starts.
func CloseInheritedOnExec() error {
	err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil || !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EPERM) {
		return err
	}
	// Before Linux 5.11, or under a seccomp profile that predates
	// close_range: each descriptor open now.
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list this process's descriptors: %w", err)
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			// The directory's own descriptor is closed by now: EBADF.
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
				return fmt.Errorf("keep descriptor %d from the programs this process starts: %w", fd, err)
			}
		}
	}
	return nil
}
