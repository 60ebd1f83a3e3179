"""forge_check.py <shards-dir> — trust between nodes, against
`test/harness/shards.sh up 3` (the 70-shards suite runs it after transfer_check.py).

node1 plays a compromised node: its superuser writes rows into its own
im.transfer_out / im.transfer_ack (its arrival triggers disabled, its
publication changed), and logical replication carries them to node2, the
victim.  node3 owns conversation Y (node2 holds a copy), node2 owns Z, node1
owns the X conversations.  Each case fails on a node that believes the
replicated row:

  forged_source   node1 sends a transfer claiming source node3 (Y's owner):
                  refused at arrival; Y's copy on node2 unchanged
  source_self     a transfer claiming source node2 (the receiver itself)
  claimed_id      a transfer claiming node3's next (source, transfer_id):
                  the real transfer is not dropped as a duplicate
  map_owner       node1, honestly named, sends a transfer of Y (node3's
                  bucket): the local map says node1 does not own it
  forged_dest     node1's publication to node2 unfiltered, a row
                  source = node2, dest = node3: node2 never stores it as its
                  own outgoing transfer (nor does node3 take it from node1)
  forged_acker    an ack claiming node3 applied node2's transfer: node2
                  keeps the transfer; node3 still receives it
  payload_other   a transfer of node1's own X whose payload carries rows of
                  Y (a body rewrite, a head pushed forward, a membership
                  period for a node2 user): quarantined, nothing of Y changed
  payload_owned   the same with rows of Z, a conversation node2 owns
  local_insert    rows inserted on node2 itself (not by an apply worker) are
                  never taken as from another node
Refusals are logged and listed by node2's reconcile (transfer_refused); each
quarantine by transfer_quarantined.  The end: forged state cleaned up as an
operator would, every node's reconcile empty.  Waits are bounded polls."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import psycopg2  # noqa: E402
from checklib import Session, ShardsDir, check, failures, wait_for  # noqa: E402

DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("IM_SHARDS_DIR")
if not DIR:
    sys.exit("usage: forge_check.py <shards-dir>")
NODES = ShardsDir(DIR).nodes
NAMES = [n for n, _ in NODES]
CONN = dict(NODES)
A, B, C = "node1", "node2", "node3"     # attacker, victim, third node


def node_of(id_):
    return NAMES[(id_ % 64) % len(NAMES)]


node = {n: Session(CONN[n]) for n in NAMES}


def pending_all():
    return [tuple(node[n].q("SELECT * FROM im.shard_pending()")[0]) for n in NAMES]


def forget_forged():
    """what node1 forged stays in its own transfer_out, never acknowledged
    (refused, or its quarantine deleted on node2): its operator's mess"""
    node[A].q("DELETE FROM im.transfer_out WHERE transfer_id > 9000000000 OR source_node <> 'node1'")


def drain(timeout=120):
    forget_forged()

    def done():
        for n in NAMES:
            node[n].q("SELECT im.run_fanout()")
        return all(p == (0, 0, 0) for p in pending_all())
    return wait_for(done, timeout, step=0.2)


def has_refused_table(n):
    return node[n].q1("SELECT to_regclass('im.transfer_refused') IS NOT NULL")


def refused(n, kind, transfer_id):
    """reasons node n recorded for a refused row (none before the fix: no table)"""
    if not has_refused_table(n):
        return []
    return [r[0] for r in node[n].q("SELECT reason FROM im.transfer_refused WHERE kind = %s AND transfer_id = %s",
                                    (kind, transfer_id))]


def in_state(n, source, tid):
    return node[n].q1("SELECT state FROM im.transfer_in WHERE source_node = %s AND transfer_id = %s", (source, tid))


def arrived(n, source, tid, kind="transfer"):
    """n took the row in (recorded under any source) or refused it"""
    return wait_for(lambda: node[n].q1("SELECT count(*) FROM im.transfer_in WHERE transfer_id = %s", (tid,)) > 0
                    or refused(n, kind, tid), 30, step=0.2)


