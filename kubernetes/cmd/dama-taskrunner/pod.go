package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/kubernetes/shim"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/taskrunner"
)

// podStarter starts a pod's command through dama's shim, the first
// process of the user's container (shim.Request): it asks the shim to
// find the command where the host's runner looks in PATH, hands it the
// events pipe and an output pipe to start it with, and signals it through
// it. The output comes back on the pipe, and goes to the log file (and so
// to the database's tail) and to this process's stdout, the container's
// log (kubectl logs).
type podStarter struct {
	// socket is where the shim connects; conn, its connection, which
	// lasts as long as this process: its end tells the shim the task
	// process is gone.
	socket  string
	conn    *shim.Conn
	logger  *slog.Logger
	signals <-chan os.Signal
	// lockDeadline ends RetryLock's tries, lockWait is the wait before
	// the next.
	lockDeadline time.Time
	lockWait     time.Duration
}

// lockPatience is how long a pod's task process tries its lock again
// while another holds it: a supervisor's step holds it for as long as it
// reads the pod from Kubernetes, and a pod that gave up at once would cost
// the launch a new pod. A host's supervisor launches its task process
// again in milliseconds instead.
const lockPatience = 30 * time.Second

// outputWait bounds the wait for the end of the command's output once
// the shim told its exit: the outcome is not to wait on the pipe.
const outputWait = 10 * time.Second

// Attach takes the shim's connection, before the lock: a pod whose user's
// container does not start (its image cannot be pulled) holds no lock, so
// that the supervisor sees it waiting, and deletes it after the kind's
// start_timeout.
func (p *podStarter) Attach(opts taskrunner.Options, logger *slog.Logger, signals <-chan os.Signal) bool {
	p.logger, p.signals = logger, signals
	var err error
	switch {
	case !filepath.IsAbs(p.socket):
		err = fmt.Errorf("%s %q: want an absolute path", shim.SocketFlag, p.socket)
	case opts.LockMode == config.LockModeHost:
		err = fmt.Errorf("%s: a pod's task process holds its own lock, in lock mode row or advisory", shim.SocketFlag)
	}
	if err != nil {
		logger.Error("taskrunner", "error", err, "exit_code", protocol.ExitSetup)
		return false
	}
	if !surelyTheServer(opts.DatabaseURL) {
		logger.Warn("the database URL names its server without verifying it (sslmode=verify-full, kubernetes.tls_secret): the command, in the same pod, could redirect this process's connections (see docs/kubernetes.md)")
	}
	l, err := listen(p.socket)
	if err != nil {
		logger.Error("taskrunner", "error", err, "exit_code", protocol.ExitSetup)
		return false
	}
	return p.await(l)
}

// listen listens on path for the shim, readable and writable by the
// user's container, whichever its user. The runner calls Attach before
// it starts any goroutine of its own: the socket's mode comes from the
// process's umask at its creation, rather than a chmod of its path
// afterwards, which would follow a link put in its place.
func listen(path string) (*net.UnixListener, error) {
	old := syscall.Umask(0o111)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen for the shim: %w", err)
	}
	l.SetUnlinkOnClose(true)
	return l, nil
}

// await takes the shim's connection on l: the first, and the only one, as
// the socket is removed once it is taken; the command, which can reach
// the volume, starts only later. It waits until a signal (the pod's
// deletion) says the shim will not come, and then returns false: nothing
// was recorded, the launch is given back.
func (p *podStarter) await(l *net.UnixListener) bool {
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err == nil {
			p.conn = shim.NewConn(c)
		}
		accepted <- err
	}()
	select {
	case sig := <-p.signals:
		_ = l.SetDeadline(time.Now())
		if err := <-accepted; err == nil {
			p.conn.Close()
			p.conn = nil
		}
		p.logger.Info("signalled before the command started: the launch is given back", "signal", sig.String())
		return false
	case err := <-accepted:
		if err != nil {
			p.logger.Error("accept dama's shim", "error", err)
			return false
		}
	}
	return true
}

// RetryLock tries the lock again for up to lockPatience. A signal (the
// pod's deletion) stops the tries: the launch is given back.
func (p *podStarter) RetryLock() bool {
	switch {
	case p.lockDeadline.IsZero():
		p.lockDeadline, p.lockWait = time.Now().Add(lockPatience), 200*time.Millisecond
		p.logger.Info("another process holds the lock of this context; trying again", "for", lockPatience)
	case time.Now().After(p.lockDeadline):
		return false
	default:
		p.lockWait = min(2*p.lockWait, 2*time.Second)
	}
	select {
	case sig := <-p.signals:
		p.logger.Info("signalled before the command started: the launch is given back", "signal", sig.String())
		return false
	case <-time.After(p.lockWait):
		return true
	}
}

