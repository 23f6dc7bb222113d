-- Indexes for the queue controls of 00008: admission counts the running
-- tasks of a kind and of a concurrency key at every start, the wake-up of
-- waiting tasks reads them by queue and kind, and dama_queue_stats reads the
-- unfinished tasks and the last day's finished ones without the rest.
--
-- Built CONCURRENTLY, outside a transaction, for the reasons 00005 gives:
-- a plain CREATE INDEX blocks every write to etl_contexts while it reads the
-- whole table. An invalid index an interrupted build left behind is renamed
-- aside (drop it by hand, DROP INDEX CONCURRENTLY, once no row-mode task
-- runs) and built again.
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
           AND c.relname IN ('etl_contexts_running_kind', 'etl_contexts_waiting',
                             'etl_contexts_active', 'etl_contexts_finished_at')
           AND NOT i.indisvalid
    LOOP
        EXECUTE format('ALTER INDEX data_manager.%I RENAME TO %I',
                       name, name || '_invalid_' || to_char(clock_timestamp(), 'YYYYMMDDHH24MISS'));
    END LOOP;
END
$$;
-- +goose StatementEnd

-- Admission: the running tasks of a kind, and of a kind and key.
CREATE INDEX CONCURRENTLY IF NOT EXISTS etl_contexts_running_kind
    ON data_manager.etl_contexts (kind, concurrency_key) WHERE etl_status = 'RUNNING';
-- Wake-up: the due tasks that wait for a slot, by queue, kind and key,
-- oldest first.
CREATE INDEX CONCURRENTLY IF NOT EXISTS etl_contexts_waiting
    ON data_manager.etl_contexts (queue, kind, concurrency_key, etl_context_id)
    WHERE waiting_for IS NOT NULL AND etl_status IN ('QUEUED', 'RETRYING');
-- dama_queue_stats: the unfinished tasks, counted from the index (without
-- reading the table once VACUUM has marked its pages all-visible).
CREATE INDEX CONCURRENTLY IF NOT EXISTS etl_contexts_active
    ON data_manager.etl_contexts (queue, kind, etl_status, due_at) INCLUDE (created_at)
    WHERE etl_status IN ('QUEUED', 'RUNNING', 'RETRYING');
-- dama_queue_stats: the last day's finished tasks.
CREATE INDEX CONCURRENTLY IF NOT EXISTS etl_contexts_finished_at
    ON data_manager.etl_contexts (finished_at, queue, kind, etl_status) WHERE finished_at IS NOT NULL;

-- The migrations after this one in the same run keep dama migrate's limits.
RESET statement_timeout;
RESET lock_timeout;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS data_manager.etl_contexts_finished_at;
DROP INDEX CONCURRENTLY IF EXISTS data_manager.etl_contexts_active;
DROP INDEX CONCURRENTLY IF EXISTS data_manager.etl_contexts_waiting;
DROP INDEX CONCURRENTLY IF EXISTS data_manager.etl_contexts_running_kind;
