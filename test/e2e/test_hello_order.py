#!/usr/bin/env python3
"""A device's newest hello wins whatever order the database ends its hellos
in.

Through the router every call commits on its node when it returns, so a
hello whose socket has closed cannot be rolled back there: if it reaches the
node after a newer hello of the same device, its epoch supersedes the newer
session.  This drives that order on purpose, with row locks held on the
node the users live on (the only direct node access) and a gateway of its
own with --pool 3 (two connections for hellos):

  1. hellos of z1 and z2 wait for their device rows: both hello
     connections are taken;
  2. x's hello, then a's (device D) are queued; z1's lock goes, so its
     connection takes x and, batched with it, a — and x waits for its row;
  3. a's socket closes; b, D's newer hello, is sent; z2's lock goes, so a
     connection is free for b;
  4. x's lock goes: x and the stale a run on the node.

Before the fix, b ran at step 3 and a's later epoch closed it (4008); now b
waits for a (im_gateway_hello_device_waits_total) and gets the newest
epoch.  Checked through the router: b is welcomed, its epoch is D's current
one after a is over, and b's session keeps answering.  On one database (no
IM_SHARDS_DIR) the same steps run against it: a's batch rolls back there.

Environment: libpq's (PGHOST/PGPORT/PGUSER) and IM_E2E_DB name the database
the API is called in (the router with IM_ROUTER_DSN and IM_SHARDS_DIR, as
test/suites/70-shards.sh sets them); IM_GW_BIN the gateway binary.
"""
import asyncio
import faulthandler
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imgw import Client, DB, DeviceRowLock, free_port, register, run_tests, sql, token, until  # noqa: E402
from gwmetrics import metric  # noqa: E402

GW_BIN = os.environ.get("IM_GW_BIN") or os.path.join(HERE, "..", "..", "gateway", "im_gateway")
DEVICE = "phone"


def node_conninfos():
    """Each node's conninfo ($IM_SHARDS_DIR/nodes); one database: its own."""
    d = os.environ.get("IM_SHARDS_DIR")
    if not d:
        return ["dbname=%s" % DB]
    out = []
    with open(os.path.join(d, "nodes")) as f:
        for line in f:
            if line.strip():
                out.append(line.strip().split(None, 1)[1])
    return out


def users_on_one_node(k):
    """k fresh user ids whose bucket (id % 64) lies on node 1 (bucket b on
    node b % N + 1, the shard design)."""
    n = len(node_conninfos())
    base = int(time.time() * 1000) % (10**9) * 64 + 10**12
    out = []
    u = base
    while len(out) < k:
        if (u % 64) % n == 0:
            out.append(u)
        u += 1
    return out


def start_gateway():
    port = free_port()
    dsn = os.environ.get("IM_ROUTER_DSN") or "dbname=%s" % DB
    p = subprocess.Popen([GW_BIN, "--listen", "127.0.0.1:%d" % port, "--pool", "3",
                          "--hello-timeout", "120", "--statement-timeout", "60000", "--db", dsn],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = "ws://127.0.0.1:%d/" % port
    for _ in range(200):
        try:
            if metric("im_gateway_pool_ready", url) >= 3:
                return p, url
        except OSError:
            pass
        time.sleep(0.05)
    p.kill()
    raise AssertionError("gateway did not come up")


async def b_answered_or_waiting(c, url, waits, timeout=60):
    """Until c has a frame or the gateway counts one more hello waiting
    for an earlier one of its device."""
    deadline = time.monotonic() + timeout
    while metric("im_gateway_hello_device_waits_total", url) <= waits:
        if time.monotonic() > deadline:
            raise AssertionError("b neither answered nor waiting for a")
        try:
            f = await c.recv_frame(0.05)
        except asyncio.TimeoutError:
            continue
        if f is not None:
            c.pending.append(f)
            return


async def send_hello(url, user, tok):
    c = await Client.open("%d/%s" % (user, DEVICE), url=url)
    await c.ws.send('{"type":"hello","id":"h","token":"%s"}' % tok)
    return c


async def test_stale_hello_does_not_supersede_newer():
    z1, z2, x, d = users_on_one_node(4)
    for u in (z1, z2, x, d):
        register(u, DEVICE)
    # tokens first: issuing one reads the device row the locks hold
    tok = {u: token(u, DEVICE) for u in (z1, z2, x, d)}
    node = node_conninfos()[0]
    gw, url = start_gateway()
    socks = []
    try:
        def in_flight():
            return metric("im_gateway_hellos_in_flight", url)

        lz1, lz2, lx = (DeviceRowLock(u, DEVICE, node) for u in (z1, z2, x))
        # 1. both hello connections wait on the node
        socks.append(await send_hello(url, z1, tok[z1]))
        await until("z1's hello waiting on its row", lambda: lz1.waiters() == 1)
        socks.append(await send_hello(url, z2, tok[z2]))
        await until("z2's hello waiting on its row", lambda: lz2.waiters() == 1)
        # 2. x, then a, queued behind them; z1's connection takes both
        cx = await send_hello(url, x, tok[x])
        socks.append(cx)
        await until("x's hello in the gateway", lambda: in_flight() == 3)
        batches = metric("im_gateway_hello_batches_total", url)
        ca = await send_hello(url, d, tok[d])
        await until("a's hello in the gateway", lambda: in_flight() == 4)
        lz1.release()
        await until("x's batch waiting on x's row", lambda: lx.waiters() == 1)
        assert metric("im_gateway_hello_batches_total", url) == batches + 1, \
            "x and a were not batched: the set-up did not hold"
        # 3. a's socket closes; b, the newer hello, finds a connection free
        await ca.close()
        cb = await send_hello(url, d, tok[d])
        socks.append(cb)
        waits = metric("im_gateway_hello_device_waits_total", url)
        lz2.release()
        w = await socks[1].reply("h", 60)
        assert w["type"] == "welcome", w
        # b has run (its welcome came: the order of gap 6) or waits for a
        await b_answered_or_waiting(cb, url, waits)
        # 4. x and the stale a run; b's welcome must come with the newest epoch
        lx.release()
        wx = await cx.reply("h", 60)
        assert wx["type"] == "welcome", wx
        wb = await cb.reply("h", 60)
        assert wb["type"] == "welcome", wb
        ep = wb["connection_epoch"]
        # x is welcomed only after a's statement ran (same transaction), so
        # a's epoch is settled on the node by now: b must be D's current one
        cur = sql("SELECT current FROM im.device_session(%s, %s, %s)", d, DEVICE, ep)[0][0]
        assert cur, "the stale hello superseded the newer session (epoch %d)" % ep
        pong = await cb.req({"type": "ping"})
        assert pong["type"] == "pong", pong
        print("b welcomed with epoch %d, current; hellos that waited for their device: %d"
              % (ep, metric("im_gateway_hello_device_waits_total", url)))
    finally:
        for c in socks:
            try:
                await c.close()
            except Exception:
                pass
        gw.terminate()
        gw.wait()


if __name__ == "__main__":
    faulthandler.dump_traceback_later(150, exit=True)
    sys.exit(run_tests([test_stale_hello_does_not_supersede_newer], "hello order"))
