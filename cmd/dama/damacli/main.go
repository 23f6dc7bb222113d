// Package damacli is the dama command: cmd/dama runs it, and so does a
// program that adds a runner to it (the Kubernetes module's dama, which
// runs the kubernetes kinds' tasks in pods).
package damacli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
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
// program is built with a cmd/dama-taskrunner of its own module beside its
// main package, whose main calls taskrunner.Main: a supervisor runs its
// task processes with that program when it is installed beside it, and
// refuses one of another build (the core's, say).
type Options struct {
	// Pods makes the launcher of the configuration's kubernetes kinds
	// (config.RunnerKubernetes), or returns nil when it has none. Nil
	// (the default): a supervisor refuses a configuration with
	// kubernetes kinds.
	Pods func(*config.Config, *slog.Logger) (supervisor.Launcher, error)
}

// Main runs the dama command on the process's arguments, and exits.
func Main(opts Options) {
	hideEnvironment()
	// What this process inherited reaches none of its task processes.
	if err := hostproc.CloseInheritedOnExec(); err != nil {
		fmt.Fprintln(os.Stderr, "dama: "+err.Error())
		os.Exit(1)
	}
	os.Exit(run(os.Args[1:], opts))
}

// run executes the command line and returns the exit code. Every error is a
// single line on stderr.
func run(args []string, opts Options) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var code exitCode
	g := &globals{opts: opts}
	root := newRootCommand(g, &code)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err != nil {
		if g.logFormat == "json" {
			// The last line of a JSON log is JSON too.
			slog.New(slog.NewJSONHandler(os.Stderr, nil)).Error("dama: " + shownText(oneLine(err.Error())))
		} else {
			fmt.Fprintln(os.Stderr, "dama: "+shownText(oneLine(err.Error())))
		}
		if code == 0 {
			return 1
		}
	}
	return int(code)
}

// hideEnvironment keeps other processes of the same user (the tasks'
// commands) from reading this process's environment, which holds the
// database URL and the page's tokens, through /proc/<pid>/environ or a
// debugger: every dama command calls it first thing. Only root, or another
// OS user's process, is kept out for sure: run the supervisor as a user of
// its own for that.
func hideEnvironment() {
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}

// exitCode lets a command choose its exit status (the taskrunner's codes).
type exitCode int

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

type globals struct {
	configPath string
	logFormat  string
	opts       Options
}

func newRootCommand(g *globals, code *exitCode) *cobra.Command {
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
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		switch {
		case cmd.Hidden:
			// A task process's configuration comes from its supervisor.
			return nil
		case cmd.Name() == "init" || cmd.Name() == "version" || cmd.Name() == "help",
			cmd.HasParent() && cmd.Parent().Name() == "completion":
			return nil
		}
		return g.settleConfig(cmd.Flag("config").Changed)
	}
	root.AddCommand(
		newInitCommand(),
		newMigrateCommand(g),
		newRolesCommand(),
		newSupervisorCommand(g),
		newSubmitCommand(g, code),
		newStatusCommand(),
		newEventsCommand(),
		newLogsCommand(),
		newCancelCommand(g, code),
		newRetryCommand(g),
		newPruneCommand(),
		newPauseCommand(g),
		newResumeCommand(g),
		newBlockCommand(g),
		newUnblockCommand(g),
		newQueuesCommand(),
		newSchedulesCommand(),
		newTaskrunnerCommand(code),
		newKeeperCommand(code),
		newWebCommand(g),
		newVersionCommand(),
	)
	return root
}

// databaseURL returns DATABASE_URL; it is read from the environment only, so
// that credentials never appear in a process listing.
func databaseURL() (string, error) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return "", errors.New("DATABASE_URL is not set")
	}
	return url, nil
}
