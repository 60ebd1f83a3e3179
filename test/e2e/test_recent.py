#!/usr/bin/env python3
"""Recency and conversation pins through the gateway (contract §20): the
frames `recent_conversations` -> recent_conversations_result with `rows`
and `next_cursor`, and `pin_conversation` -> pin_conversation_result; pages
follow the cursor to the end, a pin moves a conversation to the top and
reaches the user's other device as a `conversation_pin` sync event; both
echo the id and the trace id; refusals are their contract codes and the
session goes on."""
import asyncio
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, Client, new_user_ids, register, sql, expect  # noqa: E402


async def pages(c, limit):
    """every page of the user's list, in order: (ids, number of pages)."""
    ids, cursor, n = [], None, 0
    while True:
        frame = {"type": "recent_conversations", "limit": limit}
        if cursor is not None:
            frame["after_cursor"] = cursor
        r = await expect(c, frame, "recent_conversations_result")
        n += 1
        ids += [row["conversation_id"] for row in r["rows"]]
        assert len(r["rows"]) <= limit, r
        if r["next_cursor"] is None:
            return ids, n
        assert r["next_cursor"] == r["rows"][-1]["next_cursor"], r
        cursor = r["next_cursor"]


async def test_recent_and_pins():
    a, b = new_user_ids(2)
    for u in (a, b):
        register(u, "phone")
    register(a, "laptop")
    convs = [sql("SELECT im.create_conversation('group', %s::bigint[], %s)", [a, b], b)[0][0]
             for _ in range(5)]
    direct = sql("SELECT im.direct_conversation(%s, %s)", a, b)[0][0]
    ca = await Client.login(a, "phone")
    cl = await Client.login(a, "laptop")
    cb = await Client.login(b, "phone")
    await cl.bootstrap()
    # messages in convs[1], then direct, then convs[3]: newest first
    for i, conv in enumerate((convs[1], direct, convs[3])):
        await expect(cb, {"type": "send", "conversation_id": conv, "client_msg_id": "m%d" % i,
                          "body": {"text": "hi"}}, "send_result")
    expected = [convs[3], direct, convs[1], convs[0], convs[2], convs[4]]
    loop = asyncio.get_event_loop()
    deadline = loop.time() + 30
    while True:   # fanout is asynchronous: wait until all three moved
        ids, _ = await pages(ca, 50)
        if ids == expected:
            break
        assert loop.time() < deadline, (ids, expected)
        await asyncio.sleep(0.3)
    r = await expect(ca, {"type": "recent_conversations", "id": "r1", "trace_id": "recent-trace-1"},
                     "recent_conversations_result")
    assert r["id"] == "r1" and r["trace_id"] == "recent-trace-1" and r["next_cursor"] is None, r
    row = r["rows"][1]
    assert row["conversation_id"] == direct and row["kind"] == "direct" and row["my_role"] is None, row
    assert row["conversation_pinned"] is False and row["left_conversation"] is False, row
    assert row["last_activity_at"] is not None and row["muted_until"] is None, row
    assert r["rows"][0]["my_role"] == "member" and r["rows"][-1]["last_activity_at"] is None, r
    # pages of 2 through the cursor: the same list, three pages
    ids, n = await pages(ca, 2)
    assert ids == expected and n == 3, (ids, n)

    # a pin: to the top, echoed, idempotent, synced to the other device
    p = await expect(ca, {"type": "pin_conversation", "conversation_id": convs[4], "pinned": True,
                          "id": "p1", "trace_id": "pin-trace-1"}, "pin_conversation_result")
    assert p == {"type": "pin_conversation_result", "id": "p1", "trace_id": "pin-trace-1",
                 "conversation_pinned": True}, p
    p = await expect(ca, {"type": "pin_conversation", "conversation_id": convs[4], "pinned": True},
                     "pin_conversation_result")
    assert p["conversation_pinned"] is True, p
    ids, _ = await pages(ca, 4)
    assert ids == [convs[4]] + [c for c in expected if c != convs[4]], ids
    # b's list is b's own
    idsb, _ = await pages(cb, 50)
    assert idsb[0] == convs[3], idsb
    deadline = loop.time() + 30
    while True:
        await cl.catch_up()
        pins = [e for e in cl.events.values() if e["kind"] == "conversation_pin"]
        if pins:
            break
        assert loop.time() < deadline, list(cl.events.values())
        await asyncio.sleep(0.3)
    assert len(pins) == 1 and pins[0]["conversation_id"] == convs[4], pins
    assert pins[0]["conversation_pinned"] is True, pins
    p = await expect(ca, {"type": "pin_conversation", "conversation_id": convs[4], "pinned": False},
                     "pin_conversation_result")
    assert p["conversation_pinned"] is False, p
    ids, _ = await pages(ca, 50)
    assert ids == expected, ids
    for c in (ca, cl, cb):
        await c.close()


async def test_recent_errors():
    a, outsider = new_user_ids(2)
    for u in (a, outsider):
        register(u, "phone")
    conv = sql("SELECT im.create_conversation('group', %s::bigint[], %s)", [a], a)[0][0]
    ca = await Client.login(a, "phone")
    co = await Client.login(outsider, "phone")
    cases = [
        (co, {"type": "pin_conversation", "conversation_id": conv, "pinned": True}, "FORBIDDEN"),
        (ca, {"type": "pin_conversation", "conversation_id": 999999999999, "pinned": True}, "NOT_FOUND"),
        (ca, {"type": "pin_conversation", "conversation_id": conv, "pinned": "yes"}, "BAD_FRAME"),
        (ca, {"type": "pin_conversation", "conversation_id": conv}, "BAD_FRAME"),
        (ca, {"type": "pin_conversation", "conversation_id": conv, "pinned": True, "user_id": outsider},
         "FORBIDDEN"),
        (ca, {"type": "recent_conversations", "after_cursor": "not a cursor"}, "INVALID_ARGUMENT"),
        (ca, {"type": "recent_conversations", "after_cursor": 7}, "BAD_FRAME"),
        (ca, {"type": "recent_conversations", "limit": 0}, "INVALID_ARGUMENT"),
    ]
    for i, (cl, frame, code) in enumerate(cases):
        frame = dict(frame, id="e%d" % i, trace_id="err-trace-%d" % i)
        r = await cl.req(frame)
        assert r["type"] == "error" and r["code"] == code and r["id"] == "e%d" % i, (frame, r)
        assert r["trace_id"] == "err-trace-%d" % i, r
    # the session goes on
    r = await expect(ca, {"type": "recent_conversations"}, "recent_conversations_result")
    assert [row["conversation_id"] for row in r["rows"]] == [conv], r
    for c in (ca, co):
        await c.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_recent_and_pins, test_recent_errors], label="recent"))
