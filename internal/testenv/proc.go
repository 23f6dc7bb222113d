package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shirou/gopsutil/v3/process"
	"golang.org/x/sys/unix"
)

// Result is what a finished dama command printed and returned.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Dama runs the dama binary to completion with args and the given
// configuration, bounded by a minute.
func (e *Env) Dama(configPath string, args ...string) Result {
	e.T.Helper()
	return e.DamaWith(configPath, nil, args...)
}

// DamaWith is Dama with extraEnv entries (NAME=value) added to the test's
// environment.
func (e *Env) DamaWith(configPath string, extraEnv []string, args ...string) Result {
	e.T.Helper()
	return e.dama("", configPath, extraEnv, args)
}

// DamaIn is Dama run in the directory dir, with no configuration named:
// as a user types it where `dama init` wrote ./dama.yaml.
func (e *Env) DamaIn(dir string, args ...string) Result {
	e.T.Helper()
	return e.dama(dir, "", nil, args)
}

func (e *Env) dama(dir, configPath string, extraEnv, args []string) Result {
	e.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.DamaBin, args...)
	cmd.Dir = dir
	cmd.Env = append(e.Environ(configPath), extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if exitErr, ok := err.(*exec.ExitError); ok {
		code = exitErr.ExitCode()
	} else if err != nil {
		e.T.Fatalf("run dama %v: %v", args, err)
	}
	return Result{Stdout: stdout.String(), Stderr: stderr.String(), Code: code}
}

// Proc is a long-running process a test started.
type Proc struct {
	Cmd   *exec.Cmd
	Log   string
	done  chan struct{}
	err   error
	ready chan struct{}
}

// Ready is closed once the process told its service manager it is ready
// (sd_notify READY=1 on NOTIFY_SOCKET, which start sets): a supervisor
// does once it works.
func (p *Proc) Ready() <-chan struct{} { return p.ready }

// WaitReady waits, at most timeout, for the process to be Ready, and fails
// t if it exits or the time passes first.
func (p *Proc) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.ready:
	case <-p.done:
		t.Fatalf("%s exited before it was ready: %v", filepath.Base(p.Cmd.Path), p.err)
	case <-time.After(timeout):
		t.Fatalf("%s not ready after %s", filepath.Base(p.Cmd.Path), timeout)
	}
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits for the process to exit and returns its exit error.
func (p *Proc) Wait() error {
	<-p.done
	return p.err
}

// Start starts the dama binary with args in a process group of its own; the
// group is killed when the test ends.
func (e *Env) Start(configPath string, args ...string) *Proc {
	e.T.Helper()
	return e.StartWrapped(configPath, nil, args...)
}

// StartWrapped is Start with the dama binary run by wrapper, whose argv is
// followed by the binary's path and args.
func (e *Env) StartWrapped(configPath string, wrapper []string, args ...string) *Proc {
	e.T.Helper()
	return e.StartWith(configPath, nil, wrapper, args...)
}

// StartWith is StartWrapped with extraEnv entries (NAME=value) overriding
// the test's environment, e.g. another DATABASE_URL for the same database.
func (e *Env) StartWith(configPath string, extraEnv, wrapper []string, args ...string) *Proc {
	e.T.Helper()
	return e.start(e.DamaBin, configPath, extraEnv, wrapper, args)
}

// StartProgram is Start for another program than dama, e.g.
// SampleEmbedded.
func (e *Env) StartProgram(bin, configPath string, args ...string) *Proc {
	e.T.Helper()
	return e.start(bin, configPath, nil, nil, args)
}

// StartProgramWith is StartProgram with extraEnv entries (NAME=value)
// added to the test's environment.
func (e *Env) StartProgramWith(bin, configPath string, extraEnv []string, args ...string) *Proc {
	e.T.Helper()
	return e.start(bin, configPath, extraEnv, nil, args)
}

func (e *Env) start(bin, configPath string, extraEnv, wrapper []string, args []string) *Proc {
	e.T.Helper()
	logPath := filepath.Join(e.Dir, fmt.Sprintf("%s-%s.log", args[0], randomHex(3)))
	logFile, err := os.Create(logPath)
	if err != nil {
		e.T.Fatal(err)
	}
	defer logFile.Close()
	argv := append(append(append([]string{}, wrapper...), bin), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	notifySocket, ready, from := e.listenNotify()
	cmd.Env = append(append(e.Environ(configPath), "NOTIFY_SOCKET="+notifySocket), extraEnv...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		e.T.Fatalf("start %s %v: %v", filepath.Base(bin), args, err)
	}
	from <- cmd.Process.Pid
	p := &Proc{Cmd: cmd, Log: logPath, done: make(chan struct{}), ready: ready}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	e.T.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		if e.T.Failed() {
			out, _ := os.ReadFile(logPath)
			e.T.Logf("log of %s %v:\n%s", filepath.Base(bin), args, out)
		}
	})
	return p
}

// listenNotify opens a socket a process tells its readiness on, as to
// systemd (sd_notify(3)), and returns its path, a channel closed once
// READY=1 arrives, and one to send the process's pid on once it started:
// only what that process sends counts, by the kernel's word
// (SO_PASSCRED), as with systemd's NotifyAccess=main. Another user finds
// the socket's path in /proc/net/unix, and may write to it. The socket is
// closed when the test ends.
func (e *Env) listenNotify() (string, chan struct{}, chan<- int) {
	e.T.Helper()
	// Short: a socket's path is at most 107 bytes, and a test's temporary
	// directory is named after the test.
	dir, err := os.MkdirTemp("", "dama-notify-")
	if err != nil {
		e.T.Fatal(err)
	}
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		e.T.Fatalf("listen for readiness: %v", err)
	}
	if err := passCredentials(conn); err != nil {
		e.T.Fatalf("listen for readiness: %v", err)
	}
	// A process a test runs as another user (setpriv) tells it too: it
	// may write to the socket and pass through the directory, not list it
	// or put a socket of its own in its place.
	for p, mode := range map[string]os.FileMode{dir: 0o711, path: 0o777} {
		if err := os.Chmod(p, mode); err != nil {
			e.T.Fatal(err)
		}
	}
	ready := make(chan struct{})
	from := make(chan int, 1)
	go func() {
		pid, ok := <-from
		if !ok {
			return
		}
		buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(unix.SizeofUcred))
		told := false
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			if sender(oob[:oobn]) != pid {
				continue
			}
			for _, line := range strings.Split(string(buf[:n]), "\n") {
				if line == "READY=1" && !told {
					told = true
					close(ready)
				}
			}
		}
	}()
	e.T.Cleanup(func() {
		close(from)
		conn.Close()
		os.RemoveAll(dir)
	})
	return path, ready, from
}

// passCredentials has the kernel attach its sender's credentials to every
// message conn receives.
func passCredentials(conn *net.UnixConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set SO_PASSCRED: %w", serr)
	}
	return nil
}

// sender is the pid the kernel says sent a message with control data oob;
// 0 if it does not say.
func sender(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if cred, err := unix.ParseUnixCredentials(&m); err == nil {
			return int(cred.Pid)
		}
	}
	return 0
}

// Kill sends sig to the process (not its group).
func (p *Proc) Kill(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to pid %d: %v", sig, p.Cmd.Process.Pid, err)
	}
}

// Alive reports whether pid names a live (not zombie) process.
func Alive(pid int) bool {
	p, err := process.NewProcess(int32(pid))
	if err != nil {
		return false
	}
	st, err := p.Status()
	if err != nil {
		return false
	}
	for _, s := range st {
		if s == process.Zombie {
			return false
		}
	}
	return true
}
