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
 * connection 1.0's probe left them: end them (README, upgrade notes).
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
