\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.6'" to load this file. \quit

/*
 * ---- 1.5 -> 1.6.  The blocks below are appended verbatim, without this
 * file's \echo line, to the 1.5 full script to make im_sync--1.6.sql, so the
 * two reach the same catalog (test/suites/70-upgrade.sh compares them).
 */

-- ---- 1.5 -> 1.6 (issue 15): copies leave the sender's idempotency key
-- Contract §15 keys a sharded installation's idempotency by (sender,
-- conversation, client_msg_id), so a sender may reuse a client_msg_id in
-- conversations on two nodes; a user node holding copies of both must take
-- both.  The key (sender_id, client_msg_id) now covers exactly the events
-- that can answer a retry: those carrying their request's digest, i.e. the
-- events this node accepted itself.  A copy of a remote conversation's
-- event never carries one (transfer_in.c drops it: retries and IS409 are
-- answered by the conversation's own node), so copies never take part in
-- the key, while on a single node and for a node's own conversations it is
-- exactly the old UNIQUE constraint (every keyed event has a digest;
-- send.c has always answered IS409 for one without).  Copies received
-- before 1.6 lose their digest here.
UPDATE im.event e SET request_digest = NULL
  FROM im.shard_config c
 WHERE e.request_digest IS NOT NULL
   AND c.bucket_nodes[(e.conversation_id OPERATOR(pg_catalog.%) 64) OPERATOR(pg_catalog.+) 1]
       OPERATOR(pg_catalog.<>) c.self_name;
ALTER TABLE im.event DROP CONSTRAINT event_sender_id_client_msg_id_key;
CREATE UNIQUE INDEX event_sender_id_client_msg_id_key ON im.event (sender_id, client_msg_id)
    WHERE request_digest IS NOT NULL;
COMMENT ON INDEX im.event_sender_id_client_msg_id_key IS 'The idempotency key (sender, client_msg_id) of the events this node accepted; copies carry no digest (contract §3, §15)';

-- ---- 1.5 -> 1.6 (issue 15): an ex-member's conversation_list shows the mode in force now
-- One node's conversation_list reads the conversation row: the current
-- head and mode, for members and ex-members alike.  A mode switch of a
-- group with no member left on a node reaches no copy there, so the router
-- takes both from the conversation's node (im.conversation_heads gave the
-- head only; it stays for the 1.5 router API).
CREATE FUNCTION im.conversation_current(conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, head_msg_seq bigint, mode text)
AS 'MODULE_PATHNAME', 'im_conversation_current' LANGUAGE C;
COMMENT ON FUNCTION im.conversation_current(bigint[]) IS 'Authoritative head and mode of the conversations this node owns, for the router''s conversation_list (contract §15, issue 15)';

DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['conversation_current'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;
