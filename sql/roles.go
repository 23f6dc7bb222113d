package sql

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
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

func roleNames() []string { return []string{RoleReader, RoleOperator, RoleTask, RoleSupervisor} }

// riverTables are River's tables; those of them that exist get grants.
func riverTables() []string {
	return []string{"river_job", "river_queue", "river_leader", "river_migration", "river_client", "river_client_queue"}
}

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

// right is a right of some of dama's roles: what Migrate and RolesSQL grant
// (or, revoke, take away) and CheckRoles checks.
type right struct {
	roles []string
	// privileges are SQL privileges ("SELECT", "UPDATE", "EXECUTE", ...);
	// with columns, on those columns only.
	privileges []string
	columns    []string
	// tables are dama's (in the schema Name) or, river, River's, of which those
	// that exist; none (and no functions) means every table and view of
	// the schema Name.
	tables []string
	river  bool
	// except are tables of the schema a right on every table leaves out:
	// a revocation that follows it takes their right away.
	except []string
	// functions are dama's functions (in the schema Name), by their signatures.
	functions []string
	// revoke takes the privileges away instead: a right a role must not
	// hold (an earlier build granted it, or PUBLIC has it by default).
	// Without columns, it is the table-level right that is taken away.
	revoke bool
}

// insertColumns are the columns of etl_contexts a submission sets
// (data_manager.create_task): an operator's or a task process's submission
// starts like any other.
var insertColumns = []string{"parent_context_id", "kind", "queue", "max_attempts", "idempotency_key", "concurrency_key", "due_at"}

// eventColumns are the columns of event_store an event sets
// (etlcontext.Append, AppendEvents).
var eventColumns = []string{"etl_context_id", "type", "payload", "meta", "error", "run_id", "seq"}

// runnerColumns are the columns of etl_contexts a task process writes about
// itself (etlcontext.RecordRunner, RecordCommand, ClearLockLost,
// WithdrawRunner, SetProgress), and river_job_id for the children it
// submits.
var runnerColumns = []string{"host", "pid", "process_started_at", "heartbeat_at", "log_path", "host_id", "runner_start_ticks",
	"fence_window", "lock_lost_at", "lock_mode", "runner_release", "runner_protocol", "command_pgid", "command_start_ticks", "river_job_id",
	"progress", "progress_at"}

// The functions that make tasks (migration 24) and their jobs (migration
// 27), and keep their logs' tails (migration 25), by their signatures.
const (
	createTaskFunction = "create_task(text,jsonb,text,text,integer,text,timestamptz,bigint)"
	enqueueJobFunction = "enqueue_job(bigint)"
	submitFunction     = "submit(text,jsonb,text,text,timestamptz,bigint)"
	appendLogFunction  = "append_log(bigint,uuid,bigint,bytea,bigint)"
)

// stepFunctions are a supervisor's step's (migration 38) and what they and
// the wake count (migration 39), by their signatures.
var stepFunctions = []string{"lock_step(bigint,bigint)",
	"start_attempt(bigint,bigint,text,integer,uuid,integer,integer,integer,integer,text,bytea)", "slot_holders()"}

// heldFunctions are what migration 19's checks call with the rights of
// whoever writes: every role needs them, even where PUBLIC may not execute
// functions by default.
var heldFunctions = []string{"held_to_its_run(name)", "holds_run_key(bytea)", "holds_key_of(bigint)",
	"submitted_by_key_holder(bigint)", "refuse_to_held(text)",
	// And what create_task (migration 24), which runs with the rights of
	// whoever submits, calls.
	"max_args_bytes()", "concurrency_key_of(jsonb,text,boolean)"}

