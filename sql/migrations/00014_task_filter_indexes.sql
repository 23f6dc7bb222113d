-- Indexes for the status page (dama web): the newest tasks of a kind, or
-- of a queue, read from an index rather than by walking every context
-- newest first until a page of that kind turns up; a parent's newest
-- children, without sorting all of a large tree's; and a task's newest
-- events, without sorting all of a days-long task's PROGRESS events.
--
-- Its Down drops them CONCURRENTLY too, as 00009's does: that waits for
-- the lock transactions of the row-mode tasks running then, so roll back
-- while none runs.
--
-- Built CONCURRENTLY, outside a transaction, as in 00009; an invalid index
-- an interrupted build left behind is renamed aside and built again.
-- +goose NO TRANSACTION

-- +goose Up
SET statement_timeout = 0;
SET lock_timeout = 0;

-- +goose StatementBegin
DO $$
DECLARE
    name text;
BEGIN
    FOR name IN
        SELECT c.relname
          FROM pg_catalog.pg_index AS i
          JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid
          JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
         WHERE n.nspname = 'data_manager'
           AND c.relname IN ('etl_contexts_kind_id', 'etl_contexts_queue_id', 'etl_contexts_parent_id',
                             'event_store_context_event')
           AND NOT i.indisvalid
    LOOP
        EXECUTE format('ALTER INDEX data_manager.%I RENAME TO %I',
                       name, name || '_invalid_' || to_char(clock_timestamp(), 'YYYYMMDDHH24MISS'));
    END LOOP;
END
$$;
-- +goose StatementEnd

CREATE INDEX CONCURRENTLY IF NOT EXISTS etl_contexts_kind_id
    ON data_manager.etl_contexts (kind, etl_context_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS etl_contexts_queue_id
    ON data_manager.etl_contexts (queue, etl_context_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS etl_contexts_parent_id
    ON data_manager.etl_contexts (parent_context_id, etl_context_id) WHERE parent_context_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS event_store_context_event
    ON data_manager.event_store (etl_context_id, event_id);

-- The migrations after this one in the same run keep dama migrate's limits.
RESET statement_timeout;
RESET lock_timeout;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS data_manager.event_store_context_event;
DROP INDEX CONCURRENTLY IF EXISTS data_manager.etl_contexts_parent_id;
DROP INDEX CONCURRENTLY IF EXISTS data_manager.etl_contexts_queue_id;
DROP INDEX CONCURRENTLY IF EXISTS data_manager.etl_contexts_kind_id;
