\echo Use "ALTER EXTENSION im_sync_router UPDATE TO '1.3'" to load this file. \quit


-- ---- recency and conversation pins (contract §20): im_router and im.*
-- recent_conversations and pin_conversation, run on the user's node (nodes
-- at 1.11); the im.* wrappers as the install script generates every
-- wrapper, revoked from PUBLIC like the others.
CREATE FUNCTION im_router.recent_conversations(user_id bigint, page_limit int DEFAULT 50,
                                               after_cursor text DEFAULT NULL)
RETURNS TABLE(conversation_id bigint, kind text, mode text, last_msg_seq bigint,
              read_msg_seq bigint, unread_count bigint, dirty_target_msg_seq bigint,
              dirty_version bigint, head_msg_seq bigint, last_activity_at timestamptz,
              conversation_pinned boolean, left_conversation boolean, my_role text,
              muted_until timestamptz, next_cursor text)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.recent_conversations; $$;

CREATE FUNCTION im_router.pin_conversation(user_id bigint, conversation_id bigint, pin boolean,
                                           trace_id text DEFAULT NULL)
RETURNS TABLE(conversation_pinned boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.pin_conversation; $$;

DO $gen$
DECLARE
    f record;
    call text;
BEGIN
    FOR f IN
        SELECT p.oid, p.proname, p.pronargs
          FROM pg_proc p
         WHERE p.pronamespace = 'im_router'::regnamespace
           AND p.proname = ANY (ARRAY['recent_conversations', 'pin_conversation'])
         ORDER BY p.proname
    LOOP
        call := format('im_router.%I(%s)', f.proname,
                       (SELECT string_agg('$' || i, ', ' ORDER BY i) FROM generate_series(1, f.pronargs) i));
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
            f.proname, pg_get_function_arguments(f.oid), pg_get_function_result(f.oid),
            'RETURN QUERY SELECT * FROM ' || call || ';');
        EXECUTE format('COMMENT ON FUNCTION im.%I(%s) IS %L', f.proname,
                       pg_get_function_identity_arguments(f.oid),
                       'im_sync API through the router (contract §15): runs im_router.' || f.proname);
        EXECUTE format('REVOKE ALL ON FUNCTION im.%I(%s) FROM PUBLIC', f.proname,
                       pg_get_function_identity_arguments(f.oid));
    END LOOP;
END $gen$;
