"""deletefm_check.py <router-dsn> <shards-dir> — delete_for_me through the
router when the user and the conversation are on different nodes, against
`test/harness/shards.sh up 3` (the 70-shards suite runs it):

  first_contact  create_conversation of two users on different nodes,
                 send_message, then at once delete_for_me for the other
                 user (its node has no copy of the conversation yet): the
                 call succeeds; after run_fanout the user's devices get the
                 delete_for_me event and never the message, unread is 0,
                 fetch_messages hides it, reconcile() is empty; a second
                 call returns false and writes nothing
  early          the message's own item held back on the conversation's
                 node (next_attempt_at in the future) while the deletion's
                 hand-off goes first: the user's node records the deletion
                 before the message arrives, then the message arrives
                 hidden; the devices' view and unread as above
  unpaired       the state the 1.0 router left when its second call failed
                 (the deletion on the conversation's node only), and the
                 converse (on the user's node only): reconcile() reports
                 delete_for_me_unpaired naming the node that lacks it;
                 delete_for_me again through the router repairs both

Waits are bounded polls (never timed assertions)."""
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import psycopg2  # noqa: E402
from checklib import ShardsDir, check, connect, failures, q1_on, q_on  # noqa: E402

if len(sys.argv) < 3:
    sys.exit("usage: deletefm_check.py <router-dsn> <shards-dir>")
ROUTER_DSN, DIR = sys.argv[1], sys.argv[2]
NODES = ShardsDir(DIR).conn
router = connect(ROUTER_DSN)
nodes = {n: connect(c) for n, c in NODES.items()}


q, q1 = q_on, q1_on


BUCKETS = {r["bucket"]: r["node_name"] for r in q(router, "SELECT bucket, node_name FROM im_router.bucket")}


def node_of(id_):
    return BUCKETS[id_ % 64]


def pair_node(a, b):
    return BUCKETS[(a + b) % 64]


# fresh users on every run (a re-run on the same nodes starts clean)
BASE = int(os.environ.get("IM_DELETEFM_BASE") or random.SystemRandom().randrange(10 ** 4, 10 ** 8))
print(f"deletefm_check: users from {BASE} (IM_DELETEFM_BASE={BASE} replays)", flush=True)


def pick_pair(offset):
    """Users a, b with b's node neither a's nor their direct conversation's."""
    base = BASE + offset
    for a in range(base, base + 64):
        for b in range(a + 1, a + 64):
            if node_of(b) != pair_node(a, b) and node_of(a) != node_of(b):
                return a, b
    raise RuntimeError("no pair of users on different nodes")


def drain():
    q1(router, "SELECT im.run_fanout()")


def reconcile():
    return q(router, "SELECT check_name, conversation_id, user_id, detail, node_name FROM im.reconcile()")


GEN = {}


def new_device(user, device):
    """Register and activate a device of a user with nothing yet (an empty
    snapshot, acknowledged), so that it syncs its log from 0."""
    q(router, "SELECT * FROM im.register_device(%s, %s)", (user, device))
    b = q(router, "SELECT * FROM im.begin_snapshot(%s, %s)", (user, device))[0]
    for p in range(b["page_count"]):
        q(router, "SELECT * FROM im.fetch_snapshot(%s, %s, %s, %s)", (user, device, b["snapshot_token"], p))
    a = q(router, "SELECT * FROM im.ack_snapshot(%s, %s, %s, %s)",
          (user, device, b["snapshot_token"], b["manifest_digest"]))[0]
    check(a["status"] == "OK" and b["base_sync_seq"] == 0, f"device {user}/{device} active from 0", (b, a))
    GEN[(user, device)] = b["sync_generation"]


