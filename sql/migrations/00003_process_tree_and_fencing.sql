-- What a supervisor needs to know, for sure, that no process of an attempt
-- lives any more, and to time the fencing window on the database's clock;
-- and what a task process needs to retry a write without duplicating it.
-- Additive only: task processes of the previous release keep working.

-- +goose Up
ALTER TABLE data_manager.etl_contexts
    -- "<boot id>/<pid namespace>": pids are comparable only under one host id.
    ADD COLUMN host_id             text,
    -- Start times in clock ticks since boot: exact, unlike process_started_at.
    ADD COLUMN runner_start_ticks  bigint,
    -- The command's process group (its leader is the command).
    ADD COLUMN command_pgid        integer,
    ADD COLUMN command_start_ticks bigint,
    -- The longest a task process may go on unlocked: it stops its command
    -- within this long of its lock being released. Recorded by the task
    -- process from its own configuration.
    ADD COLUMN fence_window        interval,
    -- When a supervisor first found the lock free while the context was
    -- RUNNING (database clock); cleared by the task process when it re-takes
    -- its lock.
    ADD COLUMN lock_lost_at        timestamptz;

-- A task process numbers its events within its run, so that a write retried
-- after a lost connection is stored once.
ALTER TABLE data_manager.event_store ADD COLUMN seq integer;
CREATE UNIQUE INDEX event_store_run_seq ON data_manager.event_store (etl_context_id, run_id, seq)
    WHERE seq IS NOT NULL;

-- As in 00001, but a retried numbered event is skipped.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ctx    data_manager.etl_contexts%ROWTYPE;
    suffix text;
BEGIN
    -- A numbered event already stored (a retried write whose first try
    -- committed) is skipped before any other check: the context may have
    -- finished because of it.
    IF NEW.seq IS NOT NULL AND EXISTS (
        SELECT 1 FROM data_manager.event_store AS e
         WHERE e.etl_context_id = NEW.etl_context_id AND e.run_id = NEW.run_id AND e.seq = NEW.seq) THEN
        RETURN NULL;
    END IF;

    SELECT * INTO ctx FROM data_manager.etl_contexts
     WHERE etl_context_id = NEW.etl_context_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'etl context % does not exist', NEW.etl_context_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;

    IF left(NEW.type, length(ctx.kind) + 1) <> ctx.kind || ':' THEN
        RAISE EXCEPTION 'event type % does not belong to kind %', NEW.type, ctx.kind
            USING ERRCODE = 'check_violation';
    END IF;
    suffix := substr(NEW.type, length(ctx.kind) + 2);
    IF suffix !~ '^[A-Z][A-Z0-9_]{0,62}$' THEN
        RAISE EXCEPTION 'event type % must be <kind>:<TYPE> with TYPE in [A-Z0-9_]', NEW.type
            USING ERRCODE = 'check_violation';
    END IF;

    IF data_manager.is_finished(ctx.etl_status) THEN
        RAISE EXCEPTION 'etl context % is % and takes no more events', ctx.etl_context_id, ctx.etl_status
            USING ERRCODE = 'DMFIN';
    END IF;

    IF suffix = 'INITIAL' THEN
        IF ctx.initial_event_id IS NOT NULL THEN
            RAISE EXCEPTION 'etl context % already has its INITIAL event', ctx.etl_context_id
                USING ERRCODE = 'unique_violation';
        END IF;
    ELSIF NEW.run_id IS DISTINCT FROM ctx.run_id THEN
        RAISE EXCEPTION 'event % for etl context % comes from run %, not from the current run %',
            NEW.type, ctx.etl_context_id, NEW.run_id, ctx.run_id
            USING ERRCODE = 'DMRUN';
    ELSIF suffix IN ('FINAL', 'ERROR') AND ctx.etl_status <> 'RUNNING' THEN
        RAISE EXCEPTION 'etl context % is %, so it cannot end an attempt with %',
            ctx.etl_context_id, ctx.etl_status, NEW.type
            USING ERRCODE = 'DMRUN';
    END IF;

    NEW.attempt := ctx.attempt;
    NEW.error := NEW.error OR suffix = 'ERROR';
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- As in 00001, plus one edge: a launch whose task process never recorded
-- itself (pid NULL: no command ever started) may be abandoned, going back to
-- the status it had with its attempt number, so that a failure that says
-- nothing about the task (database unreachable, this host's log directory
-- unwritable) spends no attempt.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.etl_contexts_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF data_manager.is_finished(OLD.etl_status) THEN
        IF (NEW.etl_status, NEW.attempt, NEW.run_id, NEW.finished_at, NEW.kind, NEW.queue)
           IS DISTINCT FROM (OLD.etl_status, OLD.attempt, OLD.run_id, OLD.finished_at, OLD.kind, OLD.queue) THEN
            RAISE EXCEPTION 'etl context % is % and cannot be reopened or changed', OLD.etl_context_id, OLD.etl_status
                USING ERRCODE = 'DMFIN';
        END IF;
        RETURN NEW;
    END IF;

    IF OLD.etl_status = 'RUNNING'
       AND (NEW.etl_status = 'QUEUED' OR (NEW.etl_status = 'RETRYING' AND NEW.attempt <> OLD.attempt)) THEN
        IF OLD.pid IS NOT NULL OR NEW.pid IS NOT NULL OR NEW.attempt <> OLD.attempt - 1
           OR NEW.run_id IS DISTINCT FROM OLD.run_id
           OR (NEW.etl_status = 'QUEUED') <> (NEW.attempt = 0) THEN
            RAISE EXCEPTION 'etl context %: only a launch whose task process never started may be abandoned', OLD.etl_context_id
                USING ERRCODE = 'DMSTA';
        END IF;
        RETURN NEW;
    END IF;

    IF NEW.etl_status <> OLD.etl_status AND NOT (
           (OLD.etl_status = 'QUEUED'   AND NEW.etl_status IN ('RUNNING', 'CANCELLED'))
        OR (OLD.etl_status = 'RETRYING' AND NEW.etl_status IN ('RUNNING', 'CANCELLED'))
        OR (OLD.etl_status = 'RUNNING'  AND NEW.etl_status IN ('DONE', 'RETRYING', 'FAILED', 'CANCELLED'))
    ) THEN
        RAISE EXCEPTION 'etl context % cannot go from % to %', OLD.etl_context_id, OLD.etl_status, NEW.etl_status
            USING ERRCODE = 'DMSTA';
    END IF;

    -- A new attempt needs a new fencing token.
    IF NEW.etl_status = 'RUNNING' AND OLD.etl_status <> 'RUNNING'
       AND (NEW.run_id IS NULL OR NEW.run_id IS NOT DISTINCT FROM OLD.run_id OR NEW.attempt <= OLD.attempt) THEN
        RAISE EXCEPTION 'a new attempt of etl context % needs a new run id and a higher attempt number', OLD.etl_context_id
            USING ERRCODE = 'DMSTA';
    END IF;
    IF NEW.run_id IS DISTINCT FROM OLD.run_id AND NOT (NEW.etl_status = 'RUNNING' AND OLD.etl_status <> 'RUNNING') THEN
        RAISE EXCEPTION 'the run id of etl context % changes only when an attempt starts', OLD.etl_context_id
            USING ERRCODE = 'DMSTA';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE OR REPLACE VIEW data_manager.dama_task_queue AS
