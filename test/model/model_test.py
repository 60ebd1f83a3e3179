#!/usr/bin/python3
"""Model test of the device sync protocol (contract §5, §6, §11).

A client model keeps, per device, a local store: its generation, its
local_applied_sync_seq and its view (conversation -> msg_seq -> position,
plus the read cursor).  The store changes only by atomic commits: a whole
sync batch (every page) is applied to a copy and the copy replaces the store,
and only then is the batch ACKed.  A driver runs random operations against
the real SQL API -- sends, idempotent retries, recalls, edits, joins,
leaves, reads, deletions, partial fanout runs, partial syncs, crashes before
the ACK, lost and late ACKs, rollbacks of the local store to an older copy,
reinstalls, GC -- and at the end, after a final fanout and a full sync of
every device, every device's view must equal, position for position, what
fetch_messages returns to its user for every conversation in
conversation_list (and the read cursors must agree).

Along the way it checks what a client can check about each batch: events in
sync_seq order, gap-free and exactly covering (resume_from, watermark]; a
position (conversation, msg_seq) never changes identity; snapshot digests
recomputed locally match; the server ACK never moves backwards.

    model_test.py [--seed N ...] [--random-seeds N] [--steps N] [--dsn DSN]

Against a router (sharding; IM_SHARDS_DIR set by test/harness/shards.sh) every
figure comes through the API: session settings go to every node through
`test/harness/shards.sh set` (they do not cross PL/Proxy), and the few reads of
tables a single node allows are API calls there (ROUTER below).

Without --seed it runs a fixed set of seeds, the pinned (seed, steps) runs
of PINNED_RUNS, plus one random seed (printed); --random-seeds N runs N
random seeds instead (all printed first).  Through a router the driver also
deletes for a member right after a send (op_send_delete), preferably one
placed on another node than the conversation.  The long run through the
router (the 70-shards suite runs the fixed seeds only):

    IM_SHARDS_DIR=<dir> IM_MODEL_DSN=<router dsn> \
        model_test.py --random-seeds 50 --steps 200
"""

import argparse
import copy
import decimal
import hashlib
import json
import os
import random
import subprocess
import sys
import time

import psycopg2
import psycopg2.extensions
import psycopg2.extras

# Sharding: the DSN names a router; no node's table is read, settings are per node.
SHARDS_DIR = os.environ.get('IM_SHARDS_DIR')
ROUTER = bool(SHARDS_DIR)
SHARDS_SH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'harness', 'shards.sh')


# settings changed on the nodes (they persist there, unlike SET): reset at exit
NODE_SETTINGS = set()


def reset_node_settings():
    for name in sorted(NODE_SETTINGS):
        subprocess.run(['bash', SHARDS_SH, 'reset', name], check=True, stdout=subprocess.DEVNULL)
    NODE_SETTINGS.clear()


def set_setting(conn, name, value):
    """SET name = value for conn's session; on a router, on every node
    (test/harness/shards.sh set), since session settings do not reach the nodes."""
    if ROUTER:
        subprocess.run(['bash', SHARDS_SH, 'set', name, value], check=True, stdout=subprocess.DEVNULL)
        NODE_SETTINGS.add(name)
        return
    with conn.cursor() as cur:
        cur.execute("SET %s = %%s" % name, (value,))

FIXED_SEEDS = [1, 2, 3, 4, 5, 6]
# Random seeds that once found a bug, pinned at the step count that found it
# (seed, steps): 71294 at 200 steps, a shared_log leaver whose edits arrived
# before the target and an older edit then overwrote the newer fetched body.
PINNED_RUNS = [(71294, 200)]
N_USERS = 5
DEVICES = ("phone", "desktop")

# jsonb numbers as Decimal so digests can be recomputed without float noise.
psycopg2.extras.register_default_jsonb(
    loads=lambda s: json.loads(s, parse_float=decimal.Decimal), globally=True)


class ModelFailure(Exception):
    pass


def check(cond, msg, *args):
    if not cond:
        raise ModelFailure(msg % args if args else msg)


# ---------------------------------------------------------------- digests

def _jstr(s):
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == '\\':
            out.append('\\\\')
        elif ch == '\b':
            out.append('\\b')
        elif ch == '\f':
            out.append('\\f')
        elif ch == '\n':
            out.append('\\n')
        elif ch == '\r':
            out.append('\\r')
        elif ch == '\t':
            out.append('\\t')
        elif o < 0x20:
            out.append('\\u%04x' % o)
        else:
            out.append(ch)
    out.append('"')
    return ''.join(out)


def jsonb_text(v):
    """The text PostgreSQL prints for a jsonb value (jsonb::text): object
    keys shorter first, then bytewise; ", " and ": " separators."""
    if v is None:
        return 'null'
    if v is True:
        return 'true'
    if v is False:
        return 'false'
    if isinstance(v, (int, decimal.Decimal)):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return _jstr(v)
    if isinstance(v, list):
        return '[' + ', '.join(jsonb_text(x) for x in v) + ']'
    if isinstance(v, dict):
        keys = sorted(v, key=lambda k: (len(k.encode()), k.encode()))
        return '{' + ', '.join('%s: %s' % (_jstr(k), jsonb_text(v[k])) for k in keys) + '}'
    raise TypeError(type(v))


def sha256_hex(text):
    return hashlib.sha256(text.encode('utf-8')).hexdigest()


# ------------------------------------------------------------ local store

POS_KEYS = ('kind', 'conversation_id', 'msg_seq', 'message_id', 'sender_id',
            'content_type', 'body', 'target_message_id', 'recalled', 'created_at',
            'taken_down', 'erased')
# Contract §14 (reactions, pins, replies): a message also carries reply_to_message_id; in
# fetch_messages it carries its reactions as the reader sees them.
REPLY_KEY = 'reply_to_message_id'
VIEW_KEYS = ('reactions', 'my_reactions')
REACTION_KEYS = ('👍', '❤', '🎉', 'ok')


def pos_keys(kind):
    """The keys of a position of this kind (contract §11, §14, §17, §18)."""
    return POS_KEYS + (REPLY_KEY,) if kind == 'message' else POS_KEYS


def hides_with_target(kind):
    """Kinds hidden with their target when it is deleted for the user
    (contract §1): a pin names its target only in its body, so never."""
    return kind in ('recall', 'edit', 'reaction', 'takedown')


class Conv:
    def __init__(self):
        self.pos = {}          # msg_seq -> position dict (contract §11 keys)
        self.read = 0          # read_msg_seq as the device knows it
        self.edit_seq = {}     # target message_id -> newest edit msg_seq its body reflects (apply_position)
        self.deleted = set()   # message ids deleted for this user
        # shared_log mode (design §10.3): the device's saved position in the
        # shared log -- every visible position <= fetched was read through
        # fetch_messages (or a snapshot).  Per DEVICE: the dirty marker is per
        # user, so another device's clear says nothing about this one.
        self.fetched = 0

    def by_id(self, mid):
        for p in self.pos.values():
            if p['message_id'] == mid:
                return p
        return None


class Store:
    """What survives a client crash: the last committed local state."""

    def __init__(self):
        self.gen = None        # generation the store was built in (None: fresh install)
        self.applied = 0       # local_applied_sync_seq
        self.convs = {}
        self.dirty = set()     # conversations with a conversation_dirty event not yet handled
        self.receipts = {}     # (conversation, message_id or 0) -> the newest receipt event (contract §20)

    def copy(self):
        return copy.deepcopy(self)