// rights lists what each role may do; see docs/security.md "Database roles".
// Revocations come first: a table-level REVOKE takes the columns' rights
// too.
func rights() []right {
	return []right{
		// Submissions and events set their own columns only, never an id
		// (which a later insert would draw, and fail on); earlier builds
		// granted the tables.
		{roles: []string{RoleOperator, RoleTask}, privileges: []string{"INSERT"}, tables: []string{"etl_contexts", "event_store"}, revoke: true},
		// A task process locks its INITIAL event through
		// lock_initial_event: it may lock, so update, no other row.
		{roles: []string{RoleTask}, privileges: []string{"UPDATE"}, tables: []string{"event_store"}, revoke: true},
		{roles: []string{RoleTask}, privileges: []string{"UPDATE"}, columns: []string{"meta"}, tables: []string{"event_store"}, revoke: true},
		{roles: []string{"PUBLIC", RoleReader, RoleOperator}, privileges: []string{"EXECUTE"}, functions: []string{"lock_initial_event(bigint)"}, revoke: true},
		// Every role may use the schema, and the functions the checks call.
		{roles: roleNames()},
		{roles: roleNames(), privileges: []string{"EXECUTE"}, functions: heldFunctions},
		// Readers and operators read everything.
		{roles: []string{RoleReader, RoleOperator}, privileges: []string{"SELECT"}},
		{roles: []string{RoleReader, RoleOperator}, privileges: []string{"SELECT"}, tables: riverTables(), river: true},
		// An operator submits tasks, asks for cancellations, appends its
		// events (the database applies them), moves a retried task to its
		// new job, and pauses and blocks.
		{roles: []string{RoleOperator}, privileges: []string{"INSERT"}, columns: insertColumns, tables: []string{"etl_contexts"}},
		{roles: []string{RoleOperator}, privileges: []string{"INSERT"}, columns: eventColumns, tables: []string{"event_store"}},
		{roles: []string{RoleOperator}, privileges: []string{"INSERT"}, tables: []string{"control_events"}},
		{roles: []string{RoleOperator}, privileges: []string{"UPDATE"}, columns: []string{"cancel_requested_at", "river_job_id"}, tables: []string{"etl_contexts"}},
		{roles: []string{RoleOperator}, privileges: []string{"INSERT", "DELETE"}, tables: []string{"queue_pauses", "kind_blocks"}},
		// River's JobCancelTx (state, finalized_at, metadata), dama's
		// alignAttempt (attempt), River's insert (kind, see below).
		{roles: []string{RoleOperator}, privileges: []string{"INSERT"}, tables: []string{"river_job"}, river: true},
		{roles: []string{RoleOperator}, privileges: []string{"UPDATE"}, columns: []string{"state", "finalized_at", "metadata", "attempt", "kind"}, tables: []string{"river_job"}, river: true},
		// A task process reads contexts and events, records itself,
		// appends events, locks its INITIAL event, and submits children;
		// the rows it may write are its own run's (migration 19).
		{roles: []string{RoleTask}, privileges: []string{"SELECT"}, tables: []string{"etl_contexts", "event_store", "compatibility"}},
		{roles: []string{RoleTask}, privileges: []string{"UPDATE"}, columns: runnerColumns, tables: []string{"etl_contexts"}},
		{roles: []string{RoleTask}, privileges: []string{"INSERT"}, columns: insertColumns, tables: []string{"etl_contexts"}},
		{roles: []string{RoleTask}, privileges: []string{"INSERT"}, columns: eventColumns, tables: []string{"event_store"}},
		{roles: []string{RoleTask, RoleSupervisor}, privileges: []string{"EXECUTE"}, functions: []string{"lock_initial_event(bigint)"}},
		// River inserts with ON CONFLICT ... DO UPDATE SET kind.
		{roles: []string{RoleTask}, privileges: []string{"SELECT", "INSERT"}, tables: []string{"river_job"}, river: true},
		{roles: []string{RoleTask}, privileges: []string{"UPDATE"}, columns: []string{"kind"}, tables: []string{"river_job"}, river: true},
		// A supervisor reads and writes every table, and alters none. It
		// deletes no event: finished tasks are removed, their events with
		// them, by remove_tasks (migration 23), which only it may call.
		{roles: []string{RoleSupervisor}, privileges: []string{"SELECT", "INSERT", "UPDATE", "DELETE"}, except: []string{"event_store"}},
		{roles: []string{RoleSupervisor}, privileges: []string{"DELETE"}, tables: []string{"event_store"}, revoke: true},
		{roles: []string{RoleSupervisor}, privileges: []string{"SELECT", "INSERT", "UPDATE"}, tables: []string{"event_store"}},
		{roles: []string{RoleSupervisor}, privileges: []string{"SELECT", "INSERT", "UPDATE", "DELETE"}, tables: riverTables(), river: true},
		{roles: []string{"PUBLIC", RoleReader, RoleOperator, RoleTask}, privileges: []string{"EXECUTE"}, functions: []string{"remove_tasks(bigint[])"}, revoke: true},
		{roles: []string{RoleSupervisor}, privileges: []string{"EXECUTE"}, functions: []string{"remove_tasks(bigint[])"}},
		// A step's lock and read, and a start (migration 38), with the
		// caller's rights.
		{roles: []string{RoleSupervisor}, privileges: []string{"EXECUTE"}, functions: stepFunctions},
		// Whoever may submit makes tasks with create_task (migration 24):
		// an operator and a supervisor also by data_manager.submit, a task
		// process its children. Both run with the caller's rights, which
		// the triggers of migration 19 hold to the caller's own.
		// create_task gives a task its job with enqueue_job (migration 27),
		// as `dama retry` and a supervisor's reconcile do.
		{roles: []string{"PUBLIC", RoleReader}, privileges: []string{"EXECUTE"}, functions: []string{createTaskFunction, enqueueJobFunction, submitFunction}, revoke: true},
		{roles: []string{RoleTask}, privileges: []string{"EXECUTE"}, functions: []string{submitFunction}, revoke: true},
		{roles: []string{RoleOperator, RoleSupervisor}, privileges: []string{"EXECUTE"}, functions: []string{createTaskFunction, enqueueJobFunction, submitFunction}},
		{roles: []string{RoleTask}, privileges: []string{"EXECUTE"}, functions: []string{createTaskFunction, enqueueJobFunction}},
		// A task process keeps its log's tail by append_log (migration 25)
		// alone, which holds it to its own run.
		{roles: []string{"PUBLIC", RoleReader, RoleOperator}, privileges: []string{"EXECUTE"}, functions: []string{appendLogFunction}, revoke: true},
		{roles: []string{RoleTask, RoleSupervisor}, privileges: []string{"EXECUTE"}, functions: []string{appendLogFunction}},
	}
}

