#!/usr/bin/env python3
"""router_security.py — what a login role without grants can reach through
the router (im_sync_router), against a running sharded installation
(test/harness/shards.sh up): run by test/router/router_check.sh after
router_check.py.

  probe_leaves_no_connection  as a plain login role, a statement_timeout
      sweep (1–20 ms) and a pg_cancel_backend, each landing while
      im_router.probe connects to a node that is slow to answer (a loopback
      proxy that waits before it forwards), then dblink(…) — granted to the
      role, as a DBA might — finds no connection: nothing the probe opened
      is left in the caller's session (none is ever opened as a superuser);
  public_privileges   no dblink function is executable by PUBLIC on the
      router, and the only SECURITY DEFINER function PUBLIC may run is
      im_router.probe;
  password_with_user  a node conninfo whose password holds the text
      "user=" still connects as the calling role (PL/Proxy uses a partition
      conninfo verbatim when it finds "user=" anywhere in it);
  probe_answers       the probe says 08006 for a listener that never
      answers, and passes for servers that answer without letting anyone in:
      a SCRAM request (libpq: "fe_sendauth: no password supplied", no
      FATAL), a FATAL 28P01 and a "starting up" 57P03.

Usage: router_security.py ROUTER_CONNINFO SHARDS_DIR
Every fake server is a local socket; the map is restored at the end."""
import os
import socket
import struct
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from checklib import ShardsDir, check, connect, failures, queries, section, wait_for  # noqa: E402

import psycopg2  # noqa: E402

ROUTER, SHARDS_DIR = sys.argv[1], sys.argv[2]
ROLE = "im_app"         # a plain login role (test/harness/shards.sh creates it everywhere)
OTHER = "im_relay"      # another one that is granted nothing here


R = connect(ROUTER)
q, q1 = queries(R)


def error_of(sql, args=None, conn=None):
    try:
        q(sql, args, conn)
    except psycopg2.Error as e:
        return (e.pgcode, e.diag.message_primary)
    return None


nodes = ShardsDir(SHARDS_DIR).nodes
names = [n for n, _ in nodes]
conns = [c for _, c in nodes]
buckets = [r[0] for r in q("SELECT node_name FROM im_router.bucket ORDER BY bucket")]
node1 = dict(nodes)["node1"]
node1_port = int(psycopg2.extensions.parse_dsn(node1)["port"])


def configure(extra_names=(), extra_conns=(), conninfos=None):
    q("SELECT im_router.configure(%s, %s, %s)",
      (names + list(extra_names), (conninfos or conns) + list(extra_conns), buckets))


