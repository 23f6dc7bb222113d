-- A task process writes only what is its own run's (docs/security.md "Database
-- roles"): its context's row, its run's events, its children and their
-- River jobs. A supervisor gives each run a key, which only the task
-- process it launches learns (through a pipe); the context keeps the key's
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
-- writes once per row written, of pg_catalog first (not measured with
-- scripts/bench.sh); a task process's event then costs a look at its
-- context too. A BEFORE ROW trigger makes a COPY into river_job insert row by row.
--
-- Additive: a context launched before it has no key, and the task
-- processes of earlier releases run as roles these checks do not hold.

-- +goose Up
ALTER TABLE data_manager.etl_contexts ADD COLUMN runner_key_hash bytea;

-- Whether role who is held to its run's rows: a member of dama_task that is
-- no member of dama_supervisor (nor a superuser, who is a member of every
-- role), asked of the session's role by lock_initial_event; the triggers
-- ask the same of pg_catalog themselves. Membership, not the use of the
-- roles' rights: a NOINHERIT member may take on the role with SET ROLE. A
-- member of dama_operator too may, beside, do what an operator does (see
-- the triggers). False while the roles do not exist.
-- +goose StatementBegin
CREATE FUNCTION data_manager.held_to_its_run(who name) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF to_regrole('dama_task') IS NULL OR to_regrole('dama_supervisor') IS NULL THEN
        RETURN false;
    END IF;
    RETURN pg_has_role(who, 'dama_task', 'MEMBER') AND NOT pg_has_role(who, 'dama_supervisor', 'MEMBER');
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

-- etl_contexts. A task process: its own context, while it runs (not its
-- River job); a child it submits, which starts as a submission does (what
-- else it may set, its column rights decide) under a key of the parent's
-- (dama:child:<parent>:...); and that child's River job, once, a job of
-- the child's. An operator: a submission, under a key of its own (dama:
-- keys are dama's); a cancellation's request, never taken back; and the
-- River job of a task that is not running, a job of the task's (a
-- submission's, a retry's). River's job id is looked up in River's
-- schema, which the function's search_path names (set below).
-- +goose StatementBegin
CREATE FUNCTION data_manager.etl_contexts_held_to_its_run() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    held      boolean;
    operating boolean;
    own_job   boolean;
