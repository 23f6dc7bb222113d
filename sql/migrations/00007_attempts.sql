-- Every attempt of every task and the task process that ran it: where,
-- which release, how it held its lock, when it started and how it ended.
-- Filled by triggers from what every task process records on its context,
-- so that the attempts of task processes of v0.1.0 are recorded too.
--
-- Additive, and safe while task processes of v0.1.0 run: a new table and
-- two triggers. It holds SHARE ROW EXCLUSIVE on etl_contexts until it
-- commits (milliseconds), which waits for the writes in flight and holds
-- back new ones meanwhile, but waits for no task process's lock: neither
-- lock mode holds one on etl_contexts.

-- +goose Up
-- First, and before any snapshot is taken: no task process records itself
-- between the backfill below and the triggers, whatever the isolation level.
LOCK TABLE data_manager.etl_contexts IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE data_manager.etl_attempts (
    etl_context_id  bigint NOT NULL REFERENCES data_manager.etl_contexts (etl_context_id),
    attempt         integer NOT NULL,
    run_id          uuid NOT NULL,
    -- The supervisor host that launched the attempt, and the task process.
    launched_by     text,
    host            text,
    host_id         text,
    pid             integer,
    lock_mode       text,
    runner_release  text,
    runner_protocol integer,
    -- When the task process started (its host's clock), or when it recorded
    -- itself if that is unknown.
    started_at      timestamptz NOT NULL,
    -- When the attempt ended, and how: DONE, FAILED (another attempt may
    -- follow), or CANCELLED; NULL while it runs.
    ended_at        timestamptz,
    outcome         text CHECK (outcome IN ('DONE', 'FAILED', 'CANCELLED')),
    PRIMARY KEY (etl_context_id, run_id)
);

-- An attempt begins when its task process records itself (sets pid); a
-- launch taken back before that is no attempt.
-- +goose StatementBegin
CREATE FUNCTION data_manager.etl_attempts_begin() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO data_manager.etl_attempts (etl_context_id, attempt, run_id, launched_by, host, host_id, pid,
                                           lock_mode, runner_release, runner_protocol, started_at)
    VALUES (NEW.etl_context_id, NEW.attempt, NEW.run_id, NEW.launched_by, NEW.host, NEW.host_id, NEW.pid,
            NEW.lock_mode, NEW.runner_release, NEW.runner_protocol, coalesce(NEW.process_started_at, now()))
    ON CONFLICT (etl_context_id, run_id) DO NOTHING;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER etl_attempts_begin AFTER UPDATE OF pid ON data_manager.etl_contexts
    FOR EACH ROW
    WHEN (NEW.pid IS NOT NULL AND OLD.pid IS NULL AND NEW.run_id IS NOT NULL)
    EXECUTE FUNCTION data_manager.etl_attempts_begin();

-- +goose StatementBegin
CREATE FUNCTION data_manager.etl_attempts_end() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE data_manager.etl_attempts
       SET ended_at = now(),
           outcome = CASE NEW.etl_status WHEN 'DONE' THEN 'DONE' WHEN 'CANCELLED' THEN 'CANCELLED' ELSE 'FAILED' END
     WHERE etl_context_id = NEW.etl_context_id AND run_id = OLD.run_id AND ended_at IS NULL;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER etl_attempts_end AFTER UPDATE OF etl_status ON data_manager.etl_contexts
    FOR EACH ROW
    WHEN (OLD.etl_status = 'RUNNING' AND NEW.etl_status <> 'RUNNING')
    EXECUTE FUNCTION data_manager.etl_attempts_end();

-- The attempts running now.
INSERT INTO data_manager.etl_attempts (etl_context_id, attempt, run_id, launched_by, host, host_id, pid,
                                       lock_mode, runner_release, runner_protocol, started_at)
SELECT etl_context_id, attempt, run_id, launched_by, host, host_id, pid,
       lock_mode, runner_release, runner_protocol, coalesce(process_started_at, now())
  FROM data_manager.etl_contexts
 WHERE etl_status = 'RUNNING' AND pid IS NOT NULL AND run_id IS NOT NULL;

-- +goose Down
DROP TRIGGER etl_attempts_end ON data_manager.etl_contexts;
DROP TRIGGER etl_attempts_begin ON data_manager.etl_contexts;
DROP FUNCTION data_manager.etl_attempts_end();
DROP FUNCTION data_manager.etl_attempts_begin();
DROP TABLE data_manager.etl_attempts;
