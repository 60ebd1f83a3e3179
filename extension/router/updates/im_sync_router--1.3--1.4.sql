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
