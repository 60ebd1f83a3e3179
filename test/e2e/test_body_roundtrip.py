#!/usr/bin/env python3
"""Body round trip: message bodies travel through the gateway unchanged.

Property test: random JSON bodies (nesting up to the frame limit, unicode
with astral characters and escapes, large/small/precise numbers, exponents,
-0, empty containers, long strings) are sent through the gateway as raw
frame text; each is either refused at send with INVALID_ARGUMENT or
BAD_FRAME, or comes back from fetch_messages and from sync as an equal JSON
value (numbers equal as decimals, objects as dicts: jsonb orders keys).
Edits travel the same way.  The reproduced case {"n":1e19} never makes
`messages` or `events` a string.  \\u0000 in a body is INVALID_ARGUMENT; in a
text field it is refused at the gateway.

IM_BODY_SEED fixes the seed (printed either way), IM_BODY_COUNT the number
of bodies (default 300).
"""
import asyncio
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, Client, new_user_ids, register, sql  # noqa: E402
from rawjson import loads, raw_req, same  # noqa: E402

MAX_FRAME = int(os.environ.get("IM_E2E_MAX_FRAME", "65536"))
MAX_DEPTH = 31          # the frame object is level 1 of the 32 allowed
REFUSED = ("INVALID_ARGUMENT", "BAD_FRAME")

ASTRAL = ["\U0001F600", "\U0001F9D1\u200D\U0001F4BB", "\U00010348", "\U0010FFFF", "\U0001D11E"]
BMP = ["é", "ß", "中文", "Ω", "\u2028", "\u2029", "\ufeff", "\uffff", "ا", "\u0301"]
ESC = ["\n", "\t", "\r", "\b", "\f", "\"", "\\", "/", "\x01", "\x1f", "\x7f"]


def rand_string(rng):
    n = rng.choice([0, 1, 3, 8, 20, 200, 2000])
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.55:
            out.append(chr(rng.randint(0x20, 0x7e)))
        elif r < 0.7:
            out.append(rng.choice(BMP))
        elif r < 0.85:
            out.append(rng.choice(ASTRAL))
        else:
            out.append(rng.choice(ESC))
    return "".join(out)


def enc_string(rng, s):
    """A JSON string literal, in one of several legal spellings."""
    r = rng.random()
    if r < 0.4:
        return json.dumps(s, ensure_ascii=False)
    if r < 0.8:
        return json.dumps(s, ensure_ascii=True)          # \\uXXXX, surrogate pairs
    # escape '/' too, and some letters as \\u escapes
    out = []
    for ch in s:
        if ch.isascii() and ch.isalpha() and rng.random() < 0.3:
            out.append("\\u%04x" % ord(ch))
        elif ch == "/":
            out.append("\\/")
        else:
            out.append(json.dumps(ch, ensure_ascii=rng.random() < 0.5)[1:-1])
    return '"' + "".join(out) + '"'


def rand_number(rng):
    """Number text as a client could write it."""
    r = rng.random()
    if r < 0.2:
        return str(rng.randint(-1000, 1000))
    if r < 0.3:
        return str(rng.choice([2**53 - 1, -(2**53 - 1), 2**53, 2**53 + 1, 2**62, -2**63, 2**63 - 1]))
    if r < 0.35:
        return rng.choice(["-0", "-0.0", "0.0", "0e0", "-0E-0", "0.000"])
    if r < 0.5:
        return repr(rng.uniform(-1e6, 1e6))
    if r < 0.6:
        return rng.choice(["0.1", "0.2", "0.3", "1.1", "2.675", "1.005", "0.30000000000000004",
                           "3.141592653589793", "2.718281828459045"])
    if r < 0.7:
        m = rng.choice(["1", "1.5", "-2", "9.999", "123456789", "4.9", "2.2250738585072014"])
        e = rng.choice(["e19", "E+19", "e-5", "e308", "e-308", "e-320", "E100", "e-7", "e0", "e+0", "e2"])
        return m + e
    if r < 0.8:
        # precise decimals: more digits than a double holds
        d = "".join(rng.choice("0123456789") for _ in range(rng.randint(17, 40)))
        return rng.choice(["", "-"]) + "0." + d
    if r < 0.9:
        return "%de%d" % (rng.randint(1, 9), rng.randint(-30, 30))
    return repr(rng.choice([1e19, 1e-10, 5e-324, 1.7976931348623157e308, 123.456, -1e21]))


