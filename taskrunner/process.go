package taskrunner

// The life of a task process: a task's runner, the host's lock keeper,
// and the process that calls a function kind, each this program or
// cmd/dama-taskrunner started again by a supervisor or a runner, with a
// role in its environment (protocol.ProcessEnv). cmd/dama-taskrunner is
// this package and a main, so that a runner touches fewer pages of its
// program than of the whole dama's.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"syscall"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/logdir"
	"github.com/dama-etl/dama/internal/submit"
	"github.com/dama-etl/dama/protocol"
	"golang.org/x/sys/unix"
)

// RunProcess runs this process as the task process a supervisor or a
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
// again, which holds the task's lock as the runner (see [RunFromArgs]),
// and which starts this program a third time to call the kind's function
// (see [RunFunction]). Which of these the process is comes from
// its environment (protocol.ProcessEnv), which only dama sets. The
// functions must be those given to New in Options.Funcs: a runner whose
// program lacks its kind's function leaves the task to another host, and
// no host would have it.
func RunProcess(ctx context.Context, funcs Funcs) (code int, ok bool) {
	return runProcess(ctx, funcs, nil)
}

// runProcess is RunProcess with a runner's Starter.
func runProcess(ctx context.Context, funcs Funcs, starter Starter) (code int, ok bool) {
	switch role, set := os.LookupEnv(protocol.ProcessEnv); {
	case !set:
		return 0, false
	case role == protocol.ProcessRunner:
		if _, set := os.LookupEnv("GOMAXPROCS"); !set {
			// One thread runs a runner's Go code: it waits on its command,
			// its lock keeper and the database, and runs none of a
			// function kind's (that is another process, ProcessFunction);
			// an idle second P only woke threads to look for work. In a
			// burst of 300 /bin/true tasks this cut the machine's CPU a
			// task from 41-42 ms to 32-34 ms (docs/performance.md
			// "Bursts"). The lock keeper, which serves every task of its
			// host, keeps Go's default.
			runtime.GOMAXPROCS(1)
		}
		args := os.Args[1:]
		if len(args) > 0 && args[0] == protocol.Subcommand {
			args = args[1:]
		}
		return runFromArgs(ctx, args, funcs, starter), true
	case role == protocol.ProcessFunction:
		return RunFunction(ctx, funcs), true
	case role == protocol.ProcessKeeper:
		args := os.Args[1:]
		if len(args) > 0 && args[0] == protocol.KeeperSubcommand {
			args = args[1:]
		}
		return RunKeeperFromArgs(ctx, args), true
	default:
		// Not this program's normal run either: that could start a
		// whole supervisor where a task process was meant.
		fmt.Fprintf(os.Stderr, "dama: %s=%q: want %q, %q or %q\n", protocol.ProcessEnv, role, protocol.ProcessRunner, protocol.ProcessFunction, protocol.ProcessKeeper)
		return protocol.ExitSetup, true
	}
}

// RunFromArgs runs one attempt of a task as its runner, with the
// arguments a supervisor gives after protocol.Subcommand, and returns the
// process's exit code (taskrunner's Exit codes). The configuration comes
// from the environment (protocol.ConfigEnv), the database from the
// secrets socket, read once the process is non-dumpable
// (protocol.Secrets; or the environment's protocol.DatabaseURLEnv, for a
// runner started by hand); the runner logs to stderr, the task's log file.
// It is `dama-taskrunner taskrunner`, or `dama taskrunner`.
func RunFromArgs(ctx context.Context, args []string, funcs Funcs) int {
	return runFromArgs(ctx, args, funcs, nil)
}

func runFromArgs(ctx context.Context, args []string, funcs Funcs, starter Starter) int {
	// Before anything else, and before the secrets are read: the
	// command's processes, of the same user, must not read this one's
	// memory (see Run).
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	own := &ownLog{w: os.Stderr}
	logger := slog.New(slog.NewTextHandler(own, nil)).With("component", logComponent)
	// A command gets its stdio and its events pipe, not what this process
	// inherited (its descriptors on the command line are kept: they are
	// read, not handed on).
	if err := hostproc.CloseInheritedOnExec(); err != nil {
		logger.Error("the task process ends on an error", "error", err, "exit_code", protocol.ExitSetup)
		return protocol.ExitSetup
	}
	opts, err := runnerOptions(args, funcs)
	if err != nil {
		logger.Error("the task process ends on an error", "error", err, "exit_code", protocol.ExitSetup)
		return protocol.ExitSetup
	}
	opts.Logger, opts.Starter, opts.ownLog = logger, starter, own
	if starter != nil {
		// Its stderr is not the log file (see Options.Starter).
		if f, err := openLog(opts.Config, opts.ContextID); err == nil {
			defer f.Close()
			opts.ownLog = &ownLog{w: f}
			opts.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(os.Stderr, opts.ownLog), nil)).With("component", logComponent)
		}
	}
	// The runner ends on its own terms: a signal to it stops its command,
	// it does not abandon it.
	return Run(context.WithoutCancel(ctx), opts)
}

