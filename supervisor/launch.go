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

// Launch spawns `dama taskrunner` for l, detached: in a session of its own
// (so no signal for the supervisor's process group reaches it), stdio on
// /dev/null and the task's log file, no inherited descriptor but the
// readiness pipe and its secrets socket, and no secret in its environment or
// arguments. It waits, at most LaunchTimeout, for the runner to report that
// it holds the lock, or to exit. A runner that reports later (the outcome
// is then LaunchPending) is counted started then, if that is within
// lateReadyWait.
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
	ch, readyR, err := s.spawn(launch, l.Secrets, logFile)
	if err != nil {
		return 0, err
	}
	defer func() {
		if readyR != nil {
			readyR.Close()
		}
	}()
	// pending hands the open pipe to a goroutine that hears a late report.
	pending := func(pid int) (LaunchOutcome, error) {
		r, since := readyR, time.Now()
		readyR = nil
		go func() {
			defer r.Close()
			_ = r.SetReadDeadline(time.Now().Add(lateReadyWait))
			var b [1]byte
			if n, _ := r.Read(b[:]); n == 1 {
				logger.Info("task process took its lock after the launch timeout", "pid", pid, "later_by", time.Since(since))
				s.startedLate(c.ID, new(time.Now()))
			}
		}()
		return LaunchPending, nil
	}
	logger.Info("spawned task process", "pid", ch.pid, "kind", c.Kind)

	_ = readyR.SetReadDeadline(time.Now().Add(s.opts.LaunchTimeout))
	var b [1]byte
	n, err := readyR.Read(b[:])
	switch {
	case n == 1:
		return LaunchReady, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		logger.Warn("task process has not taken its lock yet", "pid", ch.pid, "waited", s.opts.LaunchTimeout)
		return pending(ch.pid)
	}
	// The pipe closed without a byte: the runner is exiting, and will not
	// report.
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
// commands (config.Withheld: the database URL, libpq's PG* variables,
// DAMA_*), which a process of the same user could read in a task
// process's first milliseconds: the database settings go on its secrets
// socket instead (secrets). It adds the configuration's path, and the
// process it is to be, for a program embedding the supervisor.
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

// secrets returns what a task process of run key is handed on its
// secrets socket: the database URL it connects with,
// the supervisor's PG* variables, and the keeper's secret.
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

// spawn starts `dama taskrunner` for launch l, with its
// secrets (the run's key among them) on its secrets socket, and returns it
// with the read end of its ready pipe.
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
	// ExtraFiles start at descriptor 3: protocol.ReadyFD, then
	// protocol.SecretsFD.
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
		wait(cmd, ch)
		s.reaped(l.ContextID, ch)
	}()
	return ch, readyR, nil
}

// wait waits for a runner so that it does not linger as a zombie, and
// records its exit code in ch.
func wait(cmd *exec.Cmd, ch *child) {
	err := cmd.Wait()
	ch.exitCode = 0
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		ch.exitCode = exitErr.ExitCode()
	} else if err != nil {
		ch.exitCode = -1
	}
	close(ch.exited)
}

// reaped follows the exit of context id's runner ch: it pokes the Work
// holding the context's job, so the outcome is settled at once rather than
// a poll interval later.
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
