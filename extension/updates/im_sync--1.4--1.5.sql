\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.5'" to load this file. \quit

/*
 * ---- 1.4 -> 1.5.  The blocks below are appended verbatim, without this
 * file's \echo line, to the 1.4 full script to make im_sync--1.5.sql, so the
 * two reach the same catalog (test/suites/70-upgrade.sh compares them).
 */

-- ---- 1.4 -> 1.5 (issue 15): shards — placement, transfers, node functions
-- A node with no row in im.shard_config is the single-node im_sync (ids,
-- outputs unchanged).  A configured node owns the buckets whose entry names
-- it; ids of conversations, events and push jobs carry their bucket in the
-- low 6 bits (shard_map.c).
CREATE TABLE im.shard_config (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    self_name     text NOT NULL CHECK (self_name ~ '^[a-z][a-z0-9_]{0,40}$'),
    bucket_nodes  text[] NOT NULL CHECK (pg_catalog.cardinality(bucket_nodes) = 64
                                         AND pg_catalog.array_position(bucket_nodes, NULL) IS NULL),
    configured_at timestamptz NOT NULL DEFAULT now()
);
SELECT pg_catalog.pg_extension_config_dump('im.shard_config', '');

-- Transfers (transfer_out.c, transfer_in.c, transfer_ack.c).  One row per
-- (outbox item, destination node) written by the conversation node's fanout
-- transaction; publication im_to_<node> (publish = 'insert', row filter on
-- dest_node) carries it.  On the destination the ALWAYS trigger turns the
-- replicated row into an im.transfer_in row and drops it (returns NULL), so
-- nothing of a replicated row ever reaches a unique key in the apply worker.
CREATE SEQUENCE im.transfer_id_seq;
SELECT pg_catalog.pg_extension_config_dump('im.transfer_id_seq', '');
CREATE TABLE im.transfer_out (
    transfer_id     bigint PRIMARY KEY DEFAULT nextval('im.transfer_id_seq'),
    source_node     text   NOT NULL,
    dest_node       text   NOT NULL,
    outbox_id       bigint NOT NULL,
    conversation_id bigint NOT NULL,
    msg_seq         bigint NOT NULL,
    source_event_id bigint NOT NULL,
    payload         jsonb  NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX transfer_out_dest_idx ON im.transfer_out (dest_node, transfer_id);
CREATE INDEX transfer_out_outbox_idx ON im.transfer_out (outbox_id);
SELECT pg_catalog.pg_extension_config_dump('im.transfer_out', '');

-- What a destination received: exact (source node, transfer id) pairs, the
-- duplicate filter (never "below the highest seen": ids are drawn before
-- commit, so they arrive out of order).  state: pending → applied, or
-- quarantined with the error of the failed apply (reconcile reports it).
CREATE TABLE im.transfer_in (
    source_node     text   NOT NULL,
    transfer_id     bigint NOT NULL,
    conversation_id bigint NOT NULL,
    msg_seq         bigint NOT NULL,
    source_event_id bigint NOT NULL,
    payload         jsonb,            -- NULL once applied (the copies hold it)
    state           text   NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'applied', 'quarantined')),
    last_error      text,
    sent_at         timestamptz NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    applied_at      timestamptz,
    duplicates      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (source_node, transfer_id)
);
CREATE INDEX transfer_in_pending_idx ON im.transfer_in (conversation_id, msg_seq) WHERE state = 'pending';
CREATE INDEX transfer_in_quarantined_idx ON im.transfer_in (source_node, transfer_id) WHERE state = 'quarantined';
SELECT pg_catalog.pg_extension_config_dump('im.transfer_in', '');

-- The back channel (PostgreSQL 15 has no origin = none): the destination
-- inserts one row per applied transfer; publication im_to_<source> carries
-- it (row filter on source_node); on the source the ALWAYS trigger deletes
-- exactly that transfer_out row and drops the ack row.
CREATE TABLE im.transfer_ack (
    source_node  text   NOT NULL,
    transfer_id  bigint NOT NULL,
    applied_by   text   NOT NULL,
    applied_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_node, transfer_id, applied_by)
);
SELECT pg_catalog.pg_extension_config_dump('im.transfer_ack', '');

CREATE FUNCTION im.transfer_out_arrive() RETURNS trigger
AS 'MODULE_PATHNAME', 'im_transfer_out_arrive' LANGUAGE C;
CREATE TRIGGER transfer_out_arrive BEFORE INSERT ON im.transfer_out
    FOR EACH ROW EXECUTE FUNCTION im.transfer_out_arrive();
ALTER TABLE im.transfer_out ENABLE ALWAYS TRIGGER transfer_out_arrive;
CREATE FUNCTION im.transfer_ack_arrive() RETURNS trigger
AS 'MODULE_PATHNAME', 'im_transfer_ack_arrive' LANGUAGE C;
CREATE TRIGGER transfer_ack_arrive BEFORE INSERT ON im.transfer_ack
    FOR EACH ROW EXECUTE FUNCTION im.transfer_ack_arrive();