def apply_position(st, p, floor=0):
    """Apply one conversation position (from a sync batch or from
    fetch_messages) to a store.  Re-applying is harmless.

    Edits (design §12.5): applied by target in server (msg_seq) order, so a
    late or replayed edit never overwrites a newer body.  c.edit_seq[target]
    is the msg_seq of the newest edit the target's body is known to reflect.
    It is recorded even while the target itself is not in the store (in a
    shared_log group the edit arrives as an inbox event, the target only
    later through fetch_messages).  A message's body as the server returns it
    is current (every committed edit applied) but does not say which edit it
    reflects: floor, when given, is a msg_seq of the same conversation that
    the same statement returned, so every edit at or below it was committed
    before that read and is already in the body."""
    c = st.convs.setdefault(p['conversation_id'], Conv())
    pos = {k: p.get(k) for k in pos_keys(p['kind'])}
    for k in pos_keys(p['kind']):
        check(k in p, 'position lacks key %s: %r', k, p)
    if pos['message_id'] in c.deleted or (hides_with_target(pos['kind']) and pos['target_message_id'] in c.deleted):
        # Deleted for me: the message, and (as fetch_messages does) its
        # recalls and edits, which would bring its text back.
        return
    old = c.pos.get(pos['msg_seq'])
    check(old is None or (old['message_id'] == pos['message_id'] and old['kind'] == pos['kind']),
          'position %s/%s changed identity: had %r, got %r',
          pos['conversation_id'], pos['msg_seq'], old, pos)
    if old is not None and old['recalled'] and not pos['recalled']:
        # A fresher copy can never un-recall; keep the tombstone.
        pos['body'] = None
        pos['recalled'] = True
    if old is not None and old['taken_down'] and not pos['taken_down']:
        pos['body'] = None        # nor undo a takedown (contract §17)
        pos['taken_down'] = True
    c.pos[pos['msg_seq']] = pos
    kind = pos['kind']
    if kind == 'message' and floor:
        c.edit_seq[pos['message_id']] = max(c.edit_seq.get(pos['message_id'], 0), floor)
    if kind in ('recall', 'takedown'):
        # a takedown (contract §17) tombstones as a recall does, shown as
        # taken_down instead of recalled
        flag = 'recalled' if kind == 'recall' else 'taken_down'
        t = c.by_id(pos['target_message_id'])
        if t is not None:
            t['body'] = None
            t[flag] = True
        for q in c.pos.values():
            # a recall tombstones the target's edits and reactions (contract §14)
            if q['kind'] in ('edit', 'reaction') and q['target_message_id'] == pos['target_message_id']:
                q['body'] = None
                q[flag] = True
    elif kind == 'edit':
        t = c.by_id(pos['target_message_id'])
        if pos['recalled'] or pos['taken_down']:
            if t is not None:
                t['body'] = None
                t['recalled' if pos['recalled'] else 'taken_down'] = True
        elif pos['msg_seq'] > c.edit_seq.get(pos['target_message_id'], 0):
            c.edit_seq[pos['target_message_id']] = pos['msg_seq']
            if t is not None and not gone(t):
                t['body'] = pos['body']
        tomb_like(pos, t)
    elif kind == 'reaction':
        # full state per (sender, target): nothing to merge, the view takes
        # the latest position (reaction_view); a recalled target keeps none
        tomb_like(pos, c.by_id(pos['target_message_id']))


def gone(p):
    """A tombstone: recalled, or taken down by a moderator (contract §17)."""
    return bool(p['recalled'] or p['taken_down'])


def tomb_like(pos, t):
    """An edit or reaction of a tombstoned target is a tombstone of the
    same kind."""
    if t is not None and gone(t):
        pos['body'] = None
        pos['recalled' if t['recalled'] else 'taken_down'] = True


def reaction_view(conv, mid, user):
    """A device's local view of a message's reactions (contract §14): per
    reacting user its latest reaction position's set, counted per key."""
    latest = {}
    for s in sorted(conv.pos):
        p = conv.pos[s]
        if p['kind'] == 'reaction' and p['target_message_id'] == mid:
            latest[p['sender_id']] = (p['body'] or {}).get('reactions', [])
    counts = {}
    for keys in latest.values():
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
    return counts, latest.get(user, [])


def pin_view(conv):
    """A device's local pin list: the body of its latest pin position."""
    pins = [conv.pos[s] for s in sorted(conv.pos) if conv.pos[s]['kind'] == 'pin']
    return pins[-1]['body']['pinned'] if pins else []


def apply_event(st, ev):
    kind = ev['kind']
    if kind == 'read_cursor':
        c = st.convs.setdefault(ev['conversation_id'], Conv())
        c.read = max(c.read, ev['read_msg_seq'])
    elif kind == 'delete_for_me':
        c = st.convs.setdefault(ev['conversation_id'], Conv())
        mid = ev['message_id']
        c.deleted.add(mid)
        for s in [s for s, p in c.pos.items()
                  if p['message_id'] == mid or (hides_with_target(p['kind']) and p['target_message_id'] == mid)]:
            del c.pos[s]
    elif kind == 'receipt':
        keys = set(ev) - {'sync_seq', 'kind', 'conversation_id'}
        check(keys in ({'delivered_through_seq', 'read_through_seq'},
                       {'message_id', 'delivered_count', 'read_count', 'member_count'}),
              'receipt keys %s (contract §20)', sorted(ev))
        st.receipts[(ev['conversation_id'], ev.get('message_id', 0))] = ev
    elif kind == 'conversation_dirty':
        check(set(ev) == {'sync_seq', 'kind', 'conversation_id', 'dirty_target_msg_seq', 'dirty_version'},
              'conversation_dirty keys %s (contract §11)', sorted(ev))
        check(ev['dirty_target_msg_seq'] > 0 and ev['dirty_version'] > 0, 'empty conversation_dirty: %r', ev)
        # Level-triggered: the event only says "look"; what to fetch comes
        # from the authoritative marker (conversation_list) at catch-up.
        st.convs.setdefault(ev['conversation_id'], Conv())
        st.dirty.add(ev['conversation_id'])
    else:
        check(set(ev) == set(pos_keys(ev['kind'])) | {'sync_seq'}, 'event keys %s (contract §11)', sorted(ev))
        apply_position(st, ev)


# ------------------------------------------------------------------ driver

class Device:
    def __init__(self, user, name):
        self.user = user
        self.name = name
        self.store = Store()       # committed local state
        self.saved = []            # older copies of the store (for rollbacks)
        self.last_token = None     # an old batch token, for late ACKs


