package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/taskrunner"
	"github.com/dama-etl/dama/taskrunner/protocol"
	"golang.org/x/sys/unix"
)

// RunTaskProcess runs this process as the task process a supervisor or a
// runner started it as, and returns its exit code and true; it returns
// false at once when the process is not one. A program that embeds the
// supervisor with function kinds calls it first thing in main, with the
// Funcs it gives the supervisor, and exits with the code:
//
//	if code, ok := supervisor.RunTaskProcess(ctx, funcs); ok {
//		os.Exit(code)
//	}
//
// A supervisor runs each task in a process of its own: this program started
// again, which holds the task's lock as the runner (see [RunTaskrunner]),
// and which starts this program a third time to call the kind's function
// (see [taskrunner.RunFunction]). Which of these the process is comes from
// its environment (protocol.ProcessEnv), which only dama sets. The
// functions must be those given to New in Options.Funcs: a runner whose
// program lacks its kind's function leaves the task to another host, and
// no host would have it.
func RunTaskProcess(ctx context.Context, funcs taskrunner.Funcs) (code int, ok bool) {
	switch role, set := os.LookupEnv(protocol.ProcessEnv); {
	case !set:
		return 0, false
	case role == protocol.ProcessRunner:
		args := os.Args[1:]
		if len(args) > 0 && args[0] == protocol.Subcommand {
			args = args[1:]
		}
		return RunTaskrunner(ctx, args, funcs), true
	case role == protocol.ProcessFunction:
		return taskrunner.RunFunction(ctx, funcs), true
	case role == protocol.ProcessKeeper:
		args := os.Args[1:]
		if len(args) > 0 && args[0] == protocol.KeeperSubcommand {
			args = args[1:]
		}
		return RunKeeper(ctx, args), true
	default:
		// Not this program's normal run either: that could start a
		// whole supervisor where a task process was meant.
		fmt.Fprintf(os.Stderr, "dama: %s=%q: want %q, %q or %q\n", protocol.ProcessEnv, role, protocol.ProcessRunner, protocol.ProcessFunction, protocol.ProcessKeeper)
		return protocol.ExitSetup, true
	}
}

// RunTaskrunner runs one attempt of a task as its runner, with the
// arguments a supervisor gives after protocol.Subcommand, and returns the
// process's exit code (taskrunner's Exit codes). The configuration and the
// database come from the environment (protocol.ConfigEnv and
// protocol.DatabaseURLEnv); the runner logs to stderr, the task's log
// file. It is `dama taskrunner`.
func RunTaskrunner(ctx context.Context, args []string, funcs taskrunner.Funcs) int {
	// Before anything else: the environment holds the database URL, which
	// the command's processes, of the same user, must not read (see
	// taskrunner.Run).
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "taskrunner")
	opts, err := runnerOptions(args, funcs)
	if err != nil {
		logger.Error("taskrunner", "error", err, "exit_code", protocol.ExitSetup)
		return protocol.ExitSetup
	}
	opts.Logger = logger
	// The runner ends on its own terms: a signal to it stops its command,
	// it does not abandon it.
	return taskrunner.Run(context.WithoutCancel(ctx), opts)
}

func runnerOptions(args []string, funcs taskrunner.Funcs) (taskrunner.Options, error) {
	launch, err := protocol.ParseLaunch(args)
	if err != nil {
		return taskrunner.Options{}, err
	}
	cfg, err := config.Load(os.Getenv(protocol.ConfigEnv))
	if err != nil {
		return taskrunner.Options{}, err
	}
	url := os.Getenv(protocol.DatabaseURLEnv)
	if url == "" {
		return taskrunner.Options{}, errors.New(protocol.DatabaseURLEnv + " is not set")
	}
	hostID, err := hostproc.ID()
	if err != nil {
		return taskrunner.Options{}, err
	}
	host, err := os.Hostname()
	if err != nil {
		return taskrunner.Options{}, fmt.Errorf("read host name: %w", err)
	}
	// Insert-only: children are submitted in the transaction of the
	// parent's SUBMITTED event, on the task process's own connection.
	children, err := NewClient(nil, cfg)
	if err != nil {
		return taskrunner.Options{}, err
	}
	opts := taskrunner.Options{
		LockMode:    launch.LockMode,
		Host:        host,
		HostID:      hostID,
		DatabaseURL: url,
		Config:      cfg,
		ContextID:   launch.ContextID,
		RunID:       launch.RunID,
		Funcs:       funcs,
		Submit:      children.submitChild,
	}
	if launch.ReadyFD > 0 {
		// Kept from any process the runner starts (a lock keeper before
		// the lock is held): the supervisor waits for the pipe's end.
		syscall.CloseOnExec(launch.ReadyFD)
		opts.Ready = os.NewFile(uintptr(launch.ReadyFD), "ready")
	}
	if launch.KeyFD > 0 {
		syscall.CloseOnExec(launch.KeyFD)
		f := os.NewFile(uintptr(launch.KeyFD), "key")
		key, err := io.ReadAll(io.LimitReader(f, protocol.MaxKey))
		f.Close()
		if err != nil {
			return taskrunner.Options{}, fmt.Errorf("read the run's key: %w", err)
		}
		opts.RunKey = string(key)
	}
	return opts, nil
}

// RunKeeper runs the host's lock keeper of lock_mode host, with the
// arguments a task process gives after protocol.KeeperSubcommand, and
// returns the process's exit code. The database comes from the
// environment (protocol.DatabaseURLEnv); the keeper logs to stderr, a file
// beside its socket. It is `dama keeper`.
func RunKeeper(ctx context.Context, args []string) int {
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "keeper")
	launch, err := protocol.ParseKeeperLaunch(args)
	if err == nil && launch.EnvFD > 0 {
		err = readKeeperEnv(launch.EnvFD)
	}
	if err == nil && os.Getenv(protocol.DatabaseURLEnv) == "" {
		err = errors.New(protocol.DatabaseURLEnv + " is not set")
	}
	if err != nil {
		logger.Error("keeper", "error", err, "exit_code", protocol.ExitSetup)
		return protocol.ExitSetup
	}
	return taskrunner.RunKeeper(context.WithoutCancel(ctx), taskrunner.KeeperOptions{
		DatabaseURL: os.Getenv(protocol.DatabaseURLEnv),
		Launch:      launch,
		Logger:      logger,
	})
}

// readKeeperEnv sets the variables the task process that started the
// keeper wrote on fd (protocol.KeeperLaunch.EnvFD), once the keeper is
// non-dumpable.
func readKeeperEnv(fd int) error {
	syscall.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "env")
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, protocol.MaxKeeperEnv+1))
	if err != nil {
		return fmt.Errorf("read the keeper's environment: %w", err)
	}
	if len(data) > protocol.MaxKeeperEnv {
		return fmt.Errorf("the keeper's environment is over %d bytes", protocol.MaxKeeperEnv)
	}
	for _, kv := range strings.Split(string(data), "\x00") {
		if kv == "" {
			continue
		}
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			return fmt.Errorf("the keeper's environment: %q is not NAME=value", name)
		}
		if err := os.Setenv(name, value); err != nil {
			return fmt.Errorf("the keeper's environment: %w", err)
		}
	}
	return nil
}
