#!/usr/bin/env python3
"""End-to-end tests of im_gateway over the wire (python3-websockets).

Run by test/suites/60-e2e.sh, which starts the gateway with
--max-frame 65536 --hello-timeout 2 and fanout workers running.
Usage: test_gateway.py [test-name-substring ...]
"""
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import websockets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import (run_tests, Client, Closed, URL, converge, new_user_ids, register, sql,  # noqa: E402
                  token)

HTTP = URL.replace("ws", "http", 1).rstrip("/")    # wss:// -> https://
MAX_FRAME = int(os.environ.get("IM_E2E_MAX_FRAME", "65536"))


def setup_pair():
    a, b = new_user_ids(2)
    for u, d in ((a, "phone"), (b, "desktop"), (b, "phone")):
        register(u, d)
    conv = sql("SELECT im.direct_conversation(%s, %s)", a, b)[0][0]
    return a, b, conv


async def send(c, conv, cmid, body, **kw):
    r = await c.req(dict({"type": "send", "conversation_id": conv, "client_msg_id": cmid, "body": body}, **kw))
    assert r["type"] == "send_result", r
    return r


# ---------------------------------------------------------------- scenario

async def test_scenario_2_1():
    """Design §2.1: A's phone sends to B; B's desktop (online) gets a hint,
    syncs and ACKs; B's phone (offline) reconnects later and catches up;
    more messages and a recall happen meanwhile."""
    a, b, conv = setup_pair()
    bd = await Client.login(b, "desktop")
    await bd.bootstrap()
    bp = await Client.login(b, "phone")
    await bp.bootstrap()
    await bp.close()                                   # B's phone goes offline
    ap = await Client.login(a, "phone")
    await ap.bootstrap()

    hw0 = bd.applied
    m1 = await send(ap, conv, "m1", {"text": "hello"})
    assert m1["created"] is True and m1["msg_seq"] >= 2, m1
    # the reply echoes id and carries the function's columns
    again = await send(ap, conv, "m1", {"text": "hello"})
    assert again["created"] is False and again["message_id"] == m1["message_id"], again

    hint = await bd.wait_hint(min_hw=hw0 + 1)
    assert hint is not None, "B's desktop got no NEW_EVENTS hint"
    assert set(hint) == {"type", "high_watermark", "reason"}, hint
    await converge(bd, conv, {m1["message_id"]: {"text": "hello"}})
    msg_events = [e for e in bd.events.values() if e["kind"] == "message"]
    e = msg_events[0]
    for k in ("kind", "conversation_id", "msg_seq", "message_id", "sender_id", "content_type",
              "body", "target_message_id", "recalled", "created_at", "sync_seq"):
        assert k in e, (k, e)
    assert e["sender_id"] == a and isinstance(e["body"], dict), e

    # meanwhile: more messages and a recall, B's phone still offline
    m2 = await send(ap, conv, "m2", {"text": "oops"})
    m3 = await send(ap, conv, "m3", {"text": "third"}, content_type="text")
    rc = await ap.req({"type": "recall", "conversation_id": conv, "client_msg_id": "r2",
                       "target_message_id": m2["message_id"]})
    assert rc["type"] == "recall_result" and rc["created"] is True, rc
    want = {m1["message_id"]: {"text": "hello"}, m2["message_id"]: None, m3["message_id"]: {"text": "third"}}

    # B's phone reconnects with its old cursor and catches up
    bp2 = await Client.login(b, "phone")
    bp2.gen, bp2.applied = bp.gen, bp.applied
    await converge(bp2, conv, want)
    await converge(bd, conv, want)
    # history read through fetch_messages agrees: recalled message is a tombstone
    fm = await bp2.req({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0, "limit": 100})
    assert fm["type"] == "fetch_messages_result" and isinstance(fm["messages"], list), fm
    byid = {x["message_id"]: x for x in fm["messages"] if x["kind"] == "message"}
    assert byid[m2["message_id"]]["recalled"] is True and byid[m2["message_id"]]["body"] is None, byid
    # read state and the conversation list (rows)
    rd = await bd.req({"type": "read", "conversation_id": conv, "read_to_seq": m3["msg_seq"]})
    assert rd["type"] == "read_result" and rd["read_msg_seq"] == m3["msg_seq"], rd
    cl = await bd.req({"type": "conversations", "limit": 10})
    assert cl["type"] == "conversations_result" and any(r["conversation_id"] == conv for r in cl["rows"]), cl
    for c in (ap, bd, bp2):
        await c.close()


