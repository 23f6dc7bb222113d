package damacli

import (
	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/supervisor"
)

// newTaskrunnerCommand is the task process a supervisor starts; its
// arguments (protocol.Launch) and environment are read by the same code
// as in a program embedding the supervisor.
func newTaskrunnerCommand(code *exitCode) *cobra.Command {
	return &cobra.Command{
		Use:                protocol.Subcommand,
		Short:              "Run one attempt of a task (started by the supervisor)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			*code = exitCode(supervisor.RunTaskrunner(cmd.Context(), args, nil))
			return nil
		},
	}
}

// newKeeperCommand is the host's lock keeper of lock_mode host, which a
// task process starts when none serves.
func newKeeperCommand(code *exitCode) *cobra.Command {
	return &cobra.Command{
		Use:                protocol.KeeperSubcommand,
		Short:              "Hold the locks of a host's task processes (started by them)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			*code = exitCode(supervisor.RunKeeper(cmd.Context(), args))
			return nil
		},
	}
}
