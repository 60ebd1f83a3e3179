#!/usr/bin/env python3
"""Integer ranges: an integer field out of its column's range is
INVALID_ARGUMENT (22003, contract §10), never INTERNAL; so is a number
past what the gateway's JSON reader holds.  Real bad frames, each answered
with its id, and the session goes on."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, Client, new_user_ids, register, sql  # noqa: E402
from rawjson import raw_req  # noqa: E402

INT4_OVER = 2**31
INT8_OVER = "99999999999999999999"


async def test_int_range():
    a, b = new_user_ids(2)
    register(a, "phone")
    register(b, "phone")
    conv = sql("SELECT im.direct_conversation(%s, %s)", a, b)[0][0]
    c = await Client.login(a, "phone")
    frames = [
        ({"type": "conversations", "limit": INT4_OVER}, None),
        ({"type": "conversations", "limit": -INT4_OVER - 1}, None),
        ({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0, "limit": INT4_OVER}, None),
        ({"type": "sync", "sync_generation": INT4_OVER, "local_applied_sync_seq": 0}, None),
        ({"type": "sync", "sync_generation": 1, "local_applied_sync_seq": 0, "limit": 2**40}, None),
        ({"type": "snapshot_fetch", "snapshot_token": "t", "page": 2**33}, None),
        # past int64: the JSON reader's own range
        ({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0}, '"limit":' + INT8_OVER),
        ({"type": "read", "conversation_id": conv}, '"read_to_seq":-' + INT8_OVER),
    ]
    for fields, raw in frames:
        r = await raw_req(c, fields, raw)
        assert r["type"] == "error" and r["code"] == "INVALID_ARGUMENT", (fields, raw, r)
    # an id that is a string survives an out-of-range number
    await c.ws.send('{"type":"conversations","id":"big","limit":%s}' % INT8_OVER)
    r = await c.next_frame()
    assert r["type"] == "error" and r["code"] == "INVALID_ARGUMENT" and r["id"] == "big", r
    # a real past double: refused too (its frame cannot be read, so no id)
    await c.ws.send('{"type":"conversations","id":"r","after_conversation_id":1e400}')
    r = await c.next_frame()
    assert r["type"] == "error" and r["code"] == "INVALID_ARGUMENT", r
    r = await c.req({"type": "conversations", "limit": 10})
    assert r["type"] == "conversations_result", r
    await c.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_int_range], "test_int_range", timeout=120))
