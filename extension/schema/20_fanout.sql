-- ---- fanout: the transactional outbox and what fanout could not deliver
-- (fanout/: fanout.c, fanout_shared_log.c, worker.c)

CREATE SEQUENCE im.outbox_id_seq;
SELECT pg_catalog.pg_extension_config_dump('im.outbox_id_seq', '');

-- Transactional outbox: one row per conversation position or private event,
-- written in the same transaction.  Rows are kept after processing (state
-- 'done') as the evidence reconcile and message_status read.
-- Its shape rule (a position item has its msg_seq, a private event's item
-- its user and no msg_seq) is kept by the three statements that write it
-- (append.c, read_state.c, transfer_in.c) and checked by im.reconcile()
-- (outbox_item_malformed), not by a CHECK: the send path inserts here under
-- the conversation lock, where every CHECK would be planned again.
CREATE TABLE im.outbox (
    outbox_id        bigint PRIMARY KEY DEFAULT nextval('im.outbox_id_seq'),
    conversation_id  bigint NOT NULL,
    msg_seq          bigint,            -- NULL for private events
    source_event_id  bigint NOT NULL,   -- im.event.message_id or im.private_event.private_event_id
    private_user_id  bigint,            -- set for private events
    state            im.outbox_state NOT NULL DEFAULT 'pending',
    attempts         int    NOT NULL DEFAULT 0,  -- charged failures (toward fanout_max_attempts)
    transient_failures int  NOT NULL DEFAULT 0,  -- failures never charged (contract §4), they set the backoff
    last_error       text,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    processed_at     timestamptz,
    trace_id         text,              -- the request's trace id, for the workers' log lines (contract §21)
    UNIQUE (source_event_id)
);
CREATE INDEX outbox_pending_idx ON im.outbox (conversation_id, msg_seq) WHERE state = 'pending';
-- Dead letters are rare: a partial index keeps metrics and reconcile cheap.
CREATE INDEX outbox_dead_idx ON im.outbox (outbox_id) WHERE state = 'dead';
-- Retention (maintenance.c) collects done items oldest-processed first.
CREATE INDEX outbox_done_idx ON im.outbox (processed_at) WHERE state = 'done';
SELECT pg_catalog.pg_extension_config_dump('im.outbox', '');

-- Items covered by two periods of one user: kept, reported, not delivered.
CREATE TABLE im.fanout_quarantine (
    outbox_id       bigint NOT NULL REFERENCES im.outbox,
    user_id         bigint NOT NULL,
    periods         bigint[] NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (outbox_id, user_id)
);
SELECT pg_catalog.pg_extension_config_dump('im.fanout_quarantine', '');

COMMENT ON TABLE im.outbox IS 'Transactional outbox: one item per conversation position or private event; done items stay as fanout evidence until retention (contract §4)';
COMMENT ON COLUMN im.outbox.trace_id IS 'The trace id of the request that queued this item, NULL for none; the workers log it (contract §21)';
COMMENT ON TABLE im.fanout_quarantine IS 'Outbox items covered by two membership periods of one user: kept and reported, never delivered (contract §4, §8)';

-- §4 fanout
CREATE FUNCTION im.run_fanout(max_items int DEFAULT 10000)
RETURNS bigint AS 'MODULE_PATHNAME', 'im_run_fanout' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
COMMENT ON FUNCTION im.run_fanout(integer) IS 'Runs fanout of pending outbox items into the members'' logs now, as the workers do (contract §4)';
