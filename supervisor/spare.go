package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/etlcontext"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/taskrunner/protocol"
)

// A supervisor keeps one task process started ahead of its launch, a
// spare (see protocol.SpareFD): a launch hands it the task rather than
// starting a process, so that the program's exec and initialization, and
// its connections, are not between a task's submission and its lock. Once
// a spare is handed its task, the next is started after that launch is
// decided, so that its start does not compete with the launched one's. A
// launch that finds no spare (several at once) starts its task process as
// before.
//
// A spare holds the connections of one task process and no lock, and has
// no task: it waits for its launch on a socket only this supervisor holds
// the other end of, and exits when that end closes, unused, whether the
// supervisor stopped or died.

// spare is a task process started ahead of its launch.
type spare struct {
	cmd *exec.Cmd
	ch  *child
	// conn is this supervisor's end of the spare's socket.
	conn *os.File
	// readyR is the read end of its ready pipe.
	readyR *os.File
	// key is the key of the run it will be, made before the run: it
	// connected with it.
	key string
	// taken is set once a launch took it, and task once it was handed
	// the task of that context; guarded by Supervisor.mu.
	taken bool
	task  int64
	// done is closed once the launch that took it is decided or dropped
	// it, or once it exited untaken.
	done     chan struct{}
	doneOnce sync.Once
}

func (sp *spare) finish() { sp.doneOnce.Do(func() { close(sp.done) }) }

// close closes the supervisor's ends of its socket and ready pipe.
func (sp *spare) close() {
	sp.conn.Close()
	sp.readyR.Close()
}

// spareRestartDelay spaces the spares started after one that was not
// handed a task (it exited, or a launch dropped it), doubling up to
// maxSpareRestartDelay while none is: a program that cannot start, or
// steps that keep failing, would otherwise start one after another.
const (
	spareRestartDelay    = 5 * time.Second
	maxSpareRestartDelay = 5 * time.Minute
)

// spareHelloTimeout bounds a spare's start, until it says it is
// non-dumpable.
const spareHelloTimeout = 10 * time.Second

// spareLoop keeps a spare until ctx ends, then lets it go.
func (s *Supervisor) spareLoop(ctx context.Context) {
	defer func() {
		// A step that outlives Run (River's stop timed out) gives its
		// spare back to no loop: it is let go instead.
		s.mu.Lock()
		s.sparesOver = true
		s.mu.Unlock()
		s.releaseSpare()
	}()
	var failedBefore bool
	delay := spareRestartDelay
	for {
		sp, err := s.startSpare()
		if err == nil {
			select {
			case <-ctx.Done():
				return
			case <-sp.done:
			}
			s.mu.Lock()
			taken, handed := sp.taken, sp.task != 0
			s.mu.Unlock()
			if handed {
				failedBefore, delay = false, spareRestartDelay
				continue
			}
			if !taken {
				err = fmt.Errorf("spare task process %d exited unused with code %d", sp.ch.pid, sp.ch.exitCode)
			}
		}
		if err != nil {
			if !failedBefore {
				s.logger.Warn("no spare task process; tasks start without one until another starts", "error", err)
			}
			failedBefore = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, maxSpareRestartDelay)
	}
}

// releaseSpare lets the unused spare go: it exits once it finds its
// socket closed.
func (s *Supervisor) releaseSpare() {
	s.mu.Lock()
	sp := s.spare
	s.spare = nil
	s.mu.Unlock()
	if sp == nil {
		return
	}
	sp.close()
	select {
	case <-sp.ch.exited:
	case <-time.After(10 * time.Second):
		s.logger.Warn("a spare task process did not exit once let go", "pid", sp.ch.pid)
	}
}

