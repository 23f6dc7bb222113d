package supervisor

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The program a supervisor opened is what its task processes run: one
// renamed over it changes nothing, one written in place is refused at the
// next launch, and neither a FIFO nor anything but a file is taken for
// one. A script is run by its path.
func TestTheOpenedProgramIsTheOneRun(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "dama-taskrunner")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("\x7fELF the first program")
	p, err := openProgram(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p.spawn, "/proc/self/fd/") || p.path != path {
		t.Fatalf("spawned as %q, named %q; want by its descriptor, named %s", p.spawn, p.path, path)
	}
	if got, err := os.Readlink(p.spawn); err != nil || got != path {
		t.Fatalf("%s leads to %q (%v), want %s", p.spawn, got, err, path)
	}
	if err := p.check(); err != nil {
		t.Fatalf("unchanged: %v", err)
	}

	// Renamed over, as install and mv do: the opened file is unchanged.
	if err := os.WriteFile(path+".new", []byte("\x7fELF another program"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	if err := p.check(); err != nil {
		t.Errorf("after a rename over it: %v", err)
	}
	if got, _ := os.Readlink(p.spawn); got != path+" (deleted)" {
		t.Errorf("after a rename over it, %s leads to %q, want the replaced file", p.spawn, got)
	}

	// Written in place: refused. Its time set back first, so that the
	// write changes it even on a coarse clock.
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	q, err := openProgram(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("X"), 5); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := q.check(); !errors.Is(err, errProgramChanged) {
		t.Errorf("after a write in place: %v, want errProgramChanged", err)
	}
	// A chmod is no new program.
	r, err := openProgram(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.check(); err != nil {
		t.Errorf("after a chmod: %v", err)
	}

	// A script is run by its path.
	write("#!/bin/sh\nexit 0\n")
	s, err := openProgram(path)
	if err != nil {
		t.Fatal(err)
	}
	if s.spawn != path {
		t.Errorf("a script spawned as %q, want by its path %s", s.spawn, path)
	}

	// A FIFO is refused, at once.
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openProgram(fifo); err == nil || !strings.Contains(err.Error(), "is not a file") {
		t.Errorf("a FIFO: %v, want refused as not a file", err)
	}
	if _, err := openProgram(dir); err == nil {
		t.Error("a directory taken for a program")
	}
}

// A bare name is looked for in PATH, never in the working directory.
func TestABareProgramNameIsLookedForInPath(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dama-test-program"), []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	t.Setenv("PATH", "/nonexistent")
	if p, err := openProgram("dama-test-program"); err == nil {
		t.Errorf("a bare name found in the working directory: %s", p.path)
	}
	t.Setenv("PATH", dir)
	p, err := openProgram("dama-test-program")
	if err != nil || p.path != filepath.Join(dir, "dama-test-program") {
		t.Errorf("a bare name in PATH: %v, %v", p, err)
	}
}

// Its descriptor is above those a task process is given, which os/exec
// moves to 0, 1, 2, 3... in the child before it executes the path.
func TestTheProgramsDescriptorIsAboveTheChildsOwn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "program")
	if err := os.WriteFile(path, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := openProgram(path)
	if err != nil {
		t.Fatal(err)
	}
	if fd := int(p.file.Fd()); fd < minProgramFD {
		t.Errorf("descriptor %d, want at least %d", fd, minProgramFD)
	}
	flags, err := unix.FcntlInt(p.file.Fd(), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("descriptor flags %#x (%v), want close-on-exec", flags, err)
	}
}
