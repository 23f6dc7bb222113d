-- One INSERT into River's river_job, whoever gives a task its job:
-- data_manager.enqueue_job(etl_context_id) inserts the job of a context as
-- River's InsertTx inserts a dama_task job (supervisor.TaskArgs; checked
-- by TestCreateTaskInsertsTheJobRiverWould), available now or scheduled
-- until the context is due, records it as the context's job, and sends
-- River's insert notification. create_task calls it for a new task;
-- `dama retry` for a task run again, and a supervisor for a context whose
-- job was deleted behind its back. The job starts at the context's
-- attempt (set once inserted: migration 19's trigger holds an operator's
-- insert to what River inserts), so that River's count of attempts and the
-- context's agree.
-- It runs with the caller's rights, which the triggers of migration 19 hold
-- to the caller's own.
-- +goose Up
-- +goose StatementBegin
DO $migration$
DECLARE
    river_schema text := (SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                           WHERE c.oid = to_regclass('river_job'));
BEGIN
    IF river_schema IS NULL THEN
        RAISE EXCEPTION 'river_job is not on the search_path: dama migrate runs River''s migrations first';
    END IF;
    EXECUTE format($enqueue_job$
CREATE FUNCTION data_manager.enqueue_job(etl_context_id bigint) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    c         record;
    job       bigint;
    job_state text;
BEGIN
    SELECT x.etl_context_id, x.kind, x.queue, x.max_attempts, x.due_at,
           -- A RUNNING context's attempt is under way: River counts it
           -- when it fetches the job.
           x.attempt - CASE WHEN x.etl_status = 'RUNNING' THEN 1 ELSE 0 END AS attempt INTO STRICT c
      FROM data_manager.etl_contexts AS x WHERE x.etl_context_id = enqueue_job.etl_context_id;
    job_state := CASE WHEN c.due_at > now() THEN 'scheduled' ELSE 'available' END;
    INSERT INTO %1$I.river_job (args, kind, max_attempts, metadata, priority, queue, scheduled_at, state, tags)
    VALUES (jsonb_build_object('etl_context_id', c.etl_context_id, 'kind', c.kind), 'dama_task', c.max_attempts,
            '{}', 1, c.queue, greatest(now(), coalesce(c.due_at, now())), job_state::%1$I.river_job_state, '{}')
    RETURNING id INTO job;
    -- Inserted as River inserts, which is what migration 19's trigger lets
    -- an operator insert; a retried task's job then starts at its attempt.
    IF c.attempt > 0 THEN
        UPDATE %1$I.river_job AS j SET attempt = c.attempt WHERE j.id = job;
    END IF;
    UPDATE data_manager.etl_contexts AS x SET river_job_id = job WHERE x.etl_context_id = c.etl_context_id;
    -- River's insert notification, which wakes the supervisors' producers
    -- of the queue when the transaction commits, on the channel River's
    -- listeners take: the schema of River's tables, then river_insert.
    IF job_state = 'available' THEN
        PERFORM pg_notify(%2$L, json_build_object('queue', c.queue)::text);
    END IF;
    RETURN job;
END
$$
$enqueue_job$, river_schema, river_schema || '.river_insert');

    EXECUTE format($create_task$
CREATE OR REPLACE FUNCTION data_manager.create_task(
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

    PERFORM data_manager.enqueue_job(etl_context_id);
END
$$
$create_task$);
END
$migration$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION data_manager.enqueue_job(bigint) FROM PUBLIC;

-- +goose Down
-- +goose StatementBegin
DO $migration$
DECLARE
    river_schema text := (SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                           WHERE c.oid = to_regclass('river_job'));
BEGIN
    EXECUTE format($create_task$
CREATE OR REPLACE FUNCTION data_manager.create_task(
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
END
$migration$;
-- +goose StatementEnd
DROP FUNCTION data_manager.enqueue_job(bigint);
