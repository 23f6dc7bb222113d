-- A task's arguments are a JSON object, however it is submitted: dama
-- submit refused 42, "x" and null, and now data_manager.submit, a Go
-- program's Client, a command's children and a schedule's tasks do too,
-- in data_manager.create_task, the one door they all go through. A task
-- reads its arguments as an object (DAMA_ARGS), and a kind's
-- concurrency_key names one of their fields. Tasks submitted before keep
-- theirs.
--
-- create_task is created again from its own definition (migration 27
-- wrote it for River's schema) with the check before the size's; Down
-- takes it out again.

-- +goose Up
-- +goose StatementBegin
DO $$
DECLARE
    def text := pg_catalog.pg_get_functiondef('data_manager.create_task(text, jsonb, text, text, integer, text, timestamptz, bigint)'::regprocedure);
    anchor text := E'    IF octet_length(args::text) > data_manager.max_args_bytes() THEN\n';
BEGIN
    IF pg_catalog.strpos(def, anchor) = 0 THEN
        RAISE EXCEPTION 'data_manager.create_task is not the one migration 27 made';
    END IF;
    EXECUTE replace(def, anchor, E'    IF jsonb_typeof(args) <> \'object\' THEN\n'
        || E'        RAISE EXCEPTION \'arguments must be a JSON object, not %\', jsonb_typeof(args) USING ERRCODE = \'DMARG\';\n'
        || E'    END IF;\n' || anchor);
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $$
DECLARE
    def text := pg_catalog.pg_get_functiondef('data_manager.create_task(text, jsonb, text, text, integer, text, timestamptz, bigint)'::regprocedure);
BEGIN
    EXECUTE replace(def, E'    IF jsonb_typeof(args) <> \'object\' THEN\n'
        || E'        RAISE EXCEPTION \'arguments must be a JSON object, not %\', jsonb_typeof(args) USING ERRCODE = \'DMARG\';\n'
        || E'    END IF;\n', '');
END
$$;
-- +goose StatementEnd