BEGIN
    -- A run's key opens only its run: a launch that gave no key (by a
    -- supervisor of an earlier release) takes the previous one away.
    IF TG_OP = 'UPDATE' AND NEW.run_id IS DISTINCT FROM OLD.run_id AND NEW.runner_key_hash IS NOT DISTINCT FROM OLD.runner_key_hash THEN
        NEW.runner_key_hash := NULL;
    END IF;
    -- Who is held, asked of pg_catalog alone: a role with no right on
    -- data_manager (another program's River client) inserts River jobs,
    -- and a supervisor pays no more than this.
    IF to_regrole('dama_supervisor') IS NULL OR to_regrole('dama_task') IS NULL OR to_regrole('dama_operator') IS NULL THEN
        RETURN NEW;
    END IF;
    IF pg_has_role(current_user, 'dama_supervisor', 'MEMBER') THEN
        RETURN NEW;
    END IF;
    IF NOT pg_has_role(current_user, 'dama_task', 'MEMBER') AND NOT pg_has_role(current_user, 'dama_operator', 'MEMBER') THEN
        RETURN NEW;
    END IF;
    -- No supervisor, and a member of one or both of these:
    held := pg_has_role(current_user, 'dama_task', 'MEMBER');
    operating := pg_has_role(current_user, 'dama_operator', 'MEMBER');
    IF TG_OP = 'INSERT' THEN
        IF held AND data_manager.holds_key_of(NEW.parent_context_id)
           AND (NEW.idempotency_key IS NULL OR starts_with(NEW.idempotency_key, 'dama:child:' || NEW.parent_context_id || ':')) THEN
            RETURN NEW;
        END IF;
        IF operating AND (NEW.idempotency_key IS NULL OR NOT starts_with(NEW.idempotency_key, 'dama:')) THEN
            RETURN NEW;
        END IF;
        IF held THEN
            PERFORM data_manager.refuse_to_held(format('submit a task under etl context %s', NEW.parent_context_id));
        END IF;
        RAISE EXCEPTION 'a member of dama_operator may not submit a task under a key of dama''s (%)', NEW.idempotency_key
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    own_job := NEW.river_job_id IS NOT DISTINCT FROM OLD.river_job_id
        OR EXISTS (SELECT 1 FROM river_job AS j
                    WHERE j.id = NEW.river_job_id AND j.args -> 'etl_context_id' = to_jsonb(NEW.etl_context_id));
    IF held THEN
        IF OLD.etl_status = 'RUNNING' AND data_manager.holds_run_key(OLD.runner_key_hash)
           AND NEW.river_job_id IS NOT DISTINCT FROM OLD.river_job_id THEN
            RETURN NEW;
        END IF;
        IF OLD.run_id IS NULL AND OLD.river_job_id IS NULL AND NEW.run_id IS NULL AND own_job
           AND (NEW.host, NEW.pid, NEW.process_started_at, NEW.heartbeat_at, NEW.log_path, NEW.host_id, NEW.runner_start_ticks,
                NEW.fence_window, NEW.lock_lost_at, NEW.lock_mode, NEW.runner_release, NEW.runner_protocol,
                NEW.command_pgid, NEW.command_start_ticks)
               IS NOT DISTINCT FROM
               (OLD.host, OLD.pid, OLD.process_started_at, OLD.heartbeat_at, OLD.log_path, OLD.host_id, OLD.runner_start_ticks,
                OLD.fence_window, OLD.lock_lost_at, OLD.lock_mode, OLD.runner_release, OLD.runner_protocol,
                OLD.command_pgid, OLD.command_start_ticks)
           AND data_manager.holds_key_of(OLD.parent_context_id) THEN
            RETURN NEW;
        END IF;
        IF NOT operating THEN
            PERFORM data_manager.refuse_to_held(format('write etl context %s', OLD.etl_context_id));
        END IF;
    END IF;
    -- What an operator may change: its column rights name the columns.
    IF (NEW.cancel_requested_at IS NOT DISTINCT FROM OLD.cancel_requested_at OR OLD.cancel_requested_at IS NULL)
       AND (NEW.river_job_id IS NOT DISTINCT FROM OLD.river_job_id OR (OLD.etl_status <> 'RUNNING' AND own_job))
       AND (NEW.host, NEW.pid, NEW.process_started_at, NEW.heartbeat_at, NEW.log_path, NEW.host_id, NEW.runner_start_ticks,
            NEW.fence_window, NEW.lock_lost_at, NEW.lock_mode, NEW.runner_release, NEW.runner_protocol,
            NEW.command_pgid, NEW.command_start_ticks)
           IS NOT DISTINCT FROM
           (OLD.host, OLD.pid, OLD.process_started_at, OLD.heartbeat_at, OLD.log_path, OLD.host_id, OLD.runner_start_ticks,
            OLD.fence_window, OLD.lock_lost_at, OLD.lock_mode, OLD.runner_release, OLD.runner_protocol,
            OLD.command_pgid, OLD.command_start_ticks) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'a member of dama_operator may not make this change to etl context %', OLD.etl_context_id
        USING ERRCODE = 'insufficient_privilege';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER etl_contexts_held_to_its_run BEFORE INSERT OR UPDATE ON data_manager.etl_contexts
    FOR EACH ROW EXECUTE FUNCTION data_manager.etl_contexts_held_to_its_run();

-- event_store. A task process: its run's events while it runs (the event
-- guard checks the run id), but none an operator writes (a cancellation's
-- request, a retry, a submission), and the INITIAL event of a child it
-- submits; an event it wrote already (a write made again whose reply was
-- lost) is skipped, as the event guard skips it, even once the run is
-- over. An operator: what migration 18 holds it to. A member of both may
-- do what either may.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_by_role() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, data_manager, pg_temp AS $$
DECLARE
    suffix    text := split_part(NEW.type, ':', 2);
    held      boolean;
    operating boolean;
