package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
)

// A supervisor whose binary has dama-taskrunner beside it runs its task
// processes with that program.
func TestTaskProcessesRunTheTaskrunnerProgram(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 4)
	sup := w.Start(w.cfg, "supervisor")
	sup.WaitReady(t, 30*time.Second)
	id := w.submit(400, 25)
	task := w.waitFor(id, 60*time.Second, "to run", func(c etlcontext.Task) bool {
		return c.Status == etlcontext.StatusRunning && c.PID != nil
	})
	wantProgram(t, *task.PID, w.TaskRunnerBin)
	if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone {
		t.Errorf("%s, want DONE", got.Status)
	}
}

// Without dama-taskrunner beside it, a supervisor runs its task processes
// with its own binary; with another program under that name, it refuses
// to start, with one line.
func TestADamaTaskrunnerOfAnotherBuildIsRefused(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 4)
	dir := t.TempDir()
	dama := filepath.Join(dir, "dama")
	copyProgram(t, w.DamaBin, dama)
	alone := w.With(dama)
	sup := alone.Start(w.cfg, "supervisor")
	sup.WaitReady(t, 30*time.Second)
	id := w.submitHeld(1, 1)
	task := w.waitFor(id, 60*time.Second, "to run", func(c etlcontext.Task) bool {
		return c.Status == etlcontext.StatusRunning && c.PID != nil
	})
	wantProgram(t, *task.PID, dama)
	w.release()
	if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone {
		t.Errorf("with dama alone: %s, want DONE", got.Status)
	}
	sup.Kill(t, syscall.SIGTERM)
	waitExit(t, sup)

	copyProgram(t, w.SampleETL, filepath.Join(dir, taskProgramName))
	refused := alone.Start(w.cfg, "supervisor")
	waitExit(t, refused)
	stderr, err := os.ReadFile(refused.Log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(stderr), "\n"), "\n")
	last := lines[len(lines)-1]
	if refused.Cmd.ProcessState.ExitCode() == 0 || !strings.Contains(last, "is not of this dama's build") || !strings.HasPrefix(last, "dama: ") {
		t.Errorf("exit %d, log %q; want non-zero and a last line refusing %s", refused.Cmd.ProcessState.ExitCode(), stderr, taskProgramName)
	}
}

func wantProgram(t *testing.T, pid int, want string) {
	t.Helper()
	got, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe"))
	if err != nil {
		t.Fatalf("the program of pid %d: %v", pid, err)
	}
	if wantReal, err := filepath.EvalSymlinks(want); err == nil {
		want = wantReal
	}
	if got != want {
		t.Errorf("pid %d runs %s, want %s", pid, got, want)
	}
}

func copyProgram(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// A redeploy replaces dama-taskrunner while a supervisor runs on: the
// supervisor goes on launching its task processes from the file it
// started with, of its own build.
func TestASupervisorLaunchesTheTaskrunnerItStartedWith(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 4)
	dir := t.TempDir()
	dama, runner := filepath.Join(dir, "dama"), filepath.Join(dir, taskProgramName)
	copyProgram(t, w.DamaBin, dama)
	copyProgram(t, w.TaskRunnerBin, runner)
	sup := w.With(dama).Start(w.cfg, "supervisor")
	sup.WaitReady(t, time.Minute)
	// Another program in its place, as a redeploy puts one: renamed over.
	copyProgram(t, w.SampleETL, runner+".new")
	if err := os.Rename(runner+".new", runner); err != nil {
		t.Fatal(err)
	}
	// Running until the test has looked at their runners.
	ids := []int64{w.submitHeld(20, 25), w.submitHeld(20, 25)}
	for _, id := range ids {
		task := w.waitFor(id, 60*time.Second, "to run", func(c etlcontext.Task) bool {
			return c.PID != nil && c.Status == etlcontext.StatusRunning
		})
		exe, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(*task.PID), "exe"))
		if err != nil || exe != runner+" (deleted)" {
			t.Errorf("task %d's runner runs %q (%v), want the replaced %s", id, exe, err, runner)
		}
	}
	w.release()
	for _, id := range ids {
		if got := w.waitSettled(id, 60*time.Second); got.Status != etlcontext.StatusDone {
			t.Errorf("task %d %s, want DONE", id, got.Status)
		}
	}
}
