-- Least privilege (docs/security.md "Database roles"): a role that may only append
-- events (a task process, an operator) still has them checked and
-- applied. The triggers that check an event, apply it to its context, and
-- keep the attempts, run with the rights of their owner, the tables' owner; each names the
-- schemas it reads, so that a caller's search_path cannot redirect it.
--
-- Additive, and safe while task processes of earlier releases run: the
-- functions do what they did, with their owner's rights.

-- +goose Up
ALTER FUNCTION data_manager.event_store_guard() SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp;
ALTER FUNCTION data_manager.event_store_apply() SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp;
ALTER FUNCTION data_manager.event_store_latest() SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp;
ALTER FUNCTION data_manager.etl_attempts_begin() SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp;
ALTER FUNCTION data_manager.etl_attempts_end() SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp;

-- A task process told to stop before its command started withdraws its
-- record (pid back to NULL, in the same run): the attempt it had begun is
-- no attempt. The trigger deletes it, so that a task process needs no
-- right to delete attempts.
-- +goose StatementBegin
CREATE FUNCTION data_manager.etl_attempts_withdrawn() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp AS $$
BEGIN
    DELETE FROM data_manager.etl_attempts
     WHERE etl_context_id = NEW.etl_context_id AND run_id = NEW.run_id AND ended_at IS NULL;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER etl_attempts_withdrawn AFTER UPDATE OF pid ON data_manager.etl_contexts
    FOR EACH ROW
    WHEN (OLD.pid IS NOT NULL AND NEW.pid IS NULL AND NEW.run_id = OLD.run_id
          AND NEW.etl_status = 'RUNNING' AND OLD.command_pgid IS NULL)
    EXECUTE FUNCTION data_manager.etl_attempts_withdrawn();

-- +goose Down
DROP TRIGGER etl_attempts_withdrawn ON data_manager.etl_contexts;
DROP FUNCTION data_manager.etl_attempts_withdrawn();
ALTER FUNCTION data_manager.etl_attempts_end() SECURITY INVOKER RESET search_path;
ALTER FUNCTION data_manager.etl_attempts_begin() SECURITY INVOKER RESET search_path;
ALTER FUNCTION data_manager.event_store_latest() SECURITY INVOKER RESET search_path;
ALTER FUNCTION data_manager.event_store_apply() SECURITY INVOKER RESET search_path;
ALTER FUNCTION data_manager.event_store_guard() SECURITY INVOKER RESET search_path;