async def test_hint_loss():
    """Hints dropped: a device that never sees a hint still converges by
    syncing (on reconnect and periodically), and conversation_list's head
    tells it a conversation moved."""
    a, b, conv = setup_pair()
    ap = await Client.login(a, "phone")
    await ap.bootstrap()
    bd = await Client.login(b, "desktop")
    await bd.bootstrap()
    gen, applied = bd.gen, bd.applied
    await bd.close()                   # every hint of the next sends is lost
    ids = {}
    for i in range(5):
        r = await send(ap, conv, "loss-%d" % i, {"n": i})
        ids[r["message_id"]] = {"n": i}
    bd2 = await Client.login(b, "desktop")
    bd2.gen, bd2.applied = gen, applied
    bd2.hints.clear()
    await converge(bd2, conv, ids)     # periodic sync, no hint needed
    cl = await bd2.req({"type": "conversations"})
    row = [r for r in cl["rows"] if r["conversation_id"] == conv][0]
    assert row["head_msg_seq"] >= 6, row
    for c in (ap, bd2):
        await c.close()


async def test_takedown_through_sync():
    """A moderator's takedown (contract §17) reaches a device through sync
    like a recall: the message's event comes back as a tombstone (body
    null, recalled false, taken_down true), the takedown event names it;
    fetch_messages agrees; a recall of it is CONFLICT."""
    a, b, conv = setup_pair()
    ap = await Client.login(a, "phone")
    await ap.bootstrap()
    bd = await Client.login(b, "desktop")
    await bd.bootstrap()
    bad = await send(ap, conv, "td-1", {"text": "abuse"})
    fine = await send(ap, conv, "td-2", {"text": "fine"})
    await converge(bd, conv, {bad["message_id"]: {"text": "abuse"}, fine["message_id"]: {"text": "fine"}})
    sql("SELECT created FROM im.takedown_message('e2e-mod', %s, %s, 'spam', %s)",
        conv, bad["message_id"], "td-%d" % bad["message_id"])
    await converge(bd, conv, {bad["message_id"]: None, fine["message_id"]: {"text": "fine"}})
    tds = [e for e in bd.events.values() if e["kind"] == "takedown"]
    assert len(tds) == 1 and tds[0]["target_message_id"] == bad["message_id"], tds
    assert tds[0]["body"] == {"reason": "spam"} and tds[0]["sender_id"] is None, tds
    # a fresh device replays the log: the message itself is the tombstone
    bp = await Client.login(b, "phone")
    await bp.bootstrap()
    fm = await bp.req({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0, "limit": 100})
    byid = {x["message_id"]: x for x in fm["messages"] if x["kind"] == "message"}
    m = byid[bad["message_id"]]
    assert m["body"] is None and m["recalled"] is False and m["taken_down"] is True and m["erased"] is False, m
    assert byid[fine["message_id"]]["taken_down"] is False, byid
    rc = await ap.req({"type": "recall", "conversation_id": conv, "client_msg_id": "td-r",
                       "target_message_id": bad["message_id"]})
    assert rc["type"] == "error" and rc["code"] == "CONFLICT", rc
    # the moderator's side (through the router too: the target's node, every node's log)
    ev = sql("SELECT conversation_id, sender_id, body FROM im.moderation_evidence(%s)", bad["message_id"])
    assert ev == [(conv, a, {"text": "abuse"})], ev
    log = sql("SELECT moderator, action, user_id, conversation_id, reason FROM im.moderation_log(0, 1000) "
              "WHERE message_id = %s", bad["message_id"])
    assert log == [("e2e-mod", "takedown", a, conv, "spam")], log
    for c in (ap, bd, bp):
        await c.close()


