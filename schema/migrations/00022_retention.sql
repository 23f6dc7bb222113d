-- Retention (docs/operations.md "Retention"): a finished task older than
-- the supervisors' retention is removed with its events, its attempts and
-- its River job, by etlcontext.Prune, which says so in the transaction's
-- setting dama.pruning. Nothing else deletes an event, and nothing
-- deletes an unfinished task's: the history is kept for as long as it is
-- wanted, and no longer.
--
-- Additive: a trigger function replaced in place (no lock on event_store).

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('dama.pruning', true) = 'on'
       AND EXISTS (SELECT 1 FROM data_manager.etl_contexts AS c
                    WHERE c.etl_context_id = OLD.etl_context_id
                      AND data_manager.is_finished(c.etl_status)) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'data_manager.event_store keeps every event: % is refused', TG_OP
        USING ERRCODE = 'DMAPP';
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION data_manager.event_store_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'data_manager.event_store keeps every event: % is refused', TG_OP
        USING ERRCODE = 'DMAPP';
END
$$;
-- +goose StatementEnd
