package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
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

// BenchmarkUsage measures accounting at 1,000 running attempts: 1,000
// groups with limits, each holding a sleeping process, and one group's
// Usage read per op (what a task process reads once, at its end). It
// reports what the groups cost the kernel (kernel-KiB/group: slabs,
// per-CPU data and kernel stacks from /proc/meminfo, before and after),
// beside what the sleepers alone cost it (plain: no group, no read).
func BenchmarkUsage(b *testing.B) {
	b.Run("plain", func(b *testing.B) { benchUsage(b, nil) })
	b.Run("v1", func(b *testing.B) { benchUsage(b, v1Tree(b)) })
}

func benchUsage(b *testing.B, tree *Tree) {
	const n = 1000
	before := kernelKiB(b)
	var groups []*Group
	var sleepers []*exec.Cmd
	b.Cleanup(func() {
		for _, c := range sleepers {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		for _, g := range groups {
			_ = g.Delete()
		}
	})
	for i := range n {
		cmd := exec.Command("/bin/sleep", "1000")
		start := cmd.Start
		if tree != nil {
			g, err := tree.New(fmt.Sprintf("u%d", i), Limits{Memory: 1 << 30, CPU: 1, Pids: 100})
			if err != nil {
				b.Fatal(err)
			}
			groups = append(groups, g)
			start = func() error { return g.Start(cmd) }
		}
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			errc <- start()
		}()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		sleepers = append(sleepers, cmd)
	}
	perGroup := float64(kernelKiB(b)-before) / n
	i := 0
	for b.Loop() {
		if tree == nil {
			continue
		}
		if _, err := groups[i%n].Usage(); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(perGroup, "kernel-KiB/group")
}

// kernelKiB is the kernel's own memory: its slabs and its stacks.
func kernelKiB(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "Slab:" || f[0] == "KernelStack:" || f[0] == "Percpu:") {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			total += v
		}
	}
	return total
}
