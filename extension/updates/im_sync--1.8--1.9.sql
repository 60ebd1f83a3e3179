\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.9'" to load this file. \quit

-- ---- 1.8 -> 1.9: second hardening round (extension/doc/security.md)

-- ---- the extension owner switch contains its owner (extension/doc/extension_owner.md)
-- im.set_extension_owner refuses, with 42501, an owner that someone else
-- could act as: a non-superuser role that can log in, has CREATEROLE (it
-- could make itself loginable or grant itself to a login role) or has
-- members.  The fanout workers check the same rule in every transaction
-- and act as the owner (worker_owner.c).  What the owner can change stays
-- out of a superuser's way: im.set_extension_owner itself and the schema im
-- stay the superuser's (the owner gets USAGE), so the owner can neither
-- rewrite the function a superuser runs after every update nor create an
-- overload or any other object in im that a superuser's call could resolve
-- to (CREATE OR REPLACE FUNCTION needs CREATE on the schema too).
CREATE OR REPLACE FUNCTION im.set_extension_owner(new_owner regrole) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
    n int := 0;
    self oid := 'im.set_extension_owner(pg_catalog.regrole)'::pg_catalog.regprocedure;
    new_super boolean;
    old_owner oid;
    member oid;
BEGIN
    IF pg_catalog.current_setting('is_superuser') OPERATOR(pg_catalog.<>) 'on'
       OR NOT COALESCE((SELECT a.rolsuper FROM pg_catalog.pg_roles a
                        WHERE a.rolname OPERATOR(pg_catalog.=) CURRENT_USER), false) THEN
        RAISE EXCEPTION 'permission denied to change the owner of extension im_sync'
            USING ERRCODE = '42501', DETAIL = 'Only a superuser can hand the extension''s objects to another role.';
    END IF;
    SELECT a.rolsuper INTO new_super FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) new_owner;
    IF NOT new_super THEN
        IF (SELECT a.rolcanlogin FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) new_owner) THEN
            RAISE EXCEPTION 'role % can log in', new_owner
                USING ERRCODE = '42501',
                      DETAIL = 'The owner of the SECURITY DEFINER API must be a role nobody can act as: NOLOGIN, NOCREATEROLE, without members (or a superuser).',
                      HINT = pg_catalog.format('ALTER ROLE %s NOLOGIN', new_owner);
        END IF;
        IF (SELECT a.rolcreaterole FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) new_owner) THEN
            RAISE EXCEPTION 'role % has CREATEROLE', new_owner
                USING ERRCODE = '42501',
                      DETAIL = 'The owner of the SECURITY DEFINER API must be a role nobody can act as: NOLOGIN, NOCREATEROLE, without members (or a superuser).',
                      HINT = pg_catalog.format('ALTER ROLE %s NOCREATEROLE', new_owner);
        END IF;
        SELECT m.member INTO member FROM pg_catalog.pg_auth_members m
        WHERE m.roleid OPERATOR(pg_catalog.=) new_owner ORDER BY m.member LIMIT 1;
        IF member IS NOT NULL THEN
            RAISE EXCEPTION 'role % has members', new_owner
                USING ERRCODE = '42501',
                      DETAIL = pg_catalog.format('Role %s is a member of %s and could act as the owner of the SECURITY DEFINER API.',
                                                 member::pg_catalog.regrole, new_owner),
                      HINT = pg_catalog.format('REVOKE %s FROM %s', new_owner, member::pg_catalog.regrole);
        END IF;
    END IF;
    SELECT c.relowner INTO old_owner FROM pg_catalog.pg_class c
    WHERE c.oid OPERATOR(pg_catalog.=) 'im.outbox'::pg_catalog.regclass;
    -- tables first: their owned sequences follow them
    FOR r IN SELECT d.classid, d.objid, c.relkind, c.relowner
             FROM pg_catalog.pg_depend d
             LEFT JOIN pg_catalog.pg_class c
               ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::regclass
              AND c.oid OPERATOR(pg_catalog.=) d.objid
             WHERE d.deptype OPERATOR(pg_catalog.=) 'e'
               AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::regclass
               AND d.refobjid OPERATOR(pg_catalog.=)
                   (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'im_sync')
             ORDER BY c.relkind OPERATOR(pg_catalog.<>) 'r', d.objid
    LOOP
        IF r.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass THEN
            -- this function stays its superuser's: it runs as its caller
            CONTINUE WHEN r.objid OPERATOR(pg_catalog.=) self;
            EXECUTE pg_catalog.format('ALTER ROUTINE %s OWNER TO %s', r.objid::regprocedure, new_owner);
        ELSIF r.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::regclass THEN
            -- the domains of 1.2 (their array types follow them)
            EXECUTE pg_catalog.format('ALTER DOMAIN %s OWNER TO %s', r.objid::regtype, new_owner);
        ELSIF r.relkind OPERATOR(pg_catalog.=) 'r' THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s OWNER TO %s', r.objid::regclass, new_owner);
        ELSIF r.relkind OPERATOR(pg_catalog.=) 'S' THEN
            IF (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) r.objid)
               OPERATOR(pg_catalog.<>) new_owner THEN
                EXECUTE pg_catalog.format('ALTER SEQUENCE %s OWNER TO %s', r.objid::regclass, new_owner);
            END IF;
        ELSE
            CONTINUE;
        END IF;
        n := n OPERATOR(pg_catalog.+) 1;
    END LOOP;
    -- the schema and this function: a superuser's (an earlier switch
    -- handed them over); the owner reaches its objects through USAGE
    IF NOT (SELECT a.rolsuper FROM pg_catalog.pg_namespace s JOIN pg_catalog.pg_roles a
              ON a.oid OPERATOR(pg_catalog.=) s.nspowner
            WHERE s.nspname OPERATOR(pg_catalog.=) 'im') THEN
        EXECUTE pg_catalog.format('ALTER SCHEMA im OWNER TO %I', CURRENT_USER);
    END IF;
    IF NOT (SELECT a.rolsuper FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_roles a
              ON a.oid OPERATOR(pg_catalog.=) p.proowner
            WHERE p.oid OPERATOR(pg_catalog.=) self) THEN
        EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', self::regprocedure, CURRENT_USER);
    END IF;
    IF NOT new_super THEN
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA im TO %s', new_owner);
    END IF;
    IF old_owner OPERATOR(pg_catalog.<>) new_owner
       AND NOT (SELECT a.rolsuper FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) old_owner) THEN
        EXECUTE pg_catalog.format('REVOKE USAGE ON SCHEMA im FROM %s', old_owner::regrole);
    END IF;
    RETURN n;
