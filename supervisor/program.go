package supervisor

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

// selfExe names, in the child a supervisor forks to launch a task
// process, the binary the supervisor started from.
const selfExe = "/proc/self/exe"

// program is the file a supervisor's task processes are executed from: the
// one there when New ran, even after the file at its path was replaced (see
// Options.Executable).
type program struct {
	// path names it in process listings (argv[0]).
	path string
	// spawn is what the forked child executes: selfExe, the opened file
	// by its descriptor (/proc/self/fd/N), or, without /proc, path.
	spawn string
	// file is the opened program (Options.Executable), nil for this
	// process's own; opened is its identity when it was opened.
	file   *os.File
	opened unix.Stat_t
}

// selfProgram is the binary this process started from, which the kernel
// keeps from being written while it runs: the forked child's
// /proc/self/exe is that file, even once the one at its path is replaced.
func selfProgram() (*program, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find dama executable: %w", err)
	}
	p := &program{path: exe, spawn: exe}
	if _, err := os.Stat(selfExe); err == nil {
		p.spawn = selfExe
	}
	return p, nil
}

// openProgram opens the program at path (Options.Executable). The child
// executes it by its descriptor, which is at least minProgramFD, above
// those the child is given (os/exec moves them to 0, 1, 2, 3... before it
// executes the path, and would put one in its place); close-on-exec, it is
// open in the child when the kernel resolves the path, and not after. A
// script (#!) is executed by its path: its interpreter would be handed a
// descriptor closed by then.
func openProgram(path string) (p *program, err error) {
	if !strings.Contains(path, "/") {
		// A bare name is looked for in PATH, as exec does, never in the
		// working directory.
		if path, err = exec.LookPath(path); err != nil {
			return nil, fmt.Errorf("find the task processes' program: %w", err)
		}
	}
	// Not blocked by a FIFO put in its place: it is refused below.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open the task processes' program: %w", err)
	}
	defer f.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, minProgramFD)
	if err != nil {
		return nil, fmt.Errorf("open the task processes' program %s: %w", path, err)
	}
	file := os.NewFile(uintptr(fd), path)
	defer func() {
		if err != nil {
			file.Close()
		}
	}()
	p = &program{path: path, file: file}
	if err := unix.Fstat(fd, &p.opened); err != nil {
		return nil, fmt.Errorf("open the task processes' program %s: %w", path, err)
	}
	if p.opened.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("the task processes' program %s is not a file", path)
	}
	magic := make([]byte, 2)
	if _, err := p.file.ReadAt(magic, 0); err == nil && string(magic) == "#!" {
		p.spawn = path
		return p, nil
	}
	p.spawn = fmt.Sprintf("/proc/self/fd/%d", fd)
	if _, err := os.Stat(p.spawn); err != nil {
		return nil, fmt.Errorf("the task processes' program %s would be executed by its path, as it is at each launch (no /proc: %w); leave Options.Executable empty", path, err)
	}
	return p, nil
}

// minProgramFD is above the descriptors a task process is given (its
// standard three and protocol's ReadyFD and SecretsFD).
const minProgramFD = 64

// errProgramChanged is returned at a launch when the program opened was
// written since: the kernel does not keep an opened file from being
// written as it does a running one, and a file copied over in place (not
// renamed over) would launch another release, or half of one.
var errProgramChanged = errors.New("was written in place since the supervisor started (replace it by renaming a new file over it, as `install` and `mv` do); restart the supervisor to launch the new one")

// check returns errProgramChanged when the opened program is no longer
// what it was when opened.
func (p *program) check() error {
	if p.file == nil {
		return nil
	}
	var now unix.Stat_t
	if err := unix.Fstat(int(p.file.Fd()), &now); err != nil {
		return fmt.Errorf("the task processes' program %s: %w", p.path, err)
	}
	// Its content's time and size, not its status change's: a chmod or
	// chown is no new program.
	if now.Size != p.opened.Size || now.Mtim != p.opened.Mtim {
		return fmt.Errorf("the task processes' program %s %w", p.path, errProgramChanged)
	}
	return nil
}
