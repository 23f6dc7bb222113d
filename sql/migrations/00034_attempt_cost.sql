-- What each attempt cost, by the kernel's counters of its control group
-- (config resources, cgroup_parent): its task process reads them once its
-- processes are gone and puts them in the outcome's payload, "usage"; the
-- attempt's row keeps them, for SQL that sizes a kind or charges its cost.
-- A supervisor that finds an attempt's task process dead records what its
-- group counted itself (etlcontext.RecordAttemptCost), which the attempt's
-- end keeps. NULL where the attempt had no group (a pod, a host without
-- one).
--
-- Read from the event that ended the attempt, which event_store_apply has
-- just made the context's latest: a payload's numbers are a task
-- process's, whose login may write only its own run's events, so a value
-- that is not a number of the column's range is left NULL rather than
-- failing the outcome.

-- +goose Up
ALTER TABLE data_manager.etl_attempts
    ADD COLUMN cpu_seconds double precision,
    ADD COLUMN peak_memory_bytes bigint,
    ADD COLUMN io_read_bytes bigint,
    ADD COLUMN io_write_bytes bigint,
    ADD COLUMN memory_limit_bytes bigint,
    ADD COLUMN oom_killed boolean;

-- What a kind cost in the last day, for metrics read at each scrape
-- (etlcontext.KindCosts): only the attempts that had a group.
CREATE INDEX etl_attempts_cost ON data_manager.etl_attempts (ended_at) WHERE cpu_seconds IS NOT NULL;

-- +goose StatementBegin
CREATE FUNCTION data_manager.usage_number(usage jsonb, field text) RETURNS numeric
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN jsonb_typeof(usage->field) = 'number'
                 AND (usage->>field)::numeric BETWEEN 0 AND 9223372036854775807
                THEN (usage->>field)::numeric END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.etl_attempts_end() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp AS $$
DECLARE
    usage jsonb;
BEGIN
    SELECT e.payload->'usage' INTO usage FROM data_manager.event_store AS e
     WHERE e.event_id = NEW.latest_event_id AND e.run_id = OLD.run_id AND jsonb_typeof(e.payload->'usage') = 'object';
    UPDATE data_manager.etl_attempts
       SET ended_at = now(),
           outcome = CASE NEW.etl_status WHEN 'DONE' THEN 'DONE' WHEN 'CANCELLED' THEN 'CANCELLED' ELSE 'FAILED' END,
           cpu_seconds = coalesce(data_manager.usage_number(usage, 'cpu_seconds'), cpu_seconds),
           peak_memory_bytes = coalesce(data_manager.usage_number(usage, 'peak_memory_bytes')::bigint, peak_memory_bytes),
           io_read_bytes = coalesce(data_manager.usage_number(usage, 'io_read_bytes')::bigint, io_read_bytes),
           io_write_bytes = coalesce(data_manager.usage_number(usage, 'io_write_bytes')::bigint, io_write_bytes),
           memory_limit_bytes = coalesce(data_manager.usage_number(usage, 'memory_limit_bytes')::bigint, memory_limit_bytes),
           oom_killed = coalesce(CASE WHEN usage IS NOT NULL THEN coalesce(usage->'oom_killed' = 'true', false) END, oom_killed)
     WHERE etl_context_id = NEW.etl_context_id AND run_id = OLD.run_id AND ended_at IS NULL;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.etl_attempts_end() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp AS $$
BEGIN
    UPDATE data_manager.etl_attempts
       SET ended_at = now(),
           outcome = CASE NEW.etl_status WHEN 'DONE' THEN 'DONE' WHEN 'CANCELLED' THEN 'CANCELLED' ELSE 'FAILED' END
     WHERE etl_context_id = NEW.etl_context_id AND run_id = OLD.run_id AND ended_at IS NULL;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
DROP FUNCTION data_manager.usage_number(jsonb, text);
DROP INDEX data_manager.etl_attempts_cost;
ALTER TABLE data_manager.etl_attempts
    DROP COLUMN cpu_seconds, DROP COLUMN peak_memory_bytes, DROP COLUMN io_read_bytes,
    DROP COLUMN io_write_bytes, DROP COLUMN memory_limit_bytes, DROP COLUMN oom_killed;