WITH held AS (
    SELECT l.objid::bigint AS etl_context_id
      FROM pg_catalog.pg_locks AS l
     WHERE l.locktype = 'advisory'
       AND l.granted
       AND l.classid = 1684106593::oid
       AND l.objsubid = 2
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
)
SELECT c.etl_context_id,
       c.parent_context_id,
       c.kind,
       c.queue,
       c.etl_status,
       c.attempt,
       coalesce(j.max_attempts, c.max_attempts) AS max_attempts,
       j.state::text                             AS job_state,
       j.scheduled_at,
       c.host,
       c.pid,
       c.created_at,
       c.started_at,
       c.finished_at,
       c.heartbeat_at,
       le.type                                   AS latest_event_type,
       le.created_at                             AS latest_event_at,
       p.payload                                 AS progress,
       (h.etl_context_id IS NOT NULL)            AS initial_event_locked,
       c.river_job_id,
       c.run_id,
       c.idempotency_key,
       c.cancel_requested_at,
       c.log_path,
       c.host_id,
       c.command_pgid,
       c.lock_lost_at
  FROM data_manager.etl_contexts AS c
  LEFT JOIN river_job AS j ON j.id = c.river_job_id
  LEFT JOIN data_manager.event_store AS le ON le.event_id = c.latest_event_id
  LEFT JOIN LATERAL (
        SELECT e.payload
          FROM data_manager.event_store AS e
         WHERE e.etl_context_id = c.etl_context_id
           AND e.type = c.kind || ':PROGRESS'
         ORDER BY e.event_id DESC
         LIMIT 1
  ) AS p ON true
  LEFT JOIN held AS h ON h.etl_context_id = c.etl_context_id;

-- +goose Down
DROP VIEW data_manager.dama_task_queue;
DROP INDEX data_manager.event_store_run_seq;
ALTER TABLE data_manager.event_store DROP COLUMN seq;
ALTER TABLE data_manager.etl_contexts
    DROP COLUMN host_id, DROP COLUMN runner_start_ticks, DROP COLUMN command_pgid,
    DROP COLUMN command_start_ticks, DROP COLUMN fence_window, DROP COLUMN lock_lost_at;
-- The guard keeps its abandon edge: it is harmless without the columns.
CREATE VIEW data_manager.dama_task_queue AS
WITH held AS (
    SELECT l.objid::bigint AS etl_context_id
      FROM pg_catalog.pg_locks AS l
     WHERE l.locktype = 'advisory'
       AND l.granted
       AND l.classid = 1684106593::oid
       AND l.objsubid = 2
       AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
)
SELECT c.etl_context_id,
       c.parent_context_id,
       c.kind,
       c.queue,
       c.etl_status,
       c.attempt,
       coalesce(j.max_attempts, c.max_attempts) AS max_attempts,
       j.state::text                             AS job_state,
       j.scheduled_at,
       c.host,
       c.pid,
       c.created_at,
       c.started_at,
       c.finished_at,
       c.heartbeat_at,
       le.type                                   AS latest_event_type,
       le.created_at                             AS latest_event_at,
       p.payload                                 AS progress,
       (h.etl_context_id IS NOT NULL)            AS initial_event_locked,
       c.river_job_id,
       c.run_id,
       c.idempotency_key,
       c.cancel_requested_at,
       c.log_path
  FROM data_manager.etl_contexts AS c
  LEFT JOIN river_job AS j ON j.id = c.river_job_id
  LEFT JOIN data_manager.event_store AS le ON le.event_id = c.latest_event_id
  LEFT JOIN LATERAL (
        SELECT e.payload
          FROM data_manager.event_store AS e
         WHERE e.etl_context_id = c.etl_context_id
           AND e.type = c.kind || ':PROGRESS'
         ORDER BY e.event_id DESC
         LIMIT 1
  ) AS p ON true
  LEFT JOIN held AS h ON h.etl_context_id = c.etl_context_id;