func runnerOptions(args []string, funcs Funcs) (Options, error) {
	launch, err := protocol.ParseLaunch(args)
	if err != nil {
		return Options{}, err
	}
	// Kept from any process the runner starts (a lock keeper before the
	// lock is held): the supervisor waits for the ready pipe's end.
	for _, fd := range []int{launch.ReadyFD, launch.SecretsFD} {
		if fd > 0 {
			syscall.CloseOnExec(fd)
		}
	}
	var (
		cfg     *config.Config
		secrets protocol.Secrets
	)
	if launch.SecretsFile != "" {
		// A pod's: its configuration comes with its secrets.
		if err = untraced(); err != nil {
			return Options{}, err
		}
		var data []byte
		if secrets, data, err = protocol.ReadPodFiles(launch.SecretsFile, os.Getenv(protocol.ConfigEnv), launch.SecretsDigest); err != nil {
			return Options{}, err
		}
		if cfg, err = config.LoadData(os.Getenv(protocol.ConfigEnv), data); err != nil {
			return Options{}, err
		}
	} else if cfg, err = config.Load(os.Getenv(protocol.ConfigEnv)); err != nil {
		return Options{}, err
	}
	if launch.LogDir != "" {
		cfg.LogDir = launch.LogDir
	}
	if launch.SecretsFD > 0 {
		if secrets, err = readSecrets(launch.SecretsFD); err != nil {
			return Options{}, err
		}
	}
	url, err := setSecretEnv(secrets)
	if err != nil {
		return Options{}, err
	}
	opts, err := runnerHost(cfg, funcs)
	if err != nil {
		return Options{}, err
	}
	opts.LockMode = launch.LockMode
	opts.DatabaseURL = url
	opts.ContextID, opts.RunID = launch.ContextID, launch.RunID
	opts.CgroupParent = launch.CgroupParent
	opts.RunKey, opts.KeeperSecret = secrets.RunKey, secrets.Keeper
	if launch.ReadyFD > 0 {
		opts.Ready = os.NewFile(uintptr(launch.ReadyFD), "ready")
	}
	return opts, nil
}

// openLog opens the log file of context id for appending, in the log
// volume of cfg (see Options.Starter).
func openLog(cfg *config.Config, id int64) (*os.File, error) {
	logs, err := openLogs(cfg, true)
	if err != nil {
		return nil, err
	}
	defer logs.Close()
	return logs.Append(id)
}

// openLogs opens cfg's log directory, or with volume the task process's
// own volume (see Options.Starter).
func openLogs(cfg *config.Config, volume bool) (*logdir.Dir, error) {
	if volume {
		return logdir.OpenVolume(cfg.LogDir)
	}
	return logdir.Open(cfg.LogDir, cfg.LogGroup)
}

// readSecrets reads the secrets on fd (protocol.ReadSecrets), once the
// process is non-dumpable, unless a process traced it before: a tracer
// stays attached, and would read them in its memory.
func readSecrets(fd int) (protocol.Secrets, error) {
	if err := untraced(); err != nil {
		return protocol.Secrets{}, err
	}
	return protocol.ReadSecrets(fd)
}

// untraced fails when a process traces this one.
func untraced() error {
	switch tracer, err := hostproc.Tracer(os.Getpid()); {
	case err != nil:
		return err
	case tracer != 0:
		return fmt.Errorf("process %d traces this one: its secrets are not read", tracer)
	}
	return nil
}

// setSecretEnv sets the variables of secrets (the database URL and
// libpq's PG*, which pgx reads from the environment) in this process's
// environment, for its connections and a command whose kind passes them
// (pass_env): not in what /proc shows of it, which is what the process
// was started with. It returns the database URL: secrets', or for a runner
// started by hand, its environment's.
func setSecretEnv(secrets protocol.Secrets) (string, error) {
	for _, kv := range secrets.Env {
		name, value, _ := strings.Cut(kv, "=")
		if err := os.Setenv(name, value); err != nil {
			return "", fmt.Errorf("set %s: %w", name, err)
		}
	}
	url := os.Getenv(protocol.DatabaseURLEnv)
	if url == "" {
		return "", errors.New("no database URL: neither the secrets socket nor $" + protocol.DatabaseURLEnv + " gives one")
	}
	return url, nil
}

// runnerHost returns the options of a runner on this host under cfg.
func runnerHost(cfg *config.Config, funcs Funcs) (Options, error) {
	hostID, err := hostproc.ID()
	if err != nil {
		return Options{}, err
	}
	host, err := os.Hostname()
	if err != nil {
		return Options{}, fmt.Errorf("read host name: %w", err)
	}
	return Options{
		Host:   host,
		HostID: hostID,
		Config: cfg,
		Funcs:  funcs,
		// Children are submitted in the transaction of the parent's
		// SUBMITTED event, on the task process's own connection.
		Submit: submit.New(cfg).Child,
	}, nil
}

// RunKeeperFromArgs runs the host's lock keeper of lock_mode host, with the
// arguments a task process gives after protocol.KeeperSubcommand, and
// returns the process's exit code. The database and the keeper's secret
// come from its secrets socket (protocol.KeeperLaunch.SecretsFD), read once
// it is non-dumpable; the keeper logs to stderr, a file beside its
// socket. It is `dama-taskrunner keeper`, or `dama keeper`.
func RunKeeperFromArgs(ctx context.Context, args []string) int {
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "keeper")
	launch, err := protocol.ParseKeeperLaunch(args)
	var (
		secrets protocol.Secrets
		url     string
	)
	if err == nil {
		syscall.CloseOnExec(launch.SecretsFD)
		secrets, err = readSecrets(launch.SecretsFD)
	}
	if err == nil {
		url, err = setSecretEnv(secrets)
	}
	if err == nil && len(secrets.Keeper) == 0 {
		err = errors.New("the secrets hold no keeper's secret")
	}
	if err != nil {
		logger.Error("the lock keeper ends on an error", "error", err, "exit_code", protocol.ExitSetup)
		return protocol.ExitSetup
	}
	return RunKeeper(context.WithoutCancel(ctx), KeeperOptions{
		DatabaseURL: url,
		Secret:      secrets.Keeper,
		Launch:      launch,
		Logger:      logger,
	})
}

// logComponent names the task process's own lines in a task's log.
const logComponent = "taskrunner"