def forge_out(row, trigger_off=True):
    """node1 writes a transfer_out row as it likes (its own arrival trigger off)"""
    cols = ["transfer_id", "source_node", "dest_node", "outbox_id", "conversation_id", "msg_seq",
            "source_event_id", "payload"]
    sql = ("INSERT INTO im.transfer_out (%s) VALUES (%s)" % (", ".join(cols), ", ".join(["%s"] * len(cols))))
    vals = [json.dumps(row[c]) if c == "payload" else row[c] for c in cols]
    cur = node[A].db.cursor()
    if trigger_off:
        cur.execute("BEGIN")
        cur.execute("ALTER TABLE im.transfer_out DISABLE TRIGGER transfer_out_arrive")
        cur.execute(sql, vals)
        cur.execute("ALTER TABLE im.transfer_out ENABLE ALWAYS TRIGGER transfer_out_arrive")
        cur.execute("COMMIT")
    else:
        cur.execute(sql, vals)


def forge_ack(source, tid, applied_by):
    cur = node[A].db.cursor()
    cur.execute("BEGIN")
    cur.execute("ALTER TABLE im.transfer_ack DISABLE TRIGGER transfer_ack_arrive")
    cur.execute("INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by) VALUES (%s, %s, %s)",
                (source, tid, applied_by))
    cur.execute("ALTER TABLE im.transfer_ack ENABLE ALWAYS TRIGGER transfer_ack_arrive")
    cur.execute("COMMIT")


def users_on(n, k, start=6000):
    out, u = [], start
    while len(out) < k:
        if node_of(u) == n:
            out.append(u)
        u += 1
    return out


def create(n, members):
    c = node[n].q1("SELECT im.create_conversation('group', %s)", (members,))
    check(node_of(c) == n, f"conversation {c} is placed on {n}")
    return c


RUN = str(time.time_ns())   # client_msg_ids of this run (the script may run again on the same nodes)


def send(n, conv, sender, cid, text="hi"):
    return node[n].q("SELECT message_id, msg_seq FROM im.send_message(%s, %s, %s, %s)",
                     (sender, conv, f"{cid}-{RUN}", json.dumps({"text": text})))[0]


def row(n, sql, args=None):
    return node[n].q1(sql, args)


def head(n, conv):
    return row(n, "SELECT head_msg_seq FROM im.conversation WHERE conversation_id = %s", (conv,))


def body(n, message_id):
    return row(n, "SELECT body FROM im.event WHERE message_id = %s", (message_id,))