// sql is the GRANT (or REVOKE) statement of r.
func (r right) sql() string {
	to := strings.Join(r.roles, ", ")
	if len(r.privileges) == 0 {
		return fmt.Sprintf(`GRANT USAGE ON SCHEMA %s TO %s`, Name, to)
	}
	privileges := strings.Join(r.privileges, ", ")
	if len(r.columns) > 0 {
		privileges += " (" + strings.Join(r.columns, ", ") + ")"
	}
	on := ""
	switch {
	case r.river:
		return riverGrant(r.tables, privileges, to)
	case len(r.functions) > 0:
		on = "FUNCTION " + strings.Join(qualified(r.functions), ", ")
	case len(r.tables) == 0:
		on = "ALL TABLES IN SCHEMA " + Name
	default:
		on = strings.Join(qualified(r.tables), ", ")
	}
	if r.revoke {
		return fmt.Sprintf(`REVOKE %s ON %s FROM %s`, privileges, on, to)
	}
	return fmt.Sprintf(`GRANT %s ON %s TO %s`, privileges, on, to)
}

// qualified names dama's tables or functions in the schema Name.
func qualified(names []string) []string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = Name + "." + n
	}
	return q
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
// dama migrate may not (dama roles --sql prints it).
func RolesSQL() string {
	var b strings.Builder
	b.WriteString("-- dama's roles (server-wide), and their rights in this database.\n")
	for _, s := range createRolesSQL() {
		b.WriteString(s + ";\n")
	}
	b.WriteString("BEGIN;\n")
	for _, r := range rights() {
		b.WriteString(r.sql() + ";\n")
	}
	b.WriteString("COMMIT;\n")
	return b.String()
}

// ErrRolesIncomplete says that dama's roles could not all be created or
// granted their rights: a role that may is to run EnsureRoles (dama
// roles), or an administrator RolesSQL.
var ErrRolesIncomplete = errors.New("dama's roles are not all in place")

// EnsureRoles creates dama's roles, when the connected role may, and grants
// them their rights, when it owns dama's tables (or is a superuser). What it
// may not do is left, with ErrRolesIncomplete.
func EnsureRoles(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
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
	// In one transaction: a revocation followed by its grant (a table's
	// right, then its columns') leaves no moment without either.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, r := range rights() {
			if _, err := tx.Exec(ctx, r.sql()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42501" {
			return fmt.Errorf("%w: this role may not grant rights on dama's tables (%s): dama migrate, run by their owner, grants them once the roles exist", ErrRolesIncomplete, pgErr.Message)
		}
		return fmt.Errorf("grant dama's roles their rights: %w", err)
	}
	logger.Debug("dama's roles are in place", "roles", roleNames())
	return nil
}

