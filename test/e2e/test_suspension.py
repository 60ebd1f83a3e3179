#!/usr/bin/env python3
"""Account suspension through two gateways (contract §17).

A user with two devices, each with a live session on a different gateway
(IM_GW_URL and IM_GW_URL2, both on the same database): suspend_user closes
both with 4005 within 5 s (the time is measured and printed); a hello with
a token issued before the suspension is answered FORBIDDEN with
"reason":"suspended" and closed 4005; a spoofed SUSPENDED for a user in
good standing closes nothing (the gateway believes device_session only);
after reinstate_user the same token signs in again.
"""
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, Client, new_user_ids, register, sql, token  # noqa: E402

URL1 = os.environ.get("IM_GW_URL", "ws://127.0.0.1:8080/")
URL2 = os.environ.get("IM_GW_URL2", URL1)
LIMIT_S = 5.0


async def test_suspension_closes_sessions_on_two_gateways():
    a, b = new_user_ids(2)
    register(a, "phone")
    register(a, "laptop")
    register(b, "phone")
    c1 = await Client.login(a, "phone", url=URL1)
    c2 = await Client.login(a, "laptop", url=URL2)
    other = await Client.login(b, "phone", url=URL2)
    later = token(a, "phone")             # issued before the suspension
    t0 = time.monotonic()
    suspended, told = sql("SELECT * FROM im.suspend_user('e2e', %s, NULL, 'e2e test')", a)[0]
    assert suspended is True and told == 2, (suspended, told)
    (code1, _), (code2, _) = await asyncio.gather(c1.wait_closed(timeout=LIMIT_S + 5),
                                                 c2.wait_closed(timeout=LIMIT_S + 5))
    took = time.monotonic() - t0
    print("suspension closed 2 sessions on 2 gateways in %.3f s" % took, flush=True)
    assert code1 == 4005 and code2 == 4005, (code1, code2)
    assert took < LIMIT_S, took
    # the other user's session is untouched
    assert (await other.req({"type": "ping"}))["type"] == "pong"
    # authenticate now fails: FORBIDDEN / suspended, then close 4005
    for url in (URL1, URL2):
        c = await Client.open(url=url)
        r = await c.req({"type": "hello", "token": later})
        assert r["type"] == "error" and r["code"] == "FORBIDDEN" and r.get("reason") == "suspended", r
        code, _ = await c.wait_closed()
        assert code == 4005, code
    # reinstated: the same token signs in again
    assert sql("SELECT * FROM im.reinstate_user('e2e', %s)", a)[0][0] is True
    c = await Client.open(url=URL1)
    w = await c.req({"type": "hello", "token": later})
    assert w["type"] == "welcome", w
    await c.close()
    await other.close()


async def test_spoofed_suspended_closes_nothing():
    a, = new_user_ids(1)
    register(a, "phone")
    c = await Client.login(a, "phone", url=URL2)
    epoch = c.welcome["connection_epoch"]
    sql("SELECT pg_notify('im_sync_device', %s)", "%s:phone:%s:SUSPENDED" % (a, epoch))
    try:
        code, _ = await c.wait_closed(timeout=1.5)
        raise AssertionError("a spoofed SUSPENDED closed the session with %s" % code)
    except TimeoutError:
        pass
    assert (await c.req({"type": "ping"}))["type"] == "pong"
    await c.close()


async def test_forbidden_reason_suspended():
    """A call of a suspended user answered while its session is still open
    (the row written directly: no NOTIFY, so nothing closes it): FORBIDDEN
    with "reason":"suspended", for a write and a read alike."""
    a, b = new_user_ids(2)
    register(a, "phone")
    conv = sql("SELECT im.create_conversation('group', %s::bigint[], %s)", [a, b], a)[0][0]
    c = await Client.login(a, "phone", url=URL1)
    sql("INSERT INTO im.user_suspension (user_id, moderator) VALUES (%s, 'e2e-direct')", a)
    try:
        r = await c.req({"type": "send", "conversation_id": conv, "client_msg_id": "s1",
                         "body": {"text": "x"}})
        assert r["type"] == "error" and r["code"] == "FORBIDDEN" and r.get("reason") == "suspended", r
        r = await c.req({"type": "conversations"})
        assert r["type"] == "error" and r["code"] == "FORBIDDEN" and r.get("reason") == "suspended", r
    finally:
        sql("DELETE FROM im.user_suspension WHERE user_id = %s", a)
    r = await c.req({"type": "send", "conversation_id": conv, "client_msg_id": "s2", "body": {"text": "y"}})
    assert r["type"] != "error", r
    await c.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_suspension_closes_sessions_on_two_gateways,
                        test_spoofed_suspended_closes_nothing,
                        test_forbidden_reason_suspended], label="suspension"))
