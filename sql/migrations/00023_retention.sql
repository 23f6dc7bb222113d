-- Retention (docs/operations.md "Retention"): a finished task tree older
-- than the supervisors' retention is removed with its events and attempts
-- by data_manager.remove_tasks, which only a supervisor may call
-- (etlcontext.Prune chooses the trees). It removes only whole trees of
-- finished tasks, and it alone may delete events: it says so in the
-- transaction's setting dama.pruning, which lets a DELETE through only as
-- its owner (inside it), and no role but the owner has the right to delete
-- events at all (a supervisor's is taken away by dama migrate's grants).
-- Nothing deletes an unfinished task's events.
--
-- Additive: a function, and a trigger function replaced in place (no lock
-- on event_store, which row-mode task processes hold for days).

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Inside remove_tasks, the current user is its owner: a session that
    -- only sets dama.pruning is not let through, whatever its rights.
    IF TG_OP = 'DELETE' AND current_setting('dama.pruning', true) = 'on'
       AND current_user = (SELECT pg_catalog.pg_get_userbyid(f.proowner) FROM pg_catalog.pg_proc AS f
                            WHERE f.oid = pg_catalog.to_regprocedure('data_manager.remove_tasks(bigint[])'))
       AND EXISTS (SELECT 1 FROM data_manager.etl_contexts AS c
                    WHERE c.etl_context_id = OLD.etl_context_id
                      AND data_manager.is_finished(c.etl_status)) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'data_manager.event_store keeps every event: % is refused', TG_OP
        USING ERRCODE = 'DMAPP';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION data_manager.remove_tasks(ids bigint[], OUT tasks bigint, OUT events bigint, OUT attempts bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp AS $$
DECLARE
    bad bigint;
BEGIN
    -- Locked in one order, so that two callers never wait for each other.
    PERFORM 1 FROM data_manager.etl_contexts WHERE etl_context_id = ANY(ids) ORDER BY etl_context_id FOR UPDATE;
    SELECT c.etl_context_id INTO bad
      FROM data_manager.etl_contexts AS c
     WHERE c.etl_context_id = ANY(ids)
       AND (NOT data_manager.is_finished(c.etl_status)
            OR (c.parent_context_id IS NOT NULL AND c.parent_context_id <> ALL(ids))
            OR EXISTS (SELECT 1 FROM data_manager.etl_contexts AS k
                        WHERE k.parent_context_id = c.etl_context_id AND k.etl_context_id <> ALL(ids)))
     LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'etl context % is not a finished task removed with its whole tree', bad
            USING ERRCODE = 'DMPRU';
    END IF;
    PERFORM set_config('dama.pruning', 'on', true);
    DELETE FROM data_manager.event_store WHERE etl_context_id = ANY(ids);
    GET DIAGNOSTICS events = ROW_COUNT;
    DELETE FROM data_manager.etl_attempts WHERE etl_context_id = ANY(ids);
    GET DIAGNOSTICS attempts = ROW_COUNT;
    DELETE FROM data_manager.etl_contexts WHERE etl_context_id = ANY(ids);
    GET DIAGNOSTICS tasks = ROW_COUNT;
    PERFORM set_config('dama.pruning', 'off', true);
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION data_manager.remove_tasks(bigint[]) FROM PUBLIC;

-- +goose Down
DROP FUNCTION data_manager.remove_tasks(bigint[]);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'data_manager.event_store keeps every event: % is refused', TG_OP
        USING ERRCODE = 'DMAPP';
END
$$;
-- +goose StatementEnd