def device_events(user, device):
    """Every event the device syncs from 0 (one pass, pages followed)."""
    gen = GEN[(user, device)]
    events, cursor = [], None
    for _ in range(100):
        r = q(router, "SELECT * FROM im.sync_changes(%s, %s, %s, %s, 200, %s)",
              (user, device, None if cursor else gen, None if cursor else 0, cursor))[0]
        check(r["status"] == "OK", f"sync of {user}/{device} is OK", r["status"])
        events += r["events"] or []
        if not r["has_more"]:
            break
        cursor = r["next_cursor"]
    return events


def unread(user, conv):
    rows = [r for r in q(router, "SELECT * FROM im.conversation_list(%s)", (user,)) if r["conversation_id"] == conv]
    return rows[0]["unread_count"] if rows else None


def fetched(user, conv):
    r = q(router, "SELECT messages FROM im.fetch_messages(%s, %s, 0, 100)", (user, conv))[0]
    return [m["message_id"] for m in r["messages"] if m.get("kind") == "message"]


def deleted_view_ok(what, b, conv, mid, kept):
    ev = device_events(b, "d1")
    dels = [e for e in ev if e.get("kind") == "delete_for_me" and e.get("message_id") == mid]
    shown = [e for e in ev if e.get("kind") == "message" and e.get("message_id") == mid]
    check(len(dels) == 1, f"{what}: the user's device got one delete_for_me event", json.dumps(ev)[:600])
    check(not shown, f"{what}: the user's device never shows the deleted message", json.dumps(ev)[:600])
    check(any(e.get("message_id") == kept for e in ev), f"{what}: the user's device has the other message",
          json.dumps(ev)[:600])
    check(unread(b, conv) == 1, f"{what}: unread counts only the message kept", unread(b, conv))
    f = fetched(b, conv)
    check(mid not in f and kept in f, f"{what}: fetch_messages hides the deleted message only", f)
    rows = reconcile()
    check(not rows, f"{what}: reconcile() is empty", str(rows)[:600])


def first_contact():
    a, b = pick_pair(0)
    new_device(b, "d1")
    conv = q1(router, "SELECT im.create_conversation('direct', %s)", ([a, b],))
    check(node_of(conv) != node_of(b), "first_contact: the conversation is on another node than the user")
    mid = q(router, "SELECT * FROM im.send_message(%s, %s, 'fc-1', '{\"t\": 1}')", (a, conv))[0]["message_id"]
    try:
        r = q1(router, "SELECT im.delete_for_me(%s, %s, %s)", (b, conv, mid))
        check(r is True, "first_contact: delete_for_me right after the send succeeds and returns true", r)
    except psycopg2.Error as e:
        check(False, "first_contact: delete_for_me right after the send succeeds", str(e).strip())
        return
    kept = q(router, "SELECT * FROM im.send_message(%s, %s, 'fc-2', '{\"t\": 2}')", (a, conv))[0]["message_id"]
    drain()
    deleted_view_ok("first_contact", b, conv, mid, kept)
    r = q1(router, "SELECT im.delete_for_me(%s, %s, %s)", (b, conv, mid))
    check(r is False, "first_contact: deleting again returns false", r)
    drain()
    ev = device_events(b, "d1")
    check(sum(1 for e in ev if e.get("kind") == "delete_for_me") == 1,
          "first_contact: deleting again adds no event", json.dumps(ev)[:400])


