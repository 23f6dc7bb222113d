-- An index for the status page's tabs: the tasks of a kind counted in
-- each status (each count stops at 10,000), and the newest of a kind in a
-- status, read from an index rather than by walking all of the kind's
-- tasks for the few of one status (3 FAILED among 2 million DONE, read
-- every second by a page left open).
--
-- Built CONCURRENTLY, outside a transaction, as in 00014, whose Down this
-- one's follows; an invalid index an interrupted build left behind is
-- renamed aside and built again.
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
         WHERE n.nspname = 'data_manager' AND c.relname = 'etl_contexts_kind_status_id' AND NOT i.indisvalid
    LOOP
        EXECUTE format('ALTER INDEX data_manager.%I RENAME TO %I',
                       name, name || '_invalid_' || to_char(clock_timestamp(), 'YYYYMMDDHH24MISS'));
    END LOOP;
END
$$;
-- +goose StatementEnd

CREATE INDEX CONCURRENTLY IF NOT EXISTS etl_contexts_kind_status_id
    ON data_manager.etl_contexts (kind, etl_status, etl_context_id);

-- The migrations after this one in the same run keep dama migrate's limits.
RESET statement_timeout;
RESET lock_timeout;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS data_manager.etl_contexts_kind_status_id;
