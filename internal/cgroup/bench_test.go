package cgroup

import (
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"time"
)

// BenchmarkStart measures what a group adds to an attempt: /bin/true
// started from a locked thread and waited for, plain, and in a fresh group
// of its own, made with limits, emptied, read and removed, as a task
// process does (v1-open with Lookup too: a task process looks its tree up
// once).
// It reports the medians of the launch (launch-p50-ns: the group made and
// the command started) and of the end (end-p50-ns: from the command's exit
// to its group read and removed).
func BenchmarkStart(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchStart(b, nil, false) })
	b.Run("v1", func(b *testing.B) { benchStart(b, v1Tree(b), false) })
	b.Run("v1-open", func(b *testing.B) { benchStart(b, v1Tree(b), true) })
	b.Run("v2", func(b *testing.B) { benchStart(b, v2Tree(b), false) })
}

func benchStart(b *testing.B, tree *Tree, open bool) {
	var launches, ends []time.Duration
	for i := 0; b.Loop(); i++ {
		launch, end, err := runIn(tree, open, fmt.Sprintf("b%d", i))
		if err != nil {
			b.Fatal(err)
		}
		launches, ends = append(launches, launch), append(ends, end)
	}
	for unit, d := range map[string][]time.Duration{"launch-p50-ns": launches, "end-p50-ns": ends} {
		slices.Sort(d)
		b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), unit)
	}
}

// runIn runs /bin/true in a group name of tree's (none for a nil tree) as
// a task process does, from a thread locked for it, and returns how long
// its launch and its end took.
func runIn(tree *Tree, open bool, name string) (launch, end time.Duration, _ error) {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command("/bin/true")
		start := time.Now()
		if tree == nil {
			err := cmd.Start()
			launch = time.Since(start)
			if err == nil {
				err = cmd.Wait()
			}
			done <- err
			return
		}
		if open {
			var err error
			if tree, err = Lookup(tree.root, tree.parent); err != nil {
				done <- err
				return
			}
		}
		g, err := tree.New(name, Limits{Memory: 1 << 30, CPU: 1, Pids: 100})
		if tree.Version() == 2 {
			// The v2 mount here has no memory, cpu or pids controller.
			g, err = tree.New(name, Limits{})
		}
		if err == nil {
			err = g.Start(cmd)
		}
		launch = time.Since(start)
		if err == nil {
			err = cmd.Wait()
		}
		exited := time.Now()
		defer func() { end = time.Since(exited) }()
		for err == nil {
			var pids []int
			if err = g.Kill(); err == nil {
				pids, err = g.Procs()
			}
			if len(pids) == 0 {
				break
			}
		}
		if err == nil {
			_, err = g.Usage()
		}
		if err == nil {
			err = g.Delete()
		}
		done <- err
	}()
	err := <-done
	return launch, end, err
}