def early():
    a, b = pick_pair(200)
    new_device(b, "d1")
    conv = q1(router, "SELECT im.create_conversation('direct', %s)", ([a, b],))
    cn = nodes[node_of(conv)]
    drain()
    mid = q(router, "SELECT * FROM im.send_message(%s, %s, 'ea-1', '{\"t\": 1}')", (a, conv))[0]["message_id"]
    # the message's item waits (as after a transient failure); the hand-off does not
    q(cn, "UPDATE im.outbox SET next_attempt_at = now() + interval '1 hour' WHERE source_event_id = %s", (mid,))
    check(q1(router, "SELECT im.delete_for_me(%s, %s, %s)", (b, conv, mid)) is True,
          "early: delete_for_me while the message's item is held back")
    un = nodes[node_of(b)]
    for _ in range(200):
        q1(cn, "SELECT im.run_fanout()")
        q1(un, "SELECT im.run_fanout()")
        if q1(un, "SELECT count(*) FROM im.deleted_for_me WHERE user_id = %s AND message_id = %s", (b, mid)):
            break
    check(q1(un, "SELECT count(*) FROM im.deleted_for_me WHERE user_id = %s AND message_id = %s", (b, mid)) == 1,
          "early: the user's node recorded the deletion before the message arrived")
    check(q1(un, "SELECT count(*) FROM im.inbox WHERE user_id = %s AND source_event_id = %s", (b, mid)) == 0,
          "early: (the message is not in the user's log yet)")
    q(cn, "UPDATE im.outbox SET next_attempt_at = now() WHERE source_event_id = %s", (mid,))
    kept = q(router, "SELECT * FROM im.send_message(%s, %s, 'ea-2', '{\"t\": 2}')", (a, conv))[0]["message_id"]
    drain()
    deleted_view_ok("early", b, conv, mid, kept)


def unpaired():
    a, b = pick_pair(400)
    new_device(b, "d1")
    conv = q1(router, "SELECT im.create_conversation('direct', %s)", ([a, b],))
    m1 = q(router, "SELECT * FROM im.send_message(%s, %s, 'up-1', '{\"t\": 1}')", (a, conv))[0]["message_id"]
    m2 = q(router, "SELECT * FROM im.send_message(%s, %s, 'up-2', '{\"t\": 2}')", (a, conv))[0]["message_id"]
    drain()
    cname, uname = node_of(conv), node_of(b)
    # what the 1.0 router left: the conversation's node only
    q(nodes[cname], "INSERT INTO im.deleted_for_me (user_id, message_id) VALUES (%s, %s)", (b, m1))
    # and the converse: the user's node only (its own call, nothing handed off)
    q1(nodes[uname], "SELECT im.delete_for_me(%s, %s, %s)", (b, conv, m2))
    rows = [r for r in reconcile() if r["check_name"] == "delete_for_me_unpaired"]
    got = sorted((r["detail"]["message_id"], r["node_name"], r["user_id"], r["conversation_id"]) for r in rows)
    check(got == sorted([(m1, uname, b, conv), (m2, cname, b, conv)]),
          "unpaired: reconcile() reports each one-sided deletion on the node that lacks it", got)
    check(q1(router, "SELECT im.delete_for_me(%s, %s, %s)", (b, conv, m1)) is False,
          "unpaired: delete_for_me again hands the conversation node's deletion off (false: deleted there before)")
    check(q1(router, "SELECT im.delete_for_me(%s, %s, %s)", (b, conv, m2)) is True,
          "unpaired: delete_for_me through the router records the user node's one on the conversation node")
    drain()
    ev = device_events(b, "d1")
    for m in (m1, m2):
        check(sum(1 for e in ev if e.get("kind") == "delete_for_me" and e.get("message_id") == m) == 1,
              f"unpaired: one delete_for_me event of message {m}", json.dumps(ev)[:400])
    check(fetched(b, conv) == [], "unpaired: fetch_messages hides both", fetched(b, conv))
    check(unread(b, conv) == 0, "unpaired: unread 0", unread(b, conv))
    rows = reconcile()
    check(not rows, "unpaired: reconcile() is empty after the repair", str(rows)[:600])


for drill in (first_contact, early, unpaired):
    print(f"--- deletefm {drill.__name__}", flush=True)
    try:
        drill()
    except psycopg2.Error as e:
        check(False, f"{drill.__name__}: no unexpected error", str(e).strip()[:600])
        router = connect(ROUTER_DSN)
if failures:
    print(f"deletefm_check: {len(failures)} FAILED")
    sys.exit(1)
print("deletefm_check: all ok")
