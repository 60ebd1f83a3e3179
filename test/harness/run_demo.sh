#!/usr/bin/env bash
# make demo: the design doc's §2.1 scenario end to end through the SQL API,
# with a readable transcript.  A's phone sends to B; B's desktop is online
# (hint -> sync -> ACK), B's phone is offline; more messages and a recall
# arrive while the phone reconnects; both of B's devices converge; and
# message_status shows delivery (device_synced) and reading (user_read) apart.
# Starts its own throwaway cluster (fanout workers paused: the demo runs
# fanout itself so each step is visible) and stops it at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/harness/cluster.sh
im_cluster_start "im_sync.fanout_paused = on" "im_sync.fanout_workers = 0" >/dev/null || exit 1
trap im_cluster_destroy EXIT
im_createdb im_demo

IM_DEMO_DSN="host=$PGHOST port=$PGPORT user=$PGUSER dbname=im_demo" /usr/bin/python3 - <<'PYEOF'
import json, os, select
import psycopg2, psycopg2.extras

dsn = os.environ['IM_DEMO_DSN']
db = psycopg2.connect(dsn); db.autocommit = True
listener = psycopg2.connect(dsn); listener.autocommit = True   # B's desktop gateway session
listener.cursor().execute("LISTEN im_sync_hint")

A, B = 1, 2
NAMES = {A: 'A', B: 'B'}

def q(sql, args=()):
    with db.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute(sql, args)
        return cur.fetchall()

def section(title):
    print('\n' + '=' * 78 + '\n== ' + title + '\n' + '=' * 78)

def say(text):
    print('  ' + text)

def table(rows, cols):
    if not rows:
        say('(no rows)'); return
    w = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    say('  '.join(c.ljust(w[c]) for c in cols))
    say('  '.join('-' * w[c] for c in cols))
    for r in rows:
        say('  '.join(str(r[c]).ljust(w[c]) for c in cols))

class Device:
    """A client: a local store (generation, applied cursor, view) changed
    only by whole batches, ACKed only after the batch is applied."""
    def __init__(self, user, name):
        self.user, self.name = user, name
        self.gen, self.applied, self.view = None, 0, {}
    def label(self):
        return '%s/%s' % (NAMES[self.user], self.name)
    def apply(self, p):
        if p['kind'] in ('read_cursor', 'delete_for_me', 'conversation_dirty'):
            return
        self.view[(p['conversation_id'], p['msg_seq'])] = p
        for t in self.view.values():
            if p['kind'] == 'recall' and t['kind'] == 'reaction' and t['target_message_id'] == p['target_message_id']:
                t['body'], t['recalled'] = None, True         # a recalled message keeps no reactions
            if p['kind'] in ('recall', 'edit') and t['message_id'] == p['target_message_id']:
                if p['kind'] == 'recall' or p['recalled']:
                    t['body'], t['recalled'] = None, True     # a tombstone never shows the body again
                elif not t['recalled']:
                    t['body'] = p['body']
    def snapshot(self):
        b = q("SELECT * FROM im.begin_snapshot(%s, %s)", (self.user, self.name))[0]
        say('%s: begin_snapshot -> %s, generation %s, base_sync_seq S=%s, %s page(s)' % (
            self.label(), b['status'], b['sync_generation'], b['base_sync_seq'], b['page_count']))
        self.view = {}
        for p in range(b['page_count']):
            f = q("SELECT * FROM im.fetch_snapshot(%s, %s, %s, %s)", (self.user, self.name, b['snapshot_token'], p))[0]
            for it in f['items']:
                msgs = q("SELECT * FROM im.fetch_messages(%s, %s, 0, 1000, %s)",
                         (self.user, it['conversation_id'], it['last_msg_seq']))[0]['messages']
                for m in msgs:
                    self.apply(m)
                say('%s:   conversation %s: last_msg_seq %s, fetched %d position(s)' % (
                    self.label(), it['conversation_id'], it['last_msg_seq'], len(msgs)))
        a = q("SELECT * FROM im.ack_snapshot(%s, %s, %s, %s)",
              (self.user, self.name, b['snapshot_token'], b['manifest_digest']))[0]
        self.gen, self.applied = b['sync_generation'], a['acked_sync_seq']
        say('%s: ack_snapshot -> %s, device ACK = %s' % (self.label(), a['status'], a['acked_sync_seq']))
    def sync(self, limit=2):
        while True:
            r = q("SELECT * FROM im.sync_changes(%s, %s, %s, %s, %s)",
                  (self.user, self.name, self.gen, self.applied, limit))[0]
            say('%s: sync_changes(generation %s, local_applied %s) -> %s, range (%s, %s], user watermark %s' % (
                self.label(), self.gen, self.applied, r['status'], r['resume_from'],
                r['batch_high_watermark'], r['user_high_watermark']))
            if r['status'] == 'RESET_REQUIRED':
                self.snapshot(); continue
            events, page = list(r['events']), r
            while page['has_more']:
                page = q("SELECT * FROM im.sync_changes(%s, %s, NULL, NULL, %s, %s)",
                         (self.user, self.name, limit, page['next_cursor']))[0]
                events.extend(page['events'])
                say('%s:   next page (cursor) -> %d more event(s)' % (self.label(), len(page['events'])))
            for e in events:
                self.apply(e)
                if e['kind'] == 'read_cursor':
                    say('%s:   sync_seq %s: read_cursor conversation %s read_msg_seq %s' % (
                        self.label(), e['sync_seq'], e['conversation_id'], e['read_msg_seq']))
                    continue
                say('%s:   sync_seq %s: %-8s conversation %s msg_seq %s %s' % (
                    self.label(), e['sync_seq'], e['kind'], e['conversation_id'], e.get('msg_seq'),
                    json.dumps(e.get('body'), ensure_ascii=False)))
            self.gen, self.applied = r['sync_generation'], max(self.applied, r['batch_high_watermark'])
            a = q("SELECT * FROM im.ack_sync(%s, %s, %s, %s)",
                  (self.user, self.name, r['batch_token'], r['batch_high_watermark']))[0]
            say('%s: batch applied atomically, then ack_sync(%s) -> %s, device ACK = %s' % (
                self.label(), r['batch_high_watermark'], a['status'], a['acked_sync_seq']))
            if r['status'] == 'OK' and r['user_high_watermark'] <= self.applied:
                return
    def show(self):
        rows = [dict(msg_seq=k[1], kind=p['kind'], message_id=p['message_id'], sender=p['sender_id'],
                     body=json.dumps(p['body'], ensure_ascii=False), recalled=p['recalled'])
                for k, p in sorted(self.view.items())]
        say('%s view:' % self.label())
        table(rows, ['msg_seq', 'kind', 'message_id', 'sender', 'body', 'recalled'])
        return [(k, p['message_id'], p['body'], p['recalled']) for k, p in sorted(self.view.items())]

