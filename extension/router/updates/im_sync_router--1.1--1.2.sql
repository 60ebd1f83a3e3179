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

-- ---- im.metrics() with type and labels, im.trace_message (contract §21)
-- The nodes' im.metrics() (catalog 1.10) answers (name, value, help, type,
-- labels) with bare names; the router adds node to each row's labels
-- instead of spelling it into the name.  The result changes, so the
-- wrapper im.metrics(), im_router.metrics() and im_router.on_node_metrics
-- are dropped and made again; the wrapper keeps its owner and ACL (a
-- DBA's grant survives).  trace_message merges the conversation node's
-- answer with each recipient's node's rows.  This router needs nodes at 1.10.
SELECT pg_catalog.set_config('im_sync_router_upgrade.metrics_owner', p.proowner::pg_catalog.text, true),
       pg_catalog.set_config('im_sync_router_upgrade.metrics_acl', COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p
WHERE p.oid OPERATOR(pg_catalog.=) 'im.metrics()'::pg_catalog.regprocedure;
DROP FUNCTION im.metrics();
DROP FUNCTION im_router.metrics();
DROP FUNCTION im_router.on_node_metrics(int);

CREATE FUNCTION im_router.on_node_metrics(part int)
RETURNS TABLE(name text, value double precision, help text, type text, labels jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT m.name, m.value, m.help, m.type, m.labels FROM im.metrics() m;
$$;

-- trace_message's parts: the conversation node's answer (its accepted row
-- and what it knows of the item) and each user node's rows of its users
CREATE FUNCTION im_router.conversation_trace_message(message_id bigint)
RETURNS TABLE(stage text, at timestamptz, user_id bigint, detail jsonb)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(message_id); TARGET im.trace_message; $$;

CREATE FUNCTION im_router.on_node_trace_message(part int, message_id bigint, user_ids bigint[])
RETURNS TABLE(stage text, at timestamptz, user_id bigint, detail jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT t.stage, t.at, t.user_id, t.detail FROM im.shard_trace_message(message_id, user_ids) t;
$$;

/*
 * metrics: every node's series, each with the label node="<name>" added
 * to its labels (contract §21: name, value, help, type, labels), plus the
 * router's own: im_router_node_up{node} (0 when unreachable; its series are
 * then missing) and im_router_cluster_version.  The nodes must be at 1.10.
 */
CREATE FUNCTION im_router.metrics()
RETURNS TABLE(name text, value double precision, help text, type text, labels jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    n record;
    up double precision;
BEGIN
    FOR n IN SELECT * FROM im_router.node_parts() LOOP
        up := 1;
        BEGIN
            RETURN QUERY SELECT m.name, m.value, m.help, m.type,
                                COALESCE(m.labels, '{}'::jsonb) || jsonb_build_object('node', n.node_name)
                           FROM im_router.on_node_metrics(n.part) m;
        EXCEPTION WHEN OTHERS THEN
            IF NOT im_router.node_unreachable(SQLSTATE, SQLERRM) THEN
                RAISE;      -- im.<f>'s one rethrow strips it (see the generated wrappers)
            END IF;
            up := 0;
        END;
        RETURN QUERY SELECT 'im_router_node_up'::text, up,
                            'Whether the router reached the node for this scrape'::text, 'gauge'::text,
                            jsonb_build_object('node', n.node_name);
    END LOOP;
    RETURN QUERY SELECT 'im_router_cluster_version'::text, im_router.cluster_version()::double precision,
                        'Version of the node map (bumped by im_router.configure)'::text, 'gauge'::text,
                        NULL::jsonb;
END $$;

/*
 * trace_message (contract §21): the conversation node answers P0002 for an
 * unknown id and gives the accepted row and the item's rows (user_id
 * NULL); every recipient's rows come from that recipient's node
 * (message_audience, then shard_trace_message per node), each with the
 * node in its detail and the event's trace id where the copy has none.
 * Same order as one node's answer.
 */
CREATE FUNCTION im_router.trace_message(message_id bigint)
RETURNS TABLE(stage text, at timestamptz, user_id bigint, detail jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    m bigint := trace_message.message_id;
    conv_node text := (SELECT b.node_name FROM im_router.bucket b WHERE b.bucket = im_router.bucket(m));
    conv jsonb;
    tid text;
    users bigint[];
BEGIN
    conv := (SELECT jsonb_agg(to_jsonb(t)) FROM im_router.conversation_trace_message(m) t
              WHERE t.user_id IS NULL);
    tid := (SELECT e->'detail'->>'trace_id' FROM jsonb_array_elements(conv) e WHERE e->>'stage' = 'accepted');
    users := ARRAY(SELECT a.user_id FROM im_router.message_audience(m) a);
    RETURN QUERY
        WITH x AS (
            SELECT c.stage, c.at, c.user_id, c.detail || jsonb_build_object('node', conv_node) AS detail
              FROM jsonb_to_recordset(conv) AS c(stage text, at timestamptz, user_id bigint, detail jsonb)
            UNION ALL
            SELECT s.stage, s.at, s.user_id,
                   s.detail || jsonb_build_object('node', g.node_name,
                                                  'trace_id', COALESCE(s.detail->>'trace_id', tid))
              FROM im_router.group_by_node(users) g,
                   LATERAL im_router.on_node_trace_message(g.part, m, g.node_ids) s)
        SELECT x.stage, x.at, x.user_id, x.detail FROM x
         ORDER BY x.at NULLS LAST,
                  array_position(ARRAY['accepted', 'fanout', 'hinted', 'synced', 'read', 'pushed'], x.stage),
                  x.user_id NULLS FIRST, (x.detail->>'sync_seq')::bigint, x.detail::text;
END $$;

-- the two wrappers, made by the generator of a fresh install
DO $gen$
DECLARE
    f record;
    call text;
    body text;
BEGIN
    FOR f IN
        SELECT p.oid, p.proname, p.pronargs, p.proretset, p.prorettype
          FROM pg_proc p
         WHERE p.pronamespace = 'im_router'::regnamespace
           AND p.proname = ANY (ARRAY['metrics', 'trace_message'])
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
    END LOOP;
END $gen$;

REVOKE ALL ON FUNCTION im.metrics() FROM PUBLIC;
REVOKE ALL ON FUNCTION im.trace_message(bigint) FROM PUBLIC;
DO $acl$
DECLARE
    old_owner oid := pg_catalog.current_setting('im_sync_router_upgrade.metrics_owner')::pg_catalog.oid;
    old_acl aclitem[] := NULLIF(pg_catalog.current_setting('im_sync_router_upgrade.metrics_acl'), '')::pg_catalog.aclitem[];
BEGIN
    IF old_owner OPERATOR(pg_catalog.<>) (SELECT p.proowner FROM pg_catalog.pg_proc p
            WHERE p.oid OPERATOR(pg_catalog.=) 'im.metrics()'::pg_catalog.regprocedure) THEN
        EXECUTE pg_catalog.format('ALTER FUNCTION im.metrics() OWNER TO %I', old_owner::pg_catalog.regrole);
    END IF;
    UPDATE pg_catalog.pg_proc SET proacl = old_acl
    WHERE oid OPERATOR(pg_catalog.=) 'im.metrics()'::pg_catalog.regprocedure;
END
$acl$;
