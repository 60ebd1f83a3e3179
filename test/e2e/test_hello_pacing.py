#!/usr/bin/env python3
"""Reconnect-storm pacing (§11.3, gateway --max-pending-hello and
--max-waiting-hello): run against a gateway started with --max-pending-hello
1 --max-waiting-hello 5.  Many hellos at once: one in flight, five waiting,
the ones over both limits are refused with RATE_LIMITED, an integer
retry_after_ms and close 4029; the refusals get increasing waits (one slot each at the measured
hello rate, not one shared wait), and every device gets in after waiting its
retry_after_ms."""
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import Client, new_user_ids, register, token  # noqa: E402

N = 30


async def one(u, refusals):
    tok = token(u, "pace")
    for _ in range(20):
        c = await Client.open()
        r = await c.req({"type": "hello", "token": tok})
        if r["type"] == "welcome":
            await c.close()
            return
        assert r["type"] == "error" and r["code"] == "RATE_LIMITED", r
        assert isinstance(r.get("retry_after_ms"), int) and r["retry_after_ms"] > 0, r
        code, _ = await c.wait_closed()
        assert code == 4029, code
        refusals.append(r["retry_after_ms"])
        await asyncio.sleep(r["retry_after_ms"] / 1000)
    raise AssertionError("device %d never got in" % u)


async def main():
    users = new_user_ids(N)
    for u in users:
        register(u, "pace")
    refusals = []
    await asyncio.wait_for(asyncio.gather(*(one(u, refusals) for u in users)), 120)
    assert refusals, "no refusal with --max-pending-hello 1, --max-waiting-hello 5 and %d hellos at once" % N
    # paced: refused clients do not all get the same wait
    assert len(set(refusals)) > 1, refusals
    print("hello pacing: %d refusals, retry_after_ms %d..%d" % (len(refusals), min(refusals), max(refusals)))


if __name__ == "__main__":
    asyncio.run(main())
