package taskrunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// A pod's task process runs its command through dama's shim, the first
// process of the user's container (protocol.ShimRequest): it asks the shim
// to find the command where the host's runner looks in PATH, hands it the
// events pipe and an output pipe to start it with, and signals it through
// it. The output comes back on the pipe, and goes to the log file (and so
// to the database's tail) and to this process's stdout, the container's
// log (kubectl logs).

// ListenShim listens on path for the shim, readable and writable by the
// user's container, whichever its user.
func ListenShim(path string) (*net.UnixListener, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen for the shim: %w", err)
	}
	l.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen for the shim: %w", err)
	}
	return l, nil
}

// awaitShim takes the shim's connection: the first, and the only one, as
// the socket is removed once it is taken; the command, which can reach
// the volume, starts only later. It returns false with the runner's exit
// when the shim did not come.
func (r *runner) awaitShim() (int, error, bool) {
	l := r.opts.ShimListener
	defer l.Close()
	// The user's container may wait for its image meanwhile, for as long
	// as the kind lets its pod start. A launch whose shim never comes is
	// given back (unfit), its pod deleted by the supervisor.
	wait := time.Duration(config.DefaultStartTimeout)
	if k, ok := r.opts.Config.Kind(r.ctx.Kind); ok && k.StartTimeout > 0 {
		wait = time.Duration(k.StartTimeout)
	}
	_ = l.SetDeadline(time.Now().Add(wait))
	accepted := make(chan error, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err == nil {
			r.shim = protocol.NewShimConn(c)
		}
		accepted <- err
	}()
	select {
	case sig := <-r.signals:
		// Nothing is recorded yet: the launch is given back.
		_ = l.SetDeadline(time.Now())
		if err := <-accepted; err == nil {
			r.shim.Close()
			r.shim = nil
		}
		r.logger.Info("signalled before the command started: the launch is given back", "signal", sig.String())
		return protocol.ExitSetup, nil, false
	case err := <-accepted:
		if err != nil {
			code, err := r.unfit(context.Background(), fmt.Errorf("the task's container did not start dama's shim within %s: %w", wait, err))
			return code, err, false
		}
	}
	return 0, nil, true
}

// findInShim finds the command's program in the user's container.
func (r *runner) findInShim(name string) (string, error) {
	if err := r.shim.Send(protocol.ShimRequest{Find: name}); err != nil {
		return "", err
	}
	var reply protocol.ShimReply
	if _, err := r.shim.Receive(&reply); err != nil {
		return "", fmt.Errorf("the shim did not answer: %w", err)
	}
	if reply.Error != "" {
		return "", errors.New(reply.Error)
	}
	return reply.Found, nil
}

// shimCommand is a command the shim started.
type shimCommand struct {
	conn *protocol.ShimConn
	pid  int
	// exited receives how it ended, once; output is closed once its output
	// is copied.
	exited chan error
	output chan struct{}
	mu     sync.Mutex
}

// commandExit is how a command the shim ran ended, but for a success.
type commandExit struct {
	status   syscall.WaitStatus
	oomKills int
}

func (e *commandExit) Error() string { return describeStatus(e.status, e.oomKills) }

// errShimGone: the shim's socket closed without its command's exit, which
// only the end of its container (the kernel's OOM killer, a kill, the
// pod's deletion) does.
var errShimGone = errors.New("the task's container ended before its command's exit was told")

// startInShim starts the command through the shim, with the events pipe
// eventsR, eventsW.
func (r *runner) startInShim(eventsR, eventsW *os.File) (*shimCommand, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create the output pipe: %w", err)
	}
	start := &protocol.ShimStart{Argv: r.argv, Env: r.commandEnv(r.args, r.checkpoint), KillGrace: time.Duration(*r.kind.KillGrace)}
	err = r.shim.Send(protocol.ShimRequest{Start: start}, int(eventsW.Fd()), int(outW.Fd()), int(eventsR.Fd()), int(outR.Fd()))
	outW.Close()
	var reply protocol.ShimReply
	if err == nil {
		_, err = r.shim.Receive(&reply)
	}
	if err == nil && reply.Error != "" {
		err = errors.New(reply.Error)
	}
	if err != nil {
		outR.Close()
		return nil, err
	}
	c := &shimCommand{conn: r.shim, pid: reply.Started, exited: make(chan error, 1), output: make(chan struct{})}
	go func() {
		defer close(c.output)
		defer outR.Close()
		_, _ = io.Copy(io.MultiWriter(r.logFile, os.Stdout), outR)
	}()
	go func() {
		var reply protocol.ShimReply
		for {
			if _, err := c.conn.Receive(&reply); err != nil {
				c.exited <- errShimGone
				return
			}
			if e := reply.Exited; e != nil {
				if ws := syscall.WaitStatus(e.Status); !ws.Exited() || ws.ExitStatus() != 0 {
					c.exited <- &commandExit{status: ws, oomKills: e.OOMKills}
				} else {
					c.exited <- nil
				}
				return
			}
		}
	}()
	return c, nil
}

// signal sends sig to the command's processes.
func (c *shimCommand) signal(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.conn.Send(protocol.ShimRequest{Signal: sig})
}
