#!/usr/bin/env python3
"""Notification spoofing: a notification never closes a session by itself.

Any role that can connect may NOTIFY im_sync_device.  Spoofed REVOKED and
SUPERSEDED payloads (sent by a role with no privileges at all) leave the
session open; the gateway re-checks with im.device_session first.  A real
revoke_device still closes with 4003 and a real newer hello with 4008.  A
flood of 10,000 spoofed notifications costs a bounded number of
device_session calls (gateway counter im_gateway_device_rechecks_total),
and im_sync_hint payloads only ever cause hints.
"""
import asyncio
import os
import sys
import time

import psycopg2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imgw import run_tests, DB, Client, new_user_ids, register, sql  # noqa: E402
from gwmetrics import metric  # noqa: E402

FLOOD = 10000
MAX_RECHECKS_FOR_FLOOD = 200   # measured 2-12; without coalescing it would be 10,000


def stranger():
    """A connection as a role without any grant (NOTIFY needs none)."""
    sql("DO $$BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'im_e2e_stranger') "
        "THEN CREATE ROLE im_e2e_stranger LOGIN; END IF; END$$")
    try:
        c = psycopg2.connect(dbname=DB, user="im_e2e_stranger")
    except psycopg2.OperationalError:
        c = psycopg2.connect(dbname=DB)      # pg_hba refuses the role: same NOTIFY, another role
    c.autocommit = True
    return c


def notify(conn, payloads, channel="im_sync_device"):
    with conn.cursor() as cur:
        cur.execute("SELECT pg_notify(%s, p) FROM unnest(%s::text[]) p", (channel, list(payloads)))


async def wait_metric(name, at_least, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        v = metric(name)
        if v >= at_least:
            return v
        assert time.monotonic() < deadline, "%s stayed at %s (< %s)" % (name, v, at_least)
        await asyncio.sleep(0.1)


async def still_open(c, what):
    """The session answers and is not being closed (any close would follow
    the re-check, which the caller waited for)."""
    try:
        code, _ = await c.wait_closed(timeout=1.5)
        raise AssertionError("%s closed the session with %s" % (what, code))
    except TimeoutError:
        pass
    r = await c.req({"type": "ping"})
    assert r["type"] == "pong", r


async def test_notify_spoof():
    (u,) = new_user_ids(1)
    register(u, "phone")
    c = await Client.login(u, "phone")
    epoch = c.welcome["connection_epoch"]
    conn = stranger()

    for payload in ("%d:phone:%d:REVOKED" % (u, epoch), "%d:phone:%d:SUPERSEDED" % (u, epoch + 5),
                    "%d:phone:%d:REVOKED" % (u, epoch + 1000)):
        before = metric("im_gateway_device_rechecks_total")
        notify(conn, [payload])
        await still_open(c, "spoofed %s" % payload.rsplit(":", 1)[1])
        await wait_metric("im_gateway_device_rechecks_total", before + 1)
        await still_open(c, "spoofed %s after its re-check" % payload.rsplit(":", 1)[1])
    # hint payloads naming the user: only hints, never a close
    notify(conn, ["%d:999999" % u, "c1:5", "garbage"], channel="im_sync_hint")
    await still_open(c, "a spoofed hint")

    # a flood: distinct payloads (NOTIFY folds duplicates within a transaction)
    n0 = metric("im_gateway_notifications_total")
    r0 = metric("im_gateway_device_rechecks_total")
    notify(conn, ["%d:phone:%d:%s" % (u, epoch + 1 + i, "REVOKED" if i % 2 else "SUPERSEDED")
                  for i in range(FLOOD)])
    await wait_metric("im_gateway_notifications_total", n0 + FLOOD, timeout=60)
    await still_open(c, "a flood of spoofed notifications")
    rechecks = metric("im_gateway_device_rechecks_total") - r0
    print("  %d spoofed notifications -> %d device_session re-checks" % (FLOOD, rechecks), flush=True)
    assert 1 <= rechecks <= MAX_RECHECKS_FOR_FLOOD, rechecks

    # the real thing still closes: a newer hello of the same device -> 4008
    newer = await Client.login(u, "phone")
    code, _ = await c.wait_closed()
    assert code == 4008, code
    # and a real revocation -> 4003
    sql("SELECT im.revoke_device(%s, 'phone')", u)
    code, _ = await newer.wait_closed()
    assert code == 4003, code
    conn.close()


if __name__ == "__main__":
    sys.exit(run_tests([test_notify_spoof], "test_notify_spoof", timeout=300))
