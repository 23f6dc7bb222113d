package hostproc

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAliveComparesExactStartTicks(t *testing.T) {
	self, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := Alive(os.Getpid(), self.StartTicks); !ok || err != nil {
		t.Errorf("Alive(self, own start) = %v, %v; want true", ok, err)
	}
	// A process started a hundredth of a second earlier or later is
	// another process: whole-second start times could not tell.
	for _, ticks := range []uint64{self.StartTicks - 1, self.StartTicks + 1} {
		if ok, _ := Alive(os.Getpid(), ticks); ok {
			t.Errorf("Alive(self, %d) = true; own start is %d", ticks, self.StartTicks)
		}
	}
	if ok, err := Alive(1<<22+12345, 1); ok || err != nil {
		t.Errorf("Alive(no such pid) = %v, %v; want false", ok, err)
	}
}

func TestParseStatWithParenthesesInTheName(t *testing.T) {
	st, err := parseStat(42, []byte("42 (a) b (c)) S 1 77 77 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 123456 0 0"))
	if err != nil || st.PPID != 1 || st.PGID != 77 || st.StartTicks != 123456 || st.State != 'S' {
		t.Errorf("parseStat = %+v, %v", st, err)
	}
}

func TestAttemptFindsAForkedGroupAndMarkedDescendants(t *testing.T) {
	// A group leader that forks a child, and a grandchild that leaves the
	// group with setsid but keeps the marker.
	cmd := exec.Command("/bin/sh", "-c", "sleep 30 & setsid sleep 30 & wait")
	cmd.Env = append(os.Environ(), "DAMA_TEST_MARK=hostproc-test")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	leader, err := ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	a := Attempt{PGID: cmd.Process.Pid, LeaderStartTicks: leader.StartTicks, Marker: "DAMA_TEST_MARK=hostproc-test"}
	var pids []int
	for range 200 { // the children may take a moment to exist
		if pids, err = a.Processes(); err == nil && len(pids) >= 3 {
			break
		}
	}
	if len(pids) < 3 {
		t.Fatalf("found %v (%v), want the leader, its child and the setsid grandchild", pids, err)
	}
	if err := a.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for range 500 {
		if pids, err = a.Processes(); err == nil && len(pids) == 0 {
			return
		}
	}
	t.Errorf("after SIGKILL the attempt still has %v (%v)", pids, err)
}

func TestIDDiffersInAnotherPIDNamespace(t *testing.T) {
	own, err := ID()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "readlink", "/proc/self/ns/pid").CombinedOutput()
	if err != nil {
		t.Skipf("unshare --pid (root): %v %s", err, out)
	}
	other := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(string(out)), "pid:["), "]")
	if strings.HasSuffix(own, "/"+other) {
		t.Errorf("own id %s names the other namespace %s", own, other)
	}
}

// A process's start time is read to the tick, whatever fraction of a
// second the machine booted at: /proc/stat's btime, in whole seconds,
// put every start up to a second early.
func TestStartTimeIsAccurateToTheTick(t *testing.T) {
	before := time.Now()
	cmd := exec.Command("/bin/sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	st, err := ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	got, err := StartTime(st.StartTicks)
	if err != nil {
		t.Fatal(err)
	}
	// Ticks are 10 ms, rounded down; the clocks are read a few
	// microseconds apart.
	const tick = 10 * time.Millisecond
	if got.Before(before.Add(-tick-time.Millisecond)) || got.After(after.Add(time.Millisecond)) {
		t.Errorf("start time %s; the process started between %s and %s",
			got.Format(time.RFC3339Nano), before.Format(time.RFC3339Nano), after.Format(time.RFC3339Nano))
	}
}
