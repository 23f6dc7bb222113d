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
// The supervisor starts this program again as each task's runner
// ([RunTaskrunner]), which starts it a third time to call the kind's
// function ([taskrunner.RunFunction]); its environment (protocol.ProcessEnv)
// says which the process is. funcs must be the Funcs given to New.
func RunTaskProcess(ctx context.Context, funcs taskrunner.Funcs) (code int, ok bool) {
	return taskrunner.RunProcess(ctx, funcs)
}

// RunTaskrunner runs one attempt of a task as its runner, with the
// arguments a supervisor gives after protocol.Subcommand, and returns the
// process's exit code. The configuration and the database come from the
// environment; the runner logs to stderr, the task's log file. It is
// `dama taskrunner`.
func RunTaskrunner(ctx context.Context, args []string, funcs taskrunner.Funcs) int {
	return taskrunner.RunFromArgs(ctx, args, funcs)
}

// RunKeeper runs the host's lock keeper of lock_mode host, with the
// arguments a task process gives after protocol.KeeperSubcommand, and
// returns the process's exit code. It is `dama keeper`.
func RunKeeper(ctx context.Context, args []string) int {
	return taskrunner.RunKeeperFromArgs(ctx, args)
}
