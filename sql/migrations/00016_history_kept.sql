-- The database keeps the history (docs/architecture.md "The schema"): no role may delete
-- events or empty event_store, and a context's status changes to an
-- outcome (DONE, FAILED, CANCELLED, RETRYING after a failure) or back to
-- QUEUED for a retry only through its events, whose triggers apply them,
-- never by a plain UPDATE. Launches (QUEUED or RETRYING to RUNNING) and a
-- launch taken back (etl_contexts_guard checks both) are not outcomes and
-- stay direct updates.
--
-- The owner of the tables can still drop or disable these triggers: what
-- they refuse is an accident or a role that only has the table rights.
--
-- Additive, and safe while task processes of v0.1.0 run: they change
-- statuses only through their events.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION data_manager.event_store_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'data_manager.event_store keeps every event: % is refused', TG_OP
        USING ERRCODE = 'DMAPP';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER event_store_no_delete BEFORE DELETE ON data_manager.event_store
    FOR EACH ROW EXECUTE FUNCTION data_manager.event_store_append_only();
CREATE TRIGGER event_store_no_truncate BEFORE TRUNCATE ON data_manager.event_store
    FOR EACH STATEMENT EXECUTE FUNCTION data_manager.event_store_append_only();

-- +goose StatementBegin
CREATE FUNCTION data_manager.etl_contexts_status_by_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- event_store_apply's UPDATE runs one trigger deeper than a statement
    -- of a client's.
    IF pg_trigger_depth() < 2 AND NEW.etl_status IS DISTINCT FROM OLD.etl_status AND (
           NEW.etl_status IN ('DONE', 'FAILED', 'CANCELLED')
        OR (NEW.etl_status = 'RETRYING' AND NEW.attempt = OLD.attempt)
        OR (NEW.etl_status = 'QUEUED' AND data_manager.is_finished(OLD.etl_status))) THEN
        RAISE EXCEPTION 'etl context % goes from % to % only through its events', OLD.etl_context_id, OLD.etl_status, NEW.etl_status
            USING ERRCODE = 'DMSTA';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER etl_contexts_status_by_event BEFORE UPDATE OF etl_status ON data_manager.etl_contexts
    FOR EACH ROW EXECUTE FUNCTION data_manager.etl_contexts_status_by_event();

-- +goose Down
DROP TRIGGER etl_contexts_status_by_event ON data_manager.etl_contexts;
DROP FUNCTION data_manager.etl_contexts_status_by_event();
DROP TRIGGER event_store_no_truncate ON data_manager.event_store;
DROP TRIGGER event_store_no_delete ON data_manager.event_store;
DROP FUNCTION data_manager.event_store_append_only();
