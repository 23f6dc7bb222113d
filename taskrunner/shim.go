package taskrunner

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dama-etl/dama/protocol"
)

// tee writes to each of its writers whatever the others did, and never
// fails: a full log volume must not stop the output pipe's drain, on
// which the command would block.
type tee []io.Writer

func (t tee) Write(p []byte) (int, error) {
	for _, w := range t {
		_, _ = w.Write(p)
	}
	return len(p), nil
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

// A pod's task process runs its command through dama's shim, the first
// process of the user's container (protocol.ShimRequest): it asks the shim
// to find the command where the host's runner looks in PATH, hands it the
// events pipe and an output pipe to start it with, and signals it through
// it. The output comes back on the pipe, and goes to the log file (and so
// to the database's tail) and to this process's stdout, the container's
// log (kubectl logs).

// ListenShim listens on path for the shim, readable and writable by the
// user's container, whichever its user.
// It is called before the runner starts any goroutine of its own: the
// socket's mode comes from the process's umask at its creation, rather
// than a chmod of its path afterwards, which would follow a link put in
// its place.
func ListenShim(path string) (*net.UnixListener, error) {
	old := syscall.Umask(0o111)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen for the shim: %w", err)
	}
	l.SetUnlinkOnClose(true)
	return l, nil
}

// receive reads the shim's next reply; a descriptor that came with it,
// which a shim has no reason to send, is closed.
func receive(c *protocol.ShimConn, reply *protocol.ShimReply) error {
	fds, err := c.Receive(reply)
	for _, fd := range fds {
		syscall.Close(fd)
	}
	return err
}

// awaitShim takes the shim's connection: the first, and the only one, as
// the socket is removed once it is taken; the command, which can reach
// the volume, starts only later. It waits until a signal (the pod's
// deletion) says the shim will not come, and then returns false with the
// runner's exit: nothing was recorded, the launch is given back.
func (r *runner) awaitShim() (int, bool) {
	l := r.opts.ShimListener
	defer l.Close()
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
		_ = l.SetDeadline(time.Now())
		if err := <-accepted; err == nil {
			r.shim.Close()
			r.shim = nil
		}
		r.logger.Info("signalled before the command started: the launch is given back", "signal", sig.String())
		return protocol.ExitSetup, false
	case err := <-accepted:
		if err != nil {
			r.logger.Error("accept dama's shim", "error", err)
			return protocol.ExitSetup, false
		}
	}
	return 0, true
}

// findInShim finds the command's program in the user's container.
func (r *runner) findInShim(name string) (string, error) {
	if err := r.shim.Send(protocol.ShimRequest{Find: name}); err != nil {
		return "", err
	}
	var reply protocol.ShimReply
	if err := receive(r.shim, &reply); err != nil {
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
		err = receive(r.shim, &reply)
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
		_, _ = io.Copy(tee{r.logFile, os.Stdout}, outR)
	}()
	go func() {
		var reply protocol.ShimReply
		for {
			if err := receive(c.conn, &reply); err != nil {
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
