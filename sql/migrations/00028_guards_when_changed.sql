-- The two BEFORE UPDATE triggers of etl_contexts that look only at a
-- context's state fire only when it changes (a WHEN clause, which the
-- server evaluates without entering PL/pgSQL): a task's row is updated six
-- times, and four of those (its job's id, its INITIAL event, its runner's
-- and its command's records) change none of it. Each function already
-- returned NEW unchanged in that case: etl_contexts_guard raises only when
-- one of the six columns differs, etl_contexts_status_by_event only when
-- the status does.
-- +goose Up
DROP TRIGGER etl_contexts_guard ON data_manager.etl_contexts;
CREATE TRIGGER etl_contexts_guard BEFORE UPDATE ON data_manager.etl_contexts
    FOR EACH ROW
    WHEN ((NEW.etl_status, NEW.attempt, NEW.run_id, NEW.finished_at, NEW.kind, NEW.queue)
          IS DISTINCT FROM (OLD.etl_status, OLD.attempt, OLD.run_id, OLD.finished_at, OLD.kind, OLD.queue))
    EXECUTE FUNCTION data_manager.etl_contexts_guard();
DROP TRIGGER etl_contexts_status_by_event ON data_manager.etl_contexts;
CREATE TRIGGER etl_contexts_status_by_event BEFORE UPDATE OF etl_status ON data_manager.etl_contexts
    FOR EACH ROW
    WHEN (NEW.etl_status IS DISTINCT FROM OLD.etl_status)
    EXECUTE FUNCTION data_manager.etl_contexts_status_by_event();

-- +goose Down
DROP TRIGGER etl_contexts_guard ON data_manager.etl_contexts;
CREATE TRIGGER etl_contexts_guard BEFORE UPDATE ON data_manager.etl_contexts
    FOR EACH ROW EXECUTE FUNCTION data_manager.etl_contexts_guard();
DROP TRIGGER etl_contexts_status_by_event ON data_manager.etl_contexts;
CREATE TRIGGER etl_contexts_status_by_event BEFORE UPDATE OF etl_status ON data_manager.etl_contexts
    FOR EACH ROW EXECUTE FUNCTION data_manager.etl_contexts_status_by_event();
