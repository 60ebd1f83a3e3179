/*
 * im_sync_router — the current catalog of the router database of a sharded
 * im_sync (contract §15), in its final form.  `make` writes it into the
 * install script im_sync_router--<default_version>.sql (generated, not
 * committed); an older router reaches the same catalog through the upgrade
 * scripts in extension/router/updates/ (test/suites/72-router-upgrade.sh
 * compares the two, test/suites/73-schema-policy.sh checks that this file
 * only creates).  How to make a change: extension/doc/upgrades.md.
 *
 * Layout:
 *   im_router.*  the node map (the only data here), the PL/Proxy calls and
 *                the multi-node implementations, each named after the API
 *                function it implements;
 *   im.*         the API: one generated wrapper per contract function, same
 *                signature, defaults and result columns, that calls
 *                im_router.<same name> and rethrows a node's error with its
 *                SQLSTATE and message and PL/Proxy's prefixes stripped
 *                (im_router.rethrow).
 *
 * Placement (shard_design15.md): 64 buckets; bucket(key) = key % 64 for user,
 * conversation, message and push-job ids.  The PL/Proxy cluster im_sync has
 * 64 partitions p0…p63, partition b = the node owning bucket b, so
 * `RUN ON im_router.bucket(key)` reaches the owner (PL/Proxy masks the hash
 * with 63 = key % 64 for every non-negative key).  Partitions of one node
 * have the same conninfo and so share one connection.
 *
 * Roles: PL/Proxy connects as current_user (the PUBLIC user mapping carries
 * no user), so the functions here are SECURITY INVOKER: the nodes see the
 * calling role and check its grants there.  The only SECURITY DEFINER ones
 * read the owner-only node table (im_router.probe, im_router.shard_nodes,
 * im.shard_nodes; extension/doc/sharding.md lists who may run what).
 * The caller's role must exist on every node with the same grants (extension/doc/sharding.md,
 * "Roles through the router").
 */

CREATE SCHEMA im_router;
CREATE SCHEMA im;
COMMENT ON SCHEMA im_router IS 'im_sync router: node map and PL/Proxy calls';
COMMENT ON SCHEMA im IS 'im_sync API, routed to the nodes';

-- ---------------------------------------------------------------- the map

CREATE TABLE im_router.node (
    node_name text PRIMARY KEY CHECK (node_name ~ '^[A-Za-z0-9_.-]{1,63}$'),
    conninfo  text NOT NULL CHECK (conninfo <> '')
);
CREATE TABLE im_router.bucket (
    bucket    int PRIMARY KEY CHECK (bucket BETWEEN 0 AND 63),
    node_name text NOT NULL REFERENCES im_router.node
);
-- One row: the cluster version (bumped by every configure) and the connect
-- timeout written into the partitions' conninfos.
CREATE TABLE im_router.cluster_state (
    one             boolean PRIMARY KEY DEFAULT true CHECK (one),
    cluster_version int NOT NULL DEFAULT 0,
    connect_timeout int NOT NULL DEFAULT 2 CHECK (connect_timeout > 0),
    configured_at   timestamptz
);
INSERT INTO im_router.cluster_state DEFAULT VALUES;
-- Round robin over the buckets for new group conversations (placement, not data).
CREATE SEQUENCE im_router.group_placement;

-- The bucket of an id; NULL goes to bucket 0 so that the node answers the
-- NULL argument with its own error (PL/Proxy would fail on a NULL hash).
CREATE FUNCTION im_router.bucket(id bigint) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT coalesce((id OPERATOR(pg_catalog.&) 63)::int, 0) $$;

-- direct_conversation's and create_conversation('direct')'s bucket:
-- (least + greatest) % 64 (shard_design15.md), in numeric so that no input
-- overflows here; the node rejects bad ids itself.
CREATE FUNCTION im_router.pair_bucket(user_a bigint, user_b bigint) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT coalesce(((user_a::numeric + user_b::numeric) % 64 + 64)::int % 64, 0) $$;

-- create_conversation: a direct pair goes to its pair bucket (the same node
-- and id as direct_conversation), a group to the next bucket in round robin
-- (the node then picks one of its own buckets).  Anything that is not a
-- valid pair goes to bucket 0, whose node rejects it with the usual error.
CREATE FUNCTION im_router.create_bucket(kind text, members bigint[], creator bigint) RETURNS int
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    pair bigint[];
BEGIN
    IF kind IS DISTINCT FROM 'direct' THEN
        IF kind = 'group' THEN
            RETURN (nextval('im_router.group_placement') % 64)::int;
        END IF;
        RETURN 0;
    END IF;
    SELECT array_agg(DISTINCT m) INTO pair
      FROM unnest(members || creator) AS m WHERE m IS NOT NULL;
    IF cardinality(pair) = 2 AND array_position(members, NULL) IS NULL THEN
        RETURN im_router.pair_bucket(pair[1], pair[2]);
    END IF;
    RETURN 0;
END $$;

-- authenticate's bucket: the user id read from the token's claims
-- (extension/token.c: base64url of purpose(1) version(4) registration(4)
-- sync_generation(4) user_id(8, big-endian) …).  The node verifies the
-- token; anything unreadable goes to bucket 0, which answers 28000.
CREATE FUNCTION im_router.token_bucket(token text) RETURNS int
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    b64 text;
    raw bytea;
BEGIN
    IF token IS NULL OR length(token) > 1024 OR token !~ '^[A-Za-z0-9_-]+$' THEN
        RETURN 0;
    END IF;
    b64 := translate(token, '-_', '+/');
    b64 := b64 || repeat('=', (4 - length(b64) % 4) % 4);
    raw := decode(b64, 'base64');
    IF octet_length(raw) < 21 THEN
        RETURN 0;
    END IF;
    RETURN im_router.bucket(('x' || encode(substring(raw FROM 14 FOR 8), 'hex'))::bit(64)::bigint);
