package damacli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
)

func newRetryCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "retry ID",
		Short: "Run a FAILED or CANCELLED task again, from its latest checkpoint",
		Long: `Run a FAILED or CANCELLED task again as a new attempt, which gets the task's
latest checkpoint like any retry, with its kind's max_attempts more attempts.
The task keeps its id, its events and its attempt count; a RETRIED event
records who retried it. Prints QUEUED.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, err := parseID(argv[0])
			if err != nil {
				return err
			}
			cfg, err := config.Load(g.configPath)
			if err != nil {
				return err
			}
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			client, err := dama.NewClient(pool, cfg)
			if err != nil {
				return err
			}
			if err := client.Retry(cmd.Context(), id); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), etlcontext.StatusQueued)
			return nil
		},
	}
}
