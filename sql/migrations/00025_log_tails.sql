-- Logs from anywhere (docs/operations.md "Logs"): each attempt's output is
-- also kept in the database, as a bounded rolling tail, so that `dama
-- logs` and the status page read it from any host, and a host that
-- vanished still leaves it. A task process appends what its log file
-- gained every log_tail_interval, in chunks, and drops the chunks that
-- fall out of the last log_tail_bytes: the cost of a write is what the
-- command wrote since the last one, never the whole tail.
--
-- A task process writes through data_manager.append_log alone, which
-- holds a member of dama_task to its own run, as migration 19's triggers
-- hold its other writes. Removed with its context (retention,
-- data_manager.remove_tasks).
--
-- Additive: a table and a function.

-- +goose Up
CREATE TABLE data_manager.log_chunks (
    etl_context_id bigint NOT NULL REFERENCES data_manager.etl_contexts ON DELETE CASCADE,
    attempt        integer NOT NULL,
    run_id         uuid NOT NULL,
    -- Where data starts in the attempt's output, from 0.
    start_byte     bigint NOT NULL CHECK (start_byte >= 0),
    data           bytea NOT NULL,
    written_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (etl_context_id, attempt, start_byte)
);

-- Appends chunk, which starts at start_byte of the output of context id's
-- run, and drops the run's chunks that end before the last keep bytes.
-- Only while the run is the context's current one and RUNNING (a run
-- superseded, or over, is refused with SQLSTATE DMRUN); a role held to
-- its run (the session's: within this function current_user is its
-- owner) must hold the run's key. Whoever calls it, an attempt keeps at
-- most 64 MiB (config.MaxLogTailBytes), in chunks of at most 256 KiB
-- (protocol.MaxLogChunk) that go forward: a chunk starts at or after the
-- last one kept. One written again (a write whose reply was lost) is kept
-- once, the longer; a small one that follows on grows the last chunk, up
-- to 64 KiB, rather than add a row: an attempt keeps few rows however
-- often its command writes a byte.
-- +goose StatementBegin
CREATE FUNCTION data_manager.append_log(id bigint, run uuid, start_byte bigint, chunk bytea, keep bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, data_manager, pg_temp AS $$
#variable_conflict use_column
DECLARE
    run_attempt integer;
    hash        bytea;
    status      text;
    last_start  bigint;
    last_length integer;
    kept_from   bigint := append_log.start_byte + octet_length(chunk) - keep;
BEGIN
    SELECT c.attempt, c.runner_key_hash, c.etl_status INTO run_attempt, hash, status
      FROM data_manager.etl_contexts AS c WHERE c.etl_context_id = id AND c.run_id = run;
    IF NOT FOUND OR status <> 'RUNNING' THEN
        RAISE EXCEPTION 'etl context %: run % is not the one running', id, run
            USING ERRCODE = 'DMRUN';
    END IF;
    IF data_manager.held_to_its_run(session_user) AND NOT data_manager.holds_run_key(hash) THEN
        PERFORM data_manager.refuse_to_held(format('append to the log of etl context %s', id));
    END IF;
    IF append_log.start_byte < 0 OR keep < 0 OR keep > 64 * 1024 * 1024 OR octet_length(chunk) > 256 * 1024 THEN
        RAISE EXCEPTION 'append_log: want a start and keep not negative, keep at most 64 MiB, a chunk at most 256 KiB'
            USING ERRCODE = 'DMARG';
    END IF;
    -- A launch taken back gives its attempt's number to the next one:
    -- what its run kept is not this run's output.
    DELETE FROM data_manager.log_chunks AS l
     WHERE l.etl_context_id = id AND l.attempt = run_attempt AND l.run_id <> run;
    SELECT l.start_byte, octet_length(l.data) INTO last_start, last_length
      FROM data_manager.log_chunks AS l
     WHERE l.etl_context_id = id AND l.attempt = run_attempt
     ORDER BY l.start_byte DESC LIMIT 1;
    IF append_log.start_byte < last_start THEN
        RAISE EXCEPTION 'append_log: a chunk at % starts before the last one kept, at %', append_log.start_byte, last_start
            USING ERRCODE = 'DMARG';
    END IF;
    IF append_log.start_byte = last_start + last_length AND last_length + octet_length(chunk) <= least(65536, keep) THEN
        UPDATE data_manager.log_chunks AS l SET data = l.data || chunk, written_at = now()
         WHERE l.etl_context_id = id AND l.attempt = run_attempt AND l.start_byte = last_start;
    ELSE
        INSERT INTO data_manager.log_chunks AS l (etl_context_id, attempt, run_id, start_byte, data)
        VALUES (id, run_attempt, run, append_log.start_byte, chunk)
        ON CONFLICT (etl_context_id, attempt, start_byte) DO UPDATE SET data = excluded.data, written_at = excluded.written_at
            WHERE octet_length(excluded.data) > octet_length(l.data);
    END IF;
    -- A chunk that ends before kept_from starts before it too: the index
    -- bounds the rows looked at.
    DELETE FROM data_manager.log_chunks AS l
     WHERE l.etl_context_id = id AND l.attempt = run_attempt
       AND l.start_byte <= kept_from AND l.start_byte + octet_length(l.data) <= kept_from;
END
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION data_manager.append_log(bigint, uuid, bigint, bytea, bigint) FROM PUBLIC;

-- +goose Down
DROP FUNCTION data_manager.append_log(bigint, uuid, bigint, bytea, bigint);
DROP TABLE data_manager.log_chunks;