EXCEPTION WHEN data_exception THEN
    RETURN 0;
END $$;

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
CREATE FUNCTION im_router.partition_conninfo(conninfo text, timeout_s int) RETURNS text
LANGUAGE c IMMUTABLE STRICT
AS 'MODULE_PATHNAME', 'im_router_partition_conninfo';

/*
 * query_timeout (seconds, 0 = off, the default) is PL/Proxy's: a node that
 * does not answer within it has its connection closed (08006 here, and the
 * call's outcome on that node unknown).  Off by default because run_fanout
 * and gc_inbox legitimately run long; bound calls with statement_timeout on
 * the router's roles instead (PL/Proxy then cancels the node's query).  It
 * is the backstop for one PL/Proxy 2.10 hazard: a node's own 57014 (a
 * statement_timeout set on the node) makes PL/Proxy wait for a cancel
 * answer that can never come, until the router's statement_timeout or this.
 *
 * The whole map at once.  Replaces the node and bucket rows, sets the
 * partitions of the SQL/MED server im_sync (p0…p63 = the conninfo of bucket
 * b's node, with the connect timeout; created with its PUBLIC user mapping
 * the first time) and bumps the cluster version.  PL/Proxy notices the changed server in every session on its next
 * call (it stamps the catalog entries it cached).
 */
CREATE FUNCTION im_router.configure(node_names text[], node_conninfos text[],
                                    bucket_nodes text[], connect_timeout int DEFAULT 2,
                                    query_timeout int DEFAULT 0)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    opts text;
    unknown text;