def serve(handler):
    """A loopback listener whose every connection runs handler(sock) in a thread."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)

    def loop():
        while True:
            try:
                s, _ = ls.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(s,), daemon=True).start()
    threading.Thread(target=loop, daemon=True).start()
    return ls, ls.getsockname()[1]


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def slow_proxy(s, delay=0.4):
    """Accepts, waits, then forwards to node1: the connect outlasts any
    statement_timeout of the sweep, so the interrupt lands during it."""
    threading.Event().wait(delay)
    try:
        up = socket.create_connection(("127.0.0.1", node1_port))
    except OSError:
        s.close()
        return
    threading.Thread(target=pipe, args=(up, s), daemon=True).start()
    pipe(s, up)


def read_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("closed")
        buf += chunk
    return buf


def fake_server(answer):
    """A PostgreSQL front that answers the startup packet with `answer`
    (refusing SSL and GSS encryption first), then waits for the client."""
    def handler(s):
        try:
            while True:
                length, code = struct.unpack("!ii", read_exact(s, 8))
                if code in (80877103, 80877104):     # SSLRequest, GSSENCRequest
                    s.sendall(b"N")
                    continue
                read_exact(s, length - 8)            # the startup packet
                break
            s.sendall(answer)
            while s.recv(4096):
                pass
        except OSError:
            pass
        s.close()
    return handler


def error_response(sqlstate, message):
    body = b"".join(k + v.encode() + b"\0" for k, v in
                    ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", sqlstate), (b"M", message))) + b"\0"
    return b"E" + struct.pack("!i", len(body) + 4) + body


SCRAM = (lambda mech: b"R" + struct.pack("!ii", 4 + 4 + len(mech), 10) + mech)(b"SCRAM-SHA-256\0\0")


DBLINK_WHO = ("SELECT * FROM dblink('select current_user::text, usesuper from pg_user "
              "where usename = current_user') AS t(u text, s boolean)")


@section
def probe_leaves_no_connection():
    """The issue's recipe, made reliable by a node slow to answer at connect."""
    ls, port = serve(slow_proxy)
    # a DBA granting dblink to the role must not hand it the probe's connection
    q(f"GRANT EXECUTE ON FUNCTION dblink(text) TO {ROLE}")
    app = connect(ROUTER, user=ROLE)
    try:
        configure(["slow"], [f"host=127.0.0.1 port={port} dbname=im user=postgres"])
        check(q1("SELECT current_user", conn=app) == ROLE and
              not q1("SELECT rolsuper FROM pg_roles WHERE rolname = current_user", conn=app),
              f"the caller is the plain login role {ROLE}")
        check(error_of("SELECT im_router.probe('slow')", conn=app) is None,
              "the probe passes for a node slow to answer (through the proxy)")
        leaked = []
        interrupted = 0
        for ms in range(1, 21):
            q(f"SET statement_timeout = '{ms}ms'", conn=app)
            err = error_of("SELECT im_router.probe('slow')", conn=app)
            q("RESET statement_timeout", conn=app)
            interrupted += err is not None and err[0] == "57014"
            got = error_of(DBLINK_WHO, conn=app)
            if got is None:
                leaked.append((ms, q(DBLINK_WHO, conn=app)))
        check(interrupted > 0, "the statement_timeout sweep interrupted probes", f"{interrupted}")
        check(leaked == [], "statement_timeout during the probe's connect: dblink() finds no connection "
              "in the caller's session", f"{leaked[:3]}")

        # pg_cancel_backend from another session while the probe connects
        pid = q1("SELECT pg_backend_pid()", conn=app)
        outcome = {}

        def run():
            outcome["err"] = error_of("SELECT im_router.probe('slow')", conn=app)
        t = threading.Thread(target=run)
        t.start()
        check(wait_for(lambda: q1("SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND state = 'active' "
                                  "AND query LIKE '%%im_router.probe%%'", (pid,)) == 1, 30),
              "the probe runs in the caller's session")
        q("SELECT pg_cancel_backend(%s)", (pid,))
        t.join(60)
        check(outcome.get("err") is not None and outcome["err"][0] == "57014",
              "pg_cancel_backend during the probe's connect cancels it", f"{outcome.get('err')}")
        got = error_of(DBLINK_WHO, conn=app)
        check(got is not None, "after pg_cancel_backend: dblink() finds no connection in the caller's session",
              f"{None if got else q(DBLINK_WHO, conn=app)}")
    finally:
        app.close()
        q(f"REVOKE EXECUTE ON FUNCTION dblink(text) FROM {ROLE}")
        configure()
        ls.close()


@section
def public_privileges():
    dbl = q("""SELECT p.oid::regprocedure::text FROM pg_proc p
                 JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
                 JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'dblink'
                WHERE has_function_privilege(%s, p.oid, 'EXECUTE')""", (OTHER,))
    check(q1("SELECT count(*) FROM pg_extension WHERE extname = 'dblink'") == 1 and dbl == [],
          "no dblink function is executable by a role without grants", f"{dbl}")
    other = connect(ROUTER, user=OTHER)
    try:
        err = error_of(DBLINK_WHO, conn=other)
        check(err is not None and err[0] == "42501", "dblink() as a role without grants: 42501", f"{err}")
        err = error_of("SELECT dblink_connect('host=127.0.0.1 port=1')", conn=other)
        check(err is not None and err[0] == "42501", "dblink_connect() as a role without grants: 42501", f"{err}")
        err = error_of("SELECT im_router.ping('host=127.0.0.1 port=1', 2)", conn=other)
        check(err is not None and err[0] == "42501", "im_router.ping (any conninfo) is the owner's", f"{err}")
    finally:
        other.close()
    sd = [r[0] for r in q("""SELECT p.oid::regprocedure::text FROM pg_proc p
                              WHERE p.pronamespace IN ('im'::regnamespace, 'im_router'::regnamespace)
                                AND p.prosecdef AND has_function_privilege(%s, p.oid, 'EXECUTE')
                              ORDER BY 1""", (OTHER,))]
    check(sd == ["im_router.probe(text)"],
          "the only SECURITY DEFINER function of the router PUBLIC may run is im_router.probe", f"{sd}")


