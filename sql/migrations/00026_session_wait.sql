-- A due task may wait for the database sessions of its previous run to
-- end before its next attempt starts (docs/operations.md "Retries and the
-- database"): waiting_for 'sessions'.
--
-- Additive: the check accepts one more value. Without a transaction, so
-- that the table is read to validate it under a lock that blocks no write
-- (VALIDATE CONSTRAINT takes SHARE UPDATE EXCLUSIVE), not under the brief
-- ACCESS EXCLUSIVE lock of the change itself. Run again after a failure
-- in between, it does the same.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE data_manager.etl_contexts
    DROP CONSTRAINT etl_contexts_waiting_for_check,
    ADD CONSTRAINT etl_contexts_waiting_for_check
        CHECK (waiting_for IN ('queue_paused', 'kind_blocked', 'queue_full', 'kind_full', 'key_full', 'sessions')) NOT VALID;
ALTER TABLE data_manager.etl_contexts VALIDATE CONSTRAINT etl_contexts_waiting_for_check;

-- +goose Down
UPDATE data_manager.etl_contexts SET waiting_for = NULL WHERE waiting_for = 'sessions';
ALTER TABLE data_manager.etl_contexts
    DROP CONSTRAINT etl_contexts_waiting_for_check,
    ADD CONSTRAINT etl_contexts_waiting_for_check
        CHECK (waiting_for IN ('queue_paused', 'kind_blocked', 'queue_full', 'kind_full', 'key_full'));
