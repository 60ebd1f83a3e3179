"""receipts_check.py <router-dsn> <shards-dir> — receipts (contract §20)
across nodes, against `test/harness/shards.sh up 3` (the 70-shards suite
runs it as the part `receipts`).  A receipt is produced on the reader's node
and carried to the sender's node by a transfer (sharding.md "Receipts"):

  direct     sender and reader on different nodes: the sender's device gets
             a receipt private event with delivered_through_seq once the
             reader's device ACKs, and read_through_seq once the reader
             reports the read; im.set_read_receipts off through the router
             (the reader's node) hides the read state, delivery still
  group      a fanout group whose members are spread over the 3 nodes: the
             sender's receipt per message has member_count, delivered_count
             and read_count equal to message_facts through the router; a
             member with read receipts off counts as delivered, never read
  duplicate  the same carried receipt delivered again (the exact key) and an
             older one under a new key: nothing changes (no receipt event,
             the same pending state and parts)
  bad        carried receipts that fail the checks (a sender not placed on
             the node: refused at arrival; an unknown kind, counts above
             member_count, a reader the map places elsewhere: quarantined
             and nothing applied); the quarantines removed as an operator
             would, every node's reconcile empty at the end

Played arrivals (a superuser with session_replication_role = replica on the
destination, as the regress tests play an apply worker) stand for replayed
or forged rows.  Waits are bounded polls, never timed assertions."""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import psycopg2  # noqa: E402
from checklib import ShardsDir, check, connect, failures, q1_on, q_on, wait_for  # noqa: E402

if len(sys.argv) < 3:
    sys.exit("usage: receipts_check.py <router-dsn> <shards-dir>")
ROUTER_DSN, DIR = sys.argv[1], sys.argv[2]
NODES = ShardsDir(DIR).conn
router = connect(ROUTER_DSN)
nodes = {n: connect(c) for n, c in NODES.items()}


q, q1 = q_on, q1_on


BUCKETS = {r["bucket"]: r["node_name"] for r in q(router, "SELECT bucket, node_name FROM im_router.bucket")}
NAMES = sorted(set(BUCKETS.values()))


def node_of(id_):
    return BUCKETS[id_ % 64]


BASE = int(os.environ.get("IM_RECEIPTS_BASE") or random.SystemRandom().randrange(10 ** 4, 10 ** 8))
print(f"receipts_check: users from {BASE} (IM_RECEIPTS_BASE={BASE} replays)", flush=True)
_next = [BASE]


def user_on(node):
    while True:
        u = _next[0]
        _next[0] += 1
        if node_of(u) == node:
            return u


GEN = {}
APPLIED = {}


def new_device(user, device="d1"):
    q(router, "SELECT * FROM im.register_device(%s, %s)", (user, device))
    b = q(router, "SELECT * FROM im.begin_snapshot(%s, %s)", (user, device))[0]
    for p in range(b["page_count"]):
        q(router, "SELECT * FROM im.fetch_snapshot(%s, %s, %s, %s)", (user, device, b["snapshot_token"], p))
    a = q(router, "SELECT * FROM im.ack_snapshot(%s, %s, %s, %s)",
          (user, device, b["snapshot_token"], b["manifest_digest"]))[0]
    check(a["status"] == "OK", f"device {user}/{device} active", (b, a))
    GEN[(user, device)] = b["sync_generation"]
    APPLIED[(user, device)] = a["acked_sync_seq"]


def events(user, device="d1"):
    """every event the device syncs from 0 (pages followed), without ACKing"""
    out, cursor = [], None
    for _ in range(100):
        r = q(router, "SELECT * FROM im.sync_changes(%s, %s, %s, %s, 200, %s)",
              (user, device, None if cursor else GEN[(user, device)], None if cursor else 0, cursor))[0]
        out += r["events"] or []
        if not r["has_more"]:
            break
        cursor = r["next_cursor"]
    return out


def sync_ack(user, device="d1"):
    """the device syncs what is new and ACKs it (its facts: delivered)"""
    r = q(router, "SELECT * FROM im.sync_changes(%s, %s, %s, %s, 1000)",
          (user, device, GEN[(user, device)], APPLIED[(user, device)]))[0]
    check(r["status"] == "OK", f"sync of {user}/{device}", r["status"])
    a = q(router, "SELECT * FROM im.ack_sync(%s, %s, %s, %s)",
          (user, device, r["batch_token"], r["batch_high_watermark"]))[0]
    check(a["status"] == "OK", f"ack of {user}/{device}", a)
    APPLIED[(user, device)] = r["batch_high_watermark"]
    return r["events"] or []


def drain():
    q1(router, "SELECT im.run_fanout()")


def rounds():
    """producers on every node, then transfers and fanout (one round)"""
    q1(router, "SELECT im.run_receipts()")
    drain()
    q1(router, "SELECT im.run_receipts()")
    drain()


