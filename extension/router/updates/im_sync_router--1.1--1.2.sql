\echo Use "ALTER EXTENSION im_sync_router UPDATE TO '1.2'" to load this file. \quit


-- ---- trace ids (contract §21): the router's writes take a trailing
-- trace_id and pass it on
--   * im_router.send_message, recall_message, edit_message, react,
--     pin_message, report_read, clear_dirty and delete_for_me (PL/Proxy)
--     and their im.* wrappers are each replaced by the same function with
--     a trailing `trace_id text DEFAULT NULL`, passed to the node's
--     function of the same name (nodes at 1.10): owner and ACL carried
--     over, so calls with the older argument lists resolve to the one
--     function and a role granted a wrapper keeps it.
SELECT pg_catalog.set_config('im_sync_router_upgrade.trace_' || n.nspname || '_' || p.proname,
                             p.proowner::pg_catalog.text || ' ' || COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
WHERE n.nspname OPERATOR(pg_catalog.=) ANY (ARRAY['im', 'im_router'])
  AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['send_message', 'recall_message', 'edit_message', 'react',
                                                 'pin_message', 'report_read', 'clear_dirty', 'delete_for_me']);

DROP FUNCTION im.send_message(bigint, bigint, text, jsonb, text, bigint);
DROP FUNCTION im.recall_message(bigint, bigint, text, bigint);
DROP FUNCTION im.edit_message(bigint, bigint, text, bigint, jsonb);
DROP FUNCTION im.react(bigint, bigint, bigint, text, boolean, text);
DROP FUNCTION im.pin_message(bigint, bigint, bigint, boolean, text);
DROP FUNCTION im.report_read(bigint, bigint, bigint);
DROP FUNCTION im.clear_dirty(bigint, bigint, bigint, bigint);
DROP FUNCTION im.delete_for_me(bigint, bigint, bigint);
DROP FUNCTION im_router.send_message(bigint, bigint, text, jsonb, text, bigint);
DROP FUNCTION im_router.recall_message(bigint, bigint, text, bigint);
DROP FUNCTION im_router.edit_message(bigint, bigint, text, bigint, jsonb);
DROP FUNCTION im_router.react(bigint, bigint, bigint, text, boolean, text);
DROP FUNCTION im_router.pin_message(bigint, bigint, bigint, boolean, text);
DROP FUNCTION im_router.report_read(bigint, bigint, bigint);
DROP FUNCTION im_router.clear_dirty(bigint, bigint, bigint, bigint);
DROP FUNCTION im_router.delete_for_me(bigint, bigint, bigint);

CREATE FUNCTION im_router.send_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                       body jsonb, content_type text DEFAULT 'text',
                                       reply_to_message_id bigint DEFAULT NULL,
                                       trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.send_message; $$;

CREATE FUNCTION im_router.recall_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                         target_message_id bigint, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.recall_message; $$;

CREATE FUNCTION im_router.edit_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                       target_message_id bigint, body jsonb, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.edit_message; $$;