// Find finds the command's program in the user's container.
func (p *podStarter) Find(name string, kind config.Kind) (string, error) {
	if kind.Function != "" {
		return "", fmt.Errorf("kind %s calls a function, which a pod's container does not have", name)
	}
	if err := p.conn.Send(shim.Request{Find: kind.Command[0]}); err != nil {
		return "", err
	}
	var reply shim.Reply
	if err := receive(p.conn, &reply); err != nil {
		return "", fmt.Errorf("the shim did not answer: %w", err)
	}
	if reply.Error != "" {
		return "", errors.New(reply.Error)
	}
	return reply.Found, nil
}

// errShimGone: the shim's socket closed without its command's exit, which
// only the end of its container (the kernel's OOM killer, a kill, the
// pod's deletion) does.
var errShimGone = errors.New("the task's container ended before its command's exit was told")

// Start starts the command through the shim.
func (p *podStarter) Start(cmd taskrunner.Command) (*taskrunner.Started, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create the output pipe: %w", err)
	}
	// A pod's command has its own container's environment, set over by
	// dama's variables alone.
	env := slices.DeleteFunc(cmd.Env, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return !config.Withheld(name)
	})
	start := &shim.Start{Argv: cmd.Argv, Env: env, KillGrace: cmd.KillGrace}
	err = p.conn.Send(shim.Request{Start: start}, int(cmd.EventsW.Fd()), int(outW.Fd()), int(cmd.EventsR.Fd()), int(outR.Fd()))
	outW.Close()
	var reply shim.Reply
	if err == nil {
		err = receive(p.conn, &reply)
	}
	if err == nil && reply.Error != "" {
		err = errors.New(reply.Error)
	}
	if err != nil {
		outR.Close()
		return nil, err
	}
	exited := make(chan error, 1)
	output := make(chan struct{})
	go func() {
		defer close(output)
		defer outR.Close()
		_, _ = io.Copy(tee{cmd.Output, os.Stdout}, outR)
	}()
	go func() {
		var reply shim.Reply
		for {
			if err := receive(p.conn, &reply); err != nil {
				exited <- errShimGone
				return
			}
			if e := reply.Exited; e != nil {
				exited <- exitError(e)
				return
			}
		}
	}()
	var mu sync.Mutex
	return &taskrunner.Started{
		Pid:    reply.Started,
		Exited: exited,
		Signal: func(sig syscall.Signal) {
			mu.Lock()
			defer mu.Unlock()
			_ = p.conn.Send(shim.Request{Signal: sig})
		},
		Done: func() {
			// The shim told the exit once every process of its container
			// was gone: the output pipe has no writer left.
			select {
			case <-output:
			case <-time.After(outputWait):
				p.logger.Warn("the command's output did not end with its container's processes")
			}
		},
	}, nil
}

// exitError is how the command ended, as the shim told: nil for a
// success.
func exitError(e *shim.Exit) error {
	ws := syscall.WaitStatus(e.Status)
	if ws.Exited() && ws.ExitStatus() == 0 {
		return nil
	}
	err := &taskrunner.ExitError{Status: ws}
	if e.OOMKills > 0 {
		err.Detail = fmt.Sprintf(" (out of memory: the kernel killed %d of its container's processes)", e.OOMKills)
	}
	return err
}

// SignalReason: only the kubelet signals a pod's task process, in its own
// PID namespace: the pod is being stopped.
func (p *podStarter) SignalReason(sig os.Signal) string {
	return "its pod is stopping (deleted, evicted, or its node drained): the task process received " + sig.String()
}

// receive reads the shim's next reply; a descriptor that came with it,
// which a shim has no reason to send, is closed.
func receive(c *shim.Conn, reply *shim.Reply) error {
	fds, err := c.Receive(reply)
	for _, fd := range fds {
		syscall.Close(fd)
	}
	return err
}

// tee writes to each of its writers whatever the others did, and never
// fails: a full log volume must not stop the output pipe's drain, on
// which the command would block.
type tee []io.Writer

func (t tee) Write(b []byte) (int, error) {
	for _, w := range t {
		_, _ = w.Write(b)
	}
	return len(b), nil
}

// surelyTheServer reports whether the connections of url surely reach
// its server, whatever the pod's /etc/hosts and resolv.conf say: each
// host tried is named by address (or a Unix socket), or verified by TLS
// (sslmode=verify-ca or verify-full). The command, in the same pod, shares
// its network, and as root can rewrite those files: a server known by
// name and not verified may be the command's.
func surelyTheServer(url string) bool {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		// Connecting says why.
		return true
	}
	tries := append([]*pgconn.FallbackConfig{{Host: cfg.Host, TLSConfig: cfg.TLSConfig}}, cfg.Fallbacks...)
	for _, try := range tries {
		if net.ParseIP(try.Host) != nil || strings.HasPrefix(try.Host, "/") {
			continue
		}
		if tc := try.TLSConfig; tc == nil || (tc.InsecureSkipVerify && tc.VerifyPeerCertificate == nil) {
			return false
		}
	}
	return true
}