def receipts(user, conv):
    return [e for e in events(user) if e.get("kind") == "receipt" and e.get("conversation_id") == conv]


def newest_receipt_where(what, user, conv, pred, timeout=60):
    got = []

    def ok():
        rounds()
        got[:] = receipts(user, conv)
        return bool(got) and pred(got)
    check(wait_for(ok, timeout, step=0.3), what, json.dumps(got)[-800:])
    return got


def play(node, transfer_id, source, conv, msg_seq, receipt):
    """a carried receipt arriving at node as from source (a played apply
    worker): returns the error's SQLSTATE, None when taken in"""
    c = nodes[node]
    try:
        with c.cursor() as cur:
            cur.execute("SET session_replication_role = replica")
            cur.execute("INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id,"
                        " msg_seq, source_event_id, payload) VALUES (%s, %s, %s, 0, %s, %s, 0, %s)",
                        (transfer_id, source, node, conv, msg_seq, json.dumps({"receipt": receipt})))
            cur.execute("RESET session_replication_role")
        return None
    except psycopg2.Error as e:
        with c.cursor() as cur:
            cur.execute("RESET session_replication_role")
        return e.pgcode


def transfer_in(node, source, tid):
    r = q(nodes[node], "SELECT state, duplicates, last_error FROM im.transfer_in WHERE source_node = %s"
                       " AND transfer_id = %s", (source, tid))
    return r[0] if r else None


def pending_row(node, sender, conv):
    r = q(nodes[node], "SELECT delivered_through_seq, read_through_seq, read_hidden FROM im.receipt_pending"
                       " WHERE user_id = %s AND conversation_id = %s", (sender, conv))
    return dict(r[0]) if r else None


n1, n2, n3 = NAMES[0], NAMES[1], NAMES[2]

# ------------------------------------------------------------------ direct
sender, reader = user_on(n1), user_on(n2)
for u in (sender, reader):
    new_device(u)
direct = q1(router, "SELECT im.direct_conversation(%s, %s)", (sender, reader))
print(f"direct: sender {sender} on {n1}, reader {reader} on {n2}, conversation on {node_of(direct)}", flush=True)
m = q(router, "SELECT * FROM im.send_message(%s, %s, 'r1', '{\"text\":\"hi\"}')", (sender, direct))[0]
seq = m["msg_seq"]
drain()
check(any(e.get("message_id") == m["message_id"] for e in sync_ack(reader)),
      "direct: the reader's device syncs and ACKs the message")
newest_receipt_where("direct: the sender's device gets delivered_through_seq from the reader's node",
                     sender, direct, lambda r: r[-1]["delivered_through_seq"] >= seq)
last = (receipts(sender, direct) or [{}])[-1]
check(last.get("read_through_seq", -1) in (0, None), "direct: not read yet", last)
q(router, "SELECT * FROM im.report_read(%s, %s, %s)", (reader, direct, seq))
newest_receipt_where("direct: read_through_seq after the reader's read report", sender, direct,
                     lambda r: (r[-1]["read_through_seq"] or 0) >= seq and r[-1]["delivered_through_seq"] >= seq)
check(pending_row(n1, sender, direct) is not None and pending_row(n1, sender, direct)["delivered_through_seq"] >= seq,
      "direct: the sender's node holds the carried state", pending_row(n1, sender, direct))

# read receipts off through the router: delivery still, no read state
check(q(router, "SELECT * FROM im.set_read_receipts(%s, false)", (reader,)) == [{"read_receipts": False}],
      "set_read_receipts through the router answers the setting")
check(q1(nodes[n2], "SELECT read_receipts FROM im.receipt_setting WHERE user_id = %s", (reader,)) is False,
      "set_read_receipts ran on the reader's node")
m2 = q(router, "SELECT * FROM im.send_message(%s, %s, 'r2', '{\"text\":\"again\"}')", (sender, direct))[0]
drain()
sync_ack(reader)
q(router, "SELECT * FROM im.report_read(%s, %s, %s)", (reader, direct, m2["msg_seq"]))
newest_receipt_where("direct, read receipts off: delivered moves, read_through_seq is null", sender, direct,
                     lambda r: r[-1]["delivered_through_seq"] >= m2["msg_seq"] and r[-1]["read_through_seq"] is None)
q(router, "SELECT * FROM im.set_read_receipts(%s, true)", (reader,))

# ------------------------------------------------------------------- group
gs = user_on(n1)
members = [user_on(n1), user_on(n2), user_on(n2), user_on(n3), user_on(n3)]
off = members[3]            # on n3, read receipts off
for u in [gs] + members:
    new_device(u)
