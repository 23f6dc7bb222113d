-- Retry policies (docs/tasks.md "Retries and timeouts"): an ERROR event whose
-- payload says "retry": false fails the task whatever attempts remain (an
-- exit code the kind says not to retry, a timeout with on_timeout: fail),
-- and `dama retry` reopens a FAILED or CANCELLED task with a RETRIED event,
-- keeping its attempt number and its checkpoints. Functions only: nothing
-- changes for the task processes of v0.1.0, which never write either.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ctx    data_manager.etl_contexts%ROWTYPE;
    suffix text;
BEGIN
    -- A numbered event already stored (a retried write whose first try
    -- committed) is skipped before any other check: the context may have
    -- finished because of it.
    IF NEW.seq IS NOT NULL AND EXISTS (
        SELECT 1 FROM data_manager.event_store AS e
         WHERE e.etl_context_id = NEW.etl_context_id AND e.run_id = NEW.run_id AND e.seq = NEW.seq) THEN
        RETURN NULL;
    END IF;

    SELECT * INTO ctx FROM data_manager.etl_contexts
     WHERE etl_context_id = NEW.etl_context_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'etl context % does not exist', NEW.etl_context_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;

    IF left(NEW.type, length(ctx.kind) + 1) <> ctx.kind || ':' THEN
        RAISE EXCEPTION 'event type % does not belong to kind %', NEW.type, ctx.kind
            USING ERRCODE = 'check_violation';
    END IF;
    suffix := substr(NEW.type, length(ctx.kind) + 2);
    IF suffix !~ '^[A-Z][A-Z0-9_]{0,62}$' THEN
        RAISE EXCEPTION 'event type % must be <kind>:<TYPE> with TYPE in [A-Z0-9_]', NEW.type
            USING ERRCODE = 'check_violation';
    END IF;

    IF suffix = 'RETRIED' THEN
        -- dama retry: the one event a finished context accepts, and only
        -- a FAILED or CANCELLED one; it names the new max_attempts.
        IF ctx.etl_status NOT IN ('FAILED', 'CANCELLED') THEN
            RAISE EXCEPTION 'etl context % is %: only a FAILED or CANCELLED task can be retried', ctx.etl_context_id, ctx.etl_status
                USING ERRCODE = 'DMSTA';
        END IF;
        IF NOT coalesce((NEW.payload->>'max_attempts')::int > ctx.attempt, false) THEN
            RAISE EXCEPTION 'a RETRIED event of etl context % must name max_attempts above its attempt %', ctx.etl_context_id, ctx.attempt
                USING ERRCODE = 'check_violation';
        END IF;
    ELSIF data_manager.is_finished(ctx.etl_status) THEN
        RAISE EXCEPTION 'etl context % is % and takes no more events', ctx.etl_context_id, ctx.etl_status
            USING ERRCODE = 'DMFIN';
    END IF;

    IF suffix = 'INITIAL' THEN
        IF ctx.initial_event_id IS NOT NULL THEN
            RAISE EXCEPTION 'etl context % already has its INITIAL event', ctx.etl_context_id
                USING ERRCODE = 'unique_violation';
        END IF;
    ELSIF NEW.run_id IS DISTINCT FROM ctx.run_id THEN
        RAISE EXCEPTION 'event % for etl context % comes from run %, not from the current run %',
            NEW.type, ctx.etl_context_id, NEW.run_id, ctx.run_id
            USING ERRCODE = 'DMRUN';
    ELSIF suffix IN ('FINAL', 'ERROR') AND ctx.etl_status <> 'RUNNING' THEN
        RAISE EXCEPTION 'etl context % is %, so it cannot end an attempt with %',
            ctx.etl_context_id, ctx.etl_status, NEW.type
            USING ERRCODE = 'DMRUN';
    END IF;

    NEW.attempt := ctx.attempt;
    NEW.error := NEW.error OR suffix = 'ERROR';
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    kind_len integer;
    suffix   text;
