package main

import (
	"os"
	"path/filepath"
	"runtime/debug"
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

// The check of dama-taskrunner's build tells each difference.
func TestSameBuildTellsTheDifference(t *testing.T) {
	t.Parallel()
	mod := func(path, version string) *debug.Module {
		return &debug.Module{Path: path, Version: version, Sum: "h1:" + version}
	}
	ours := func() *debug.BuildInfo {
		return &debug.BuildInfo{
			GoVersion: "go1.26.8", Path: "github.com/dama-etl/dama/cmd/dama",
			Main:     debug.Module{Path: "github.com/dama-etl/dama", Version: "v0.3.0"},
			Deps:     []*debug.Module{mod("github.com/jackc/pgx/v5", "v5.7.0"), mod("github.com/spf13/cobra", "v1.9.0")},
			Settings: []debug.BuildSetting{{Key: "CGO_ENABLED", Value: "0"}, {Key: "vcs.revision", Value: "abc"}},
		}
	}
	theirs := func() *debug.BuildInfo {
		b := ours()
		b.Path = taskProgramPath
		b.Deps = b.Deps[:1]
		return b
	}
	if err := sameBuild(ours(), theirs()); err != nil {
		t.Fatalf("the same build: %v", err)
	}
	// Builds that name neither a version nor a commit cannot be told apart.
	anonymous := func(b *debug.BuildInfo) *debug.BuildInfo {
		b.Main.Version = "(devel)"
		b.Settings = b.Settings[:1]
		return b
	}
	if err := sameBuild(anonymous(ours()), anonymous(theirs())); err == nil {
		t.Error("two builds without a version or commit taken for the same")
	}
	withCommit := func(b *debug.BuildInfo) *debug.BuildInfo {
		b = anonymous(b)
		b.Settings = append(b.Settings, debug.BuildSetting{Key: "-ldflags", Value: "-X github.com/dama-etl/dama/version.commit=abc"})
		return b
	}
	if err := sameBuild(withCommit(ours()), withCommit(theirs())); err != nil {
		t.Errorf("two builds of one commit set by the linker: %v", err)
	}
	for name, change := range map[string]func(*debug.BuildInfo){
		"another command": func(b *debug.BuildInfo) { b.Path = "github.com/dama-etl/dama/cmd/sample-etl" },
		"another Go":      func(b *debug.BuildInfo) { b.GoVersion = "go1.26.7" },
		"another version": func(b *debug.BuildInfo) { b.Main.Version = "v0.2.0" },
		"another commit":  func(b *debug.BuildInfo) { b.Settings[1].Value = "def" },
		"a setting more": func(b *debug.BuildInfo) {
			b.Settings = append(b.Settings, debug.BuildSetting{Key: "-race", Value: "true"})
		},
		"a setting less":     func(b *debug.BuildInfo) { b.Settings = b.Settings[:1] },
		"another dependency": func(b *debug.BuildInfo) { b.Deps[0] = mod("github.com/jackc/pgx/v5", "v5.7.1") },
		"a dependency more":  func(b *debug.BuildInfo) { b.Deps = append(b.Deps, mod("example.com/x", "v1.0.0")) },
		"a replaced one": func(b *debug.BuildInfo) {
			b.Deps[0].Replace = mod("../pgx", "(devel)")
		},
	} {
		b := theirs()
		change(b)
		if err := sameBuild(ours(), b); err == nil {
			t.Errorf("%s: taken for the same build", name)
		}
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
