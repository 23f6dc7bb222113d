package damacli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/sql"
)

func newMigrateCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply River's and dama's migrations (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			pool, _, err := connect(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := sql.Migrate(cmd.Context(), pool, logger); err != nil {
				return err
			}
			err = sql.CheckRoles(cmd.Context(), pool)
			if errors.Is(err, sql.ErrRolesIncomplete) {
				// What this role may not do, an administrator may.
				fmt.Fprintf(cmd.OutOrStdout(), "-- %s\n-- Run this as an administrator, in this database:\n%s", oneLine(err.Error()), sql.RolesSQL())
				return nil
			}
			return err
		},
	}
	g.addLogFormat(cmd)
	return cmd
}

func newRolesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "roles",
		Short: "Print the SQL that creates dama's roles and grants their rights (for an administrator)",
		Long: `Print the SQL that creates dama's database roles (NOLOGIN; grant them to
login roles) and grants each its rights in the database it is run in. dama
migrate does the same when its role may; run this as an administrator
otherwise, after each dama migrate. Needs no database.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprint(cmd.OutOrStdout(), sql.RolesSQL())
			return nil
		},
	}
}
