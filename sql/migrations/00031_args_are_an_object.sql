-- data_manager.submit refuses arguments that are not a JSON object, as
-- dama submit, a Go program's Client, a command's children and schedules
-- do: a task reads its arguments as an object (DAMA_ARGS), and a kind's
-- concurrency_key names one of their fields. Only data_manager.submit, the
-- door of SQL users: create_task, which the task processes of the release
-- before call for their commands' children, accepts what it did, as
-- docs/operations.md promises them.
--
-- As in 00024, with the check before the task is made.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.submit(kind text, args jsonb DEFAULT '{}', idempotency_key text DEFAULT NULL,
                                               queue text DEFAULT NULL, run_at timestamptz DEFAULT NULL, parent bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    k     data_manager.kinds;
    known text;
BEGIN
    SELECT * INTO k FROM data_manager.kinds AS p WHERE p.kind = submit.kind;
    IF NOT FOUND THEN
        SELECT string_agg(p.kind, ', ' ORDER BY p.kind) INTO known FROM data_manager.kinds AS p;
        RAISE EXCEPTION 'unknown kind %: no supervisor has published it (data_manager.kinds has %)',
            coalesce(quote_literal(submit.kind), 'NULL'), coalesce(known, 'none')
            USING ERRCODE = 'DMKND';
    END IF;
    IF jsonb_typeof(coalesce(args, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'arguments must be a JSON object, not %', jsonb_typeof(args)
            USING ERRCODE = 'DMARG';
    END IF;
    IF starts_with(submit.idempotency_key, 'dama:') THEN
        RAISE EXCEPTION 'idempotency keys starting with "dama:" are dama''s own'
            USING ERRCODE = 'DMARG';
    END IF;
    IF submit.queue IS NOT NULL AND submit.queue <> k.queue AND submit.queue <> ALL(k.queues) THEN
        RAISE EXCEPTION 'queue %: the supervisor that published kind % serves %', quote_literal(submit.queue), k.kind,
            coalesce(nullif(array_to_string(k.queues, ', '), ''), k.queue)
            USING ERRCODE = 'DMARG';
    END IF;
    RETURN (data_manager.create_task(k.kind, args, submit.idempotency_key, coalesce(submit.queue, k.queue),
                                     k.max_attempts, k.concurrency_key, run_at, parent)).etl_context_id;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.submit(kind text, args jsonb DEFAULT '{}', idempotency_key text DEFAULT NULL,
                                               queue text DEFAULT NULL, run_at timestamptz DEFAULT NULL, parent bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    k     data_manager.kinds;
    known text;
BEGIN
    SELECT * INTO k FROM data_manager.kinds AS p WHERE p.kind = submit.kind;
    IF NOT FOUND THEN
        SELECT string_agg(p.kind, ', ' ORDER BY p.kind) INTO known FROM data_manager.kinds AS p;
        RAISE EXCEPTION 'unknown kind %: no supervisor has published it (data_manager.kinds has %)',
            coalesce(quote_literal(submit.kind), 'NULL'), coalesce(known, 'none')
            USING ERRCODE = 'DMKND';
    END IF;
    IF starts_with(submit.idempotency_key, 'dama:') THEN
        RAISE EXCEPTION 'idempotency keys starting with "dama:" are dama''s own'
            USING ERRCODE = 'DMARG';
    END IF;
    IF submit.queue IS NOT NULL AND submit.queue <> k.queue AND submit.queue <> ALL(k.queues) THEN
        RAISE EXCEPTION 'queue %: the supervisor that published kind % serves %', quote_literal(submit.queue), k.kind,
            coalesce(nullif(array_to_string(k.queues, ', '), ''), k.queue)
            USING ERRCODE = 'DMARG';
    END IF;
    RETURN (data_manager.create_task(k.kind, args, submit.idempotency_key, coalesce(submit.queue, k.queue),
                                     k.max_attempts, k.concurrency_key, run_at, parent)).etl_context_id;
END
$$;
-- +goose StatementEnd
