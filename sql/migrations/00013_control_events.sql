-- Who acts (docs/operations.md "The status page"): every pause, resume, block and
-- unblock is kept, with who did it, in data_manager.control_events
-- (queue_pauses and kind_blocks hold only what is in force, and lose the
-- record of a pause once it is lifted); and a request to cancel a running
-- task is recorded as its <kind>:CANCEL_REQUESTED event naming who asked.
-- That event is a note beside the run: it leaves latest_event_id to the
-- run's own events, and only dama's client writes it (a task process's
-- events are numbered, and refused).
--
-- Additive, and safe while task processes of v0.1.0 run: a new table,
-- and trigger functions replaced with the same behaviour for every event
-- they write.

-- +goose Up
CREATE TABLE data_manager.control_events (
    control_event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at       timestamptz NOT NULL DEFAULT now(),
    action           text NOT NULL CHECK (action IN ('PAUSED', 'RESUMED', 'BLOCKED', 'UNBLOCKED')),
    -- The queue of a pause or resume; the kind of a block or unblock.
    queue            text CHECK ((queue IS NULL) = (action IN ('BLOCKED', 'UNBLOCKED'))),
    kind             text CHECK ((kind IS NULL) = (action IN ('PAUSED', 'RESUMED'))),
    reason           text NOT NULL DEFAULT '',
    -- Who did it: user@host for the CLI and the Go client, and for the
    -- status page the name its operator gave, the page's host and the
    -- address the request came from.
    actor            text NOT NULL
);

-- +goose StatementBegin
CREATE FUNCTION data_manager.control_events_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'data_manager.control_events is a record: its rows are never changed or deleted'
        USING ERRCODE = 'check_violation';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER control_events_immutable BEFORE UPDATE OR DELETE ON data_manager.control_events
    FOR EACH ROW EXECUTE FUNCTION data_manager.control_events_immutable();

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

    IF suffix = 'CANCEL_REQUESTED' AND NEW.seq IS NOT NULL THEN
        -- Written by the client that asks, never by a task process (whose
        -- events are numbered): a command cannot forge who cancelled it.
        RAISE EXCEPTION 'event type % is written by dama alone', NEW.type
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
       -- A cancellation request is a note beside the run, not a step of
       -- it: the latest event stays the run's (an AWAITING parent keeps
       -- its queue slot free until its task process records the end).
       SET latest_event_id  = CASE WHEN suffix = 'CANCEL_REQUESTED' THEN c.latest_event_id ELSE NEW.event_id END,
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

-- +goose Down
-- As in 00010.
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

DROP TABLE data_manager.control_events;
DROP FUNCTION data_manager.control_events_immutable();
