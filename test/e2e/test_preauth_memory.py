#!/usr/bin/env python3
"""Unauthenticated memory amplification (contract §10).

Against a gateway (IM_GW_URL, process id IM_GW_PID) started with
--max-unauth-per-ip 1000 --max-pending-hello 1000 --hello-timeout 120 --pool 4:
a transaction holds the im.device row that authenticate updates, so hellos
for that device stay pending; 500 unauthenticated sockets each send such a
hello and then a 256 KiB frame, all open at once.  Before the fix each queued
its frame behind the pending hello (500 x 256 KiB); now the second frame is NOT_AUTHENTICATED
+ 4001 after at most 8 KiB are read.  Passes when the gateway's peak RSS
(VmHWM) grew by at most 64 MiB over its RSS before, and an authenticated
session did a send/sync round trip while the hellos were pending and after.
"""
import asyncio
import json
import os
import sys

import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, Client, new_user_ids, register, sql, token  # noqa: E402
from test_transport import DeviceRowLock  # noqa: E402

SOCKETS = 500
FRAME = 256 * 1024
LIMIT_KIB = 64 * 1024
PID = int(os.environ["IM_GW_PID"])


def status_kib(field):
    with open("/proc/%d/status" % PID) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(field)


async def round_trip(c, conv, cmid):
    """send, then sync from the device's position and ACK: the session works."""
    r = await c.req({"type": "send", "conversation_id": conv, "client_msg_id": cmid, "body": {"t": cmid}},
                    timeout=30)
    assert r["type"] == "send_result" and r["created"] is True, r
    s = await c.req({"type": "sync", "sync_generation": c.gen, "local_applied_sync_seq": c.applied},
                    timeout=30)
    assert s["type"] == "sync_result" and s["status"] in ("OK", "RECOVERY"), s
    a = await c.req({"type": "ack", "batch_token": s["batch_token"],
                     "acked_sync_seq": s["batch_high_watermark"]}, timeout=30)
    assert a["type"] == "ack_result" and a["status"] == "OK", a
    c.applied = s["batch_high_watermark"]


async def attack(tok, pad):
    """One socket: hello (stays pending), then a large frame; left open."""
    try:
        c = await Client.open()
    except (OSError, websockets.WebSocketException) as e:
        return "connect:%s" % type(e).__name__
    try:
        await c.send_raw(json.dumps({"type": "hello", "token": tok}))
        await c.send_raw(pad)
    except websockets.ConnectionClosed:
        pass                     # closed by the gateway mid-frame: read what it said
    return c


async def outcome(c):
    """What the socket got: 'CODE/close code', or why nothing came."""
    if isinstance(c, str):
        return c
    try:
        r = await c.next_frame(timeout=10)
        code, _ = await c.wait_closed(timeout=10)
        return "%s/%s" % (r.get("code"), code)
    except Exception as e:       # old gateway: no answer while the hello is pending
        return type(e).__name__
    finally:
        await c.ws.close()


async def test_preauth_memory_bounded():
    a, b, victim = new_user_ids(3)
    register(a, "phone")
    register(b, "phone")
    register(victim, "locked")
    conv = sql("SELECT im.direct_conversation(%s, %s)", a, b)[0][0]
    c = await Client.login(a, "phone")
    await c.bootstrap()
    await round_trip(c, conv, "before")
    tok = token(victim, "locked")
    pad = json.dumps({"type": "ping", "pad": "x" * FRAME})
    rss0 = status_kib("VmRSS")
    lock = DeviceRowLock(victim, "locked")
    socks = []
    try:
        # all 500 sockets open at once, each with its hello pending
        for i in range(0, SOCKETS, 50):
            socks += await asyncio.gather(*(attack(tok, pad) for _ in range(50)))
        print("rss before %d KiB, peak with the sockets open %d KiB (+%d KiB)"
              % (rss0, status_kib("VmHWM"), status_kib("VmHWM") - rss0), flush=True)
        outcomes = await asyncio.gather(*(outcome(x) for x in socks))
        # authenticated sessions keep working while hellos are pending
        assert lock.waiting() > 0, "no hello is waiting for the device row"
        await round_trip(c, conv, "during")
    finally:
        lock.release()
    hwm = status_kib("VmHWM")
    await round_trip(c, conv, "after")
    await c.close()
    counts = {}
    for o in outcomes:
        counts[o] = counts.get(o, 0) + 1
    print("rss before %d KiB, peak %d KiB (+%d KiB); outcomes %r" % (rss0, hwm, hwm - rss0, counts))
    assert hwm - rss0 <= LIMIT_KIB, "gateway RSS grew by %d KiB" % (hwm - rss0)
    assert counts == {"NOT_AUTHENTICATED/4001": SOCKETS}, counts


def main():
    return run_tests([test_preauth_memory_bounded], "preauth memory", timeout=300)


if __name__ == "__main__":
    sys.exit(main())
