\echo Use "ALTER EXTENSION im_sync_router UPDATE TO '1.1'" to load this file. \quit

/*
 * im_sync_router 1.0 -> 1.1.  Sections (each self-contained; later changes
 * to the router's catalog go below as sections of their own):
 *   1. the probe without a session: im_router.ping (C, PQpingParams) and
 *      im_router.probe over it, instead of dblink's unnamed connection;
 *   2. partition conninfos parsed by libpq (C), and the server's partitions
 *      rewritten with them;
 *   3. SECURITY DEFINER only where the owner-only node table is read, and
 *      dblink's functions revoked from PUBLIC.
 * Sessions that were open before this update may still hold a dblink
 * connection the earlier probe left them: end them (extension/doc/upgrades.md).
 */

-- ---- 1. the probe without a session

/*
 * Reaching a node within connect_timeout.  PL/Proxy 2.10 connects
 * asynchronously and never sets its own connect timeout (its
 * check_timeouts reads a config field nothing fills), and libpq ignores
 * connect_timeout in asynchronous connects; tcp_user_timeout bounds only
 * data the peer does not acknowledge.  So a host whose kernel accepts the
 * TCP connection but whose server never answers the startup packet (a
 * frozen postmaster, a wrong port with a silent listener) would hold a call
 * forever.  Every PL/Proxy function here therefore routes through
 * im_router.route(part) (RUN ON im_router.route…(…), evaluated on the
 * router before PL/Proxy connects): the first call of a session to a node
 * (per map version) first pings it (im_router.ping: libpq's PQpingParams,
 * synchronous, so connect_timeout holds); a node that does not answer is
 * 08006 at once, and later calls of that session reach it through
 * PL/Proxy's own connection without the probe.  A server that answers at
 * all (an authentication request, any error, "starting up") is reachable:
 * PL/Proxy then fails fast with the node's own error.
 *
 * The ping sends no credentials (the map's user and password are left
 * out) and its connection opens and ends inside libpq: no session is ever
 * left to the caller, whatever interrupt (statement_timeout,
 * pg_cancel_backend) arrives during it.  im_router.ping takes any conninfo
 * and so is the owner's; PUBLIC runs the probe, which pings map nodes only.
 */
CREATE FUNCTION im_router.ping(conninfo text, connect_timeout int) RETURNS text
LANGUAGE c VOLATILE STRICT
AS 'MODULE_PATHNAME', 'im_router_ping';

CREATE OR REPLACE FUNCTION im_router.probe(node text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    ci text;
    timeout int;
    answer text;
BEGIN
    SELECT n.conninfo, s.connect_timeout INTO ci, timeout
      FROM im_router.node n, im_router.cluster_state s WHERE n.node_name = probe.node;
    IF ci IS NULL THEN
        RAISE EXCEPTION 'the map has no node %', probe.node USING ERRCODE = '22023';
    END IF;
    answer := im_router.ping(ci, timeout);
    IF answer IN ('ok', 'reject') THEN
        RETURN;     -- the server answered: PL/Proxy then gets the node's own error
    END IF;
    RAISE EXCEPTION USING ERRCODE = '08006', MESSAGE = CASE answer
        WHEN 'no_response' THEN format('node %s does not answer (connection refused, or no answer within %s s)',
                                       probe.node, timeout)
        ELSE format('node %s: libpq refuses its conninfo', probe.node) END;
END $$;

REVOKE ALL ON FUNCTION im_router.ping(text, int) FROM PUBLIC;

-- ---- 2. partition conninfos parsed by libpq

-- A node's conninfo for PL/Proxy (C: extension/router/im_sync_router.c).
-- libpq's PQconninfoParse reads it (never a text search); rebuilt as
-- key='value' pairs:
--  * without its user: PL/Proxy then adds user=<current_user> (from the
--    PUBLIC user mapping), so the nodes see the calling role.  PL/Proxy uses
--    a conninfo verbatim when the text "user=" occurs anywhere in it (a
--    password holding it would make PL/Proxy connect as the router's OS
--    user), so every '=' inside a value is written \= (libpq reads it back
--    as '='), and the result never holds that text (checked on each call);
--  * with the connect timeout, as libpq's connect_timeout and as
--    tcp_user_timeout, each unless the conninfo has its own: PL/Proxy 2.10
--    connects asynchronously (PQconnectStart), where libpq ignores
--    connect_timeout, and its own cluster option of that name is gone;
--    tcp_user_timeout bounds the TCP handshake with a host that does not
--    answer.  A refused connection (a stopped node on a reachable host)
--    fails at once either way.
-- A conninfo libpq refuses is 22023 (configure refuses it; it also refuses
-- URIs, whose text the gateway and the relay read as they are).
CREATE OR REPLACE FUNCTION im_router.partition_conninfo(conninfo text, timeout_s int) RETURNS text
LANGUAGE c IMMUTABLE STRICT
AS 'MODULE_PATHNAME', 'im_router_partition_conninfo';

-- the partitions 1.0's configure wrote, rewritten the way 1.1's writes
-- them (PL/Proxy notices the changed server in every session)
DO $partitions$
DECLARE
    opts text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_foreign_server WHERE srvname = 'im_sync') THEN
        SELECT string_agg(format('SET p%s %L', b.bucket,
                                 im_router.partition_conninfo(n.conninfo, s.connect_timeout)),
                          ', ' ORDER BY b.bucket)
          INTO opts
          FROM im_router.bucket b JOIN im_router.node n USING (node_name), im_router.cluster_state s;
        IF opts IS NOT NULL THEN
            EXECUTE format('ALTER SERVER im_sync OPTIONS (%s)', opts);
        END IF;
    END IF;
