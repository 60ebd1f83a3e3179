\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.7'" to load this file. \quit

-- ---- 1.6 -> 1.7 (issue 15, quarantine order): an inbound transfer that
-- fails to apply is retried with fanout's backoff (attempts,
-- transient_failures, next_attempt_at as on im.outbox) and is 'dead' after
-- im_sync.fanout_max_attempts charged attempts; while quarantined it holds
-- the later transfers of its conversation on this node (transfer_in.c,
-- transfer.h).  A quarantine recorded before 1.7 has no next_attempt_at:
-- it holds nothing and waits for im.shard_retry_quarantined, as in 1.6.
-- held_at: when a pending transfer was found held behind a quarantined one
-- (its applied record goes at the next pass, once the mark is on the
-- synchronous standby: the failover window below).
ALTER TABLE im.transfer_in
    ADD COLUMN attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN transient_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN next_attempt_at timestamptz,
    ADD COLUMN held_at timestamptz,
    DROP CONSTRAINT transfer_in_state_check,
    ADD CONSTRAINT transfer_in_state_check
        CHECK (state IN ('pending', 'applied', 'quarantined', 'dead'));
CREATE INDEX transfer_in_quarantined_order_idx ON im.transfer_in (conversation_id, msg_seq, transfer_id)
    WHERE state = 'quarantined';
COMMENT ON TABLE im.transfer_in IS 'Transfers received from other nodes by exact (source node, transfer id): pending, applied, quarantined (retried; holds the later ones of its conversation) or dead (contract §15)';
COMMENT ON FUNCTION im.shard_retry_quarantined(text, bigint) IS 'Puts a quarantined or dead inbound transfer back to pending, attempts cleared (contract §15, issue 15)';

-- ---- 1.6 -> 1.7 (issue 15, failover window): a settled transfer's applied
-- record is written by a later apply pass, once the settling transaction is
-- visible (so on the synchronous standby): transfer_in.applied_at stays NULL
-- until then (transfer_ack.c, im_transfer_ack_release); this index finds them.
CREATE INDEX transfer_in_ack_due_idx ON im.transfer_in (source_node, transfer_id)
    WHERE state <> 'pending' AND applied_at IS NULL;
COMMENT ON COLUMN im.transfer_in.applied_at IS 'When its applied record was written (NULL while pending, and while settled but not yet on the synchronous standby)';
