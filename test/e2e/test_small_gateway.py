#!/usr/bin/env python3
"""Run against a gateway started with --statement-timeout 1000 and
--max-queue 100000 (test/suites/60-e2e.sh).

Statement timeout: a call that waits past the statement timeout (a lock that
send_message needs is held by another transaction) is answered UNAVAILABLE
with retry_after_ms and its id, and the retry works once the lock is gone.
Large replies: a reply larger than the session's queue cap is answered
UNAVAILABLE with its id; a smaller page still works."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, Client, new_user_ids, pg, register, sql  # noqa: E402


async def test_small_gateway():
    a, b = new_user_ids(2)
    register(a, "phone")
    register(b, "phone")
    conv = sql("SELECT im.direct_conversation(%s, %s)", a, b)[0][0]
    ca = await Client.login(a, "phone")

    # statement timeout: the conversation row is locked (send takes it first)
    locker = pg()
    locker.autocommit = False
    cur = locker.cursor()
    cur.execute("SELECT 1 FROM im.conversation WHERE conversation_id = %s FOR UPDATE", (conv,))
    try:
        r = await ca.req({"type": "send", "conversation_id": conv, "client_msg_id": "t1", "body": {"x": 1}})
        assert r["type"] == "error" and r["code"] == "UNAVAILABLE", r
        assert isinstance(r["retry_after_ms"], int) and r["retry_after_ms"] > 0, r
        assert "timeout" in r["message"], r
    finally:
        locker.rollback()
        locker.close()
    r = await ca.req({"type": "send", "conversation_id": conv, "client_msg_id": "t1", "body": {"x": 1}})
    assert r["type"] == "send_result" and r["created"] is True, r

    # queue cap: three 40 KB messages are a 120 KB page
    body = json.dumps({"t": "y" * 40000})
    with pg() as c, c.cursor() as cur:
        for i in range(3):
            cur.execute("SELECT * FROM im.send_message(%s, %s, %s, %s::jsonb)", (a, conv, "q%d" % i, body))
    r = await ca.req({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0, "limit": 10})
    assert r["type"] == "error" and r["code"] == "UNAVAILABLE", r.get("type")
    assert isinstance(r["retry_after_ms"], int), r
    r = await ca.req({"type": "fetch_messages", "conversation_id": conv, "after_seq": 0, "limit": 2})
    assert r["type"] == "fetch_messages_result", r.get("type")
    assert (await ca.req({"type": "ping"}))["type"] == "pong"
    await ca.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_small_gateway], "test_small_gateway", timeout=120))
