#!/usr/bin/env python3
"""Large replies: every request gets a reply, however large its result.

400 messages of 60 KB in one conversation (24 MB, past the gateway's
16 MiB per-session queue), then fetch_messages limit 400 and sync limit
1000: each request gets a reply with its id — a page (ending early with
has_more once pages are bounded by bytes in SQL) or an UNAVAILABLE error
with retry_after_ms — and the session goes on."""
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, Client, new_user_ids, pg, register, sql  # noqa: E402

N = 400
SIZE = 60000


def check_reply(r, want_type, items):
    if r["type"] == "error":
        assert r["code"] == "UNAVAILABLE" and isinstance(r.get("retry_after_ms"), int), r
        return "UNAVAILABLE"
    assert r["type"] == want_type, {k: v for k, v in r.items() if k != items}
    assert isinstance(r[items], list), type(r[items])
    return "%d items, has_more %s" % (len(r[items]), r["has_more"])


async def test_large_replies():
    a, b = new_user_ids(2)
    register(a, "phone")
    register(b, "phone")
    conv = sql("SELECT im.direct_conversation(%s, %s)", a, b)[0][0]
    cb = await Client.login(b, "phone")
    await cb.bootstrap()
    base = cb.applied
    body = json.dumps({"t": "x" * SIZE})
    with pg() as c, c.cursor() as cur:
        for i in range(N):
            cur.execute("SELECT * FROM im.send_message(%s, %s, %s, %s::jsonb)", (a, conv, "big%d" % i, body))
    # wait until fanout delivered them all to b's log (device_session: the
    # user's high watermark, through a router too; the epoch only decides `current`)
    deadline = time.monotonic() + 120
    while sql("SELECT high_watermark FROM im.device_session(%s, 'phone', 0)", b)[0][0] < base + N:
        assert time.monotonic() < deadline, "fanout did not deliver"
        await asyncio.sleep(0.3)

    r = await cb.req({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0, "limit": N}, timeout=60)
    print("  fetch_messages limit %d: %s" % (N, check_reply(r, "fetch_messages_result", "messages")), flush=True)
    r = await cb.req({"type": "sync", "sync_generation": cb.gen, "local_applied_sync_seq": cb.applied,
                      "limit": 1000}, timeout=60)
    print("  sync limit 1000: %s" % check_reply(r, "sync_result", "events"), flush=True)
    # a small page still works on the same session
    r = await cb.req({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0, "limit": 5}, timeout=60)
    assert r["type"] == "fetch_messages_result" and len(r["messages"]) == 5, r.get("type")
    assert (await cb.req({"type": "ping"}))["type"] == "pong"
    await cb.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_large_replies], "test_large_replies", timeout=300))
