package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/etlcontext"
)

func newLogsCommand() *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print the log file of a task (on the host it ran on)",
		Long: `Print the log file of a task: the task process's own lines and its command's
output. The file is on the host the task ran on. With --follow, keep printing
what is appended until the task is finished.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			ctx := cmd.Context()
			id, pool, err := openContext(ctx, argv[0])
			if err != nil {
				return err
			}
			defer pool.Close()
			c, err := etlcontext.Get(ctx, pool, id)
			if err != nil {
				return err
			}
			for follow && c.LogPath == nil && !c.Status.Finished() {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
				if c, err = etlcontext.Get(ctx, pool, id); err != nil {
					return err
				}
			}
			if c.LogPath == nil {
				return fmt.Errorf("etl context %d has no log (it is %s and never started)", id, c.Status)
			}
			f, err := os.Open(*c.LogPath)
			if err != nil {
				return fmt.Errorf("open log of etl context %d (the task ran on %s): %w", id, orDash(c.Host), err)
			}
			defer f.Close()
			out := cmd.OutOrStdout()
			if _, err := io.Copy(out, f); err != nil || !follow {
				return err
			}
			return followLog(ctx, pool, id, f, out)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing until the task is finished")
	return cmd
}

// followLog copies what is appended to f until the context is finished (and
// its log drained) or ctx ends. Later attempts append to the same file.
func followLog(ctx context.Context, pool *pgxpool.Pool, id int64, f *os.File, out io.Writer) error {
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		finished := false
		c, err := etlcontext.Get(ctx, pool, id)
		if err == nil {
			finished = c.Status.Finished()
		}
		n, err := io.Copy(out, f)
		if err != nil {
			return err
		}
		if finished && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}
