package damacli

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/supervisor"
)

// newTaskProcessCommands are the processes dama starts itself: the task
// process a supervisor starts, and the host's lock keeper of lock_mode
// host, which a task process starts when none serves. Their arguments
// (protocol.Launch) and environment are read by the same code as in a
// program embedding the supervisor.
func newTaskProcessCommands(g *globals) []*cobra.Command {
	command := func(use, short string, run func(context.Context, []string) int) *cobra.Command {
		return &cobra.Command{
			Use:                use,
			Short:              short,
			Hidden:             true,
			DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, args []string) error {
				g.code = run(cmd.Context(), args)
				return nil
			},
		}
	}
	return []*cobra.Command{
		command(protocol.Subcommand, "Run one attempt of a task (started by the supervisor)",
			func(ctx context.Context, args []string) int { return supervisor.RunTaskrunner(ctx, args, nil) }),
		command(protocol.KeeperSubcommand, "Hold the locks of a host's task processes (started by them)", supervisor.RunKeeper),
	}
}
