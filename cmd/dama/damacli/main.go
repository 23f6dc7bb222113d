// Package damacli is the dama command: cmd/dama runs it, and so does a
// program that adds a runner to it (the Kubernetes module's dama, which
// runs the kubernetes kinds' tasks in pods).
package damacli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	// Schedules' time zones read the same rules on every host, whatever
	// its tzdata package holds, or lacks in a minimal container.
	_ "time/tzdata"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/supervisor"
	"github.com/dama-etl/dama/version"
)

// Options are what a program running the dama command adds to it. Such a
// program is built with a cmd/dama-taskrunner of its own module (whose
// main calls taskrunner.Main), which its supervisor runs task processes
// with when it is installed beside it (checkTaskProgram).
type Options struct {
	// Pods makes the launcher of the configuration's kubernetes kinds, or
	// returns nil when it has none. Nil: a supervisor refuses kubernetes kinds.
	Pods func(*config.Config, *slog.Logger) (supervisor.Launcher, error)
}

// Main runs the dama command on the process's arguments, and exits.
func Main(opts Options) {
	// Other processes of the same user (the tasks' commands) may not read
	// this process's environment, which holds the database URL and the
	// page's tokens, through /proc/<pid>/environ or a debugger. Only root,
	// or another OS user's process, is kept out for sure: run the
	// supervisor as a user of its own for that.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	// What this process inherited reaches none of its task processes.
	if err := hostproc.CloseInheritedOnExec(); err != nil {
		fmt.Fprintln(os.Stderr, "dama: "+err.Error())
		os.Exit(1)
	}
	os.Exit(run(os.Args[1:], opts))
}

// run executes the command line and returns the exit code. Every error is
// a single line on stderr.
func run(args []string, opts Options) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	g := &globals{opts: opts}
	root := newRootCommand(g)
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		msg := "dama: " + shownText(oneLine(err.Error()))
		if g.logFormat == "json" {
			// The last line of a JSON log is JSON too.
			slog.New(slog.NewJSONHandler(os.Stderr, nil)).Error(msg)
		} else {
			fmt.Fprintln(os.Stderr, msg)
		}
		// An error exits 1 unless the command chose its code.
		return max(g.code, 1)
	}
	return g.code
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// globals are what the commands share: the global flags, Main's options,
// the exit status.
type globals struct {
	configPath string
	logFormat  string
	opts       Options
	// code is the exit status a command chose (the taskrunner's, say).
	code int
}

func newRootCommand(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "dama",
		Short: "A supervisor for long-running ETL tasks",
		Long: `dama runs long ETL tasks as detached processes that survive a restart of the
supervisor. The database named by DATABASE_URL holds every task's status in
data_manager.etl_contexts and data_manager.event_store; the view
data_manager.dama_task_queue shows what runs where, and how far along.`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	// --version prints what `dama version` prints.
	root.Version = version.Release
	root.SetVersionTemplate(versionText())
	root.PersistentFlags().StringVar(&g.configPath, "config", os.Getenv("DAMA_CONFIG"), "configuration file (default $DAMA_CONFIG, else ./dama.yaml if there is one)")
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		// These read no configuration; a task process's comes from its supervisor.
		if cmd.Hidden || slices.Contains([]string{"init", "version", "help", "ready"}, cmd.Name()) ||
			cmd.HasParent() && cmd.Parent().Name() == "completion" {
			return nil
		}
		return g.settleConfig(cmd.Flag("config").Changed)
	}
	root.AddCommand(
		newInitCommand(),
		newMigrateCommand(g),
		newRolesCommand(),
		newSupervisorCommand(g),
		newSubmitCommand(g),
		newStatusCommand(),
		newEventsCommand(),
		newLogsCommand(),
		newCancelCommand(g),
		newRetryCommand(g),
		newPruneCommand(),
		newQueuesCommand(),
		newSupervisorsCommand(),
		newSchedulesCommand(),
		newWebCommand(g),
		newVersionCommand(),
		newReadyCommand(),
	)
	root.AddCommand(newControlCommands(g)...)
	root.AddCommand(newTaskProcessCommands(g)...)
	return root
}