ALTER TABLE im.transfer_ack ENABLE ALWAYS TRIGGER transfer_ack_arrive;

CREATE FUNCTION im.shard_configure(self_name text, bucket_nodes text[]) RETURNS void
AS 'MODULE_PATHNAME', 'im_shard_configure' LANGUAGE C;
CREATE FUNCTION im.shard_self() RETURNS text
AS 'MODULE_PATHNAME', 'im_shard_self' LANGUAGE C STABLE;
CREATE FUNCTION im.shard_pending()
RETURNS TABLE(outbox_pending bigint, transfers_unacked bigint, inbound_unapplied bigint)
AS 'MODULE_PATHNAME', 'im_shard_pending' LANGUAGE C;
CREATE FUNCTION im.shard_apply_transfers(max_transfers int DEFAULT 10000) RETURNS bigint
AS 'MODULE_PATHNAME', 'im_shard_apply_transfers' LANGUAGE C;
CREATE FUNCTION im.shard_retry_quarantined(source_node text, transfer_id bigint) RETURNS boolean
AS 'MODULE_PATHNAME', 'im_shard_retry_quarantined' LANGUAGE C;
CREATE FUNCTION im.conversation_heads(conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, head_msg_seq bigint)
AS 'MODULE_PATHNAME', 'im_conversation_heads' LANGUAGE C;
CREATE FUNCTION im.message_audience(message_id bigint)
RETURNS TABLE(user_id bigint, conversation_id bigint, msg_seq bigint, accepted boolean)
AS 'MODULE_PATHNAME', 'im_message_audience' LANGUAGE C;
CREATE FUNCTION im.shard_message_status(message_id bigint, user_ids bigint[])
RETURNS TABLE(user_id bigint, device_id text, accepted boolean,
              in_sync_scope boolean, device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_shard_message_status' LANGUAGE C;
CREATE FUNCTION im.shard_message_facts(message_id bigint, user_ids bigint[])
RETURNS TABLE(user_id bigint, accepted boolean, in_sync_scope boolean,
              any_device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_shard_message_facts' LANGUAGE C;
CREATE FUNCTION im.shard_received_positions(user_ids bigint[])
RETURNS TABLE(user_id bigint, conversation_id bigint, msg_seq bigint, source_event_id bigint, delivery_scope bigint)
AS 'MODULE_PATHNAME', 'im_shard_received_positions' LANGUAGE C;

COMMENT ON FUNCTION im.shard_configure(text, text[]) IS 'Stores this node''s name and the 64-bucket node map; idempotent (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_self() IS 'This node''s name, NULL when not sharded (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_pending() IS 'Outbox items pending, transfers not yet acknowledged, inbound transfers not applied (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_apply_transfers(integer) IS 'Applies pending inbound transfers into the local copies and outbox (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_retry_quarantined(text, bigint) IS 'Puts a quarantined inbound transfer back to pending (contract §15, issue 15)';
COMMENT ON FUNCTION im.conversation_heads(bigint[]) IS 'Authoritative heads of the conversations this node owns (contract §15, issue 15)';
COMMENT ON FUNCTION im.message_audience(bigint) IS 'The users contract §1 lets see a message, on its conversation node (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_message_status(bigint, bigint[]) IS 'message_status''s device rows for these users of this node, from its copies (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_message_facts(bigint, bigint[]) IS 'message_facts'' user rows for these users of this node, from its copies (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_received_positions(bigint[]) IS 'The conversation positions in these local users'' logs, for the cross-node check (contract §15, issue 15)';

COMMENT ON TABLE im.shard_config IS 'This node''s name and the 64-bucket node map; no row = not sharded (contract §15)';
COMMENT ON TABLE im.transfer_out IS 'Transfers this node''s fanout wrote for other nodes, kept until their applied record comes back (contract §15)';
COMMENT ON TABLE im.transfer_in IS 'Transfers received from other nodes by exact (source node, transfer id): pending, applied or quarantined (contract §15)';
COMMENT ON TABLE im.transfer_ack IS 'Applied records this node sends back to the transfers'' sources (contract §15)';
COMMENT ON FUNCTION im.transfer_out_arrive() IS 'Trigger: records a replicated transfer for this node in im.transfer_in and drops the row (contract §15)';
COMMENT ON FUNCTION im.transfer_ack_arrive() IS 'Trigger: deletes the acknowledged transfer on its source and drops the row (contract §15)';

-- issue 15's functions: SECURITY DEFINER, pinned search_path, no PUBLIC execute
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['shard_configure', 'shard_self',
                   'shard_pending', 'shard_apply_transfers', 'shard_retry_quarantined',
                   'conversation_heads', 'message_audience', 'shard_received_positions',
                   'shard_message_status', 'shard_message_facts',
                   'transfer_out_arrive', 'transfer_ack_arrive'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;
