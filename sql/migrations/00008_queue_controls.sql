-- Queue controls (docs/operations.md "Queues"): an operator pauses a queue or blocks a
-- kind, a task records why it waits to start and when it is due, and
-- data_manager.dama_queue_stats counts what every queue holds. Additive, and
-- safe while task processes of v0.1.0 run: new tables, new nullable columns
-- on etl_contexts (ALTER TABLE holds ACCESS EXCLUSIVE on it for
-- milliseconds, rewriting nothing; no task process holds a lock there),
-- and views.

-- +goose Up
-- A paused queue starts nothing; its running tasks go on. The row is the
-- pause: `dama resume` deletes it.
CREATE TABLE data_manager.queue_pauses (
    queue     text PRIMARY KEY,
    reason    text NOT NULL DEFAULT '',
    paused_by text NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now()
);

-- A blocked kind starts nothing, in any queue; submissions are kept.
CREATE TABLE data_manager.kind_blocks (
    kind       text PRIMARY KEY,
    reason     text NOT NULL CHECK (reason <> ''),
    blocked_by text NOT NULL,
    blocked_at timestamptz NOT NULL DEFAULT now()
);

-- due_at: when the task may start first (its --run-at or --delay, else its
-- submission). concurrency_key: the value, taken from its arguments, that
-- its kind's max_running_per_key counts by. waiting_for and waiting_since:
-- why a QUEUED or RETRYING task that is due has not started, and since
-- when ('queue_paused', 'kind_blocked', 'queue_full', 'kind_full',
-- 'key_full'); NULL once it starts.
ALTER TABLE data_manager.etl_contexts
    ADD COLUMN due_at          timestamptz,
    ADD COLUMN concurrency_key text,
    ADD COLUMN waiting_for     text CHECK (waiting_for IN ('queue_paused', 'kind_blocked', 'queue_full', 'kind_full', 'key_full')),
    ADD COLUMN waiting_since   timestamptz;
-- Only for rows inserted from now on (an older release's submissions
-- included): a default set with ADD COLUMN would be stored for every
-- existing row. The rows before have none, and are read as due when they
-- were created: no backfill, which would hold ACCESS EXCLUSIVE on the table
-- while it rewrote every unfinished row.
ALTER TABLE data_manager.etl_contexts ALTER COLUMN due_at SET DEFAULT now();

-- As in 00006, with when the task is due, why it waits and its
-- concurrency key.
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

-- Per queue and kind: what waits, what runs, what finished in the last 24
-- hours, how long the oldest due task has waited, and whether the queue is
-- paused or the kind blocked. A paused queue or a blocked kind with no task
-- has a row of its own, with NULL kind or queue. Read from indexes of the
-- unfinished tasks and of the last day's finished ones (00009), so its cost
-- does not grow with the tasks finished before.
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

-- +goose Down
DROP VIEW data_manager.dama_queue_stats;
DROP VIEW data_manager.dama_task_queue;
-- As in 00006.
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
       c.runner_protocol
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
ALTER TABLE data_manager.etl_contexts
    DROP COLUMN due_at,
    DROP COLUMN concurrency_key,
    DROP COLUMN waiting_for,
    DROP COLUMN waiting_since;
DROP TABLE data_manager.kind_blocks;
DROP TABLE data_manager.queue_pauses;