class Model:
    def __init__(self, dsn, seed, steps, verbose=False, skip=()):
        self.skip = set(skip)
        self.seed = seed
        self.rng = random.Random(seed)
        self.steps = steps
        self.verbose = verbose
        self.dsn = dsn
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.gc_conn = psycopg2.connect(dsn)
        self.gc_conn.autocommit = True
        self.trace = []
        self.counts = {}
        self.users = list(range(seed * 100 + 1, seed * 100 + 1 + N_USERS))
        self.devices = [Device(u, d) for u in self.users for d in DEVICES]
        self.members = {}          # conversation -> set of active members (driver's truth)
        # contract §17, the driver's truth of roles: a group's owner, its
        # admins, its active members in the order they joined (successor rule)
        self.owner = {}
        self.admins = {}
        self.join_order = {}
        # moderation draws from its own stream, so the other operations'
        # choices stay those of the seed until a moderation changes a member
        self.mrng = random.Random(seed * 7 + 29)
        self.kind = {}             # conversation -> 'direct' | 'group'
        self.sent = []             # [conv, sender, message_id, recalled]
        self.ckey = 0
        self.max_ack = {}          # (user, device) -> highest server ACK seen
        # A small replay limit sometimes, so rollbacks also end in snapshots.
        self.max_replay = self.rng.choice([3, 10, 1000, 1000])
        # Sometimes a join that reaches 4 active members switches the group
        # to shared_log (contract §2); mode switches also happen at random.
        self.min_members = self.rng.choice([0, 0, 4])
        set_setting(self.conn, 'im_sync.recovery_max_replay', str(self.max_replay))
        set_setting(self.conn, 'im_sync.shared_log_min_members', str(self.min_members))
        if not ROUTER:
            # receipts at every producer run, so the final check sees the last facts
            set_setting(self.conn, 'im_sync.receipt_interval', '0')

    # ---- plumbing
    def count(self, what, n=1):
        self.counts[what] = self.counts.get(what, 0) + n

    def note(self, text):
        self.trace.append(text)
        if len(self.trace) > 60:
            del self.trace[:20]
        if self.verbose:
            print('   ', text)

    def q(self, sql, args=(), conn=None):
        with (conn or self.conn).cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None

    def q1(self, sql, args=(), conn=None):
        rows = self.q(sql, args, conn)
        check(len(rows) == 1, 'expected one row from %s, got %d', sql, len(rows))
        return rows[0]

    def key(self):
        self.ckey += 1
        return 'm%d-%d' % (self.seed, self.ckey)

    def server_ack(self, dev):
        # device_session reads the device row (the epoch only decides `current`)
        r = self.q1("SELECT server_acked_sync_seq AS acked_sync_seq, sync_generation, state "
                    "FROM im.device_session(%s, %s, 0)", (dev.user, dev.name))
        k = (dev.user, dev.name)
        check(r['acked_sync_seq'] >= self.max_ack.get(k, 0),
              'server ACK of %s/%s moved backwards: %s -> %s', dev.user, dev.name,
              self.max_ack.get(k), r['acked_sync_seq'])
        self.max_ack[k] = r['acked_sync_seq']
        return r

    # ---- setup
    def setup(self):
        for d in self.devices:
            r = self.q1("SELECT * FROM im.register_device(%s, %s)", (d.user, d.name))
            check(r['state'] == 'NEW', 'fresh device not NEW: %r', r)
        u = self.users
        for a, b in ((u[0], u[1]), (u[1], u[2]), (u[0], u[3])):
            c = self.q1("SELECT im.direct_conversation(%s, %s) AS c", (a, b))['c']
            self.members[c] = {a, b}
            self.kind[c] = 'direct'
        for members in ((u[0], u[1], u[2]), (u[2], u[3], u[4])):
            c = self.q1("SELECT im.create_conversation('group', %s) AS c", (list(members),))['c']
            self.members[c] = set(members)
            self.kind[c] = 'group'
            # no creator: the first member (lowest user id) owns it
            self.owner[c] = min(members)
            self.admins[c] = set()
            self.join_order[c] = sorted(members)

    # ---- server-side operations
    def op_send(self, c=None):
        if c is None:
            c = self.rng.choice(sorted(self.members))
            if not self.members[c]:
                return self.op_join()
        elif not self.members[c]:
            return
        s = self.rng.choice(sorted(self.members[c]))
        k = self.key()
        body = {'text': 'msg %s from %d' % (k, s), 'n': self.ckey}
        if self.rng.random() < 0.1:
            body['text'] += ' "quoted" \\ tab\t ü'
        # replies: sometimes a reply to a live message the sender may see
        reply = None
        if self.rng.random() < 0.2:
            targets = self.visible_live(s, c)
            reply = self.rng.choice(targets) if targets else None
        r = self.q1("SELECT * FROM im.send_message(%s, %s, %s, %s, 'text', %s)",
                    (s, c, k, psycopg2.extras.Json(body), reply))
        check(r['created'], 'first send not created: %r', r)
        if reply:
            self.count('op.reply')
        if self.rng.random() < 0.15:   # the response was lost: retry the same key
            r2 = self.q1("SELECT * FROM im.send_message(%s, %s, %s, %s, 'text', %s)",
                         (s, c, k, psycopg2.extras.Json(body), reply))
            check(not r2['created'] and r2['message_id'] == r['message_id']
                  and r2['msg_seq'] == r['msg_seq'], 'retry not idempotent: %r vs %r', r, r2)
            self.count('op.send_retry')
        self.sent.append([c, s, r['message_id'], False])
        self.note('send u%d c%d -> seq %d' % (s, c, r['msg_seq']))
        self.count('op.send')

    def visible_live(self, u, c, recalled=False):
        """Live (or recalled) messages of c inside one of u's periods (sorted ids).
        On a router through fetch_messages, which leaves out what u deleted
        for itself: a narrower set of targets, each one valid."""
        if ROUTER:
            return sorted(p['message_id'] for p in self.fetch_all(u, c)
                          if p['kind'] == 'message' and gone(p) == recalled)
        return [r['message_id'] for r in self.q(
            "SELECT e.message_id FROM im.event e WHERE e.conversation_id = %s AND e.kind = 'message' "
            "AND e.recalled = %s AND EXISTS (SELECT 1 FROM im.membership_period p WHERE p.conversation_id = %s "
            "AND p.user_id = %s AND p.join_seq <= e.msg_seq AND (p.leave_seq IS NULL OR p.leave_seq >= e.msg_seq)) "
            "ORDER BY 1", (c, recalled, c, u))]

    def op_react(self):
        """Reactions: set or clear a key of a member's reactions; sometimes
        on a recalled message (IS409, nothing written)."""
        c = self.rng.choice(sorted(self.members))
        if not self.members[c]:
            return self.op_join()
        u = self.rng.choice(sorted(self.members[c]))
        dead = self.visible_live(u, c, recalled=True)
        if dead and self.rng.random() < 0.05:
            try:
                self.q("SELECT * FROM im.react(%s, %s, %s, 'x', true, %s)", (u, c, self.rng.choice(dead), self.key()))
                raise ModelFailure('react on a recalled message was accepted')
            except psycopg2.Error as e:
                check(e.pgcode == 'IS409', 'react on a recalled message: %s %s', e.pgcode, e)
            self.count('op.react_refused')
            return
        targets = self.visible_live(u, c)
        if not targets:
            return self.op_send(c)
        mid = self.rng.choice(targets)
        key, present = self.rng.choice(REACTION_KEYS), self.rng.random() < 0.7
        k = self.key()
        r = self.q1("SELECT * FROM im.react(%s, %s, %s, %s, %s, %s)", (u, c, mid, key, present, k))
        check(r['created'], 'react not created: %r', r)
        if self.rng.random() < 0.1:    # a lost response: the retry returns the same position
            r2 = self.q1("SELECT * FROM im.react(%s, %s, %s, %s, %s, %s)", (u, c, mid, key, present, k))
            check(not r2['created'] and r2['msg_seq'] == r['msg_seq'], 'react retry: %r vs %r', r, r2)
        self.note('react u%d c%d msg %d %s %s -> seq %d' % (u, c, mid, key, present, r['msg_seq']))
        self.count('op.react' if present else 'op.unreact')

    def op_pin(self):
        """Pins: pin or unpin a live message for the conversation."""
        c = self.rng.choice(sorted(self.members))
        if not self.members[c]:
            return self.op_join()
        u = self.rng.choice(sorted(self.members[c]))
        targets = self.visible_live(u, c)
        if not targets:
            return self.op_send(c)
        mid, pinned = self.rng.choice(targets), self.rng.random() < 0.6
        r = self.q1("SELECT * FROM im.pin_message(%s, %s, %s, %s, %s)", (u, c, mid, pinned, self.key()))
        check(r['created'], 'pin not created: %r', r)
        self.note('pin u%d c%d msg %d %s -> seq %d' % (u, c, mid, pinned, r['msg_seq']))
        self.count('op.pin' if pinned else 'op.unpin')

    def _own_live(self):
        live = [m for m in self.sent if not m[3] and m[1] in self.members[m[0]]]
        return self.rng.choice(live) if live else None

    def op_recall(self):
        m = self._own_live()
        if m is None:
            return self.op_send()
        c, s, mid, _ = m
        r = self.q1("SELECT * FROM im.recall_message(%s, %s, %s, %s)", (s, c, self.key(), mid))
        check(r['created'], 'recall not created: %r', r)
        m[3] = True
        self.note('recall u%d c%d msg %d -> seq %d' % (s, c, mid, r['msg_seq']))
        self.count('op.recall')

    def op_takedown(self):
        """A moderator takes down any live message (contract §17); a lost
        response's retry answers the original; the sender can no longer
        recall or edit it."""
        live = [m for m in self.sent if not m[3]]
        if not live:
            return self.op_send()
        m = self.rng.choice(live)
        c, s, mid, _ = m
        k = self.key()
        r = self.q1("SELECT * FROM im.takedown_message('model-mod', %s, %s, 'spam', %s)", (c, mid, k))
        check(r['created'], 'takedown not created: %r', r)
        if self.rng.random() < 0.2:
            r2 = self.q1("SELECT * FROM im.takedown_message('model-mod', %s, %s, 'spam', %s)", (c, mid, k))
            check(not r2['created'] and r2['msg_seq'] == r['msg_seq'], 'takedown retry: %r vs %r', r, r2)
        m[3] = True
        self.note('takedown c%d msg %d -> seq %d' % (c, mid, r['msg_seq']))
        self.count('op.takedown')

    def op_edit(self):
        m = self._own_live()
        if m is None:
            return self.op_send()
        c, s, mid, _ = m
        body = {'text': 'edited %d at %d' % (mid, self.ckey + 1)}
        r = self.q1("SELECT * FROM im.edit_message(%s, %s, %s, %s, %s)",
                    (s, c, self.key(), mid, psycopg2.extras.Json(body)))
        check(r['created'], 'edit not created: %r', r)
        self.note('edit u%d c%d msg %d -> seq %d' % (s, c, mid, r['msg_seq']))
        self.count('op.edit')

    def op_join(self):
        groups = [c for c in sorted(self.members) if self.kind[c] == 'group']
        c = self.rng.choice(groups)
        outside = [u for u in self.users if u not in self.members[c]]
        if not outside:
            return self.op_leave()
        u = self.rng.choice(outside)
        before = self.mode(c)
        r = self.q1("SELECT * FROM im.join_conversation(%s, %s)", (c, u))
        check(r['created'], 'join of a non-member not created: %r', r)
        after = self.mode(c)
        n = len(self.members[c]) + 1
        want = 'shared_log' if self.min_members and n >= self.min_members else before
        check(after == want, 'join of c%d to %d active members (shared_log_min_members=%d): mode %s -> %s',
              c, n, self.min_members, before, after)
        if after != before:
            self.note('  join switched c%d to %s' % (c, after))
            self.count('switch.auto')
        self.members[c].add(u)
        self.join_order[c].append(u)
        if self.owner[c] is None:
            self.owner[c] = u       # the first to join an empty group owns it
        self.note('join u%d c%d period %d at %d' % (u, c, r['membership_period_id'], r['join_seq']))
        self.count('op.join')

    def mode(self, c):
        if not ROUTER:
            return self.q1("SELECT mode FROM im.conversation WHERE conversation_id = %s", (c,))['mode']
        # the users' nodes hold a copy: drained first, then read through a user who has it
        self.q("SELECT im.run_fanout()")
        for u in sorted(self.members[c]) + self.users:
            for cl in self.conv_list(u):
                if cl['conversation_id'] == c:
                    return cl['mode']
        raise ModelFailure('conversation %d in nobody\'s conversation_list' % c)

    def fetch_all(self, u, c):
        """Every position of c that fetch_messages returns to u."""
        pos, after_seq = [], 0
        while True:
            m = self.q1("SELECT * FROM im.fetch_messages(%s, %s, %s, %s)", (u, c, after_seq, 50))
            pos.extend(m['messages'])
            if not m['has_more']:
                return pos
            after_seq = m['next_after_seq']

    def op_mode(self):
        """set_conversation_mode in the middle of traffic, both directions
        (sometimes the mode already in force: a no-op)."""
        # Through a router the mode is read through a member's copy (mode()):
        # a group nobody is in any more has no recipient, so no node but its
        # own learns of a switch, and an ex-member's copy keeps the mode of
        # its leave.  Such groups are switched on one node only.
        groups = [c for c in sorted(self.members) if self.kind[c] == 'group' and (self.members[c] or not ROUTER)]
        if not groups:
            return self.op_join()
        c = self.rng.choice(groups)
        before = self.mode(c)
        want = before if self.rng.random() < 0.15 else {'fanout': 'shared_log', 'shared_log': 'fanout'}[before]
        r = self.q1("SELECT im.set_conversation_mode(%s, %s) AS m", (c, want))
        check(r['m'] == want and self.mode(c) == want, 'set_conversation_mode(%d, %s) -> %r', c, want, r)
        self.note('mode c%d %s -> %s' % (c, before, want))
        self.count('op.mode')
        self.count('switch.noop' if want == before else 'switch.to_' + want)

    def op_open(self):
        """The user opens the app / a conversation without any hint: the
        slow path reads the authoritative markers and heads."""
        d = self.rng.choice(self.devices)
        self.count('op.open')
        self.catch_up(d, faults=True)

    def op_leave(self):
        groups = [c for c in sorted(self.members) if self.kind[c] == 'group' and self.members[c]]
        if not groups:
            return self.op_join()
        c = self.rng.choice(groups)
        u = self.rng.choice(sorted(self.members[c]))
        r = self.q1("SELECT * FROM im.leave_conversation(%s, %s)", (c, u))
        self.members[c].discard(u)
        self.forget_member(c, u)
        self.note('leave u%d c%d leave_seq %d' % (u, c, r['leave_seq']))
        self.count('op.leave')

    def forget_member(self, c, u):
        """u's period in c ended: its role goes; the owner's successor is the
        longest-serving admin, else the longest-serving member (contract §17)."""
        self.join_order[c].remove(u)
        self.admins[c].discard(u)
        if self.owner[c] == u:
            order = self.join_order[c]
            admins = [x for x in order if x in self.admins[c]]
            self.owner[c] = (admins or order or [None])[0]
            self.admins[c].discard(self.owner[c])
            self.count('role.successor')

    def api_error(self, sql, args):
        """The SQLSTATE of a call that must fail (nothing written)."""
        try:
            self.q(sql, args)
        except psycopg2.Error as e:
            return e.pgcode
        raise ModelFailure('%s %r succeeded' % (sql, args))

    def op_moderate(self):
        """Roles, mutes, removals (contract §17) by the group's owner: a role
        change (sometimes the handover), a mute (the muted member's send is
        IS403 and writes nothing) lifted again, a removal (with a ban: a
        join is 42501 until unban_member).  Each is a position that every
        member's device must end up with, as fetch_messages shows it."""
        rng = self.mrng
        groups = [c for c in sorted(self.members)
                  if self.kind[c] == 'group' and self.owner.get(c) in self.members[c] and len(self.members[c]) > 1]
        if not groups:
            return
        c = rng.choice(groups)
        o = self.owner[c]
        t = rng.choice(sorted(self.members[c] - {o}))
        what = rng.choice(['role', 'role', 'handover', 'mute', 'remove'])
        k = self.key()
        if what in ('role', 'handover'):
            role = 'owner' if what == 'handover' else rng.choice(['admin', 'member'])
            r = self.q1("SELECT * FROM im.set_member_role(%s, %s, %s, %s, %s)", (o, c, t, role, k))
            check(r['created'], 'set_member_role not created: %r', r)
            if rng.random() < 0.3:
                r2 = self.q1("SELECT * FROM im.set_member_role(%s, %s, %s, %s, %s)", (o, c, t, role, k))
                check(not r2['created'] and r2['message_id'] == r['message_id'], 'role retry: %r vs %r', r, r2)
            if role == 'owner':
                self.owner[c] = t
                self.admins[c].discard(t)
                self.admins[c].add(o)
            elif role == 'admin':
                self.admins[c].add(t)
            else:
                self.admins[c].discard(t)
            self.note('role c%d u%d %s by u%d -> seq %d' % (c, t, role, o, r['msg_seq']))
        elif what == 'mute':
            r = self.q1("SELECT * FROM im.mute_member(%s, %s, %s, 'infinity', %s)", (o, c, t, k))
            check(r['created'], 'mute not created: %r', r)
            code = self.api_error("SELECT * FROM im.send_message(%s, %s, %s, '{\"text\": \"muted\"}')",
                                  (t, c, self.key()))
            check(code == 'IS403', 'a muted member sent: %s', code)
            r = self.q1("SELECT * FROM im.mute_member(%s, %s, %s, NULL, %s)", (o, c, t, self.key()))
            check(r['created'], 'unmute not created: %r', r)
            self.note('mute c%d u%d by u%d, refused send, unmuted at %d' % (c, t, o, r['msg_seq']))
        else:
            ban = rng.random() < 0.5
            r = self.q1("SELECT * FROM im.remove_member(%s, %s, %s, %s, %s)", (o, c, t, ban, k))
            check(r['created'], 'remove not created: %r', r)
            self.members[c].discard(t)
            self.forget_member(c, t)
            if ban:
                code = self.api_error("SELECT * FROM im.join_conversation(%s, %s)", (c, t))
                check(code == '42501', 'a banned user joined: %s', code)
                r2 = self.q1("SELECT * FROM im.unban_member(%s, %s, %s)", (o, c, t))
                check(r2['unbanned'], 'unban found no ban: %r', r2)
            self.note('remove c%d u%d by u%d ban %s -> seq %d' % (c, t, o, ban, r['msg_seq']))
        self.count('op.moderate.' + what)

    def op_read(self):
        d = self.rng.choice(self.devices)
        convs = [c for c, v in d.store.convs.items() if v.pos]
        if not convs:
            return
        c = self.rng.choice(sorted(convs))
        upto = max(d.store.convs[c].pos)
        r = self.q1("SELECT * FROM im.report_read(%s, %s, %s)", (d.user, c, upto))
        check(r['read_msg_seq'] >= 0 and r['unread_count'] >= 0, 'bad report_read: %r', r)
        self.note('read u%d c%d to %d -> %r' % (d.user, c, upto, dict(r)))
        self.count('op.read')

    def op_delete(self):
        d = self.rng.choice(self.devices)
        cands = [(c, p['message_id']) for c, v in sorted(d.store.convs.items())
                 for p in v.pos.values() if p['kind'] == 'message']
        if not cands:
            return
        c, mid = self.rng.choice(cands)
        r = self.q1("SELECT im.delete_for_me(%s, %s, %s) AS d", (d.user, c, mid))
        self.note('delete_for_me u%d c%d msg %d -> %s' % (d.user, c, mid, r['d']))
        self.count('op.delete_for_me')

    def node_of(self, id_):
        """Through a router: the node owning id's bucket (its map is readable)."""
        if not hasattr(self, '_buckets'):
            self._buckets = {r['bucket']: r['node_name'] for r in
                             self.q("SELECT bucket, node_name FROM im_router.bucket")}
        return self._buckets[id_ % 64]

    def op_send_delete(self):
        """Through a router: a send, then at once delete_for_me of it for
        another member — one placed on another node than the conversation
        when there is one, whose node may hold no copy of the message (nor
        of the conversation) yet.  The deletion must reach that user's
        devices as it reaches fetch_messages."""
        cands = [c for c in sorted(self.members) if len(self.members[c]) >= 2]
        if not cands:
            return self.op_send()
        c = self.rng.choice(cands)
        self.op_send(c)
        s, mid = self.sent[-1][1], self.sent[-1][2]
        others = sorted(self.members[c] - {s})
        far = [u for u in others if self.node_of(u) != self.node_of(c)]
        u = self.rng.choice(far or others)
        r = self.q1("SELECT im.delete_for_me(%s, %s, %s) AS d", (u, c, mid))
        check(r['d'], 'delete_for_me right after the send did not delete: %r', r)
        self.note('delete_for_me u%d c%d msg %d right after the send%s -> %s' % (
            u, c, mid, ' (user on another node)' if far else '', r['d']))
        self.count('op.send_delete_far' if far else 'op.send_delete')

    def op_fanout(self):
        n = self.rng.choice([1, 2, 3, 5, 10000])
        if not ROUTER and self.rng.random() < 0.5:
            # the receipt producer, as a worker batch runs it before fanout
            self.note('run_receipts() -> %d' % self.q1("SELECT im.run_receipts() AS n")['n'])
        r = self.q1("SELECT im.run_fanout(%s) AS n", (n,))
        self.note('run_fanout(%d) -> %d' % (n, r['n']))
        self.count('op.fanout')

    def op_gc(self, aggressive=None):
        if 'gc' in self.skip:
            return
        if aggressive is None:
            aggressive = self.rng.random() < 0.3
        set_setting(self.gc_conn, 'im_sync.inbox_retention', '0')
        # Aggressive: no device counts as recently seen, so only recovery
        # sessions and snapshots hold the fence; devices left behind
        # must get RESET_REQUIRED, never a gap.
        set_setting(self.gc_conn, 'im_sync.device_inactive_after', '0' if aggressive else '30d')
        if ROUTER:
            # a router session keeps its node connections, which read the
            # role settings once: a fresh session sees the new ones
            self.gc_conn.close()
            self.gc_conn = psycopg2.connect(self.dsn)
            self.gc_conn.autocommit = True
        rows = self.q("SELECT * FROM im.gc_inbox()", conn=self.gc_conn)
        deleted = sum(r['deleted'] for r in rows)
        self.note('gc_inbox(aggressive=%s) deleted %d' % (aggressive, deleted))
        self.count('op.gc_aggressive' if aggressive else 'op.gc')
        self.count('gc.deleted', deleted)

    # ---- client-side operations
    def op_sync(self, d=None, faults=True):
        d = d or self.rng.choice(self.devices)
        if faults and self.rng.random() < 0.4:
            d.saved.append(d.store.copy())
            d.saved = d.saved[-4:]
        self.sync(d, faults)

    def op_rollback(self):
        d = self.rng.choice(self.devices)
        if not d.saved:
            return
        # Mostly a recent copy (replayable), sometimes an old one.
        d.store = (d.saved[-1] if self.rng.random() < 0.7 else self.rng.choice(d.saved)).copy()
        self.note('rollback %d/%s to gen %s applied %d' % (d.user, d.name, d.store.gen, d.store.applied))
        self.count('op.rollback')
        self.sync(d, faults=False)

    def op_reinstall(self):
        d = self.rng.choice(self.devices)
        d.store = Store()
        d.saved = []
        self.note('reinstall %d/%s' % (d.user, d.name))
        self.count('op.reinstall')
        if self.rng.random() < 0.5:
            self.snapshot(d, faults=False)   # a fresh install may go straight to a snapshot
        self.sync(d, faults=False)

    def op_late_ack(self):
        d = self.rng.choice(self.devices)
        if d.last_token is None:
            return
        tok, seq = d.last_token
        before = self.server_ack(d)
        r = self.q1("SELECT * FROM im.ack_sync(%s, %s, %s, %s)", (d.user, d.name, tok, seq))
        check(r['status'] in ('OK', 'STALE_GENERATION', 'RESET_REQUIRED'),
              'late ACK got %r', r)
        after = self.server_ack(d)
        check(after['acked_sync_seq'] == before['acked_sync_seq']
              or (r['status'] == 'OK' and after['acked_sync_seq'] <= seq),
              'late ACK moved the cursor: %r -> %r (%r)', dict(before), dict(after), dict(r))
        self.note('late ack %d/%s %d -> %s' % (d.user, d.name, seq, r['status']))
        self.count('ack.late.' + r['status'])

    # ---- the sync protocol
    def sync(self, d, faults=True, max_rounds=20):
        for _ in range(max_rounds):
            done = self.sync_round(d, faults)
            if done:
                if faults and self.rng.random() < 0.2:
                    # hints lost, app in the background: no catch-up now;
                    # the marker stays dirty (level-triggered) for later.
                    self.count('fault.no_catch_up')
                    if d.store.dirty and self.rng.random() < 0.5:
                        # ... and the app is killed: the event was ACKed but
                        # its handling lived only in memory.  Only the slow
                        # path (marker target vs saved position) recovers it.
                        d.store.dirty.clear()
                        self.count('fault.dirty_event_lost')
                else:
                    self.catch_up(d, faults, only_events=faults and self.rng.random() < 0.5)
                return True
        raise ModelFailure('device %d/%s did not converge in %d rounds' % (d.user, d.name, max_rounds))

    def sync_round(self, d, faults):
        """One sync_changes batch.  True when nothing more is due."""
        st = d.store
        limit = self.rng.choice([1, 2, 3, 7, 200])
        r = self.q1("SELECT * FROM im.sync_changes(%s, %s, %s, %s, %s)",
                    (d.user, d.name, st.gen, st.applied, limit))
        status = r['status']
        self.count('sync.' + status)
        self.note('sync %d/%s gen %s la %d -> %s gen %s from %s hw %s user_hw %s' % (
            d.user, d.name, st.gen, st.applied, status, r['sync_generation'],
            r['resume_from'], r['batch_high_watermark'], r['user_high_watermark']))
        if status == 'RESET_REQUIRED':
            check(r['events'] == [] and r['batch_token'] is None and r['next_cursor'] is None
                  and not r['has_more'], 'RESET_REQUIRED carries data: %r', r)
            self.snapshot(d, faults)
            return False
        check(status in ('OK', 'RECOVERY'), 'unexpected sync status %r', r)
        if status == 'OK':
            check(r['sync_generation'] == st.gen, 'OK in another generation: %r', r)
            check(r['resume_from'] == r['server_acked_sync_seq'], 'OK batch not from the server ACK: %r', r)
        else:
            # A new session starts at la; the same session again (rule 4) at
            # its own resume_from, which is at or below la.
            check(r['resume_from'] <= st.applied, 'RECOVERY from above la %d: %r', st.applied, r)
        resume, hw, token = r['resume_from'], r['batch_high_watermark'], r['batch_token']
        check(resume <= hw <= r['user_high_watermark'], 'watermarks out of order: %r', r)
        events = list(r['events'])
        page = r
        pages = 1
        abort_at = self.rng.randint(1, 4) if faults and self.rng.random() < 0.1 else None
        while page['has_more']:
            if abort_at is not None and pages >= abort_at:
                self.note('  partial sync: stopped after %d pages' % pages)
                self.count('fault.partial_sync')
                return True
            if faults and self.rng.random() < 0.05:
                # GC between pages: the batch's range must survive it.  With
                # aggressive GC only a recovery session holds the fence.
                self.op_gc(aggressive=(status == 'RECOVERY' and self.rng.random() < 0.5))
            if faults and self.rng.random() < 0.05:
                self.op_send()
                self.op_fanout()
            page = self.q1("SELECT * FROM im.sync_changes(%s, %s, %s, %s, %s, %s)",
                           (d.user, d.name, None, None, limit, page['next_cursor']))
            pages += 1
            check(page['status'] == status and page['batch_token'] == token
                  and page['resume_from'] == resume and page['batch_high_watermark'] == hw,
                  'page disagrees with its batch: %r vs %r', dict(page), dict(r))
            events.extend(page['events'])
        self.count('sync.pages', pages)
        seqs = [e['sync_seq'] for e in events]
        check(seqs == sorted(set(seqs)) and all(resume < x <= hw for x in seqs),
              'batch (%d, %d] of %d/%s: events out of order or range: %s', resume, hw, d.user, d.name, seqs)
        missing = sorted(set(range(resume + 1, hw + 1)) - set(seqs))
        if missing and ROUTER:
            # No table to map a position to its message through the router:
            # a real gap shows in the final comparison with fetch_messages.
            self.count('sync.filtered_unchecked', len(missing))
        elif missing:
            # The only positions a batch may leave out are those deleted for
            # the user (contract §1); anything else is a gap.
            rows = self.q("SELECT i.sync_seq, EXISTS (SELECT 1 FROM im.deleted_for_me x "
                          "  WHERE x.user_id = i.user_id AND x.message_id IN (e.message_id, e.target_message_id)) AS del "
                          "FROM im.inbox i LEFT JOIN im.event e ON e.message_id = i.source_event_id "
                          "WHERE i.user_id = %s AND i.sync_seq = ANY(%s)", (d.user, missing))
            ok = {r['sync_seq'] for r in rows if r['del']}
            check(ok == set(missing), 'batch (%d, %d] of %d/%s has a gap: %s missing, not deleted for the user',
                  resume, hw, d.user, d.name, sorted(set(missing) - ok))
            self.count('sync.filtered_deleted', len(missing))
        # Per conversation, events come in msg_seq order.
        last = {}
        for e in events:
            if e.get('msg_seq') is not None and e['kind'] not in ('read_cursor', 'delete_for_me', 'conversation_dirty'):
                check(e['msg_seq'] > last.get(e['conversation_id'], 0),
                      'conversation %s out of msg_seq order in batch: %s', e['conversation_id'], events)
                last[e['conversation_id']] = e['msg_seq']
        # Apply atomically: build the new store on a copy.
        new = st.copy()
        for e in events:
            apply_event(new, e)
        new.gen = r['sync_generation']
        # After a lost ACK the batch may replay what we already hold.
        new.applied = max(hw, st.applied)
        if faults and self.rng.random() < 0.08:
            self.note('  crash before local commit')
            self.count('fault.crash_before_commit')
            return True
        d.store = new
        self.count('batches')
        self.count('events', len(events))
        self.count('dirty.events', sum(1 for e in events if e['kind'] == 'conversation_dirty'))
        if status == 'RECOVERY':
            self.count('recoveries')
        if faults and self.rng.random() < 0.08:
            self.note('  ACK lost')
            self.count('fault.ack_lost')
            d.last_token = (token, hw)
            return True
        a = self.q1("SELECT * FROM im.ack_sync(%s, %s, %s, %s)", (d.user, d.name, token, hw))
        check(a['status'] == 'OK', 'ACK of an applied batch refused: %r', a)
        check(a['acked_sync_seq'] >= hw, 'ACK %d answered %r', hw, a)
        if self.rng.random() < 0.3:
            d.last_token = (token, self.rng.randint(resume, hw))
        self.server_ack(d)
        return status == 'OK' and r['user_high_watermark'] <= new.applied

    # ---- shared_log catch-up (design §10.3)
    def conv_list(self, u, after=None, limit=None):
        convs = []
        while True:
            rows = self.q("SELECT * FROM im.conversation_list(%s, %s, %s)", (u, limit or 3, after))
            convs.extend(rows)
            if limit or len(rows) < 3:
                return convs
            after = rows[-1]['conversation_id']

    def fetch_range(self, u, st, c, after, upto):
        """Read (after, upto] through fetch_messages into the store."""
        while after < upto:
            m = self.q1("SELECT * FROM im.fetch_messages(%s, %s, %s, %s, %s)",
                        (u, c, after, self.rng.choice([2, 5, 100]), upto))
            # One statement, one snapshot: its bodies reflect every edit up
            # to the highest position it returned.
            floor = max([p['msg_seq'] for p in m['messages']] or [0])
            for p in m['messages']:
                check(set(p) == set(pos_keys(p['kind'])) | (set(VIEW_KEYS) if p['kind'] == 'message' else set()),
                      'fetch_messages keys %s (contract §11, §14)', sorted(p))
                check(after < p['msg_seq'] <= upto, 'fetch_messages out of range (%d, %d]: %r', after, upto, p)
                apply_position(st, p, floor)
            self.count('fetch_messages')
            if not m['has_more']:
                break
            check(m['next_after_seq'] > after, 'fetch_messages does not advance: %r', m)
            after = m['next_after_seq']

    def catch_up(self, d, faults=True, only_events=False):
        """After a sync: for every conversation whose authoritative dirty
        target is beyond this device's saved position, or that got a
        conversation_dirty event, fetch up to the target and clear the
        marker with the observed version.  only_events: the fast path (only
        conversations with an event); otherwise the slow path over the whole
        conversation_list."""
        for cl in self.conv_list(d.user):
            if only_events and cl['conversation_id'] not in d.store.dirty:
                continue
            self.catch_up_conv(d, cl, faults)

    def catch_up_conv(self, d, cl, faults):
        u, c, st = d.user, cl['conversation_id'], d.store
        for _ in range(20):
            target, version = cl['dirty_target_msg_seq'], cl['dirty_version']
            check(0 <= target <= cl['head_msg_seq'], 'marker beyond the head: %r', dict(cl))
            conv = st.convs.get(c)
            fetched = conv.fetched if conv else 0
            if target <= fetched and c not in st.dirty:
                return
            if target > fetched:
                conv = st.convs.setdefault(c, Conv())
                self.fetch_range(u, st, c, fetched, target)
                conv.fetched = target
                self.count('dirty.fetches')
                self.note('catch-up %d/%s c%d (%d, %d] v%d' % (u, d.name, c, fetched, target, version))
            if faults and self.rng.random() < 0.1:
                self.note('  crash before clear_dirty')
                self.count('fault.crash_before_clear')
                return
            if faults and self.rng.random() < 0.2:
                # A new message is sent and fanned out between the read of
                # the marker and the clear: the stale version must fail.
                self.op_send(c)
                self.q1("SELECT im.run_fanout() AS n")
                self.count('dirty.raced')
            r = self.q1("SELECT * FROM im.clear_dirty(%s, %s, %s, %s)", (u, c, version, conv.fetched))
            self.note('  clear_dirty %d c%d v%d saved %d -> %r' % (u, c, version, conv.fetched, dict(r)))
            if r['cleared']:
                check(r['dirty_version'] == version and r['dirty_target_msg_seq'] <= conv.fetched,
                      'clear_dirty cleared a newer marker: observed v%d, saved %d, got %r', version, conv.fetched, dict(r))
                self.count('clear.ok')
                st.dirty.discard(c)
                return
            # Failed: a newer message raced us.  Re-read and repeat.
            check(r['dirty_version'] > version or r['dirty_target_msg_seq'] > conv.fetched,
                  'clear_dirty refused without a newer marker: observed v%d, saved %d, got %r',
                  version, conv.fetched, dict(r))
            self.count('clear.failed')
            cl = self.conv_list(u, after=c - 1, limit=1)[0]
            check(cl['conversation_id'] == c, 'conversation_list lost c%d', c)
        raise ModelFailure('catch-up of %d/%s c%d does not converge' % (u, d.name, c))

    def snapshot(self, d, faults):
        b = self.q1("SELECT * FROM im.begin_snapshot(%s, %s)", (d.user, d.name))
        check(b['status'] == 'READY', 'begin_snapshot: %r', b)
        self.count('snapshots')
        S, tok = b['base_sync_seq'], b['snapshot_token']
        self.note('snapshot %d/%s gen %d S %d pages %d' % (d.user, d.name, b['sync_generation'], S, b['page_count']))
        items, digests = [], []
        for p in range(b['page_count']):
            f = self.q1("SELECT * FROM im.fetch_snapshot(%s, %s, %s, %s)", (d.user, d.name, tok, p))
            check(f['status'] == 'OK' and f['page'] == p, 'fetch_snapshot page %d: %r', p, f)
            pd = sha256_hex(jsonb_text(f['items']))
            check(pd == f['page_digest'], 'page %d digest: local %s server %s', p, pd, f['page_digest'])
            for it in f['items']:
                body = {k: v for k, v in it.items() if k != 'digest'}
                check(sha256_hex(jsonb_text(body)) == it['digest'], 'item digest mismatch: %r', it)
            digests.append(pd)
            items.extend(f['items'])
        manifest = sha256_hex(''.join(digests))
        check(manifest == b['manifest_digest'], 'manifest digest: local %s server %s', manifest, b['manifest_digest'])
        if faults and self.rng.random() < 0.1:
            self.note('  crash during snapshot install')
            self.count('fault.snapshot_crash')
            return
        new = Store()
        for it in items:
            c = it['conversation_id']
            conv = new.convs.setdefault(c, Conv())
            self.fetch_range(d.user, new, c, 0, it['last_msg_seq'])
            conv.fetched = it['last_msg_seq']
            if it['mode'] == 'shared_log':
                new.dirty.add(c)   # the marker may be dirty: clear it at catch-up
            conv.read = max(conv.read, it['read_msg_seq'])
            for mid in it['recalled_message_ids'] or []:
                t = conv.by_id(mid)
                check(t is None or t['recalled'], 'manifest recalls %s, fetch_messages shows it live', mid)
            for mid in it.get('taken_down_message_ids') or []:
                t = conv.by_id(mid)
                check(t is None or t['taken_down'], 'manifest takes down %s, fetch_messages shows it live', mid)
            # pins: the item's pin list is the latest pin position up to its last_msg_seq
            check(it['pinned'] == pin_view(conv), 'snapshot item c%d pinned %r, fetch_messages up to %d says %r',
                  c, it['pinned'], it['last_msg_seq'], pin_view(conv))
        a = self.q1("SELECT * FROM im.ack_snapshot(%s, %s, %s, %s)", (d.user, d.name, tok, manifest))
        check(a['status'] == 'OK' and a['acked_sync_seq'] == S, 'ack_snapshot: %r', a)
        if faults and self.rng.random() < 0.05:
            self.note('  crash after ack_snapshot, before local commit')
            self.count('fault.snapshot_crash_after_ack')
            return
        new.gen = b['sync_generation']
        new.applied = S
        d.store = new
        self.server_ack(d)

    # ---- the final comparison
    def final_check(self):
        for _ in range(100):
            if self.q1("SELECT im.run_fanout() AS n")['n'] == 0:
                break
        for d in self.devices:
            self.sync(d, faults=False)
        if not ROUTER:
            # Every receipt state reported once more after the last ACKs, so
            # each device's newest receipt is what the facts say now: a leave,
            # join, revocation or deletion changes message_facts' counts
            # without an ACK or read, and is reported at the next one
            # (operations.md "Receipts").  The devices' ACKs of the receipts
            # cover no position, so they queue nothing new.
            self.q("UPDATE im.receipt_pending rp SET dirty = true, dirty_from_msg_seq = 1, "
                   "dirty_to_msg_seq = (SELECT c.head_msg_seq FROM im.conversation c "
                   "                    WHERE c.conversation_id = rp.conversation_id) RETURNING 1")
            self.q1("SELECT im.run_receipts() AS n")
            for _ in range(100):
                if self.q1("SELECT im.run_fanout() AS n")['n'] == 0:
                    break
            for d in self.devices:
                self.sync(d, faults=False)
        for u in self.users:
            convs = self.conv_list(u)
            truth = {}
            views = {}
            for cl in convs:
                c = cl['conversation_id']
                pos = self.fetch_all(u, c)
                truth[c] = ([{k: p[k] for k in pos_keys(p['kind'])} for p in pos], cl['read_msg_seq'])
                views[c] = {p['message_id']: (p['reactions'], p['my_reactions'])
                            for p in pos if p['kind'] == 'message'}
                # Unread (contract §3), counted independently of the server's
                # recount: exact in fanout mode; in shared_log mode the upper
                # bound max(0, target - read), never below the true count.
                true_unread = sum(1 for p in pos if p['kind'] == 'message' and p['sender_id'] != u
                                  and not gone(p) and p['msg_seq'] > cl['read_msg_seq'])
                if cl['mode'] == 'fanout':
                    check(cl['unread_count'] == true_unread,
                          'user %d conversation %d (fanout): unread_count %d, recount from fetch_messages %d',
                          u, c, cl['unread_count'], true_unread)
                else:
                    check(true_unread <= cl['unread_count'] <= max(true_unread,
                          cl['dirty_target_msg_seq'] - cl['read_msg_seq']),
                          'user %d conversation %d (shared_log): unread_count %d not within [%d, max(0, %d - %d)]',
                          u, c, cl['unread_count'], true_unread, cl['dirty_target_msg_seq'], cl['read_msg_seq'])
                    self.count('final.shared_log_convs')
                self.count('final.positions', len(pos))
            for d in [x for x in self.devices if x.user == u]:
                got = {c: v for c, v in d.store.convs.items()}
                check(set(got) == set(truth),
                      'user %d device %s knows conversations %s, conversation_list says %s',
                      u, d.name, sorted(got), sorted(truth))
                for c, (want, read) in truth.items():
                    have = [got[c].pos[s] for s in sorted(got[c].pos)]
                    if have != want:
                        extra = [p for p in have if p not in want and p['kind'] in ('recall', 'edit', 'takedown')]
                        for p in (extra if not ROUTER else []):
                            if self.q("SELECT 1 FROM im.deleted_for_me WHERE user_id = %s AND message_id = %s",
                                      (u, p['target_message_id'])):
                                raise ModelFailure(
                                    'user %d device %s conversation %d: sync_changes delivered %s msg_seq %d of '
                                    'message %d, which the user deleted for itself; fetch_messages hides it '
                                    '(sync_changes and fetch_messages disagree on deleted-for-me)' % (
                                        u, d.name, c, p['kind'], p['msg_seq'], p['target_message_id']))
                        diff = [(a, b) for a, b in zip(have, want) if a != b][:3]
                        raise ModelFailure('user %d device %s conversation %d differs from fetch_messages '
                                           '(%d vs %d positions); first differences (device, server): %r' % (
                                               u, d.name, c, len(have), len(want), diff or (have[len(want):] or want[len(have):])[:3]))
                    check(got[c].read == read, 'user %d device %s conversation %d read cursor %d, server %d',
                          u, d.name, c, got[c].read, read)
                    # reactions: the local view of reactions (latest set per
                    # user, replayed in msg_seq order) is fetch_messages'
                    for mid, (counts, mine) in views[c].items():
                        local = reaction_view(got[c], mid, u)
                        check(local == (counts, mine),
                              'user %d device %s conversation %d message %d: local reactions %r, fetch_messages %r',
                              u, d.name, c, mid, local, (counts, mine))
                        self.count('final.reaction_views', 1 if counts else 0)
        if not ROUTER:
            self.check_receipts()
        rows = self.q("SELECT * FROM im.reconcile()")
        check(not rows, 'reconcile reports problems: %r', rows)

    def check_receipts(self):
        """Each device's newest receipt against the facts (contract §20, §7):
        a group message's counts are message_facts' rows counted (while the
        group is in fanout mode); a direct
        conversation's read_through_seq is the other member's cursor and its
        delivered_through_seq lies between what the other member's devices'
        ACKs still cover and that member's last position."""
        for d in self.devices:
            for (c, mid), ev in sorted(d.store.receipts.items()):
                self.count('final.receipts')
                if mid:
                    # none in shared_log mode (contract §20): a group that
                    # switched keeps the receipts it had, frozen
                    if self.q1("SELECT mode FROM im.conversation WHERE conversation_id = %s", (c,))['mode'] != 'fanout':
                        self.count('final.receipts_shared_log')
                        continue
                    f = self.q1("SELECT count(*) AS members, "
                                "count(*) FILTER (WHERE any_device_synced) AS delivered, "
                                "count(*) FILTER (WHERE user_read) AS read "
                                "FROM im.message_facts(%s, %s)", (d.user, mid))
                    check((ev['member_count'], ev['delivered_count'], ev['read_count'])
                          == (f['members'], f['delivered'], f['read']),
                          'user %d device %s message %d: receipt %r, message_facts %r',
                          d.user, d.name, mid, ev, f)
                    continue
                other = self.q1("SELECT uc.user_id, uc.read_msg_seq, uc.last_msg_seq, "
                                "  (SELECT max(i.msg_seq) FROM im.inbox i JOIN im.device v "
                                "     ON v.user_id = i.user_id AND v.state <> 'REVOKED' "
                                "    AND i.sync_seq <= v.acked_sync_seq "
                                "   WHERE i.user_id = uc.user_id AND i.conversation_id = uc.conversation_id) AS acked "
                                "FROM im.user_conversation uc "
                                "WHERE uc.conversation_id = %s AND uc.user_id <> %s", (c, d.user))
                check(ev['read_through_seq'] == other['read_msg_seq'],
                      'user %d device %s conversation %d: receipt %r, the other member reads through %d',
                      d.user, d.name, c, ev, other['read_msg_seq'])
                check((other['acked'] or 0) <= ev['delivered_through_seq'] <= other['last_msg_seq'],
                      'user %d device %s conversation %d: receipt %r, the other member ACKed through %r, last %d',
                      d.user, d.name, c, ev, other['acked'], other['last_msg_seq'])

    # ---- main loop
    def run(self):
        self.setup()
        ops = [(self.op_send, 25), (self.op_recall, 4), (self.op_edit, 5), (self.op_join, 3),
               (self.op_leave, 3), (self.op_read, 4), (self.op_delete, 2), (self.op_fanout, 12),
               (self.op_sync, 30), (self.op_rollback, 6), (self.op_reinstall, 2),
               (self.op_late_ack, 3), (self.op_gc, 1), (self.op_mode, 3), (self.op_open, 3),
               (self.op_react, 6), (self.op_pin, 2), (self.op_takedown, 2)]
        if ROUTER:
            # only through a router, so the single-node seeds replay as before
            ops.append((self.op_send_delete, 4))
        ops = [(f, w) for f, w in ops if f.__name__[3:] not in self.skip]
        fns = [f for f, _ in ops]
        weights = [w for _, w in ops]
        moderate = 'moderate' not in self.skip
        for step in range(self.steps):
            if moderate and self.mrng.random() < 0.06:
                self.op_moderate()
            self.rng.choices(fns, weights)[0]()
        self.final_check()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--seed', type=int, action='append', help='seed to run (repeatable); replays exactly')
    ap.add_argument('--random-seeds', type=int, default=0, metavar='N',
                    help='run N random seeds (printed first, each replays with --seed) instead of the fixed set')
    ap.add_argument('--steps', type=int, default=500)
    ap.add_argument('--dsn', default=os.environ.get('IM_MODEL_DSN', 'dbname=im_model'))
    ap.add_argument('-v', '--verbose', action='store_true')
    ap.add_argument('--skip', action='append', default=[],
                    help='leave out an operation kind (gc, rollback, reinstall, ...), for triage only')
    args = ap.parse_args()
    if args.random_seeds:
        rnd = random.SystemRandom()
        runs = [(seed, args.steps) for seed in rnd.sample(range(1000, 10 ** 6), args.random_seeds)]
        print('model: random seeds %s' % ' '.join(str(seed) for seed, _ in runs), flush=True)
    elif args.seed:
        runs = [(seed, args.steps) for seed in args.seed]
    else:
        runs = [(seed, args.steps) for seed in FIXED_SEEDS] + PINNED_RUNS + \
            [(random.SystemRandom().randrange(1000, 10 ** 6), args.steps)]
    seeds = [seed for seed, _ in runs]
    failed = 0
    for seed, steps in runs:
        t0 = time.time()
        m = Model(args.dsn, seed, steps, args.verbose, args.skip)
        try:
            m.run()
        except (ModelFailure, psycopg2.Error) as e:
            failed += 1
            print('seed %d: FAILED after %.1fs (replay: --seed %d --steps %d)' % (seed, time.time() - t0, seed, steps))
            print('  recovery_max_replay=%d; last operations:' % m.max_replay)
            for t in m.trace[-25:]:
                print('   ', t)
            print('  error: %s: %s' % (type(e).__name__, str(e).strip()[:3000]))
            continue
        finally:
            m.conn.close()
            m.gc_conn.close()
        c = m.counts
        print('seed %d: ok in %.1fs, max_replay=%d' % (seed, time.time() - t0, m.max_replay))
        print('  ops: ' + ', '.join('%s=%d' % (k[3:], v) for k, v in sorted(c.items()) if k.startswith('op.')))
        print('  batches=%d events=%d pages=%d recoveries=%d resets=%d snapshots=%d fetch_messages=%d final_positions=%d' % (
            c.get('batches', 0), c.get('events', 0), c.get('sync.pages', 0), c.get('recoveries', 0),
            c.get('sync.RESET_REQUIRED', 0), c.get('snapshots', 0), c.get('fetch_messages', 0),
            c.get('final.positions', 0)))
        print('  faults: ' + (', '.join('%s=%d' % (k.split('.', 1)[1], v) for k, v in sorted(c.items())
                                        if k.startswith('fault.') or k.startswith('ack.late.')) or 'none'))
        print('  shared_log: min_members=%d switches to_shared_log=%d to_fanout=%d auto=%d noop=%d; '
              'dirty_events=%d fetches=%d raced=%d clears ok=%d failed=%d; shared_log at the end=%d' % (
                  m.min_members, c.get('switch.to_shared_log', 0), c.get('switch.to_fanout', 0),
                  c.get('switch.auto', 0), c.get('switch.noop', 0), c.get('dirty.events', 0),
                  c.get('dirty.fetches', 0), c.get('dirty.raced', 0), c.get('clear.ok', 0),
                  c.get('clear.failed', 0), c.get('final.shared_log_convs', 0)))
        print('  relations: reactions views compared=%d' % c.get('final.reaction_views', 0))
        print('  receipts: compared with the facts=%d' % c.get('final.receipts', 0))
        print('  sync statuses: ' + ', '.join('%s=%d' % (k[5:], v) for k, v in sorted(c.items())
                                                if k.startswith('sync.') and k[5:].isupper()))
    print('model: %d seeds, %d failed' % (len(seeds), failed))
    return 1 if failed else 0


if __name__ == '__main__':
    try:
        rc = main()
    finally:
        reset_node_settings()
    sys.exit(rc)