def fanout():
    n = q("SELECT im.run_fanout() AS n")[0]['n']
    say('fanout: run_fanout() processed %d outbox item(s)' % n)

def hints():
    select.select([listener], [], [], 2)
    listener.poll()
    got = []
    while listener.notifies:
        got.append(listener.notifies.pop(0).payload)
    say('gateway LISTEN im_sync_hint received: %s' % (got or 'nothing'))
    return got

def status(mid, title):
    say(title)
    table(q("SELECT * FROM im.message_status(%s) ORDER BY user_id, device_id", (mid,)),
          ['user_id', 'device_id', 'accepted', 'in_sync_scope', 'device_synced', 'user_read'])

a_phone, b_desktop, b_phone = Device(A, 'phone'), Device(B, 'desktop'), Device(B, 'phone')

section('0. Setup: users A=1 and B=2, a direct conversation, three devices')
conv = q("SELECT im.direct_conversation(%s, %s) AS c", (A, B))[0]['c']
say('direct_conversation(A, B) -> conversation %s' % conv)
for d in (a_phone, b_desktop, b_phone):
    r = q("SELECT * FROM im.register_device(%s, %s)", (d.user, d.name))[0]
    say('register_device(%s) -> state %s, generation %s' % (d.label(), r['state'], r['sync_generation']))
fanout()
hints()
say('every new device first installs a snapshot, then syncs from its base:')
for d in (a_phone, b_desktop, b_phone):
    d.sync()

section("1. B's phone goes offline; A's phone sends \"hello\" (SEND_ACK)")
r = q("SELECT * FROM im.send_message(%s, %s, %s, %s)", (A, conv, 'a-phone-1', psycopg2.extras.Json({'text': 'hello'})))[0]
m1 = r['message_id']
say('send_message(A, "hello") -> message_id %s, msg_seq %s, created %s' % (m1, r['msg_seq'], r['created']))
r = q("SELECT * FROM im.send_message(%s, %s, %s, %s)", (A, conv, 'a-phone-1', psycopg2.extras.Json({'text': 'hello'})))[0]
say('retry after a lost response (same client_msg_id) -> message_id %s, created %s' % (r['message_id'], r['created']))
status(m1, 'message_status right after the send (accepted, not yet fanned out):')

section("2. Fanout places it in B's sync space; the gateway hints B's desktop")
fanout()
hints()
say("B's desktop is online: the hint wakes it, it syncs and ACKs")
b_desktop.sync()
status(m1, "message_status: delivered to B's desktop, not to B's phone, not read "
           "(A's own phone has not synced its copy yet either):")

section("3. More messages and a recall arrive while B's phone is still offline")
mids = []
for i, text in enumerate(['are you there?', 'oops, wrong chat', 'see you at 6'], 2):
    r = q("SELECT * FROM im.send_message(%s, %s, %s, %s)", (A, conv, 'a-phone-%d' % i, psycopg2.extras.Json({'text': text})))[0]
    mids.append(r['message_id'])
    say('send_message(A, %s) -> message_id %s, msg_seq %s' % (json.dumps(text), r['message_id'], r['msg_seq']))
