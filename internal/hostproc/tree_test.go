package hostproc

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"
)

// Descendants walks a process's tree: its children and theirs, in a
// session of their own or not.
func TestDescendantsWalksTheTree(t *testing.T) {
	// sh starts a sleeper in a session of its own, prints the pids, and
	// waits; the test reads the pids from its output.
	cmd := exec.Command("/bin/sh", "-c", `setsid sleep 100 & echo $$ $!; exec sleep 100`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var shPID, leaderPID int
	if _, err := fmt.Fscan(out, &shPID, &leaderPID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Both sleep on: killed by pid.
		for _, pid := range []int{leaderPID, cmd.Process.Pid} {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = cmd.Wait()
	})
	var got []int
	deadline := time.Now().Add(10 * time.Second)
	for {
		tree, err := Descendants(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, st := range tree {
			got = append(got, st.PID)
		}
		// sh has exec'd sleep by now once its pid runs sleep.
		if slices.Contains(got, shPID) && slices.Contains(got, leaderPID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("descendants of the test %v, want %d (sh, then sleep) and %d (its setsid child) among them", got, shPID, leaderPID)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The setsid child is below sh, not below the test.
	kids, err := Children(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(kids, leaderPID) || !slices.Contains(kids, shPID) {
		t.Errorf("children of the test %v: want %d and not its child %d", kids, shPID, leaderPID)
	}
}
