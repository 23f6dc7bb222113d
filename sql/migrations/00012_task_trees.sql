-- Task trees (docs/tasks.md "Task trees"): a task's command submits children on
-- its events pipe, and a kind with await_children finishes once they have.
-- The announcement of a finished context names its parent, so that a task
-- process awaiting its children hears of theirs without counting at every
-- announcement; the view counts each task's children by status. Additive:
-- a new key in a JSON payload and a new column at the end of the view.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.etl_contexts_announce_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dama_task_finished', json_build_object(
        'etl_context_id', NEW.etl_context_id,
        'kind', NEW.kind,
        'queue', NEW.queue,
        'status', NEW.etl_status,
        'parent_context_id', NEW.parent_context_id)::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- As in 00008, with the task's children counted by status.
CREATE OR REPLACE VIEW data_manager.dama_task_queue AS
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
       c.lock_lost_at,
       c.lock_mode,
       c.runner_release,
       c.runner_protocol,
       coalesce(c.due_at, c.created_at)          AS due_at,
       -- A finished task waits for nothing, whatever it waited for before.
       CASE WHEN c.etl_status IN ('QUEUED', 'RETRYING') THEN c.waiting_for END   AS waiting_for,
       CASE WHEN c.etl_status IN ('QUEUED', 'RETRYING') THEN c.waiting_since END AS waiting_since,
       c.concurrency_key,
       ch.children
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
  LEFT JOIN (
        SELECT l.objid::bigint AS etl_context_id
          FROM pg_catalog.pg_locks AS l
         WHERE l.locktype = 'advisory'
           AND l.granted
           AND l.classid = 1684106593::oid
           AND l.objsubid = 2
           AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
  ) AS h ON h.etl_context_id = c.etl_context_id
  LEFT JOIN LATERAL (
        SELECT jsonb_object_agg(s.etl_status, s.n) AS children
          FROM (SELECT k.etl_status, count(*) AS n
                  FROM data_manager.etl_contexts AS k
                 WHERE k.parent_context_id = c.etl_context_id
                 GROUP BY k.etl_status) AS s
  ) AS ch ON true;

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.etl_contexts_announce_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dama_task_finished', json_build_object(
        'etl_context_id', NEW.etl_context_id,
        'kind', NEW.kind,
        'queue', NEW.queue,
        'status', NEW.etl_status)::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP VIEW data_manager.dama_task_queue;
-- As in 00008.
CREATE VIEW data_manager.dama_task_queue AS
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
       c.lock_lost_at,
       c.lock_mode,
       c.runner_release,
       c.runner_protocol,
       coalesce(c.due_at, c.created_at)          AS due_at,
       -- A finished task waits for nothing, whatever it waited for before.
       CASE WHEN c.etl_status IN ('QUEUED', 'RETRYING') THEN c.waiting_for END   AS waiting_for,
       CASE WHEN c.etl_status IN ('QUEUED', 'RETRYING') THEN c.waiting_since END AS waiting_since,
       c.concurrency_key
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
  LEFT JOIN (
        SELECT l.objid::bigint AS etl_context_id
          FROM pg_catalog.pg_locks AS l
         WHERE l.locktype = 'advisory'
           AND l.granted
           AND l.classid = 1684106593::oid
           AND l.objsubid = 2
           AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
  ) AS h ON h.etl_context_id = c.etl_context_id;
