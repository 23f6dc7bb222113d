-- Submitting from SQL (docs/tasks.md "Submitting from SQL"): any program
-- that can reach the database submits a task in its own transaction with
-- data_manager.submit, which refuses a kind no supervisor has published in
-- data_manager.kinds. Every submission, dama's own (etlcontext.CreateTask)
-- among them, makes its task with data_manager.create_task: the context,
-- its INITIAL event and its River job, inserted as River's InsertTx
-- inserts it (River v0.51.1, supervisor/riverinternals.go), so that a task
-- is made one way whoever makes it.
--
-- Both functions run with the caller's rights (SECURITY INVOKER): the
-- triggers of migration 19 hold the caller to what its roles may submit
-- (an operator, under keys of its own; a task process, children of its
-- own run), exactly as they hold a submission made statement by statement.
-- Their search_path is pg_catalog's alone, and River's tables are named in
-- their schema, written into the functions when they are made (below): a
-- function or operator someone put in River's schema (public, often) is
-- never called by a submission, whoever submits.
--
-- Additive: a table and functions.

-- +goose Up
-- The kinds the supervisors run, as each last published them at its start
-- (supervisor.New): the queue and attempts a submission takes, the field of
-- the arguments that is the concurrency key, the queues the supervisor
-- serves (those a submission may name), and the kind's whole setting for
-- readers. A kind no supervisor configures any more stays until it is
-- deleted (docs/operations.md "Kinds").
CREATE TABLE data_manager.kinds (
    kind            text PRIMARY KEY CHECK (kind ~ '^[A-Za-z][A-Za-z0-9_.-]{0,62}$'),
    queue           text NOT NULL,
    max_attempts    integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 32767),
    concurrency_key text,
    queues          text[] NOT NULL DEFAULT '{}',
    settings        jsonb NOT NULL DEFAULT '{}',
    published_by    text NOT NULL,
    release         text NOT NULL,
    published_at    timestamptz NOT NULL DEFAULT now()
);

-- The most bytes a task's arguments may take as jsonb prints them: a task
-- receives them in DAMA_ARGS (protocol.MaxEnvPayload, which a test holds
-- equal to this).
CREATE FUNCTION data_manager.max_args_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$ SELECT 98304 $$;

-- The concurrency key of a task whose kind's concurrency_key is field
-- ("region", "source.region"): the value there, a string as itself and
-- anything else as jsonb prints it; NULL when field is NULL. Arguments that
-- lack the field, hold null there, or a key over 512 bytes
-- (config.MaxConcurrencyKey) are refused, or give NULL when not strict. The
-- one rule of a key, whoever submits (create_task) or derives it later
-- (etlcontext.DeriveConcurrencyKey).
-- +goose StatementBegin
CREATE FUNCTION data_manager.concurrency_key_of(args jsonb, field text, strict boolean DEFAULT true) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v   jsonb := args;
    key text;
    f   text;
BEGIN
    IF field IS NULL OR field = '' THEN
        RETURN NULL;
    END IF;
    FOREACH f IN ARRAY string_to_array(field, '.') LOOP
        IF v IS NULL OR jsonb_typeof(v) <> 'object' THEN
            v := NULL;
            EXIT;
        END IF;
        v := v -> f;
    END LOOP;
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        IF NOT strict THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'the arguments have no field %, the kind''s concurrency_key', field
            USING ERRCODE = 'DMARG';
    END IF;
    key := CASE WHEN jsonb_typeof(v) = 'string' THEN v #>> '{}' ELSE v::text END;
    -- The key is indexed while the task runs: a longer one would be
    -- accepted now and refused at every launch.
    IF octet_length(key) > 512 THEN
        IF NOT strict THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'the arguments'' % (the kind''s concurrency_key) is % bytes: at most 512', field, octet_length(key)
            USING ERRCODE = 'DMARG';
    END IF;
    RETURN key;
END
$$;
-- +goose StatementEnd

-- data_manager.create_task makes a task: its context (QUEUED), its INITIAL
-- event holding args, and the River job that steps it, in the caller's
-- transaction. With a key a context holds already, it makes nothing and
-- returns that context (created false), which must be of kind (SQLSTATE
-- DMKEY otherwise). It trusts kind, queue and max_attempts:
-- data_manager.submit takes them from data_manager.kinds, dama's own
-- submissions from their configuration.
--
-- data_manager.submit submits a task of a published kind in the caller's
-- transaction and returns its etl context id: the one a context of
-- idempotency_key holds already, if any. queue overrides the kind's (it
-- must be one the supervisor that published the kind serves); run_at
-- delays the first start; parent makes it a child. Keys starting with
-- "dama:" are dama's own.
--
-- Both are made here, with River's schema written into them (%1$I).
-- +goose StatementBegin
DO $migration$
DECLARE
    river_schema text := (SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                           WHERE c.oid = to_regclass('river_job'));
