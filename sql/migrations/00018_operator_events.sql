-- An operator writes only what an operator does (docs/security.md "Database roles"):
-- a submission's INITIAL, a cancellation's request, the CANCELLED of a
-- task that is not running, a retry's RETRIED. An outcome of a running
-- task (FINAL, ERROR, ...) is its task process's, or its supervisor's, to
-- write. The check applies to a member of dama_operator that is neither a
-- superuser nor a member of dama_supervisor or dama_task; it is void when
-- the roles do not exist (dama migrate could not create them).
--
-- Additive: it changes nothing for the roles dama ran as before.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION data_manager.event_store_by_role() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, data_manager, pg_temp AS $$
DECLARE
    suffix text := split_part(NEW.type, ':', 2);
BEGIN
    IF to_regrole('dama_operator') IS NULL OR to_regrole('dama_supervisor') IS NULL OR to_regrole('dama_task') IS NULL
       OR NOT pg_has_role(current_user, 'dama_operator', 'USAGE')
       OR pg_has_role(current_user, 'dama_supervisor', 'USAGE')
       OR pg_has_role(current_user, 'dama_task', 'USAGE')
       OR (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        RETURN NEW;
    END IF;
    IF suffix IN ('INITIAL', 'CANCEL_REQUESTED', 'RETRIED')
       OR (suffix = 'CANCELLED' AND NOT EXISTS (
            SELECT 1 FROM data_manager.etl_contexts
             WHERE etl_context_id = NEW.etl_context_id AND etl_status = 'RUNNING')) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'a member of dama_operator may not write a % event', suffix
        USING ERRCODE = 'insufficient_privilege';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER event_store_by_role BEFORE INSERT ON data_manager.event_store
    FOR EACH ROW EXECUTE FUNCTION data_manager.event_store_by_role();

-- +goose Down
DROP TRIGGER event_store_by_role ON data_manager.event_store;
DROP FUNCTION data_manager.event_store_by_role();
