\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.6'" to load this file. \quit

/*
 * ---- 1.5 -> 1.6.  The blocks below are appended verbatim, without this
 * file's \echo line, to the 1.5 full script to make im_sync--1.6.sql, so the
 * two reach the same catalog (test/suites/70-upgrade.sh compares them).
 */

-- ---- 1.5 -> 1.6 (issue 15, router checks): the node functions of the
-- router's cross-node §18.3 check, im.shard_expected_receipts (conversation
-- node) and im.shard_check_receipts (user node).  Helper shops' block; the
-- other issue-15 block (helper shnode) is separate.
--
-- The router's im.reconcile() asks each conversation node what its periods
-- say each member on another node may receive, for its newest processed
-- positions (bounded: max_positions, the newest outbox items by id), and
-- hands each destination its part; the destination compares that with its
-- users' logs and answers with reconcile rows named like the single node's
-- delivery audit (fanout_missing / fanout_extra).  A position whose
-- transfer to a node is not yet acknowledged (conversation side) or not
-- applied (user side: pending or quarantined) is not checked there: the
-- transfer checks report those.  The expected recipients are derived here
-- on their own, with the period predicate of reconcile.c's audit written
-- out, not fanout's: a checker must not share the code it checks.

-- Conversation node: one row per other node, `expected` a JSON array of
-- {e: source event id, c: conversation, s: msg_seq, k: kind, sh: a
-- shared_log position (marker, not an event), t: the event's created_at,
-- u: user, p: delivery scope}; one element with u = NULL per checked
-- position (so the destination also sees positions it must have no event
-- for), one per expected (user, period) placed on that node.
CREATE FUNCTION im.shard_expected_receipts(max_positions int DEFAULT 10000)
RETURNS TABLE(dest_node text, expected jsonb)
LANGUAGE sql STABLE AS $$
  WITH cfg AS (SELECT c.self_name, c.bucket_nodes FROM im.shard_config c),
  item AS (
    SELECT o.outbox_id, o.conversation_id, o.msg_seq, o.source_event_id, e.kind, e.created_at,
           (e.kind IN ('message', 'reaction', 'pin') AND e.mode OPERATOR(pg_catalog.=) 'shared_log') IS TRUE AS shared,
           COALESCE(t.msg_seq, e.msg_seq) AS vis_seq,
           CASE WHEN e.kind OPERATOR(pg_catalog.=) 'reaction' THEN e.msg_seq END AS own_seq
      FROM im.outbox o CROSS JOIN cfg
      JOIN im.event e ON e.message_id OPERATOR(pg_catalog.=) o.source_event_id
      LEFT JOIN im.event t ON t.message_id OPERATOR(pg_catalog.=) e.target_message_id
     WHERE o.state OPERATOR(pg_catalog.=) 'done' AND o.private_user_id IS NULL
       AND cfg.bucket_nodes[o.conversation_id OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1]
           OPERATOR(pg_catalog.=) cfg.self_name
     ORDER BY o.outbox_id DESC
     LIMIT $1),
  exp AS (
    SELECT i.outbox_id, p.user_id, p.membership_period_id AS scope
      FROM item i JOIN im.membership_period p ON p.conversation_id OPERATOR(pg_catalog.=) i.conversation_id
       AND p.join_seq OPERATOR(pg_catalog.<=) i.vis_seq
       AND (p.leave_seq IS NULL OR p.leave_seq OPERATOR(pg_catalog.>=) i.vis_seq)
       AND (i.own_seq IS NULL OR p.leave_seq IS NULL OR p.leave_seq OPERATOR(pg_catalog.>=) i.own_seq)
    UNION
    SELECT i.outbox_id, p.user_id, p.membership_period_id
      FROM item i JOIN im.membership_period p ON p.leave_event_id OPERATOR(pg_catalog.=) i.source_event_id
     WHERE i.kind OPERATOR(pg_catalog.=) 'leave'),
  dest AS (
    SELECT DISTINCT n AS dest_node FROM cfg, pg_catalog.unnest(cfg.bucket_nodes) n
     WHERE n OPERATOR(pg_catalog.<>) cfg.self_name),
  want AS (
    SELECT d.dest_node, i.outbox_id, NULL::bigint AS user_id, NULL::bigint AS scope
      FROM dest d CROSS JOIN item i
    UNION ALL
    SELECT cfg.bucket_nodes[x.user_id OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1], x.outbox_id, x.user_id, x.scope
      FROM exp x CROSS JOIN cfg
     WHERE cfg.bucket_nodes[x.user_id OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1]
           OPERATOR(pg_catalog.<>) cfg.self_name
       AND NOT EXISTS (SELECT 1 FROM im.fanout_quarantine q
                        WHERE q.outbox_id OPERATOR(pg_catalog.=) x.outbox_id
                          AND q.user_id OPERATOR(pg_catalog.=) x.user_id))
  SELECT w.dest_node,
         pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
             'e', i.source_event_id, 'c', i.conversation_id, 's', i.msg_seq, 'k', i.kind,
             'sh', i.shared, 't', i.created_at, 'u', w.user_id, 'p', w.scope)
           ORDER BY i.outbox_id, w.user_id NULLS FIRST, w.scope)
    FROM want w JOIN item i ON i.outbox_id OPERATOR(pg_catalog.=) w.outbox_id
   WHERE NOT EXISTS (SELECT 1 FROM im.transfer_out tr
                      WHERE tr.outbox_id OPERATOR(pg_catalog.=) w.outbox_id
                        AND tr.dest_node OPERATOR(pg_catalog.=) w.dest_node)
   GROUP BY w.dest_node
   ORDER BY w.dest_node
