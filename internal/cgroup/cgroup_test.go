package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// helperEnv names what the test binary does when it runs as a test's
// command instead of its tests: "MODE ARG...", see helper.
const helperEnv = "DAMA_CGROUP_TEST_HELPER"

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		if err := helper(strings.Fields(h)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helper is the test binary as a command: it allocates, burns CPU, does
// block IO, or plays a supervisor as a test asks.
func helper(args []string) error {
	switch args[0] {
	case "alloc": // MiB: allocate and touch them
		n, _ := strconv.Atoi(args[1])
		var keep [][]byte
		for range n {
			b := make([]byte, 1<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			keep = append(keep, b)
		}
		runtime.KeepAlive(keep)
	case "burn": // ms of CPU time, by this process's own count
		ms, _ := strconv.Atoi(args[1])
		for x := 0; cpuTime(unix.RUSAGE_SELF) < time.Duration(ms)*time.Millisecond; {
			for range 100000 {
				x++
			}
		}
	case "io": // a file in dir: 8 MiB written and read back past the page cache
		return directIO(filepath.Join(args[1], "io"))
	case "open": // root parent: print what Open says
		_, err := Open(args[1], args[2])
		fmt.Print(err)
	case "supervise": // root parent: what a supervisor and its runner do
		return supervise(args[1], args[2])
	case "delegated": // root: print what delegated says
		p, ok := delegated(args[1])
		fmt.Print(p, " ", ok)
	}
	return nil
}

func cpuTime(who int) time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(who, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func directIO(path string) error {
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE) // aligned, as O_DIRECT wants
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|unix.O_DIRECT, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	for range 8 {
		if _, err := f.Write(buf); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if f, err = os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0); err != nil {
		return err
	}
	defer f.Close()
	for range 8 {
		if _, err := io.ReadFull(f, buf); err != nil {
			return err
		}
	}
	return nil
}

// supervise runs what a supervisor and a runner do, as whoever runs it:
// Start must refuse before Join (the thread could not come back), then
// Join, a group, a setsid daemon in it, Kill, Usage and Delete.
func supervise(root, parent string) error {
	runtime.LockOSThread()
	if status, _ := os.ReadFile("/proc/self/status"); os.Geteuid() != 0 && !bytes.Contains(status, []byte("\nCapEff:\t0000000000000000\n")) {
		return fmt.Errorf("capabilities as uid %d:\n%s", os.Geteuid(), status)
	}
	tree, err := Open(root, parent)
	if err != nil {
		return err
	}
	l := Limits{Memory: 256 << 20, CPU: 1, Pids: 50}
	if tree.Version() == 2 {
		l = Limits{} // the tests' own cgroup2 mount has no controller for them
	}
	g, err := tree.New("a1", l)
	if err != nil {
		return err
	}
	daemon := exec.Command("setsid", "sh", "-c", "sleep 1000 &")
	if tree.Version() == 1 && os.Geteuid() != 0 {
		here, _ := os.ReadFile("/proc/thread-self/cgroup")
		if err := g.Start(daemon); err == nil || !errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("start before Join: %v, want permission denied", err)
		}
		if now, _ := os.ReadFile("/proc/thread-self/cgroup"); !bytes.Equal(now, here) || daemon.Process != nil {
			return fmt.Errorf("a refused start moved the thread from\n%s\nto\n%s\nor started %v", here, now, daemon.Process)
		}
		daemon = exec.Command("setsid", "sh", "-c", "sleep 1000 &")
	}
	if err := tree.Join("supervisor"); err != nil {
		return err
	}
	if err := g.Start(daemon); err != nil {
		return err
	}
	if err := daemon.Wait(); err != nil {
		return err
	}
	ps, err := g.Procs()
	if err != nil || len(ps) != 1 {
		return fmt.Errorf("procs after the daemon's parent ended: %v, %v; want the daemon", ps, err)
	}
	if err := g.Kill(); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); len(ps) > 0; time.Sleep(time.Millisecond) {
		if ps, err = g.Procs(); err != nil || time.Now().After(deadline) {
			return fmt.Errorf("procs after Kill: %v, %v", ps, err)
		}
	}
	if _, err := g.Usage(); err != nil {
		return err
	}
	threads, _ := filepath.Glob("/proc/self/task/*/cgroup")
	for _, f := range threads {
		b, _ := os.ReadFile(f)
		fmt.Printf("%s", b)
	}
	return g.Delete()
}

