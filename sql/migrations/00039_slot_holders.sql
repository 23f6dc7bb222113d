-- What takes a slot of max_running is said once, in slot_holders, which
-- both the wake (etlcontext's wakeWaiting) and start_attempt count: before,
-- the wake's Go text and start_attempt's each spelt it out. It is a
-- LANGUAGE sql STABLE function of one SELECT, without SET or SECURITY
-- DEFINER, so the planner inlines it into the query that calls it, as if
-- its text were written there: the wake's plan is the one it had.
--
-- lock_step and start_attempt read, once the task's lock (and a start's
-- turns) are held, what committed before: under READ COMMITTED each of
-- their statements takes a snapshot of its own. Under REPEATABLE READ or
-- SERIALIZABLE they would read the transaction's snapshot, older than the
-- locks, and count a start just decided as not made: they now refuse to
-- run there.
--
-- Additive for the previous release's supervisors and task processes: a
-- new function, and two replaced with the same signatures, which do what
-- they did under READ COMMITTED.

-- +goose Up
-- The contexts that take a slot of their queue, their kind and their
-- concurrency key: RUNNING, but for a parent whose command succeeded and
-- which now only awaits its children (its latest event is AWAITING).
-- Parents awaiting children of their own queue would otherwise take every
-- slot, and wait for ever.
-- +goose StatementBegin
CREATE FUNCTION data_manager.slot_holders() RETURNS SETOF data_manager.etl_contexts
LANGUAGE sql STABLE AS $$
    SELECT r.* FROM data_manager.etl_contexts AS r
     WHERE r.etl_status = 'RUNNING' AND NOT EXISTS (
           SELECT FROM data_manager.event_store AS ae
            WHERE ae.event_id = r.latest_event_id AND ae.type LIKE '%:AWAITING')
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.lock_step(id bigint, job bigint,
    OUT held_elsewhere boolean, OUT task data_manager.etl_contexts,
    OUT job_running boolean, OUT job_attempted_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'lock_step needs READ COMMITTED, not %: it must read what committed before its lock', current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    held_elsewhere := NOT pg_try_advisory_xact_lock(1684106593, id::int);
    -- Statements of their own: they see what the lock's last holder
    -- committed before it let go.
    SELECT * INTO task FROM data_manager.etl_contexts AS c WHERE c.etl_context_id = lock_step.id;
    SELECT j.state = 'running', j.attempted_at INTO job_running, job_attempted_at
      FROM river_job AS j WHERE j.id = lock_step.job;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.start_attempt(id bigint, job bigint, status text, attempt integer, run uuid,
    queue_max integer, kind_max integer, key_max integer,
    new_attempt integer, launched_by text, key_hash bytea,
    OUT waiting text, OUT new_run uuid, OUT started_attempt integer)
LANGUAGE plpgsql AS $$
DECLARE
    c data_manager.etl_contexts;
    key text;
    paused boolean;
    blocked boolean;
    queue_running bigint;
    kind_running bigint;
    key_running bigint;
BEGIN
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'start_attempt needs READ COMMITTED, not %: it must count the starts that committed before its locks', current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    IF NOT pg_try_advisory_xact_lock(1684106593, id::int) THEN
        waiting := 'changed';
        RETURN;
    END IF;
    SELECT * INTO c FROM data_manager.etl_contexts AS x WHERE x.etl_context_id = start_attempt.id;
    IF NOT FOUND OR c.etl_status IS DISTINCT FROM status OR c.attempt IS DISTINCT FROM start_attempt.attempt
       OR c.run_id IS DISTINCT FROM run OR c.cancel_requested_at IS NOT NULL OR c.river_job_id IS DISTINCT FROM job THEN
        waiting := 'changed';
        RETURN;
    END IF;
    IF key_max > 0 THEN
        key := c.concurrency_key;
    END IF;
    -- In the order whoever takes more than one takes them.
    PERFORM pg_advisory_xact_lock(1684106594, hashtext(c.queue));
    PERFORM pg_advisory_xact_lock(1684106597, hashtext(c.kind));
    IF key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(1684106598, hashtext(c.kind || '/' || key));
    END IF;
    -- Read once the turns are held: every start decided before is counted.
    SELECT EXISTS (SELECT 1 FROM data_manager.queue_pauses AS p WHERE p.queue = c.queue),
           EXISTS (SELECT 1 FROM data_manager.kind_blocks AS b WHERE b.kind = c.kind),
           (SELECT count(*) FROM data_manager.slot_holders() AS r WHERE r.queue = c.queue),
           (SELECT count(*) FROM data_manager.slot_holders() AS r WHERE kind_max > 0 AND r.kind = c.kind),
           (SELECT count(*) FROM data_manager.slot_holders() AS r WHERE r.kind = c.kind AND r.concurrency_key = key)
      INTO paused, blocked, queue_running, kind_running, key_running;
    waiting := CASE
        WHEN paused THEN 'queue_paused'
        WHEN blocked THEN 'kind_blocked'
        WHEN queue_running >= queue_max THEN 'queue_full'
        WHEN kind_max > 0 AND kind_running >= kind_max THEN 'kind_full'
        WHEN key IS NOT NULL AND key_running >= key_max THEN 'key_full'
    END;
    IF waiting IS NOT NULL THEN
        UPDATE data_manager.etl_contexts AS x
           SET waiting_for = waiting, waiting_since = coalesce(x.waiting_since, now())
         WHERE x.etl_context_id = start_attempt.id AND x.waiting_for IS DISTINCT FROM waiting;
        RETURN;
    END IF;
    UPDATE data_manager.etl_contexts AS x
       SET etl_status = 'RUNNING', attempt = new_attempt, run_id = gen_random_uuid(),
           launched_by = start_attempt.launched_by, runner_key_hash = key_hash,
           started_at = coalesce(x.started_at, now()),
           host = NULL, pid = NULL, process_started_at = NULL, heartbeat_at = NULL, host_id = NULL,
           runner_start_ticks = NULL, fence_window = NULL, lock_lost_at = NULL, lock_mode = NULL,
           runner_release = NULL, runner_protocol = NULL, command_pgid = NULL, command_start_ticks = NULL,
           waiting_for = NULL, waiting_since = NULL
     WHERE x.etl_context_id = start_attempt.id
    RETURNING x.run_id, x.attempt INTO new_run, started_attempt;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The functions as migration 38 made them.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.lock_step(id bigint, job bigint,
    OUT held_elsewhere boolean, OUT task data_manager.etl_contexts,
    OUT job_running boolean, OUT job_attempted_at timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    held_elsewhere := NOT pg_try_advisory_xact_lock(1684106593, id::int);
    -- Statements of their own: they see what the lock's last holder
    -- committed before it let go.
    SELECT * INTO task FROM data_manager.etl_contexts AS c WHERE c.etl_context_id = lock_step.id;
    SELECT j.state = 'running', j.attempted_at INTO job_running, job_attempted_at
      FROM river_job AS j WHERE j.id = lock_step.job;
END
$$;
-- +goose StatementEnd
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.start_attempt(id bigint, job bigint, status text, attempt integer, run uuid,
    queue_max integer, kind_max integer, key_max integer,
    new_attempt integer, launched_by text, key_hash bytea,
    OUT waiting text, OUT new_run uuid, OUT started_attempt integer)
LANGUAGE plpgsql AS $$
DECLARE
    c data_manager.etl_contexts;
    key text;
    paused boolean;
    blocked boolean;
    queue_running bigint;
    kind_running bigint;
    key_running bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(1684106593, id::int) THEN
        waiting := 'changed';
        RETURN;
    END IF;
    SELECT * INTO c FROM data_manager.etl_contexts AS x WHERE x.etl_context_id = start_attempt.id;
    IF NOT FOUND OR c.etl_status IS DISTINCT FROM status OR c.attempt IS DISTINCT FROM start_attempt.attempt
       OR c.run_id IS DISTINCT FROM run OR c.cancel_requested_at IS NOT NULL OR c.river_job_id IS DISTINCT FROM job THEN
        waiting := 'changed';
        RETURN;
    END IF;
    IF key_max > 0 THEN
        key := c.concurrency_key;
    END IF;
    -- In the order whoever takes more than one takes them.
    PERFORM pg_advisory_xact_lock(1684106594, hashtext(c.queue));
    PERFORM pg_advisory_xact_lock(1684106597, hashtext(c.kind));
    IF key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(1684106598, hashtext(c.kind || '/' || key));
    END IF;
    -- Read once the turns are held: every start decided before is counted.
    -- A task takes a slot while RUNNING, unless it is a parent whose
    -- command succeeded and which now only awaits its children (its
    -- latest event is AWAITING): etlcontext's holdsSlot, which the wake
    -- uses too.
    SELECT EXISTS (SELECT 1 FROM data_manager.queue_pauses AS p WHERE p.queue = c.queue),
           EXISTS (SELECT 1 FROM data_manager.kind_blocks AS b WHERE b.kind = c.kind),
           (SELECT count(*) FROM data_manager.etl_contexts AS r
             WHERE r.queue = c.queue AND r.etl_status = 'RUNNING' AND NOT EXISTS (
                   SELECT 1 FROM data_manager.event_store AS ae
                    WHERE ae.event_id = r.latest_event_id AND ae.type LIKE '%:AWAITING')),
           (SELECT count(*) FROM data_manager.etl_contexts AS r
             WHERE kind_max > 0 AND r.kind = c.kind AND r.etl_status = 'RUNNING' AND NOT EXISTS (
                   SELECT 1 FROM data_manager.event_store AS ae
                    WHERE ae.event_id = r.latest_event_id AND ae.type LIKE '%:AWAITING')),
           (SELECT count(*) FROM data_manager.etl_contexts AS r
             WHERE r.kind = c.kind AND r.concurrency_key = key AND r.etl_status = 'RUNNING' AND NOT EXISTS (
                   SELECT 1 FROM data_manager.event_store AS ae
                    WHERE ae.event_id = r.latest_event_id AND ae.type LIKE '%:AWAITING'))
      INTO paused, blocked, queue_running, kind_running, key_running;
    waiting := CASE
        WHEN paused THEN 'queue_paused'
        WHEN blocked THEN 'kind_blocked'
        WHEN queue_running >= queue_max THEN 'queue_full'
        WHEN kind_max > 0 AND kind_running >= kind_max THEN 'kind_full'
        WHEN key IS NOT NULL AND key_running >= key_max THEN 'key_full'
    END;
    IF waiting IS NOT NULL THEN
        UPDATE data_manager.etl_contexts AS x
           SET waiting_for = waiting, waiting_since = coalesce(x.waiting_since, now())
         WHERE x.etl_context_id = start_attempt.id AND x.waiting_for IS DISTINCT FROM waiting;
        RETURN;
    END IF;
    UPDATE data_manager.etl_contexts AS x
       SET etl_status = 'RUNNING', attempt = new_attempt, run_id = gen_random_uuid(),
           launched_by = start_attempt.launched_by, runner_key_hash = key_hash,
           started_at = coalesce(x.started_at, now()),
           host = NULL, pid = NULL, process_started_at = NULL, heartbeat_at = NULL, host_id = NULL,
           runner_start_ticks = NULL, fence_window = NULL, lock_lost_at = NULL, lock_mode = NULL,
           runner_release = NULL, runner_protocol = NULL, command_pgid = NULL, command_start_ticks = NULL,
           waiting_for = NULL, waiting_since = NULL
     WHERE x.etl_context_id = start_attempt.id
    RETURNING x.run_id, x.attempt INTO new_run, started_attempt;
END
$$;
-- +goose StatementEnd
DROP FUNCTION data_manager.slot_holders();
