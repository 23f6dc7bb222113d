-- A due task may wait for the database sessions of its previous run to
-- end before its next attempt starts (docs/operations.md "Retries and the
-- database"): waiting_for 'sessions'.
--
-- Additive: the check accepts one more value. NOT VALID, so that the
-- table is not read under the lock the change takes: every row holds one
-- of the values it accepted already, and rows written from now on are
-- checked.

-- +goose Up
ALTER TABLE data_manager.etl_contexts
    DROP CONSTRAINT etl_contexts_waiting_for_check,
    ADD CONSTRAINT etl_contexts_waiting_for_check
        CHECK (waiting_for IN ('queue_paused', 'kind_blocked', 'queue_full', 'kind_full', 'key_full', 'sessions')) NOT VALID;

-- +goose Down
UPDATE data_manager.etl_contexts SET waiting_for = NULL WHERE waiting_for = 'sessions';
ALTER TABLE data_manager.etl_contexts
    DROP CONSTRAINT etl_contexts_waiting_for_check,
    ADD CONSTRAINT etl_contexts_waiting_for_check
        CHECK (waiting_for IN ('queue_paused', 'kind_blocked', 'queue_full', 'kind_full', 'key_full')) NOT VALID;
