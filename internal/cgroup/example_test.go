package cgroup_test

import (
	"fmt"
	"os/exec"
	"runtime"
	"time"

	"github.com/dama-etl/dama/internal/cgroup"
)

// An attempt in a group of its own: a command that leaves a daemon behind,
// the daemon killed with the group, and what it all cost. It needs root, or
// a parent given to this user, so its output is not checked.
func Example() {
	tree, err := cgroup.Open("", "/dama")
	if err != nil {
		fmt.Println(err) // one line saying what root has to grant
		return
	}
	g, err := tree.New("run-42", cgroup.Limits{Memory: 1 << 30, CPU: 1.5, Pids: 100})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Delete()

	cmd := exec.Command("sh", "-c", "setsid sleep 600 & echo started")
	exited := make(chan error, 1)
	go func() {
		// Locked for good: on v1 this thread passes through g to fork.
		runtime.LockOSThread()
		if err := g.Start(cmd); err != nil {
			exited <- err
			return
		}
		exited <- cmd.Wait()
	}()
	if err := <-exited; err != nil {
		fmt.Println(err)
		return
	}

	// The shell has ended, its daemon has not: it is still in g.
	if err := g.Kill(); err != nil {
		fmt.Println(err)
		return
	}
	for ps, err := g.Procs(); len(ps) > 0 && err == nil; ps, err = g.Procs() {
		time.Sleep(10 * time.Millisecond)
	}
	u, err := g.Usage()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("CPU %v, peak memory %d bytes, OOM kills %d\n", u.CPU, u.PeakMemory, u.OOMKills)
}
