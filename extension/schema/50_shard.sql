-- ---- shards: placement, transfers between nodes, the node functions the
-- router calls (contract §15; shard/)

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
-- A quarantined transfer is retried with fanout's backoff (attempts,
-- transient_failures, next_attempt_at as on im.outbox) and is 'dead' after
-- im_sync.fanout_max_attempts charged attempts; while quarantined it holds
-- the later transfers of its conversation on this node (transfer_in.c,
-- transfer.h).  A quarantine without next_attempt_at holds nothing and waits
-- for im.shard_retry_quarantined.  held_at: when a pending transfer was found
-- held behind a quarantined one (its applied record goes at the next pass,
-- once the mark is on the synchronous standby).  applied_at stays NULL after
-- a transfer settles until a later apply pass writes its applied record, once
-- the settling transaction is visible, so on the synchronous standby
-- (transfer_ack.c, im_transfer_ack_release).
CREATE TABLE im.transfer_in (
    source_node     text   NOT NULL,
    transfer_id     bigint NOT NULL,
    conversation_id bigint NOT NULL,
    msg_seq         bigint NOT NULL,
    source_event_id bigint NOT NULL,
    payload         jsonb,            -- NULL once applied (the copies hold it)
    state           text   NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'applied', 'quarantined', 'dead')),
    last_error      text,
    sent_at         timestamptz NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    applied_at      timestamptz,
    duplicates      bigint NOT NULL DEFAULT 0,
    attempts        integer NOT NULL DEFAULT 0,
    transient_failures integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz,
    held_at         timestamptz,
    PRIMARY KEY (source_node, transfer_id)
);
CREATE INDEX transfer_in_pending_idx ON im.transfer_in (conversation_id, msg_seq) WHERE state = 'pending';
CREATE INDEX transfer_in_quarantined_idx ON im.transfer_in (source_node, transfer_id) WHERE state = 'quarantined';
CREATE INDEX transfer_in_quarantined_order_idx ON im.transfer_in (conversation_id, msg_seq, transfer_id)
    WHERE state = 'quarantined';
-- Settled transfers whose applied record is not written yet (see applied_at).
CREATE INDEX transfer_in_ack_due_idx ON im.transfer_in (source_node, transfer_id)
    WHERE state <> 'pending' AND applied_at IS NULL;
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
AS 'MODULE_PATHNAME', 'im_transfer_out_arrive' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE TRIGGER transfer_out_arrive BEFORE INSERT ON im.transfer_out
    FOR EACH ROW EXECUTE FUNCTION im.transfer_out_arrive();
ALTER TABLE im.transfer_out ENABLE ALWAYS TRIGGER transfer_out_arrive;
CREATE FUNCTION im.transfer_ack_arrive() RETURNS trigger
AS 'MODULE_PATHNAME', 'im_transfer_ack_arrive' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE TRIGGER transfer_ack_arrive BEFORE INSERT ON im.transfer_ack
    FOR EACH ROW EXECUTE FUNCTION im.transfer_ack_arrive();
ALTER TABLE im.transfer_ack ENABLE ALWAYS TRIGGER transfer_ack_arrive;