CREATE FUNCTION im_router.react(user_id bigint, conversation_id bigint, target_message_id bigint,
                                reaction text, present boolean, client_msg_id text,
                                trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.react; $$;

CREATE FUNCTION im_router.pin_message(user_id bigint, conversation_id bigint, target_message_id bigint,
                                      pinned boolean, client_msg_id text, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.pin_message; $$;

CREATE FUNCTION im_router.report_read(user_id bigint, conversation_id bigint, read_to_seq bigint,
                                      trace_id text DEFAULT NULL)
RETURNS TABLE(read_msg_seq bigint, unread_count bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.report_read; $$;

CREATE FUNCTION im_router.clear_dirty(user_id bigint, conversation_id bigint, observed_version bigint,
                                      saved_last_msg_seq bigint, trace_id text DEFAULT NULL)
RETURNS TABLE(cleared boolean, dirty_target_msg_seq bigint, dirty_version bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.clear_dirty; $$;

CREATE FUNCTION im_router.delete_for_me(user_id bigint, conversation_id bigint, message_id bigint,
                                        trace_id text DEFAULT NULL)
RETURNS boolean
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.delete_for_me; $$;

-- the im.* wrappers of the eight, as the install script generates every
-- wrapper (same text), then the old owners and ACLs (the ACL copied into
-- pg_proc directly: a GRANT here would record the DBA's grants as the
-- extension's initial privileges)
DO $gen$
DECLARE
    f record;
    call text;
    body text;
    saved text;
    old_owner oid;
    old_acl aclitem[];
    fn regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid, p.proname, p.pronargs, p.proretset, p.prorettype
          FROM pg_proc p
         WHERE p.pronamespace = 'im_router'::regnamespace
           AND p.proname = ANY (ARRAY['send_message', 'recall_message', 'edit_message', 'react', 'pin_message',
                                      'report_read', 'clear_dirty', 'delete_for_me'])
         ORDER BY p.proname
    LOOP
        call := format('im_router.%I(%s)', f.proname,
                       (SELECT coalesce(string_agg('$' || i, ', ' ORDER BY i), '')
                          FROM generate_series(1, f.pronargs) i));
        body := CASE
            WHEN f.proretset THEN 'RETURN QUERY SELECT * FROM ' || call || ';'
            WHEN f.prorettype = 'void'::regtype THEN 'PERFORM ' || call || ';'
            ELSE 'RETURN ' || call || ';' END;
        EXECUTE format($w$
            CREATE FUNCTION im.%I(%s) RETURNS %s
            LANGUAGE plpgsql
            SET search_path = pg_catalog, im_router, pg_temp
            SET client_min_messages = warning
            AS $body$
            DECLARE
                err_state text; err_msg text; err_detail text; err_hint text;
            BEGIN
                %s
            EXCEPTION WHEN OTHERS OR query_canceled THEN
                GET STACKED DIAGNOSTICS err_state = RETURNED_SQLSTATE, err_msg = MESSAGE_TEXT,
                                        err_detail = PG_EXCEPTION_DETAIL, err_hint = PG_EXCEPTION_HINT;
                PERFORM im_router.rethrow(err_state, err_msg, err_detail, err_hint);
            END $body$$w$,
            f.proname, pg_get_function_arguments(f.oid), pg_get_function_result(f.oid), body);
        EXECUTE format('COMMENT ON FUNCTION im.%I(%s) IS %L', f.proname,
                       pg_get_function_identity_arguments(f.oid),
                       'im_sync API through the router (contract §15): runs im_router.' || f.proname);
        EXECUTE format('REVOKE ALL ON FUNCTION im.%I(%s) FROM PUBLIC', f.proname,
                       pg_get_function_identity_arguments(f.oid));
        FOREACH fn IN ARRAY ARRAY[f.oid::regprocedure,
                                  (SELECT p.oid FROM pg_proc p WHERE p.pronamespace = 'im'::regnamespace
                                      AND p.proname = f.proname)::regprocedure]
        LOOP
            saved := current_setting('im_sync_router_upgrade.trace_' ||
                         (SELECT n.nspname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                           WHERE p.oid = fn) || '_' || f.proname, true);
            CONTINUE WHEN saved IS NULL OR saved = '';
            -- "<owner oid> <acl>": the oid has no space, the ACL may
            old_owner := split_part(saved, ' ', 1)::oid;
            old_acl := NULLIF(substr(saved, position(' ' in saved) + 1), '')::aclitem[];
            IF old_owner <> (SELECT p.proowner FROM pg_proc p WHERE p.oid = fn) THEN
                EXECUTE format('ALTER FUNCTION %s OWNER TO %I', fn, old_owner::regrole);
            END IF;
            UPDATE pg_proc SET proacl = old_acl WHERE oid = fn;
        END LOOP;
    END LOOP;
END $gen$;
