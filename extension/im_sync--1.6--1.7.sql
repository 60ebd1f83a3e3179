\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.7'" to load this file. \quit

-- ---- 1.6 -> 1.7 (issue 15, failover window): a settled transfer's applied
-- record is written by a later apply pass, once the settling transaction is
-- visible (so on the synchronous standby): transfer_in.applied_at stays NULL
-- until then (transfer_ack.c, im_transfer_ack_release); this index finds them.
CREATE INDEX transfer_in_ack_due_idx ON im.transfer_in (source_node, transfer_id)
    WHERE state <> 'pending' AND applied_at IS NULL;
COMMENT ON COLUMN im.transfer_in.applied_at IS 'When its applied record was written (NULL while pending, and while settled but not yet on the synchronous standby)';
