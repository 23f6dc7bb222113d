package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/logdir"
	"github.com/dama-etl/dama/protocol"
)

// lateReadyWait bounds how long a supervisor listens for the report of a
// runner that did not report within the launch timeout: the runner holds
// its lock by then, or has failed to for good.
const lateReadyWait = 10 * time.Minute

// child is a runner this supervisor spawned and reaps.
type child struct {
	pid      int
	exited   chan struct{}
	exitCode int
}

// Launch spawns `dama taskrunner` for l, detached (docs/architecture.md:
// "Detached launch"), and waits, at most LaunchTimeout, for the runner to
// report that it holds the lock, or to exit. A runner that reports later
// (LaunchPending) is counted started then, within lateReadyWait.
func (h hostLauncher) Launch(ctx context.Context, l Launch) (LaunchOutcome, error) {
	s, c := h.s, l.Task
	logger := l.Logger
	logs, err := logdir.Open(s.cfg.LogDir, s.cfg.LogGroup)
	if err != nil {
		return 0, err
	}
	logFile, err := logs.Append(c.ID)
	logs.Close()
	if err != nil {
		return 0, err
	}
	defer logFile.Close()

	kind, _ := s.cfg.Kind(c.Kind)
	launch := protocol.Launch{ContextID: c.ID, RunID: l.Run.ID, LockMode: kind.LockMode}
	if s.groups != nil {
		launch.CgroupParent = s.groups.Parent()
	}
	ch, readyR, err := s.spawn(launch, l.Secrets, logFile)
	if err != nil {
		return 0, err
	}
	logger.Info("spawned task process", "pid", ch.pid, "kind", c.Kind)
	_ = readyR.SetReadDeadline(time.Now().Add(s.opts.LaunchTimeout))
	var b [1]byte
	n, err := readyR.Read(b[:])
	if errors.Is(err, os.ErrDeadlineExceeded) {
		logger.Warn("task process has not taken its lock yet", "pid", ch.pid, "waited", s.opts.LaunchTimeout)
		since := time.Now()
		go func() {
			defer readyR.Close()
			_ = readyR.SetReadDeadline(time.Now().Add(lateReadyWait))
			if n, _ := readyR.Read(b[:]); n == 1 {
				logger.Info("task process took its lock after the launch timeout", "pid", ch.pid, "later_by", time.Since(since))
				s.startedLate(c.ID, new(time.Now()))
			}
		}()
		return LaunchPending, nil
	}
	readyR.Close()
	if n == 1 {
		return LaunchReady, nil
	}
	// The pipe closed without a byte: the runner is exiting.
	select {
	case <-ch.exited:
	case <-time.After(s.opts.LaunchTimeout):
		return LaunchPending, nil
	case <-ctx.Done():
		return LaunchPending, nil
	}
	switch ch.exitCode {
	case protocol.ExitLocked:
		return LaunchLocked, nil
	case protocol.ExitRefused:
		return LaunchRefused, nil
	case protocol.ExitUnfit:
		// It recorded why (reportLaunchFailure logs it once).
		return LaunchExited, nil
	}
	logger.Warn("task process exited before taking its lock", "pid", ch.pid, "exit_code", ch.exitCode, "log", logFile.Name())
	return LaunchExited, nil
}

// runnerEnv is the supervisor's environment less what dama withholds from
// commands (config.Withheld), which a process of the same user could read
// in a task process's first milliseconds (secrets has them instead), plus
// the configuration's path and the process it is to be.
func runnerEnv(configPath string) []string {
	env := make([]string, 0, len(os.Environ())+2)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		// NOTIFY_SOCKET is the supervisor's service manager's: a task
		// that told it anything would speak for the supervisor.
		if config.Withheld(name) || name == "NOTIFY_SOCKET" {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		protocol.ConfigEnv+"="+configPath,
		protocol.ProcessEnv+"="+protocol.ProcessRunner)
}

// secrets returns what a task process of run key is handed on its secrets
// socket: the database URL it connects with, the supervisor's PG*
// variables, and the keeper's secret.
func (s *Supervisor) secrets(key string) protocol.Secrets {
	env := []string{protocol.DatabaseURLEnv + "=" + s.opts.DatabaseURL}
	for _, kv := range os.Environ() {
		// The supervisor's own URL is not theirs: they have theirs.
		if name, _, _ := strings.Cut(kv, "="); protocol.DatabaseVar(name) && name != protocol.DatabaseURLEnv {
			env = append(env, kv)
		}
	}
	return protocol.Secrets{Env: env, RunKey: key, Keeper: s.keeperSecret}
}

// spawn starts `dama taskrunner` for launch l, with its secrets on its
// secrets socket, and returns it with the read end of its ready pipe.
func (s *Supervisor) spawn(l protocol.Launch, secrets protocol.Secrets, logFile *os.File) (*child, *os.File, error) {
	if err := s.program.check(); err != nil {
		return nil, nil, err
	}
	secretsR, err := protocol.SecretsSocket(secrets)
	if err != nil {
		return nil, nil, err
	}
	defer secretsR.Close() // the runner has its own
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("create readiness pipe: %w", err)
	}
	defer readyW.Close()
	l.ReadyFD, l.SecretsFD = protocol.ReadyFD, protocol.SecretsFD
	cmd := exec.Command(s.program.spawn, l.Args()...)
	// Named by its path in a process listing, whichever file it runs from.
	cmd.Args[0] = s.opts.Executable
	cmd.Env = runnerEnv(s.cfg.Path)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// protocol.ReadyFD and SecretsFD: ExtraFiles start at descriptor 3.
	cmd.ExtraFiles = []*os.File{readyW, secretsR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		readyR.Close()
		return nil, nil, fmt.Errorf("start taskrunner: %w", err)
	}
	ch := &child{pid: cmd.Process.Pid, exited: make(chan struct{})}
	s.mu.Lock()
	s.children[l.ContextID] = ch
	s.mu.Unlock()
	go func() {
		// Reaped, so that it does not linger as a zombie.
		var exitErr *exec.ExitError
		if err := cmd.Wait(); errors.As(err, &exitErr) {
			ch.exitCode = exitErr.ExitCode()
		} else if err != nil {
			ch.exitCode = -1
		}
		close(ch.exited)
		s.reaped(l.ContextID, ch)
	}()
	return ch, readyR, nil
}

// reaped follows the exit of context id's runner ch: it pokes the Work
// holding the context's job, so the outcome is settled at once.
func (s *Supervisor) reaped(id int64, ch *child) {
	s.mu.Lock()
	if s.children[id] == ch {
		delete(s.children, id)
	}
	s.mu.Unlock()
	s.logger.Info("task process exited", "etl_context_id", id, "pid", ch.pid, "exit_code", ch.exitCode)
	if ch.exitCode == protocol.ExitRefused {
		// Also when the refusal came after the launch stopped waiting.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s.retire(ctx)
		cancel()
	}
	if ch.exitCode != protocol.ExitLocked {
		s.poke(id)
	}
}
