"""Drill 7 (§19.4, last line; design §10.3): a dirty-marker clear racing a
new message in a shared_log group.  The client reads its marker (target,
version), saves the positions up to the target, and clears with that
version -- while a sender keeps sending and the background workers fan the
new messages out.  The clear with the stale version must fail and leave the
marker dirty (it may never clear a newer target).  The client ignores every
NOTIFY hint (they are lost by design); the authoritative marker and head
from im.conversation_list alone must let it catch up, message for message.
Afterwards a successful clear and one new message make the marker dirty
again with a new conversation_dirty event (level-triggered, not one-shot)."""
import threading
from drill_lib import *

set_paused(True)
# Fresh users per run (disjoint from drill 6's range), so the drill can be re-run.
U = 5_000_000 + int(time.time() * 10) % 1_000_000 * 4
CLIENT, SENDER = U, U + 1
conv = q1("SELECT im.create_conversation('group', %s)", ([CLIENT, SENDER, U + 2],))
q1("SELECT im.set_conversation_mode(%s, 'shared_log')", (conv,))


# The client's own session (one connection, as a real client keeps).
client_conn = connect()


def cq(sql, args=None):
    with client_conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall()


def marker():
    """What the client may read: the authoritative row of conversation_list."""
    for r in cq("SELECT conversation_id, mode, dirty_target_msg_seq, dirty_version, head_msg_seq "
               "FROM im.conversation_list(%s, 1, %s)", (CLIENT, conv - 1)):
        if r[0] == conv:
            return {"mode": r[1], "target": r[2], "version": r[3], "head": r[4]}
    raise AssertionError(f"conversation {conv} missing from conversation_list({CLIENT})")


def dirty_events():
    return q1("SELECT count(*) FROM im.inbox WHERE user_id = %s AND conversation_id = %s "
              "AND kind = 'conversation_dirty'", (CLIENT, conv))


def is_dirty():
    # Server-side truth for the drill's report only; the client never reads it.
    return q1("SELECT dirty FROM im.user_conversation WHERE user_id = %s AND conversation_id = %s",
              (CLIENT, conv))


class Client:
    """Keeps the positions it saved; its saved position is the highest
    msg_seq up to which it read the shared log."""

    def __init__(self):
        self.pos = {}
        self.saved = 0
        self.fetches = 0

    def fetch_to(self, upto):
        after = self.saved
        while after < upto:
            msgs, nxt, more = cq("SELECT * FROM im.fetch_messages(%s, %s, %s, 7, %s)",
                                (CLIENT, conv, after, upto))[0]
            self.fetches += 1
            for p in msgs:
                s = p["msg_seq"]
                if not (after < s <= upto and (s not in self.pos or self.pos[s]["message_id"] == p["message_id"])):
                    check(False, f"fetch_messages position {s} in ({after}, {upto}] with a stable identity")
                    return
                self.pos[s] = p
            if not more:
                break
            after = nxt
        self.saved = max(self.saved, upto)

    def clear(self, m):
        return cq("SELECT cleared, dirty_target_msg_seq, dirty_version FROM im.clear_dirty(%s, %s, %s, %s)",
                 (CLIENT, conv, m["version"], self.saved))[0]

    def catch_up(self, max_rounds=50):
        """Level-triggered slow path: read the marker, fetch to its target,
        clear with the observed version; a failed clear means re-read."""
        failed = 0
        for _ in range(max_rounds):
            m = marker()
            self.fetch_to(m["target"])
            r = self.clear(m)
            if r[0]:
                return failed, m
            failed += 1
        return failed, None


# A hint listener, to show hints were sent -- the client never looks at them.
hints = connect()
hints.cursor().execute("LISTEN im_sync_hint")

drill("dirty_marker_race",
      "a shared_log client clears its dirty marker with the version it read while new messages are sent and "
      "fanned out by the background workers; every NOTIFY hint is ignored (dropped)",
      "a stale clear_dirty fails and never clears a newer target; the marker stays dirty (no second "
      "conversation_dirty while dirty); conversation_list's marker and head alone let the client catch up to "
      "exactly fetch_messages; reconcile = 0")

for i in range(3):
    q("SELECT im.send_message(%s, %s, %s, %s)", (SENDER, conv, f"{U}-a-{i}", '{"n": %d}' % i))
run_fanout_until_drained()
client = Client()
m1 = marker()
check(m1["mode"] == "shared_log" and m1["target"] == m1["head"] == 5 and is_dirty() and dirty_events() == 1,
      f"3 messages after create + mode: marker target {m1['target']} = head {m1['head']}, v{m1['version']}, "
      f"dirty, one conversation_dirty event")
check(q1("SELECT count(*) FROM im.inbox WHERE user_id = %s AND conversation_id = %s AND kind = 'message'",
         (CLIENT, conv)) == 0, "no per-member message events in shared_log mode")
client.fetch_to(m1["target"])