BEGIN
    IF river_schema IS NULL THEN
        RAISE EXCEPTION 'river_job is not on the search_path: dama migrate runs River''s migrations first';
    END IF;
    EXECUTE format($create_task$
CREATE FUNCTION data_manager.create_task(
    kind text, args jsonb, idempotency_key text, queue text, max_attempts integer,
    concurrency_field text, run_at timestamptz, parent bigint,
    OUT etl_context_id bigint, OUT created boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    task_kind   text := kind;
    task_key    text := nullif(idempotency_key, '');
    task_queue  text := queue;
    other_kind  text;
    job         bigint;
    job_state   text;
BEGIN
    args := coalesce(args, '{}');
    IF octet_length(args::text) > data_manager.max_args_bytes() THEN
        RAISE EXCEPTION 'arguments are %% bytes as stored; a task receives them in DAMA_ARGS, which holds at most %%',
            octet_length(args::text), data_manager.max_args_bytes()
            USING ERRCODE = 'DMARG';
    END IF;
    -- River's rule for a queue's name (validateQueueName).
    IF task_queue IS NULL OR length(task_queue) > 64 OR task_queue !~ '^[a-z0-9]+([_|-]?[a-z0-9]+)*$' THEN
        RAISE EXCEPTION 'queue %%: want at most 64 lowercase letters and digits, separated by single underscores or hyphens', coalesce(quote_literal(task_queue), 'NULL')
            USING ERRCODE = 'DMARG';
    END IF;
    -- As protocol.MaxIdempotencyKey.
    IF octet_length(task_key) > 512 THEN
        RAISE EXCEPTION 'idempotency key of %% bytes: at most 512', octet_length(task_key)
            USING ERRCODE = 'DMARG';
    END IF;
    -- A time River and dama read back: not infinity.
    IF run_at IS NOT NULL AND NOT isfinite(run_at) THEN
        RAISE EXCEPTION 'run_at %%: want a finite time', run_at
            USING ERRCODE = 'DMARG';
    END IF;
    IF parent IS NOT NULL AND NOT EXISTS (SELECT 1 FROM data_manager.etl_contexts AS c WHERE c.etl_context_id = parent) THEN
        RAISE EXCEPTION 'parent etl context %% does not exist', parent
            USING ERRCODE = 'DMARG';
    END IF;

    LOOP
        INSERT INTO data_manager.etl_contexts AS c (parent_context_id, kind, queue, max_attempts, idempotency_key, concurrency_key, due_at)
        VALUES (parent, task_kind, task_queue, max_attempts, task_key,
                data_manager.concurrency_key_of(args, concurrency_field), greatest(now(), coalesce(run_at, now())))
        ON CONFLICT ON CONSTRAINT etl_contexts_idempotency_key_key DO NOTHING
        RETURNING c.etl_context_id INTO etl_context_id;
        EXIT WHEN etl_context_id IS NOT NULL;
        -- The key's unique index made a concurrent insert of it wait for
        -- its holder to commit; this statement's snapshot, newer than that
        -- commit, sees the holder (under REPEATABLE READ the insert fails
        -- instead), so two submissions of one key with different kinds
        -- never both succeed. A holder removed meanwhile (retention) frees
        -- the key: the insert is made again.
        SELECT c.etl_context_id, c.kind INTO etl_context_id, other_kind
          FROM data_manager.etl_contexts AS c WHERE c.idempotency_key = task_key;
        CONTINUE WHEN etl_context_id IS NULL;
        IF other_kind IS DISTINCT FROM task_kind THEN
            RAISE EXCEPTION 'idempotency key belongs to a task of another kind: %% is the key of etl context %%, of kind %%',
                to_json(task_key)::text, etl_context_id, other_kind
                USING ERRCODE = 'DMKEY';
        END IF;
        created := false;
        RETURN;
    END LOOP;
    created := true;

    INSERT INTO data_manager.event_store (etl_context_id, type, payload)
    VALUES (etl_context_id, task_kind || ':INITIAL', args);

    -- As River's InsertTx inserts a dama_task job (supervisor.TaskArgs):
    -- available now, or scheduled until run_at.
    job_state := CASE WHEN run_at > now() THEN 'scheduled' ELSE 'available' END;
    INSERT INTO %1$I.river_job (args, kind, max_attempts, metadata, priority, queue, scheduled_at, state, tags)
    VALUES (jsonb_build_object('etl_context_id', etl_context_id, 'kind', task_kind), 'dama_task', max_attempts,
            '{}', 1, task_queue, greatest(now(), coalesce(run_at, now())), job_state::%1$I.river_job_state, '{}')
    RETURNING id INTO job;
    UPDATE data_manager.etl_contexts AS c SET river_job_id = job WHERE c.etl_context_id = create_task.etl_context_id;

    -- River's insert notification, which wakes the supervisors' producers
    -- of the queue when the transaction commits, on the channel River's
    -- listeners take: the schema of River's tables, then river_insert.
    IF job_state = 'available' THEN
        PERFORM pg_notify(%2$L, json_build_object('queue', task_queue)::text);
    END IF;
END
$$
$create_task$, river_schema, river_schema || '.river_insert');

    EXECUTE $submit$
CREATE FUNCTION data_manager.submit(
    kind text, args jsonb DEFAULT '{}', idempotency_key text DEFAULT NULL, queue text DEFAULT NULL,
    run_at timestamptz DEFAULT NULL, parent bigint DEFAULT NULL) RETURNS bigint
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
$$
$submit$;
END
$migration$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION data_manager.create_task(text, jsonb, text, text, integer, text, timestamptz, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION data_manager.submit(text, jsonb, text, text, timestamptz, bigint) FROM PUBLIC;

-- +goose Down
DROP FUNCTION data_manager.submit(text, jsonb, text, text, timestamptz, bigint);
DROP FUNCTION data_manager.create_task(text, jsonb, text, text, integer, text, timestamptz, bigint);
DROP FUNCTION data_manager.concurrency_key_of(jsonb, text, boolean);
DROP FUNCTION data_manager.max_args_bytes();
DROP TABLE data_manager.kinds;
