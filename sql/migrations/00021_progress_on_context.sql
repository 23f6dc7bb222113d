-- A context keeps its latest progress (docs/tasks.md "Progress and
-- checkpoints"): each PROGRESS event stored sets it, and a task process
-- sets it in between (etlcontext.SetProgress), PROGRESS events being a
-- sample of it, one per progress_interval. Contexts from before keep theirs
-- in their events, where the view (migration 22) still finds it.
--
-- Quick and safe while tasks run: two nullable columns (no rewrite; the
-- table's lock is held only for that, and a row-mode task process holds
-- nothing of etl_contexts), and trigger functions replaced in place. Only
-- the task process's own run may set the columns (the run's key), and no
-- operator, nor a task process for its children before they run
-- (etl_contexts_held_to_its_run).

-- +goose Up
ALTER TABLE data_manager.etl_contexts ADD COLUMN progress jsonb, ADD COLUMN progress_at timestamptz;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_latest() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp AS $$
BEGIN
    -- A cancellation request is a note beside the run, not a step of it:
    -- the latest event stays the run's (an AWAITING parent keeps its queue
    -- slot free until its task process records the end). The newest
    -- PROGRESS event of the statement is the context's progress.
    UPDATE data_manager.etl_contexts AS c
       SET latest_event_id = CASE WHEN c.latest_event_id IS NULL OR c.latest_event_id < n.latest
                                  THEN n.latest ELSE c.latest_event_id END,
           progress = CASE WHEN n.progress_id IS NOT NULL THEN n.progress ELSE c.progress END,
           progress_at = CASE WHEN n.progress_id IS NOT NULL THEN n.progress_at ELSE c.progress_at END
      FROM (SELECT e.etl_context_id,
                   max(e.event_id) FILTER (WHERE e.type <> k.kind || ':CANCEL_REQUESTED') AS latest,
                   max(e.event_id) FILTER (WHERE e.type = k.kind || ':PROGRESS') AS progress_id,
                   (array_agg(e.payload ORDER BY e.event_id DESC) FILTER (WHERE e.type = k.kind || ':PROGRESS'))[1] AS progress,
                   max(e.created_at) FILTER (WHERE e.type = k.kind || ':PROGRESS') AS progress_at
              FROM new_events AS e
              JOIN data_manager.etl_contexts AS k ON k.etl_context_id = e.etl_context_id
             GROUP BY e.etl_context_id) AS n
     WHERE c.etl_context_id = n.etl_context_id
       AND ((n.latest IS NOT NULL AND (c.latest_event_id IS NULL OR c.latest_event_id < n.latest))
            OR n.progress_id IS NOT NULL);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.etl_contexts_held_to_its_run() RETURNS trigger
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
                NEW.command_pgid, NEW.command_start_ticks, NEW.progress, NEW.progress_at)
               IS NOT DISTINCT FROM
               (OLD.host, OLD.pid, OLD.process_started_at, OLD.heartbeat_at, OLD.log_path, OLD.host_id, OLD.runner_start_ticks,
                OLD.fence_window, OLD.lock_lost_at, OLD.lock_mode, OLD.runner_release, OLD.runner_protocol,
                OLD.command_pgid, OLD.command_start_ticks, OLD.progress, OLD.progress_at)
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
            NEW.command_pgid, NEW.command_start_ticks, NEW.progress, NEW.progress_at)
           IS NOT DISTINCT FROM
           (OLD.host, OLD.pid, OLD.process_started_at, OLD.heartbeat_at, OLD.log_path, OLD.host_id, OLD.runner_start_ticks,
            OLD.fence_window, OLD.lock_lost_at, OLD.lock_mode, OLD.runner_release, OLD.runner_protocol,
            OLD.command_pgid, OLD.command_start_ticks, OLD.progress, OLD.progress_at) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'a member of dama_operator may not make this change to etl context %', OLD.etl_context_id
        USING ERRCODE = 'insufficient_privilege';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION data_manager.etl_contexts_held_to_its_run() SET search_path = pg_catalog, %I, pg_temp',
        (SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('river_job')));
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.etl_contexts_held_to_its_run() RETURNS trigger
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

-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION data_manager.etl_contexts_held_to_its_run() SET search_path = pg_catalog, %I, pg_temp',
        (SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = to_regclass('river_job')));
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_latest() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp AS $$
BEGIN
    UPDATE data_manager.etl_contexts AS c
       SET latest_event_id = n.latest
      FROM (SELECT e.etl_context_id, max(e.event_id) AS latest
              FROM new_events AS e
              JOIN data_manager.etl_contexts AS k ON k.etl_context_id = e.etl_context_id
             WHERE e.type <> k.kind || ':CANCEL_REQUESTED'
             GROUP BY e.etl_context_id) AS n
     WHERE c.etl_context_id = n.etl_context_id
       AND (c.latest_event_id IS NULL OR c.latest_event_id < n.latest);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

ALTER TABLE data_manager.etl_contexts DROP COLUMN progress, DROP COLUMN progress_at;
