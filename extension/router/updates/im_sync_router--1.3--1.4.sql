\echo Use "ALTER EXTENSION im_sync_router UPDATE TO '1.4'" to load this file. \quit

-- ---- moderator takedowns (contract §17): takedown_message on the
-- conversation's node, moderation_evidence on the target's, moderation_log
-- on every node merged by time
CREATE FUNCTION im_router.takedown_message(moderator text, conversation_id bigint, target_message_id bigint,
                                           reason text, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.takedown_message; $$;
CREATE FUNCTION im_router.moderation_evidence(target_message_id bigint)
RETURNS TABLE(conversation_id bigint, sender_id bigint, body jsonb,
              taken_down_at timestamptz, erase_after timestamptz)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(target_message_id); TARGET im.moderation_evidence; $$;
-- moderation_log's part: one node's page of its own audit ids
CREATE FUNCTION im_router.on_node_moderation_log(part int, after_id bigint, page_limit int)
RETURNS TABLE(id bigint, at timestamptz, moderator text, action text, user_id bigint,
              conversation_id bigint, message_id bigint, reason text)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT l.id, l.at, l.moderator, l.action, l.user_id, l.conversation_id, l.message_id, l.reason
      FROM im.moderation_log(after_id, page_limit) l;
$$;

/*
 * moderation_log (contract §17): every node's page, merged by time (then
 * id).  Audit ids are each node's own, so after_id applies on every node
 * alike and a page holds at most page_limit rows of all nodes together
 * (extension/doc/decisions.md).  An unreachable node fails the call: a log
 * missing a node's actions would look complete.
 */
CREATE FUNCTION im_router.moderation_log(after_id bigint DEFAULT 0, page_limit int DEFAULT 100)
RETURNS TABLE(id bigint, at timestamptz, moderator text, action text, user_id bigint,
              conversation_id bigint, message_id bigint, reason text)
LANGUAGE sql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
    SELECT l.id, l.at, l.moderator, l.action, l.user_id, l.conversation_id, l.message_id, l.reason
      FROM im_router.node_parts() n,
           LATERAL im_router.on_node_moderation_log(n.part, after_id, page_limit) l
     ORDER BY l.at, l.id
     LIMIT page_limit
$$;
SELECT im_router.create_api_wrapper('im_router.takedown_message(text, bigint, bigint, text, text)'::regprocedure);
SELECT im_router.create_api_wrapper('im_router.moderation_evidence(bigint)'::regprocedure);
SELECT im_router.create_api_wrapper('im_router.moderation_log(bigint, int)'::regprocedure);
REVOKE ALL ON FUNCTION im.takedown_message(text, bigint, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.moderation_evidence(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.moderation_log(bigint, int) FROM PUBLIC;
-- ---- receipts through the router (contract §20)
-- contract §20: receipts; set_read_receipts on the user's node, run_receipts
-- on every node (a receipt is produced on the reader's node and carried to
-- the sender's by a transfer, so a round runs every node's producer)
CREATE FUNCTION im_router.set_read_receipts(user_id bigint, enabled boolean, trace_id text DEFAULT NULL)
RETURNS TABLE(read_receipts boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.set_read_receipts; $$;

CREATE FUNCTION im_router.all_run_receipts(max_rows int) RETURNS SETOF bigint
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); TARGET im.run_receipts; $$;

-- run_receipts: one producer pass on every node; the receipts written in all
CREATE FUNCTION im_router.run_receipts(max_rows int DEFAULT 10000) RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, im_router, pg_temp
AS $$ SELECT coalesce(sum(n), 0)::bigint FROM im_router.all_run_receipts(max_rows) n $$;

SELECT im_router.create_api_wrapper('im_router.set_read_receipts(bigint, boolean, text)'::regprocedure);
SELECT im_router.create_api_wrapper('im_router.run_receipts(int)'::regprocedure);
REVOKE ALL ON FUNCTION im.set_read_receipts(bigint, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.run_receipts(int) FROM PUBLIC;


-- ---- roles, mutes, removals and bans (contract §17): im_router and im.*
-- set_member_role, mute_member, remove_member and unban_member, run on the
-- conversation's node (nodes at 1.12); the im.* wrappers as the install
-- script generates every wrapper, revoked from PUBLIC like the others.
-- conversation_list gains my_role and muted_until (the node's columns end
-- head_stale, my_role, muted_until): im_router.user_conversation_list,
-- im_router.conversation_list and the wrapper im.conversation_list are
-- dropped and made again, each keeping its owner and ACL; my_role and
-- muted_until come from the conversation's node (im.shard_member_roles,
-- nodes at 1.12) through im_router.on_node_member_roles.
CREATE FUNCTION im_router.set_member_role(actor_id bigint, conversation_id bigint, user_id bigint,
                                          role text, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.set_member_role; $$;

CREATE FUNCTION im_router.mute_member(actor_id bigint, conversation_id bigint, user_id bigint,
                                      muted_until timestamptz, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.mute_member; $$;

CREATE FUNCTION im_router.remove_member(actor_id bigint, conversation_id bigint, user_id bigint,
                                        ban boolean, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.remove_member; $$;

CREATE FUNCTION im_router.unban_member(actor_id bigint, conversation_id bigint, user_id bigint)
RETURNS TABLE(unbanned boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.unban_member; $$;

SELECT im_router.create_api_wrapper(p.oid)
  FROM pg_proc p
 WHERE p.pronamespace = 'im_router'::regnamespace
   AND p.proname = ANY (ARRAY['set_member_role', 'mute_member', 'remove_member', 'unban_member'])
 ORDER BY p.proname;
REVOKE ALL ON FUNCTION im.set_member_role(bigint, bigint, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.mute_member(bigint, bigint, bigint, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.remove_member(bigint, bigint, bigint, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.unban_member(bigint, bigint, bigint) FROM PUBLIC;

SELECT pg_catalog.set_config('im_sync_router_upgrade.list_' || n.nspname || '_' || p.proname,
                             p.proowner::pg_catalog.text || ' ' || COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
WHERE n.nspname OPERATOR(pg_catalog.=) ANY (ARRAY['im', 'im_router'])
  AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['conversation_list', 'user_conversation_list']);

CREATE FUNCTION im_router.on_node_member_roles(part int, user_id bigint, conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, my_role text, muted_until timestamptz)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT r.conversation_id, r.my_role, r.muted_until FROM im.shard_member_roles(user_id, conversation_ids) r;
$$;

DROP FUNCTION im.conversation_list(bigint, int, bigint);
DROP FUNCTION im_router.conversation_list(bigint, int, bigint);
DROP FUNCTION im_router.user_conversation_list(bigint, int, bigint);

CREATE FUNCTION im_router.user_conversation_list(user_id bigint, page_limit int, after_conversation_id bigint)
RETURNS TABLE(conversation_id bigint, kind text, mode text, last_msg_seq bigint, read_msg_seq bigint,
              unread_count bigint, dirty_target_msg_seq bigint, dirty_version bigint, head_msg_seq bigint,
              head_stale boolean, my_role text, muted_until timestamptz)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.conversation_list; $$;

CREATE FUNCTION im_router.conversation_list(user_id bigint, page_limit int DEFAULT 100,
                                            after_conversation_id bigint DEFAULT NULL)
RETURNS TABLE(conversation_id bigint, kind text, mode text, last_msg_seq bigint, read_msg_seq bigint,
              unread_count bigint, dirty_target_msg_seq bigint, dirty_version bigint,
              head_msg_seq bigint, head_stale boolean, my_role text, muted_until timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    page jsonb;
    heads jsonb := '{}';
    roles jsonb := '{}';
    stale bigint[] := '{}';
    g record;
BEGIN
    SELECT coalesce(jsonb_agg(to_jsonb(l)), '[]') INTO page
      FROM im_router.user_conversation_list(user_id, page_limit, after_conversation_id) l;
    FOR g IN SELECT * FROM im_router.group_by_node(ARRAY(
                 SELECT (e->>'conversation_id')::bigint FROM jsonb_array_elements(page) e)) LOOP
        BEGIN
            heads := heads || coalesce((SELECT jsonb_object_agg(h.conversation_id::text,
                                                                jsonb_build_object('head', h.head_msg_seq,
                                                                                   'mode', h.mode))
                                          FROM im_router.on_node_current(g.part, g.node_ids) h), '{}');
            -- contract §17: the role and mute from the conversation's own periods
            roles := roles || coalesce((SELECT jsonb_object_agg(r.conversation_id::text,
                                                                jsonb_build_object('role', r.my_role,
                                                                                   'muted_until', r.muted_until))
                                          FROM im_router.on_node_member_roles(g.part, user_id, g.node_ids) r), '{}');
        EXCEPTION WHEN OTHERS THEN
            IF NOT im_router.node_unreachable(SQLSTATE, SQLERRM) THEN
                RAISE;      -- im.<f>'s one rethrow strips it (see the generated wrappers)
            END IF;
            stale := stale || g.node_ids;
        END;
    END LOOP;
    RETURN QUERY
        SELECT x.conversation_id, x.kind,
               CASE WHEN x.conversation_id = ANY (stale) THEN x.mode
                    ELSE coalesce(heads->x.conversation_id::text->>'mode', x.mode) END,
               x.last_msg_seq, x.read_msg_seq, x.unread_count,
               x.dirty_target_msg_seq, x.dirty_version,
               CASE WHEN x.conversation_id = ANY (stale) THEN x.head_msg_seq
                    ELSE coalesce((heads->x.conversation_id::text->>'head')::bigint, x.head_msg_seq) END,
               x.conversation_id = ANY (stale),
               CASE WHEN roles ? x.conversation_id::text THEN roles->x.conversation_id::text->>'role'
                    ELSE x.my_role END,
               CASE WHEN roles ? x.conversation_id::text
                    THEN (roles->x.conversation_id::text->>'muted_until')::timestamptz
                    ELSE x.muted_until END
          FROM jsonb_array_elements(page) WITH ORDINALITY AS e(row_json, ord),
               LATERAL jsonb_to_record(e.row_json) AS x(conversation_id bigint, kind text, mode text,
                   last_msg_seq bigint, read_msg_seq bigint, unread_count bigint,
                   dirty_target_msg_seq bigint, dirty_version bigint, head_msg_seq bigint,
                   my_role text, muted_until timestamptz)
         ORDER BY e.ord;
END $$;

SELECT im_router.create_api_wrapper('im_router.conversation_list(bigint, int, bigint)'::regprocedure);
REVOKE ALL ON FUNCTION im.conversation_list(bigint, int, bigint) FROM PUBLIC;
DO $acl$
DECLARE
    saved text;
    old_owner oid;
    old_acl aclitem[];
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY['im.conversation_list(bigint, int, bigint)'::regprocedure,
                              'im_router.conversation_list(bigint, int, bigint)'::regprocedure,
                              'im_router.user_conversation_list(bigint, int, bigint)'::regprocedure]
    LOOP
        saved := current_setting('im_sync_router_upgrade.list_' ||
                     (SELECT n.nspname || '_' || p.proname FROM pg_proc p
                        JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = fn), true);
        CONTINUE WHEN saved IS NULL OR saved = '';
        -- "<owner oid> <acl>": the oid has no space, the ACL may
        old_owner := split_part(saved, ' ', 1)::oid;
        old_acl := NULLIF(substr(saved, position(' ' in saved) + 1), '')::aclitem[];
        IF old_owner <> (SELECT p.proowner FROM pg_proc p WHERE p.oid = fn) THEN
            EXECUTE format('ALTER FUNCTION %s OWNER TO %I', fn, old_owner::regrole);
        END IF;
        UPDATE pg_proc SET proacl = old_acl WHERE oid = fn;
    END LOOP;
END $acl$;

-- ---- account standing (contract §17): suspend_user and reinstate_user on
-- every node, device_session's account_state
--   * im_router.all_suspend_user / all_reinstate_user run the node function
--     on every node; im_router.suspend_user / reinstate_user fold the rows;
--     the im.* wrappers as the install script generates every wrapper,
--     revoked from PUBLIC like the others;
--   * im_router.device_session and its wrapper gain the nodes' trailing
--     account_state (nodes at 1.12): the result changes, so both are
--     dropped and made again, each keeping its owner and ACL (copied into
--     pg_proc: a GRANT here would record the DBA's grants as the
--     extension's initial privileges).
CREATE FUNCTION im_router.all_suspend_user(moderator text, user_id bigint, suspended_until timestamptz,
                                           reason text)
RETURNS TABLE(suspended boolean, sessions_closed int)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); TARGET im.suspend_user; $$;

CREATE FUNCTION im_router.all_reinstate_user(moderator text, user_id bigint)
RETURNS TABLE(reinstated boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); TARGET im.reinstate_user; $$;

CREATE FUNCTION im_router.suspend_user(moderator text, user_id bigint, suspended_until timestamptz,
                                       reason text)
RETURNS TABLE(suspended boolean, sessions_closed int)
LANGUAGE sql
AS $$ SELECT bool_or(s.suspended), sum(s.sessions_closed)::int
        FROM im_router.all_suspend_user(moderator, user_id, suspended_until, reason) s $$;

CREATE FUNCTION im_router.reinstate_user(moderator text, user_id bigint)
RETURNS TABLE(reinstated boolean)
LANGUAGE sql
AS $$ SELECT bool_or(r.reinstated) FROM im_router.all_reinstate_user(moderator, user_id) r $$;

SELECT im_router.create_api_wrapper('im_router.suspend_user(text, bigint, timestamptz, text)'::regprocedure);
REVOKE ALL ON FUNCTION im.suspend_user(text, bigint, timestamptz, text) FROM PUBLIC;
SELECT im_router.create_api_wrapper('im_router.reinstate_user(text, bigint)'::regprocedure);
REVOKE ALL ON FUNCTION im.reinstate_user(text, bigint) FROM PUBLIC;

SELECT pg_catalog.set_config('im_sync_router_upgrade.session_' || n.nspname,
                             p.proowner::pg_catalog.text || ' ' || COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
WHERE n.nspname OPERATOR(pg_catalog.=) ANY (ARRAY['im', 'im_router'])
  AND p.proname OPERATOR(pg_catalog.=) 'device_session';

DROP FUNCTION im.device_session(bigint, text, bigint);
DROP FUNCTION im_router.device_session(bigint, text, bigint);

-- account_state last: the nodes' trailing column (contract §17)
CREATE FUNCTION im_router.device_session(user_id bigint, device_id text, connection_epoch bigint)
RETURNS TABLE(state text, sync_generation int, server_acked_sync_seq bigint, high_watermark bigint, current boolean,
              account_state text)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.device_session; $$;

SELECT im_router.create_api_wrapper('im_router.device_session(bigint, text, bigint)'::regprocedure);
REVOKE ALL ON FUNCTION im.device_session(bigint, text, bigint) FROM PUBLIC;
DO $acl$
DECLARE
    saved text;
    old_owner oid;
    old_acl aclitem[];
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY['im.device_session(bigint, text, bigint)'::regprocedure,
                              'im_router.device_session(bigint, text, bigint)'::regprocedure]
    LOOP
        saved := current_setting('im_sync_router_upgrade.session_' ||
                     (SELECT n.nspname FROM pg_proc p
                        JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = fn), true);
        CONTINUE WHEN saved IS NULL OR saved = '';
        -- "<owner oid> <acl>": the oid has no space, the ACL may
        old_owner := split_part(saved, ' ', 1)::oid;
        old_acl := NULLIF(substr(saved, position(' ' in saved) + 1), '')::aclitem[];
        IF old_owner <> (SELECT p.proowner FROM pg_proc p WHERE p.oid = fn) THEN
            EXECUTE format('ALTER FUNCTION %s OWNER TO %I', fn, old_owner::regrole);
        END IF;
        UPDATE pg_proc SET proacl = old_acl WHERE oid = fn;
    END LOOP;
END $acl$;
