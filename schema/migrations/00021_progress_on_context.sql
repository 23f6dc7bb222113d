-- A context keeps its latest progress. The view and the status page read
-- it from the context rather than by searching its events, and PROGRESS
-- events become a sample of it, one per progress_interval
-- (docs/tasks.md "Progress and checkpoints"). A task process sets it in
-- between; each PROGRESS event stored sets it too.
--
-- Additive: two nullable columns of etl_contexts (whose row a row-mode task
-- process never locks), a trigger function replaced in place, and the view
-- with a column added at its end.

-- +goose Up
ALTER TABLE data_manager.etl_contexts ADD COLUMN progress jsonb, ADD COLUMN progress_at timestamptz;

-- One index probe per context that has progress.
UPDATE data_manager.etl_contexts AS c
   SET progress = p.payload, progress_at = p.created_at
  FROM data_manager.etl_contexts AS k
  CROSS JOIN LATERAL (
        SELECT e.payload, e.created_at
          FROM data_manager.event_store AS e
         WHERE e.etl_context_id = k.etl_context_id
           AND e.type = k.kind || ':PROGRESS'
         ORDER BY e.event_id DESC
         LIMIT 1
  ) AS p
 WHERE c.etl_context_id = k.etl_context_id;

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

-- As in 00012, with the progress read from the context, and when it was
-- reported added.
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
       c.progress,
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
       ch.children,
       c.progress_at
  FROM data_manager.etl_contexts AS c
  LEFT JOIN river_job AS j ON j.id = c.river_job_id
  LEFT JOIN data_manager.event_store AS le ON le.event_id = c.latest_event_id
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
DROP VIEW data_manager.dama_task_queue;
-- As in 00012.
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
