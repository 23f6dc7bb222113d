-- The database's messages say "task", as the CLI, the page and the docs
-- do: "task 42 is DONE and cannot be reopened or changed", not "etl
-- context 42 ...". Each of dama's functions that says "etl context %" in
-- its body (by name, owned by the owner of dama's tables, and saying it
-- nowhere else: its name, its arguments) is created again from its own
-- definition with those words changed, and nothing else: its grants,
-- owner and settings stay. A function another role made in the schema is
-- left alone, lest the role that migrates make it again as its own.
-- Before this migration none of them said "task %", so Down restores
-- them exactly.

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    f    regprocedure;
    def  text;
    body text;
BEGIN
    FOR f, def, body IN
        SELECT p.oid::regprocedure, pg_catalog.pg_get_functiondef(p.oid), p.prosrc
          FROM pg_catalog.pg_proc AS p
          JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
         WHERE n.nspname = 'data_manager'
           AND p.proname IN ('append_log', 'create_task', 'etl_contexts_guard', 'etl_contexts_held_to_its_run',
                             'etl_contexts_status_by_event', 'event_store_by_role', 'event_store_guard',
                             'lock_initial_event', 'remove_tasks')
           AND p.proowner = (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = 'data_manager.etl_contexts'::regclass)
           AND p.prosrc LIKE '%etl context \%%'
    LOOP
        IF pg_catalog.length(def) - pg_catalog.length(replace(def, 'etl context %', ''))
           <> pg_catalog.length(body) - pg_catalog.length(replace(body, 'etl context %', '')) THEN
            RAISE EXCEPTION 'function % says "etl context %%" outside its body', f;
        END IF;
        EXECUTE replace(def, 'etl context %', 'task %');
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    f    regprocedure;
    def  text;
    body text;
BEGIN
    FOR f, def, body IN
        SELECT p.oid::regprocedure, pg_catalog.pg_get_functiondef(p.oid), p.prosrc
          FROM pg_catalog.pg_proc AS p
          JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
         WHERE n.nspname = 'data_manager'
           AND p.proname IN ('append_log', 'create_task', 'etl_contexts_guard', 'etl_contexts_held_to_its_run',
                             'etl_contexts_status_by_event', 'event_store_by_role', 'event_store_guard',
                             'lock_initial_event', 'remove_tasks')
           AND p.proowner = (SELECT c.relowner FROM pg_catalog.pg_class AS c WHERE c.oid = 'data_manager.etl_contexts'::regclass)
           AND p.prosrc LIKE '%task \%%'
    LOOP
        IF pg_catalog.length(def) - pg_catalog.length(replace(def, 'task %', ''))
           <> pg_catalog.length(body) - pg_catalog.length(replace(body, 'task %', '')) THEN
            RAISE EXCEPTION 'function % says "task %%" outside its body', f;
        END IF;
        EXECUTE replace(def, 'task %', 'etl context %');
    END LOOP;
END
$$;
-- +goose StatementEnd
