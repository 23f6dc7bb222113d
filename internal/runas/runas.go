// Package runas is the OS user a kind's command runs as (its `user:` and
// `group:`): who that is on this host, whether this process may become it,
// and what the command's process is given of it. The kernel then keeps the
// command from dama: another uid cannot signal, trace or read dama's
// processes, nor open what their modes keep from it.
package runas

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Identity is a user to run a command as, with its group and its
// supplementary groups.
type Identity struct {
	Name     string
	UID, GID uint32
	Groups   []uint32
	Home     string
}

// ErrRootByDefault refuses a kind that names no user to a process running
// as root: a command never runs as root by accident.
var ErrRootByDefault = errors.New("this supervisor runs as root, and runs no command as root unless told: give the kind (or the configuration) a user, such as user: etl (user: root to mean it)")

// Resolve is who a kind's command runs as on this host (config.Kind.User
// and Group): nil for this process's own user, which needs no switch. It
// refuses no user to a process running as root (ErrRootByDefault), and
// root's uid or gid to one that is not: dama that may switch users never
// makes a command root that it is not.
func Resolve(userName, group string) (*Identity, error) {
	if userName == "" {
		if os.Geteuid() == 0 {
			return nil, ErrRootByDefault
		}
		return nil, nil
	}
	id, err := Lookup(userName, group)
	switch {
	case err != nil:
		return nil, err
	case id.Self():
		return nil, nil
	case os.Geteuid() != 0 && (id.UID == 0 || id.GID == 0 || slices.Contains(id.Groups, 0)):
		return nil, fmt.Errorf("user %s would run as root (uid, gid or a group 0), which a supervisor that is not root never makes a command", userName)
	}
	return id, nil
}

// Check says why this process may not run a command as id: it cannot
// switch users (CanSwitch), or id is of logDir's group, so that the
// command would read every task's log. A log directory not made yet is
// checked by each task process, once its launch made it.
func (id *Identity) Check(logDir string) error {
	info, err := os.Stat(logDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("read the log directory: %w", err)
	}
	if err == nil {
		if gid := info.Sys().(*syscall.Stat_t).Gid; slices.Contains(id.Groups, gid) {
			return fmt.Errorf("user %s is of group %d, which may read every task's log (log_dir %s): give log_dir another group (log_group), or the kind another user", id.Name, gid, logDir)
		}
	}
	if err := CanSwitch(); err != nil {
		return fmt.Errorf("this process cannot switch to user %s (%v): run it as root, or grant it CAP_SETUID, CAP_SETGID and CAP_KILL (docs/security.md)", id.Name, err)
	}
	return nil
}

// Lookup finds userName (a name or a number) and, when group is not
// empty, that group (else the user's own) on this host. The supplementary
// groups are the user's own, and nothing of this process's.
func Lookup(userName, group string) (*Identity, error) {
	u, err := user.Lookup(userName)
	if err != nil {
		var unknown user.UnknownUserError
		if !errors.As(err, &unknown) {
			return nil, fmt.Errorf("user %s: %w", userName, err)
		}
		if u, err = user.LookupId(userName); err != nil {
			return nil, fmt.Errorf("user %s: no such user on this host", userName)
		}
	}
	id := &Identity{Name: u.Username, Home: u.HomeDir}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q", userName, u.Uid)
	}
	id.UID = uint32(uid)
	gid := u.Gid
	if group != "" {
		g, err := user.LookupGroup(group)
		if err != nil {
			if g, err = user.LookupGroupId(group); err != nil {
				return nil, fmt.Errorf("group %s: no such group on this host", group)
			}
		}
		gid = g.Gid
	}
	g, err := strconv.ParseUint(gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("group %s: gid %q", group, gid)
	}
	id.GID = uint32(g)
	groups, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("the groups of user %s: %w", userName, err)
	}
	// As initgroups does: the groups that list the user, and the group it
	// runs as, which replaces its own.
	id.Groups = []uint32{id.GID}
	for _, s := range groups {
		if s == u.Gid && gid != u.Gid {
			continue
		}
		if n, err := strconv.ParseUint(s, 10, 32); err == nil && !slices.Contains(id.Groups, uint32(n)) {
			id.Groups = append(id.Groups, uint32(n))
		}
	}
	return id, nil
}