END $partitions$;

-- ---- 3. SECURITY DEFINER where needed only; dblink revoked from PUBLIC

-- both read only tables every role may read
ALTER FUNCTION im_router.cluster_version() SECURITY INVOKER;
ALTER FUNCTION im_router.node_parts() SECURITY INVOKER;
/*
 * dblink's functions are nobody's by default on the router: dblink_connect
 * opens connections from the router's host, and a connection its session
 * holds answers dblink() / dblink_exec() as whoever opened it.  The
 * extension uses none of them; a DBA who needs dblink grants it per role.
 * dblink is a required extension, so it exists by now (created by CASCADE,
 * or before the router, then with the same revoke).
 */
DO $dblink$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT d.objid FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
              WHERE d.refclassid = 'pg_extension'::regclass AND d.classid = 'pg_proc'::regclass
                AND d.deptype = 'e' AND e.extname = 'dblink' LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $dblink$;

-- ---- 4. a call through the router takes effect on every node it must or
-- on none a reader can see: delete_for_me is one call on the conversation's
-- node, which hands the deletion to the user's node through its transfers;
-- reconcile() gains the cross-node check of deletions (delete_for_me_unpaired);
-- claim_push_jobs keeps the jobs it claimed when a later node fails
-- (extension/doc/router_writes.md lists every call that writes on several nodes)
/*
 * delete_for_me: ONE call, on the conversation's node.  It records the
 * deletion there (fetch_messages) and, for a user placed on another node,
 * hands it off in the same transaction: the transfer its fanout writes
 * carries it to the user's node, which records it when it applies it, in
 * the conversation's order (unread, the delete_for_me event for the
 * devices), also when the message itself has not reached that node yet.
 * So the call takes effect on both nodes or on neither, and a retry of a
 * failed call is the same single call.
 */
CREATE OR REPLACE FUNCTION im_router.delete_for_me(user_id bigint, conversation_id bigint, message_id bigint)
RETURNS boolean
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.delete_for_me; $$;

