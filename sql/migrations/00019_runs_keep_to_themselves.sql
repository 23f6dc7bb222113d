-- A task process writes only what is its own run's (README "Database
-- roles"): its context's row, its run's events, its children. A supervisor
-- gives each run a key, which only the task process it launches learns
-- (DAMA_RUN_KEY); the context keeps the key's SHA-256, and the task process
-- sets the key in each of its sessions (dama.run_key). A member of
-- dama_task is then held to the rows its key opens: anything else it may
-- read, and it can neither change nor lock it.
--
-- - etl_contexts and River's river_job: row-level security. SELECT ...
--   FOR UPDATE skips what an UPDATE could not touch. The policies bind no
--   one else: every other role passes a policy that is true for all rows
--   (the tables' owner, dama migrate's role, is not subject to them at
--   all), and whether a role is held is decided once per statement (an
--   initplan), so the others pay nothing per row.
-- - event_store: a check in its trigger, and its INITIAL row is locked
--   through a function. Row-level security would need the table's ACCESS
--   EXCLUSIVE lock, which waits for every row-mode task process to end.
--
-- Additive: a context launched before it has no key, and the task
-- processes of earlier releases run as roles these checks do not hold.

-- +goose Up
ALTER TABLE data_manager.etl_contexts ADD COLUMN runner_key_hash bytea;

-- Whether role who is held to its run's rows: a member of dama_task that is
-- no member of dama_supervisor or dama_operator (nor a superuser, who is a
-- member of every role). False while the roles do not exist.
-- +goose StatementBegin
CREATE FUNCTION data_manager.held_to_its_run(who name) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF to_regrole('dama_task') IS NULL OR to_regrole('dama_supervisor') IS NULL OR to_regrole('dama_operator') IS NULL THEN
        RETURN false;
    END IF;
    RETURN pg_has_role(who, 'dama_task', 'USAGE')
       AND NOT pg_has_role(who, 'dama_supervisor', 'USAGE')
       AND NOT pg_has_role(who, 'dama_operator', 'USAGE');
END
$$;
-- +goose StatementEnd

-- Whether this session holds the key whose SHA-256 is hash.
CREATE FUNCTION data_manager.holds_run_key(hash bytea) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(hash = sha256(convert_to(current_setting('dama.run_key', true), 'UTF8')), false)
$$;

-- Whether this session holds the key of context id's run.
CREATE FUNCTION data_manager.holds_key_of(id bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT data_manager.holds_run_key(runner_key_hash)
                       FROM data_manager.etl_contexts WHERE etl_context_id = id), false)
$$;

-- Whether context id is a child, not yet launched, of a run whose key this
-- session holds: what a task process submits.
CREATE FUNCTION data_manager.submitted_by_key_holder(id bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT data_manager.holds_key_of(parent_context_id)
                       FROM data_manager.etl_contexts WHERE etl_context_id = id AND run_id IS NULL), false)
$$;

ALTER TABLE data_manager.etl_contexts ENABLE ROW LEVEL SECURITY;
CREATE POLICY everyone ON data_manager.etl_contexts USING (true) WITH CHECK (true);
-- Its own context, and a child it just submitted (to record the child's
-- River job).
CREATE POLICY held_to_its_run_update ON data_manager.etl_contexts AS RESTRICTIVE FOR UPDATE
    USING ((SELECT NOT data_manager.held_to_its_run(current_user))
           OR data_manager.holds_run_key(runner_key_hash)
           OR (run_id IS NULL AND river_job_id IS NULL AND data_manager.holds_key_of(parent_context_id)))
    WITH CHECK ((SELECT NOT data_manager.held_to_its_run(current_user))
           OR data_manager.holds_run_key(runner_key_hash)
           OR (run_id IS NULL AND data_manager.holds_key_of(parent_context_id)));
CREATE POLICY held_to_its_run_insert ON data_manager.etl_contexts AS RESTRICTIVE FOR INSERT
    WITH CHECK ((SELECT NOT data_manager.held_to_its_run(current_user))
           OR (runner_key_hash IS NULL AND data_manager.holds_key_of(parent_context_id)));

-- Its run's events (the database's guard checks the run id), and the
-- INITIAL event of a child it submits; and what migration 18 holds an
-- operator to.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_by_role() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, data_manager, pg_temp AS $$
DECLARE
    suffix text := split_part(NEW.type, ':', 2);