@section
def password_with_user():
    """A PL/Proxy function that asks the node who it is, through a map whose
    node1 conninfo has a password holding "user=" (trust ignores it)."""
    nc = connect(node1)
    q("CREATE OR REPLACE FUNCTION public.im_probe_whoami() RETURNS text LANGUAGE sql "
      "AS 'SELECT current_user::text'", conn=nc)
    q("GRANT EXECUTE ON FUNCTION public.im_probe_whoami() TO PUBLIC", conn=nc)
    part = buckets.index("node1")
    q(f"""CREATE OR REPLACE FUNCTION public.im_probe_whoami() RETURNS text LANGUAGE plproxy
          AS $$ CLUSTER 'im_sync'; RUN ON {part}; TARGET public.im_probe_whoami; $$""")
    app = connect(ROUTER, user=ROLE)
    try:
        check(q1("SELECT public.im_probe_whoami()", conn=app) == ROLE,
              "through the map as set up, the node sees the calling role")
        for pw in ("xuser=postgres", "a'b\\user=c d", "user="):
            ci = node1 + " password='" + pw.replace("\\", "\\\\").replace("'", "\\'") + "'"
            configure(conninfos=[ci if n == "node1" else c for n, c in nodes])
            opts = q1("SELECT srvoptions FROM pg_foreign_server WHERE srvname = 'im_sync'")
            check(all("user=" not in o.split("=", 1)[1] for o in opts if o.startswith("p")),
                  f"password {pw!r}: no partition conninfo holds \"user=\"")
            app.close()
            app = connect(ROUTER, user=ROLE)      # a fresh PL/Proxy connection
            who = q1("SELECT public.im_probe_whoami()", conn=app)
            check(who == ROLE, f"password {pw!r}: the node still sees the calling role", f"{who}")
    finally:
        app.close()
        configure()
        q("DROP FUNCTION IF EXISTS public.im_probe_whoami()")
        q("DROP FUNCTION IF EXISTS public.im_probe_whoami()", conn=nc)
        nc.close()


@section
def probe_answers():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)               # the kernel completes handshakes; nobody reads
    servers = {"silent": (silent, silent.getsockname()[1])}
    for name, answer in (("scram", SCRAM),
                         ("badpass", error_response("28P01", "password authentication failed for user \"x\"")),
                         ("starting", error_response("57P03", "the database system is starting up"))):
        servers[name] = serve(fake_server(answer))
    stopped = socket.socket()
    stopped.bind(("127.0.0.1", 0))
    stopped_port = stopped.getsockname()[1]
    stopped.close()                 # nothing listens there: refused
    app = connect(ROUTER, user=ROLE)
    try:
        configure(list(servers) + ["stopped"],
                  [f"host=127.0.0.1 port={p} dbname=im user=postgres" for _, p in servers.values()]
                  + [f"host=127.0.0.1 port={stopped_port} dbname=im"])
        for name in ("scram", "badpass", "starting"):
            err = error_of("SELECT im_router.probe(%s)", (name,), conn=app)
            check(err is None, f"the probe passes for a server that answers ({name})", f"{err}")
        for name in ("silent", "stopped"):
            err = error_of("SELECT im_router.probe(%s)", (name,), conn=app)
            check(err is not None and err[0] == "08006",
                  f"the probe says 08006 for a {name} node", f"{err}")
        err = error_of("SELECT im_router.probe('nosuch')", conn=app)
        check(err is not None and err[0] == "22023", "the probe of a node not in the map: 22023", f"{err}")
    finally:
        app.close()
        configure()
        for s, _ in servers.values():
            s.close()


print(f"router_security: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