r = q("SELECT * FROM im.recall_message(%s, %s, %s, %s)", (A, conv, 'a-phone-recall-1', mids[1]))[0]
say('recall_message(A, message %s) -> recall event msg_seq %s' % (mids[1], r['msg_seq']))
fanout()
hints()
b_desktop.sync()

section("4. B's phone reconnects and catches up from its own cursor (pages of 2)")
b_phone.sync()

section("5. Both of B's devices converge")
v1 = b_desktop.show()
v2 = b_phone.show()
say('views equal: %s' % (v1 == v2))
truth = q("SELECT * FROM im.fetch_messages(%s, %s, 0, 1000)", (B, conv))[0]['messages']
say('equal to fetch_messages(B): %s' % (v1 == [((conv, p['msg_seq']), p['message_id'], p['body'], p['recalled']) for p in truth]))
say("the recalled message is a tombstone everywhere: body null, recalled true")
if v1 != v2:
    raise SystemExit('demo: the devices did not converge')

section("6. Delivery is not reading: message_status before B reads")
status(mids[2], 'message "see you at 6" is on both of B\'s devices, but B has not read it:')
cl = q("SELECT * FROM im.conversation_list(%s)", (B,))
table(cl, ['conversation_id', 'last_msg_seq', 'read_msg_seq', 'unread_count', 'head_msg_seq'])

section("7. B opens the conversation on the desktop and reads it")
last = max(k[1] for k in b_desktop.view)
r = q("SELECT * FROM im.report_read(%s, %s, %s)", (B, conv, last))[0]
say('report_read(B, conversation %s, %s) -> read_msg_seq %s, unread_count %s' % (conv, last, r['read_msg_seq'], r['unread_count']))
status(mids[2], 'message_status after the read (user_read is per user, device ACKs did not move):')
fanout()
hints()
say("B's phone learns the read position as a read_cursor event on its next sync:")
b_phone.sync()
table(q("SELECT * FROM im.conversation_list(%s)", (B,)),
      ['conversation_id', 'last_msg_seq', 'read_msg_seq', 'unread_count', 'head_msg_seq'])
section("8. Replies, reactions and pins travel as positions (contract §14)")
r = q("SELECT * FROM im.send_message(%s, %s, %s, %s, 'text', %s)",
      (B, conv, 'b-desktop-1', psycopg2.extras.Json({'text': 'at 6, ok'}), mids[2]))[0]
reply = r['message_id']
say('send_message(B, "at 6, ok", reply_to_message_id %s) -> message_id %s, msg_seq %s' % (mids[2], reply, r['msg_seq']))
for u, dev, target, key, present in ((A, 'a-phone-r1', reply, '👍', True), (B, 'b-phone-r1', m1, '❤', True),
                                     (B, 'b-desktop-r2', m1, '👋', True), (B, 'b-phone-r3', m1, '❤', False)):
    r = q("SELECT * FROM im.react(%s, %s, %s, %s, %s, %s)", (u, conv, target, key, present, dev))[0]
    say('react(%s, message %s, %s, present %s) -> msg_seq %s' % (NAMES[u], target, key, present, r['msg_seq']))
r = q("SELECT * FROM im.pin_message(%s, %s, %s, true, %s)", (A, conv, mids[2], 'a-phone-p1'))[0]
say('pin_message(A, message %s) -> msg_seq %s' % (mids[2], r['msg_seq']))
fanout()
hints()
b_desktop.sync()
b_phone.sync()
def local_relations(d):
    latest, pins = {}, []
    for k, p in sorted(d.view.items()):
        if p['kind'] == 'reaction':
            latest[(p['target_message_id'], p['sender_id'])] = (p['body'] or {}).get('reactions', [])
        elif p['kind'] == 'pin':
            pins = p['body']['pinned']
    counts = {}
    for (t, _), keys in latest.items():
        for key in keys:
            counts.setdefault(t, {})[key] = counts.setdefault(t, {}).get(key, 0) + 1
    return counts, pins
truth = q("SELECT * FROM im.fetch_messages(%s, %s, 0, 1000)", (B, conv))[0]['messages']
server = {p['message_id']: p['reactions'] for p in truth if p['kind'] == 'message' and p['reactions']}
for d in (b_desktop, b_phone):
    counts, pins = local_relations(d)
    say('%s: reactions %s, pinned %s (replayed from the reaction and pin positions in msg_seq order)' % (
        d.label(), json.dumps(counts, ensure_ascii=False), pins))
say('fetch_messages(B): reactions %s, reply_to_message_id of message %s = %s' % (
    json.dumps(server, ensure_ascii=False), reply, [p['reply_to_message_id'] for p in truth if p['message_id'] == reply][0]))
if any(local_relations(d)[0] != server for d in (b_desktop, b_phone)):
    raise SystemExit('demo: the reaction views do not match fetch_messages')

print('\ndemo: done')
PYEOF
