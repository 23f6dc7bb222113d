// Package shim is dama's shim: the first process of the user's container
// in a task's pod, which starts the kind's command when the task process
// in dama's container tells it to, and stops it when that task process is
// gone; and the messages the two exchange on their socket (Request,
// Reply, Conn). The shim holds no secret and no connection to the
// database: whatever it is asked to do, the command could do itself.
package shim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Exit codes of the shim that are not its command's.
const (
	// ExitSetup: the shim could not run (bad arguments, not the
	// container's first process, no task process came).
	ExitSetup = 120
	// ExitNoCommand: the task process went away before the command
	// started.
	ExitNoCommand = 121
)

// Options configure the shim.
type Options struct {
	// Socket is the task process's socket.
	Socket string
	// Wait bounds how long the shim waits for the socket to take its
	// connection.
	Wait time.Duration
	// Logger receives the shim's own lines.
	Logger *slog.Logger
}

// Run runs the shim and returns its exit code: the command's (128 plus
// the signal's number when a signal killed it), or ExitSetup or
// ExitNoCommand.
func Run(ctx context.Context, opts Options) int {
	// The command runs as this process's user: it must not trace it,
	// take its socket or make it report another exit.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	if os.Getpid() != 1 {
		// Only the first process of a PID namespace takes every process
		// of the container with it, which is what lets the task process
		// record an outcome only once all of the command's are gone.
		opts.Logger.Error("dama-shim must be its container's first process (pid 1); is the pod's shareProcessNamespace set?")
		return ExitSetup
	}
	// The shim's signals are its container's stopping, which the task
	// process, stopped too, turns into the command's; handled rather than
	// ignored, which the command would inherit.
	stopping := make(chan os.Signal, 1)
	signal.Notify(stopping, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	// The command may signal its container's first process: those that
	// Go's runtime would die of (with a stack dump) are taken and never
	// read, so that the shim lives to report the command's exit.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGQUIT, syscall.SIGABRT, syscall.SIGTRAP, syscall.SIGSYS,
		syscall.SIGILL, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV, syscall.SIGSTKFLT)
	conn, err := dial(ctx, opts.Socket, opts.Wait)
	if err != nil {
		opts.Logger.Error("dama-shim", "error", err)
		return ExitNoCommand
	}
	s := &shim{conn: NewConn(conn), logger: opts.Logger, pid: -1}
	defer s.conn.Close()
	return s.serve(stopping, children)
}

