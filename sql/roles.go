package sql

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The database roles dama defines. They are NOLOGIN: an administrator
// grants them to the login roles of people and programs. Roles belong to
// the whole server, so every database of dama on it shares them; their
// rights are granted in each database by its migration.
const (
	// RoleReader may read dama's tables and views, and River's jobs:
	// dama status, events, queues, schedules, the status page's reads,
	// and plain SQL. Nothing else.
	RoleReader = "dama_reader"
	// RoleOperator is a reader that may also cancel and retry tasks, and
	// pause, resume, block and unblock: dama's commands and the status
	// page's actions.
	RoleOperator = "dama_operator"
	// RoleTask is what a task process needs: read its context, take its
	// lock, record itself, append events, submit children, each for its own
	// run only, which the run's key opens (migration 19). Supervisors give
	// it to their task processes' connections by DAMA_TASK_DATABASE_URL.
	RoleTask = "dama_task"
	// RoleSupervisor runs a supervisor: it reads and writes dama's and
	// River's tables, and changes no schema (dama migrate is the owner's).
	RoleSupervisor = "dama_supervisor"
)

// roleNames lists dama's roles.
func roleNames() []string { return []string{RoleReader, RoleOperator, RoleTask, RoleSupervisor} }

// riverTables are River's tables; those of them that exist get grants.
func riverTables() []string {
	return []string{"river_job", "river_queue", "river_leader", "river_migration", "river_client", "river_client_queue"}
}

// runnerColumns are the columns of etl_contexts a task process writes about
// itself (etlcontext.RecordRunner, RecordCommand, ClearLockLost,
// WithdrawRunner), and river_job_id for the children it submits.
const runnerColumns = `host, pid, process_started_at, heartbeat_at, log_path, host_id, runner_start_ticks,
	fence_window, lock_lost_at, lock_mode, runner_release, runner_protocol, command_pgid, command_start_ticks, river_job_id`

// createRolesSQL creates the roles that do not exist yet. Creating a role
// another migration creates at the same moment is no error.
func createRolesSQL() []string {
	var stmts []string
	for _, r := range roleNames() {
		stmts = append(stmts, fmt.Sprintf(`DO $$
BEGIN
    CREATE ROLE %s NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$`, r))
	}
	return stmts
}

