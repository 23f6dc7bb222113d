package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/cgroup"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/testenv"
)

// cgroupControllers are the cgroup v1 hierarchies dama's groups use.
var cgroupControllers = []string{"memory", "cpu", "cpuacct", "pids", "freezer", "blkio"}

// cgroupParent makes a control group for dama under each controller of
// this host's cgroup v1, owned by owner (nil: root), as an administrator
// would for cgroup_parent, and returns its path. It must be called before
// testenv.New: its cleanup, which empties and removes every group below
// it, then runs after the test's processes are killed.
func cgroupParent(t *testing.T, owner *user.User) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making control groups needs root")
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		t.Skip("this host has cgroup v2 only; the tests make cgroup v1 groups (internal/cgroup's tests cover v2)")
	}
	parent := fmt.Sprintf("/dama-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() {
		for _, c := range cgroupControllers {
			removeCgroupTree(t, filepath.Join("/sys/fs/cgroup", c, parent))
		}
	})
	for _, c := range cgroupControllers {
		dir := filepath.Join("/sys/fs/cgroup", c, parent)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Skipf("cannot make a %s control group: %v", c, err)
		}
		if owner == nil {
			continue
		}
		uid, gid := int(testenv.Atoi(t, owner.Uid)), int(testenv.Atoi(t, owner.Gid))
		for _, f := range []string{"", "cgroup.procs", "tasks", "cgroup.clone_children"} {
			if err := os.Chown(filepath.Join(dir, f), uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	return parent
}

// removeCgroupTree kills what is left in dir's groups, deepest first, and
// removes them.
func removeCgroupTree(t *testing.T, dir string) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	for _, e := range entries {
		if e.IsDir() {
			removeCgroupTree(t, filepath.Join(dir, e.Name()))
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, f := range strings.Fields(string(procs)) {
			pid, _ := strconv.Atoi(f)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("cleanup: remove control group %s: %v (processes %q)", dir, err, procs)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func orZero[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// attemptCost reads the cost the database keeps of attempt n of task id.
func attemptCost(t *testing.T, env *testenv.Env, id int64, n int) etlcontext.Attempt {
	t.Helper()
	attempts, err := etlcontext.RecentAttempts(context.Background(), env.Pool, id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range attempts {
		if a.Attempt == n {
			return a
		}
	}
	t.Fatalf("task %d has no attempt %d", id, n)
	return etlcontext.Attempt{}
}

// An attempt that goes past its kind's memory is killed by the kernel in
// its own group, and says so; its supervisor, and a task beside it, live
// on.
func TestAnAttemptPastItsMemoryIsKilledAloneAndSaysSo(t *testing.T) {
	t.Parallel()
	parent := cgroupParent(t, nil)
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
cgroup_parent: ` + parent + `
user: root
kinds:
  greedy:
    command: ["/bin/dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"]
    max_attempts: 1
    resources: { memory: 64MiB }
  forking:
    command: ["/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 30 & done; wait"]
    max_attempts: 1
    resources: { pids: 4 }
` + waiterKind(goFile, 1))
	w := &world{Env: env, cfg: cfg}
	sup := w.Start(cfg, "supervisor")
	beside := w.submitOf("waiter")
	w.waitRunning(beside)
	id := w.submitOf("greedy")
	got := w.waitSettled(id, time.Minute)
	a := attemptCost(t, env, id, 1)
	if got.Status != etlcontext.StatusFailed || deref(a.Reason) != "out of memory: limit 64MiB, peak 64MiB" {
		t.Errorf("the greedy task: %s, reason %q; want FAILED, out of memory: limit 64MiB, peak 64MiB", got.Status, deref(a.Reason))
	}
	// The kernel may let the peak pass the limit by a page.
	if peak := orZero(a.PeakMemory); a.OOMKilled == nil || !*a.OOMKilled || deref(a.MemoryLimit) != int64(64<<20) || peak < 63<<20 || peak > 65<<20 {
		t.Errorf("its attempt's record: oom_killed %v, limit %v, peak %v; want true, 64MiB, 64MiB", deref(a.OOMKilled), deref(a.MemoryLimit), deref(a.PeakMemory))
	}
	if !testenv.Alive(sup.Cmd.Process.Pid) {
		t.Errorf("the supervisor died")
	}
	if st := w.task(beside); st.Status != etlcontext.StatusRunning || !st.InitialEventLocked {
		t.Errorf("the task beside it: %s, locked %v; want RUNNING, locked", st.Status, st.InitialEventLocked)
	}
	res := w.Dama(cfg, "status", strconv.FormatInt(id, 10))
	if line := lineWith(res.Stdout, "FAILED", "64MiB of 64MiB", "out of memory"); line == "" {
		t.Errorf("dama status %d shows no attempt out of memory:\n%s", id, res.Stdout)
	}
	// A failure that forks refused by the pids limit explain says so.
	forking := w.submitOf("forking")
	if got := w.waitSettled(forking, time.Minute); got.Status != etlcontext.StatusFailed ||
		!strings.Contains(orZero(attemptCost(t, env, forking, 1).Reason), "forks refused at resources.pids 4") {
		t.Errorf("the forking task: %s, reason %q; want FAILED, with the forks refused", got.Status, orZero(attemptCost(t, env, forking, 1).Reason))
	}
	_ = os.WriteFile(goFile, nil, 0o644)
	if got := w.waitSettled(beside, time.Minute); got.Status != etlcontext.StatusDone {
		t.Errorf("the task beside it: %s, want DONE", got.Status)
	}
}

// What an attempt cost is what the kernel counted for its group: its CPU
// time, its peak memory, and the bytes it read and wrote to disk,
// read by the test from the group's own files just before the command
// ends.
func TestAnAttemptsCostIsItsGroupsCounters(t *testing.T) {
	t.Parallel()
	parent := cgroupParent(t, nil)
	env := testenv.New(t)
	work := filepath.Join(env.Dir, "work")
	if err := os.Mkdir(work, 0o777); err != nil {
		t.Fatal(err)
	}
	goFile := filepath.Join(env.Dir, "go")
	// Busy for a while, 16 MiB written past the page cache, then waits.
	script := `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done
dd if=/dev/zero of=` + work + `/out bs=1M count=16 oflag=direct status=none
touch ` + work + `/spent
while [ ! -e ` + goFile + ` ]; do sleep 0.05; done`
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
cgroup_parent: ` + parent + `
user: root
kinds:
  spender:
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `]
    max_attempts: 1
    resources: { memory: 256MiB, cpu: 1.5, pids: 100 }
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("spender")
	testenv.Eventually(t, time.Minute, "the command to spend", func() (bool, error) {
		_, err := os.Stat(filepath.Join(work, "spent"))
		return err == nil, nil
	})
	runID := orZero(w.task(id).RunID)
	read := func(controller, file string) string {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", controller, parent, runID, file))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	cpuNS := testenv.Atoi(t, strings.TrimSpace(read("cpuacct", "cpuacct.usage")))
	peak := testenv.Atoi(t, strings.TrimSpace(read("memory", "memory.max_usage_in_bytes")))
	var written int64
	for line := range strings.SplitSeq(read("blkio", "blkio.throttle.io_service_bytes"), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[1] == "Write" {
			written += testenv.Atoi(t, f[2])
		}
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone {
		t.Fatalf("the task: %s, want DONE", got.Status)
	}
	a := attemptCost(t, env, id, 1)
	within := func(what string, got, want float64) {
		if want <= 0 || got < want*0.98 || got > want*1.02+0.01 {
			t.Errorf("%s: the attempt's record says %g, its group's counters %g: want within 2%%", what, got, want)
		}
	}
	within("CPU seconds", orZero(a.CPUSeconds), float64(cpuNS)/1e9)
	within("peak memory", float64(orZero(a.PeakMemory)), float64(peak))
	within("bytes written", float64(orZero(a.WriteBytes)), float64(written))
	if written < 16<<20 {
		t.Errorf("the group counted %d bytes written, want at least 16MiB: the test proves nothing", written)
	}
	if orZero(a.MemoryLimit) != 256<<20 || orZero(a.OOMKilled) {
		t.Errorf("limit %v, oom_killed %v; want 256MiB, false", deref(a.MemoryLimit), deref(a.OOMKilled))
	}
	// The metrics' figures of the day, per kind.
	costs, err := etlcontext.KindCosts(context.Background(), env.Pool)
	if err != nil || len(costs) != 1 || costs[0].Kind != "spender" || costs[0].Attempts != 1 ||
		costs[0].CPUSeconds != orZero(a.CPUSeconds) || costs[0].WriteBytes != float64(orZero(a.WriteBytes)) {
		t.Errorf("KindCosts: %+v, %v; want the one attempt's", costs, err)
	}
}

// A daemon that a kind's command leaves behind, in a session of its own
// and without DAMA_RUN_ID, under a supervisor that runs as a user of its
// own without CAP_SYS_PTRACE, is found by its attempt's group when the
// task process is SIGKILLed, and stopped before the next attempt starts:
// nothing reads another user's processes in /proc. Without the group, the
// daemon lives on (the supervisor cannot tell it is the attempt's).
func TestADaemonOfAKilledTaskProcessIsFoundByItsGroup(t *testing.T) {
	t.Parallel()
	ensureUser(t, commandUser)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody to run the supervisor as: %v", err)
	}
	parent := cgroupParent(t, nobody)
	env := testenv.New(t)
	for _, dir := range []string{filepath.Dir(env.DamaBin), filepath.Dir(env.Dir), env.Dir} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	logs := filepath.Join(env.Dir, "logs")
	if err := os.Mkdir(logs, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(logs, int(testenv.Atoi(t, nobody.Uid)), int(testenv.Atoi(t, nobody.Gid))); err != nil {
		t.Fatal(err)
	}
	pids := filepath.Join(env.Dir, "pids")
	if err := os.Mkdir(pids, 0o755); err != nil || os.Chmod(pids, 0o777) != nil {
		t.Fatal(err)
	}
	// Attempt 1 leaves a daemon, then waits; attempt 2 records whether the
	// daemon of attempt 1 is alive, by a signal 0 (the same user's).
	script := `if [ "$DAMA_ATTEMPT" = 1 ]; then
  setsid env -u DAMA_RUN_ID /bin/sh -c 'echo $$ > "$0/daemon"; exec sleep 1000' "$0" &
  while :; do sleep 1; done
fi
state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$(cat "$0/daemon")/status" 2>/dev/null)
if [ -n "$state" ] && [ "$state" != Z ]; then echo alive > "$0/seen"; else echo gone > "$0/seen"; fi`
	cfg := env.WriteConfig(`
user: nobody
log_dir: {{dir}}/logs
poll_interval: 300ms
cgroup_parent: ` + parent + `
kinds:
  daemonizing:
    user: ` + commandUser + `
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `, "` + pids + `"]
    max_attempts: 2
    retry: { delay: 1s }
`)
	caps := "+setuid,+setgid,+kill"
	w := &world{Env: env, cfg: cfg}
	env.StartWith(cfg, nil, []string{"setpriv", "--reuid=" + nobody.Uid, "--regid=" + nobody.Gid, "--clear-groups",
		"--inh-caps=" + caps, "--ambient-caps=" + caps}, "supervisor")
	id := w.submitOf("daemonizing")
	var daemon int
	testenv.Eventually(t, time.Minute, "the daemon to start", func() (bool, error) {
		b, _ := os.ReadFile(filepath.Join(pids, "daemon"))
		daemon, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return daemon > 0, nil
	})
	st, err := hostproc.ReadStat(daemon)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if now, err := hostproc.ReadStat(daemon); err == nil && now.StartTicks == st.StartTicks {
			_ = syscall.Kill(daemon, syscall.SIGKILL)
		}
	})
	running := w.waitRunning(id)
	if err := syscall.Kill(*running.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, 2*time.Minute); got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Fatalf("the task: %s at attempt %d, want DONE at attempt 2", got.Status, got.Attempt)
	}
	if seen, _ := os.ReadFile(filepath.Join(pids, "seen")); strings.TrimSpace(string(seen)) != "gone" {
		t.Errorf("attempt 2 found the daemon of attempt 1 %q, want gone", seen)
	}
	// What attempt 1 cost, its supervisor read from its group.
	if a := attemptCost(t, env, id, 1); a.CPUSeconds == nil || a.PeakMemory == nil || orZero(a.OOMKilled) {
		t.Errorf("attempt 1, whose task process was killed: cpu %v, peak %v, oom_killed %v; want its group's", deref(a.CPUSeconds), deref(a.PeakMemory), deref(a.OOMKilled))
	}
}

// A supervisor with a kind that has resources, and no control group to
// make its attempts' in, refuses to start, in one line that says what to
// grant.
func TestResourcesWithoutAControlGroupAreRefusedAtStart(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
kinds:
  bounded:
    command: ["/bin/true"]
    resources: { memory: 1GiB }
`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.DamaBin, "supervisor")
	cmd.Env = env.Environ(cfg)
	out, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err == nil || len(lines) != 1 || !strings.Contains(lines[0], "kind bounded has resources, but no control group is given to dama: set cgroup_parent") {
		t.Errorf("dama supervisor: %v, %q; want it refused in one line", err, out)
	}
}

// A group left under cgroup_parent by an attempt whose run is no longer
// running (its task process died while no supervisor of this host looked,
// and it was retried or settled elsewhere) is emptied and removed by the
// next supervisor's start; a running task's group is left alone.
func TestALeftoverGroupIsStoppedAtStart(t *testing.T) {
	t.Parallel()
	parent := cgroupParent(t, nil)
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
cgroup_parent: ` + parent + `
user: root
kinds:` + waiterKind(goFile, 1))
	w := &world{Env: env, cfg: cfg}
	first := w.Start(cfg, "supervisor")
	running := w.waitRunning(w.submitOf("waiter"))
	if err := syscall.Kill(-first.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	tree, err := cgroup.Lookup("", parent)
	if err != nil {
		t.Fatal(err)
	}
	left, err := tree.New("0b7d3f6e-4a8f-4c1e-9d2b-5f6a7b8c9d0e", cgroup.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("/bin/sleep", "1000")
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		started <- left.Start(sleeper)
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sleeper.Wait() }()
	t.Cleanup(func() { _ = sleeper.Process.Kill() })

	w.Start(cfg, "supervisor")
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("the leftover group's process lives on a minute after a supervisor started")
	}
	testenv.Eventually(t, 30*time.Second, "the leftover group to be removed", func() (bool, error) {
		_, err := tree.Load(left.Name())
		return errors.Is(err, fs.ErrNotExist), nil
	})
	if _, err := tree.Load(*running.RunID); err != nil {
		t.Errorf("the running task's group: %v", err)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(running.ID, time.Minute); got.Status != etlcontext.StatusDone {
		t.Errorf("the running task: %s, want DONE", got.Status)
	}
}
