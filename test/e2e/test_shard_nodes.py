#!/usr/bin/env python3
"""Per-node LISTEN against the real router: a node stopped (immediate)
while devices on the other nodes keep receiving hints and messages, and,
restarted, its devices are re-checked by the gateway, hinted, and catch up
with what was sent to them meanwhile (the transfers resume).

Run by test/suites/70-shards.sh after `test/harness/shards.sh up 3`, with the
gateway on the router (IM_GW_URL) and libpq's environment naming the
router.  Node conninfos come from $IM_SHARDS_DIR/nodes; buckets follow the
shard design (bucket = id % 64, bucket b on node b % N + 1, direct
conversations at (a + b) % 64).  Every figure is read through the router's
API or the gateway; the only direct node access is stopping and starting
the victim's postmaster.
"""
import asyncio
import os
import random
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import psycopg2  # noqa: E402
from imgw import Client, converge, register, run_tests, sql, URL  # noqa: E402
from gwmetrics import metric  # noqa: E402

AS_SERVER = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
PGBIN = os.environ.get("PGBIN") or subprocess.run(["pg_config", "--bindir"], capture_output=True,
                                                  text=True).stdout.strip()


def nodes():
    out = []
    with open(os.path.join(os.environ["IM_SHARDS_DIR"], "nodes")) as f:
        for line in f:
            if line.strip():
                name, conninfo = line.strip().split(None, 1)
                out.append((name, conninfo))
    return out


def node_of(bucket, n):
    return "node%d" % (bucket % n + 1)


class Postmaster:
    """The victim node's postmaster: stopped with pg_ctl -m immediate and
    started again with the options it ran with (postmaster.opts)."""

    def __init__(self, conninfo):
        c = psycopg2.connect(conninfo)
        c.autocommit = True
        with c.cursor() as cur:
            cur.execute("SHOW data_directory")
            self.data = cur.fetchone()[0]
        c.close()
        with open(os.path.join(self.data, "postmaster.opts")) as f:
            argv = shlex.split(f.read())
        opts, skip = [], False
        for a in argv[1:]:
            if skip:
                skip = False
            elif a == "-D":
                skip = True
            else:
                opts.append(a)
        self.opts = " ".join(shlex.quote(a) for a in opts)

    def pg_ctl(self, *args):
        subprocess.run(AS_SERVER + [os.path.join(PGBIN, "pg_ctl"), "-D", self.data, "-w", "-t", "90",
                                    "-l", os.path.join(self.data, "restart.log")] + list(args),
                       check=True, stdout=subprocess.DEVNULL)

    def stop(self):
        self.pg_ctl("-m", "immediate", "stop")

    def start(self):
        self.pg_ctl("-o", self.opts, "start")


async def wait_metric(name, want, timeout=60):
    loop = asyncio.get_event_loop()
    deadline = loop.time() + timeout
    while metric(name) != want:
        assert loop.time() < deadline, "%s never became %s (is %s)" % (name, want, metric(name))
        await asyncio.sleep(0.2)


def pick_users(n):
    """uA on node1, uB on node2, uC on the victim (the last node), with
    direct(uA, uB) and direct(uA, uC) on nodes other than the victim."""
    victim = "node%d" % n
    on = lambda node: [b for b in range(64) if node_of(b, n) == node]  # noqa: E731
    while True:
        base = random.randint(10**6, 10**7) * 64
        ua = base + random.choice(on("node1"))
        ub = base + 64 + random.choice(on("node2"))
        uc = base + 128 + random.choice(on(victim))
        if node_of((ua + ub) % 64, n) != victim and node_of((ua + uc) % 64, n) != victim:
            return ua, ub, uc, victim


async def send(c, conv, cmid, text):
    r = await c.req({"type": "send", "conversation_id": conv, "client_msg_id": cmid, "body": {"text": text}})
    assert r["type"] == "send_result", r
    return r


async def test_node_stopped_and_restarted():
    ns = dict(nodes())
    n = len(ns)
    assert n >= 3, ns
    await wait_metric("im_gateway_listen_nodes", n)
    await wait_metric("im_gateway_listen_nodes_ready", n)
    ua, ub, uc, victim = pick_users(n)
    for u in (ua, ub, uc):
        register(u, "d")
    ab = sql("SELECT im.direct_conversation(%s, %s)", ua, ub)[0][0]
    ac = sql("SELECT im.direct_conversation(%s, %s)", ua, uc)[0][0]
    sa, sb, sc = [await Client.login(u, "d") for u in (ua, ub, uc)]
    for s in (sa, sb, sc):
        await s.bootstrap()
    want_ab, want_ac = {}, {}
    m = await send(sa, ab, "before-ab", "before ab")
    want_ab[m["message_id"]] = {"text": "before ab"}
    m = await send(sa, ac, "before-ac", "before ac")
    want_ac[m["message_id"]] = {"text": "before ac"}
    await converge(sb, ab, want_ab)
    await converge(sc, ac, want_ac)

    pm = Postmaster(ns[victim])
    pm.stop()
    try:
        await wait_metric("im_gateway_listen_nodes_ready", n - 1)
        # the others go on: a send across the two live nodes is hinted and arrives
        hw = sb.applied
        sb.hints.clear()
        for i in range(3):
            m = await send(sa, ab, "down-ab-%d" % i, "while %s is down %d" % (victim, i))
            want_ab[m["message_id"]] = {"text": "while %s is down %d" % (victim, i)}
        assert await sb.wait_hint(hw + 1), "no hint on node2 while %s was down" % victim
        await converge(sb, ab, want_ab)
        # a send to the victim's user succeeds (its conversation lives elsewhere)
        m = await send(sa, ac, "down-ac", "for uC while its node is down")
        want_ac[m["message_id"]] = {"text": "for uC while its node is down"}
        # the victim's user is delayed, with UNAVAILABLE, not a hang
        r = await sc.req({"type": "sync", "sync_generation": sc.gen, "local_applied_sync_seq": sc.applied})
        assert r["type"] == "error" and r["code"] == "UNAVAILABLE", r
    finally:
        sc.hints.clear()
        pm.start()
    await wait_metric("im_gateway_listen_nodes_ready", n)
    # re-checked by the gateway when the node's LISTEN came back, and hinted
    assert await sc.wait_hint(0), "no hint for the restarted node's device"
    await converge(sc, ac, want_ac, timeout=90)
    # and its hints flow again
    hw = sc.applied
    m = await send(sa, ac, "after-ac", "after the restart")
    want_ac[m["message_id"]] = {"text": "after the restart"}
    assert await sc.wait_hint(hw + 1), "no hint after the restart"
    await converge(sc, ac, want_ac)
    for s in (sa, sb, sc):
        await s.close()


if __name__ == "__main__":
    print("gateway %s" % URL)
    sys.exit(run_tests([test_node_stopped_and_restarted], "shard nodes", timeout=300))