BEGIN
    SELECT length(kind) INTO kind_len FROM data_manager.etl_contexts
     WHERE etl_context_id = NEW.etl_context_id;
    suffix := substr(NEW.type, kind_len + 2);

    UPDATE data_manager.etl_contexts AS c
       SET latest_event_id  = NEW.event_id,
           initial_event_id = CASE WHEN suffix = 'INITIAL' THEN NEW.event_id ELSE c.initial_event_id END,
           etl_status = CASE
               WHEN suffix = 'FINAL' THEN 'DONE'
               WHEN suffix = 'CANCELLED' THEN 'CANCELLED'
               WHEN suffix = 'ERROR' AND (c.attempt >= c.max_attempts OR NEW.payload->>'retry' = 'false') THEN 'FAILED'
               WHEN suffix = 'ERROR' THEN 'RETRYING'
               WHEN suffix = 'RETRIED' THEN 'QUEUED'
               ELSE c.etl_status
           END,
           finished_at = CASE
               WHEN suffix IN ('FINAL', 'CANCELLED') OR (suffix = 'ERROR' AND (c.attempt >= c.max_attempts OR NEW.payload->>'retry' = 'false')) THEN now()
               WHEN suffix = 'RETRIED' THEN NULL
               ELSE c.finished_at
           END,
           max_attempts = CASE WHEN suffix = 'RETRIED' THEN (NEW.payload->>'max_attempts')::int ELSE c.max_attempts END,
           cancel_requested_at = CASE WHEN suffix = 'RETRIED' THEN NULL ELSE c.cancel_requested_at END,
           waiting_for = CASE WHEN suffix = 'RETRIED' THEN NULL ELSE c.waiting_for END,
           waiting_since = CASE WHEN suffix = 'RETRIED' THEN NULL ELSE c.waiting_since END,
           due_at = CASE WHEN suffix = 'RETRIED' THEN now() ELSE c.due_at END
     WHERE c.etl_context_id = NEW.etl_context_id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.etl_contexts_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF data_manager.is_finished(OLD.etl_status) THEN
        -- Reopened by its RETRIED event (event_store_apply), keeping its
        -- attempt number and run id.
        IF OLD.etl_status IN ('FAILED', 'CANCELLED') AND NEW.etl_status = 'QUEUED'
           AND NEW.attempt = OLD.attempt AND NEW.run_id IS NOT DISTINCT FROM OLD.run_id
           AND (NEW.kind, NEW.queue) = (OLD.kind, OLD.queue)
           AND EXISTS (SELECT 1 FROM data_manager.event_store AS e
                        WHERE e.event_id = NEW.latest_event_id AND e.etl_context_id = OLD.etl_context_id
                          AND e.type = OLD.kind || ':RETRIED') THEN
            RETURN NEW;
        END IF;
        IF (NEW.etl_status, NEW.attempt, NEW.run_id, NEW.finished_at, NEW.kind, NEW.queue)
           IS DISTINCT FROM (OLD.etl_status, OLD.attempt, OLD.run_id, OLD.finished_at, OLD.kind, OLD.queue) THEN
            RAISE EXCEPTION 'etl context % is % and cannot be reopened or changed', OLD.etl_context_id, OLD.etl_status
                USING ERRCODE = 'DMFIN';
        END IF;
        RETURN NEW;
    END IF;

    IF OLD.etl_status = 'RUNNING'
       AND (NEW.etl_status = 'QUEUED' OR (NEW.etl_status = 'RETRYING' AND NEW.attempt <> OLD.attempt)) THEN
        IF OLD.pid IS NOT NULL OR NEW.pid IS NOT NULL OR NEW.attempt <> OLD.attempt - 1
           OR NEW.run_id IS DISTINCT FROM OLD.run_id
           OR (NEW.etl_status = 'QUEUED') <> (NEW.attempt = 0) THEN
            RAISE EXCEPTION 'etl context %: only a launch whose task process never started may be abandoned', OLD.etl_context_id
                USING ERRCODE = 'DMSTA';
        END IF;
        RETURN NEW;
    END IF;

    IF NEW.etl_status <> OLD.etl_status AND NOT (
           (OLD.etl_status = 'QUEUED'   AND NEW.etl_status IN ('RUNNING', 'CANCELLED'))
        OR (OLD.etl_status = 'RETRYING' AND NEW.etl_status IN ('RUNNING', 'CANCELLED'))
        OR (OLD.etl_status = 'RUNNING'  AND NEW.etl_status IN ('DONE', 'RETRYING', 'FAILED', 'CANCELLED'))
    ) THEN
        RAISE EXCEPTION 'etl context % cannot go from % to %', OLD.etl_context_id, OLD.etl_status, NEW.etl_status
            USING ERRCODE = 'DMSTA';
    END IF;

    -- A new attempt needs a new fencing token.
    IF NEW.etl_status = 'RUNNING' AND OLD.etl_status <> 'RUNNING'
       AND (NEW.run_id IS NULL OR NEW.run_id IS NOT DISTINCT FROM OLD.run_id OR NEW.attempt <= OLD.attempt) THEN
        RAISE EXCEPTION 'a new attempt of etl context % needs a new run id and a higher attempt number', OLD.etl_context_id
            USING ERRCODE = 'DMSTA';
    END IF;
    IF NEW.run_id IS DISTINCT FROM OLD.run_id AND NOT (NEW.etl_status = 'RUNNING' AND OLD.etl_status <> 'RUNNING') THEN
        RAISE EXCEPTION 'the run id of etl context % changes only when an attempt starts', OLD.etl_context_id
            USING ERRCODE = 'DMSTA';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- As in 00003 and 00001.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ctx    data_manager.etl_contexts%ROWTYPE;
    suffix text;