$$;

-- User node: compares shard_expected_receipts' part for this node (from
-- conversation node $1) with the logs of the users placed here.  Rows as
-- im.reconcile()'s: fanout_missing (error) for an expected (user, period)
-- without its event — unless the position is a shared_log one whose marker
-- reaches it, or the user's log was collected past the event (GC'd history
-- is not checked, as on one node) — and fanout_extra (critical) for an
-- event of a checked position nobody's period calls for.
CREATE FUNCTION im.shard_check_receipts(source_node text, expected jsonb)
RETURNS TABLE(check_name text, severity text, conversation_id bigint, user_id bigint, detail jsonb)
LANGUAGE sql STABLE AS $$
  WITH cfg AS (SELECT c.self_name, c.bucket_nodes FROM im.shard_config c),
  x AS (
    SELECT * FROM pg_catalog.jsonb_to_recordset($2)
        AS x(e bigint, c bigint, s bigint, k text, sh boolean, t timestamptz, u bigint, p bigint)),
  pos AS (
    SELECT DISTINCT ON (x.e) x.e, x.c, x.s, x.k, x.sh, x.t FROM x
     WHERE NOT EXISTS (SELECT 1 FROM im.transfer_in ti
                        WHERE ti.source_node OPERATOR(pg_catalog.=) $1
                          AND ti.source_event_id OPERATOR(pg_catalog.=) x.e
                          AND ti.state OPERATOR(pg_catalog.<>) 'applied')
     ORDER BY x.e),
  exp AS (
    SELECT x.u, x.e, x.p FROM x CROSS JOIN cfg
     WHERE x.u IS NOT NULL
       AND cfg.bucket_nodes[x.u OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1] OPERATOR(pg_catalog.=) cfg.self_name),
  act AS (
    SELECT b.user_id AS u, b.source_event_id AS e, b.delivery_scope AS p FROM im.inbox b
     WHERE b.source_event_id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT pos.e FROM pos))),
  cmp AS (
    SELECT COALESCE(w.u, a.u) AS u, COALESCE(w.e, a.e) AS e, COALESCE(w.p, a.p) AS p,
           w.u IS NOT NULL AS expected, a.u IS NOT NULL AS delivered
      FROM exp w FULL JOIN act a ON a.u OPERATOR(pg_catalog.=) w.u AND a.e OPERATOR(pg_catalog.=) w.e
       AND a.p OPERATOR(pg_catalog.=) w.p)
  SELECT CASE WHEN m.expected THEN 'fanout_missing' ELSE 'fanout_extra' END,
         CASE WHEN m.expected THEN 'error' ELSE 'critical' END,
         pos.c, m.u,
         pg_catalog.jsonb_build_object('source_event_id', pos.e, 'msg_seq', pos.s, 'delivery_scope', m.p,
                                       'kind', pos.k, 'conversation_node', $1)
    FROM cmp m JOIN pos ON pos.e OPERATOR(pg_catalog.=) m.e
   WHERE m.expected IS DISTINCT FROM m.delivered
     AND NOT (m.expected AND pos.sh AND EXISTS (
           SELECT 1 FROM im.user_conversation uc
            WHERE uc.user_id OPERATOR(pg_catalog.=) m.u AND uc.conversation_id OPERATOR(pg_catalog.=) pos.c
              AND uc.dirty_target_msg_seq OPERATOR(pg_catalog.>=) pos.s))
     AND NOT (m.expected AND EXISTS (
           SELECT 1 FROM im.user_head h
            WHERE h.user_id OPERATOR(pg_catalog.=) m.u AND h.gc_floor OPERATOR(pg_catalog.>) 0
              AND NOT COALESCE((SELECT pg_catalog.min(b.created_at) FROM im.inbox b
                                 WHERE b.user_id OPERATOR(pg_catalog.=) m.u) OPERATOR(pg_catalog.<) pos.t, false)))
   ORDER BY pos.c, m.u, pos.s, m.p