NEXT_ID = [9_000_000_000 + (time.time_ns() // 1000) % 1_000_000_000 * 1000]


def fresh_id():
    NEXT_ID[0] += 1
    return NEXT_ID[0]


def event_like(ev, conv, k, text):
    """a new event of conv modelled on ev: an id with conv's bucket, msg_seq 1000 + k"""
    e = dict(ev)
    e.update(message_id=ev["message_id"] + 64 * (1_000_003 + k), conversation_id=conv, msg_seq=1000 + k,
             client_msg_id=f"forged-{k}-{RUN}", body={"text": text})
    e.pop("target_message_id", None)
    return e


def main():
    ua, ub, uc = users_on(A, 3), users_on(B, 4), users_on(C, 3)
    # Y on node3 with node2 and node3 members only (node3's transfers all go to node2)
    Y = create(C, [uc[0], ub[0]])
    Z = create(B, [ub[0], ub[1]])
    X = [create(A, [ua[0], ub[0]]) for _ in range(3)]
    my, _ = send(C, Y, uc[0], "y-1", "the real Y message")
    mz, _ = send(B, Z, ub[0], "z-1", "the real Z message")
    for x in X:
        send(A, x, ua[0], f"x-{x}", "x")
    check(drain(), "set-up drained", str(pending_all()))
    y_ev = json.loads(json.dumps(row(B, "SELECT to_jsonb(e) - 'request_digest' FROM im.event e WHERE message_id = %s", (my,))))
    z_ev = row(B, "SELECT to_jsonb(e) - 'request_digest' FROM im.event e WHERE message_id = %s", (mz,))
    y_conv = row(B, "SELECT to_jsonb(c) FROM im.conversation c WHERE conversation_id = %s", (Y,))
    z_conv = row(B, "SELECT to_jsonb(c) FROM im.conversation c WHERE conversation_id = %s", (Z,))
    y_period = row(B, "SELECT to_jsonb(p) FROM im.membership_period p WHERE conversation_id = %s AND user_id = %s",
                   (Y, ub[0]))
    check(y_ev is not None and y_period is not None, "node2 holds a copy of Y (event, period)")
    y_head, z_head = head(B, Y), head(B, Z)

    def forged_y_payload(k):
        conv = dict(y_conv, head_msg_seq=1000 + k)
        return {"conversation": conv, "events": [event_like(y_ev, Y, k, "forged")], "periods": [], "period_ids": []}

    def forged_y_row(source, dest=B, k=0, tid=None):
        p = forged_y_payload(k)
        return {"transfer_id": tid or fresh_id(), "source_node": source, "dest_node": dest, "outbox_id": 0,
                "conversation_id": Y, "msg_seq": 1000 + k, "source_event_id": p["events"][0]["message_id"],
                "payload": p}

    # ---- forged_source
    r = forged_y_row(C, k=1)
    forge_out(r)
    arrived(B, C, r["transfer_id"])
    node[B].q("SELECT im.run_fanout()")
    check(in_state(B, C, r["transfer_id"]) is None,
          "forged_source: a transfer claiming node3 but delivered by node1 is not recorded as node3's",
          str(in_state(B, C, r["transfer_id"])))
    check(head(B, Y) == y_head and row(B, "SELECT count(*) FROM im.event WHERE message_id = %s",
                                       (r["source_event_id"],)) == 0,
          "forged_source: Y's copy on node2 unchanged (no head pushed forward, no forged event)",
          f"head {head(B, Y)} (was {y_head})")
    check(any("node1" in x for x in refused(B, "transfer", r["transfer_id"])),
          "forged_source: node2 recorded the refusal naming the delivering node",
          str(refused(B, "transfer", r["transfer_id"])))

    # ---- source_self
    r = forged_y_row(B, k=2)
    forge_out(r)
    arrived(B, B, r["transfer_id"])
    node[B].q("SELECT im.run_fanout()")
    check(in_state(B, B, r["transfer_id"]) is None and head(B, Y) == y_head,
          "source_self: a transfer claiming to come from node2 itself is refused on node2",
          f"{in_state(B, B, r['transfer_id'])}, head {head(B, Y)}")
    check(refused(B, "transfer", r["transfer_id"]) != [], "source_self: the refusal is recorded")

    # ---- map_owner: node1 under its own name, a transfer of node3's Y
    r = forged_y_row(A, k=3)
    forge_out(r, trigger_off=False)
    arrived(B, A, r["transfer_id"])
    node[B].q("SELECT im.run_fanout()")
    check(in_state(B, A, r["transfer_id"]) is None and head(B, Y) == y_head,
          "map_owner: a transfer of a conversation the map places on node3 is refused from node1",
          f"{in_state(B, A, r['transfer_id'])}, head {head(B, Y)}")
    check(refused(B, "transfer", r["transfer_id"]) != [], "map_owner: the refusal is recorded")

    # ---- claimed_id: node1 takes node3's next transfer id
    tli, last, called = node[C].q("SELECT (SELECT timeline_id FROM pg_control_checkpoint()), last_value, is_called"
                                  " FROM im.transfer_id_seq")[0]
    nxt = (tli << 40) | (last + 1 if called else last)
    r = forged_y_row(C, k=4, tid=nxt)
    r["payload"] = {}
    forge_out(r)
    arrived(B, C, nxt)
    my2, seq2 = send(C, Y, uc[0], "y-2", "the real second Y message")
    node[C].q("SELECT im.run_fanout()")
    used = node[C].q1("SELECT last_value FROM im.transfer_id_seq")
    check(used == last + 1, "claimed_id: node3's real transfer took the id node1 claimed", f"{used} vs {last + 1}")
    check(drain(), "claimed_id: drained", str(pending_all()))
    check(row(B, "SELECT count(*) FROM im.inbox WHERE user_id = %s AND conversation_id = %s AND msg_seq = %s",
              (ub[0], Y, seq2)) == 1,
          "claimed_id: the real message reached node2's user (not dropped as a duplicate of the forged claim)",
          f"transfer_in: {node[B].q('SELECT state, duplicates FROM im.transfer_in WHERE transfer_id = %s', (nxt,))}")

    # ---- forged_dest: node1's publication to node2 unfiltered; source node2, dest node3
    node[A].q("ALTER PUBLICATION im_to_node2 SET TABLE im.transfer_out,"
              " im.transfer_ack WHERE (source_node = 'node2')")
    zp = {"conversation": dict(z_conv, head_msg_seq=2000), "events": [event_like(z_ev, Z, 10, "forged")],
          "periods": [], "period_ids": []}
    r = {"transfer_id": fresh_id(), "source_node": B, "dest_node": C, "outbox_id": 0, "conversation_id": Z,
         "msg_seq": 1010, "source_event_id": zp["events"][0]["message_id"], "payload": zp}
    forge_out(r)
    arrived(B, B, r["transfer_id"])
    wait_for(lambda: row(B, "SELECT count(*) FROM im.transfer_out WHERE transfer_id = %s", (r["transfer_id"],)) > 0
             or refused(B, "transfer", r["transfer_id"]), 30, step=0.2)
    stored_on_b = row(B, "SELECT count(*) FROM im.transfer_out WHERE transfer_id = %s", (r["transfer_id"],))
    node[A].q("ALTER PUBLICATION im_to_node2 SET TABLE im.transfer_out WHERE (dest_node = 'node2'),"
              " im.transfer_ack WHERE (source_node = 'node2')")
    for n in NAMES:
        node[n].q("SELECT im.run_fanout()")
    wait_for(lambda: in_state(C, B, r["transfer_id"]) or refused(C, "transfer", r["transfer_id"]), 30, step=0.2)
    check(stored_on_b == 0 and refused(B, "transfer", r["transfer_id"]) != [],
          "forged_dest: a row for node3 claiming source node2 is never stored on node2 as its own transfer",
          f"stored {stored_on_b}")
    check(in_state(C, B, r["transfer_id"]) is None,
          "forged_dest: node3 never records it as node2's transfer", str(in_state(C, B, r["transfer_id"])))

    # ---- forged_acker: node3's subscription from node2 stopped; node1 acks for node3
    node[C].q("ALTER SUBSCRIPTION im_node2_to_node3 DISABLE")
    z3 = create(B, [ub[2], uc[1]])
    mz3, _ = send(B, z3, ub[2], "z3-1", "for node3")
    t = wait_for(lambda: node[B].q1("SELECT im.run_fanout() >= 0") and
                 row(B, "SELECT transfer_id FROM im.transfer_out WHERE dest_node = %s AND source_event_id = %s",
                     (C, mz3)), 30, step=0.2)
    check(t is not None, "forged_acker: node2 wrote the transfer for node3")
    forge_ack(B, t, C)
    wait_for(lambda: row(B, "SELECT count(*) FROM im.transfer_out WHERE transfer_id = %s", (t,)) == 0
             or refused(B, "ack", t), 30, step=0.2)
    node[B].q("SELECT im.run_fanout()")
    check(row(B, "SELECT count(*) FROM im.transfer_out WHERE transfer_id = %s", (t,)) == 1,
          "forged_acker: an ack claiming node3 but delivered by node1 does not delete node2's transfer")
    check(refused(B, "ack", t) != [], "forged_acker: the refusal is recorded")
    node[C].q("ALTER SUBSCRIPTION im_node2_to_node3 ENABLE")
    check(drain(), "forged_acker: drained after the subscription is back", str(pending_all()))
    check(row(C, "SELECT count(*) FROM im.inbox WHERE user_id = %s AND conversation_id = %s", (uc[1], z3)) >= 1,
          "forged_acker: node3's user received the message")

    # ---- payload_other / payload_owned: node1's own X transfers carrying rows of Y / Z
    x_rows = []
    for x in X:
        x_rows.append((x, row(A, "SELECT to_jsonb(c) FROM im.conversation c WHERE conversation_id = %s", (x,)),
                       row(A, "SELECT to_jsonb(e) - 'request_digest' FROM im.event e WHERE conversation_id = %s"
                              " AND kind = 'message' ORDER BY msg_seq DESC LIMIT 1", (x,))))
    new_period = dict(y_period, membership_period_id=y_period["membership_period_id"] + 64 * 1_000_003,
                      user_id=ub[3])
    cases = [
        ("payload_other", "a body of Y rewritten", x_rows[0], {"events": [dict(y_ev, body={"text": "rewritten"})]},
         lambda: body(B, my) == y_ev["body"]),
        ("payload_other", "Y's head pushed forward and a membership period opened in Y for a node2 user", x_rows[1],
         {"conversation": dict(y_conv, head_msg_seq=5000), "periods": [new_period]},
         lambda: head(B, Y) == y_head + 1 and row(B, "SELECT count(*) FROM im.membership_period WHERE"
                                                    " membership_period_id = %s",
                                                    (new_period["membership_period_id"],)) == 0),
        ("payload_owned", "a body and the head of node2's own Z", x_rows[2],
         {"events": [dict(z_ev, body={"text": "rewritten"})], "conversation": dict(z_conv, head_msg_seq=6000)},
         lambda: body(B, mz) == z_ev["body"] and head(B, Z) == z_head),
    ]
    for name, what, (x, xconv, xev), change, unchanged in cases:
        ev = dict(xev, message_id=xev["message_id"] + 64 * 2_000_003, msg_seq=xconv["head_msg_seq"] + 1,
                  client_msg_id=f"x-forged-{RUN}")
        p = {"conversation": dict(xconv, head_msg_seq=ev["msg_seq"]), "events": [ev], "periods": [],
             "period_ids": []}
        if "conversation" in change:
            p["conversation"] = change["conversation"]
        p["events"] = p["events"] + change.get("events", [])
        p["periods"] = change.get("periods", [])
        r = {"transfer_id": fresh_id(), "source_node": A, "dest_node": B, "outbox_id": 0, "conversation_id": x,
             "msg_seq": ev["msg_seq"], "source_event_id": ev["message_id"], "payload": p}
        forge_out(r, trigger_off=False)
        arrived(B, A, r["transfer_id"])
        wait_for(lambda: node[B].q1("SELECT im.run_fanout() >= 0") and in_state(B, A, r["transfer_id"]) != "pending",
                 30, step=0.2)
        st = in_state(B, A, r["transfer_id"])
        check(unchanged(), f"{name}: {what} — nothing of it reached node2", f"state {st}")
        check(st == "quarantined", f"{name}: the transfer is quarantined", f"state {st}")
        # the operator's step once it is seen: delete the quarantined transfer
        node[B].q("DELETE FROM im.transfer_in WHERE source_node = %s AND transfer_id = %s", (A, r["transfer_id"]))

    # ---- local_insert: rows inserted on node2 by a session, not an apply worker
    r = forged_y_row(C, k=20)
    try:
        node[B].q("INSERT INTO im.transfer_out (transfer_id, source_node, dest_node, outbox_id, conversation_id,"
                  " msg_seq, source_event_id, payload) VALUES (%s, %s, %s, 0, %s, %s, %s, %s)",
                  (r["transfer_id"], C, B, Y, r["msg_seq"], r["source_event_id"], json.dumps(r["payload"])))
        err = None
    except psycopg2.Error as e:
        err = e.pgcode
    check(err == "42501" and in_state(B, C, r["transfer_id"]) is None,
          "local_insert: a transfer inserted on node2 by a session is refused (42501), not recorded as node3's",
          f"{err}, {in_state(B, C, r['transfer_id'])}")
    node[C].q("ALTER SUBSCRIPTION im_node2_to_node3 DISABLE")
    mz4, _ = send(B, z3, ub[2], "z3-2", "for node3 again")
    t = wait_for(lambda: node[B].q1("SELECT im.run_fanout() >= 0") and
                 row(B, "SELECT transfer_id FROM im.transfer_out WHERE dest_node = %s AND source_event_id = %s",
                     (C, mz4)), 30, step=0.2)
    check(t is not None, "local_insert: node2 wrote the transfer for node3")
    try:
        node[B].q("INSERT INTO im.transfer_ack (source_node, transfer_id, applied_by) VALUES (%s, %s, %s)", (B, t, C))
        err = None
    except psycopg2.Error as e:
        err = e.pgcode
    check(err == "42501" and row(B, "SELECT count(*) FROM im.transfer_out WHERE transfer_id = %s", (t,)) == 1,
          "local_insert: an ack inserted on node2 by a session is refused (42501) and deletes nothing", str(err))
    node[C].q("ALTER SUBSCRIPTION im_node2_to_node3 ENABLE")
    check(drain(), "local_insert: drained", str(pending_all()))

    # ---- reconcile lists the refusals; cleaned up, every node is clean
    if has_refused_table(B):
        names = [r[0] for r in node[B].q("SELECT check_name FROM im.reconcile()")]
        check("transfer_refused" in names, "node2's reconcile lists the refused rows", str(names))
    for n in NAMES:
        if has_refused_table(n):
            node[n].q("DELETE FROM im.transfer_refused")
    check(drain(), "drained at the end", str(pending_all()))
    bad = {n: node[n].q("SELECT check_name, detail::text FROM im.reconcile()") for n in NAMES}
    bad = {n: r for n, r in bad.items() if r}
    check(not bad, "every node's reconcile is empty after the clean-up", str(bad)[:800])


if __name__ == "__main__":
    check(len(NAMES) == 3, f"three nodes ({NAMES})")
    main()
    print(f"forge_check: {len(failures)} failure(s)")
    sys.exit(1 if failures else 0)