async def test_shared_log_hint():
    """shared_log groups: a message reaches connected members as a
    CONVERSATION_ADVANCED hint naming the conversation and its head."""
    a, b = new_user_ids(2)
    register(a, "phone")
    register(b, "desktop")
    conv = sql("SELECT im.create_conversation('group', ARRAY[%s, %s]::bigint[], %s)", a, b, a)[0][0]
    assert sql("SELECT im.set_conversation_mode(%s, 'shared_log')", conv)[0][0] == "shared_log"
    bd = await Client.login(b, "desktop")
    await bd.bootstrap()
    ap = await Client.login(a, "phone")
    m = await send(ap, conv, "sl-1", {"text": "to the group"})
    loop = asyncio.get_event_loop()
    deadline = loop.time() + 15
    hint = None
    while hint is None and loop.time() < deadline:
        hint = next((h for h in bd.hints if h.get("reason") == "CONVERSATION_ADVANCED"), None)
        if hint is None:
            try:
                f = await bd.recv_frame(0.5)
            except asyncio.TimeoutError:
                continue
            if f is not None:
                bd.pending.append(f)
    assert hint is not None, "no CONVERSATION_ADVANCED hint; hints %r" % bd.hints
    assert hint == {"type": "hint", "reason": "CONVERSATION_ADVANCED", "conversation_id": conv,
                    "head_msg_seq": hint["head_msg_seq"]} and hint["head_msg_seq"] >= m["msg_seq"], hint
    fm = await bd.req({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0})
    assert any(x["message_id"] == m["message_id"] for x in fm["messages"]), fm
    for c in (ap, bd):
        await c.close()


# ------------------------------------------------------- session lifecycle

async def test_supersede_4008():
    a, = new_user_ids(1)
    register(a, "tab")
    c1 = await Client.login(a, "tab")
    c2 = await Client.login(a, "tab")          # newer connection of the same device
    code, _ = await c1.wait_closed()
    assert code == 4008, code
    assert (await c2.req({"type": "ping"}))["type"] == "pong"
    await c2.close()


async def test_revoke_4003():
    a, = new_user_ids(1)
    register(a, "old")
    c = await Client.login(a, "old")
    tok = token(a, "old")
    assert sql("SELECT im.revoke_device(%s, 'old')", a)[0][0] is True
    code, _ = await c.wait_closed()
    assert code == 4003, code
    # a token issued before the revocation no longer authenticates
    c2 = await Client.open()
    r = await c2.req({"type": "hello", "token": tok})
    assert r["type"] == "error" and r["code"] == "NOT_AUTHENTICATED", r
    code, _ = await c2.wait_closed()
    assert code == 4001, code


async def test_spoofed_ids_forbidden():
    a, b, conv = setup_pair()
    c = await Client.login(a, "phone")
    for extra in ({"user_id": b}, {"sender_id": b}, {"device_id": "desktop"}, {"user_id": "x"}):
        r = await c.req(dict({"type": "send", "conversation_id": conv, "client_msg_id": "spoof",
                              "body": {"t": 1}}, **extra))
        assert r["type"] == "error" and r["code"] == "FORBIDDEN", (extra, r)
    # naming oneself is fine
    r = await c.req({"type": "conversations", "user_id": a})
    assert r["type"] == "conversations_result", r
    # nothing was stored under the spoofed frames' key
    r = await send(c, conv, "spoof", {"t": 1})
    assert r["created"] is True, r
    await c.close()


# ---------------------------------------------------------------- bad frames