// dial connects to the task process's socket, waiting for it to listen.
// A socket that refuses for a second belongs to a task process that
// exited (listening follows its creation at once).
func dial(ctx context.Context, path string, wait time.Duration) (*net.UnixConn, error) {
	deadline := time.Now().Add(wait)
	var refusedSince time.Time
	for {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		switch {
		case err == nil:
			return c, nil
		case errors.Is(err, syscall.ECONNREFUSED) && refusedSince.IsZero():
			refusedSince = time.Now()
		case errors.Is(err, syscall.ECONNREFUSED) && time.Since(refusedSince) > time.Second:
			return nil, fmt.Errorf("the task process at %s is gone: %w", path, err)
		case errors.Is(err, fs.ErrNotExist):
			refusedSince = time.Time{}
		case !errors.Is(err, syscall.ECONNREFUSED):
			return nil, fmt.Errorf("connect to the task process at %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no task process listened at %s within %s", path, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

type shim struct {
	conn   *Conn
	logger *slog.Logger
	// pid is the command's, -1 before it starts; status is its wait
	// status once it exited.
	pid    int
	exited bool
	// gone: the task process closed its end.
	gone bool
	// eventsR and outputR are the read ends of the command's pipes, which
	// the shim drains once the task process is gone.
	eventsR, outputR *os.File
	status           syscall.WaitStatus
	oomBefore        int
}

type received struct {
	req Request
	fds []int
	err error
}

func (s *shim) serve(stopping, children <-chan os.Signal) int {
	requests := make(chan received)
	go func() {
		for {
			var r received
			r.fds, r.err = s.conn.Receive(&r.req)
			requests <- r
			if r.err != nil {
				return
			}
		}
	}()
	var (
		killGrace time.Duration
		killTimer <-chan time.Time
	)
	for {
		select {
		case sig := <-stopping:
			s.logger.Info("the container is stopping; the task process stops the command", "signal", sig.String())
		case <-children:
			if s.reap(); s.exited {
				return s.end()
			}
		case r := <-requests:
			if r.err != nil {
				// The task process is gone: no one holds the lock.
				if s.pid < 0 {
					s.logger.Info("the task process went away before the command started", "error", r.err)
					return ExitNoCommand
				}
				s.logger.Error("the task process went away; stopping the command", "error", r.err, "kill_grace", killGrace)
				requests, s.gone = nil, true
				go func() { _, _ = io.Copy(io.Discard, s.eventsR) }()
				go func() { _, _ = io.Copy(os.Stdout, s.outputR) }()
				signalAll(syscall.SIGTERM)
				killTimer = time.After(killGrace)
				continue
			}
			if err := s.handle(r, &killGrace); err != nil {
				s.logger.Error("dama-shim", "error", err)
				return ExitSetup
			}
		case <-killTimer:
			signalAll(syscall.SIGKILL)
		}
	}
}

// handle answers one request.
func (s *shim) handle(r received, killGrace *time.Duration) error {
	defer func() {
		for _, fd := range r.fds {
			unix.Close(fd)
		}
	}()
	switch req := r.req; {
	case req.Find != "":
		path, err := find(req.Find)
		if err != nil {
			return s.conn.Send(Reply{Error: err.Error()})
		}
		return s.conn.Send(Reply{Found: path})
	case req.Start != nil && s.pid < 0:
		if len(r.fds) != 4 {
			return fmt.Errorf("a start with %d descriptors, want 4", len(r.fds))
		}
		*killGrace = req.Start.KillGrace
		// The read ends are kept, for the task process's going.
		s.eventsR, s.outputR = os.NewFile(uintptr(r.fds[2]), "events"), os.NewFile(uintptr(r.fds[3]), "output")
		r.fds = r.fds[:2]
		pid, err := s.start(req.Start, r.fds[0], r.fds[1])
		if err != nil {
			return s.conn.Send(Reply{Error: err.Error()})
		}
		s.pid = pid
		return s.conn.Send(Reply{Started: pid})
	case req.Signal == syscall.SIGTERM || req.Signal == syscall.SIGKILL:
		if s.pid > 0 && !s.exited {
			signalAll(req.Signal)
		}
		return nil
	}
	return fmt.Errorf("a request the shim does not take: %+v", r.req)
}

// find is exec.LookPath's answer in the words of the kind's check
// (config.Kind.FindCommand).
func find(name string) (string, error) {
	path, err := exec.LookPath(name)
	switch {
	case err == nil:
		return path, nil
	case errors.Is(err, exec.ErrNotFound):
		return "", fmt.Errorf("%s not found in PATH (%s) of the task's container", name, os.Getenv("PATH"))
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("%s not found in the task's container", name)
	case errors.Is(err, fs.ErrPermission):
		return "", fmt.Errorf("%s is not executable in the task's container", name)
	}
	return "", fmt.Errorf("%s: %w", name, err)
}

// start starts the command with the events pipe's write end on
// protocol.EventsFD and the output's on stdout and stderr.
func (s *shim) start(st *Start, events, output int) (int, error) {
	if len(st.Argv) == 0 {
		return 0, errors.New("no command to start")
	}
	path, err := find(st.Argv[0])
	if err != nil {
		return 0, err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer devnull.Close()
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.ContainsFunc(st.Env, func(set string) bool { return strings.HasPrefix(set, name+"=") })
	})
	s.oomBefore = oomKills()
	pid, err := syscall.ForkExec(path, st.Argv, &syscall.ProcAttr{
		Env:   append(env, st.Env...),
		Files: []uintptr{devnull.Fd(), uintptr(output), uintptr(output), uintptr(events)},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", path, err)
	}
	s.logger.Info("command started", "pid", pid, "command", st.Argv)
	return pid, nil
}

// reap reaps the container's exited processes, the command among them.
func (s *shim) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err != nil || pid <= 0 {
			return
		}
		if pid == s.pid {
			s.exited, s.status = true, ws
		}
	}
}

// signalAll sends sig to every process of the container but the shim:
// from the first process of a PID namespace, -1 names them all, whatever
// group or session they moved to.
func signalAll(sig syscall.Signal) { _ = syscall.Kill(-1, sig) }

// end stops every other process of the container once the command
// exited, waits for them, tells the task process how the command ended,
// and returns the shim's exit code.
func (s *shim) end() int {
	signalAll(syscall.SIGKILL)
	for {
		if _, err := syscall.Wait4(-1, nil, 0, nil); errors.Is(err, syscall.ECHILD) {
			break
		}
	}
	exit := &Exit{Status: uint32(s.status), OOMKills: max(oomKills()-s.oomBefore, 0)}
	if !s.gone {
		if err := s.conn.Send(Reply{Exited: exit}); err != nil {
			s.logger.Error("tell the task process how the command ended", "error", err)
		}
	}
	if s.status.Signaled() {
		return 128 + int(s.status.Signal())
	}
	return s.status.ExitStatus()
}

// oomKills is how many processes the kernel killed in this container's
// memory cgroup for want of memory: cgroup v2's memory.events, or v1's
// memory.oom_control (Linux 4.13+); 0 when neither tells.
func oomKills() int {
	for _, path := range []string{"/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"} {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
				n, _ := strconv.Atoi(v)
				f.Close()
				return n
			}
		}
		f.Close()
	}
	return 0
}