def rand_value(rng, depth, budget):
    """(text) of a random JSON value at most depth levels deep."""
    r = rng.random()
    if depth > 0 and r < 0.35:
        return rand_container(rng, depth, budget)
    if r < 0.55:
        return enc_string(rng, rand_string(rng))
    if r < 0.85:
        return rand_number(rng)
    return rng.choice(["true", "false", "null"])


def rand_container(rng, depth, budget, force_object=False):
    n = rng.choice([0, 0, 1, 2, 3, 5, 8]) if budget[0] > 0 else 0
    budget[0] -= n
    ws = rng.choice(["", "", " ", "\n  "])
    if force_object or rng.random() < 0.5:
        keys = set()
        parts = []
        for _ in range(n):
            k = rand_string(rng)[:12]
            if k in keys:
                continue
            keys.add(k)
            parts.append(enc_string(rng, k) + ws + ":" + ws + rand_value(rng, depth - 1, budget))
        return "{" + ws + ("," + ws).join(parts) + ws + "}"
    return "[" + ws + ("," + ws).join(rand_value(rng, depth - 1, budget) for _ in range(n)) + ws + "]"


def deep_body(rng, depth):
    """A chain of exactly depth containers (the body object included)."""
    text = rand_value(rng, 0, [0])
    for i in range(depth - 1):
        text = ("[%s]" % text) if rng.random() < 0.5 else ('{"k%d":%s}' % (i, text))
    return '{"deep":%s}' % text


def bodies(rng, count):
    fixed = ['{"n":1e19}', '{"n":10000000000000000000}', '{"n":-0}', '{"n":0.1}', '{}',
             '{"a":[],"b":{},"c":[[]],"d":[{}]}', '{"n":1E+400}', '{"n":1e-400}',
             '{"s":"\\ud83d\\ude00 \\u00e9 \\\\ \\" \\/"}', '{"n":123456789012345678901234567890}',
             '{"n":2.5e-320}', '{"n":9007199254740993}', '{"long":"%s"}' % ("x" * 30000),
             deep_body(rng, MAX_DEPTH), deep_body(rng, MAX_DEPTH + 1)]
    out = list(fixed)
    while len(out) < count:
        if rng.random() < 0.1:
            out.append(deep_body(rng, rng.randint(2, MAX_DEPTH)))
        else:
            out.append(rand_container(rng, rng.randint(1, 6), [rng.randint(1, 40)], force_object=True))
    return out


async def send_body(c, conv, cmid, text):
    return await raw_req(c, {"type": "send", "conversation_id": conv, "client_msg_id": cmid}, '"body":' + text)


async def fetch_all(c, conv):
    """message_id -> event, from fetch_messages pages."""
    got, after = {}, 0
    for _ in range(1000):
        r = await raw_req(c, {"type": "fetch_messages", "conversation_id": conv, "after_seq": after, "limit": 50})
        assert r["type"] == "fetch_messages_result", r
        assert isinstance(r["messages"], list), "messages is not an array: %.300r" % (r,)
        for e in r["messages"]:
            got[int(e["message_id"])] = e
        if not r["has_more"]:
            return got
        after = int(r["next_after_seq"])
    raise AssertionError("fetch_messages did not end")


async def sync_until(c, conv, want_ids, timeout=90):
    """Sync pages (ACKing each batch) until every id in want_ids was seen in
    events; returns message_id -> latest body seen (edits applied)."""
    gen, applied = c.gen, c.applied
    bodies_seen = {}
    deadline = time.monotonic() + timeout
    while True:
        r = await raw_req(c, {"type": "sync", "sync_generation": gen, "local_applied_sync_seq": applied,
                              "limit": 100})
        assert r["type"] == "sync_result" and r["status"] in ("OK", "RECOVERY"), r
        page = r
        while True:
            assert isinstance(page["events"], list), "events is not an array: %.300r" % (page,)
            for e in page["events"]:
                if e.get("conversation_id") != conv:
                    continue
                if e["kind"] == "message":
                    bodies_seen[int(e["message_id"])] = e["body"]
                elif e["kind"] == "edit" and int(e["target_message_id"]) in bodies_seen:
                    bodies_seen[int(e["target_message_id"])] = e["body"]
            if not page["has_more"]:
                break
            page = await raw_req(c, {"type": "sync", "cursor": page["next_cursor"], "limit": 100})
        a = await raw_req(c, {"type": "ack", "batch_token": r["batch_token"],
                              "acked_sync_seq": int(r["batch_high_watermark"])})
        assert a["type"] == "ack_result", a
        gen, applied = int(r["sync_generation"]), int(r["batch_high_watermark"])
        if want_ids <= bodies_seen.keys():
            return bodies_seen
        assert time.monotonic() < deadline, "sync never delivered %d messages" % len(want_ids - bodies_seen.keys())
        await asyncio.sleep(0.3)