BEGIN
    -- Who is held, asked of pg_catalog alone: a role with no right on
    -- data_manager (another program's River client) inserts River jobs,
    -- and a supervisor pays no more than this.
    IF to_regrole('dama_supervisor') IS NULL OR to_regrole('dama_task') IS NULL OR to_regrole('dama_operator') IS NULL THEN
        RETURN NEW;
    END IF;
    IF pg_has_role(current_user, 'dama_supervisor', 'MEMBER') THEN
        RETURN NEW;
    END IF;
    IF NOT pg_has_role(current_user, 'dama_task', 'MEMBER') AND NOT pg_has_role(current_user, 'dama_operator', 'MEMBER') THEN
        RETURN NEW;
    END IF;
    -- No supervisor, and a member of one or both of these:
    held := pg_has_role(current_user, 'dama_task', 'MEMBER');
    operating := pg_has_role(current_user, 'dama_operator', 'MEMBER');
    IF held THEN
        IF (suffix NOT IN ('INITIAL', 'CANCEL_REQUESTED', 'RETRIED') AND data_manager.holds_key_of(NEW.etl_context_id))
           OR (suffix = 'INITIAL' AND data_manager.submitted_by_key_holder(NEW.etl_context_id)) THEN
            RETURN NEW;
        END IF;
        IF NEW.seq IS NOT NULL
           AND EXISTS (SELECT 1 FROM data_manager.event_store AS e
                        WHERE e.etl_context_id = NEW.etl_context_id AND e.run_id = NEW.run_id AND e.seq = NEW.seq)
           AND data_manager.holds_run_key((SELECT runner_key_hash FROM data_manager.etl_contexts
                                            WHERE etl_context_id = NEW.etl_context_id AND run_id = NEW.run_id)) THEN
            RETURN NULL;
        END IF;
        IF NOT operating THEN
            PERFORM data_manager.refuse_to_held(format('write a %s event of etl context %s', suffix, NEW.etl_context_id));
        END IF;
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
-- of etl_contexts (docs/operations.md "Releases and upgrades"): the context is read in
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

-- River's jobs. A task process inserts its children's, as River inserts
-- them (supervisor.TaskArgs, kind dama_task, not yet run); an operator, a
-- job of a task that is not running (a submission's, a retry's). Neither
-- changes one: the right to UPDATE kind is only what River's INSERT ... ON
-- CONFLICT DO UPDATE SET kind asks for, and dama's jobs carry no unique
-- key, so that update never happens.
-- +goose StatementBegin
CREATE FUNCTION data_manager.river_job_held_to_its_run() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held      boolean;
    operating boolean;
    task      bigint;
BEGIN
    -- Who is held, asked of pg_catalog alone: a role with no right on
    -- data_manager (another program's River client) inserts River jobs,
    -- and a supervisor pays no more than this.
    IF to_regrole('dama_supervisor') IS NULL OR to_regrole('dama_task') IS NULL OR to_regrole('dama_operator') IS NULL THEN
        RETURN NEW;
    END IF;
    IF pg_has_role(current_user, 'dama_supervisor', 'MEMBER') THEN
        RETURN NEW;
    END IF;
    IF NOT pg_has_role(current_user, 'dama_task', 'MEMBER') AND NOT pg_has_role(current_user, 'dama_operator', 'MEMBER') THEN
        RETURN NEW;
    END IF;
    -- No supervisor, and a member of one or both of these:
    held := pg_has_role(current_user, 'dama_task', 'MEMBER');
    operating := pg_has_role(current_user, 'dama_operator', 'MEMBER');
    IF TG_OP = 'INSERT' AND NEW.kind = 'dama_task' AND NEW.state IN ('available', 'scheduled') AND NEW.attempt = 0 AND NEW.attempted_at IS NULL
       AND jsonb_typeof(NEW.args -> 'etl_context_id') = 'number' THEN
        task := (NEW.args ->> 'etl_context_id')::bigint;
        IF (held AND data_manager.submitted_by_key_holder(task))
           OR (operating AND EXISTS (SELECT 1 FROM data_manager.etl_contexts WHERE etl_context_id = task AND etl_status <> 'RUNNING')) THEN
            -- The id is the one this session just drew from River's
            -- sequence, as River's insert draws it: an id of its choice
            -- would be one a later insert draws, and fails on.
            BEGIN
                IF NEW.id = currval(pg_get_serial_sequence(format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME), 'id')) THEN
                    RETURN NEW;
                END IF;
            EXCEPTION WHEN object_not_in_prerequisite_state THEN
                NULL; -- no id drawn in this session
            END;
        END IF;
    END IF;
    IF held AND NOT operating THEN
        PERFORM data_manager.refuse_to_held(format('write River job %s', NEW.id));
    END IF;
    RAISE EXCEPTION 'a member of dama_operator may write River job % only as a submission or a retry inserts it', NEW.id
        USING ERRCODE = 'insufficient_privilege';
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
    EXECUTE format('ALTER FUNCTION data_manager.etl_contexts_held_to_its_run() SET search_path = pg_catalog, %I, pg_temp',
        (SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('river_job')));
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