async def test_bad_frames_isolated():
    """Each bad-frame class gets its error (or close) on its own session
    while another client keeps working."""
    a, b, conv = setup_pair()
    good = await Client.login(b, "desktop")
    bad = await Client.login(a, "phone")

    async def still_good(i):
        r = await good.req({"type": "conversations"})
        assert r["type"] == "conversations_result", r

    cases = [
        ("not json", "{nope"),
        ("not an object", "[1,2]"),
        ("no type", json.dumps({"id": 7})),
        ("unknown type", json.dumps({"type": "launch_missiles"})),
        ("wrong type of type", json.dumps({"type": 5})),
        ("string for integer", json.dumps({"type": "read", "conversation_id": str(conv), "read_to_seq": 1})),
        ("float for integer", json.dumps({"type": "read", "conversation_id": conv, "read_to_seq": 1.5})),
        ("body not object", json.dumps({"type": "send", "conversation_id": conv, "client_msg_id": "x", "body": "hi"})),
        ("missing required", json.dumps({"type": "ack", "batch_token": "t"})),
        ("deep nesting", json.dumps({"type": "send", "conversation_id": conv, "client_msg_id": "d",
                                     "body": {"x": json.loads("[" * 40 + "]" * 40)}})),
        ("duplicate keys", '{"type":"ping","type":"ping"}'),
    ]
    for i, (name, raw) in enumerate(cases):
        await bad.send_raw(raw)
        r = await bad.next_frame()
        assert r["type"] == "error" and r["code"] == "BAD_FRAME", (name, r)
        await still_good(i)
    # nesting of exactly 32 is accepted (and reaches SQL)
    ok = {"type": "send", "conversation_id": conv, "client_msg_id": "deep32",
          "body": {"x": json.loads("[" * 30 + "]" * 30)}}
    r = await bad.req(ok)
    assert r["type"] == "send_result", r
    # invalid UTF-8 in a text frame, and a binary frame
    await bad.ws.write_frame(True, websockets.frames.OP_TEXT, b'{"type":"ping","x":"\xff"}')
    r = await bad.next_frame()
    assert r["type"] == "error" and r["code"] == "BAD_FRAME", r
    await bad.send_raw(b'{"type":"ping"}')
    r = await bad.next_frame()
    assert r["type"] == "error" and r["code"] == "BAD_FRAME", r
    # SQL errors map to contract codes; the id is echoed
    r = await bad.req({"type": "send", "id": "x1", "conversation_id": conv, "client_msg_id": "",
                       "body": {"t": 1}})
    # (and every error carries a trace id, here one the gateway made: contract §21)
    assert r == {"type": "error", "id": "x1", "trace_id": r["trace_id"], "code": "INVALID_ARGUMENT",
                 "message": r["message"]}, r
    assert re.match(r"^[0-9a-f]{32}$", r["trace_id"]), r
    r = await bad.req({"type": "send", "conversation_id": 999999999999, "client_msg_id": "nf", "body": {}})
    assert r["code"] == "NOT_FOUND", r
    await send(bad, conv, "conf", {"v": 1})
    r = await bad.req({"type": "send", "conversation_id": conv, "client_msg_id": "conf", "body": {"v": 2}})
    assert r["code"] == "CONFLICT", r
    assert (await bad.req({"type": "ping"}))["type"] == "pong"
    # oversized frame: close 1009
    await bad.send_raw(json.dumps({"type": "ping", "pad": "x" * (MAX_FRAME + 10)}))
    code, _ = await bad.wait_closed()
    assert code == 1009, code
    await still_good(99)
    await good.close()


async def test_first_frame_rules():
    # a frame before hello
    c = await Client.open()
    await c.send_raw(json.dumps({"type": "ping"}))
    r = await c.next_frame()
    assert r["type"] == "error" and r["code"] == "NOT_AUTHENTICATED", r
    code, _ = await c.wait_closed()
    assert code == 4001, code
    # garbage first
    c = await Client.open(subprotocol=False)
    await c.send_raw("\x00garbage")
    r = await c.next_frame()
    assert r["code"] == "NOT_AUTHENTICATED", r
    assert (await c.wait_closed())[0] == 4001
    # a bad token
    c = await Client.open()
    r = await c.req({"type": "hello", "token": "not-a-token"})
    assert r["code"] == "NOT_AUTHENTICATED", r
    assert (await c.wait_closed())[0] == 4001
    # silence: closed 4001 after the hello timeout (2 s in this suite)
    c = await Client.open()
    t0 = time.monotonic()
    assert (await c.wait_closed(timeout=15))[0] == 4001
    assert time.monotonic() - t0 >= 1.5


async def test_rate_limit_4029():
    a, = new_user_ids(1)
    register(a, "spam")
    c = await Client.login(a, "spam")
    # one frame at a time, reading each answer: the bucket (burst 100,
    # 50/s) empties, then ten refusals in a row close the session; nothing
    # of ours is in flight when the close comes
    frames = []
    streak = 0
    for _ in range(400):
        try:
            await c.send_raw('{"type":"ping"}')
            f = await c.next_frame()
        except (websockets.ConnectionClosed, Closed):
            break
        frames.append(f)
        streak = streak + 1 if f.get("code") == "RATE_LIMITED" else 0
        if streak == 10:
            break                      # the gateway must close now
    code, more = await c.wait_closed()
    frames += more
    limited = [f for f in frames if f.get("code") == "RATE_LIMITED"]
    assert code == 4029, code
    assert limited and all(isinstance(f["retry_after_ms"], int) and f["retry_after_ms"] > 0 for f in limited), limited[:3]


