-- A supervisor's step in fewer round trips (docs/performance.md "Bursts").
-- A step takes the task's lock and then reads the task: two statements
-- before, since a read in the lock's own statement would see the database
-- as it stood before the lock was held. Inside a function, each statement
-- sees what was committed when it began (READ COMMITTED), so lock_step
-- takes the lock and reads in one call. A start took the task's lock, its
-- queue's, kind's and key's turns, read the pauses, blocks and running
-- tasks, and marked the task RUNNING, in six statements and a transaction:
-- start_attempt does it in one, under the same locks, taken in the same
-- order as before, so that a supervisor of the previous release starting
-- tasks beside this one's waits for the same turns.
--
-- Additive: two functions, which run with the caller's rights.

-- +goose Up
-- Tries the lock of context id (pg_try_advisory_xact_lock(1684106593,
-- id), held for the rest of the caller's transaction) and returns, read
-- once it is held (or found held by another: held_elsewhere), the task
-- (NULL if there is none) and whether River job job runs and since when.
-- +goose StatementBegin
CREATE FUNCTION data_manager.lock_step(id bigint, job bigint,
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

-- Starts a new attempt of context id (of River job job), as a step
-- decided from a read that found it in status, at attempt, with run id
-- run and no cancellation requested, unless the context changed since
-- (or its lock is held elsewhere: waiting is 'changed'). Under the locks
-- of the task, of its queue's and kind's turns (and, when key_max > 0
-- and the task has a concurrency key, of the key's), it reads the pauses,
-- blocks and running tasks as they stand once those are held. If the
-- task must wait, it records why (waiting, as waiting_for) and starts
-- nothing; else it marks the task RUNNING for attempt new_attempt with a
-- fresh run id (new_run) and the hash of the run's key, launched by
-- launched_by. A kind's or key's bound of 0 is none. The locks are held to
-- the end of the caller's transaction.
-- +goose StatementBegin
CREATE FUNCTION data_manager.start_attempt(id bigint, job bigint, status text, attempt integer, run uuid,
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

-- +goose Down
DROP FUNCTION data_manager.start_attempt(bigint, bigint, text, integer, uuid, integer, integer, integer, integer, text, bytea);
DROP FUNCTION data_manager.lock_step(bigint, bigint);
