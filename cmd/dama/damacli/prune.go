package damacli

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/etlcontext"
)

func newPruneCommand() *cobra.Command {
	var olderThan string
	cmd := &cobra.Command{
		Use:   "prune --older-than DURATION",
		Short: "Remove the finished tasks older than a duration, with their events, now",
		Long: `Remove the tasks that finished more than DURATION ago (a Go duration:
720h, 90m; 0s removes every finished task), by the database's clock, with
their events, attempts and River jobs, in transactions of at most 500 tasks or 50,000 events (a larger tree
alone): what
the supervisors do on their own past the configuration's retention. A task
that is not finished is never removed, nor a parent while a child of it is
kept. Needs a role that may delete (dama_supervisor, or the tables' owner).
Prints what it removed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := parseOlderThan(olderThan)
			if err != nil {
				return err
			}
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			total, err := etlcontext.Prune(cmd.Context(), pool, d, etlcontext.PruneLimits{})
			if err != nil {
				return fmt.Errorf("%w (removed %d tasks before it)", err, total.Tasks)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d tasks, %d events, %d attempts, %d River jobs\n", total.Tasks, total.Events, total.Attempts, total.Jobs)
			return nil
		},
	}
	cmd.Flags().StringVar(&olderThan, "older-than", "", "remove the tasks finished longer ago than this (required; e.g. 720h)")
	return cmd
}

// parseOlderThan reads --older-than: a Go duration, not negative.
func parseOlderThan(s string) (time.Duration, error) {
	if s == "" {
		return 0, errors.New("--older-than is required (a duration, e.g. 720h)")
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("--older-than %s: not a duration (e.g. 720h, 90m)", strconv.Quote(s))
	}
	if d < 0 {
		return 0, fmt.Errorf("--older-than %s: must not be negative", strconv.Quote(s))
	}
	return d, nil
}