async def test_reconnect_storm_refusal():
    """§11.3: a device reconnecting faster than its limit (burst 5, then
    1/s) is refused with RATE_LIMITED + retry_after_ms and close 4029;
    after waiting retry_after_ms it gets in."""
    a, = new_user_ids(1)
    register(a, "flappy")
    refused = None
    for _ in range(8):
        c = await Client.open()
        r = await c.req({"type": "hello", "token": token(a, "flappy")})
        if r["type"] == "error":
            refused = r
            code, _ = await c.wait_closed()
            assert code == 4029, code
            break
        await c.close()
    assert refused is not None, "no refusal after 8 quick reconnects"
    assert refused["code"] == "RATE_LIMITED" and refused["retry_after_ms"] > 0, refused
    await asyncio.sleep(refused["retry_after_ms"] / 1000 + 0.1)
    c = await Client.login(a, "flappy")
    assert (await c.req({"type": "ping"}))["type"] == "pong"
    await c.close()


async def test_http_endpoints():
    r = urllib.request.urlopen(HTTP + "/healthz", timeout=5)
    assert r.status == 200
    body = urllib.request.urlopen(HTTP + "/metrics", timeout=5).read().decode()
    for name in ("im_gateway_connections", "im_gateway_frames_in_total{type=\"send\"}",
                 "im_gateway_errors_total{code=\"BAD_FRAME\"}", "im_gateway_db_seconds_bucket",
                 "im_gateway_hints_sent_total", "im_gateway_pool_waits_total"):
        assert name in body, name
    try:
        urllib.request.urlopen(HTTP + "/nope", timeout=5)
        raise AssertionError("404 expected")
    except urllib.error.HTTPError as e:
        assert e.code == 404


# ------------------------------------------------------------ database restart

def pg_ctl(*args):
    pgdata = os.environ["PGDATA"]
    cmd = [os.path.join(os.environ.get("PGBIN", ""), "pg_ctl") if os.environ.get("PGBIN") else "pg_ctl",
           "-D", pgdata, "-w", "-t", "60", "-l", os.path.join(os.environ["IM_TMP"], "server.log")] + list(args)
    if os.getuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


async def test_db_restart():
    """Database stopped mid-session: UNAVAILABLE with retry_after_ms, the
    session stays open, and after the restart the pool and LISTEN come back,
    every session gets a hint, and requests work again."""
    a, b, conv = setup_pair()
    c = await Client.login(a, "phone")
    await c.bootstrap()
    pg_ctl("stop", "-m", "fast")
    try:
        r = await c.req({"type": "conversations"})
        assert r["type"] == "error" and r["code"] == "UNAVAILABLE", r
        assert isinstance(r["retry_after_ms"], int) and r["retry_after_ms"] > 0, r
        try:
            urllib.request.urlopen(HTTP + "/healthz", timeout=5)
            raise AssertionError("healthz should fail while the database is down")
        except urllib.error.HTTPError as e:
            assert e.code == 503
        assert (await c.req({"type": "ping"}))["type"] == "pong"
    finally:
        pg_ctl("start")
    c.hints.clear()
    deadline = time.monotonic() + 30
    while True:
        r = await c.req({"type": "conversations"})
        if r["type"] == "conversations_result":
            break
        assert r["code"] == "UNAVAILABLE", r
        assert time.monotonic() < deadline, "gateway did not recover"
        await asyncio.sleep(r["retry_after_ms"] / 1000)
    assert await c.wait_hint() is not None, "no hint after LISTEN came back"
    m = await send(c, conv, "after-restart", {"ok": True})
    assert m["created"] is True
    await c.close()


TESTS = [test_scenario_2_1, test_hint_loss, test_takedown_through_sync, test_shared_log_hint, test_supersede_4008, test_revoke_4003,
         test_spoofed_ids_forbidden, test_bad_frames_isolated, test_first_frame_rules,
         test_rate_limit_4029, test_reconnect_storm_refusal, test_http_endpoints, test_db_restart]


def main():
    return run_tests(TESTS, "e2e")


if __name__ == "__main__":
    sys.exit(main())
