-- A task process takes its lock in one statement: lock_run checks that
-- the database accepts its protocol (refused with SQLSTATE DMPRO, before
-- any lock is taken), and, given the run's key (a lock keeper's, for the
-- session it serves), that the key is that of the task's current run
-- (DMRUN otherwise), then takes the task's session lock and returns the
-- task's row as it stands under the lock: no row when another session
-- holds the lock; DMNOT, with the lock released, when there is no such
-- task. Before, that was four statements through a lock keeper (the key's
-- check, the protocol's, the lock, the read), three on a connection of
-- the task process's own. The read is the function's own query, so it
-- sees what committed before the lock was taken (a VOLATILE function's
-- query takes a snapshot of its own).
--
-- Task processes of earlier releases do as they did: additive, one
-- function, with the rights of its caller (readers may read the tables it
-- reads, and any role may take an advisory lock).

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION data_manager.lock_run(id bigint, protocol integer, key text)
RETURNS SETOF data_manager.etl_contexts
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    accepted integer;
    migrated text;
BEGIN
    SELECT min_runner_protocol, 'dama ' || migrated_by INTO accepted, migrated FROM data_manager.compatibility;
    IF lock_run.protocol < accepted THEN
        RAISE EXCEPTION 'this one speaks protocol %, and the database, migrated by %, accepts % and later: run % or later',
            lock_run.protocol, coalesce(migrated, 'a newer release'), accepted, coalesce(migrated, 'a newer release')
            USING ERRCODE = 'DMPRO';
    END IF;
    IF key IS NOT NULL AND NOT EXISTS (
        SELECT FROM data_manager.etl_contexts AS c
         WHERE c.etl_context_id = id AND c.etl_status = 'RUNNING'
           AND c.runner_key_hash = sha256(convert_to(key, 'UTF8'))) THEN
        RAISE EXCEPTION 'the key is not that of task %''s current run', id USING ERRCODE = 'DMRUN';
    END IF;
    IF NOT pg_try_advisory_lock(1684106593, id::integer) THEN
        RETURN;
    END IF;
    -- A session lock outlives a failed statement: one that fails once the
    -- lock is taken (a cancel, a right revoked) lets it go, lest it be held
    -- for nobody on a keeper's lock session.
    BEGIN
        RETURN QUERY SELECT * FROM data_manager.etl_contexts AS c WHERE c.etl_context_id = id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task % not found', id USING ERRCODE = 'DMNOT';
        END IF;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM pg_advisory_unlock(1684106593, id::integer);
        RAISE;
    END;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION data_manager.lock_run(bigint, integer, text);
