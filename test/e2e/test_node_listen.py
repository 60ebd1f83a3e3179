#!/usr/bin/env python3
"""Per-node LISTEN: the gateway and the relay keep one LISTEN connection per
node of a router's map, each reconnecting on its own, and a node's LISTEN
coming back re-checks exactly the sessions of the users it owns.

Runs without the router extension: two throwaway clusters, A (im_sync in
im_test; it stands for the router, so calls work) and B (a bare node), and
a stand-in im.shard_nodes() on A listing both (A: even buckets, B: odd),
the shape the router answers.  A hint NOTIFYed on a node reaches the
sessions of its users; B stopped delays only B: A's hints keep coming;
B restarted: its users' sessions (and only those) are re-checked and
hinted, and the relay, woken by B's im_sync_push, claims at once.

Environment: PGBIN (or pg_config on PATH); IM_TMP for the clusters' files.
Every wait has a deadline; nothing asserts on timing.
"""
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "failover"))
import pair  # noqa: E402  (throwaway nodes: initdb, pg_ctl as postgres)
from imgw import wait_until as wait_for  # noqa: E402

BASE = tempfile.mkdtemp(prefix="node_listen.", dir=os.environ.get("IM_TMP", "/tmp"))
os.chmod(BASE, 0o755)
A = pair.Node(BASE, "a")
B = pair.Node(BASE, "b")
PROCS = []


def start_node(n, im_sync):
    pair.run([os.path.join(pair.PGBIN, "initdb"), "-D", n.data, "-A", "trust", "-U", "postgres",
              "-E", "UTF8", "--locale=C.UTF-8"])
    n.write_conf("track_functions = 'all'" if im_sync else "shared_preload_libraries = ''")
    n.pg_ctl("start")
    if im_sync:
        n.q("CREATE DATABASE im_test", db="postgres")
        n.q("SET client_min_messages = warning; CREATE EXTENSION im_sync CASCADE")


def setup():
    start_node(A, True)
    start_node(B, False)
    # the router's answer, by hand: node_name, conninfo, buckets.  B's
    # conninfo names no user: the gateway's own (--db) is used
    A.q("""CREATE FUNCTION im.shard_nodes() RETURNS TABLE(node_name text, conninfo text, buckets int[])
           LANGUAGE sql AS $$
             VALUES ('nodeA', 'host=127.0.0.1 port=%d dbname=im_test',
                     ARRAY(SELECT b FROM generate_series(0, 62, 2) b)),
                    ('nodeB', 'host=127.0.0.1 port=%d dbname=postgres',
                     ARRAY(SELECT b FROM generate_series(1, 63, 2) b)) $$""" % (A.port, B.port))


def start(cmd, log):
    p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    PROCS.append(p)
    return p


def notify(node, channel, payload, db):
    node.q("SELECT pg_notify(%s, %s)", (channel, payload), db=db)


def claims():
    return A.q("SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
               "WHERE schemaname = 'im' AND funcname = 'claim_push_jobs'")[0][0]


