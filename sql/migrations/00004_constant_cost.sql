-- What a running task costs must not grow with the number of tasks running:
-- supervisors no longer poll each task, so a task's end is announced by the
-- database itself; and task processes may hold an advisory lock instead of a
-- row lock (lock_mode), recorded on the context. Additive only: task
-- processes of the previous release keep working (but a supervisor of the
-- previous release does not see an advisory-mode task's lock: see the
-- docs/operations.md "Deployment notes").

-- +goose Up
-- How the attempt's task process holds its lock: 'row' or 'advisory'; NULL
-- for a task process of a release that predates the choice (row).
ALTER TABLE data_manager.etl_contexts ADD COLUMN lock_mode text;

-- The supervisors' watch reads the RUNNING contexts of their queues and
-- hosts every poll interval: an index of those alone, which stays as small
-- as the number of running tasks however many contexts the table holds.
CREATE INDEX etl_contexts_running ON data_manager.etl_contexts (queue, host_id)
    WHERE etl_status = 'RUNNING';

-- Every context that finishes (DONE, FAILED or CANCELLED) is announced on the
-- channel dama_task_finished, in the transaction that finishes it, with the
-- payload {"etl_context_id": ..., "kind": ..., "queue": ..., "status": ...}:
-- `dama cancel` waits on it, and any service may LISTEN instead of polling.
-- +goose StatementBegin
CREATE FUNCTION data_manager.etl_contexts_announce_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dama_task_finished', json_build_object(
        'etl_context_id', NEW.etl_context_id,
        'kind', NEW.kind,
        'queue', NEW.queue,
        'status', NEW.etl_status)::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER etl_contexts_announce_finished AFTER UPDATE OF etl_status ON data_manager.etl_contexts
    FOR EACH ROW
    WHEN (data_manager.is_finished(NEW.etl_status) AND NOT data_manager.is_finished(OLD.etl_status))
    EXECUTE FUNCTION data_manager.etl_contexts_announce_finished();

-- +goose Down
DROP INDEX data_manager.etl_contexts_running;
DROP TRIGGER etl_contexts_announce_finished ON data_manager.etl_contexts;
DROP FUNCTION data_manager.etl_contexts_announce_finished();
ALTER TABLE data_manager.etl_contexts DROP COLUMN lock_mode;