BEGIN
    -- A numbered event already stored (a retried write whose first try
    -- committed) is skipped before any other check: the context may have
    -- finished because of it.
    IF NEW.seq IS NOT NULL AND EXISTS (
        SELECT 1 FROM data_manager.event_store AS e
         WHERE e.etl_context_id = NEW.etl_context_id AND e.run_id = NEW.run_id AND e.seq = NEW.seq) THEN
        RETURN NULL;
    END IF;

    SELECT * INTO ctx FROM data_manager.etl_contexts
     WHERE etl_context_id = NEW.etl_context_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'etl context % does not exist', NEW.etl_context_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;

    IF left(NEW.type, length(ctx.kind) + 1) <> ctx.kind || ':' THEN
        RAISE EXCEPTION 'event type % does not belong to kind %', NEW.type, ctx.kind
            USING ERRCODE = 'check_violation';
    END IF;
    suffix := substr(NEW.type, length(ctx.kind) + 2);
    IF suffix !~ '^[A-Z][A-Z0-9_]{0,62}$' THEN
        RAISE EXCEPTION 'event type % must be <kind>:<TYPE> with TYPE in [A-Z0-9_]', NEW.type
            USING ERRCODE = 'check_violation';
    END IF;

    IF data_manager.is_finished(ctx.etl_status) THEN
        RAISE EXCEPTION 'etl context % is % and takes no more events', ctx.etl_context_id, ctx.etl_status
            USING ERRCODE = 'DMFIN';
    END IF;

    IF suffix = 'INITIAL' THEN
        IF ctx.initial_event_id IS NOT NULL THEN
            RAISE EXCEPTION 'etl context % already has its INITIAL event', ctx.etl_context_id
                USING ERRCODE = 'unique_violation';
        END IF;
    ELSIF NEW.run_id IS DISTINCT FROM ctx.run_id THEN
        RAISE EXCEPTION 'event % for etl context % comes from run %, not from the current run %',
            NEW.type, ctx.etl_context_id, NEW.run_id, ctx.run_id
            USING ERRCODE = 'DMRUN';
    ELSIF suffix IN ('FINAL', 'ERROR') AND ctx.etl_status <> 'RUNNING' THEN
        RAISE EXCEPTION 'etl context % is %, so it cannot end an attempt with %',
            ctx.etl_context_id, ctx.etl_status, NEW.type
            USING ERRCODE = 'DMRUN';
    END IF;

    NEW.attempt := ctx.attempt;
    NEW.error := NEW.error OR suffix = 'ERROR';
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_apply() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    kind_len integer;
    suffix   text;