async def scenario(gw_url):
    import imgw
    from gwmetrics import metric

    imgw.URL = gw_url

    def gw_metric(name):
        try:
            return metric(name, gw_url)
        except OSError:             # not listening yet
            return None
    nodes_ready = lambda: gw_metric("im_gateway_listen_nodes_ready")  # noqa: E731
    wait_for("the gateway lists two nodes", lambda: gw_metric("im_gateway_listen_nodes") == 2)
    wait_for("both node LISTEN connections", lambda: nodes_ready() == 2)

    base = random.randint(10**6, 10**7) * 64
    ua, ub = base + 2, base + 3          # even bucket: A; odd bucket: B
    for u in (ua, ub):
        imgw.register(u, "d")
    sa = await imgw.Client.login(ua, "d")
    sb = await imgw.Client.login(ub, "d")

    # a hint NOTIFYed on a node reaches that node's user
    notify(B, "im_sync_hint", "%d:7" % ub, "postgres")
    notify(A, "im_sync_hint", "%d:7" % ua, "im_test")
    assert await sb.wait_hint(7), "no hint from node B"
    assert await sa.wait_hint(7), "no hint from node A"
    print("ok   a hint NOTIFYed on each node reaches that node's user", flush=True)

    # B stops: only B is delayed
    B.stop_immediate()
    wait_for("node B's LISTEN connection down", lambda: nodes_ready() == 1)
    assert gw_metric("im_gateway_listen_ready") == 0
    notify(A, "im_sync_hint", "%d:8" % ua, "im_test")
    assert await sa.wait_hint(8), "node A's hints stopped while B was down"
    r = await sb.req({"type": "conversations"})          # calls go to the router, not to B
    assert r["type"] == "conversations_result", r
    print("ok   node B down: node A's hints keep coming, calls still answered", flush=True)

    # B back: exactly B's users' sessions are re-checked, and hinted
    rechecks0 = gw_metric("im_gateway_device_rechecks_total")
    sb.hints.clear()
    sa.hints.clear()
    B.pg_ctl("start")
    wait_for("node B's LISTEN connection back", lambda: nodes_ready() == 2)
    assert await sb.wait_hint(0), "B's user was not hinted after B's LISTEN came back"
    rechecks = gw_metric("im_gateway_device_rechecks_total") - rechecks0
    assert rechecks == 1, "re-checks after B came back: %s (want 1: B's session only)" % rechecks
    assert not [h for h in sa.hints if h.get("reason") == "NEW_EVENTS"], sa.hints
    notify(B, "im_sync_hint", "%d:9" % ub, "postgres")
    assert await sb.wait_hint(9), "no hint from node B after its restart"
    print("ok   node B back: only its users' sessions re-checked and hinted; its hints flow again", flush=True)
    await sa.close()
    await sb.close()


def relay_check(relay_log):
    log = lambda: open(relay_log).read()  # noqa: E731
    wait_for("the relay listens on node B", lambda: "event=node_listen_ready node=nodeB" in log())
    # --poll is an hour: a claim now comes from a wake-up alone
    c0 = claims()
    notify(B, "im_sync_push", "", "postgres")
    wait_for("a claim woken by node B's im_sync_push", lambda: claims() > c0)
    n = log().count("event=node_listen_ready node=nodeB")
    B.stop_immediate()
    c1 = claims()
    B.pg_ctl("start")
    wait_for("the relay back on node B", lambda: log().count("event=node_listen_ready node=nodeB") > n)
    wait_for("a claim after node B's LISTEN came back", lambda: claims() > c1)
    print("ok   relay: woken by node B's im_sync_push, reconnected to B by itself, claims when it is back", flush=True)


def main():
    rc = 1
    try:
        setup()
        port = pair.free_port()
        dsn = "host=127.0.0.1 port=%d user=postgres dbname=im_test" % A.port
        start([os.path.join(ROOT, "gateway", "im_gateway"), "--listen", "127.0.0.1:%d" % port, "--pool", "2",
               "--db", dsn], os.path.join(BASE, "gateway.log"))
        relay_log = os.path.join(BASE, "relay.log")
        start([os.path.join(ROOT, "gateway", "im_push_relay"), "--db", dsn, "--url", "http://127.0.0.1:9/none",
               "--key", os.path.join(ROOT, "test", "push", "relay_key.pem"), "--poll", "3600"], relay_log)
        os.environ["IM_E2E_DB"] = "im_test"
        os.environ.update(PGHOST="127.0.0.1", PGPORT=str(A.port), PGUSER="postgres")
        asyncio.run(asyncio.wait_for(scenario("ws://127.0.0.1:%d/" % port), 180))
        relay_check(relay_log)
        rc = 0
    except Exception:
        import traceback
        traceback.print_exc()
        for f in ("gateway.log", "relay.log"):
            p = os.path.join(BASE, f)
            if os.path.exists(p):
                print("--- %s (last lines)" % f)
                print("".join(open(p).readlines()[-15:]))
    finally:
        for p in PROCS:
            p.send_signal(signal.SIGTERM)
        for p in PROCS:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        for n in (A, B):
            try:
                n.pg_ctl("-m", "immediate", "stop")
            except Exception:
                pass
        if rc == 0 and not os.environ.get("IM_KEEP"):
            subprocess.run(["rm", "-rf", BASE])
    print("node_listen: %s" % ("ok" if rc == 0 else "FAILED"), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