// skipUnlessRoot skips a test that makes control groups as another user
// than root: it cannot.
func skipUnlessRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making control groups needs root")
	}
}

// testParent is a parent of t's own: of this process and test, no other's.
func testParent(t testing.TB) string {
	return fmt.Sprintf("/dama-test-%d-%s", os.Getpid(), regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
}

// v1Tree opens a tree under a parent of t's own in this host's cgroup v1
// hierarchies, removed with every process in it when t ends.
func v1Tree(t testing.TB) *Tree {
	t.Helper()
	skipUnlessRoot(t)
	if _, err := os.Stat("/sys/fs/cgroup/freezer/cgroup.procs"); err != nil {
		t.Skip("no cgroup v1 at /sys/fs/cgroup (the v2 tests run on a mount of their own)")
	}
	parent := testParent(t)
	for _, c := range v1Controllers {
		t.Cleanup(func() { removeCgroup(t, filepath.Join("/sys/fs/cgroup", c, parent)) })
	}
	tree, err := Open("", parent)
	if err != nil {
		t.Fatal(err)
	}
	if tree.Version() != 1 || tree.Parent() != parent {
		t.Fatalf("Open: version %d, parent %s", tree.Version(), tree.Parent())
	}
	return tree
}

// v2Tree opens a tree under a parent of t's own on a cgroup2 mount of t's
// own, unmounted with every group and process in it removed when t ends.
func v2Tree(t testing.TB) *Tree {
	t.Helper()
	skipUnlessRoot(t)
	mnt, err := os.MkdirTemp("", "dama-cgroup2-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(mnt) }) // never RemoveAll: it would rmdir others' groups if mounted
	if err := unix.Mount("none", mnt, "cgroup2", 0, ""); err != nil {
		t.Skipf("no cgroup2 to mount: %v", err)
	}
	t.Cleanup(func() {
		var err error
		if !poll(func() bool { err = unix.Unmount(mnt, 0); return err == nil }) { // EBUSY right after an rmdir
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	parent := testParent(t)
	t.Cleanup(func() { removeCgroup(t, filepath.Join(mnt, parent)) })
	tree, err := Open(mnt, parent)
	if err != nil {
		t.Fatal(err)
	}
	if tree.Version() != 2 {
		t.Fatalf("Open: version %d", tree.Version())
	}
	return tree
}

// removeCgroup removes dir and the groups under it, killing their
// processes first, without the package under test.
func removeCgroup(t testing.TB, dir string) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	for _, e := range entries {
		if e.IsDir() {
			removeCgroup(t, filepath.Join(dir, e.Name()))
		}
	}
	_ = os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	// Errors, not fatal ones: the other cleanups (the unmount) must run.
	var pids []int
	if !poll(func() bool {
		pids = readPids(t, filepath.Join(dir, "cgroup.procs"))
		for _, p := range pids {
			if p != os.Getpid() {
				_ = unix.Kill(p, unix.SIGKILL)
			}
		}
		return len(pids) == 0
	}) {
		t.Errorf("processes %v are left in %s (%d is the test)", pids, dir, os.Getpid())
	}
	if !poll(func() bool { err = unix.Rmdir(dir); return err == nil || err == unix.ENOENT }) {
		t.Errorf("rmdir %s: %v", dir, err)
	}
}

func readPids(t testing.TB, file string) []int {
	b, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Error(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		p, _ := strconv.Atoi(f)
		pids = append(pids, p)
	}
	return pids
}

// waitFor polls cond until it holds, failing t after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll(cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// poll polls cond until it holds, for 10 s at most, and tells whether it
// did.
func poll(cond func() bool) bool {
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// proc is a command started in a group from a goroutine locked to its
// thread, which waits for it, as dama's runner does.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func start(t *testing.T, g *Group, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		defer close(p.done)
		runtime.LockOSThread() // never unlocked: the thread ends with the command
		if err := g.Start(cmd); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); p.wait() })
	return p
}

func (p *proc) wait() error { <-p.done; return p.err }

// self is the test binary run as a helper.
func self(t *testing.T, args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	// A program built with the race detector sleeps a second at exit.
	cmd.Env = append(os.Environ(), helperEnv+"="+strings.Join(args, " "), "GORACE=atexit_sleep_ms=0")
	return cmd
}

func readFile(t *testing.T, dir, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// kv is the value of key in a cgroup file of "key value" lines.
func kv(t *testing.T, dir, file, key string) int64 {
	t.Helper()
	for line := range strings.SplitSeq(readFile(t, dir, file), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in %s/%s", key, dir, file)
	return 0
}

func num(t *testing.T, dir, file string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSpace(readFile(t, dir, file)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func within2(a, b float64) bool { return math.Abs(a-b) <= 0.02*math.Max(math.Abs(a), math.Abs(b)) }

func v1Dir(g *Group, controller string) string {
	return g.dirs[slices.Index(v1Controllers, controller)]
}

func TestOOMKillsTheCommandAlone(t *testing.T) {
	tree := v1Tree(t)
	const limit = 64 << 20
	g, err := tree.New("oom", Limits{Memory: limit})
	if err != nil {
		t.Fatal(err)
	}
	err = start(t, g, self(t, "alloc", "512")).wait()
	if ws, ok := err.(*exec.ExitError); !ok || ws.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the allocator ended with %v, want killed", err)
	}
	u, err := g.Usage()
	if err != nil {
		t.Fatal(err)
	}
	mem := v1Dir(g, "memory")
	if u.OOMKills < 1 || u.OOMKills != kv(t, mem, "memory.oom_control", "oom_kill") {
		t.Errorf("OOMKills %d, memory.oom_control:\n%s", u.OOMKills, readFile(t, mem, "memory.oom_control"))
	}
	if u.PeakMemory < limit*95/100 || u.PeakMemory > limit*101/100 || u.PeakMemory != num(t, mem, "memory.max_usage_in_bytes") || u.MemoryLimit != limit {
		t.Errorf("PeakMemory %d, MemoryLimit %d; want about %d, as memory.max_usage_in_bytes %d", u.PeakMemory, u.MemoryLimit, limit, num(t, mem, "memory.max_usage_in_bytes"))
	}
	if slices.Contains(readPids(t, filepath.Join(mem, "cgroup.procs")), os.Getpid()) {
		t.Error("the test process is in the group")
	}
}

func TestAForkBombStopsAtThePidsLimit(t *testing.T) {
	for _, bomb := range [][]string{
		{"sh", "-c", "while :; do sleep 1000 & done"}, // ends at its first refused fork
		// Every process forks again at once, and on while Kill kills; the
		// v1 freezer may give up on them ("unable to freeze").
		{"perl", "-e", "fork while 1"},
	} {
		t.Run(bomb[0], func(t *testing.T) {
			g, err := v1Tree(t).New("bomb", Limits{Pids: 20})
			if err != nil {
				t.Fatal(err)
			}
			p := start(t, g, exec.Command(bomb[0], bomb[1:]...))
			pids := v1Dir(g, "pids")
			waitFor(t, "a refused fork", func() bool {
				if n := num(t, pids, "pids.current"); n > 20 {
					t.Fatalf("pids.current %d, limit 20", n)
				}
				return kv(t, pids, "pids.events", "max") > 0
			})
			u, err := g.Usage()
			if err != nil || u.PidsLimited < 1 {
				t.Errorf("Usage: PidsLimited %d, %v; want at least 1", u.PidsLimited, err)
			}
			killAll(t, g)
			if err := p.wait(); err == nil {
				t.Error("the bomb's first process ended well")
			}
			// pids.current is not 0 yet: a zombie is out of cgroup.procs, but
			// counts until its new parent (here PID 1, not the test) reaps it.
			if err := g.Delete(); err != nil {
				t.Error(err)
			}
		})
	}
}

// killAll kills g's processes and waits until they are gone.
func killAll(t *testing.T, g *Group) {
	t.Helper()
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an empty group", func() bool {
		ps, err := g.Procs()
		if err != nil {
			t.Fatal(err)
		}
		return len(ps) == 0
	})
}

func TestADaemonIsInTheGroupUntilKilled(t *testing.T) {
	for _, tt := range []struct {
		name string
		tree func(testing.TB) *Tree
	}{{"v1", v1Tree}, {"v2", v2Tree}} {
		t.Run(tt.name, func(t *testing.T) {
			g, err := tt.tree(t).New("daemon", Limits{})
			if err != nil {
				t.Fatal(err)
			}
			// setsid's sh forks a sleep and ends: the sleep is in a session
			// of its own, a child of whatever adopts orphans.
			if err := start(t, g, exec.Command("setsid", "sh", "-c", "sleep 1000 &")).wait(); err != nil {
				t.Fatal(err)
			}
			ps, err := g.Procs()
			if err != nil || len(ps) != 1 {
				t.Fatalf("Procs %v, %v; want the daemon", ps, err)
			}
			if sid, _ := unix.Getsid(ps[0]); sid == must(unix.Getsid(0)) {
				t.Errorf("the daemon %d is in the test's session", ps[0])
			}
			killAll(t, g)
			if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", ps[0])); err == nil && !bytes.Contains(st, []byte(") Z ")) {
				t.Errorf("the daemon lives on: %s", st)
			}
			if g.tree.Version() == 2 && kv(t, g.member, "cgroup.events", "populated") != 0 {
				t.Errorf("cgroup.events: %s", readFile(t, g.member, "cgroup.events"))
			}
			if err := g.Delete(); err != nil {
				t.Error(err)
			}
			if err := g.Kill(); err != nil {
				t.Errorf("Kill of a deleted group: %v", err)
			}
			if err := g.Delete(); err != nil {
				t.Errorf("Delete of a deleted group: %v", err)
			}
		})
	}
}

