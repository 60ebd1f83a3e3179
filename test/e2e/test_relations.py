#!/usr/bin/env python3
"""Reactions, pins and replies (contract §14): the gateway frames `react` -> react_result,
`pin` -> pin_result and `send` with reply_to_message_id; the positions
reach every member's devices through sync, fetch_messages carries
reply_to_message_id, reactions and my_reactions; each refusal is its
contract code, answered with its id, and the session goes on."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, Client, new_user_ids, register, sql, expect, wait_events  # noqa: E402


def setup_group(n=3):
    users = new_user_ids(n)
    for u in users:
        register(u, "phone")
    conv = sql("SELECT im.create_conversation('group', %s::bigint[], %s)", users, users[0])[0][0]
    return users, conv


async def test_react_pin_reply():
    (a, b, c3), conv = setup_group()
    ca = await Client.login(a, "phone")
    cb = await Client.login(b, "phone")
    await ca.bootstrap()
    await cb.bootstrap()
    m1 = await expect(ca, {"type": "send", "conversation_id": conv, "client_msg_id": "m1",
                           "body": {"text": "question"}}, "send_result")
    # a reply: send with reply_to_message_id (with and without content_type)
    r1 = await expect(cb, {"type": "send", "conversation_id": conv, "client_msg_id": "r1",
                           "body": {"text": "answer"}, "reply_to_message_id": m1["message_id"]},
                      "send_result")
    r2 = await expect(cb, {"type": "send", "conversation_id": conv, "client_msg_id": "r2",
                           "body": {"text": "**answer**"}, "content_type": "markdown",
                           "reply_to_message_id": m1["message_id"]}, "send_result")
    assert r1["created"] and r2["created"], (r1, r2)
    # react: the row of the function; idempotent by client_msg_id
    x = await expect(cb, {"type": "react", "conversation_id": conv, "target_message_id": m1["message_id"],
                          "reaction": "👍", "present": True, "client_msg_id": "x1"}, "react_result")
    assert x["created"] is True and x["msg_seq"] > r2["msg_seq"], x
    again = await expect(cb, {"type": "react", "conversation_id": conv, "target_message_id": m1["message_id"],
                              "reaction": "👍", "present": True, "client_msg_id": "x1"}, "react_result")
    assert again["created"] is False and again["message_id"] == x["message_id"], again
    await expect(ca, {"type": "react", "conversation_id": conv, "target_message_id": m1["message_id"],
                      "reaction": "🎉", "present": True, "client_msg_id": "x2"}, "react_result")
    p = await expect(ca, {"type": "pin", "conversation_id": conv, "target_message_id": m1["message_id"],
                          "pinned": True, "client_msg_id": "p1"}, "pin_result")
    assert p["created"] is True, p

    # every member's device gets the positions with their bodies (full state)
    for cl in (ca, cb):
        pins = await wait_events(cl, conv, lambda e: e["kind"] == "pin")
        assert pins[-1]["body"] == {"pinned": [m1["message_id"]]}, pins
        assert pins[-1]["target_message_id"] == m1["message_id"], pins
        reacts = [e for e in cl.events.values() if e.get("conversation_id") == conv and e["kind"] == "reaction"]
        assert sorted((e["sender_id"], tuple(e["body"]["reactions"])) for e in reacts) == \
            sorted([(b, ("👍",)), (a, ("🎉",))]), reacts
        replies = [e for e in cl.events.values() if e.get("conversation_id") == conv and e["kind"] == "message"
                   and e.get("reply_to_message_id") == m1["message_id"]]
        assert len(replies) == 2, replies

    # fetch_messages through the gateway: counts, the reader's keys, replies
    f = await expect(cb, {"type": "fetch_messages", "conversation_id": conv, "after_seq": 0}, "fetch_messages_result")
    byid = {m["message_id"]: m for m in f["messages"]}
    assert byid[m1["message_id"]]["reactions"] == {"👍": 1, "🎉": 1}, byid[m1["message_id"]]
    assert byid[m1["message_id"]]["my_reactions"] == ["👍"], byid[m1["message_id"]]
    assert byid[m1["message_id"]]["reply_to_message_id"] is None, byid[m1["message_id"]]
    assert byid[r1["message_id"]]["reply_to_message_id"] == m1["message_id"], byid[r1["message_id"]]

    # a recall drops the reactions and appends the pin list without it
    await expect(ca, {"type": "recall", "conversation_id": conv, "client_msg_id": "rc1",
                      "target_message_id": m1["message_id"]}, "recall_result")
    pins = await wait_events(cb, conv, lambda e: e["kind"] == "pin" and e["body"] == {"pinned": []})
    assert pins[-1]["target_message_id"] is None and pins[-1]["sender_id"] is None, pins
    f = await expect(cb, {"type": "fetch_messages", "conversation_id": conv, "after_seq": 0}, "fetch_messages_result")
    byid = {m["message_id"]: m for m in f["messages"]}
    assert byid[m1["message_id"]]["reactions"] == {} and byid[m1["message_id"]]["my_reactions"] == [], byid
    for cl in (ca, cb):
        await cl.close()


async def test_relation_errors():
    (a, b, c3), conv = setup_group()
    outsider = new_user_ids(1)[0]
    register(outsider, "phone")
    other = sql("SELECT im.create_conversation('group', %s::bigint[], %s)", [outsider], outsider)[0][0]
    om = sql("SELECT message_id FROM im.send_message(%s, %s, 'om', '{}')", outsider, other)[0][0]
    ca = await Client.login(a, "phone")
    co = await Client.login(outsider, "phone")
    m = await expect(ca, {"type": "send", "conversation_id": conv, "client_msg_id": "m",
                          "body": {"text": "x"}}, "send_result")
    mid = m["message_id"]

    def react(**kw):
        return dict({"type": "react", "conversation_id": conv, "target_message_id": mid,
                     "reaction": "👍", "present": True, "client_msg_id": "e"}, **kw)

    def pin(**kw):
        return dict({"type": "pin", "conversation_id": conv, "target_message_id": mid,
                     "pinned": True, "client_msg_id": "e"}, **kw)

    cases = [
        (ca, react(target_message_id=om), "NOT_FOUND"),
        (ca, react(target_message_id=999999999999), "NOT_FOUND"),
        (co, react(), "FORBIDDEN"),
        (ca, react(reaction=""), "INVALID_ARGUMENT"),
        (ca, react(reaction="x" * 33), "INVALID_ARGUMENT"),
        (ca, react(present="yes"), "BAD_FRAME"),
        (ca, react(present=None), "BAD_FRAME"),
        (ca, react(reaction=7), "BAD_FRAME"),
        (ca, react(user_id=b), "FORBIDDEN"),
        (ca, pin(target_message_id=om), "NOT_FOUND"),
        (co, pin(), "FORBIDDEN"),
        (ca, pin(pinned=1), "BAD_FRAME"),
        (ca, {"type": "send", "conversation_id": conv, "client_msg_id": "e", "body": {},
              "reply_to_message_id": om}, "NOT_FOUND"),
        (ca, {"type": "send", "conversation_id": conv, "client_msg_id": "e", "body": {},
              "reply_to_message_id": "7"}, "BAD_FRAME"),
    ]
    for i, (cl, frame, code) in enumerate(cases):
        frame = dict(frame, id="c%d" % i)
        r = await cl.req(frame)
        assert r["type"] == "error" and r["code"] == code and r["id"] == "c%d" % i, (frame, r)
    # a recalled target: CONFLICT; a key reused for another request: CONFLICT
    await expect(ca, {"type": "recall", "conversation_id": conv, "client_msg_id": "rc",
                      "target_message_id": mid}, "recall_result")
    for frame in (react(client_msg_id="e2"), pin(client_msg_id="e3"), react(client_msg_id="m")):
        r = await ca.req(frame)
        assert r["type"] == "error" and r["code"] == "CONFLICT", (frame, r)
    # nothing of the refusals was written, and the session goes on
    if os.environ.get("IM_SHARDS_DIR"):
        # a router (sharding): no node's table; a, a member throughout, sees every position
        n = len([p for p in sql("SELECT * FROM im.fetch_messages(%s, %s, 0, 1000)", a, conv)[0][0]
                 if p["kind"] in ("reaction", "pin")])
    else:
        n = sql("SELECT count(*) FROM im.event WHERE conversation_id = %s AND kind IN ('reaction', 'pin')", conv)[0][0]
    assert n == 0, n
    await expect(ca, {"type": "conversations"}, "conversations_result")
    await ca.close()
    await co.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_react_pin_reply, test_relation_errors], label="relations"))