// CheckRoles reports, with ErrRolesIncomplete, a role of dama's that is
// missing, lacks a right in this database (a table added since its grants,
// say) or holds one it must not: what dama migrate could not do, an
// administrator does with RolesSQL.
func CheckRoles(ctx context.Context, pool *pgxpool.Pool) error {
	var present []string
	if err := pool.QueryRow(ctx, `
		SELECT coalesce(array_agg(r), '{}') FROM unnest($1::text[]) AS r
		 WHERE EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r)`, roleNames()).Scan(&present); err != nil {
		return fmt.Errorf("read dama's roles: %w", err)
	}
	var lacking []string
	for _, r := range roleNames() {
		if !slices.Contains(present, r) {
			lacking = append(lacking, r+" missing")
		}
	}
	var schemaTables []string
	if err := pool.QueryRow(ctx, `
		SELECT coalesce(array_agg(format('%I.%I', $1::text, c.relname) ORDER BY c.relname), '{}') FROM pg_class AS c
		 WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'v', 'p')`, Name).Scan(&schemaTables); err != nil {
		return fmt.Errorf("read dama's tables: %w", err)
	}
	// One row per (role, object, privilege, column, whether held), checked
	// in one query. An object is a table, a function, or (what riverGrant
	// grants with INSERT) River's job id sequence.
	var roles, kinds, objects, privileges, columns []string
	var want []bool
	add := func(role, kind, object, privilege, column string, held bool) {
		roles, kinds, objects = append(roles, role), append(kinds, kind), append(objects, object)
		privileges, columns, want = append(privileges, privilege), append(columns, column), append(want, held)
	}
	for _, r := range rights() {
		kind, objs, cols := "table", r.tables, r.columns
		switch {
		case len(r.privileges) == 0:
			continue
		case len(r.functions) > 0:
			kind, objs = "function", qualified(r.functions)
		case len(objs) == 0:
			objs = slices.DeleteFunc(slices.Clone(schemaTables), func(t string) bool {
				return slices.Contains(qualified(r.except), t)
			})
		case !r.river:
			objs = qualified(objs)
		}
		if len(cols) == 0 {
			cols = []string{""} // the table's own right
		}
		for _, role := range r.roles {
			if !slices.Contains(present, role) {
				continue
			}
			if r.river && slices.Contains(r.privileges, "INSERT") {
				add(role, "sequence", "river_job_id_seq", "USAGE", "", true)
			}
			for _, o := range objs {
				for _, p := range r.privileges {
					for _, c := range cols {
						add(role, kind, o, p, c, !r.revoke)
					}
				}
			}
		}
	}
	var wrong []string
	err := pool.QueryRow(ctx, `
		SELECT coalesce(array_agg(role || CASE WHEN want THEN ' lacks ' ELSE ' holds ' END || privilege
		                          || CASE WHEN col = '' THEN '' ELSE ' (' || col || ')' END || ' on ' || obj
		                          ORDER BY n), '{}')
		  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bool[])
		       WITH ORDINALITY AS c(role, kind, obj, privilege, col, want, n)
		 WHERE CASE kind WHEN 'function' THEN to_regprocedure(obj) IS NOT NULL ELSE to_regclass(obj) IS NOT NULL END
		   AND want <> CASE
		       WHEN kind = 'function' THEN has_function_privilege(role, to_regprocedure(obj), privilege)
		       WHEN kind = 'sequence' THEN has_sequence_privilege(role, to_regclass(obj), privilege)
		       WHEN col <> '' THEN has_column_privilege(role, to_regclass(obj), col, privilege)
		       ELSE has_table_privilege(role, to_regclass(obj), privilege) END`,
		roles, kinds, objects, privileges, columns, want).Scan(&wrong)
	if err != nil {
		return fmt.Errorf("read the rights of dama's roles: %w", err)
	}
	lacking = append(lacking, wrong...)
	var schemaUse []string
	if err := pool.QueryRow(ctx, `
		SELECT coalesce(array_agg(r || ' lacks USAGE on schema ' || $2), '{}') FROM unnest($1::text[]) AS r
		 WHERE NOT has_schema_privilege(r, $2, 'USAGE')`, present, Name).Scan(&schemaUse); err != nil {
		return fmt.Errorf("read the rights of dama's roles: %w", err)
	}
	lacking = append(lacking, schemaUse...)
	if len(lacking) > 0 {
		return fmt.Errorf("%w: %s", ErrRolesIncomplete, strings.Join(lacking, ", "))
	}
	return nil
}