// grantRolesSQL gives each role its rights in the current database; run
// again after every migration, it also covers tables a migration added.
func grantRolesSQL() []string {
	dm := func(table string) string { return Schema + "." + table }
	return []string{
		fmt.Sprintf(`GRANT USAGE ON SCHEMA %s TO %s, %s, %s, %s`, Schema, RoleReader, RoleOperator, RoleTask, RoleSupervisor),
		// Readers and operators read everything.
		fmt.Sprintf(`GRANT SELECT ON ALL TABLES IN SCHEMA %s TO %s, %s`, Schema, RoleReader, RoleOperator),
		riverGrant(riverTables(), "SELECT", RoleReader+", "+RoleOperator),
		// An operator submits tasks, asks for cancellations, appends its
		// events (the database applies them), moves a retried task to its
		// new job, and pauses and blocks.
		fmt.Sprintf(`GRANT INSERT, UPDATE (cancel_requested_at, river_job_id) ON %s TO %s`, dm("etl_contexts"), RoleOperator),
		fmt.Sprintf(`GRANT INSERT ON %s, %s TO %s`, dm("event_store"), dm("control_events"), RoleOperator),
		fmt.Sprintf(`GRANT INSERT, DELETE ON %s, %s TO %s`, dm("queue_pauses"), dm("kind_blocks"), RoleOperator),
		riverGrant([]string{"river_job"}, "INSERT, UPDATE", RoleOperator),
		// A task process reads contexts and events, records itself,
		// appends events, and submits children; the rows it may write are
		// its own run's (migration 19). It locks its INITIAL event through
		// data_manager.lock_initial_event: it may lock no other row of
		// event_store.
		fmt.Sprintf(`GRANT SELECT ON %s, %s, %s TO %s`, dm("etl_contexts"), dm("event_store"), dm("compatibility"), RoleTask),
		fmt.Sprintf(`GRANT UPDATE (%s) ON %s TO %s`, runnerColumns, dm("etl_contexts"), RoleTask),
		fmt.Sprintf(`GRANT INSERT ON %s TO %s`, dm("etl_contexts"), RoleTask),
		fmt.Sprintf(`GRANT INSERT ON %s TO %s`, dm("event_store"), RoleTask),
		fmt.Sprintf(`REVOKE UPDATE ON %s FROM %s`, dm("event_store"), RoleTask),
		// River inserts with ON CONFLICT ... DO UPDATE SET kind.
		riverGrant([]string{"river_job"}, "SELECT, INSERT, UPDATE (kind)", RoleTask),
		// A supervisor reads and writes every table, and alters none.
		fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %s TO %s`, Schema, RoleSupervisor),
		riverGrant(riverTables(), "SELECT, INSERT, UPDATE, DELETE", RoleSupervisor),
	}
}

// riverGrant grants privileges on those of River's tables that exist, in
// the schema the search_path finds them in, and, with INSERT, the use of
// river_job's id sequence.
func riverGrant(tables []string, privileges, to string) string {
	seq := ""
	if strings.Contains(privileges, "INSERT") {
		seq = fmt.Sprintf(`
    IF to_regclass('river_job_id_seq') IS NOT NULL THEN
        EXECUTE format('GRANT USAGE ON SEQUENCE %%s TO %s', to_regclass('river_job_id_seq'));
    END IF;`, to)
	}
	return fmt.Sprintf(`DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['%s'] LOOP
        IF to_regclass(t) IS NOT NULL THEN
            EXECUTE format('GRANT %s ON %%s TO %s', to_regclass(t));
        END IF;
    END LOOP;%s
END
$$`, strings.Join(tables, "', '"), privileges, to, seq)
}

// RolesSQL is the SQL that creates dama's roles and grants them their
// rights in the database it is run in, for an administrator to run when
// dama migrate may not (dama roles prints it).
func RolesSQL() string {
	var b strings.Builder
	b.WriteString("-- dama's roles (server-wide), and their rights in this database.\n")
	for _, s := range append(createRolesSQL(), grantRolesSQL()...) {
		b.WriteString(s)
		b.WriteString(";\n")
	}
	return b.String()
}

// ErrRolesIncomplete says that dama's roles could not all be created or
// granted their rights: an administrator is to run RolesSQL.
var ErrRolesIncomplete = errors.New("dama's roles are not all in place")

// ensureRoles creates dama's roles, when the migrating role may, and grants
// them their rights, when it owns dama's tables. What it may not do is
// left, with ErrRolesIncomplete.
func ensureRoles(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	var mayCreate bool
	if err := pool.QueryRow(ctx, `SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&mayCreate); err != nil {
		return fmt.Errorf("read the migrating role's rights: %w", err)
	}
	if mayCreate {
		for _, s := range createRolesSQL() {
			if _, err := pool.Exec(ctx, s); err != nil {
				return fmt.Errorf("create dama's roles: %w", err)
			}
		}
	}
	var missing []string
	if err := pool.QueryRow(ctx, `
		SELECT coalesce(array_agg(r), '{}') FROM unnest($1::text[]) AS r
		 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r)`, roleNames()).Scan(&missing); err != nil {
		return fmt.Errorf("read dama's roles: %w", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s missing, and %s may not create roles", ErrRolesIncomplete, strings.Join(missing, ", "), "this role")
	}
	for _, s := range grantRolesSQL() {
		if _, err := pool.Exec(ctx, s); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42501" {
				return fmt.Errorf("%w: this role may not grant rights on dama's tables (%s)", ErrRolesIncomplete, pgErr.Message)
			}
			return fmt.Errorf("grant dama's roles their rights: %w", err)
		}
	}
	logger.Debug("dama's roles are in place", "roles", roleNames())
	return nil
}

// CheckRoles reports, with ErrRolesIncomplete, a role of dama's that is
// missing or lacks a right in this database (a table added since its
// grants, say): what dama migrate could not do, an administrator does with
// RolesSQL.
func CheckRoles(ctx context.Context, pool *pgxpool.Pool) error {
	var lacking []string
	err := pool.QueryRow(ctx, `
		SELECT coalesce(array_agg(what), '{}') FROM (
			SELECT r || ' (missing)' AS what FROM unnest($1::text[]) AS r
			 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r)
			UNION ALL
			SELECT $2 || ' (SELECT on ' || c.oid::regclass::text || ')'
			  FROM pg_class AS c
			 WHERE c.relnamespace = $3::regnamespace AND c.relkind IN ('r', 'v', 'p')
			   AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $2)
			   AND NOT has_table_privilege($2, c.oid, 'SELECT')
		) AS l`, roleNames(), RoleReader, Schema).Scan(&lacking)
	if err != nil {
		return fmt.Errorf("read dama's roles: %w", err)
	}
	if len(lacking) > 0 {
		return fmt.Errorf("%w: %s", ErrRolesIncomplete, strings.Join(lacking, ", "))
	}
	return nil
}