# The race, workers on.  Phase 1, interleaved on purpose: the client reads
# its marker and saves up to the target; meanwhile a sender sends and the
# workers fan out; then the client clears with the version it read.
set_paused(False)
ROUNDS, PER_ROUND, FREE = 5, 4, 120
stale_ok, dirty_ok = 0, 0
sent = 0
for r in range(ROUNDS):
    m = marker()
    client.fetch_to(m["target"])
    go = threading.Thread(target=lambda base=sent: [
        q("SELECT im.send_message(%s, %s, %s, %s)", (SENDER, conv, f"{U}-b-{base + i}", '{"n": %d}' % i))
        for i in range(PER_ROUND)])
    go.start()
    deadline = time.time() + 30
    while time.time() < deadline and marker()["version"] == m["version"]:
        time.sleep(0.01)   # until a worker has fanned out at least one racing message
    stale = client.clear(m)
    go.join()
    sent += PER_ROUND
    stale_ok += (not stale[0] and stale[2] > m["version"] and stale[1] > client.saved)
    dirty_ok += bool(is_dirty())
check(stale_ok == ROUNDS, f"{stale_ok}/{ROUNDS} clear_dirty calls with a version read before a racing message "
      f"failed (never clearing the newer target)")
check(dirty_ok == ROUNDS and dirty_events() == 1,
      f"the marker stayed dirty each time and no second conversation_dirty was written while dirty "
      f"({dirty_events()} event)")

# Phase 2, free-running: a sender sends FREE messages while the client keeps
# catching up (clears may fail or win); a clear that wins must never cover a
# position the client has not saved.
sender_errors, clears = [], []


def sender():
    try:
        c = connect()
        cur = c.cursor()
        for i in range(FREE):
            cur.execute("SELECT im.send_message(%s, %s, %s, %s)", (SENDER, conv, f"{U}-f-{i}", '{"n": %d}' % i))
        c.close()
    except psycopg2.Error as e:
        sender_errors.append(str(e).splitlines()[0])


t = threading.Thread(target=sender)
t.start()
while t.is_alive():
    m = marker()
    client.fetch_to(m["target"])
    r = client.clear(m)
    clears.append((m["version"], client.saved, r))
t.join()
sent += FREE
won = [(v, sv, r) for v, sv, r in clears if r[0]]
bad = [(v, sv, r) for v, sv, r in won if r[2] != v or r[1] > sv]
check(not sender_errors, f"the sender's {FREE} messages were accepted ({sender_errors[:1]})")
check(not bad, f"{len(clears)} clears during the free race ({len(won)} won, {len(clears) - len(won)} failed): "
      f"none cleared a newer version or a target beyond the saved position {bad[:2]}")
check(dirty_events() <= 1 + len(won),
      f"conversation_dirty events {dirty_events()} <= 1 + successful clears {len(won)} (one per clean->dirty)")
check(wait_drained(60), "the workers drained the outbox")
# After the race: whatever arrived after the last clear is under a dirty marker;
# the client, still ignoring hints, catches up from conversation_list alone.
failed2, m3 = client.catch_up()
HEAD = 5 + sent
check(m3 is not None and client.saved == m3["head"] == m3["target"] == HEAD and not is_dirty(),
      f"final catch-up from the authoritative marker: saved {client.saved} = head {m3 and m3['head']} = target, "
      f"marker clean")

# Hints were sent but the client never used them.
hints.poll()
payloads = [n.payload for n in hints.notifies]
check(any(e.startswith(f"c{conv}:") for p in payloads for e in p.split(",")),
      f"{len(payloads)} im_sync_hint notifications were sent (c{conv}:<head> among them) and all were ignored")
hints.close()

# Message for message: what the client saved = fetch_messages for the user.
truth = []
after = 0
while True:
    msgs, nxt, more = q("SELECT * FROM im.fetch_messages(%s, %s, %s, 100)", (CLIENT, conv, after))[0]
    truth.extend(msgs)
    if not more:
        break
    after = nxt
have = [client.pos[s] for s in sorted(client.pos)]
check([p["msg_seq"] for p in have] == list(range(1, HEAD + 1)) and have == truth,
      f"the client holds positions 1..{HEAD}, equal to fetch_messages ({len(have)} vs {len(truth)}), "
      f"via {client.fetches} fetch_messages pages")

# Level-triggered, not one-shot: after a successful clear, a new message makes
# the marker dirty again with a new conversation_dirty event.
before = dirty_events()
q("SELECT im.send_message(%s, %s, %s, '{\"n\": 99}')", (SENDER, conv, f"{U}-c"))
check(wait_drained(30), "the next message is fanned out")
m4 = marker()
check(is_dirty() and m4["target"] == HEAD + 1 and dirty_events() == before + 1,
      f"after the clear a new message makes the marker dirty again (target {m4['target']}) with one new "
      f"conversation_dirty event ({before} -> {dirty_events()})")
_, m5 = client.catch_up()
check(m5 is not None and client.saved == HEAD + 1 and not is_dirty(), "the client catches up and clears again")

client_conn.close()
set_paused(True)
reconcile_zero()
finish("dirty_marker_race")
