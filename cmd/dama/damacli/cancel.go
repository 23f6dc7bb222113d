package damacli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama"
)

func newCancelCommand(g *globals) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a task, stopping its process wherever it runs",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, err := parseID(argv[0])
			if err != nil {
				return err
			}
			// Within --wait, a database that restarts or fails over is
			// waited for, from the first connection on.
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			pool, _, err := waitForDatabase(ctx, slog.New(slog.DiscardHandler), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			client, err := dama.NewClient(pool, nil)
			if err != nil {
				return err
			}
			status, err := client.Cancel(ctx, id)
			if errors.Is(err, dama.ErrCancelPending) {
				g.code = exitCancelPending
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), status)
			return nil
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", time.Minute, "how long to wait for the task to stop")
	return cmd
}