BEGIN
    IF data_manager.held_to_its_run(current_user)
       AND NOT data_manager.holds_key_of(NEW.etl_context_id)
       AND NOT (suffix = 'INITIAL' AND data_manager.submitted_by_key_holder(NEW.etl_context_id)) THEN
        RAISE EXCEPTION 'a member of dama_task may write only the events of its own run (etl context %)', NEW.etl_context_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF to_regrole('dama_operator') IS NULL OR to_regrole('dama_supervisor') IS NULL OR to_regrole('dama_task') IS NULL
       OR NOT pg_has_role(current_user, 'dama_operator', 'USAGE')
       OR pg_has_role(current_user, 'dama_supervisor', 'USAGE')
       OR pg_has_role(current_user, 'dama_task', 'USAGE')
       OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RETURN NEW;
    END IF;
    IF suffix IN ('INITIAL', 'CANCEL_REQUESTED', 'RETRIED')
       OR (suffix = 'CANCELLED' AND NOT EXISTS (
            SELECT 1 FROM data_manager.etl_contexts
             WHERE etl_context_id = NEW.etl_context_id AND etl_status = 'RUNNING')) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'a member of dama_operator may not write a % event', suffix
        USING ERRCODE = 'insufficient_privilege';
END
$$;
-- +goose StatementEnd

-- A row-mode task process's lock: context id's INITIAL event row, FOR
-- UPDATE NOWAIT, for the rest of the caller's transaction; NULL when there
-- is none. A role held to its run must hold the run's key. The caller's
-- transaction keeps no lock of etl_contexts (README "Releases and
-- upgrades"): the key is read in a subtransaction rolled back, which
-- releases the read's lock, while the variable keeps what was read. The
-- role is the session's: within this function, current_user is its owner.
-- +goose StatementBegin
CREATE FUNCTION data_manager.lock_initial_event(id bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp AS $$
DECLARE
    hash bytea;
    locked bigint;
BEGIN
    BEGIN
        SELECT runner_key_hash INTO hash FROM data_manager.etl_contexts WHERE etl_context_id = id;
        RAISE SQLSTATE 'DMRBK';
    EXCEPTION WHEN SQLSTATE 'DMRBK' THEN
        NULL;
    END;
    IF data_manager.held_to_its_run(session_user) AND NOT data_manager.holds_run_key(hash) THEN
        RAISE EXCEPTION 'a member of dama_task may lock only its own run (etl context %)', id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT event_id INTO locked FROM data_manager.event_store
     WHERE etl_context_id = id AND type LIKE '%:INITIAL'
       FOR UPDATE NOWAIT;
    RETURN locked;
END
$$;
-- +goose StatementEnd

-- River's jobs: a task process inserts its children's, and changes and
-- locks none (its right to UPDATE kind is only what River's INSERT ... ON
-- CONFLICT DO UPDATE asks for; dama's jobs have no unique key, so it never
-- conflicts).
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('river_job') IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', to_regclass('river_job'));
        EXECUTE format('CREATE POLICY everyone ON %s USING (true) WITH CHECK (true)', to_regclass('river_job'));
        EXECUTE format('CREATE POLICY held_to_its_run_update ON %s AS RESTRICTIVE FOR UPDATE USING ((SELECT NOT data_manager.held_to_its_run(current_user)))', to_regclass('river_job'));
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('river_job') IS NOT NULL THEN
        EXECUTE format('DROP POLICY held_to_its_run_update ON %s', to_regclass('river_job'));
        EXECUTE format('DROP POLICY everyone ON %s', to_regclass('river_job'));
        EXECUTE format('ALTER TABLE %s DISABLE ROW LEVEL SECURITY', to_regclass('river_job'));
    END IF;
END
$$;
-- +goose StatementEnd
DROP FUNCTION data_manager.lock_initial_event(bigint);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_by_role() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, data_manager, pg_temp AS $$
DECLARE
    suffix text := split_part(NEW.type, ':', 2);
BEGIN
    IF to_regrole('dama_operator') IS NULL OR to_regrole('dama_supervisor') IS NULL OR to_regrole('dama_task') IS NULL
       OR NOT pg_has_role(current_user, 'dama_operator', 'USAGE')
       OR pg_has_role(current_user, 'dama_supervisor', 'USAGE')
       OR pg_has_role(current_user, 'dama_task', 'USAGE')
       OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RETURN NEW;
    END IF;
    IF suffix IN ('INITIAL', 'CANCEL_REQUESTED', 'RETRIED')
       OR (suffix = 'CANCELLED' AND NOT EXISTS (
            SELECT 1 FROM data_manager.etl_contexts
             WHERE etl_context_id = NEW.etl_context_id AND etl_status = 'RUNNING')) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'a member of dama_operator may not write a % event', suffix
        USING ERRCODE = 'insufficient_privilege';
END
$$;
-- +goose StatementEnd
DROP POLICY held_to_its_run_insert ON data_manager.etl_contexts;
DROP POLICY held_to_its_run_update ON data_manager.etl_contexts;
DROP POLICY everyone ON data_manager.etl_contexts;
ALTER TABLE data_manager.etl_contexts DISABLE ROW LEVEL SECURITY;
DROP FUNCTION data_manager.submitted_by_key_holder(bigint);
DROP FUNCTION data_manager.holds_key_of(bigint);
DROP FUNCTION data_manager.holds_run_key(bytea);
DROP FUNCTION data_manager.held_to_its_run(name);
ALTER TABLE data_manager.etl_contexts DROP COLUMN runner_key_hash;
