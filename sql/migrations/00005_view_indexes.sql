-- The view stays cheap on millions of contexts (docs/operations.md "Status with SQL",
-- scripts/bench-view.sh). Additive: an index and the same view.
--
-- Without a transaction, so that the index is built CONCURRENTLY: a plain
-- CREATE INDEX blocks every write to etl_contexts (submissions, status
-- changes) while it reads the whole table (a task's write times out after
-- 10 s). The concurrent build blocks no write; it waits instead for every
-- transaction of this database that holds a snapshot older than its own.
-- Task processes hold none (a row-mode lock transaction ends its query's
-- portal right after taking the lock). Nothing here waits for a row-mode
-- task's lock transaction, whose table locks (ACCESS SHARE, ROW SHARE) do
-- not conflict: DROP INDEX CONCURRENTLY would, so an invalid index that an
-- interrupted build left behind is renamed aside instead (drop it by hand,
-- DROP INDEX CONCURRENTLY, once no row-mode task runs).
-- +goose NO TRANSACTION

-- +goose Up
-- A build that runs for long is not a hung statement, and its wait for
-- older snapshots is no table lock held against the tasks' writes (dama
-- migrate's lock_timeout is for those).
SET statement_timeout = 0;
SET lock_timeout = 0;

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1
                 FROM pg_catalog.pg_index AS i
                 JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid
                 JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
                WHERE n.nspname = 'data_manager' AND c.relname = 'etl_contexts_status_id'
                  AND NOT i.indisvalid) THEN
        EXECUTE format('ALTER INDEX data_manager.etl_contexts_status_id RENAME TO %I',
                       'etl_contexts_status_id_invalid_' || to_char(clock_timestamp(), 'YYYYMMDDHH24MISS'));
    END IF;
END
$$;
-- +goose StatementEnd

-- Contexts in given statuses, newest first, however rare the status: the
-- existing (queue, etl_status) index cannot be searched by status alone, and
-- etl_contexts_unfinished holds no FAILED or CANCELLED context.
-- A valid one exists when a run was cut short after the build.
CREATE INDEX CONCURRENTLY IF NOT EXISTS etl_contexts_status_id ON data_manager.etl_contexts (etl_status, etl_context_id);

-- As in 00003, row for row and value for value, but with the advisory locks
-- joined as a subquery instead of a WITH clause: a view with a WITH clause is
-- never merged into the query that reads it (and the planner cannot inline
-- this one, pg_locks being volatile), so ORDER BY etl_context_id DESC LIMIT 50
-- joined and sorted every context. Merged, it reads the newest 50 by the
-- primary key.
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
  LEFT JOIN (
        SELECT l.objid::bigint AS etl_context_id
          FROM pg_catalog.pg_locks AS l
         WHERE l.locktype = 'advisory'
           AND l.granted
           AND l.classid = 1684106593::oid
           AND l.objsubid = 2
           AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
  ) AS h ON h.etl_context_id = c.etl_context_id;

-- +goose Down
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
DROP INDEX CONCURRENTLY IF EXISTS data_manager.etl_contexts_status_id;