CREATE FUNCTION im.shard_configure(self_name text, bucket_nodes text[]) RETURNS void
AS 'MODULE_PATHNAME', 'im_shard_configure' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.shard_self() RETURNS text
AS 'MODULE_PATHNAME', 'im_shard_self' LANGUAGE C STABLE
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.shard_pending()
RETURNS TABLE(outbox_pending bigint, transfers_unacked bigint, inbound_unapplied bigint)
AS 'MODULE_PATHNAME', 'im_shard_pending' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.shard_apply_transfers(max_transfers int DEFAULT 10000) RETURNS bigint
AS 'MODULE_PATHNAME', 'im_shard_apply_transfers' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.shard_retry_quarantined(source_node text, transfer_id bigint) RETURNS boolean
AS 'MODULE_PATHNAME', 'im_shard_retry_quarantined' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.conversation_heads(conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, head_msg_seq bigint)
AS 'MODULE_PATHNAME', 'im_conversation_heads' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.message_audience(message_id bigint)
RETURNS TABLE(user_id bigint, conversation_id bigint, msg_seq bigint, accepted boolean)
AS 'MODULE_PATHNAME', 'im_message_audience' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.shard_message_status(message_id bigint, user_ids bigint[])
RETURNS TABLE(user_id bigint, device_id text, accepted boolean,
              in_sync_scope boolean, device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_shard_message_status' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.shard_message_facts(message_id bigint, user_ids bigint[])
RETURNS TABLE(user_id bigint, accepted boolean, in_sync_scope boolean,
              any_device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_shard_message_facts' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.shard_received_positions(user_ids bigint[])
RETURNS TABLE(user_id bigint, conversation_id bigint, msg_seq bigint, source_event_id bigint, delivery_scope bigint)
AS 'MODULE_PATHNAME', 'im_shard_received_positions' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

COMMENT ON FUNCTION im.shard_configure(text, text[]) IS 'Stores this node''s name and the 64-bucket node map; idempotent (contract §15)';
COMMENT ON FUNCTION im.shard_self() IS 'This node''s name, NULL when not sharded (contract §15)';
COMMENT ON FUNCTION im.shard_pending() IS 'Outbox items pending, transfers not yet acknowledged, inbound transfers not applied (contract §15)';
COMMENT ON FUNCTION im.shard_apply_transfers(integer) IS 'Applies pending inbound transfers into the local copies and outbox (contract §15)';
COMMENT ON FUNCTION im.shard_retry_quarantined(text, bigint) IS 'Puts a quarantined or dead inbound transfer back to pending, attempts cleared (contract §15)';
COMMENT ON FUNCTION im.conversation_heads(bigint[]) IS 'Authoritative heads of the conversations this node owns (contract §15)';
COMMENT ON FUNCTION im.message_audience(bigint) IS 'The users contract §1 lets see a message, on its conversation node (contract §15)';
COMMENT ON FUNCTION im.shard_message_status(bigint, bigint[]) IS 'message_status''s device rows for these users of this node, from its copies (contract §15)';
COMMENT ON FUNCTION im.shard_message_facts(bigint, bigint[]) IS 'message_facts'' user rows for these users of this node, from its copies (contract §15)';
COMMENT ON FUNCTION im.shard_received_positions(bigint[]) IS 'The conversation positions in these local users'' logs, for the cross-node check (contract §15)';

COMMENT ON TABLE im.shard_config IS 'This node''s name and the 64-bucket node map; no row = not sharded (contract §15)';
COMMENT ON TABLE im.transfer_out IS 'Transfers this node''s fanout wrote for other nodes, kept until their applied record comes back (contract §15)';
COMMENT ON TABLE im.transfer_in IS 'Transfers received from other nodes by exact (source node, transfer id): pending, applied, quarantined (retried; holds the later ones of its conversation) or dead (contract §15)';
COMMENT ON COLUMN im.transfer_in.applied_at IS 'When its applied record was written (NULL while pending, and while settled but not yet on the synchronous standby)';
COMMENT ON TABLE im.transfer_ack IS 'Applied records this node sends back to the transfers'' sources (contract §15)';
COMMENT ON FUNCTION im.transfer_out_arrive() IS 'Trigger: records a replicated transfer for this node in im.transfer_in and drops the row (contract §15)';
COMMENT ON FUNCTION im.transfer_ack_arrive() IS 'Trigger: deletes the acknowledged transfer on its source and drops the row (contract §15)';

-- An ex-member's conversation_list shows the mode in force now: one node's
-- conversation_list reads the conversation row (current head and mode, for
-- members and ex-members alike), and a mode switch of a group with no member
-- left on a node reaches no copy there, so the router takes both from the
-- conversation's node (im.conversation_heads gives the head only).
CREATE FUNCTION im.conversation_current(conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, head_msg_seq bigint, mode text)
AS 'MODULE_PATHNAME', 'im_conversation_current' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
COMMENT ON FUNCTION im.conversation_current(bigint[]) IS 'Authoritative head and mode of the conversations this node owns, for the router''s conversation_list (contract §15)';

-- contract §17 on several nodes: a user's role and mute in conversations
-- this node owns (the authoritative periods), for the router's
-- conversation_list (the user node's copies of periods keep the role they
-- were copied with).  NULL role: no open period or a direct conversation.
CREATE FUNCTION im.shard_member_roles(user_id bigint, conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, my_role text, muted_until timestamptz)
AS 'MODULE_PATHNAME', 'im_shard_member_roles' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
COMMENT ON FUNCTION im.shard_member_roles(bigint, bigint[]) IS 'A user''s role and mute in force in conversations this node owns, for the router''s conversation_list (contract §15, §17)';

-- ---- the router's cross-node delivery check (contract §18.3)
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
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp AS $$
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
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp AS $$
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

COMMENT ON FUNCTION im.shard_expected_receipts(integer) IS 'What this conversation node''s periods say users on each other node may receive, for its newest processed positions: the router''s cross-node check (contract §15, §18.3)';
COMMENT ON FUNCTION im.shard_check_receipts(text, jsonb) IS 'This user node''s logs against shard_expected_receipts'' part for it: fanout_missing / fanout_extra rows (contract §15, §18.3)';

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
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp AS $$
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
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp AS $$
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

-- ---- trust between nodes: refused arrivals (transfer_trust.c)
-- A replicated transfer or ack that fails the arrival checks (its
-- subscription does not name its source or acker, it claims this node, the
-- map places its conversation elsewhere, it is addressed to another node) is
-- dropped in the apply worker — an error there would stop the subscription
-- for good — with a WARNING and a row here; reconcile reports each row
-- (transfer_refused) until an operator deletes it.  Nothing of a refused row
-- is applied; a real transfer refused by mistake stays on its source,
-- unacknowledged.
CREATE TABLE im.transfer_refused (
    refused_id      bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    refused_at      timestamptz NOT NULL DEFAULT now(),
    kind            text   NOT NULL CHECK (kind IN ('transfer', 'ack')),
    subscription    text,             -- the subscription whose apply worker delivered it
    delivered_by    text,             -- the node that subscription names (NULL: none)
    source_node     text,
    dest_node       text,             -- a transfer's
    applied_by      text,             -- an ack's
    transfer_id     bigint NOT NULL,
    conversation_id bigint,           -- a transfer's
    reason          text   NOT NULL
);
SELECT pg_catalog.pg_extension_config_dump('im.transfer_refused', '');
SELECT pg_catalog.pg_extension_config_dump('im.transfer_refused_refused_id_seq', '');
COMMENT ON TABLE im.transfer_refused IS 'Replicated transfers and acks this node refused at arrival, with the reason (contract §15)';
