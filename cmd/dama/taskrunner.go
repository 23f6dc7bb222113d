package main

import (
	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/supervisor"
	"github.com/dama-etl/dama/taskrunner/protocol"
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