BEGIN
    SELECT length(kind) INTO kind_len FROM data_manager.etl_contexts
     WHERE etl_context_id = NEW.etl_context_id;
    suffix := substr(NEW.type, kind_len + 2);

    UPDATE data_manager.etl_contexts AS c
       SET latest_event_id  = NEW.event_id,
           initial_event_id = CASE WHEN suffix = 'INITIAL' THEN NEW.event_id ELSE c.initial_event_id END,
           etl_status = CASE
               WHEN suffix = 'FINAL' THEN 'DONE'
               WHEN suffix = 'CANCELLED' THEN 'CANCELLED'
               WHEN suffix = 'ERROR' AND c.attempt >= c.max_attempts THEN 'FAILED'
               WHEN suffix = 'ERROR' THEN 'RETRYING'
               ELSE c.etl_status
           END,
           finished_at = CASE
               WHEN suffix IN ('FINAL', 'CANCELLED') OR (suffix = 'ERROR' AND c.attempt >= c.max_attempts) THEN now()
               ELSE c.finished_at
           END
     WHERE c.etl_context_id = NEW.etl_context_id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.etl_contexts_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF data_manager.is_finished(OLD.etl_status) THEN
        IF (NEW.etl_status, NEW.attempt, NEW.run_id, NEW.finished_at, NEW.kind, NEW.queue)
           IS DISTINCT FROM (OLD.etl_status, OLD.attempt, OLD.run_id, OLD.finished_at, OLD.kind, OLD.queue) THEN
            RAISE EXCEPTION 'etl context % is % and cannot be reopened or changed', OLD.etl_context_id, OLD.etl_status
                USING ERRCODE = 'DMFIN';
        END IF;
        RETURN NEW;
    END IF;

    IF OLD.etl_status = 'RUNNING'
       AND (NEW.etl_status = 'QUEUED' OR (NEW.etl_status = 'RETRYING' AND NEW.attempt <> OLD.attempt)) THEN
        IF OLD.pid IS NOT NULL OR NEW.pid IS NOT NULL OR NEW.attempt <> OLD.attempt - 1
           OR NEW.run_id IS DISTINCT FROM OLD.run_id
           OR (NEW.etl_status = 'QUEUED') <> (NEW.attempt = 0) THEN
            RAISE EXCEPTION 'etl context %: only a launch whose task process never started may be abandoned', OLD.etl_context_id
                USING ERRCODE = 'DMSTA';
        END IF;
        RETURN NEW;
    END IF;

    IF NEW.etl_status <> OLD.etl_status AND NOT (
           (OLD.etl_status = 'QUEUED'   AND NEW.etl_status IN ('RUNNING', 'CANCELLED'))
        OR (OLD.etl_status = 'RETRYING' AND NEW.etl_status IN ('RUNNING', 'CANCELLED'))
        OR (OLD.etl_status = 'RUNNING'  AND NEW.etl_status IN ('DONE', 'RETRYING', 'FAILED', 'CANCELLED'))
    ) THEN
        RAISE EXCEPTION 'etl context % cannot go from % to %', OLD.etl_context_id, OLD.etl_status, NEW.etl_status
            USING ERRCODE = 'DMSTA';
    END IF;

    -- A new attempt needs a new fencing token.
    IF NEW.etl_status = 'RUNNING' AND OLD.etl_status <> 'RUNNING'
       AND (NEW.run_id IS NULL OR NEW.run_id IS NOT DISTINCT FROM OLD.run_id OR NEW.attempt <= OLD.attempt) THEN
        RAISE EXCEPTION 'a new attempt of etl context % needs a new run id and a higher attempt number', OLD.etl_context_id
            USING ERRCODE = 'DMSTA';
    END IF;
    IF NEW.run_id IS DISTINCT FROM OLD.run_id AND NOT (NEW.etl_status = 'RUNNING' AND OLD.etl_status <> 'RUNNING') THEN
        RAISE EXCEPTION 'the run id of etl context % changes only when an attempt starts', OLD.etl_context_id
            USING ERRCODE = 'DMSTA';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