async def test_body_roundtrip():
    seed = int(os.environ.get("IM_BODY_SEED") or random.randrange(1 << 30))
    count = int(os.environ.get("IM_BODY_COUNT", "300"))
    print("body round trip: seed %d (IM_BODY_SEED=%d to repeat), %d bodies" % (seed, seed, count), flush=True)
    rng = random.Random(seed)
    a, b = new_user_ids(2)
    register(a, "phone")
    register(b, "desktop")
    conv = sql("SELECT im.direct_conversation(%s, %s)", a, b)[0][0]
    ca = await Client.login(a, "phone")
    cb = await Client.login(b, "desktop")
    await cb.bootstrap()

    sent = {}           # message_id -> body text
    refused = {}
    for i, text in enumerate(bodies(rng, count)):
        assert text.startswith("{")
        if len(text) > MAX_FRAME - 200:
            continue
        if os.environ.get("IM_BODY_DEBUG"):
            print(i, len(text), text[:150], flush=True)
        r = await send_body(ca, conv, "b%d" % i, text)
        if r["type"] == "send_result":
            sent[int(r["message_id"])] = text
        else:
            assert r["type"] == "error" and r["code"] in REFUSED, (text[:200], r)
            refused[r["code"]] = refused.get(r["code"], 0) + 1
            if os.environ.get("IM_BODY_DEBUG"):
                print("refused", r, text[:200], flush=True)
        if i < 15 and text.startswith('{"n":1e19}'):
            print("  {\"n\":1e19}: %s" % (r.get("code") or "accepted"), flush=True)
    # edits: a new random body for some messages, through the same path
    edited = {}
    for i, mid in enumerate(rng.sample(sorted(sent), min(20, len(sent)))):
        text = rand_container(rng, rng.randint(1, 5), [rng.randint(1, 20)], force_object=True)
        r = await raw_req(ca, {"type": "edit", "conversation_id": conv, "client_msg_id": "e%d" % i,
                               "target_message_id": mid}, '"body":' + text)
        if r["type"] == "edit_result":
            edited[mid] = text
        else:
            assert r["type"] == "error" and r["code"] in REFUSED, (text[:200], r)
    assert len(sent) > count // 3, "too few bodies accepted (%d of %d)" % (len(sent), count)

    want = {mid: loads(edited.get(mid, text)) for mid, text in sent.items()}
    got = await fetch_all(ca, conv)
    for mid, body in want.items():
        assert mid in got, "message %d missing from fetch_messages" % mid
        assert same(got[mid]["body"], body), "fetch_messages changed a body:\n sent %s\n got  %r" % (
            edited.get(mid, sent[mid])[:300], got[mid]["body"])
    seen = await sync_until(cb, conv, set(want))
    for mid, body in want.items():
        assert same(seen[mid], body), "sync changed a body:\n sent %s\n got  %r" % (
            edited.get(mid, sent[mid])[:300], seen[mid])
    print("  %d accepted (%d edited) and equal in fetch_messages and sync; refused %r" % (
        len(sent), len(edited), refused), flush=True)

    # \\u0000: in a body PostgreSQL refuses it (22P05); in a text field the
    # gateway does (libpq parameters are C strings)
    r = await send_body(ca, conv, "nul-body", '{"t":"a\\u0000b"}')
    assert r["type"] == "error" and r["code"] == "INVALID_ARGUMENT", r
    r = await raw_req(ca, {"type": "send", "conversation_id": conv}, '"client_msg_id":"n\\u0000ul","body":{}')
    assert r["type"] == "error" and r["code"] == "INVALID_ARGUMENT", r
    r = await raw_req(ca, {"type": "sync", "sync_generation": 1, "local_applied_sync_seq": 0},
                      '"cursor":"c\\u0000"')
    assert r["type"] == "error" and r["code"] == "INVALID_ARGUMENT", r
    r = await raw_req(ca, {}, '"type":"ping\\u0000x"')
    assert r["type"] == "error" and r["code"] == "BAD_FRAME", r
    # the session goes on, and the conversation still reads as arrays
    got = await fetch_all(ca, conv)
    assert len(got) >= len(sent)
    await ca.close()
    await cb.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_body_roundtrip], "test_body_roundtrip", timeout=600))
