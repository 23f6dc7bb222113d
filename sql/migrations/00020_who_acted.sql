-- Who acted, as the database saw it: the login role (session_user) of the
-- session that submitted, cancelled or retried a task, or paused, resumed,
-- blocked or unblocked, stamped by a trigger, whatever the writer says.
-- The "by" of an event and the actor of a control event are the writer's
-- words (dama's commands add the role to them too); these are not.
--
-- Additive: a trigger on event_store (which takes no lock a row-mode task
-- process's ROW SHARE waits for) and a nullable column of control_events.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION data_manager.event_store_who() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    who jsonb := jsonb_build_object('database_role', session_user::text);
BEGIN
    NEW.meta := CASE
        WHEN NEW.meta IS NULL OR jsonb_typeof(NEW.meta) = 'null' THEN who
        WHEN jsonb_typeof(NEW.meta) = 'object' THEN NEW.meta || who
        ELSE jsonb_build_object('meta', NEW.meta) || who
    END;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- Called only for the events it stamps: a burst of progress pays nothing.
CREATE TRIGGER event_store_who BEFORE INSERT ON data_manager.event_store
    FOR EACH ROW WHEN (split_part(NEW.type, ':', 2) IN ('INITIAL', 'CANCEL_REQUESTED', 'CANCELLED', 'RETRIED'))
    EXECUTE FUNCTION data_manager.event_store_who();

ALTER TABLE data_manager.control_events ADD COLUMN database_role text;

-- +goose StatementBegin
CREATE FUNCTION data_manager.control_events_who() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.database_role := session_user::text;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER control_events_who BEFORE INSERT ON data_manager.control_events
    FOR EACH ROW EXECUTE FUNCTION data_manager.control_events_who();

-- +goose Down
DROP TRIGGER control_events_who ON data_manager.control_events;
DROP FUNCTION data_manager.control_events_who();
ALTER TABLE data_manager.control_events DROP COLUMN database_role;
DROP TRIGGER event_store_who ON data_manager.event_store;
DROP FUNCTION data_manager.event_store_who();
