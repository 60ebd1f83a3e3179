\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.9'" to load this file. \quit

-- ---- 1.8 -> 1.9: second hardening round (docs: README "Security")

-- ---- deletions for oneself across nodes: the router's cross-node check
-- A deletion of a user placed on another node than its conversation is
-- recorded on the conversation's node (fetch_messages) and handed off, in
-- the same transaction, to the user's node (unread, the devices' event)
-- through a transfer (read_state.c, transfer_out.c, transfer_in.c).  The
-- router's im.reconcile() asks every node for its deletions whose other
-- side is on another node (im.shard_remote_deletions, the newest max_rows
-- of each node) and hands each list to that other node, which answers
-- with a delete_for_me_unpaired row for every deletion it lacks
-- (im.shard_check_deletions).  A hand-off still in flight is not checked:
-- its item pending or its transfer unacknowledged (conversation side), its
-- transfer not applied (user side: the transfer checks report those).

-- Every node: {u: user, m: message, c: conversation, e: the hand-off's
-- private event on the conversation's node (absent: none recorded)} per
-- deletion, one row per node holding the other side.
CREATE FUNCTION im.shard_remote_deletions(max_rows int DEFAULT 10000)
RETURNS TABLE(other_node text, deletions jsonb)
LANGUAGE sql STABLE AS $$
  WITH cfg AS (SELECT c.self_name, c.bucket_nodes FROM im.shard_config c),
  d AS (
    SELECT d.user_id, d.message_id, e.conversation_id, d.deleted_at,
           cfg.bucket_nodes[d.user_id OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1] AS user_node,
           cfg.bucket_nodes[e.conversation_id OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1] AS conv_node,
           cfg.self_name
      FROM im.deleted_for_me d CROSS JOIN cfg
      JOIN im.event e ON e.message_id OPERATOR(pg_catalog.=) d.message_id),
  mine AS (
    SELECT d.*, (SELECT pg_catalog.max(pe.private_event_id) FROM im.private_event pe
                  WHERE pe.user_id OPERATOR(pg_catalog.=) d.user_id
                    AND pe.message_id OPERATOR(pg_catalog.=) d.message_id
                    AND pe.kind OPERATOR(pg_catalog.=) 'delete_for_me'
                    AND d.conv_node OPERATOR(pg_catalog.=) d.self_name) AS hand_off
      FROM d
     WHERE d.user_node OPERATOR(pg_catalog.<>) d.conv_node
       AND d.self_name OPERATOR(pg_catalog.=) ANY (ARRAY[d.user_node, d.conv_node])
     ORDER BY d.deleted_at DESC, d.user_id, d.message_id
     LIMIT $1)
  SELECT CASE WHEN m.conv_node OPERATOR(pg_catalog.=) m.self_name THEN m.user_node ELSE m.conv_node END,
         pg_catalog.jsonb_agg(pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
             'u', m.user_id, 'm', m.message_id, 'c', m.conversation_id, 'e', m.hand_off))
           ORDER BY m.user_id, m.message_id)
    FROM mine m
   WHERE NOT EXISTS (SELECT 1 FROM im.outbox o
                      WHERE o.source_event_id OPERATOR(pg_catalog.=) m.hand_off
                        AND (o.state OPERATOR(pg_catalog.=) 'pending'
                             OR EXISTS (SELECT 1 FROM im.transfer_out t
                                         WHERE t.outbox_id OPERATOR(pg_catalog.=) o.outbox_id)))
   GROUP BY 1
   ORDER BY 1
$$;

-- The other side: the listed deletions (from node $1) this node lacks, as
-- reconcile rows; a hand-off that arrived here but is not applied yet
-- (pending, quarantined, dead) is the transfer checks' row, not this one.
CREATE FUNCTION im.shard_check_deletions(source_node text, deletions jsonb)
RETURNS TABLE(check_name text, severity text, conversation_id bigint, user_id bigint, detail jsonb)
LANGUAGE sql STABLE AS $$
  SELECT 'delete_for_me_unpaired'::text, 'error'::text, x.c, x.u,
         pg_catalog.jsonb_build_object('message_id', x.m, 'deleted_on', $1,
             'missing_on', (SELECT c.self_name FROM im.shard_config c),
             'hint', 'delete_for_me again through the router hands the deletion off again')
    FROM pg_catalog.jsonb_to_recordset($2) AS x(u bigint, m bigint, c bigint, e bigint)
   WHERE NOT EXISTS (SELECT 1 FROM im.deleted_for_me d
                      WHERE d.user_id OPERATOR(pg_catalog.=) x.u AND d.message_id OPERATOR(pg_catalog.=) x.m)
     AND NOT EXISTS (SELECT 1 FROM im.transfer_in ti
                      WHERE ti.source_node OPERATOR(pg_catalog.=) $1
                        AND ti.source_event_id OPERATOR(pg_catalog.=) x.e
                        AND ti.state OPERATOR(pg_catalog.<>) 'applied')
   ORDER BY x.c, x.u, x.m
$$;

COMMENT ON FUNCTION im.shard_remote_deletions(integer) IS 'This node''s newest deletions for oneself whose other side (the conversation''s or the user''s node) is another node, per that node: the router''s cross-node check (contract §15)';
COMMENT ON FUNCTION im.shard_check_deletions(text, jsonb) IS 'The deletions of shard_remote_deletions'' list for this node that it lacks: delete_for_me_unpaired rows (contract §15)';
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['shard_remote_deletions', 'shard_check_deletions'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;
