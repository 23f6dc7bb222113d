package hostproc

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/internal/testenv"
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
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("%d (sh, then sleep) and %d (its setsid child) among the test's descendants", shPID, leaderPID), func() (bool, error) {
		tree, err := Descendants(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		for _, st := range tree {
			got = append(got, st.PID)
		}
		// sh has exec'd sleep by now once its pid runs sleep.
		return slices.Contains(got, shPID) && slices.Contains(got, leaderPID), fmt.Errorf("descendants %v", got)
	})
	// The setsid child is below sh, not below the test.
	kids, err := Children(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(kids, leaderPID) || !slices.Contains(kids, shPID) {
		t.Errorf("children of the test %v: want %d and not its child %d", kids, shPID, leaderPID)
	}
}
