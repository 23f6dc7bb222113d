package main

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/supervisor"
	"github.com/dama-etl/dama/taskrunner"
)

func newTaskrunnerCommand(g *globals, code *exitCode) *cobra.Command {
	var (
		contextID int64
		runID     string
		readyFD   int
		lockMode  string
	)
	cmd := &cobra.Command{
		Use:    "taskrunner",
		Short:  "Run one attempt of a task (started by the supervisor)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			*code = taskrunner.ExitSetup
			cfg, err := config.Load(g.configPath)
			if err != nil {
				return err
			}
			url, err := databaseURL()
			if err != nil {
				return err
			}
			hostID, err := hostproc.ID()
			if err != nil {
				return err
			}
			host, err := os.Hostname()
			if err != nil {
				return fmt.Errorf("read host name: %w", err)
			}
			mode := config.LockMode(lockMode)
			if mode != config.LockModeRow && mode != config.LockModeAdvisory {
				return fmt.Errorf("--lock-mode %q: want %q or %q", lockMode, config.LockModeRow, config.LockModeAdvisory)
			}
			// Insert-only: children are submitted in the transaction of
			// the parent's SUBMITTED event, on the task process's own
			// connection.
			children, err := supervisor.NewClient(nil, cfg)
			if err != nil {
				return err
			}
			opts := taskrunner.Options{
				LockMode:    mode,
				Host:        host,
				HostID:      hostID,
				DatabaseURL: url,
				Config:      cfg,
				ContextID:   contextID,
				RunID:       runID,
				Logger:      newLogger(os.Stderr).With("component", "taskrunner"),
				Submit: func(ctx context.Context, tx pgx.Tx, c taskrunner.Child) (int64, bool, error) {
					return children.SubmitTx(ctx, tx, supervisor.SubmitParams{
						Kind: c.Kind, Args: c.Args, IdempotencyKey: c.IdempotencyKey, ParentID: c.ParentID,
					})
				},
			}
			if readyFD > 0 {
				opts.Ready = os.NewFile(uintptr(readyFD), "ready")
			}
			// The runner ends on its own terms: a signal to it stops its
			// command, it does not abandon it.
			*code = exitCode(taskrunner.Run(context.WithoutCancel(cmd.Context()), opts))
			return nil
		},
	}
	cmd.Flags().Int64Var(&contextID, "context-id", 0, "etl_context_id to run")
	cmd.Flags().StringVar(&runID, "run-id", "", "run id prepared by the supervisor")
	cmd.Flags().IntVar(&readyFD, "ready-fd", 0, "descriptor to write one byte to once the lock is held")
	cmd.Flags().StringVar(&lockMode, "lock-mode", string(config.LockModeRow), "how to hold the lock: row or advisory (the kind's lock_mode)")
	_ = cmd.MarkFlagRequired("context-id")
	_ = cmd.MarkFlagRequired("run-id")
	return cmd
}
