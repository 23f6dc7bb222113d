-- Events in batches (docs/tasks.md "What a task sees"): a task process writes the
-- events its command reports many to a statement. Every event used to
-- update its context's row for its latest_event_id; while a row-mode task
-- holds its transaction open no dead version of that row can be pruned,
-- so each update walked all the earlier ones, and a burst of events slowed
-- to a crawl. Now an event that changes the context's status still
-- updates it at once, and any other sets latest_event_id once per
-- statement.
--
-- The same results for every single-event statement, which is all that
-- task processes of v0.1.0 write: additive and safe while they run.

-- +goose Up
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
    -- Any other event changes nothing but the latest event, which
    -- event_store_latest sets once per statement.
    IF suffix NOT IN ('INITIAL', 'FINAL', 'CANCELLED', 'ERROR', 'RETRIED') THEN
        RETURN NULL;
    END IF;

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
CREATE FUNCTION data_manager.event_store_latest() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A cancellation request is a note beside the run, not a step of it:
    -- the latest event stays the run's (an AWAITING parent keeps its queue
    -- slot free until its task process records the end).
    UPDATE data_manager.etl_contexts AS c
       SET latest_event_id = n.latest
      FROM (SELECT e.etl_context_id, max(e.event_id) AS latest
              FROM new_events AS e
              JOIN data_manager.etl_contexts AS k ON k.etl_context_id = e.etl_context_id
             WHERE e.type <> k.kind || ':CANCEL_REQUESTED'
             GROUP BY e.etl_context_id) AS n
     WHERE c.etl_context_id = n.etl_context_id
       AND (c.latest_event_id IS NULL OR c.latest_event_id < n.latest);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER event_store_latest AFTER INSERT ON data_manager.event_store
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION data_manager.event_store_latest();

-- +goose Down
DROP TRIGGER event_store_latest ON data_manager.event_store;
DROP FUNCTION data_manager.event_store_latest();
-- As in 00013.
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
