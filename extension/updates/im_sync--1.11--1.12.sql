\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.12'" to load this file. \quit

-- ---- receipts across nodes (contract §20)
-- A receipt is produced on the reader's node and carried to the sender's
-- node by a transfer (user/receipt.c, sharding.md "Receipts"): a direct
-- conversation's cumulative seqs, a fanout group's per-node parts.
ALTER TABLE im.receipt_pending ADD COLUMN read_hidden boolean NOT NULL DEFAULT false;
CREATE TABLE im.receipt_part (
    message_id      bigint NOT NULL,
    node_name       text   NOT NULL,
    sender_id       bigint NOT NULL,
    conversation_id bigint NOT NULL,
    delivered_count bigint NOT NULL CHECK (delivered_count BETWEEN 0 AND member_count),
    read_count      bigint NOT NULL CHECK (read_count BETWEEN 0 AND member_count),
    member_count    bigint NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, node_name)
);
SELECT pg_catalog.pg_extension_config_dump('im.receipt_part', '');
COMMENT ON TABLE im.receipt_part IS 'Per message of a fanout group, the receipt counts another node carried for its own members (contract §15, §20)';
COMMENT ON COLUMN im.receipt_pending.read_hidden IS 'A carried direct receipt''s reader turned read receipts off: no read state is emitted (contract §20)';