END
$fn$;
REVOKE ALL ON FUNCTION im.set_extension_owner(regrole) FROM PUBLIC;
COMMENT ON FUNCTION im.set_extension_owner(regrole) IS 'Hands every table, sequence and function of the extension (but itself and the schema) to a role nobody can act as; run after every update and restore (contract §12)';

-- An earlier switch handed the schema im and im.set_extension_owner to its
-- role: both go back to the superuser running the update, and that role
-- keeps USAGE, so the API it owns works until set_extension_owner runs again
-- (a fresh install: nothing to do).
DO $do$
DECLARE
    owner oid;
BEGIN
    SELECT s.nspowner INTO owner FROM pg_catalog.pg_namespace s
    WHERE s.nspname OPERATOR(pg_catalog.=) 'im';
    IF NOT (SELECT a.rolsuper FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) owner) THEN
        EXECUTE pg_catalog.format('ALTER SCHEMA im OWNER TO %I', CURRENT_USER);
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA im TO %s', owner::pg_catalog.regrole);
    END IF;
    IF NOT (SELECT a.rolsuper FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_roles a
              ON a.oid OPERATOR(pg_catalog.=) p.proowner
            WHERE p.oid OPERATOR(pg_catalog.=) 'im.set_extension_owner(pg_catalog.regrole)'::pg_catalog.regprocedure) THEN
        EXECUTE pg_catalog.format('ALTER FUNCTION im.set_extension_owner(pg_catalog.regrole) OWNER TO %I', CURRENT_USER);
    END IF;
END
$do$;

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

-- ---- comments of the shard functions name the contract only
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
COMMENT ON FUNCTION im.conversation_current(bigint[]) IS 'Authoritative head and mode of the conversations this node owns, for the router''s conversation_list (contract §15)';
COMMENT ON FUNCTION im.shard_expected_receipts(integer) IS 'What this conversation node''s periods say users on each other node may receive, for its newest processed positions: the router''s cross-node check (contract §15, §18.3)';
COMMENT ON FUNCTION im.shard_check_receipts(text, jsonb) IS 'This user node''s logs against shard_expected_receipts'' part for it: fanout_missing / fanout_extra rows (contract §15, §18.3)';