$$;

COMMENT ON FUNCTION im.shard_expected_receipts(integer) IS 'What this conversation node''s periods say users on each other node may receive, for its newest processed positions: the router''s cross-node check (contract §15, §18.3, issue 15)';
COMMENT ON FUNCTION im.shard_check_receipts(text, jsonb) IS 'This user node''s logs against shard_expected_receipts'' part for it: fanout_missing / fanout_extra rows (contract §15, §18.3, issue 15)';

-- issue 15 (router checks): SECURITY DEFINER, pinned search_path, no PUBLIC execute
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['shard_expected_receipts', 'shard_check_receipts'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;
-- ---- 1.5 -> 1.6 (issue 10): one CHECK per send-path table, its rule in C
-- PostgreSQL reads each table CHECK from its stored node text and plans it
-- again at every INSERT or UPDATE statement (ExecRelCheck): the event's three
-- CHECKs (4.5 kB of node text) at every send, the conversation's at every
-- head UPDATE.  Each becomes one CHECK calling an immutable C function with
-- the columns as arguments (row_rules.c: the same rules, NULL passes as
-- before).  Adding a constraint validates the existing rows (one scan of
-- each table under its ACCESS EXCLUSIVE lock).  The functions run no SQL, so
-- they are not SECURITY DEFINER (a pinned search_path would cost a GUC
-- save and restore per row); PUBLIC cannot execute them.
CREATE FUNCTION im.event_fields_valid(kind text, sender bigint, idempotency_key text,
                                      target bigint, reply_to bigint, pin bigint) RETURNS boolean
AS 'MODULE_PATHNAME', 'im_event_fields_valid' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION im.conversation_pair_valid(kind text, lo bigint, hi bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'im_conversation_pair_valid' LANGUAGE C IMMUTABLE PARALLEL SAFE;
REVOKE ALL ON FUNCTION im.event_fields_valid(text, bigint, text, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.conversation_pair_valid(text, bigint, bigint) FROM PUBLIC;
COMMENT ON FUNCTION im.event_fields_valid(text, bigint, text, bigint, bigint, bigint) IS 'CHECK event_kind_fields: which kinds carry an idempotency key, a target, a reply or pin target (contract §3, §14)';
COMMENT ON FUNCTION im.conversation_pair_valid(text, bigint, bigint) IS 'CHECK conversation_direct_pair: a direct conversation names its ordered pair, a group none (contract §1)';
ALTER TABLE im.event
    DROP CONSTRAINT event_kind_fields,
    DROP CONSTRAINT event_reply_to_check,
    DROP CONSTRAINT event_pin_check,
    ADD CONSTRAINT event_kind_fields CHECK (im.event_fields_valid(kind, sender_id, client_msg_id,
        target_message_id, reply_to_message_id, pin_message_id));
ALTER TABLE im.conversation
    DROP CONSTRAINT conversation_direct_pair,
    ADD CONSTRAINT conversation_direct_pair CHECK (im.conversation_pair_valid(kind, direct_user_lo,
        direct_user_hi));

-- ---- 1.5 -> 1.6 (issue 10): no foreign key on im.event.target_message_id
-- Its check was an AFTER trigger queued and fired for every event insert
-- (every send), and on a recall, edit or reaction a FOR KEY SHARE lock of
-- the target (a WAL record and a dirtied page).  The target is checked
-- under the conversation lock by the function that writes the event
-- (send.c check_target, relation.c), events are never deleted, and
-- im.reconcile() reports a missing or foreign target (relation_target_mismatch),
-- as for reply and pin targets since 1.3.
ALTER TABLE im.event DROP CONSTRAINT event_target_message_id_fkey;

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
