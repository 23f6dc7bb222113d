-- A kind's tasks submit as children only the kinds its configuration
-- names (children:, published in data_manager.kinds.children), none when
-- it names none. Per-kind users were only as strong as the weakest kind's
-- handling of its arguments: any command could submit any configured
-- kind, with arguments it chose, to run under that kind's user (root's).
--
-- The task process checks it before it writes; this trigger checks every
-- task made under a parent, however it is inserted (create_task, or an
-- INSERT through a task's login forged by its command), whoever inserts
-- it. It reads the published kinds, which a task's login may not: it runs
-- as the schema's owner.
--
-- AFTER INSERT: a child found by its idempotency key (a retried parent's)
-- is not inserted again, and not judged again; and the key checks of
-- etl_contexts_held_to_its_run, BEFORE, come first. children is NULL for a
-- kind that a release before this one published, which named none: its
-- tasks submit as before until a supervisor of this release publishes
-- the kind, so that an upgrade fails no tree on its way.

-- +goose Up
ALTER TABLE data_manager.kinds ADD COLUMN children text[];

-- +goose StatementBegin
CREATE FUNCTION data_manager.etl_contexts_child_allowed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    parent_kind text;
    named       text[];
BEGIN
    SELECT c.kind INTO parent_kind FROM data_manager.etl_contexts AS c WHERE c.etl_context_id = NEW.parent_context_id;
    -- A parent that does not exist is the foreign key's to refuse.
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT k.children INTO named FROM data_manager.kinds AS k WHERE k.kind = parent_kind;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'kind % may not submit kind %: no supervisor has published kind % with its children:', parent_kind, NEW.kind, parent_kind
            USING ERRCODE = 'DMARG';
    END IF;
    IF named IS NOT NULL AND array_position(named, NEW.kind) IS NULL THEN
        RAISE EXCEPTION 'kind % may not submit kind %: its children: are %', parent_kind, NEW.kind, named
            USING ERRCODE = 'DMARG';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER etl_contexts_child_allowed AFTER INSERT ON data_manager.etl_contexts
    FOR EACH ROW WHEN (NEW.parent_context_id IS NOT NULL)
    EXECUTE FUNCTION data_manager.etl_contexts_child_allowed();

-- +goose Down
DROP TRIGGER etl_contexts_child_allowed ON data_manager.etl_contexts;
DROP FUNCTION data_manager.etl_contexts_child_allowed();
ALTER TABLE data_manager.kinds DROP COLUMN children;
