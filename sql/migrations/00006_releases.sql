-- Releases: which release of dama migrated the schema, what the schema still
-- accepts of the task processes of older releases, and which release ran
-- each attempt (docs/operations.md "Releases and upgrades"). Additive only: task
-- processes of earlier builds keep working.
--
-- ALTER TABLE needs a moment's ACCESS EXCLUSIVE lock on etl_contexts, which
-- the lock transaction of a row-mode task process of an unreleased build
-- holds a conflicting lock against for the task's life (from v0.1.0 on it
-- holds none on etl_contexts): dama migrate then fails after its
-- lock_timeout, having changed nothing, until those tasks have ended.

-- +goose Up
-- One row. min_runner_protocol is the oldest taskrunner.Protocol the schema
-- accepts: a task process of an older one refuses to start (exit 106), and
-- so does a supervisor. A migration raises it only once no task process of
-- an older protocol runs. migrated_by and migrated_at name the last
-- `dama migrate` run, so that an older release can say which one to run.
CREATE TABLE data_manager.compatibility (
    only_row            boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    min_runner_protocol integer NOT NULL CHECK (min_runner_protocol >= 1),
    migrated_by         text,
    migrated_at         timestamptz
);
INSERT INTO data_manager.compatibility (min_runner_protocol) VALUES (1);

-- The release and taskrunner.Protocol of the current attempt's task process;
-- NULL for one of an unreleased build (protocol 1).
ALTER TABLE data_manager.etl_contexts
    ADD COLUMN runner_release  text,
    ADD COLUMN runner_protocol integer;

-- As in 00005, with the lock mode and the runner's release and protocol.
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

-- +goose Down
DROP VIEW data_manager.dama_task_queue;
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
ALTER TABLE data_manager.etl_contexts DROP COLUMN runner_release, DROP COLUMN runner_protocol;
DROP TABLE data_manager.compatibility;
