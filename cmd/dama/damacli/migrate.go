package damacli

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

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
				// Optional: the owner's login runs everything without them.
				fmt.Fprintf(cmd.ErrOrStderr(), "Migrated. dama's roles are not in place (%s): they are optional, for logins that are to have only what a supervisor, a task, an operator or a reader needs (docs/security.md).\n"+
					"To add them later, run dama roles with DATABASE_URL naming this database as a role that may create roles (a superuser), or pipe dama roles --sql to psql.\n", rolesAmiss(err))
				return nil
			}
			return err
		},
	}
	g.addLogFormat(cmd)
	return cmd
}

// rolesAmiss is the first thing CheckRoles found amiss, and how many more.
func rolesAmiss(err error) string {
	amiss := strings.Split(strings.TrimPrefix(err.Error(), sql.ErrRolesIncomplete.Error()+": "), ", ")
	if len(amiss) == 1 {
		return amiss[0]
	}
	return fmt.Sprintf("%s, and %d more", amiss[0], len(amiss)-1)
}

func newRolesCommand() *cobra.Command {
	var printSQL bool
	cmd := &cobra.Command{
		Use:   "roles",
		Short: "Create dama's roles and grant their rights in this database (as a role that may create roles)",
		Long: `Create dama's database roles (NOLOGIN; grant them to login roles) and grant
each its rights in the database of DATABASE_URL, as dama migrate does when
its role may: run it as a role that may create roles (a superuser), after
dama migrate. Once the roles exist, dama migrate run by the tables' owner
keeps their rights up to date. With --sql, print that SQL instead, for an
administrator to run in this database (needs no database).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if printSQL {
				fmt.Fprint(cmd.OutOrStdout(), sql.RolesSQL())
				return nil
			}
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			err = sql.EnsureRoles(cmd.Context(), pool, slog.New(slog.DiscardHandler))
			if err == nil {
				err = sql.CheckRoles(cmd.Context(), pool)
			}
			if err != nil {
				return fmt.Errorf("%w; dama roles --sql prints the SQL for an administrator", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dama's roles are in place: %s, %s, %s, %s; grant them to logins (GRANT %[4]s TO alice).\n",
				sql.RoleSupervisor, sql.RoleTask, sql.RoleOperator, sql.RoleReader)
			return nil
		},
	}
	cmd.Flags().BoolVar(&printSQL, "sql", false, "print the SQL instead, for an administrator (needs no database)")
	return cmd
}
