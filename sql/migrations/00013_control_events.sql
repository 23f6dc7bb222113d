-- Who paused, resumed, blocked and unblocked what, and when (README "The
-- status page"): queue_pauses and kind_blocks hold only what is in force,
-- and lose the record of a pause once it is lifted. Written in the
-- transaction of the action it records; never updated. Additive: a new
-- table that task processes of v0.1.0 never read.

-- +goose Up
CREATE TABLE data_manager.control_events (
    control_event_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at       timestamptz NOT NULL DEFAULT now(),
    action           text NOT NULL CHECK (action IN ('PAUSED', 'RESUMED', 'BLOCKED', 'UNBLOCKED')),
    -- The queue of a pause or resume; the kind of a block or unblock.
    queue            text CHECK ((queue IS NULL) = (action IN ('BLOCKED', 'UNBLOCKED'))),
    kind             text CHECK ((kind IS NULL) = (action IN ('PAUSED', 'RESUMED'))),
    reason           text NOT NULL DEFAULT '',
    -- Who did it: user@host for the CLI and the Go client, and for the
    -- status page the name its operator gave, the page's host and the
    -- address the request came from.
    actor            text NOT NULL
);

-- +goose Down
DROP TABLE data_manager.control_events;