// A process that moved itself into a group below its attempt's (which a
// command of dama's own user may make) is still the group's: listed,
// killed, and keeping the group from being deleted.
func TestAProcessInAGroupBelowIsTheGroups(t *testing.T) {
	for _, tt := range []struct {
		name string
		tree func(testing.TB) *Tree
	}{{"v1", v1Tree}, {"v2", v2Tree}} {
		t.Run(tt.name, func(t *testing.T) {
			g, err := tt.tree(t).New("nest", Limits{})
			if err != nil {
				t.Fatal(err)
			}
			p := start(t, g, exec.Command("sleep", "1000"))
			// Into <g>/below, in the hierarchy that lists g's processes.
			below := filepath.Join(g.member, "below")
			if err := os.Mkdir(below, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(below, "cgroup.procs"), []byte(strconv.Itoa(p.cmd.Process.Pid)), 0); err != nil {
				t.Fatal(err)
			}
			if ps, err := g.Procs(); err != nil || !slices.Equal(ps, []int{p.cmd.Process.Pid}) {
				t.Fatalf("Procs %v, %v; want the process below", ps, err)
			}
			if err := g.Delete(); err == nil {
				t.Errorf("Delete of a group with a process below: no error")
			}
			killAll(t, g)
			if err := p.wait(); err == nil {
				t.Errorf("the process below lives on")
			}
			if err := g.Delete(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestUsageIsTheKernelsCount(t *testing.T) {
	t.Run("v1", func(t *testing.T) {
		g, err := v1Tree(t).New("usage", Limits{})
		if err != nil {
			t.Fatal(err)
		}
		var rusage time.Duration
		for _, args := range [][]string{{"burn", "500"}, {"alloc", "64"}, {"io", t.TempDir()}} {
			p := start(t, g, self(t, args...))
			if err := p.wait(); err != nil {
				t.Fatal(args, err)
			}
			rusage += p.cmd.ProcessState.SystemTime() + p.cmd.ProcessState.UserTime()
		}
		u, err := g.Usage()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v; rusage %v", u, rusage)
		acct := time.Duration(num(t, v1Dir(g, "cpuacct"), "cpuacct.usage"))
		if u.CPU < 500*time.Millisecond || !within2(float64(u.CPU), float64(acct)) || !within2(float64(u.CPU), float64(rusage)) {
			t.Errorf("CPU %v; cpuacct.usage %v, rusage %v", u.CPU, acct, rusage)
		}
		peak := num(t, v1Dir(g, "memory"), "memory.max_usage_in_bytes")
		if u.PeakMemory < 64<<20 || !within2(float64(u.PeakMemory), float64(peak)) || u.MemoryLimit != 0 {
			t.Errorf("PeakMemory %d, MemoryLimit %d; memory.max_usage_in_bytes %d", u.PeakMemory, u.MemoryLimit, peak)
		}
		io := map[string]int64{}
		for line := range strings.SplitSeq(readFile(t, v1Dir(g, "blkio"), "blkio.throttle.io_service_bytes_recursive"), "\n") {
			if f := strings.Fields(line); len(f) == 3 {
				n, _ := strconv.ParseInt(f[2], 10, 64)
				io[f[1]] += n
			}
		}
		if u.ReadBytes < 8<<20 || u.WriteBytes < 8<<20 || !within2(float64(u.ReadBytes), float64(io["Read"])) || !within2(float64(u.WriteBytes), float64(io["Write"])) {
			t.Errorf("ReadBytes %d, WriteBytes %d; blkio %v", u.ReadBytes, u.WriteBytes, io)
		}
	})
	t.Run("v2", func(t *testing.T) {
		g, err := v2Tree(t).New("usage", Limits{})
		if err != nil {
			t.Fatal(err)
		}
		p := start(t, g, self(t, "burn", "500"))
		if err := p.wait(); err != nil {
			t.Fatal(err)
		}
		rusage := p.cmd.ProcessState.SystemTime() + p.cmd.ProcessState.UserTime()
		u, err := g.Usage()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%+v; rusage %v", u, rusage)
		stat := time.Duration(kv(t, g.member, "cpu.stat", "usage_usec")) * time.Microsecond
		if u.CPU < 500*time.Millisecond || !within2(float64(u.CPU), float64(stat)) || !within2(float64(u.CPU), float64(rusage)) {
			t.Errorf("CPU %v; cpu.stat usage_usec %v, rusage %v", u.CPU, stat, rusage)
		}
		if _, err := os.Stat(filepath.Join(g.member, "memory.peak")); errors.Is(err, fs.ErrNotExist) && u.PeakMemory != 0 {
			t.Errorf("PeakMemory %d without a memory controller", u.PeakMemory)
		}
	})
}

func TestAnotherUserWithAParentOfItsOwn(t *testing.T) {
	tree := v1Tree(t) // the parent is root's, for the refusal
	u := tempUser(t)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	exe := exeFor(t)
	run := func(args ...string) (string, string, error) {
		cmd := self(t, args...)
		cmd.Path, cmd.Dir = exe, "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}

	stdout, stderr, err := run("open", "/sys/fs/cgroup", tree.Parent())
	want := fmt.Sprintf("cgroup parent %s is not writable by uid %d (freezer: permission denied); as root run: mkdir -p /sys/fs/cgroup/{freezer,memory,cpu,cpuacct,pids,blkio}%[1]s && chown %[2]d /sys/fs/cgroup/{freezer,memory,cpu,cpuacct,pids,blkio}%[1]s{,/tasks,/cgroup.procs}", tree.Parent(), uid)
	if stdout != want || stderr != "" || err != nil {
		t.Errorf("Open of root's parent as uid %d: %q (stderr %q, %v)\nwant %q", uid, stdout, stderr, err, want)
	}

	// As root would, with the command Open gave: the group and what
	// moves processes, not its own limits.
	own := tree.Parent() + "-own"
	for _, c := range v1Controllers {
		dir := filepath.Join("/sys/fs/cgroup", c, own)
		t.Cleanup(func() { removeCgroup(t, dir) })
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"", "tasks", "cgroup.procs"} {
			if err := os.Chown(filepath.Join(dir, f), uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	stdout, stderr, err = run("supervise", "/sys/fs/cgroup", own)
	if err != nil || stderr != "" {
		t.Fatalf("the supervisor as uid %d: %v\nstderr: %s", uid, err, stderr)
	}
	if !strings.Contains(stdout, "memory:"+own+"/supervisor\n") {
		t.Errorf("the supervisor's threads after Join:\n%s", stdout)
	}
}

func must[T any](v T, _ error) T { return v }

// tempUser makes a system user of t's own, with no capability, removed
// with its group when t ends.
func tempUser(t *testing.T) *user.User {
	t.Helper()
	name := fmt.Sprintf("dama-cg%d", os.Getpid())
	out, err := exec.Command("useradd", "--system", "--user-group", "--no-create-home",
		"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
	if err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// exeFor is a copy of the test binary that any user may run: the go
// command's build directory is root's alone.
func exeFor(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dama-cgroup-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "cgroup.test"), b, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "cgroup.test")
}

func TestStartLeavesTheCallerWhereItWas(t *testing.T) {
	tree := v1Tree(t)
	g, err := tree.New("caller", Limits{Pids: 10})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "1000")
	var before, after []byte
	started := make(chan error)
	go func() {
		// Never unlocked: if Start left the thread in g, it ends with the
		// goroutine instead of keeping g from being removed.
		runtime.LockOSThread()
		before, _ = os.ReadFile("/proc/thread-self/cgroup")
		err := g.Start(cmd)
		after, _ = os.ReadFile("/proc/thread-self/cgroup")
		started <- err
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if !bytes.Equal(before, after) {
		t.Errorf("the starting thread's cgroups were\n%s\nand are\n%s", before, after)
	}
	threads, _ := os.ReadDir("/proc/self/task")
	for _, dir := range g.dirs {
		if slices.Contains(readPids(t, filepath.Join(dir, "cgroup.procs")), os.Getpid()) {
			t.Errorf("the test process is in %s", dir)
		}
		tasks := readPids(t, filepath.Join(dir, "tasks"))
		for _, th := range threads {
			if tid, _ := strconv.Atoi(th.Name()); slices.Contains(tasks, tid) {
				t.Errorf("the test's thread %d is in %s", tid, dir)
			}
		}
	}
	if ps, err := g.Procs(); err != nil || !slices.Equal(ps, []int{cmd.Process.Pid}) {
		t.Errorf("Procs %v, %v; want the command %d", ps, err, cmd.Process.Pid)
	}
}

func TestJoinMovesEveryThread(t *testing.T) {
	for _, tt := range []struct {
		name string
		tree func(testing.TB) *Tree
		want string
	}{{"v1", v1Tree, "freezer:%s/supervisor\n"}, {"v2", v2Tree, "0::%s/supervisor\n"}} {
		t.Run(tt.name, func(t *testing.T) {
			tree := tt.tree(t)
			cmd := self(t, "supervise", tree.root, tree.Parent())
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil || stderr.Len() > 0 {
				t.Fatalf("%v; stderr: %s", err, stderr.Bytes())
			}
			threads := strings.Count(string(out), "0::")
			if want := fmt.Sprintf(tt.want, tree.Parent()); threads < 2 || strings.Count(string(out), want) != threads {
				t.Errorf("after Join each of %d threads should have %q:\n%s", threads, want, out)
			}
		})
	}
}

func TestNewRefusesBadNamesAndAGroupAgain(t *testing.T) {
	for _, tt := range []struct {
		name string
		tree func(testing.TB) *Tree
	}{{"v1", v1Tree}, {"v2", v2Tree}} {
		t.Run(tt.name, func(t *testing.T) {
			tree := tt.tree(t)
			for _, name := range []string{"", ".", "..", "a/b", "../x", "/x"} {
				if _, err := tree.New(name, Limits{}); err == nil {
					t.Errorf("New(%q) made a group", name)
				}
				if _, err := tree.Load(name); err == nil {
					t.Errorf("Load(%q) loaded a group", name)
				}
			}
			for _, l := range []Limits{{Memory: -1}, {CPU: -1}, {CPU: 0.001}, {CPU: math.NaN()}, {Pids: -1}} {
				if _, err := tree.New("bad", l); err == nil {
					t.Errorf("New with %+v made a group", l)
				}
			}
			if _, err := tree.Load("a"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("Load of no group: %v", err)
			}
			g, err := tree.New("a", Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tree.New("a", Limits{}); !errors.Is(err, fs.ErrExist) {
				t.Errorf("New of an existing group: %v", err)
			}
			if l, err := tree.Load("a"); err != nil || l.Name() != "a" {
				t.Errorf("Load: %v", err)
			}
			if err := g.Delete(); err != nil {
				t.Fatal(err)
			}
			entries, _ := os.ReadDir(filepath.Join(g.member, ".."))
			for _, e := range entries {
				if e.IsDir() {
					t.Errorf("left under the parent: %s", e.Name())
				}
			}
		})
	}
}

func TestV2RefusesALimitItsParentDoesNotEnable(t *testing.T) {
	tree := v2Tree(t)
	have := readFile(t, tree.dir(""), "cgroup.subtree_control")
	if strings.Contains(have, "memory") {
		t.Skip("this host's cgroup2 enables memory under the test's parent")
	}
	_, err := tree.New("mem", Limits{Memory: 1 << 30})
	if want := "make cgroup mem: a memory limit needs the memory controller, which " + tree.dir("") + "/cgroup.subtree_control does not enable"; err == nil || err.Error() != want {
		t.Errorf("New with a memory limit: %v\nwant %s", err, want)
	}
	if _, err := os.Stat(tree.dir("mem")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused group is left: %v", err)
	}
}

// A process is given its unit's group only from the unit's subgroup
// "supervisor" (DelegateSubgroup), of a group systemd marked delegated:
// not a root process in any other group, marked or not.
func TestDelegatedOnlyFromAMarkedUnitsSubgroup(t *testing.T) {
	tree := v2Tree(t)
	mnt := tree.root
	unit := filepath.Join(tree.parent, "dama.service")
	for _, dir := range []string{unit, unit + "/supervisor", unit + "/other"} {
		if err := os.Mkdir(filepath.Join(mnt, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	from := func(group string) string {
		t.Helper()
		fd, err := unix.Open(filepath.Join(mnt, group), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		cmd := self(t, "delegated", mnt)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("delegated from %s: %v", group, err)
		}
		return string(out)
	}
	if got := from(unit + "/supervisor"); got != " false" {
		t.Errorf("from the subgroup of an unmarked unit: %q, want none", got)
	}
	if err := unix.Setxattr(filepath.Join(mnt, unit), "trusted.delegate", []byte("1"), 0); err != nil {
		t.Skipf("cannot mark a group delegated here: %v", err)
	}
	if got, want := from(unit+"/supervisor"), unit+" true"; got != want {
		t.Errorf("from the subgroup of a marked unit: %q, want %q", got, want)
	}
	if got := from(unit + "/other"); got != " false" {
		t.Errorf("from another subgroup of a marked unit: %q, want none", got)
	}
	if got := from(tree.parent); got != " false" {
		t.Errorf("from an unmarked group: %q, want none", got)
	}
}
