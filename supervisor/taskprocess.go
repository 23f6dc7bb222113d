package supervisor

import (
	"context"

	"github.com/dama-etl/dama/taskrunner"
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
	return taskrunner.RunProcess(ctx, funcs)
}

// RunTaskrunner runs one attempt of a task as its runner, with the
// arguments a supervisor gives after protocol.Subcommand, and returns the
// process's exit code (taskrunner's Exit codes). The configuration and the
// database come from the environment (protocol.ConfigEnv and
// protocol.DatabaseURLEnv); the runner logs to stderr, the task's log
// file. It is `dama taskrunner`.
func RunTaskrunner(ctx context.Context, args []string, funcs taskrunner.Funcs) int {
	return taskrunner.RunFromArgs(ctx, args, funcs)
}

// RunKeeper runs the host's lock keeper of lock_mode host, with the
// arguments a task process gives after protocol.KeeperSubcommand, and
// returns the process's exit code. The database comes from the
// environment (protocol.DatabaseURLEnv); the keeper logs to stderr, a file
// beside its socket. It is `dama keeper`.
func RunKeeper(ctx context.Context, args []string) int {
	return taskrunner.RunKeeperFromArgs(ctx, args)
}