// Self reports whether id is this process's own user and group: a command
// runs as it without a switch, or any privilege.
func (id *Identity) Self() bool {
	return int(id.UID) == os.Getuid() && int(id.UID) == os.Geteuid() &&
		int(id.GID) == os.Getgid() && int(id.GID) == os.Getegid()
}

// Credential is what a command's process becomes between its fork and its
// exec: id's uid, gid and groups, and nothing of dama's. A uid switch from
// root drops every capability; a user holding ambient ones clears them in
// the forking thread first (DropInherited).
func (id *Identity) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: slices.Clone(id.Groups)}
}

// Env returns env with HOME, USER and LOGNAME set for id.
func (id *Identity) Env(env []string) []string {
	env = slices.DeleteFunc(env, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return name == "HOME" || name == "USER" || name == "LOGNAME"
	})
	return append(env, "HOME="+id.Home, "USER="+id.Name, "LOGNAME="+id.Name)
}

// The capabilities a process needs to run commands as other users: to
// become them, and to stop them (a process of another uid is signalled
// only with CAP_KILL).
var switchCaps = []struct {
	bit  uint
	name string
}{{unix.CAP_SETUID, "CAP_SETUID"}, {unix.CAP_SETGID, "CAP_SETGID"}, {unix.CAP_KILL, "CAP_KILL"}}

// CanSwitch says why this process may not run commands as another user,
// or nil when it may: it holds CAP_SETUID, CAP_SETGID and CAP_KILL (root
// does, unless its bounding set was cut; dama's user, as a service's
// AmbientCapabilities).
func CanSwitch() error {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("read this process's capabilities: %w", err)
	}
	var eff uint64
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			if eff, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64); err != nil {
				return fmt.Errorf("read this process's capabilities: %q", line)
			}
		}
	}
	var missing []string
	for _, c := range switchCaps {
		if eff&(1<<c.bit) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("uid %d lacks %s", os.Geteuid(), strings.Join(missing, ", "))
	}
	return nil
}

// DropInherited clears the calling thread's inheritable and ambient
// capabilities (a capability set is a thread's: lock the goroutine to its
// thread first), so that a program it executes gets none of those a
// service manager granted dama: not at the exec (ambient), nor later from
// a file that has inheritable capabilities of its own (inheritable). The
// thread keeps its permitted and effective ones, to switch users.
func DropInherited() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read the capabilities: %w", err)
	}
	if data[0].Inheritable != 0 || data[1].Inheritable != 0 {
		data[0].Inheritable, data[1].Inheritable = 0, 0
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return fmt.Errorf("clear the inheritable capabilities: %w", err)
		}
	}
	// Ambient ones need to be inheritable: none are left. Cleared all the
	// same, as a kernel without them refuses the call.
	err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear the ambient capabilities: %w", err)
	}
	return nil
}