group = q1(router, "SELECT im.create_conversation('group', %s, %s)", ([gs] + members, gs))
print(f"group {group} on {node_of(group)}: sender {gs} on {n1}, members "
      f"{[(u, node_of(u)) for u in members]}", flush=True)
q(router, "SELECT * FROM im.set_read_receipts(%s, false)", (off,))
gm = q(router, "SELECT * FROM im.send_message(%s, %s, 'g1', '{\"text\":\"all\"}')", (gs, group))[0]
gm2 = q(router, "SELECT * FROM im.send_message(%s, %s, 'g2', '{\"text\":\"two\"}')", (gs, group))[0]
drain()
# delivered: members[0] (n1), members[1] (n2), members[3] (n3, off); read: members[1], members[3]
for u in (members[0], members[1], members[3]):
    sync_ack(u)
for u in (members[1], members[3]):
    q(router, "SELECT * FROM im.report_read(%s, %s, %s)", (u, group, gm["msg_seq"]))


def facts(mid=None):
    rows = q(router, "SELECT * FROM im.message_facts(%s, %s)", (gs, mid or gm["message_id"]))
    setting_off = {off}
    return (len(rows), sum(1 for r in rows if r["any_device_synced"]),
            sum(1 for r in rows if r["user_read"] and r["user_id"] not in setting_off))


want = facts()
check(want == (5, 3, 1), "group: message_facts through the router (5 members, 3 delivered, 1 read that counts)",
      want)


def counts_are(expect, expect2=None):
    """the newest receipt of gm (and of gm2) has these (members, delivered, read)"""
    def newest(r, mid):
        mine = [e for e in r if e.get("message_id") == mid]
        return (mine[-1]["member_count"], mine[-1]["delivered_count"], mine[-1]["read_count"]) if mine else None

    def pred(r):
        return newest(r, gm["message_id"]) == expect and (
            expect2 is None or newest(r, gm2["message_id"]) == expect2)
    return pred


want_2 = facts(gm2["message_id"])
check(want_2 == (5, 3, 0), "group: the second message delivered to the same three, read by none", want_2)
rs = newest_receipt_where("group: the sender's receipts of both messages sum the nodes' parts to "
                          "message_facts' counts", gs, group, counts_are(want, want_2))
check(q1(nodes[n1], "SELECT count(DISTINCT node_name) FROM im.receipt_part WHERE message_id = %s",
         (gm["message_id"],)) == 2, "group: the sender's node holds one part from each other node")
# the rest deliver and read: still equal to message_facts
for u in (members[2], members[4]):
    sync_ack(u)
    q(router, "SELECT * FROM im.report_read(%s, %s, %s)", (u, group, gm["msg_seq"]))
q(router, "SELECT * FROM im.report_read(%s, %s, %s)", (members[0], group, gm["msg_seq"]))
want2 = facts()
check(want2 == (5, 5, 4), "group: message_facts after every member read (the one with receipts off not counted)",
      want2)
want2_2 = facts(gm2["message_id"])
check(want2_2 == (5, 5, 0), "group: the second message delivered to all, read by none", want2_2)
newest_receipt_where("group: the sender's receipts follow message_facts again", gs, group,
                     counts_are(want2, want2_2))

# --------------------------------------------------------------- duplicates
drain()
rounds()
before_direct = (len(receipts(sender, direct)), pending_row(n1, sender, direct))
before_group = (len(receipts(gs, group)),
                q(nodes[n1], "SELECT node_name, delivered_count, read_count, member_count FROM im.receipt_part"
                             " WHERE message_id = %s ORDER BY node_name", (gm["message_id"],)))
TID = 9 * 10 ** 12 + random.SystemRandom().randrange(10 ** 9)
older = {"kind": "direct", "sender_id": sender, "reader_id": reader, "delivered_through_seq": seq,
         "read_through_seq": seq}
same_part = [{"message_id": gm["message_id"], "delivered_count": r["delivered_count"],
              "read_count": r["read_count"], "member_count": r["member_count"]}
             for r in before_group[1] if r["node_name"] == n2]
check(len(same_part) == 1, "duplicate: the part of node2 is there", before_group[1])
play_rc = [play(n1, TID, n2, direct, seq, older), play(n1, TID, n2, direct, seq, older),
           play(n1, TID + 1, n2, group, gm["msg_seq"],
                {"kind": "group", "sender_id": gs, "parts": same_part}),
           play(n1, TID + 1, n2, group, gm["msg_seq"],
                {"kind": "group", "sender_id": gs, "parts": same_part})]
check(play_rc == [None] * 4, "duplicate: the replayed receipts are taken in", play_rc)
rounds()
rounds()
t0, t1 = transfer_in(n1, n2, TID), transfer_in(n1, n2, TID + 1)
check(t0 and t0["state"] == "applied" and t0["duplicates"] == 1, "duplicate: the exact key counted once more, "
      "applied once", t0)
