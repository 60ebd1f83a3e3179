#!/usr/bin/env python3
"""Forged hellos naming a device never wait for, nor hold back, that
device's real hellos, nor fill --max-pending-hello behind them
(gateway/server/db/hello_order.c).

Tokens are verified only in the database (im.authenticate), so the claims
the gateway reads from a token to keep a device's hellos in order may be
forged; it orders a hello by its device only once the database has
accepted its token.  Set-up (a gateway of its own, --pool 3: two hello
connections, --max-pending-hello 4):

  1. device D logs in once (its token is now accepted), then D's device row
     is locked and D's real hello g waits on it in the database;
  2. four hellos whose tokens carry D's claims with a broken MAC, then a
     real hello of another user X;
  3. while g still waits: every forged hello is answered NOT_AUTHENTICATED
     and X is welcomed.  Before, the forged hellos waited behind g (same
     claims), held --max-pending-hello, and X waited behind them until the
     lock went;
  4. the lock goes: g is welcomed.

Environment: libpq's (PGHOST/PGPORT/PGUSER), IM_E2E_DB, IM_GW_BIN.
"""
import base64
import faulthandler
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imgw import DB, Client, DeviceRowLock, free_port, new_user_ids, register, run_tests, token, until  # noqa: E402
from gwmetrics import metric  # noqa: E402

GW_BIN = os.environ.get("IM_GW_BIN") or os.path.join(HERE, "..", "..", "gateway", "im_gateway")


def forged(tok, i):
    """tok with byte i of its MAC (the last 32 bytes) flipped: D's claims,
    a signature that does not verify."""
    raw = bytearray(base64.urlsafe_b64decode(tok + "=" * (-len(tok) % 4)))
    raw[-1 - i] ^= 0x01
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def start_gateway():
    port = free_port()
    p = subprocess.Popen([GW_BIN, "--listen", "127.0.0.1:%d" % port, "--pool", "3",
                          "--max-pending-hello", "4", "--hello-timeout", "120",
                          "--statement-timeout", "60000", "--db", "dbname=%s" % DB],
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


async def send_hello(url, tok, rid="h"):
    c = await Client.open(url=url)
    await c.ws.send(json.dumps({"type": "hello", "id": rid, "token": tok}))
    return c


async def test_forged_claims_do_not_queue_behind_real_device():
    d, x = new_user_ids(2)
    register(d, "phone")
    register(x, "phone")
    tok_d, tok_x = token(d, "phone"), token(x, "phone")
    gw, url = start_gateway()
    socks = []
    lock = None
    try:
        # 1. D's token is accepted once; then D's real hello waits on its row
        c = await Client.login(d, "phone", url=url)
        await c.close()
        await until("D's first session gone", lambda: metric("im_gateway_connections", url) == 0)
        lock = DeviceRowLock(d, "phone")
        g = await send_hello(url, tok_d)
        socks.append(g)
        await until("D's hello waiting on its row", lambda: lock.waiters() == 1)
        # 2. forged hellos with D's claims, then X
        fakes = []
        for i in range(4):
            fakes.append(await send_hello(url, forged(tok_d, i)))
        socks += fakes
        cx = await send_hello(url, tok_x)
        socks.append(cx)
        # 3. answered while D's real hello still waits
        for f in fakes:
            r = await f.reply("h", 30)
            assert r["type"] == "error" and r["code"] == "NOT_AUTHENTICATED", r
        w = await cx.reply("h", 30)
        assert w["type"] == "welcome" and w["user_id"] == x, w
        assert lock.waiters() == 1, "D's real hello stopped waiting: the set-up did not hold"
        # 4. the lock goes: D's real hello is welcomed
        lock.release()
        lock = None
        wg = await g.reply("h", 30)
        assert wg["type"] == "welcome" and wg["user_id"] == d, wg
        assert (await g.req({"type": "ping"}))["type"] == "pong"
    finally:
        if lock:
            lock.release()
        for s in socks:
            try:
                await s.close()
            except Exception:
                pass
        gw.terminate()
        gw.wait()


if __name__ == "__main__":
    faulthandler.dump_traceback_later(150, exit=True)
    sys.exit(run_tests([test_forged_claims_do_not_queue_behind_real_device], "forged hello claims"))