// CanRun says why id may not run the program at path (absolute, as
// config.Kind.FindCommand returns it): a directory on its way id may not
// search, or the file id may not execute (nor read, a script), in a line
// that names the user and the fix. The kernel answers, in a thread of its
// own that takes id's fsuid, fsgid and groups and no capability, so that
// ACLs and security modules count as at the exec. A question the kernel
// cannot answer (before Linux 5.8, or without the capabilities to switch)
// refuses nothing.
func (id *Identity) CanRun(path string) error {
	if id.UID == 0 {
		// Root executes what any execute bit allows, as its supervisor
		// found when it looked the command up.
		return nil
	}
	path, err := filepath.Abs(path)
	if err != nil {
		return nil
	}
	script := isScript(path)
	// Taking other credentials makes the process not dumpable (its /proc
	// files root's, no core): given back after, one asker at a time.
	asking.Lock()
	defer asking.Unlock()
	dumpable, _ := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	denied := make(chan string, 1)
	go func() {
		// The thread's credentials are changed for good: it is not
		// unlocked, so it ends with this goroutine.
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			denied <- id.deniedOn(path, script)
			return
		}
		// The main thread, though, is parked, not ended, and would keep
		// id's credentials for the process's listings: another goroutine,
		// which cannot run here while this one holds the thread, asks.
		inner := make(chan string, 1)
		go func() {
			runtime.LockOSThread()
			inner <- id.deniedOn(path, script)
		}()
		denied <- <-inner
		runtime.UnlockOSThread()
	}()
	on := <-denied
	if dumpable == 1 {
		_ = unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0)
	}
	if on == "" {
		return nil
	}
	want := "executable"
	switch {
	case on != path:
		want = "searchable"
	case script:
		want = "readable and executable"
	}
	// The fix in parentheses: a task's reason goes on after it ("on host h1").
	return fmt.Errorf("user %s (uid %d) cannot run %s: permission denied on %s (make it %s by %s, or give the kind a user that may)", id.Name, id.UID, path, on, want, id.Name)
}

// isScript reports whether path is a regular file that starts with "#!",
// whose interpreter reads it as the command's user. The kind's user may put
// anything at path: it is opened only once known to be a regular file (a
// FIFO's open would wait for a writer; a device's may act), by its O_PATH
// descriptor, which opens nothing.
func isScript(path string) bool {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(fd), os.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	var b [2]byte
	_, err = io.ReadFull(f, b[:])
	return err == nil && string(b[:]) == "#!"
}

// asking serializes CanRun: whether the process is dumpable is the
// process's, not a thread's.
var asking sync.Mutex

// deniedOn takes id's file system credentials in the calling thread, which
// must be locked to it and never serve another goroutine, and returns what
// id may not search or execute on the way to path, or read of a script;
// "" when it may run path, or when the kernel cannot tell.
func (id *Identity) deniedOn(path string, script bool) string {
	groups := make([]int, len(id.Groups))
	for i, g := range id.Groups {
		groups[i] = int(g)
	}
	// Each call changes this thread alone (unix.Setgroups, unlike
	// syscall.Setgroups, is the raw system call). The capabilities go
	// last: switching needs them.
	if unix.Setgroups(groups) != nil {
		return ""
	}
	unix.SetfsgidRetGid(int(id.GID))
	unix.SetfsuidRetUid(int(id.UID))
	gid, _ := unix.SetfsgidRetGid(-1)
	uid, _ := unix.SetfsuidRetUid(-1)
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if gid != int(id.GID) || uid != int(id.UID) || unix.Capget(&hdr, &data[0]) != nil {
		return ""
	}
	data[0].Effective, data[1].Effective = 0, 0
	if unix.Capset(&hdr, &data[0]) != nil {
		return ""
	}
	// AT_EACCESS: as this thread's fsuid, fsgid, groups and capabilities.
	// Only faccessat2 takes it; unix.Faccessat's stand-in would ask as
	// the process.
	may := func(p string, mode uint32) bool {
		return unix.Faccessat2(unix.AT_FDCWD, p, mode, unix.AT_EACCESS) != unix.EACCES
	}
	mode := uint32(unix.X_OK)
	if script {
		mode |= unix.R_OK
	}
	if may(path, mode) {
		return ""
	}
	// The outermost directory id may not search is the one to fix.
	parts := strings.Split(path, "/")
	for i := 1; i < len(parts); i++ {
		if dir := cmp.Or(strings.Join(parts[:i], "/"), "/"); !may(dir, unix.X_OK) {
			return dir
		}
	}
	return path
}