BEGIN
    IF node_names IS NULL OR node_conninfos IS NULL OR bucket_nodes IS NULL
       OR cardinality(node_names) = 0
       OR cardinality(node_names) <> cardinality(node_conninfos) THEN
        RAISE EXCEPTION 'configure needs as many node names as conninfos, at least one'
            USING ERRCODE = '22023';
    END IF;
    IF cardinality(bucket_nodes) <> 64 OR array_ndims(bucket_nodes) <> 1 THEN
        RAISE EXCEPTION 'bucket_nodes must have 64 entries, has %', cardinality(bucket_nodes)
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(node_conninfos) c WHERE c ~* '^postgres(ql)?://') THEN
        RAISE EXCEPTION 'node conninfos must be key=value strings, not URIs'
            USING ERRCODE = '22023';
    END IF;
    IF connect_timeout IS NULL OR connect_timeout <= 0 THEN
        RAISE EXCEPTION 'connect_timeout must be a positive number of seconds'
            USING ERRCODE = '22023';
    END IF;
    IF query_timeout IS NULL OR query_timeout < 0 THEN
        RAISE EXCEPTION 'query_timeout must be 0 (off) or a number of seconds'
            USING ERRCODE = '22023';
    END IF;
    IF (SELECT count(DISTINCT n) FROM unnest(node_names) n) <> cardinality(node_names)
       OR array_position(node_names, NULL) IS NOT NULL
       OR array_position(node_conninfos, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'node names must be distinct and no entry may be NULL'
            USING ERRCODE = '22023';
    END IF;
    SELECT min(b) INTO unknown FROM unnest(bucket_nodes) b
     WHERE b IS NULL OR b <> ALL (node_names);
    IF unknown IS NOT NULL OR array_position(bucket_nodes, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'bucket_nodes names a node that is not in node_names: %',
            coalesce(unknown, 'NULL') USING ERRCODE = '22023';
    END IF;

    DELETE FROM im_router.bucket;
    DELETE FROM im_router.node;
    INSERT INTO im_router.node (node_name, conninfo)
        SELECT n, c FROM unnest(node_names, node_conninfos) AS t(n, c);
    INSERT INTO im_router.bucket (bucket, node_name)
        SELECT o::int - 1, n FROM unnest(bucket_nodes) WITH ORDINALITY AS t(n, o);
    UPDATE im_router.cluster_state
       SET cluster_version = cluster_version + 1,
           connect_timeout = configure.connect_timeout,
           configured_at = now();

    -- the first time: the server, the PUBLIC user mapping (no user: the
    -- caller's) and USAGE for everyone; later only the partitions change, so
    -- user mappings the DBA added (e.g. passwords per role) are kept
    IF NOT EXISTS (SELECT 1 FROM pg_foreign_server WHERE srvname = 'im_sync') THEN
        SELECT string_agg(format('p%s %L', b.bucket,
                                 im_router.partition_conninfo(n.conninfo, configure.connect_timeout)),
                          ', ' ORDER BY b.bucket)
          INTO opts
          FROM im_router.bucket b JOIN im_router.node n USING (node_name);
        EXECUTE format('CREATE SERVER im_sync FOREIGN DATA WRAPPER plproxy OPTIONS (query_timeout %L, %s)',
                       configure.query_timeout, opts);
        CREATE USER MAPPING FOR PUBLIC SERVER im_sync;
        GRANT USAGE ON FOREIGN SERVER im_sync TO PUBLIC;
    ELSE
        SELECT string_agg(format('SET p%s %L', b.bucket,
                                 im_router.partition_conninfo(n.conninfo, configure.connect_timeout)),
                          ', ' ORDER BY b.bucket)
          INTO opts
          FROM im_router.bucket b JOIN im_router.node n USING (node_name);
        EXECUTE format('ALTER SERVER im_sync OPTIONS (SET query_timeout %L, %s)',
                       configure.query_timeout, opts);
    END IF;
END $$;

CREATE FUNCTION im_router.cluster_version() RETURNS int
LANGUAGE sql STABLE
SET search_path = pg_catalog, im_router, pg_temp
AS $$ SELECT cluster_version FROM im_router.cluster_state $$;

-- The nodes for calls that run on each: the node name and one partition
-- (bucket) it owns, so that `RUN ON part` reaches it.  Reads only the
-- bucket map, which every role may read (no conninfo: those may hold
-- passwords), so it runs as the caller.
CREATE FUNCTION im_router.node_parts()
RETURNS TABLE(node_name text, part int)
LANGUAGE sql STABLE
SET search_path = pg_catalog, im_router, pg_temp
AS $$ SELECT b.node_name, min(b.bucket) FROM im_router.bucket b GROUP BY b.node_name ORDER BY 1 $$;

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

CREATE FUNCTION im_router.probe(node text) RETURNS void
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

-- The partition to run on, once its node answered in this session.  On
-- every routed call: one lookup and a string search (no SET clause, names
-- qualified, so the call stays cheap).
CREATE FUNCTION im_router.route(part int) RETURNS int
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    reached constant text := COALESCE(pg_catalog.current_setting('im_router.reached', true), '');
    mark text;
BEGIN
    SELECT s.cluster_version OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) b.node_name INTO mark
      FROM im_router.bucket b, im_router.cluster_state s WHERE b.bucket OPERATOR(pg_catalog.=) part;
    IF mark IS NULL OR pg_catalog.strpos(reached, ' ' OPERATOR(pg_catalog.||) mark OPERATOR(pg_catalog.||) ' ') > 0 THEN
        RETURN part;        -- reached before (or no such partition: PL/Proxy says so)
    END IF;
    PERFORM im_router.probe(pg_catalog.split_part(mark, ':', 2));
    PERFORM pg_catalog.set_config('im_router.reached',
        COALESCE(NULLIF(reached, ''), ' ') OPERATOR(pg_catalog.||) mark OPERATOR(pg_catalog.||) ' ', false);
    RETURN part;
END $$;

-- RUN ON forms of the routing keys (shard_design15.md), each through route().
CREATE FUNCTION im_router.route_id(id bigint) RETURNS int
LANGUAGE sql VOLATILE AS $$ SELECT im_router.route(im_router.bucket(id)) $$;
CREATE FUNCTION im_router.route_pair(user_a bigint, user_b bigint) RETURNS int
LANGUAGE sql VOLATILE AS $$ SELECT im_router.route(im_router.pair_bucket(user_a, user_b)) $$;
CREATE FUNCTION im_router.route_create(kind text, members bigint[], creator bigint) RETURNS int
LANGUAGE sql VOLATILE AS $$ SELECT im_router.route(im_router.create_bucket(kind, members, creator)) $$;
CREATE FUNCTION im_router.route_token(token text) RETURNS int
LANGUAGE sql VOLATILE AS $$ SELECT im_router.route(im_router.token_bucket(token)) $$;
-- every node: one partition each (partitions of one node share a connection)
CREATE FUNCTION im_router.route_all() RETURNS SETOF int
LANGUAGE sql VOLATILE AS $$ SELECT im_router.route(p.part) FROM im_router.node_parts() p $$;

-- The gateway and the relay open one LISTEN connection per node from this.
CREATE FUNCTION im_router.shard_nodes()
RETURNS TABLE(node_name text, conninfo text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, im_router, pg_temp
AS $$ SELECT n.node_name, n.conninfo FROM im_router.node n ORDER BY 1 $$;

-- ----------------------------------------------------------- node errors

/*
 * What PL/Proxy 2.10 does to errors (src/main.c, src/execute.c):
 *  - a node's error keeps its SQLSTATE; the message becomes
 *    "<schema>.<function>(<nargs>): [<dbname>] REMOTE <SEVERITY>: <message>",
 *    the detail "Remote detail: …", the hint "Remote hint: …", the context
 *    "Remote context: …";
 *  - its own errors are XX000 "PL/Proxy function <schema>.<function>(<nargs>): …";
 *    a connection it cannot open or that breaks shows libpq's text after
 *    "[<dbname>] PQconnectPoll: " (or PQconnectStart, PQconsumeInput,
 *    PQsendQuery…, PQflush), or "connect timeout to: …" / "query timeout".
 * node_error_state says which of these is an unreachable node (08006): the
 * connection ones and a node's FATAL/PANIC (its backend ended the session).
 */
CREATE FUNCTION im_router.node_unreachable(state text, msg text) RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT state = '08006'
        OR (state = 'XX000' AND msg ~ '^PL/Proxy function \S+\(\d+\): (\[[^]]*\] (PQconnectPoll|PQconnectStart|PQconsumeInput|PQsendQuery\S*|PQflush|select )|connect timeout|query timeout|Lost result|Unfinished connection)')
        OR msg ~ '^\S+\(\d+\): \[[^]]*\] REMOTE (FATAL|PANIC): '
$$;

CREATE FUNCTION im_router.rethrow(state text, msg text, detail text, hint text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    remote constant text := '^\S+\(\d+\): \[[^]]*\] REMOTE [A-Z]+: ';
    m text := msg;
    d text := nullif(detail, '');
    h text := nullif(hint, '');
BEGIN
    IF im_router.node_unreachable(state, msg) THEN
        -- keep libpq's first line, never the conninfo (it may hold a password)
        m := 'im_sync node unreachable: ' || coalesce(nullif(split_part(
                 regexp_replace(regexp_replace(msg, remote, ''),
                     '^PL/Proxy function \S+\(\d+\): (\[[^]]*\] \S+: )?(connect timeout) to: .*$', '\2'),
                 E'\n', 1), ''), 'connection lost');
        m := regexp_replace(m, '^im_sync node unreachable: PL/Proxy function \S+\(\d+\): (\[[^]]*\] \S+: )?',
                            'im_sync node unreachable: ');
        state := '08006';
    ELSIF m ~ remote THEN
        m := regexp_replace(m, remote, '');
        d := regexp_replace(d, '^Remote detail: ', '');
        h := regexp_replace(h, '^Remote hint: ', '');
    ELSIF state = 'XX000' AND m ~ '^PL/Proxy function ' AND NOT EXISTS (
            SELECT 1 FROM pg_foreign_server WHERE srvname = 'im_sync') THEN
        state := '55000';
        m := 'the router has no node map: call im_router.configure first';
    END IF;
    IF d IS NULL AND h IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = m;
    ELSIF h IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = m, DETAIL = d;
    ELSIF d IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = m, HINT = h;
    ELSE
        RAISE EXCEPTION USING ERRCODE = state, MESSAGE = m, DETAIL = d, HINT = h;
    END IF;
END $$;

-- ------------------------------------------------ calls one node answers
-- Each runs on the node that owns its routing key, with the node's function
-- of the same name (TARGET).  Signatures are contract §2–§8, §13, §14, §16.

-- by conversation_id: the conversation node
CREATE FUNCTION im_router.join_conversation(conversation_id bigint, user_id bigint)
RETURNS TABLE(membership_period_id bigint, join_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.join_conversation; $$;

CREATE FUNCTION im_router.leave_conversation(conversation_id bigint, user_id bigint)
RETURNS TABLE(membership_period_id bigint, leave_seq bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.leave_conversation; $$;

CREATE FUNCTION im_router.set_conversation_mode(conversation_id bigint, mode text)
RETURNS text
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.set_conversation_mode; $$;

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

-- §17 moderation: a takedown on the conversation's node, its evidence on
-- the node holding the target (a message id carries its conversation's
-- bucket)
CREATE FUNCTION im_router.takedown_message(moderator text, conversation_id bigint, target_message_id bigint,
                                           reason text, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.takedown_message; $$;
CREATE FUNCTION im_router.moderation_evidence(target_message_id bigint)
RETURNS TABLE(conversation_id bigint, sender_id bigint, body jsonb,
              taken_down_at timestamptz, erase_after timestamptz)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(target_message_id); TARGET im.moderation_evidence; $$;
-- contract §17: roles, mutes, removals and bans, on the conversation's node
-- (its single writer orders them with the sends)
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

-- the conversation node holds the positions, the shared log and (for users
-- placed elsewhere) the deletions for fetch_messages
CREATE FUNCTION im_router.fetch_messages(user_id bigint, conversation_id bigint, after_seq bigint,
                                         page_limit int DEFAULT 100, up_to_seq bigint DEFAULT NULL)
RETURNS TABLE(messages jsonb, next_after_seq bigint, has_more boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.fetch_messages; $$;

CREATE FUNCTION im_router.conversation_members(conversation_id bigint)
RETURNS TABLE(user_id bigint, membership_period_id bigint, join_seq bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.conversation_members; $$;

CREATE FUNCTION im_router.members_among(conversation_id bigint, candidate_user_ids bigint[])
RETURNS SETOF bigint
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.members_among; $$;

CREATE FUNCTION im_router.direct_conversation(user_a bigint, user_b bigint)
RETURNS bigint
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_pair(user_a, user_b); TARGET im.direct_conversation; $$;

CREATE FUNCTION im_router.create_conversation(kind text, members bigint[], creator bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_create(kind, members, creator); TARGET im.create_conversation; $$;

-- by user_id: the user node
CREATE FUNCTION im_router.register_device(user_id bigint, device_id text)
RETURNS TABLE(sync_generation int, state text)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.register_device; $$;

CREATE FUNCTION im_router.revoke_device(user_id bigint, device_id text)
RETURNS boolean
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.revoke_device; $$;

CREATE FUNCTION im_router.issue_device_token(user_id bigint, device_id text, ttl interval DEFAULT '1 day')
RETURNS text
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.issue_device_token; $$;

-- account_state last: the nodes' trailing column (contract §17)
CREATE FUNCTION im_router.device_session(user_id bigint, device_id text, connection_epoch bigint)
RETURNS TABLE(state text, sync_generation int, server_acked_sync_seq bigint, high_watermark bigint, current boolean,
              account_state text)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.device_session; $$;

CREATE FUNCTION im_router.sync_changes(user_id bigint, device_id text, client_generation int,
                                       local_applied_sync_seq bigint, page_limit int DEFAULT 200,
                                       page_cursor text DEFAULT NULL)
RETURNS TABLE(status text, sync_generation int, batch_token text, resume_from bigint,
              batch_high_watermark bigint, server_acked_sync_seq bigint, events jsonb,
              next_cursor text, has_more boolean, recovery_session_id bigint, user_high_watermark bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.sync_changes; $$;

CREATE FUNCTION im_router.ack_sync(user_id bigint, device_id text, batch_token text, ack_seq bigint)
RETURNS TABLE(status text, acked_sync_seq bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.ack_sync; $$;

CREATE FUNCTION im_router.begin_snapshot(user_id bigint, device_id text)
RETURNS TABLE(status text, snapshot_id bigint, sync_generation int, base_sync_seq bigint,
              snapshot_token text, page_count int, manifest_digest text)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.begin_snapshot; $$;

CREATE FUNCTION im_router.fetch_snapshot(user_id bigint, device_id text, snapshot_token text, page_no int)
RETURNS TABLE(status text, page int, page_count int, items jsonb, page_digest text)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.fetch_snapshot; $$;

CREATE FUNCTION im_router.ack_snapshot(user_id bigint, device_id text, snapshot_token text, manifest_digest text)
RETURNS TABLE(status text, acked_sync_seq bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.ack_snapshot; $$;

CREATE FUNCTION im_router.report_read(user_id bigint, conversation_id bigint, read_to_seq bigint,
                                      trace_id text DEFAULT NULL)
RETURNS TABLE(read_msg_seq bigint, unread_count bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.report_read; $$;

CREATE FUNCTION im_router.clear_dirty(user_id bigint, conversation_id bigint, observed_version bigint,
                                      saved_last_msg_seq bigint, trace_id text DEFAULT NULL)
RETURNS TABLE(cleared boolean, dirty_target_msg_seq bigint, dirty_version bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.clear_dirty; $$;

-- recency and conversation pins (contract §20): per user, so the user's node
-- answers (its state rows, copies of the conversations and its periods)
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

CREATE FUNCTION im_router.register_push_target(user_id bigint, device_id text, provider text, app_id text,
                                               push_token text, preview text DEFAULT 'none')
RETURNS bigint
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.register_push_target; $$;

CREATE FUNCTION im_router.remove_push_target(user_id bigint, device_id text)
RETURNS boolean
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.remove_push_target; $$;

CREATE FUNCTION im_router.set_notify(user_id bigint, conversation_id bigint DEFAULT NULL,
                                     mute_until timestamptz DEFAULT NULL, preview text DEFAULT NULL,
                                     clear boolean DEFAULT false)
RETURNS void
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.set_notify; $$;

CREATE FUNCTION im_router.set_presence(user_id bigint, device_id text, connection_epoch bigint,
                                       online boolean, ttl interval DEFAULT '90 seconds')
RETURNS boolean
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.set_presence; $$;

-- by token: the user node named in its claims
CREATE FUNCTION im_router.authenticate(token text)
RETURNS TABLE(user_id bigint, device_id text, connection_epoch bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_token(token); TARGET im.authenticate; $$;

-- by push-job id: it carries its user's bucket
CREATE FUNCTION im_router.complete_push_job(job_id bigint, relay_id text, result text,
                                            http_status int DEFAULT NULL, retry_after_ms int DEFAULT NULL,
                                            provider_ref text DEFAULT NULL)
RETURNS text
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(job_id); TARGET im.complete_push_job; $$;

-- ------------------------------------------- helpers of multi-node calls
-- on_node_*: one node, reached through `part` (a bucket it owns, from
-- im_router.node_parts()); all_*: every node at once (RUN ON ALL sends one
-- query per connection, i.e. per node, in parallel).

CREATE FUNCTION im_router.on_node_self(part int) RETURNS text
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route(part); SELECT im.shard_self(); $$;

CREATE FUNCTION im_router.on_node_metrics(part int)
RETURNS TABLE(name text, value double precision, help text, type text, labels jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT m.name, m.value, m.help, m.type, m.labels FROM im.metrics() m;
$$;

-- moderation_log's part: one node's page of its own audit ids
CREATE FUNCTION im_router.on_node_moderation_log(part int, after_id bigint, page_limit int)
RETURNS TABLE(id bigint, at timestamptz, moderator text, action text, user_id bigint,
              conversation_id bigint, message_id bigint, reason text)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT l.id, l.at, l.moderator, l.action, l.user_id, l.conversation_id, l.message_id, l.reason
      FROM im.moderation_log(after_id, page_limit) l;
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

CREATE FUNCTION im_router.on_node_reconcile(part int)
RETURNS TABLE(check_name text, severity text, conversation_id bigint, user_id bigint, detail jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT r.check_name, r.severity, r.conversation_id, r.user_id, r.detail FROM im.reconcile() r;
$$;

-- the cross-node §18.3 check (im_router.reconcile)
CREATE FUNCTION im_router.on_node_expected_receipts(part int, max_positions int)
RETURNS TABLE(dest_node text, expected jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT e.dest_node, e.expected FROM im.shard_expected_receipts(max_positions) e;
$$;

CREATE FUNCTION im_router.on_node_check_receipts(part int, source_node text, expected jsonb)
RETURNS TABLE(check_name text, severity text, conversation_id bigint, user_id bigint, detail jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT r.check_name, r.severity, r.conversation_id, r.user_id, r.detail
      FROM im.shard_check_receipts(source_node, expected) r;
$$;

CREATE FUNCTION im_router.on_node_current(part int, conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, head_msg_seq bigint, mode text)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT h.conversation_id, h.head_msg_seq, h.mode FROM im.conversation_current(conversation_ids) h;
$$;

CREATE FUNCTION im_router.on_node_member_roles(part int, user_id bigint, conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, my_role text, muted_until timestamptz)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT r.conversation_id, r.my_role, r.muted_until FROM im.shard_member_roles(user_id, conversation_ids) r;
$$;

CREATE FUNCTION im_router.on_node_message_status(part int, message_id bigint, user_ids bigint[])
RETURNS TABLE(user_id bigint, device_id text, accepted boolean, in_sync_scope boolean,
              device_synced boolean, user_read boolean)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT s.user_id, s.device_id, s.accepted, s.in_sync_scope, s.device_synced, s.user_read
      FROM im.shard_message_status(message_id, user_ids) s;
$$;

CREATE FUNCTION im_router.on_node_message_facts(part int, message_id bigint, user_ids bigint[])
RETURNS TABLE(user_id bigint, accepted boolean, in_sync_scope boolean, any_device_synced boolean,
              user_read boolean)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT f.user_id, f.accepted, f.in_sync_scope, f.any_device_synced, f.user_read
      FROM im.shard_message_facts(message_id, user_ids) f;
$$;

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

CREATE FUNCTION im_router.on_node_rotate_token_key(part int) RETURNS int
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route(part); SELECT im.rotate_token_key(); $$;

-- the cross-node check of deletions for oneself (im_router.reconcile)
CREATE FUNCTION im_router.on_node_remote_deletions(part int, max_rows int)
RETURNS TABLE(other_node text, deletions jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT r.other_node, r.deletions FROM im.shard_remote_deletions(max_rows) r;
$$;

CREATE FUNCTION im_router.on_node_check_deletions(part int, source_node text, deletions jsonb)
RETURNS TABLE(check_name text, severity text, conversation_id bigint, user_id bigint, detail jsonb)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT r.check_name, r.severity, r.conversation_id, r.user_id, r.detail
      FROM im.shard_check_deletions(source_node, deletions) r;
$$;

CREATE FUNCTION im_router.message_audience(message_id bigint)
RETURNS TABLE(user_id bigint, conversation_id bigint, msg_seq bigint, accepted boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(message_id); TARGET im.message_audience; $$;

-- the conversation node's own message_facts: its checks (P0002, 42501 for
-- anyone but the sender) in the node's words
CREATE FUNCTION im_router.sender_message_facts(sender_id bigint, message_id bigint)
RETURNS TABLE(user_id bigint, accepted boolean, in_sync_scope boolean, any_device_synced boolean,
              user_read boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(message_id); TARGET im.message_facts; $$;

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

CREATE FUNCTION im_router.user_conversation_list(user_id bigint, page_limit int, after_conversation_id bigint)
RETURNS TABLE(conversation_id bigint, kind text, mode text, last_msg_seq bigint, read_msg_seq bigint,
              unread_count bigint, dirty_target_msg_seq bigint, dirty_version bigint, head_msg_seq bigint,
              head_stale boolean, my_role text, muted_until timestamptz)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.conversation_list; $$;

CREATE FUNCTION im_router.all_run_fanout(max_items int) RETURNS SETOF bigint
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); TARGET im.run_fanout; $$;

CREATE FUNCTION im_router.all_pending()
RETURNS TABLE(node_name text, outbox_pending bigint, transfers_unacked bigint, inbound_unapplied bigint)
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route_all();
    SELECT im.shard_self() AS node_name, p.outbox_pending, p.transfers_unacked, p.inbound_unapplied
      FROM im.shard_pending() p;
$$;

CREATE FUNCTION im_router.all_retire_token_key(key_id int) RETURNS SETOF boolean
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); TARGET im.retire_token_key; $$;

-- regrole travels as text: its binary form is an OID, which differs per node
CREATE FUNCTION im_router.all_set_extension_owner(new_owner text) RETURNS SETOF int
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); SELECT im.set_extension_owner(new_owner::regrole); $$;

CREATE FUNCTION im_router.split_refresh_presence(user_ids bigint[], device_ids text[],
                                                 connection_epochs bigint[], ttl interval)
RETURNS SETOF int
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync';
    SPLIT user_ids, device_ids, connection_epochs;
    RUN ON im_router.route_id(user_ids);
    TARGET im.refresh_presence;
$$;

CREATE FUNCTION im_router.whole_refresh_presence(part int, user_ids bigint[], device_ids text[],
                                                 connection_epochs bigint[], ttl interval)
RETURNS int
LANGUAGE plproxy AS $$
    CLUSTER 'im_sync'; RUN ON im_router.route(part);
    SELECT im.refresh_presence(user_ids, device_ids, connection_epochs, ttl);
$$;

-- --------------------------------------------------- calls on every node

-- gc_inbox and repair_fanout: every node in parallel; max_users applies per node.
CREATE FUNCTION im_router.gc_inbox(max_users int DEFAULT NULL)
RETURNS TABLE(user_id bigint, retained_from bigint, deleted bigint)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); TARGET im.gc_inbox; $$;

CREATE FUNCTION im_router.repair_fanout(retry_dead boolean DEFAULT false, dry_run boolean DEFAULT false)
RETURNS TABLE(action text, outbox_id bigint, conversation_id bigint, user_id bigint, detail jsonb)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); TARGET im.repair_fanout; $$;

CREATE FUNCTION im_router.set_extension_owner(new_owner regrole) RETURNS int
LANGUAGE sql
AS $$ SELECT sum(n)::int FROM im_router.all_set_extension_owner(new_owner::text) n $$;

CREATE FUNCTION im_router.retire_token_key(key_id int) RETURNS boolean
LANGUAGE sql
AS $$ SELECT bool_or(r) FROM im_router.all_retire_token_key(key_id) r $$;

-- suspend_user and reinstate_user (contract §17): written on every node, as
-- rotate_token_key is, so that every node's checks (a conversation node's
-- send, a user node's sync) refuse the user.  One statement on each node in
-- parallel; suspended / reinstated are true when any node changed (the
-- nodes agree unless a node was restored or written apart), sessions_closed
-- sums what each node told (the devices live on the user's node alone).
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

/*
 * rotate_token_key: the same new key id on every node (contract §15).  The
 * nodes number keys max(key_id) + 1, so: rotate everywhere, take the highest
 * id, and rotate the nodes below it again until each has it.  A node that
 * lagged keeps the keys in between as superseded keys (maintenance retires
 * them like any other).
 * TODO(shnode): a node function im.rotate_token_key(key_id int) would make
 * this one call per node.
 */
CREATE FUNCTION im_router.rotate_token_key() RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    n record;
    got int;
    target int := 0;
    behind int;
    ids int[] := '{}';
    parts int[] := '{}';
BEGIN
    FOR n IN SELECT * FROM im_router.node_parts() LOOP
        got := im_router.on_node_rotate_token_key(n.part);
        ids := ids || got;
        parts := parts || n.part;
        target := greatest(target, got);
    END LOOP;
    FOR round IN 1..1000 LOOP
        behind := 0;
        FOR i IN 1..cardinality(parts) LOOP
            IF ids[i] < target THEN
                ids[i] := im_router.on_node_rotate_token_key(parts[i]);
                target := greatest(target, ids[i]);
                behind := behind + 1;
            END IF;
        END LOOP;
        EXIT WHEN behind = 0;
    END LOOP;
    IF EXISTS (SELECT 1 FROM unnest(ids) i WHERE i <> target) THEN
        RAISE EXCEPTION 'rotate_token_key could not bring every node to key %', target
            USING ERRCODE = '55000';
    END IF;
    RETURN target;
END $$;

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

-- refresh_presence: split by user (SPLIT), the counts summed.  Arrays the
-- split cannot take (NULL, empty, unequal lengths) go whole to one node,
-- which answers them exactly as a single node does.
CREATE FUNCTION im_router.refresh_presence(user_ids bigint[], device_ids text[], connection_epochs bigint[],
                                           ttl interval DEFAULT '90 seconds')
RETURNS int
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
BEGIN
    IF coalesce(cardinality(user_ids), 0) = 0
       OR cardinality(user_ids) IS DISTINCT FROM cardinality(device_ids)
       OR cardinality(user_ids) IS DISTINCT FROM cardinality(connection_epochs)
       OR array_ndims(user_ids) > 1 OR array_ndims(device_ids) > 1 OR array_ndims(connection_epochs) > 1 THEN
        RETURN im_router.whole_refresh_presence(
            (SELECT min(p.part) FROM im_router.node_parts() p), user_ids, device_ids, connection_epochs, ttl);
    END IF;
    RETURN (SELECT sum(n)::int FROM im_router.split_refresh_presence(user_ids, device_ids, connection_epochs, ttl) n);
END $$;

-- ------------------------------------- calls that touch several nodes

-- The nodes of a set of ids: node, one of its partitions, its ids.
CREATE FUNCTION im_router.group_by_node(ids bigint[])
RETURNS TABLE(node_name text, part int, node_ids bigint[])
LANGUAGE sql STABLE
AS $$
    SELECT b.node_name, min(b.bucket), array_agg(DISTINCT i ORDER BY i)
      FROM unnest(ids) AS i JOIN im_router.bucket b ON b.bucket = im_router.bucket(i)
     GROUP BY b.node_name ORDER BY 1
$$;

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
CREATE FUNCTION im_router.delete_for_me(user_id bigint, conversation_id bigint, message_id bigint,
                                        trace_id text DEFAULT NULL)
RETURNS boolean
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(conversation_id); TARGET im.delete_for_me; $$;

-- message_status: who may see the message comes from its conversation node
-- (message_audience, P0002 for an unknown id); each recipient's devices and
-- reads from that recipient's node.  Same order as one node's answer.
CREATE FUNCTION im_router.message_status(message_id bigint)
RETURNS TABLE(user_id bigint, device_id text, accepted boolean, in_sync_scope boolean,
              device_synced boolean, user_read boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    users bigint[];
BEGIN
    users := ARRAY(SELECT a.user_id FROM im_router.message_audience(message_id) a);
    RETURN QUERY
        SELECT s.* FROM im_router.group_by_node(users) g,
               LATERAL im_router.on_node_message_status(g.part, message_id, g.node_ids) s
         ORDER BY s.user_id, s.device_id;
END $$;

-- message_facts: the conversation node checks the caller (42501 unless it
-- sent the message, P0002) with its own message_facts; the facts of each
-- recipient come from the recipient's node.  The audience includes the
-- sender; message_facts' rows are the recipients only (contract §16, as on
-- one node), so the sender is left out here.
CREATE FUNCTION im_router.message_facts(sender_id bigint, message_id bigint)
RETURNS TABLE(user_id bigint, accepted boolean, in_sync_scope boolean, any_device_synced boolean,
              user_read boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    users bigint[];
BEGIN
    PERFORM count(*) FROM im_router.sender_message_facts(sender_id, message_id);
    users := ARRAY(SELECT a.user_id FROM im_router.message_audience(message_id) a
                    WHERE a.user_id <> message_facts.sender_id);
    RETURN QUERY
        SELECT f.* FROM im_router.group_by_node(users) g,
               LATERAL im_router.on_node_message_facts(g.part, message_id, g.node_ids) f
         ORDER BY f.user_id;
END $$;

/*
 * conversation_list: the page comes from the user's node; head_msg_seq and
 * mode are replaced by the authoritative ones from each conversation's node
 * (im.conversation_current), as one node reads them from the conversation
 * row: an ex-member's copy misses a mode switch made once no member was
 * left on its node.  When a conversation node is unreachable its rows keep
 * the user node's copy and head_stale is true (contract §15).  my_role and
 * muted_until come from the same node's periods (im.shard_member_roles;
 * contract §17), the user node's copy when it is unreachable.
 */
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

/*
 * run_fanout: every node drains its outbox and applies what reached it
 * (im.run_fanout there does both), round after round, until every node's
 * im.shard_pending() is all zero: everything fanned out, carried, applied
 * and acknowledged back.  Between rounds that moved nothing it waits a
 * little for logical replication.  The deadline is the setting
 * im_router.run_fanout_timeout (default 60 s); past it, 55000 names what
 * is still pending on which node.  Returns the items processed in total.
 */
CREATE FUNCTION im_router.run_fanout(max_items int DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, im_router, pg_temp
AS $$
DECLARE
    deadline constant timestamptz := clock_timestamp()
        + coalesce(nullif(current_setting('im_router.run_fanout_timeout', true), ''), '60s')::interval;
    total bigint := 0;
    moved bigint;
    pending text;
BEGIN
    LOOP
        SELECT coalesce(sum(n), 0) INTO moved FROM im_router.all_run_fanout(max_items) n;
        total := total + moved;
        SELECT string_agg(format('%s (outbox %s, transfers unacked %s, inbound unapplied %s)',
                                 coalesce(p.node_name, '?'), p.outbox_pending, p.transfers_unacked,
                                 p.inbound_unapplied), ', ' ORDER BY p.node_name)
          INTO pending
          FROM im_router.all_pending() p
         WHERE p.outbox_pending <> 0 OR p.transfers_unacked <> 0 OR p.inbound_unapplied <> 0;
        EXIT WHEN pending IS NULL;
        IF clock_timestamp() > deadline THEN
            RAISE EXCEPTION 'run_fanout: not drained before the deadline: %', pending
                USING ERRCODE = '55000',
                      HINT = 'Check the subscriptions (im.reconcile(), im.metrics()); the deadline is im_router.run_fanout_timeout.';
        END IF;
        IF moved = 0 THEN
            PERFORM pg_sleep(0.02);
        END IF;
    END LOOP;
    RETURN total;
END $$;

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
CREATE FUNCTION im_router.reconcile()
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

-- The identity of a delivery row (fanout_missing / fanout_extra of one
-- user, event and period), to tell a cross-node row from the same row a
-- node's own audit gave; NULL-free text, '' for other checks.
CREATE FUNCTION im_router.delivery_key(check_name text, user_id bigint, detail jsonb) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN check_name IN ('fanout_missing', 'fanout_extra')
                THEN concat_ws('/', check_name, user_id, detail->>'source_event_id', detail->>'delivery_scope')
                ELSE '' END
$$;

-- A Prometheus series name with one more label: name{a="1"} → name{node="x",a="1"}.
CREATE FUNCTION im_router.with_node_label(series text, node text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN position('{' IN series) > 0
                THEN regexp_replace(series, '\{', format('{node="%s",', node))
                ELSE format('%s{node="%s"}', series, node) END
$$;

/*
 * metrics: every node's series, each with the label node="<name>" added
 * to its labels (contract §21: name, value, help, type, labels), plus the
 * router's own: im_router_node_up{node} (0 when unreachable; its series are
 * then missing) and im_router_cluster_version.  The nodes must be at 1.10.
 */
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

-- ---------------------------------------------------------------- the API

-- The gateway and the relay read the nodes (and their conninfos) from here.
CREATE FUNCTION im.shard_nodes()
RETURNS TABLE(node_name text, conninfo text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, im_router, pg_temp
AS $$ SELECT s.node_name, s.conninfo FROM im_router.shard_nodes() s $$;

/*
 * One wrapper per contract function: im.<f> has im_router.<f>'s signature
 * (names, defaults, result columns), calls it, and turns a node's error into
 * the same error without PL/Proxy's prefixes (im_router.rethrow).  Generated
 * from the catalog so that the two signatures cannot drift apart.  This is
 * the one place a node's error is rewritten: the hand-written multi-node
 * implementations (reconcile, metrics, conversation_list, claim_push_jobs)
 * catch only to skip an unreachable node and otherwise RAISE the error as
 * PL/Proxy gave it, which then arrives here.
 * OTHERS does not catch query_canceled (57014): named too, so that a node's
 * statement_timeout arrives stripped like any other error.
 * client_min_messages = warning hides PL/Proxy's NOTICE "dropping stale
 * conn": after a node's error PL/Proxy 2.10 leaves that connection mid-result
 * and reconnects on the next call (so an error costs one reconnect).
 * im_router.create_api_wrapper makes one; the install script calls it for
 * every contract function, an upgrade for each function it adds or remakes.
 */
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

DO $gen$
BEGIN
    PERFORM im_router.create_api_wrapper(p.oid)
       FROM pg_proc p
      WHERE p.pronamespace = 'im_router'::regnamespace
        AND p.proname = ANY (ARRAY[
                    -- contract §2
                    'create_conversation', 'direct_conversation', 'join_conversation',
                    'leave_conversation', 'set_conversation_mode', 'conversation_members',
                    'members_among',
                    -- §3, §14
                    'send_message', 'recall_message', 'edit_message', 'react', 'pin_message',
                    -- §17 roles, mutes, removals and bans
                    'set_member_role', 'mute_member', 'remove_member', 'unban_member',
                    -- §4, §8 operations
                    'run_fanout', 'repair_fanout', 'gc_inbox', 'reconcile', 'metrics',
                    'set_extension_owner',
                    -- §21 operators
                    'trace_message',
                    -- §5, §6 devices, sync, snapshots
                    'register_device', 'revoke_device', 'device_session', 'sync_changes',
                    'ack_sync', 'begin_snapshot', 'fetch_snapshot', 'ack_snapshot',
                    -- §7, §16 read state, status of a message
                    'conversation_list', 'fetch_messages', 'report_read', 'clear_dirty',
                    'delete_for_me', 'message_status', 'message_facts',
                    -- §20 recency and conversation pins
                    'recent_conversations', 'pin_conversation', 'set_read_receipts', 'run_receipts',
                    -- §17 moderation
                    'takedown_message', 'moderation_evidence', 'moderation_log',
                    -- §8 tokens
                    'issue_device_token', 'authenticate', 'rotate_token_key', 'retire_token_key',
                    -- §17 account standing
                    'suspend_user', 'reinstate_user',
                    -- §13 push
                    'register_push_target', 'remove_push_target', 'set_notify', 'set_presence',
                    'refresh_presence', 'claim_push_jobs', 'complete_push_job'])
      ORDER BY p.proname;
END $gen$;

/*
 * Grants.  The API (im.*) is revoked from PUBLIC like on a node; the DBA
 * grants it per role as on the nodes (README).  The wrappers are SECURITY
 * INVOKER so that PL/Proxy connects to the nodes as the caller, so the
 * callers also need what the wrappers use here: the schema im_router, its
 * routing functions (granted to PUBLIC: each only reaches a node as the
 * caller, whose grants there decide), the bucket map and the cluster state
 * (no conninfos: route() reads both on every call) and the server.  The
 * node conninfos and configure stay the owner's; im_router.probe reads the
 * conninfos as its owner (SECURITY DEFINER) and shows none.
 */
DO $grants$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p WHERE p.pronamespace = 'im'::regnamespace LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $grants$;
REVOKE ALL ON FUNCTION im_router.configure(text[], text[], text[], int, int) FROM PUBLIC;
REVOKE ALL ON FUNCTION im_router.shard_nodes() FROM PUBLIC;
GRANT USAGE ON SCHEMA im_router TO PUBLIC;
GRANT SELECT ON im_router.bucket TO PUBLIC;
-- the map's version (no conninfo): im_router.route reads it on every call
GRANT SELECT ON im_router.cluster_state TO PUBLIC;
GRANT USAGE ON SEQUENCE im_router.group_placement TO PUBLIC;

-- The ping takes any conninfo: the owner's (the probe runs it as its owner).
REVOKE ALL ON FUNCTION im_router.ping(text, int) FROM PUBLIC;
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
