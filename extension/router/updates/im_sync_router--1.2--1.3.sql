\echo Use "ALTER EXTENSION im_sync_router UPDATE TO '1.3'" to load this file. \quit

-- ---- one generator of the im.* wrappers (the install script's), kept in
-- the catalog so that every upgrade makes its wrappers with the same text
CREATE FUNCTION im_router.create_api_wrapper(f regprocedure) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $gen$
DECLARE
    p record;
    call text;
    body text;
BEGIN
    SELECT pr.proname, pr.pronargs, pr.proretset, pr.prorettype INTO p
      FROM pg_proc pr WHERE pr.oid = f;
    call := format('im_router.%I(%s)', p.proname,
                   (SELECT coalesce(string_agg('$' || i, ', ' ORDER BY i), '')
                      FROM generate_series(1, p.pronargs) i));
    body := CASE
        WHEN p.proretset THEN 'RETURN QUERY SELECT * FROM ' || call || ';'
        WHEN p.prorettype = 'void'::regtype THEN 'PERFORM ' || call || ';'
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
        p.proname, pg_get_function_arguments(f), pg_get_function_result(f), body);
    EXECUTE format('COMMENT ON FUNCTION im.%I(%s) IS %L', p.proname,
                   pg_get_function_identity_arguments(f),
                   'im_sync API through the router (contract §15): runs im_router.' || p.proname);
END $gen$;
-- creates functions in im: the extension scripts' (install, upgrades) only
REVOKE ALL ON FUNCTION im_router.create_api_wrapper(regprocedure) FROM PUBLIC;


-- ---- claim_push_jobs passes the node's trace_id on (contract §13, §21)
-- The nodes' im.claim_push_jobs (catalog 1.10) ends its result with
-- trace_id, the trace id of the job's message; the router's claim dropped
-- it.  The result changes, so im_router.on_node_claim_push_jobs,
-- im_router.claim_push_jobs and the wrapper im.claim_push_jobs are
-- dropped and made again with trace_id as the last column; each keeps its
-- owner and ACL (a DBA's grant to a relay's role survives).
SELECT pg_catalog.set_config('im_sync_router_upgrade.claim_' || n.nspname || '_' || p.proname,
                             p.proowner::pg_catalog.text || ' ' || COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
WHERE n.nspname OPERATOR(pg_catalog.=) ANY (ARRAY['im', 'im_router'])
  AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['claim_push_jobs', 'on_node_claim_push_jobs']);

DROP FUNCTION im.claim_push_jobs(text, int, interval);
DROP FUNCTION im_router.claim_push_jobs(text, int, interval);
DROP FUNCTION im_router.on_node_claim_push_jobs(int, text, int, interval);

-- the node's trace_id column last (nodes at 1.10): a relay logs each job
-- with its message's trace id through the router too (contract §21)
CREATE FUNCTION im_router.on_node_claim_push_jobs(part int, relay_id text, max_jobs int, lease interval)
RETURNS TABLE(job_id bigint, push_target_id bigint, provider text, app_id text, sealed_token text,
              notification jsonb, trace_id text)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT j.job_id, j.push_target_id, j.provider, j.app_id, j.sealed_token, j.notification, j.trace_id
      FROM im.claim_push_jobs(relay_id, max_jobs, lease) j;
$$;

-- claim_push_jobs: max_jobs is a total; nodes are asked in turn, starting at
-- a random one so that no node's jobs wait behind another's, each for what
-- is still missing.  An unreachable node is skipped (its jobs wait for it)
-- unless every node is.  A node's other error after jobs were claimed on
-- earlier nodes ends the round with those jobs (and a WARNING naming the
-- error) rather than raising: their leases are committed on their nodes,
-- so an error here would leave them claimed by nobody until the lease ran
-- out.  With nothing claimed yet the error is raised as before.  Each job
-- carries its message's trace id (the node's trailing column).
CREATE FUNCTION im_router.claim_push_jobs(relay_id text, max_jobs int DEFAULT 100,
                                          lease interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, push_target_id bigint, provider text, app_id text, sealed_token text,
              notification jsonb, trace_id text)
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    parts int[];
    start int;
    got bigint;
    missing int := max_jobs;
    reached int := 0;
    unreachable_state text;
    unreachable_msg text;
BEGIN
    parts := ARRAY(SELECT p.part FROM im_router.node_parts() p);
    IF max_jobs IS NULL OR max_jobs < 1 OR relay_id IS NULL THEN
        -- the first node answers bad arguments with its own error
        RETURN QUERY SELECT * FROM im_router.on_node_claim_push_jobs(parts[1], relay_id, max_jobs, lease);
        RETURN;
    END IF;
    start := floor(random() * cardinality(parts))::int;
    FOR i IN 0..cardinality(parts) - 1 LOOP
        EXIT WHEN missing <= 0;
        BEGIN
            RETURN QUERY SELECT * FROM im_router.on_node_claim_push_jobs(
                parts[(start + i) % cardinality(parts) + 1], relay_id, missing, lease);
            GET DIAGNOSTICS got = ROW_COUNT;
            missing := missing - got::int;
            reached := reached + 1;
        EXCEPTION WHEN OTHERS THEN
            IF NOT im_router.node_unreachable(SQLSTATE, SQLERRM) THEN
                IF missing < max_jobs THEN
                    RAISE WARNING 'claim_push_jobs: a node failed after % jobs were claimed: % (%)',
                        max_jobs - missing, SQLERRM, SQLSTATE;
                    EXIT;
                END IF;
                RAISE;      -- im.<f>'s one rethrow strips it (see the generated wrappers)
            END IF;
            unreachable_state := SQLSTATE;
            unreachable_msg := SQLERRM;
        END;
    END LOOP;
    IF reached = 0 AND missing > 0 THEN
        -- every node unreachable: the last one's error, as PL/Proxy gave it
        RAISE EXCEPTION USING ERRCODE = unreachable_state, MESSAGE = unreachable_msg;
    END IF;
END $$;

-- the wrapper im.claim_push_jobs, as the install script generates every
-- wrapper (same text), then the three functions' old owners and ACLs (the
-- ACL copied into pg_proc directly: a GRANT here would record the DBA's
-- grants as the extension's initial privileges)
SELECT im_router.create_api_wrapper('im_router.claim_push_jobs(text, int, interval)'::regprocedure);
REVOKE ALL ON FUNCTION im.claim_push_jobs(text, int, interval) FROM PUBLIC;
DO $acl$
DECLARE
    saved text;
    old_owner oid;
    old_acl aclitem[];
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY['im.claim_push_jobs(text, int, interval)'::regprocedure,
                              'im_router.claim_push_jobs(text, int, interval)'::regprocedure,
                              'im_router.on_node_claim_push_jobs(int, text, int, interval)'::regprocedure]
    LOOP
        saved := current_setting('im_sync_router_upgrade.claim_' ||
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

SELECT im_router.create_api_wrapper(p.oid)
  FROM pg_proc p
 WHERE p.pronamespace = 'im_router'::regnamespace
   AND p.proname = ANY (ARRAY['recent_conversations', 'pin_conversation'])
 ORDER BY p.proname;
REVOKE ALL ON FUNCTION im.recent_conversations(bigint, int, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.pin_conversation(bigint, bigint, boolean, text) FROM PUBLIC;
