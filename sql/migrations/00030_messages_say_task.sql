-- The database's messages say "task", as the CLI, the page and the docs
-- do: "task 42 is DONE and cannot be reopened or changed", not "etl
-- context 42 ...". Every function of data_manager that says "etl context
-- %" is created again from its own definition with those words changed,
-- and nothing else: its grants, owner, settings and body stay. Before this
-- migration no function said "task %", so Down restores them exactly.

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure
               FROM pg_catalog.pg_proc AS p
               JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
              WHERE n.nspname = 'data_manager' AND p.prosrc LIKE '%etl context \%%'
    LOOP
        EXECUTE replace(pg_catalog.pg_get_functiondef(f), 'etl context %', 'task %');
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure
               FROM pg_catalog.pg_proc AS p
               JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
              WHERE n.nspname = 'data_manager' AND p.prosrc LIKE '%task \%%'
    LOOP
        EXECUTE replace(pg_catalog.pg_get_functiondef(f), 'task %', 'etl context %');
    END LOOP;
END
$$;
-- +goose StatementEnd