// startSpare starts a spare as launch starts a task process (detached, in
// a session of its own, stdio on /dev/null until its launch brings the
// task's log file), hands it its secrets once it is non-dumpable and
// untraced, and makes it the supervisor's spare.
func (s *Supervisor) startSpare() (*spare, error) {
	if err := s.program.check(); err != nil {
		return nil, err
	}
	key, err := etlcontext.NewRunKey()
	if err != nil {
		return nil, err
	}
	// Non-blocking on this side, for the hello's deadline.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("create a spare's socket: %w", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("create a spare's socket: %w", err)
	}
	conn, theirs := os.NewFile(uintptr(fds[0]), "spare"), os.NewFile(uintptr(fds[1]), "spare")
	defer theirs.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("create a spare's readiness pipe: %w", err)
	}
	defer readyW.Close()
	l := protocol.Launch{ReadyFD: protocol.ReadyFD, SpareFD: protocol.SpareFD, LockMode: s.spareMode}
	cmd := exec.Command(s.program.spawn, l.Args()...)
	cmd.Args[0] = s.opts.Executable
	cmd.Env = runnerEnv(s.cfg.Path)
	// What a spare says before its launch brings the task's log file (why
	// it cannot start) goes to the supervisor's log.
	cmd.Stderr = os.Stderr
	// ExtraFiles start at descriptor 3: protocol.ReadyFD, then
	// protocol.SpareFD.
	cmd.ExtraFiles = []*os.File{readyW, theirs}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		conn.Close()
		readyR.Close()
		return nil, fmt.Errorf("start a spare task process: %w", err)
	}
	sp := &spare{cmd: cmd, ch: &child{pid: cmd.Process.Pid, exited: make(chan struct{})}, conn: conn, readyR: readyR, key: key, done: make(chan struct{})}
	go s.reapSpare(sp)
	// The secrets go on the socket, which no other process can open, once
	// the spare is non-dumpable, and only if nothing traced it before
	// that.
	err = protocol.AwaitHello(conn, time.Now().Add(spareHelloTimeout))
	if err == nil {
		var tracer int
		if tracer, err = hostproc.Tracer(sp.ch.pid); err == nil && tracer != 0 {
			err = fmt.Errorf("spare task process %d is traced by process %d", sp.ch.pid, tracer)
		}
	}
	if err == nil {
		err = protocol.SendSecrets(conn, s.secrets(key))
	}
	if err == nil {
		s.mu.Lock()
		select {
		case <-sp.ch.exited:
			err = fmt.Errorf("spare task process %d exited with code %d as it started", sp.ch.pid, sp.ch.exitCode)
		default:
			s.spare = sp
		}
		s.mu.Unlock()
	}
	if err != nil {
		sp.close()
		if kerr := cmd.Process.Kill(); kerr != nil && !errors.Is(kerr, os.ErrProcessDone) {
			s.logger.Warn("stop a spare task process that did not start", "pid", sp.ch.pid, "error", kerr)
		}
		return nil, err
	}
	return sp, nil
}

// reapSpare waits for a spare: unused, it tells the spare loop; handed a
// task, it is that task's runner, reaped as launch's are.
func (s *Supervisor) reapSpare(sp *spare) {
	wait(sp.cmd, sp.ch)
	s.mu.Lock()
	id, taken := sp.task, sp.taken
	if s.spare == sp {
		s.spare = nil
	}
	s.mu.Unlock()
	if id != 0 {
		s.reaped(id, sp.ch)
	}
	if !taken {
		sp.close()
		sp.finish()
	}
}

// takeSpare returns the spare, if there is one, for a launch, whose run
// takes the spare's key, and which calls its finish once it is decided
// (or drops it, when it does not come to a launch); nil when there is
// none.
func (s *Supervisor) takeSpare() *spare {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.spare
	s.spare = nil
	if sp != nil {
		sp.taken = true
	}
	return sp
}

// dropSpare lets sp, taken for a launch that did not come to it, go: the
// run may hold its key.
func (s *Supervisor) dropSpare(sp *spare) {
	if sp == nil {
		return
	}
	sp.close()
	sp.finish()
}

// returnSpare gives sp, taken for a launch whose run was not recorded
// (its key is unused), back, or lets it go when another took its place.
func (s *Supervisor) returnSpare(sp *spare) {
	if sp == nil {
		return
	}
	s.mu.Lock()
	back := s.spare == nil && !s.sparesOver
	if back {
		select {
		case <-sp.ch.exited:
			back = false
		default:
			s.spare, sp.taken = sp, false
		}
	}
	s.mu.Unlock()
	if !back {
		s.dropSpare(sp)
	}
}

// handOff hands context id's launch l, with the task's log file, to sp.
// It fails when the spare cannot take it (it died meanwhile): sp is then
// stopped, and the launch starts a task process.
func (s *Supervisor) handOff(logger *slog.Logger, sp *spare, id int64, l protocol.Launch, logFile *os.File) error {
	defer sp.conn.Close()
	// Under mu with the send: a spare that exits once handed its task is
	// reaped as the task's runner, one that exits before as a spare.
	s.mu.Lock()
	err := protocol.SendLaunch(sp.conn, l, logFile)
	if err == nil {
		sp.task = id
		s.children[id] = sp.ch
	}
	s.mu.Unlock()
	if err != nil {
		sp.readyR.Close()
		// Nothing was handed: stopped, whatever it was doing.
		if kerr := sp.cmd.Process.Kill(); kerr != nil && !errors.Is(kerr, os.ErrProcessDone) {
			logger.Warn("stop a spare task process that could not take its launch", "pid", sp.ch.pid, "error", kerr)
		}
		return err
	}
	return nil
}

// commonLockMode is the lock mode of most of cfg's kinds (row, then
// advisory, then host on a tie).
func commonLockMode(cfg *config.Config) config.LockMode {
	count := map[config.LockMode]int{}
	for _, k := range cfg.Kinds {
		count[k.LockMode]++
	}
	best := config.LockModeRow
	for _, m := range []config.LockMode{config.LockModeAdvisory, config.LockModeHost} {
		if count[m] > count[best] {
			best = m
		}
	}
	return best
}
