-- One row per context with its River job, the latest event, the latest
-- progress, and whether a live task process holds the context's lock. Row
-- locks do not appear in pg_locks, so the task process also holds an advisory
-- lock keyed (1684106593 = 'dama', etl_context_id); reading pg_locks takes no
-- lock, so querying this view never blocks a task.

-- +goose Up
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

-- +goose Down
DROP VIEW data_manager.dama_task_queue;