-- the cross-node check of deletions for oneself (im_router.reconcile)
CREATE OR REPLACE FUNCTION im_router.on_node_remote_deletions(part int, max_rows int)
RETURNS TABLE(other_node text, deletions jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT r.other_node, r.deletions FROM im.shard_remote_deletions(max_rows) r;
$$;

CREATE OR REPLACE FUNCTION im_router.on_node_check_deletions(part int, source_node text, deletions jsonb)
RETURNS TABLE(check_name text, severity text, conversation_id bigint, user_id bigint, detail jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT r.check_name, r.severity, r.conversation_id, r.user_id, r.detail
      FROM im.shard_check_deletions(source_node, deletions) r;
$$;

/*
 * reconcile: every node's own checks (node_name says whose), plus the
 * router's: a node it cannot reach (node_unreachable), a node whose
 * im.shard_self() is not the name the map gives it (node_identity, a wrong
 * conninfo in the map), and the cross-node §18.3 check (design §18.3, issue
 * 15 item 5): each user's received events match what the conversation
 * node's periods say.  For that each conversation node lists, for its
 * newest im_router.reconcile_positions processed positions (default 10000;
 * the bound that keeps this affordable on a big installation), what each
 * member placed on another node may receive (im.shard_expected_receipts),
 * and each destination compares its part with its users' logs
 * (im.shard_check_receipts): fanout_missing / fanout_extra rows, the
 * single node's names, node_name = the user's node, detail.conversation_node
 * = where the periods are.  A row the user node's own audit already gave
 * (it checks the copies it received) is not repeated.  Unreachable nodes do
 * not hide the others' rows; positions in flight are the transfer checks'.
 * Then deletions for oneself: each node lists its newest deletions whose
 * other side — the conversation's node, which hides the message from
 * fetch_messages, or the user's node, which hides it from the devices — is
 * another node (im.shard_remote_deletions, im_router.reconcile_positions
 * of them); that node answers delete_for_me_unpaired for each it lacks
 * (im.shard_check_deletions; node_name = where it is missing).  Hand-offs
 * in flight are left out.
 */
CREATE OR REPLACE FUNCTION im_router.reconcile()
RETURNS TABLE(check_name text, severity text, conversation_id bigint, user_id bigint, detail jsonb,
              node_name text)
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    positions constant int :=
        coalesce(nullif(current_setting('im_router.reconcile_positions', true), ''), '10000')::int;
    n record;
    x record;
    r record;
    self text;
    reached text[] := '{}';
    seen text[] := '{}';
BEGIN
    FOR n IN SELECT * FROM im_router.node_parts() LOOP
        BEGIN
            self := im_router.on_node_self(n.part);
            IF self IS DISTINCT FROM n.node_name THEN
                RETURN QUERY SELECT 'node_identity'::text, 'error'::text, NULL::bigint, NULL::bigint,
                    jsonb_build_object('map_name', n.node_name, 'shard_self', self), n.node_name;
            END IF;
            FOR r IN SELECT * FROM im_router.on_node_reconcile(n.part) LOOP
                seen := seen || im_router.delivery_key(r.check_name, r.user_id, r.detail);
                check_name := r.check_name; severity := r.severity; conversation_id := r.conversation_id;
                user_id := r.user_id; detail := r.detail; node_name := n.node_name;
                RETURN NEXT;
            END LOOP;
            IF self = n.node_name THEN
                reached := reached || n.node_name;  -- the cross-node check trusts only these
            END IF;
        EXCEPTION WHEN OTHERS THEN
            IF NOT im_router.node_unreachable(SQLSTATE, SQLERRM) THEN
                RAISE;
            END IF;
            RETURN QUERY SELECT 'node_unreachable'::text, 'error'::text, NULL::bigint, NULL::bigint,
                jsonb_build_object('node', n.node_name), n.node_name;
        END;
    END LOOP;

    -- the cross-node check, between nodes reached above (a node lost in
    -- between is skipped: it was reported reachable a moment ago, and the
    -- next run checks it)
    FOR n IN SELECT * FROM im_router.node_parts() p WHERE p.node_name = ANY (reached) LOOP
        BEGIN
            FOR x IN SELECT e.dest_node, e.expected, d.part
                       FROM im_router.on_node_expected_receipts(n.part, positions) e
                       JOIN im_router.node_parts() d ON d.node_name = e.dest_node
                      WHERE e.dest_node = ANY (reached) LOOP
                RETURN QUERY
                    SELECT c.*, x.dest_node
                      FROM im_router.on_node_check_receipts(x.part, n.node_name, x.expected) c
                     WHERE im_router.delivery_key(c.check_name, c.user_id, c.detail) <> ALL (seen);
            END LOOP;
        EXCEPTION WHEN OTHERS THEN
            IF NOT im_router.node_unreachable(SQLSTATE, SQLERRM) THEN
                RAISE;
            END IF;
        END;
    END LOOP;

    -- deletions for oneself: both sides or neither (same rule for a node
    -- lost in between as above)
    FOR n IN SELECT * FROM im_router.node_parts() p WHERE p.node_name = ANY (reached) LOOP
        BEGIN
            FOR x IN SELECT rd.other_node, rd.deletions, d.part
                       FROM im_router.on_node_remote_deletions(n.part, positions) rd
                       JOIN im_router.node_parts() d ON d.node_name = rd.other_node
                      WHERE rd.other_node = ANY (reached) LOOP
                RETURN QUERY
                    SELECT c.*, x.other_node
                      FROM im_router.on_node_check_deletions(x.part, n.node_name, x.deletions) c;
            END LOOP;
        EXCEPTION WHEN OTHERS THEN
            IF NOT im_router.node_unreachable(SQLSTATE, SQLERRM) THEN
                RAISE;
            END IF;
        END;
    END LOOP;
END $$;

-- claim_push_jobs: max_jobs is a total; nodes are asked in turn, starting at
-- a random one so that no node's jobs wait behind another's, each for what
-- is still missing.  An unreachable node is skipped (its jobs wait for it)
-- unless every node is.  A node's other error after jobs were claimed on
-- earlier nodes ends the round with those jobs (and a WARNING naming the
-- error) rather than raising: their leases are committed on their nodes,
-- so an error here would leave them claimed by nobody until the lease ran
-- out.  With nothing claimed yet the error is raised as before.
CREATE OR REPLACE FUNCTION im_router.claim_push_jobs(relay_id text, max_jobs int DEFAULT 100,
                                          lease interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, push_target_id bigint, provider text, app_id text, sealed_token text,
              notification jsonb)
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

-- the second call of the old delete_for_me is gone
DROP FUNCTION im_router.on_node_delete_for_me(int, bigint, bigint, bigint);
