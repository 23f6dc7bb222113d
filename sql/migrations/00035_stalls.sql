-- A running task whose command reported nothing for its kind's
-- stall_after is marked stalled by its task process (docs/tasks.md
-- "Retries and timeouts") with a STALLED event, which holds the mark
-- while it is the task's latest: any later event, the command's next
-- report's or the attempt's end, clears it. So the mark needs no column,
-- no trigger and no right of its own: the events' guards already let a
-- task's run alone write it, and a report costs nothing more.
-- dama_task_queue shows it in stalled (the event's payload: stall_after,
-- last_at, on_stall), and dama_queue_stats counts it per queue and kind
-- (dama_tasks_stalled).
--
-- Only views are replaced, each locking itself alone (see 00022).

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
       c.progress_at,
       -- The mark holds while the task's STALLED event is its latest:
       -- whatever the command reports next moves it on.
       CASE WHEN c.etl_status = 'RUNNING' AND le.type = c.kind || ':STALLED' THEN le.payload END AS stalled
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

CREATE OR REPLACE VIEW data_manager.dama_queue_stats AS
WITH active AS (
    SELECT queue, kind,
           count(*) FILTER (WHERE etl_status = 'QUEUED' AND coalesce(due_at, created_at) <= now()) AS queued,
           count(*) FILTER (WHERE etl_status = 'QUEUED' AND coalesce(due_at, created_at) > now())  AS scheduled,
           count(*) FILTER (WHERE etl_status = 'RUNNING')                                           AS running,
           count(*) FILTER (WHERE etl_status = 'RETRYING')                                          AS retrying,
           min(coalesce(due_at, created_at))
               FILTER (WHERE etl_status = 'QUEUED' AND coalesce(due_at, created_at) <= now())       AS oldest_due_at
      FROM data_manager.etl_contexts
     WHERE etl_status IN ('QUEUED', 'RUNNING', 'RETRYING')
     GROUP BY queue, kind),
recent AS (
    SELECT queue, kind,
           count(*) FILTER (WHERE etl_status = 'DONE')      AS done_24h,
           count(*) FILTER (WHERE etl_status = 'FAILED')    AS failed_24h,
           count(*) FILTER (WHERE etl_status = 'CANCELLED') AS cancelled_24h
      FROM data_manager.etl_contexts
     WHERE finished_at > now() - interval '24 hours'
     GROUP BY queue, kind),
-- Apart from active, which reads an index alone: the few running tasks
-- are read with their latest event.
stalled AS (
    SELECT c.queue, c.kind, count(*) AS stalled
      FROM data_manager.etl_contexts AS c
      JOIN data_manager.event_store AS e ON e.event_id = c.latest_event_id
     WHERE c.etl_status = 'RUNNING' AND e.type = c.kind || ':STALLED'
     GROUP BY c.queue, c.kind),
pairs AS (
    SELECT queue, kind FROM active
    UNION
    SELECT queue, kind FROM recent)
SELECT coalesce(pr.queue, qp.queue)                    AS queue,
       coalesce(pr.kind, kb.kind)                      AS kind,
       coalesce(a.queued, 0)                           AS queued,
       coalesce(a.scheduled, 0)                        AS scheduled,
       coalesce(a.running, 0)                          AS running,
       coalesce(a.retrying, 0)                         AS retrying,
       coalesce(r.done_24h, 0)                         AS done_24h,
       coalesce(r.failed_24h, 0)                       AS failed_24h,
       coalesce(r.cancelled_24h, 0)                    AS cancelled_24h,
       now() - a.oldest_due_at                         AS oldest_waiting,
       (qp.queue IS NOT NULL)                          AS paused,
       qp.reason                                       AS pause_reason,
       qp.paused_at,
       (kb.kind IS NOT NULL)                           AS blocked,
       kb.reason                                       AS block_reason,
       kb.blocked_at,
       coalesce(s.stalled, 0)                          AS stalled
  FROM pairs AS pr
  LEFT JOIN active AS a ON a.queue = pr.queue AND a.kind = pr.kind
  LEFT JOIN stalled AS s ON s.queue = pr.queue AND s.kind = pr.kind
  LEFT JOIN recent AS r ON r.queue = pr.queue AND r.kind = pr.kind
  FULL JOIN data_manager.queue_pauses AS qp ON qp.queue = pr.queue
  FULL JOIN data_manager.kind_blocks AS kb ON kb.kind = pr.kind;

-- +goose Down
DROP VIEW data_manager.dama_queue_stats;
DROP VIEW data_manager.dama_task_queue;
-- As in 00029.
CREATE VIEW data_manager.dama_task_queue AS
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
-- As in 00008.
CREATE VIEW data_manager.dama_queue_stats AS
WITH active AS (
    SELECT queue, kind,
           count(*) FILTER (WHERE etl_status = 'QUEUED' AND coalesce(due_at, created_at) <= now()) AS queued,
           count(*) FILTER (WHERE etl_status = 'QUEUED' AND coalesce(due_at, created_at) > now())  AS scheduled,
           count(*) FILTER (WHERE etl_status = 'RUNNING')                                           AS running,
           count(*) FILTER (WHERE etl_status = 'RETRYING')                                          AS retrying,
           min(coalesce(due_at, created_at))
               FILTER (WHERE etl_status = 'QUEUED' AND coalesce(due_at, created_at) <= now())       AS oldest_due_at
      FROM data_manager.etl_contexts
     WHERE etl_status IN ('QUEUED', 'RUNNING', 'RETRYING')
     GROUP BY queue, kind),
recent AS (
    SELECT queue, kind,
           count(*) FILTER (WHERE etl_status = 'DONE')      AS done_24h,
           count(*) FILTER (WHERE etl_status = 'FAILED')    AS failed_24h,
           count(*) FILTER (WHERE etl_status = 'CANCELLED') AS cancelled_24h
      FROM data_manager.etl_contexts
     WHERE finished_at > now() - interval '24 hours'
     GROUP BY queue, kind),
pairs AS (
    SELECT queue, kind FROM active
    UNION
    SELECT queue, kind FROM recent)
SELECT coalesce(pr.queue, qp.queue)                    AS queue,
       coalesce(pr.kind, kb.kind)                      AS kind,
       coalesce(a.queued, 0)                           AS queued,
       coalesce(a.scheduled, 0)                        AS scheduled,
       coalesce(a.running, 0)                          AS running,
       coalesce(a.retrying, 0)                         AS retrying,
       coalesce(r.done_24h, 0)                         AS done_24h,
       coalesce(r.failed_24h, 0)                       AS failed_24h,
       coalesce(r.cancelled_24h, 0)                    AS cancelled_24h,
       now() - a.oldest_due_at                         AS oldest_waiting,
       (qp.queue IS NOT NULL)                          AS paused,
       qp.reason                                       AS pause_reason,
       qp.paused_at,
       (kb.kind IS NOT NULL)                           AS blocked,
       kb.reason                                       AS block_reason,
       kb.blocked_at
  FROM pairs AS pr
  LEFT JOIN active AS a ON a.queue = pr.queue AND a.kind = pr.kind
  LEFT JOIN recent AS r ON r.queue = pr.queue AND r.kind = pr.kind
  FULL JOIN data_manager.queue_pauses AS qp ON qp.queue = pr.queue
  FULL JOIN data_manager.kind_blocks AS kb ON kb.kind = pr.kind;
