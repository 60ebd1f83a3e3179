#!/usr/bin/env python3
"""Read receipts through the gateway (contract §20): the frame
`set_read_receipts` -> set_read_receipts_result with `read_receipts`, for
the session's user only; off, the sender's receipt shows delivery but no
read state (read_through_seq null), on again it shows the read cursor; the
reply echoes the id and the trace id; refusals are their contract codes and
the session goes on."""
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, Client, new_user_ids, register, sql, expect  # noqa: E402


async def receipt_where(c, conv, pred, timeout=30):
    """the sender's newest receipt event of conv once pred holds for it"""
    loop = asyncio.get_event_loop()
    deadline = loop.time() + timeout
    while True:
        await c.catch_up()
        rs = [c.events[s] for s in sorted(c.events)
              if c.events[s]["kind"] == "receipt" and c.events[s].get("conversation_id") == conv]
        if rs and pred(rs[-1]):
            return rs[-1]
        assert loop.time() < deadline, rs
        await asyncio.sleep(0.3)


async def test_set_read_receipts():
    a, b = new_user_ids(2)
    for u in (a, b):
        register(u, "phone")
    direct = sql("SELECT im.direct_conversation(%s, %s)", a, b)[0][0]
    ca = await Client.login(a, "phone")
    cb = await Client.login(b, "phone")
    for c in (ca, cb):
        await c.bootstrap()
    r = await expect(ca, {"type": "set_read_receipts", "enabled": False, "id": "s1",
                          "trace_id": "receipts-trace-1"}, "set_read_receipts_result")
    assert r == {"type": "set_read_receipts_result", "id": "s1", "trace_id": "receipts-trace-1",
                 "read_receipts": False}, r
    assert sql("SELECT read_receipts FROM im.receipt_setting WHERE user_id = %s", a) == [(False,)]
    s = await expect(cb, {"type": "send", "conversation_id": direct, "client_msg_id": "m1",
                          "body": {"text": "hi"}}, "send_result")
    seq = s["msg_seq"]
    loop = asyncio.get_event_loop()
    deadline = loop.time() + 30
    while not any(e["kind"] == "message" for e in ca.events.values()):
        await ca.catch_up()          # a's device ACKs it
        assert loop.time() < deadline, ca.events
        await asyncio.sleep(0.2)
    await expect(ca, {"type": "read", "conversation_id": direct, "read_to_seq": seq}, "read_result")
    rc = await receipt_where(cb, direct, lambda e: e["delivered_through_seq"] >= seq)
    assert rc["read_through_seq"] is None, rc    # off: no read state, delivery still
    # on again: the read cursor shows
    r = await expect(ca, {"type": "set_read_receipts", "enabled": True}, "set_read_receipts_result")
    assert r["read_receipts"] is True, r
    s = await expect(cb, {"type": "send", "conversation_id": direct, "client_msg_id": "m2",
                          "body": {"text": "again"}}, "send_result")
    seq2 = s["msg_seq"]
    deadline = loop.time() + 30
    while not any(e["kind"] == "message" and e["msg_seq"] == seq2 for e in ca.events.values()):
        await ca.catch_up()
        assert loop.time() < deadline, ca.events
        await asyncio.sleep(0.2)
    await expect(ca, {"type": "read", "conversation_id": direct, "read_to_seq": seq2}, "read_result")
    rc = await receipt_where(cb, direct, lambda e: (e["read_through_seq"] or 0) >= seq2)
    assert rc["delivered_through_seq"] >= seq2, rc
    for c in (ca, cb):
        await c.close()


async def test_set_read_receipts_errors():
    a, other = new_user_ids(2)
    register(a, "phone")
    ca = await Client.login(a, "phone")
    cases = [
        ({"type": "set_read_receipts"}, "BAD_FRAME"),
        ({"type": "set_read_receipts", "enabled": "no"}, "BAD_FRAME"),
        ({"type": "set_read_receipts", "enabled": False, "user_id": other}, "FORBIDDEN"),
        ({"type": "set_read_receipts", "enabled": False, "trace_id": "not a trace id"}, "INVALID_ARGUMENT"),
    ]
    for i, (frame, code) in enumerate(cases):
        frame = dict(frame, id="e%d" % i)
        r = await ca.req(frame)
        assert r["type"] == "error" and r["code"] == code and r["id"] == "e%d" % i, (frame, r)
    # nothing was stored for either user; the session goes on
    assert sql("SELECT count(*) FROM im.receipt_setting WHERE user_id IN (%s, %s)", a, other) == [(0,)]
    r = await expect(ca, {"type": "set_read_receipts", "enabled": True, "user_id": a},
                     "set_read_receipts_result")
    assert r["read_receipts"] is True, r
    await ca.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_set_read_receipts, test_set_read_receipts_errors], label="read_receipts"))
