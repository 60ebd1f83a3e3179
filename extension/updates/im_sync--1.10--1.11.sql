\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.11'" to load this file. \quit


-- ---- receipts (contract §20): delivered/read receipts to the sender's
-- devices as `receipt` private events
--   * im.private_event accepts the kind 'receipt' and gains a nullable
--     payload column at the end of the row (the receipt's keys);
--   * im.receipt_source (ACKs and read reports not yet turned into
--     receipts), im.receipt_pending (per sender and conversation: what was
--     last emitted, what is due) and im.receipt_setting (users with read
--     receipts off) are new;
--   * im.set_read_receipts and im.run_receipts are new.
ALTER TABLE im.private_event DROP CONSTRAINT private_event_kind_check;
ALTER TABLE im.private_event ADD CONSTRAINT private_event_kind_check
    CHECK (kind IN ('read_cursor', 'delete_for_me', 'receipt'));
ALTER TABLE im.private_event ADD COLUMN payload jsonb;
COMMENT ON COLUMN im.private_event.payload IS 'A receipt''s keys besides conversation_id (contract §20), NULL for other kinds';

CREATE TABLE im.receipt_source (
    user_id         bigint NOT NULL,
    conversation_id bigint,
    from_seq        bigint NOT NULL,
    to_seq          bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
SELECT pg_catalog.pg_extension_config_dump('im.receipt_source', '');
CREATE TABLE im.receipt_pending (
    user_id               bigint NOT NULL,
    conversation_id       bigint NOT NULL,
    delivered_through_seq bigint NOT NULL DEFAULT 0,
    read_through_seq      bigint NOT NULL DEFAULT 0,
    dirty_from_msg_seq    bigint,
    dirty_to_msg_seq      bigint,
    dirty                 boolean NOT NULL DEFAULT false,
    emitted_at            timestamptz,
    PRIMARY KEY (user_id, conversation_id)
);
-- The producer's due rows.
CREATE INDEX receipt_pending_dirty_idx ON im.receipt_pending (user_id, conversation_id) WHERE dirty;
SELECT pg_catalog.pg_extension_config_dump('im.receipt_pending', '');
CREATE TABLE im.receipt_setting (
    user_id        bigint PRIMARY KEY,
    read_receipts  boolean NOT NULL
);
SELECT pg_catalog.pg_extension_config_dump('im.receipt_setting', '');
COMMENT ON TABLE im.receipt_source IS 'ACKs and read reports not yet turned into receipts, one row per call that moved (contract §20)';
COMMENT ON TABLE im.receipt_pending IS 'Per sender and conversation: the receipt state last emitted and what is due (contract §20)';
COMMENT ON TABLE im.receipt_setting IS 'Users who turned read receipts off (contract §20)';

CREATE FUNCTION im.set_read_receipts(user_id bigint, enabled boolean, trace_id text DEFAULT NULL)
RETURNS TABLE(read_receipts boolean)
AS 'MODULE_PATHNAME', 'im_set_read_receipts' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.run_receipts(max_rows int DEFAULT 10000)
RETURNS bigint AS 'MODULE_PATHNAME', 'im_run_receipts' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
REVOKE ALL ON FUNCTION im.set_read_receipts(bigint, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.run_receipts(integer) FROM PUBLIC;
COMMENT ON FUNCTION im.set_read_receipts(bigint, boolean, text) IS 'Turns the user''s read receipts on or off; off, others learn no read state of the user (contract §20)';
COMMENT ON FUNCTION im.run_receipts(integer) IS 'Turns queued ACKs and read reports into receipt private events now, as the fanout workers do (contract §20)';
