-- A task process writes only what is its own run's (README "Database
-- roles"): its context's row, its run's events, its children and their
-- River jobs. A supervisor gives each run a key, which only the task
-- process it launches learns (DAMA_RUN_KEY); the context keeps the key's
-- SHA-256, and the task process sets the key in each of its sessions
-- (dama.run_key). A member of dama_task is then held, by triggers, to the
-- rows of a RUNNING context whose key its session holds: anything else it
-- may read, and write nothing of.
--
-- Triggers, not row-level security: row-level security on a table costs
-- every role (the planner may then neither use a non-leakproof condition
-- as an index condition nor its statistics, and COPY FROM is refused), and
-- on event_store it would need the table's ACCESS EXCLUSIVE lock, which
-- waits for every row-mode task process to end. The triggers ask who
-- writes once per row written; the rows they guard are written a few times
-- per attempt.
--
-- Additive: a context launched before it has no key, and the task
-- processes of earlier releases run as roles these checks do not hold.

-- +goose Up
ALTER TABLE data_manager.etl_contexts ADD COLUMN runner_key_hash bytea;

-- Whether role who is held to its run's rows: a member of dama_task that is
-- no member of dama_supervisor or dama_operator (nor a superuser, who is a
-- member of every role). Membership, not the use of the roles' rights: a
-- NOINHERIT member may take on the role with SET ROLE. False while the
-- roles do not exist.
-- +goose StatementBegin
CREATE FUNCTION data_manager.held_to_its_run(who name) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF to_regrole('dama_task') IS NULL OR to_regrole('dama_supervisor') IS NULL OR to_regrole('dama_operator') IS NULL THEN
        RETURN false;
    END IF;
    RETURN pg_has_role(who, 'dama_task', 'MEMBER')
       AND NOT pg_has_role(who, 'dama_supervisor', 'MEMBER')
       AND NOT pg_has_role(who, 'dama_operator', 'MEMBER');
END
$$;
-- +goose StatementEnd

-- Whether this session holds the key whose SHA-256 is hash.
CREATE FUNCTION data_manager.holds_run_key(hash bytea) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(hash = sha256(convert_to(current_setting('dama.run_key', true), 'UTF8')), false)
$$;

-- Whether this session holds the key of context id's run, and the run is
-- under way: a finished run's key opens nothing.
CREATE FUNCTION data_manager.holds_key_of(id bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT data_manager.holds_run_key(runner_key_hash)
                       FROM data_manager.etl_contexts WHERE etl_context_id = id AND etl_status = 'RUNNING'), false)
$$;

-- Whether context id is a child, never launched, of a run whose key this
-- session holds: what a task process submits.
CREATE FUNCTION data_manager.submitted_by_key_holder(id bigint) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT data_manager.holds_key_of(parent_context_id)
                       FROM data_manager.etl_contexts WHERE etl_context_id = id AND run_id IS NULL), false)
$$;

-- The error for a role held to its run: a session that holds a key, but
-- not this run's, is a task process whose run is over (DMRUN, as the
-- event guard says of a stale run); one that holds none may not write.
-- +goose StatementBegin
CREATE FUNCTION data_manager.refuse_to_held(what text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF coalesce(current_setting('dama.run_key', true), '') <> '' THEN
        RAISE EXCEPTION '%: this session holds the key of another run, or of one that is over', what
            USING ERRCODE = 'DMRUN';
    END IF;
    RAISE EXCEPTION '%: a member of dama_task writes only its own run''s rows, with its key', what
        USING ERRCODE = 'insufficient_privilege';
END
$$;
-- +goose StatementEnd

-- etl_contexts: its own context, while it runs; a child it submits, which
-- starts as a submission does (what else it may set, its column rights
-- decide) under a key of the parent's (dama:child:<parent>:...); and that
-- child's River job, once.
-- +goose StatementBegin
CREATE FUNCTION data_manager.etl_contexts_held_to_its_run() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT data_manager.held_to_its_run(current_user) THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF data_manager.holds_key_of(NEW.parent_context_id)
           AND (NEW.idempotency_key IS NULL OR starts_with(NEW.idempotency_key, 'dama:child:' || NEW.parent_context_id || ':')) THEN
            RETURN NEW;
        END IF;
        PERFORM data_manager.refuse_to_held(format('submit a task under etl context %s', NEW.parent_context_id));
    END IF;
    IF (OLD.etl_status = 'RUNNING' AND data_manager.holds_run_key(OLD.runner_key_hash)
        AND NEW.river_job_id IS NOT DISTINCT FROM OLD.river_job_id)
       OR (OLD.run_id IS NULL AND OLD.river_job_id IS NULL AND NEW.run_id IS NULL
           AND data_manager.holds_key_of(OLD.parent_context_id)) THEN
        RETURN NEW;
    END IF;
    PERFORM data_manager.refuse_to_held(format('write etl context %s', OLD.etl_context_id));
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER etl_contexts_held_to_its_run BEFORE INSERT OR UPDATE ON data_manager.etl_contexts
    FOR EACH ROW EXECUTE FUNCTION data_manager.etl_contexts_held_to_its_run();

-- event_store: its run's events while it runs (the event guard checks the
-- run id), but none an operator writes (a cancellation's request, a
-- retry, a submission), and the INITIAL event of a child it submits; and
-- what migration 18 holds an operator to.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_by_role() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, data_manager, pg_temp AS $$
DECLARE
    suffix text := split_part(NEW.type, ':', 2);
