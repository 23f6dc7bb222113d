-- The view's job_state no longer contradicts etl_status where the
-- contradiction is dama's mechanism, not news: a due task that waits for a
-- slot has its job parked ('scheduled' an hour ahead, woken when a slot
-- frees), shown 'available'; a running task's job, given back by its hold
-- (every 30 minutes, and while no supervisor runs) to be held again, is
-- 'running'; a finished task whose job is not finalized yet is
-- 'finalizing'. Any other pair is River's own state, a contradiction
-- included: that one is worth seeing (a running task whose job is
-- 'scheduled' waits out a lost lock; a job finalized by hand, or one a
-- rescuer took), and reconciliation ends it.
-- due_at is when the task may next start, a retry's backoff included.
-- scheduled_at stays River's, for the readers of the release before.
--
-- A migration of its own, as 00022 says.

-- +goose Up
CREATE OR REPLACE VIEW data_manager.dama_task_queue AS
SELECT c.etl_context_id,
       c.parent_context_id,
       c.kind,
       c.queue,
       c.etl_status,
       c.attempt,
       coalesce(j.max_attempts, c.max_attempts) AS max_attempts,
       CASE WHEN c.etl_status IN ('DONE', 'FAILED', 'CANCELLED') AND j.finalized_at IS NULL THEN 'finalizing'
            WHEN c.etl_status IN ('QUEUED', 'RETRYING') AND c.waiting_for IS NOT NULL
                 AND j.state = 'scheduled' THEN 'available'
            WHEN c.etl_status = 'RUNNING' AND j.state = 'available' THEN 'running'
            ELSE j.state::text
       END                                       AS job_state,
       j.scheduled_at,
       c.host,
       c.pid,
       c.created_at,
       c.started_at,
       c.finished_at,
       c.heartbeat_at,
       le.type                                   AS latest_event_type,
       le.created_at                             AS latest_event_at,
       -- Contexts from before migration 21 keep their progress in their
       -- events: looked for only when the context has none.
       CASE WHEN c.progress_at IS NOT NULL THEN c.progress
            ELSE (SELECT e.payload
                    FROM data_manager.event_store AS e
                   WHERE e.etl_context_id = c.etl_context_id
                     AND e.type = c.kind || ':PROGRESS'
                   ORDER BY e.event_id DESC
                   LIMIT 1)
       END                                       AS progress,
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
       -- When the task may next start: its retry's backoff ends when River
       -- says so.
       CASE WHEN c.etl_status = 'RETRYING' AND j.state = 'retryable' THEN j.scheduled_at
            ELSE coalesce(c.due_at, c.created_at)
       END                                       AS due_at,
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
-- As in 00022.
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
       -- Contexts from before migration 21 keep their progress in their
       -- events: looked for only when the context has none.
       CASE WHEN c.progress_at IS NOT NULL THEN c.progress
            ELSE (SELECT e.payload
                    FROM data_manager.event_store AS e
                   WHERE e.etl_context_id = c.etl_context_id
                     AND e.type = c.kind || ':PROGRESS'
                   ORDER BY e.event_id DESC
                   LIMIT 1)
       END                                       AS progress,
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