check(t1 and t1["state"] == "applied" and t1["duplicates"] == 1, "duplicate: the group part's key too", t1)
check((len(receipts(sender, direct)), pending_row(n1, sender, direct)) == before_direct,
      "duplicate: an older direct receipt under a new key changes nothing (GREATEST)",
      (before_direct, pending_row(n1, sender, direct)))
after_group = (len(receipts(gs, group)),
               q(nodes[n1], "SELECT node_name, delivered_count, read_count, member_count FROM im.receipt_part"
                            " WHERE message_id = %s ORDER BY node_name", (gm["message_id"],)))
check(after_group == before_group, "duplicate: the same part again changes nothing, no new receipt",
      (before_group, after_group))

# -------------------------------------------------------------------- bad input
other_s, other_r = user_on(n1), user_on(n3)
bad_conv = q1(router, "SELECT im.direct_conversation(%s, %s)", (other_s, other_r))
q(router, "SELECT * FROM im.send_message(%s, %s, 'b1', '{\"text\":\"x\"}')", (other_s, bad_conv))
drain()
bad_group = q1(router, "SELECT im.create_conversation('group', %s, %s)", ([other_s, other_r], other_s))
bm = q(router, "SELECT * FROM im.send_message(%s, %s, 'b2', '{\"text\":\"y\"}')", (other_s, bad_group))[0]
drain()
refused = play(n1, TID + 10, n3, bad_conv, 1, {"kind": "direct", "sender_id": other_r, "reader_id": other_s,
                                              "delivered_through_seq": 1, "read_through_seq": 1})
check(refused == "42501" and transfer_in(n1, n3, TID + 10) is None,
      "bad: a receipt for a sender placed elsewhere is refused at arrival", refused)
cases = {
    TID + 11: (bad_conv, {"kind": "someday", "sender_id": other_s}, "22023"),
    TID + 12: (bad_conv, {"kind": "direct", "sender_id": other_s, "reader_id": other_r,
                          "delivered_through_seq": -1, "read_through_seq": 1}, "22023"),
    TID + 13: (bad_conv, {"kind": "direct", "sender_id": other_s, "reader_id": other_r,
                          "delivered_through_seq": 1, "read_through_seq": 1}, "42501"),   # from n2: not the reader's node
    TID + 14: (bad_group, {"kind": "group", "sender_id": other_s,
                           "parts": [{"message_id": bm["message_id"], "delivered_count": 3, "read_count": 0,
                                      "member_count": 1}]}, "22023"),
    TID + 15: (bad_group, {"kind": "group", "sender_id": other_s, "parts": []}, "22023"),
    TID + 16: (bad_conv, {"kind": "group", "sender_id": other_s,
                          "parts": [{"message_id": bm["message_id"], "delivered_count": 0, "read_count": 0,
                                     "member_count": 1}]}, "42501"),
}
for tid, (conv, rc, _) in cases.items():
    check(play(n1, tid, n2, conv, 1, rc) is None, f"bad: receipt {tid - TID} taken in for its apply")
rounds()
for tid, (conv, rc, code) in cases.items():
    t = transfer_in(n1, n2, tid)
    # quarantined, or dead once its attempts ran out (the nodes' settings)
    check(t is not None and t["state"] in ("quarantined", "dead") and (t["last_error"] or "").startswith(code + ":"),
          f"bad: receipt {tid - TID} ({json.dumps(rc)[:80]}) failed with {code}, applied nothing", t)
# nobody on n3 ACKed in bad_conv, and n2 holds no member of either: any
# state from them would be the bad receipts'
check(pending_row(n1, other_s, bad_conv) is None
      and q1(nodes[n1], "SELECT count(*) FROM im.receipt_part WHERE sender_id = %s AND node_name = %s",
             (other_s, n2)) == 0
      and q1(nodes[n3], "SELECT count(*) FROM im.receipt_pending WHERE user_id = %s", (other_r,)) == 0,
      "bad: nothing of the refused or quarantined receipts was applied")
# the operator's clean-up: the played quarantines and the refusal go
q(nodes[n1], "DELETE FROM im.transfer_in WHERE source_node = %s AND transfer_id BETWEEN %s AND %s",
  (n2, TID + 11, TID + 16))
q(nodes[n1], "DELETE FROM im.transfer_ack WHERE transfer_id BETWEEN %s AND %s", (TID, TID + 16))
q(nodes[n1], "DELETE FROM im.transfer_refused WHERE transfer_id = %s", (TID + 10,))
drain()
rows = []
check(wait_for(lambda: not rows.__setitem__(slice(None), q(router, "SELECT * FROM im.reconcile()")) and not rows,
               60, step=0.5), "reconcile() is empty at the end", str(rows)[:800])

print(f"receipts_check: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