BEGIN
    IF data_manager.held_to_its_run(current_user) THEN
        IF (suffix NOT IN ('INITIAL', 'CANCEL_REQUESTED', 'RETRIED') AND data_manager.holds_key_of(NEW.etl_context_id))
           OR (suffix = 'INITIAL' AND data_manager.submitted_by_key_holder(NEW.etl_context_id)) THEN
            RETURN NEW;
        END IF;
        PERFORM data_manager.refuse_to_held(format('write a %s event of etl context %s', suffix, NEW.etl_context_id));
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

-- A row-mode task process's lock, when it holds its run's key: context
-- id's INITIAL event row, FOR UPDATE NOWAIT, for the rest of the caller's
-- transaction; NULL when there is none. A role held to its run (the
-- session's: within this function current_user is its owner) must hold the
-- key of the context's running run. The caller's transaction keeps no lock
-- of etl_contexts (README "Releases and upgrades"): the context is read in
-- a subtransaction rolled back, which releases the read's lock, while the
-- variables keep what was read. Only dama_task and dama_supervisor may
-- call it (dama migrate grants them).
-- +goose StatementBegin
CREATE FUNCTION data_manager.lock_initial_event(id bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp AS $$
DECLARE
    hash    bytea;
    status  text;
    locked  bigint;
BEGIN
    BEGIN
        SELECT runner_key_hash, etl_status INTO hash, status FROM data_manager.etl_contexts WHERE etl_context_id = id;
        RAISE SQLSTATE 'DMRBK';
    EXCEPTION WHEN SQLSTATE 'DMRBK' THEN
        NULL;
    END;
    IF data_manager.held_to_its_run(session_user) AND NOT (status = 'RUNNING' AND data_manager.holds_run_key(hash)) THEN
        PERFORM data_manager.refuse_to_held(format('lock etl context %s', id));
    END IF;
    SELECT event_id INTO locked FROM data_manager.event_store
     WHERE etl_context_id = id AND type LIKE '%:INITIAL'
       FOR UPDATE NOWAIT;
    RETURN locked;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION data_manager.lock_initial_event(bigint) FROM PUBLIC;

-- River's jobs: a task process inserts its children's, as River inserts
-- them (supervisor.TaskArgs, kind dama_task), and changes none. Its right to UPDATE kind is only what River's
-- INSERT ... ON CONFLICT DO UPDATE SET kind asks for: dama's jobs carry no
-- unique key, so that update never happens, and the trigger refuses it.
-- +goose StatementBegin
CREATE FUNCTION data_manager.river_job_held_to_its_run() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT data_manager.held_to_its_run(current_user) THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' AND NEW.kind = 'dama_task' AND NEW.state IN ('available', 'scheduled') AND NEW.attempt = 0 AND NEW.attempted_at IS NULL
       AND jsonb_typeof(NEW.args -> 'etl_context_id') = 'number'
       AND data_manager.submitted_by_key_holder((NEW.args ->> 'etl_context_id')::bigint) THEN
        RETURN NEW;
    END IF;
    PERFORM data_manager.refuse_to_held(format('write River job %s', NEW.id));
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    IF to_regclass('river_job') IS NULL THEN
        RAISE EXCEPTION 'river_job is not on the search_path: dama migrate runs River''s migrations first';
    END IF;
    EXECUTE format('CREATE TRIGGER river_job_held_to_its_run BEFORE INSERT OR UPDATE OF kind ON %s
        FOR EACH ROW EXECUTE FUNCTION data_manager.river_job_held_to_its_run()', to_regclass('river_job'));
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('DROP TRIGGER river_job_held_to_its_run ON %s', to_regclass('river_job'));
END
$$;
-- +goose StatementEnd
DROP FUNCTION data_manager.river_job_held_to_its_run();
DROP FUNCTION data_manager.lock_initial_event(bigint);
DROP TRIGGER etl_contexts_held_to_its_run ON data_manager.etl_contexts;
DROP FUNCTION data_manager.etl_contexts_held_to_its_run();
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
DROP FUNCTION data_manager.refuse_to_held(text);
DROP FUNCTION data_manager.submitted_by_key_holder(bigint);
DROP FUNCTION data_manager.holds_key_of(bigint);
DROP FUNCTION data_manager.holds_run_key(bytea);
DROP FUNCTION data_manager.held_to_its_run(name);
ALTER TABLE data_manager.etl_contexts DROP COLUMN runner_key_hash;
