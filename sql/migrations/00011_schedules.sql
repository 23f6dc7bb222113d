-- Periodic kinds (docs/operations.md "Schedules"): one row per scheduled kind says which
-- tick was last taken, so that every supervisor configuring the kind agrees
-- on it. A supervisor takes a tick by locking the row, in the transaction
-- that submits the tick's task: one task per tick however many supervisors
-- run. Additive: a new table and a new view.

-- +goose Up
-- last_tick: the last tick taken; last_outcome: what it did ('baseline'
-- when the schedule was first seen or changed, which submits nothing;
-- 'submitted'; 'skipped' when overlap is skip and a task of the kind was
-- unfinished); last_context_id: the task it submitted; next_tick: the tick
-- after, as the supervisor that took the last one computed it.
CREATE TABLE data_manager.schedules (
    kind            text PRIMARY KEY,
    schedule        text NOT NULL,
    timezone        text NOT NULL,
    overlap         text NOT NULL,
    last_tick       timestamptz NOT NULL,
    last_outcome    text NOT NULL CHECK (last_outcome IN ('baseline', 'submitted', 'skipped')),
    last_context_id bigint REFERENCES data_manager.etl_contexts (etl_context_id) ON DELETE SET NULL,
    next_tick       timestamptz,
    updated_by      text NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The schedules with the status of the task each last submitted.
CREATE VIEW data_manager.dama_schedules AS
SELECT s.kind,
       s.schedule,
       s.timezone,
       s.overlap,
       s.last_tick,
       s.last_outcome,
       s.last_context_id,
       c.etl_status AS last_status,
       s.next_tick,
       s.updated_by,
       s.updated_at
  FROM data_manager.schedules AS s
  LEFT JOIN data_manager.etl_contexts AS c ON c.etl_context_id = s.last_context_id;

-- +goose Down
DROP VIEW data_manager.dama_schedules;
DROP TABLE data_manager.schedules;
