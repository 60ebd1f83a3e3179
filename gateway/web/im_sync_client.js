// im_sync_client.js — the reference client of im_sync (contract §16).
//
// One ES module, no build step, the same file in browsers and in Node ≥ 20.
// It keeps the client's half of the promises (design §7.3, §8, §9.1, §11,
// §12.2–§12.3, §13.2):
//   - a batch's events and the cursor that covers them reach storage in ONE
//     commit, and the ACK is sent only after that commit returned, so a crash
//     between the two replays the batch (applied idempotently) and never
//     loses it;
//   - RESET_REQUIRED → snapshot (local view rebuilt, cursor = its base),
//     RECOVERY → the replayed batch is applied like any other, STALE_GENERATION
//     / EXPIRED / INVALID_TOKEN → the batch is started again from the saved
//     cursor, DEVICE_REVOKED → stop and say so;
//   - every send, recall, edit, reaction, pin and read first goes to an outbox
//     in storage and is sent again with the SAME client_msg_id after a
//     reconnect or a reload, so it takes effect exactly once;
//   - hints are only reasons to sync; a reconnect always syncs, and the
//     conversation list's heads catch up shared_log groups whose hints were
//     lost;
//   - shared_log groups are kept current with fetch_messages + clear_dirty.
// Ids are JSON numbers read exactly: the server keeps them below 2^53.

const SUBPROTOCOL = 'im-sync.v1';
const PAGE_LIMIT = 500;
const FETCH_LIMIT = 500;
const HISTORY_PAGE = 50;
const HISTORY_TIMEOUT_MS = 30000;
const RECENT_LIMIT = 100;
const BACKOFF_BASE_MS = 250;
const BACKOFF_MAX_MS = 30000;

// Close codes of contract §10 that end the client instead of a reconnect.
const CLOSE_STOP = {
  4001: 'needs_token',      // authentication failed: a new token is needed
  4003: 'revoked',          // the device was revoked
  4005: 'suspended',        // the account is suspended (contract §17)
  4008: 'superseded',       // a newer connection of this device exists
};
// Close codes that ask for a longer back-off before the next attempt.
const CLOSE_BACK_OFF = new Set([1013, 4029]);

export class ImSyncError extends Error {
  constructor(code, message, frame) {
    super(`${code}: ${message}`);
    this.code = code;
    this.frame = frame || null;
    this.retryAfterMs = frame && frame.retry_after_ms != null ? frame.retry_after_ms : null;
    // FORBIDDEN's reason (contract §17): 'suspended', 'muted', or null
    this.reason = frame && frame.reason != null ? frame.reason : null;
  }
}

// An error that a later attempt may not have (the request can be repeated).
function retryable(err) {
  return err instanceof ImSyncError &&
    ['UNAVAILABLE', 'RATE_LIMITED', 'DISCONNECTED', 'INTERNAL'].includes(err.code);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function newClientMsgId() {
  if (globalThis.crypto && globalThis.crypto.randomUUID) return globalThis.crypto.randomUUID();
  return `${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}-${Math.random().toString(36).slice(2)}`;
}

async function sha256Hex(text) {
  const bytes = new TextEncoder().encode(text);
  const digest = await globalThis.crypto.subtle.digest('SHA-256', bytes);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
}

// The user and device a device token names, read from its claims without
// verifying them (the server does, at hello); null if it is not a device
// token.  The layout is extension/include/im_sync/token_layout.h: purpose
// 'D', version 1, user_id (int64, big-endian) at byte 13, the device id's
// length at byte 77 and its bytes after it; base64url without padding.  A
// storage can be chosen by these before connecting (the page keys its
// database by them); the welcome then confirms them.
export function deviceTokenClaims(token) {
  // no regular expression touches the token: RegExp.input and RegExp.$_
  // would keep it on a global
  if (typeof token !== 'string' || token.length < 4 || token.length % 4 === 1 || token.length > 300) return null;
  let b64 = '';
  for (const ch of token) {
    if (ch === '-') b64 += '+';
    else if (ch === '_') b64 += '/';
    else if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9')) b64 += ch;
    else return null;
  }
  let bin;
  try { bin = atob(b64 + '='.repeat((4 - token.length % 4) % 4)); } catch { return null; }
  const b = Uint8Array.from(bin, (ch) => ch.charCodeAt(0));
  const USER_AT = 13; const DEVLEN_AT = USER_AT + 8 * 8;
  if (b.length <= DEVLEN_AT || b[0] !== 0x44 /* 'D' */) return null;
  const view = new DataView(b.buffer);
  if (view.getUint32(1) !== 1) return null;
  const devlen = b[DEVLEN_AT];
  if (devlen < 1 || devlen > 64 || b.length < DEVLEN_AT + 1 + devlen + 4 + 32) return null;
  const user = view.getBigInt64(USER_AT);
  let deviceId;
  try { deviceId = new TextDecoder('utf-8', { fatal: true }).decode(b.subarray(DEVLEN_AT + 1, DEVLEN_AT + 1 + devlen)); } catch { return null; }
  return { userId: user <= BigInt(Number.MAX_SAFE_INTEGER) && user >= -BigInt(Number.MAX_SAFE_INTEGER) ? Number(user) : null,
           deviceId };
}

// ---------------------------------------------------------------------------
// Storage: a key/value store whose commit(change) applies puts, deletes and
// prefix clears together or not at all.  The client keeps its whole state in
// it: 'meta' (user, device, generation, applied cursor), 'c/<conversation>',
// 'p/<conversation>/<msg_seq>' (positions), 'o/<seq>' (outbox).
//   load()          → Promise<Array<[key, value]>>
//   commit(change)  → Promise, change = {puts: [[k, v]…], deletes: [k…], clear: [prefix…]}
//                     (clears first, then deletes, then puts)
//   close()         → Promise

function applyChange(map, change) {
  for (const prefix of change.clear || []) {
    for (const k of [...map.keys()]) if (k.startsWith(prefix)) map.delete(k);
  }
  for (const k of change.deletes || []) map.delete(k);
  for (const [k, v] of change.puts || []) map.set(k, v);
}

// Memory: for tests and for clients that re-sync from scratch on each start.
export class MemoryStorage {
  constructor() { this.map = new Map(); }
  async load() { return [...this.map.entries()].map(([k, v]) => [k, structuredClone(v)]); }
  async commit(change) { applyChange(this.map, structuredClone(change)); }
  async close() {}
}

// File (Node): snapshot.json + journal.log in a directory.  A commit is one
// JSON line appended and fdatasync'ed before commit() returns; load() replays
// the journal over the snapshot and drops a torn last line (a commit that did
// not return, so nothing was ACKed for it).  Compaction writes a new snapshot
// (temp file, fsync, rename, fsync of the directory) and then empties the
// journal; a crash between the two replays the journal over a snapshot that
// already holds it, which ends in the same state (every op is a put, delete
// or clear whose last occurrence decides its keys).
export class FileStorage {
  constructor(dir, { compactBytes = 8 << 20 } = {}) {
    this.dir = dir;
    this.compactBytes = compactBytes;
    this.map = new Map();
    this.fh = null;
    this.journalBytes = 0;
  }

  async load() {
    const fs = await import('node:fs/promises');
    const path = await import('node:path');
    this.fs = fs;
    this.snapPath = path.join(this.dir, 'snapshot.json');
    this.journalPath = path.join(this.dir, 'journal.log');
    await fs.mkdir(this.dir, { recursive: true });
    this.map = new Map();
    try {
      const snap = JSON.parse(await fs.readFile(this.snapPath, 'utf8'));
      for (const [k, v] of snap.records) this.map.set(k, v);
    } catch (e) {
      if (e.code !== 'ENOENT') throw e;
    }
    let text = '';
    try {
      text = await fs.readFile(this.journalPath, 'utf8');
    } catch (e) {
      if (e.code !== 'ENOENT') throw e;
    }
    let good = 0;
    while (good < text.length) {
      const nl = text.indexOf('\n', good);
      if (nl < 0) break;                       // torn tail: never committed
      let change;
      try { change = JSON.parse(text.slice(good, nl)); } catch { break; }
      applyChange(this.map, change);
      good = nl + 1;
    }
    this.fh = await fs.open(this.journalPath, 'a+');
    const goodBytes = Buffer.byteLength(text.slice(0, good), 'utf8');
    if (goodBytes !== Buffer.byteLength(text, 'utf8')) {
      await this.fh.truncate(goodBytes);
      await this.fh.datasync();
    }
    this.journalBytes = goodBytes;
    return [...this.map.entries()].map(([k, v]) => [k, structuredClone(v)]);
  }

  async commit(change) {
    const line = JSON.stringify(change) + '\n';
    await this.fh.appendFile(line, 'utf8');
    await this.fh.datasync();
    applyChange(this.map, structuredClone(change));
    this.journalBytes += Buffer.byteLength(line, 'utf8');
    if (this.journalBytes > this.compactBytes) await this.compact();
  }

  async compact() {
    const fs = this.fs;
    const tmp = this.snapPath + '.tmp';
    const fh = await fs.open(tmp, 'w');
    await fh.writeFile(JSON.stringify({ records: [...this.map.entries()] }), 'utf8');
    await fh.sync();
    await fh.close();
    await fs.rename(tmp, this.snapPath);
    const dh = await fs.open(this.dir, 'r');
    await dh.sync();
    await dh.close();
    await this.fh.truncate(0);
    await this.fh.datasync();
    this.journalBytes = 0;
  }

  async close() {
    if (this.fh) await this.fh.close();
    this.fh = null;
  }
}

// IndexedDB (browsers): one object store; a commit is one readwrite
// transaction, which IndexedDB makes atomic and durable on 'complete'.
export class IndexedDBStorage {
  constructor(name = 'im_sync') { this.name = name; this.db = null; }

  open() {
    return new Promise((resolve, reject) => {
      const req = indexedDB.open(this.name, 1);
      req.onupgradeneeded = () => req.result.createObjectStore('kv');
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }

  async load() {
    this.db = await this.open();
    return new Promise((resolve, reject) => {
      const tx = this.db.transaction('kv', 'readonly');
      const store = tx.objectStore('kv');
      const keys = store.getAllKeys();
      const values = store.getAll();
      tx.oncomplete = () => resolve(keys.result.map((k, i) => [k, values.result[i]]));
      tx.onerror = () => reject(tx.error);
    });
  }

  commit(change) {
    return new Promise((resolve, reject) => {
      const tx = this.db.transaction('kv', 'readwrite', { durability: 'strict' });
      const store = tx.objectStore('kv');
      for (const prefix of change.clear || []) store.delete(IDBKeyRange.bound(prefix, prefix + '\uffff'));
      for (const k of change.deletes || []) store.delete(k);
      for (const [k, v] of change.puts || []) store.put(v, k);
      tx.oncomplete = () => resolve();
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error || new Error('IndexedDB transaction aborted'));
    });
  }

  async close() { if (this.db) this.db.close(); this.db = null; }

  // Deletes the whole database (the page's "forget this device").
  static wipe(name = 'im_sync') {
    return new Promise((resolve, reject) => {
      const req = indexedDB.deleteDatabase(name);
      req.onsuccess = () => resolve();
      req.onerror = () => reject(req.error);
    });
  }
}

// ---------------------------------------------------------------------------
// The local view: conversations and their positions, built by applying
// events in sync_seq order and fetch_messages pages in msg_seq order.  Every
// application is idempotent (positions are keyed by msg_seq, cursors only
// move forward, reactions are whole sets per user), so a replayed batch
// shows nothing twice.

const convKey = (c) => `c/${c}`;
const posKey = (c, s) => `p/${c}/${String(s).padStart(16, '0')}`;

class View {
  constructor() {
    this.convs = new Map();     // conversation_id → conversation record
    this.positions = new Map(); // conversation_id → Map(msg_seq → position)
    this.byMessage = new Map(); // message_id → [conversation_id, msg_seq]
    this.dirtyKeys = new Set();
    this.pinClock = 0;          // the highest pin_order given: a later pin ranks higher
  }

  // A conversation record.  Besides the server's fields it keeps:
  //   conversation_pinned, pin_order  the user's conversation pin and its rank
  //                                   (higher = pinned more recently);
  //   last_activity_at                the created_at of its last message;
  //   delivered_through_seq, read_through_seq   direct receipts (cumulative);
  //   msg_receipts                    group receipts, message_id → counts;
  //   loaded_from, history_floor      every visible position >= loaded_from is
  //                                   local; none below history_floor exists
  //                                   (a snapshot leaves history to be loaded
  //                                   when the conversation is opened);
  //   server_unread, server_unread_at the server's unread count as of that
  //                                   last_msg_seq, for history not loaded;
  //   my_role, muted_until, standing_seq  the user's role and mute in a group
  //                                   (contract §17) as of that position: a
  //                                   role or mute position above it changes
  //                                   them, an older one (lazy history) not.
  conv(id) {
    let c = this.convs.get(id);
    if (!c) {
      c = { conversation_id: id, kind: null, mode: 'fanout', last_msg_seq: 0, read_msg_seq: 0,
            dirty_target_msg_seq: 0, dirty_version: 0, dirty: false, pinned: [], head_msg_seq: 0,
            conversation_pinned: false, pin_order: 0, last_activity_at: null,
            delivered_through_seq: 0, read_through_seq: 0, msg_receipts: {},
            loaded_from: 1, history_floor: 1, server_unread: null, server_unread_at: 0,
            my_role: null, muted_until: null, standing_seq: 0 };
      this.convs.set(id, c);
    }
    this.dirtyKeys.add(convKey(id));
    return c;
  }

  load(key, value) {
    if (key.startsWith('c/')) {
      this.convs.set(value.conversation_id, value);
      if ((value.pin_order || 0) > this.pinClock) this.pinClock = value.pin_order;
    } else if (key.startsWith('p/')) this.putPosition(value, false);
  }

  // True while positions between history_floor and loaded_from are not local.
  hasOlder(c) { return (c.loaded_from || 1) > (c.history_floor || 1); }

  pinRanked(c, pinned) {
    c.conversation_pinned = !!pinned;
    if (c.conversation_pinned) c.pin_order = ++this.pinClock;
  }

  putPosition(p, mark = true) {
    let m = this.positions.get(p.conversation_id);
    if (!m) { m = new Map(); this.positions.set(p.conversation_id, m); }
    m.set(p.msg_seq, p);
    if (p.message_id != null) this.byMessage.set(p.message_id, [p.conversation_id, p.msg_seq]);
    if (mark) this.dirtyKeys.add(posKey(p.conversation_id, p.msg_seq));
  }

  position(messageId) {
    const at = this.byMessage.get(messageId);
    if (!at) return null;
    const m = this.positions.get(at[0]);
    return m ? m.get(at[1]) || null : null;
  }

  touch(p) { this.dirtyKeys.add(posKey(p.conversation_id, p.msg_seq)); }

  // One conversation position (an event or a fetch_messages element).
  applyPosition(e, me) {
    const c = this.conv(e.conversation_id);
    const prev = (this.positions.get(e.conversation_id) || new Map()).get(e.msg_seq);
    const p = {
      kind: e.kind, conversation_id: e.conversation_id, msg_seq: e.msg_seq,
      message_id: e.message_id, sender_id: e.sender_id, content_type: e.content_type,
      body: e.body, target_message_id: e.target_message_id ?? null,
      // `recalled` here is any tombstone (as in the server's column): a
      // moderator's takedown is one too, shown as taken_down (contract §17)
      recalled: !!e.recalled || !!e.taken_down, taken_down: !!e.taken_down, erased: !!e.erased,
      created_at: e.created_at, reply_to_message_id: e.reply_to_message_id ?? null,
    };
    if (e.kind === 'message') {
      // a replay never undoes what later positions did to this message
      p.reactionsByUser = prev ? prev.reactionsByUser : {};
      p.reactionSeq = prev ? prev.reactionSeq : {};
      p.deleted = prev ? !!prev.deleted : false;
      p.edited = prev ? !!prev.edited : false;
      if (prev && prev.recalled) { p.recalled = true; p.body = null; }
      if (prev && prev.taken_down) p.taken_down = true;
      if (p.recalled) p.reactionsByUser = {};
    }
    // the server tombstones a recalled or taken-down message's edits and
    // reactions too (message_relations.c)
    const tomb = (from) => { p.recalled = true; p.body = null; if (from.taken_down) p.taken_down = true; };
    if ((e.kind === 'edit' || e.kind === 'reaction') && prev && prev.recalled) tomb(prev);
    const earlyTarget = p.target_message_id != null ? this.position(p.target_message_id) : null;
    if ((e.kind === 'edit' || e.kind === 'reaction') && earlyTarget && earlyTarget.recalled) tomb(earlyTarget);
    this.putPosition(p);
    if (e.msg_seq > c.last_msg_seq) c.last_msg_seq = e.msg_seq;
    // only a message moves a conversation in the recent order (contract §20)
    if (e.kind === 'message' && e.created_at && laterThan(e.created_at, c.last_activity_at)) c.last_activity_at = e.created_at;
    const target = p.target_message_id != null ? this.position(p.target_message_id) : null;
    switch (e.kind) {
      case 'recall':
      case 'takedown':
        if (target) {
          target.recalled = true; target.body = null; target.reactionsByUser = {};
          if (e.kind === 'takedown') target.taken_down = true;
          this.touch(target);
          // no edited text of a recalled message stays visible (contract §1),
          // and it keeps no reactions (contract §14)
          for (const q of this.positions.get(e.conversation_id).values()) {
            if ((q.kind === 'edit' || q.kind === 'reaction') && q.target_message_id === p.target_message_id &&
                (!q.recalled || (target.taken_down && !q.taken_down))) {
              q.recalled = true; q.body = null; q.taken_down = !!target.taken_down; this.touch(q);
            }
          }
        }
        break;
      case 'edit':
        if (target && !target.recalled && !p.recalled) {
          target.body = p.body; target.edited = true; this.touch(target);
        }
        break;
      case 'reaction':
        if (target && target.kind === 'message' && p.body && p.body.user_id != null) {
          const u = String(p.body.user_id);
          if (!(target.reactionSeq[u] > p.msg_seq)) {
            target.reactionSeq[u] = p.msg_seq;
            if (!target.recalled) target.reactionsByUser[u] = p.body.reactions || [];
            this.touch(target);
          }
        }
        break;
      case 'pin':
        if (p.body && Array.isArray(p.body.pinned) && !(c.pinSeq > p.msg_seq)) {
          c.pinned = p.body.pinned; c.pinSeq = p.msg_seq;
        }
        break;
      case 'mode':
        if (p.body && p.body.mode && !(c.modeSeq > p.msg_seq)) { c.mode = p.body.mode; c.modeSeq = p.msg_seq; }
        break;
      case 'leave':
        if (p.body && p.body.user_id === me) c.left = true;
        break;
      case 'join':
        if (p.body && p.body.user_id === me) c.left = false;
        break;
      // the user's own role and mute (contract §17), newest position wins
      case 'role':
        if (p.body && !(c.standing_seq > p.msg_seq)) {
          if (p.body.user_id === me) { c.my_role = p.body.role; c.standing_seq = p.msg_seq; }
          else if (p.body.previous_owner === me) { c.my_role = p.body.previous_owner_role; c.standing_seq = p.msg_seq; }
        }
        break;
      case 'mute':
        if (p.body && p.body.user_id === me && !(c.standing_seq > p.msg_seq)) {
          c.muted_until = p.body.muted_until ?? null; c.standing_seq = p.msg_seq;
        }
        break;
      default:
        break;
    }
  }

  // A private event or a conversation position from the user's log.
  applyEvent(e, me) {
    switch (e.kind) {
      case 'read_cursor': {
        const c = this.conv(e.conversation_id);
        if (e.read_msg_seq > c.read_msg_seq) c.read_msg_seq = e.read_msg_seq;
        return null;
      }
      case 'conversation_dirty': {
        const c = this.conv(e.conversation_id);
        if (e.dirty_version >= c.dirty_version) {
          c.dirty_version = e.dirty_version;
          c.dirty_target_msg_seq = Math.max(c.dirty_target_msg_seq, e.dirty_target_msg_seq);
          c.dirty = true;
        }
        return e.conversation_id;
      }
      case 'delete_for_me': {
        const p = this.position(e.message_id);
        if (p) { p.deleted = true; this.touch(p); this.conv(p.conversation_id); }
        return null;
      }
      case 'conversation_pin': {
        this.pinRanked(this.conv(e.conversation_id), e.conversation_pinned);
        return null;
      }
      case 'receipt': {
        // cumulative facts: a replayed or older receipt never takes a tick back
        const c = this.conv(e.conversation_id);
        if (e.message_id != null) {
          const r = c.msg_receipts || (c.msg_receipts = {});
          const old = r[e.message_id] || { delivered_count: 0, read_count: 0, member_count: null };
          r[e.message_id] = { delivered_count: Math.max(old.delivered_count, e.delivered_count || 0),
                              read_count: Math.max(old.read_count, e.read_count || 0),
                              member_count: e.member_count ?? old.member_count };
        } else {
          c.delivered_through_seq = Math.max(c.delivered_through_seq || 0, e.delivered_through_seq || 0);
          c.read_through_seq = Math.max(c.read_through_seq || 0, e.read_through_seq || 0);
        }
        return null;
      }
      default:
        this.applyPosition(e, me);
        return null;
    }
  }

  // Unread (contract §3): in fanout mode the recount of messages from others
  // after the read cursor, not recalled, not deleted; in shared_log mode the
  // server's upper bound max(0, m - read_msg_seq).
  // History not loaded yet (a snapshot's conversation before it is opened):
  // the server's count as of server_unread_at plus what arrived since.
  unread(c, me) {
    const m = this.positions.get(c.conversation_id) || new Map();
    if (c.server_unread != null && c.mode !== 'shared_log' && (c.loaded_from || 1) > c.read_msg_seq + 1 &&
        this.hasOlder(c)) {
      let n = c.server_unread;
      for (const p of m.values()) {
        if (p.kind === 'message' && p.sender_id !== me && !p.recalled && !p.deleted &&
            p.msg_seq > Math.max(c.read_msg_seq, c.server_unread_at)) n++;
      }
      return n;
    }
    if (c.mode === 'shared_log') {
      let top = 0;
      for (const p of m.values()) if (p.kind === 'message' && p.msg_seq > top) top = p.msg_seq;
      return Math.max(0, top - c.read_msg_seq);
    }
    let n = 0;
    for (const p of m.values()) {
      if (p.kind === 'message' && p.sender_id !== me && !p.recalled && !p.deleted && p.msg_seq > c.read_msg_seq) n++;
    }
    return n;
  }

  // The storage change for everything touched since the last call.
  drain() {
    const puts = [];
    for (const k of this.dirtyKeys) {
      if (k.startsWith('c/')) {
        const c = this.convs.get(Number(k.slice(2)));
        if (c) puts.push([k, c]);
      } else {
        const [, conv, seq] = k.split('/');
        const p = this.positions.get(Number(conv)).get(Number(seq));
        puts.push([k, p]);
      }
    }
    this.dirtyKeys.clear();
    return puts;
  }

  reset() {
    this.convs.clear(); this.positions.clear(); this.byMessage.clear(); this.dirtyKeys.clear();
  }
}

// PostgreSQL prints timestamptz with its offset; compare instants, not text.
function laterThan(a, b) {
  if (b == null) return a != null;
  if (a == null) return false;
  return Date.parse(a) > Date.parse(b);
}
const activityMs = (c) => (c.last_activity_at ? Date.parse(c.last_activity_at) : -Infinity);

// The recent order of contract §20: pinned first (the most recently pinned
// first), then the latest message first, ties by conversation id.
function recentOrder(a, b) {
  const pa = a.conversation_pinned ? 1 : 0; const pb = b.conversation_pinned ? 1 : 0;
  if (pa !== pb) return pb - pa;
  if (pa && (a.pin_order || 0) !== (b.pin_order || 0)) return (b.pin_order || 0) - (a.pin_order || 0);
  const ta = activityMs(a); const tb = activityMs(b);
  if (ta !== tb) return tb > ta ? 1 : -1;
  return a.conversation_id - b.conversation_id;
}

function reactionCounts(p) {
  const counts = {};
  for (const keys of Object.values(p.reactionsByUser || {})) for (const k of keys) counts[k] = (counts[k] || 0) + 1;
  return counts;
}

// ---------------------------------------------------------------------------

export class ImSyncClient {
  // pollMs: a sync this often while ready, so a client that lost every
  // hint still catches up (hints carry no data and may be lost).
  // historyPage: positions loaded when a conversation is opened and per
  // loadOlder(); historyTimeoutMs: how long loadOlder waits for a cold range.
  // window, document: the targets of 'online' and 'visibilitychange' (the
  // globals in a browser; none in Node unless given).
  constructor({ url, token, storage, WebSocket: WS, onChange, onStatus, pageLimit, pollMs = 30000, hooks,
                historyPage = HISTORY_PAGE, historyTimeoutMs = HISTORY_TIMEOUT_MS,
                window: win, document: doc } = {}) {
    if (!url) throw new Error('ImSyncClient: url is required');
    this.url = url;
    this.token = token;
    this.storage = storage || new MemoryStorage();
    this.WS = WS || globalThis.WebSocket;
    if (!this.WS) throw new Error('ImSyncClient: no WebSocket implementation (pass one, e.g. the ws package in Node)');
    this.onChange = onChange || (() => {});
    this.onStatus = onStatus || (() => {});
    this.pageLimit = pageLimit || PAGE_LIMIT;
    this.pollMs = pollMs;
    this.historyPage = historyPage;
    this.historyTimeoutMs = historyTimeoutMs;
    this.win = win !== undefined ? win : (typeof window !== 'undefined' ? window : null);
    this.doc = doc !== undefined ? doc : (typeof document !== 'undefined' ? document : null);
    this.onForeground = () => { if (!this.doc || this.doc.visibilityState === 'visible') this.wake('visible'); };
    this.onNetwork = () => this.wake('online');
    this.opening = new Map();        // conversation_id → the promise of its first history page
    this.historyWaiters = new Set(); // loadOlder calls waiting for history_ready
    this.noRecent = false;           // the gateway answered recent_conversations with BAD_FRAME
    this.hooks = hooks || {};        // tests: beforeAck(batch) between commit and ACK; dropHints
    this.view = new View();
    this.meta = { user_id: null, device_id: null, generation: 0, applied: 0, outbox_seq: 0 };
    this.outbox = new Map();         // 'o/<seq>' → item
    this.waiters = new Map();        // client_msg_id → {resolve, reject}
    this.pending = new Map();        // request id → {resolve, reject}
    this.nextId = 1;
    this.ws = null;
    this.state = 'stopped';
    this.offline = false;
    this.stopped = true;
    this.attempt = 0;
    this.syncWanted = false;
    this.syncing = null;
    this.fetchWanted = new Map();    // conversation_id → head to reach
    this.flushing = null;
    this.loaded = false;
    this.commitChain = Promise.resolve();
    this.serial = Promise.resolve();
    this.storageClosed = false;
    this.stats = { snapshots: 0, recoveries: 0, batches: 0, events: 0, reconnects: 0, refusedHellos: 0, wakeups: 0 };
  }

  // -- lifecycle -------------------------------------------------------------

  // Loads storage, connects, and resolves once the first catch-up is done
  // (rejects if the client is stopped for good first: revoked, bad token).
  async start() {
    if (!this.loaded) {
      this.storageClosed = false;
      for (const [k, v] of await this.storage.load()) {
        if (k === 'meta') this.meta = { ...this.meta, ...v };
        else if (k.startsWith('o/')) this.outbox.set(k, v);
        else this.view.load(k, v);
      }
      this.view.dirtyKeys.clear();
      this.loaded = true;
    }
    this.stopped = false;
    const ready = new Promise((resolve, reject) => { this.readyWaiter = { resolve, reject }; });
    this.listen(true);
    this.connect();
    return ready;
  }

  listen(on) {
    const m = on ? 'addEventListener' : 'removeEventListener';
    if (this.listening === on) return;
    this.listening = on;
    if (this.doc && this.doc[m]) this.doc[m]('visibilitychange', this.onForeground);
    if (this.win && this.win[m]) this.win[m]('online', this.onNetwork);
  }

  // The page came to the foreground or the network came back (§9.1): sync
  // now, or connect now instead of waiting out the back-off (a wait the
  // server asked for is still kept).
  wake(reason) {
    if (this.stopped || this.offline) return;
    this.stats.wakeups++;
    if (this.ws) {
      if (this.state === 'ready' || this.state === 'syncing') this.requestSync();
      return;                          // connecting: the welcome syncs
    }
    const notBefore = (this.reconnectNotBefore || 0) - Date.now();
    clearTimeout(this.reconnectTimer);
    if (notBefore > 0) this.reconnectTimer = setTimeout(() => this.connect(), notBefore);
    else this.connect();
  }

  async stop() {
    this.stopped = true;
    this.listen(false);
    clearTimeout(this.reconnectTimer);
    for (const w of [...this.historyWaiters]) w(null);
    clearInterval(this.pollTimer);
    if (this.ws) { try { this.ws.close(1000); } catch { /* already closed */ } }
    this.ws = null;
    this.failPending(new ImSyncError('DISCONNECTED', 'client stopped'));
    // queued operations stay in storage and go out after the next start()
    for (const w of this.waiters.values()) w.reject(new ImSyncError('STOPPED', 'client stopped; the operation stays queued'));
    this.waiters.clear();
    try { await this.syncing; } catch { /* ended by the close */ }
    try { await this.flushing; } catch { /* ended by the close */ }
    this.storageClosed = true;
    await this.commitChain;
    await this.storage.close();
    this.loaded = false;
    this.setState('stopped');
  }

  // The offline switch: closes the socket and keeps sends in the outbox.
  setOffline(offline) {
    this.offline = !!offline;
    if (this.offline) {
      clearTimeout(this.reconnectTimer);
      // let go of the socket now: its close must not schedule a reconnect,
      // so switching back on connects at once
      const ws = this.ws;
      this.ws = null;
      clearInterval(this.pollTimer);
      this.failPending(new ImSyncError('DISCONNECTED', 'offline'));
      if (ws) { try { ws.close(1000); } catch { /* already closed */ } }
      this.setState('offline');
    } else if (!this.stopped) {
      this.attempt = 0;
      this.connect();
    }
  }

  setToken(token) {
    this.token = token;
    if (this.state === 'needs_token' && !this.offline) { this.stopped = false; this.connect(); }
  }

  setState(state, detail) {
    this.state = state;
    this.onStatus({ state, detail: detail || null });
  }

  connect() {
    if (this.stopped || this.offline || this.ws) return;
    this.setState('connecting');
    let ws;
    try {
      ws = new this.WS(this.url, SUBPROTOCOL);
    } catch (e) {
      this.scheduleReconnect(null, e.message);
      return;
    }
    this.ws = ws;
    ws.onopen = () => ws.send(JSON.stringify({ type: 'hello', token: this.token, id: 'hello' }));
    ws.onmessage = (ev) => this.onFrame(ws, typeof ev.data === 'string' ? ev.data : String(ev.data));
    ws.onerror = () => { /* onclose follows and decides */ };
    ws.onclose = (ev) => this.onClose(ws, ev.code, ev.reason);
  }

  onClose(ws, code, reason) {
    if (this.ws !== ws) return;
    this.ws = null;
    clearInterval(this.pollTimer);
    this.failPending(new ImSyncError('DISCONNECTED', `connection closed (${code})`));
    if (CLOSE_STOP[code]) {
      this.stopped = true;
      this.listen(false);
      const state = CLOSE_STOP[code];
      this.setState(state, reason || null);
      if (this.readyWaiter) { this.readyWaiter.reject(new ImSyncError(state.toUpperCase(), `closed with ${code}`)); this.readyWaiter = null; }
      return;
    }
    if (this.stopped || this.offline) return;
    // a refused hello (admission, close 4029) named the earliest useful retry
    const atLeast = this.helloRetryAfterMs || 0;
    this.helloRetryAfterMs = 0;
    this.scheduleReconnect(code, reason, atLeast);
  }

  // Jittered exponential back-off ("full jitter"); 1013/4029 and an
  // UNAVAILABLE's retry_after_ms push the next attempt out further.
  scheduleReconnect(code, reason, atLeastMs = 0) {
    this.setState('reconnecting', { code, reason: reason || null });
    this.attempt++;
    this.stats.reconnects++;
    const cap = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** Math.min(this.attempt, 10));
    let wait = this.hooks.backoffMs != null ? this.hooks.backoffMs : Math.random() * cap;
    if (CLOSE_BACK_OFF.has(code)) wait = Math.max(wait, cap / 2, 1000);
    wait = Math.max(wait, atLeastMs);
    this.reconnectNotBefore = Date.now() + atLeastMs;
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = setTimeout(() => this.connect(), wait);
  }

  failPending(err) {
    for (const { reject } of this.pending.values()) reject(err);
    this.pending.clear();
  }

  // -- frames ----------------------------------------------------------------

  onFrame(ws, text) {
    let f;
    try { f = JSON.parse(text); } catch { return; }
    if (f.type === 'welcome') return this.onWelcome(f);
    if (f.type === 'hint') return this.onHint(f);
    if (f.type === 'history_ready') {
      for (const w of [...this.historyWaiters]) w(f);
      return;
    }
    if (f.id != null && this.pending.has(f.id)) {
      const { resolve, reject } = this.pending.get(f.id);
      this.pending.delete(f.id);
      if (f.type === 'error') reject(new ImSyncError(f.code, f.message, f));
      else resolve(f);
    } else if (f.type === 'error' && f.id == null && f.code === 'RATE_LIMITED') {
      // The gateway refuses over-rate frames before reading them, so the
      // error names no request: every pending one may be the refused one.
      // All are failed as RATE_LIMITED and call() repeats them after the
      // wait; each is idempotent (client_msg_id, cursors, ACKs), and a late
      // answer to an old id is ignored.
      // After one, requests go one at a time, spaced by the wait the
      // gateway named, for a while: a refusal then names its request.
      const wait = f.retry_after_ms != null ? f.retry_after_ms : 1000;
      this.pausedUntil = Date.now() + wait;
      this.spacingMs = Math.max(this.spacingMs || 0, wait);
      this.carefulUntil = Date.now() + 5000 + 20 * wait;
      this.failPending(new ImSyncError('RATE_LIMITED', f.message, f));
    } else if (f.type === 'error' && f.id === 'hello' && f.retry_after_ms != null) {
      // the hello was refused (RATE_LIMITED, UNAVAILABLE): the close that
      // follows reconnects no earlier than this
      this.helloRetryAfterMs = f.retry_after_ms;
      this.stats.refusedHellos++;
    } else if (f.type === 'error' && f.code === 'NOT_AUTHENTICATED') {
      this.setState('needs_token', f.message);
    }
  }

  async onWelcome(f) {
    this.attempt = 0;
    if (this.meta.user_id != null && (this.meta.user_id !== f.user_id ||
                                      this.meta.device_id != null && this.meta.device_id !== f.device_id)) {
      // a token of another account or device on this storage: never mix two views
      this.stopped = true;
      if (this.ws) this.ws.close(1000);
      this.setState('wrong_account', `storage belongs to user ${this.meta.user_id}, device ${this.meta.device_id}`);
      if (this.readyWaiter) { this.readyWaiter.reject(new ImSyncError('WRONG_ACCOUNT', 'storage belongs to another user')); this.readyWaiter = null; }
      return;
    }
    this.welcome = f;
    if (this.meta.user_id == null) {
      this.meta.user_id = f.user_id; this.meta.device_id = f.device_id;
      await this.commit({ puts: [['meta', { ...this.meta }]] });
    }
    // syncing until the first catch-up of this connection is done, then ready
    this.setState('syncing');
    clearInterval(this.pollTimer);
    if (this.pollMs) this.pollTimer = setInterval(() => { if (this.state === 'ready') this.requestSync(); }, this.pollMs);
    this.requestSync();
    this.flushOutbox();
  }

  onHint(f) {
    if (this.hooks.dropHints) return;
    if (f.reason === 'CONVERSATION_ADVANCED') {
      const c = this.view.convs.get(f.conversation_id);
      if (!c || f.head_msg_seq > c.last_msg_seq) this.requestFetch(f.conversation_id, f.head_msg_seq);
    } else if (f.high_watermark == null || f.high_watermark > this.meta.applied) {
      this.requestSync();
    }
  }

  request(frame) {
    const ws = this.ws;
    if (!ws || this.state !== 'ready' && this.state !== 'syncing') {
      return Promise.reject(new ImSyncError('DISCONNECTED', 'not connected'));
    }
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      try { ws.send(JSON.stringify({ ...frame, id })); } catch (e) {
        this.pending.delete(id);
        reject(new ImSyncError('DISCONNECTED', e.message));
      }
    });
  }

  // A request repeated while the server asks to wait (UNAVAILABLE,
  // RATE_LIMITED honour retry_after_ms); a closed connection ends it.
  async call(frame) {
    for (let i = 0; ; i++) {
      const wait = (this.pausedUntil || 0) - Date.now();
      if (wait > 0) await sleep(wait);
      try {
        if (Date.now() < (this.carefulUntil || 0)) return await this.carefully(frame);
        this.spacingMs = 0;
        return await this.request(frame);
      } catch (e) {
        if (!(e instanceof ImSyncError) || !['UNAVAILABLE', 'RATE_LIMITED'].includes(e.code) || i >= 20) throw e;
        await sleep(e.retryAfterMs != null ? e.retryAfterMs : BACKOFF_BASE_MS * 2 ** Math.min(i, 6));
      }
    }
  }

  // One request at a time, at most one per spacingMs (after a RATE_LIMITED).
  carefully(frame) {
    const run = this.serial.then(async () => {
      const gap = (this.lastSentAt || 0) + (this.spacingMs || 0) - Date.now();
      if (gap > 0) await sleep(gap);
      this.lastSentAt = Date.now();
      return this.request(frame);
    });
    this.serial = run.catch(() => {});
    return run;
  }

  // -- sync ------------------------------------------------------------------

  requestSync() {
    this.syncWanted = true;
    if (!this.syncing) {
      this.syncing = this.syncLoop().finally(() => {
        this.syncing = null;
        // a connection that came up while the old loop unwound
        if (this.syncWanted && (this.state === 'ready' || this.state === 'syncing')) setTimeout(() => this.requestSync(), 0);
      });
    }
  }

  requestFetch(conversationId, head) {
    const had = this.fetchWanted.get(conversationId) || 0;
    this.fetchWanted.set(conversationId, Math.max(had, head || 0));
    this.requestSync();
  }

  async syncLoop() {
    try {
      while (this.syncWanted && this.ws) {
        this.syncWanted = false;
        await this.catchUp();
        await this.refreshConversations();
        await this.catchUpSharedLogs();
        // caught up with the watermark this round saw: ready (contract §20)
        if (this.state === 'syncing' && this.ws) this.setState('ready');
        if (this.readyWaiter) { this.readyWaiter.resolve(); this.readyWaiter = null; }
        this.emit();
      }
    } catch (e) {
      if (e.code === 'DEVICE_REVOKED') {
        this.stopped = true;
        this.listen(false);
        if (this.ws) this.ws.close(1000);
        this.setState('revoked');
        if (this.readyWaiter) { this.readyWaiter.reject(e); this.readyWaiter = null; }
      } else if (!retryable(e)) {
        this.setState('error', e.message);
        if (this.readyWaiter) { this.readyWaiter.reject(e); this.readyWaiter = null; }
      }
      // retryable: the reconnect (or the next hint) syncs again
    }
  }

  // Batches until the device holds the user's watermark (contract §5).
  // A storage without a cursor (new install, wiped storage) starts from a
  // snapshot rather than replaying the whole log (design §7.5).
  async catchUp() {
    if (!this.meta.generation) await this.snapshot();
    for (let rounds = 0; rounds < 10000; rounds++) {
      const r = await this.call({ type: 'sync', sync_generation: this.meta.generation || null,
                                  local_applied_sync_seq: this.meta.applied, limit: this.pageLimit });
      switch (r.status) {
        case 'OK':
        case 'RECOVERY': {
          const done = await this.applyBatch(r);
          if (done) return;
          break;
        }
        case 'RESET_REQUIRED':
          await this.snapshot();
          break;
        case 'DEVICE_REVOKED':
          throw new ImSyncError('DEVICE_REVOKED', 'this device was revoked');
        default:
          // STALE_GENERATION, EXPIRED, INVALID_TOKEN: start again from the saved cursor
          break;
      }
    }
    throw new ImSyncError('INTERNAL', 'catch-up did not converge');
  }

  // One batch: every page, then ONE commit of the view and the cursor, then
  // the ACK.  Returns true when nothing more is due.
  async applyBatch(first) {
    const events = [...first.events];
    let page = first;
    while (page.has_more) {
      page = await this.call({ type: 'sync', cursor: page.next_cursor, limit: this.pageLimit });
      if (page.status !== 'OK' && page.status !== 'RECOVERY') return false;   // expired mid-batch: restart
      events.push(...page.events);
    }
    const me = this.meta.user_id;
    const dirty = new Set();
    for (const e of events) {
      const d = this.view.applyEvent(e, me);
      if (d != null) dirty.add(d);
    }
    const hw = first.batch_high_watermark;
    this.meta.generation = first.sync_generation;
    this.meta.applied = hw;
    await this.commitView();
    this.stats.batches++;
    this.stats.events += events.length;
    if (first.status === 'RECOVERY') this.stats.recoveries++;
    if (this.hooks.beforeAck) await this.hooks.beforeAck({ status: first.status, high_watermark: hw, events: events.length });
    const a = await this.call({ type: 'ack', batch_token: first.batch_token, acked_sync_seq: hw });
    for (const c of dirty) this.requestFetch(c, this.view.conv(c).dirty_target_msg_seq);
    if (a.status === 'RESET_REQUIRED') { await this.snapshot(); return false; }
    if (a.status === 'DEVICE_REVOKED') throw new ImSyncError('DEVICE_REVOKED', 'this device was revoked');
    if (a.status !== 'OK') return false;   // STALE_GENERATION / EXPIRED: sync again
    this.emit();
    return first.status === 'OK' && first.user_high_watermark <= hw;
  }

  // Storage commits one at a time in call order; none after stop().
  commit(change) {
    if (this.storageClosed) return Promise.reject(new ImSyncError('STOPPED', 'client stopped'));
    const run = this.commitChain.then(() => this.storage.commit(change));
    this.commitChain = run.catch(() => {});
    return run;
  }

  async commitView(extra = {}) {
    const puts = this.view.drain();
    puts.push(['meta', { ...this.meta }]);
    await this.commit({ clear: extra.clear || [], puts: [...(extra.puts || []), ...puts] });
  }

  // RESET_REQUIRED or a new device: a snapshot replaces the local view
  // (contract §6): the manifest's conversations, committed with the cursor =
  // base; then snapshot_ack.  No history is fetched here: the list shows
  // first, and a conversation's last historyPage positions are loaded when
  // it is opened (open(), or its first messages() call), older ones by
  // loadOlder() (contract §20, design §11.3).
  async snapshot() {
    if (this.state === 'ready') this.setState('syncing');
    const b = await this.call({ type: 'snapshot_begin' });
    if (b.status === 'DEVICE_REVOKED') throw new ImSyncError('DEVICE_REVOKED', 'this device was revoked');
    if (b.status !== 'READY') throw new ImSyncError('INTERNAL', `snapshot_begin: ${b.status}`);
    const items = [];
    const digests = [];
    for (let page = 0; page < b.page_count; page++) {
      const p = await this.call({ type: 'snapshot_fetch', snapshot_token: b.snapshot_token, page });
      if (p.status !== 'OK') return;        // a newer reset happened: the sync loop starts again
      items.push(...p.items);
      digests.push(p.page_digest);
    }
    // the manifest digest is the SHA-256 of the page digests (contract §6)
    if (await sha256Hex(digests.join('')) !== b.manifest_digest) {
      throw new ImSyncError('INTERNAL', 'snapshot pages do not match the manifest digest');
    }
    this.view.reset();
    this.opening.clear();
    for (const it of items) {
      const c = this.view.conv(it.conversation_id);
      const last = it.last_msg_seq || 0;
      const joins = (it.periods || []).map((p) => p.join_seq).filter((x) => x != null);
      Object.assign(c, { kind: it.kind, mode: it.mode, read_msg_seq: it.read_msg_seq || 0,
                         dirty_target_msg_seq: it.dirty_target_msg_seq || 0,
                         dirty_version: it.dirty_version || 0, pinned: it.pinned || [],
                         last_msg_seq: last, loaded_from: last + 1,
                         history_floor: joins.length ? Math.max(1, Math.min(...joins)) : 1,
                         server_unread: it.unread_count ?? null, server_unread_at: last,
                         last_activity_at: it.last_activity_at ?? null,
                         my_role: it.my_role ?? null, muted_until: it.muted_until ?? null, standing_seq: last });
      this.view.pinRanked(c, it.conversation_pinned);
      if (it.periods && it.periods.length && it.periods.every((p) => p.leave_seq != null)) c.left = true;
    }
    this.meta.generation = b.sync_generation;
    this.meta.applied = b.base_sync_seq;
    await this.commitView({ clear: ['c/', 'p/'] });
    this.stats.snapshots++;
    const a = await this.call({ type: 'snapshot_ack', snapshot_token: b.snapshot_token, manifest_digest: b.manifest_digest });
    if (a.status === 'DEVICE_REVOKED') throw new ImSyncError('DEVICE_REVOKED', 'this device was revoked');
    // any other status: the next sync answers RESET_REQUIRED and this runs again
    this.emit();
  }

  // Positions (after, upTo] of one conversation into the view (not committed).
  async fetchInto(conversationId, after, upTo, me) {
    let cursor = after;
    for (;;) {
      const r = await this.call({ type: 'fetch_messages', conversation_id: conversationId, after_seq: cursor,
                                  limit: FETCH_LIMIT, up_to_seq: upTo == null ? null : upTo });
      for (const m of r.messages || []) this.view.applyPosition(m, me);
      if (!r.has_more || r.next_after_seq == null || r.next_after_seq <= cursor) return;
      cursor = r.next_after_seq;
    }
  }

  // The conversation list: kinds, modes, authoritative heads (contract §7),
  // so a shared_log group whose hints were all lost still catches up; from
  // recent_conversations (contract §20: activity and conversation pins too),
  // or from conversations on a gateway that does not know that frame.
  async refreshConversations() {
    if (!this.noRecent) {
      try {
        await this.refreshRecent();
        return;
      } catch (e) {
        if (!(e instanceof ImSyncError) || e.code !== 'BAD_FRAME') throw e;
        this.noRecent = true;          // an older gateway: the id order, no pins
      }
    }
    let after = null;
    for (;;) {
      const r = await this.call({ type: 'conversations', limit: RECENT_LIMIT, after_conversation_id: after });
      const rows = r.rows || [];
      for (const row of rows) {
        this.applyListRow(row);
        after = row.conversation_id;
      }
      if (rows.length < RECENT_LIMIT) break;
    }
    await this.commitView();
  }

  // Every page of recent_conversations; a conversation that moved between
  // pages may come twice (the first row counts) or be missed (sync brings
  // its change anyway).  Pinned rows come first, most recently pinned first:
  // their ranks are renumbered in that order.
  async refreshRecent() {
    let cursor = null;
    const seen = new Set();
    const pinned = [];
    for (let pages = 0; pages < 10000; pages++) {
      const r = await this.call({ type: 'recent_conversations', limit: RECENT_LIMIT, after_cursor: cursor });
      const rows = r.rows || [];
      for (const row of rows) {
        if (seen.has(row.conversation_id)) continue;
        seen.add(row.conversation_id);
        const c = this.applyListRow(row);
        if (laterThan(row.last_activity_at, c.last_activity_at)) c.last_activity_at = row.last_activity_at;
        c.conversation_pinned = !!row.conversation_pinned;
        if (row.left_conversation != null) c.left = !!row.left_conversation;
        if (c.conversation_pinned) pinned.push(c);
      }
      const next = rows.length ? rows[rows.length - 1].next_cursor : null;
      if (rows.length < RECENT_LIMIT || next == null || next === cursor) break;
      cursor = next;
    }
    const base = this.view.pinClock;
    pinned.forEach((c, i) => { c.pin_order = base + pinned.length - i; });
    this.view.pinClock = base + pinned.length;
    await this.commitView();
  }

  applyListRow(row) {
    const c = this.view.conv(row.conversation_id);
    c.kind = row.kind;
    c.mode = row.mode;
    c.head_msg_seq = row.head_msg_seq;
    if (row.read_msg_seq > c.read_msg_seq) c.read_msg_seq = row.read_msg_seq;
    // the role and mute as of the row's last position, unless a newer
    // position already said otherwise
    if ('my_role' in row && !(c.standing_seq > (row.last_msg_seq ?? 0))) {
      c.my_role = row.my_role ?? null; c.muted_until = row.muted_until ?? null;
      c.standing_seq = row.last_msg_seq ?? c.standing_seq;
    }
    if (row.unread_count != null) { c.server_unread = row.unread_count; c.server_unread_at = row.last_msg_seq ?? c.last_msg_seq; }
    if (row.mode === 'shared_log' && row.dirty_target_msg_seq > c.last_msg_seq) {
      c.dirty = true;
      c.dirty_version = Math.max(c.dirty_version, row.dirty_version);
      c.dirty_target_msg_seq = Math.max(c.dirty_target_msg_seq, row.dirty_target_msg_seq);
      this.requestFetchQuiet(row.conversation_id, row.dirty_target_msg_seq);
    }
    return c;
  }

  requestFetchQuiet(conversationId, head) {
    const had = this.fetchWanted.get(conversationId) || 0;
    this.fetchWanted.set(conversationId, Math.max(had, head || 0));
  }

  // shared_log groups: fetch what the marker (or a hint) announces, commit,
  // then clear_dirty with the version seen; a newer message in between
  // keeps the marker and the next round fetches again (contract §7, §10.3).
  async catchUpSharedLogs() {
    const me = this.meta.user_id;
    for (let round = 0; this.fetchWanted.size && round < 100; round++) {
      const wanted = [...this.fetchWanted.entries()];
      this.fetchWanted.clear();
      for (const [cid] of wanted) {
        const c = this.view.conv(cid);
        const version = c.dirty_version;
        await this.fetchInto(cid, c.last_msg_seq, null, me);
        await this.commitView();
        if (c.dirty || c.mode === 'shared_log') {
          const r = await this.call({ type: 'clear_dirty', conversation_id: cid, observed_version: version,
                                      saved_last_msg_seq: c.last_msg_seq });
          if (r.cleared) c.dirty = false;
          else if (r.dirty_target_msg_seq > c.last_msg_seq || r.dirty_version !== version) {
            c.dirty_version = Math.max(c.dirty_version, r.dirty_version);
            this.requestFetchQuiet(cid, r.dirty_target_msg_seq);
          }
          await this.commitView();
        }
      }
      this.emit();
    }
  }

  // -- outbox ----------------------------------------------------------------

  // Queues an operation in storage first, then sends it; the promise settles
  // with the server's answer (a reload re-sends it with the same id, and the
  // server answers the original row: created = false).
  async enqueue(op) {
    if (!this.loaded) throw new Error('ImSyncClient: start() first');
    const item = { ...op, client_msg_id: op.client_msg_id || newClientMsgId(), queued_at: new Date().toISOString() };
    this.meta.outbox_seq = (this.meta.outbox_seq || 0) + 1;
    const key = `o/${String(this.meta.outbox_seq).padStart(12, '0')}`;
    const done = new Promise((resolve, reject) => this.waiters.set(item.client_msg_id, { resolve, reject }));
    done.catch(() => {});   // the caller gets the rejection; stop() may come first
    try {
      await this.commit({ puts: [[key, item], ['meta', { ...this.meta }]] });
    } catch (e) {
      this.waiters.delete(item.client_msg_id);
      throw e;
    }
    this.outbox.set(key, item);
    this.emit();
    this.flushOutbox();
    return done;
  }

  flushOutbox() {
    if (!this.flushing) {
      this.flushing = this.flushLoop()
        .catch((e) => { if (!retryable(e) && e.code !== 'STOPPED') this.setState('error', e.message); })
        .finally(() => {
          this.flushing = null;
          // a connection that came up while the old loop unwound
          if (this.outbox.size && (this.state === 'ready' || this.state === 'syncing')) setTimeout(() => this.flushOutbox(), 0);
        });
    }
    return this.flushing;
  }

  // One at a time, in queue order, so a conversation sees them in the order
  // they were made.
  async flushLoop() {
    while (this.state === 'ready' || this.state === 'syncing') {
      const keys = [...this.outbox.keys()].sort();
      if (!keys.length) return;
      const key = keys[0];
      const item = this.outbox.get(key);
      let result; let failure = null;
      try {
        result = await this.call(this.frameFor(item));
      } catch (e) {
        if (retryable(e)) return;          // kept: the next connection sends it again
        failure = e;                        // refused for good (FORBIDDEN, CONFLICT, …)
      }
      this.outbox.delete(key);
      await this.commit({ deletes: [key] });
      const w = this.waiters.get(item.client_msg_id);
      this.waiters.delete(item.client_msg_id);
      if (failure) { if (w) w.reject(failure); else this.onStatus({ state: this.state, detail: `dropped ${item.type}: ${failure.message}` }); }
      else if (w) w.resolve(result);
      if (!failure && item.type !== 'read') this.requestSync();
      if (item.type === 'pin_conversation' && result && result.conversation_pinned != null) {
        const c = this.view.conv(item.conversation_id);
        if (!!result.conversation_pinned !== !!c.conversation_pinned) { this.view.pinRanked(c, result.conversation_pinned); await this.commitView(); }
      }
      if (item.type === 'read' && result) {
        const c = this.view.conv(item.conversation_id);
        if (result.read_msg_seq > c.read_msg_seq) { c.read_msg_seq = result.read_msg_seq; await this.commitView(); }
      }
      this.emit();
    }
  }

  frameFor(item) {
    const f = { type: item.type, conversation_id: item.conversation_id };
    switch (item.type) {
      case 'send':
        return { ...f, client_msg_id: item.client_msg_id, body: item.body, content_type: item.content_type ?? null,
                 ...(item.reply_to_message_id != null ? { reply_to_message_id: item.reply_to_message_id } : {}) };
      case 'recall':
        return { ...f, client_msg_id: item.client_msg_id, target_message_id: item.target_message_id };
      case 'edit':
        return { ...f, client_msg_id: item.client_msg_id, target_message_id: item.target_message_id, body: item.body };
      case 'react':
        return { ...f, client_msg_id: item.client_msg_id, target_message_id: item.target_message_id,
                 reaction: item.reaction, present: item.present };
      case 'pin':
        return { ...f, client_msg_id: item.client_msg_id, target_message_id: item.target_message_id, pinned: item.pinned };
      case 'read':
        return { ...f, read_to_seq: item.read_to_seq };
      case 'pin_conversation':
        // `pinned` as the pin frame names it, `pin` as the SQL function does
        return { ...f, pinned: item.pinned, pin: item.pinned };
      // roles, mutes, removals (contract §17): the actor is the session's user
      case 'set_role':
        return { ...f, client_msg_id: item.client_msg_id, target_user_id: item.target_user_id, role: item.role };
      case 'mute_member':
        return { ...f, client_msg_id: item.client_msg_id, target_user_id: item.target_user_id,
                 muted_until: item.muted_until ?? null };
      case 'remove_member':
        return { ...f, client_msg_id: item.client_msg_id, target_user_id: item.target_user_id, ban: !!item.ban };
      default:
        throw new Error(`unknown outbox item ${item.type}`);
    }
  }

  // -- the API of contract §16 ------------------------------------------------

  send(conversationId, body, { contentType = null, replyTo = null, clientMsgId = null } = {}) {
    return this.enqueue({ type: 'send', conversation_id: conversationId, body, content_type: contentType,
                          reply_to_message_id: replyTo, client_msg_id: clientMsgId });
  }
  read(conversationId, msgSeq) {
    return this.enqueue({ type: 'read', conversation_id: conversationId, read_to_seq: msgSeq });
  }
  recall(conversationId, messageId) {
    return this.enqueue({ type: 'recall', conversation_id: conversationId, target_message_id: messageId });
  }
  edit(conversationId, messageId, body) {
    return this.enqueue({ type: 'edit', conversation_id: conversationId, target_message_id: messageId, body });
  }
  react(conversationId, messageId, key, present) {
    return this.enqueue({ type: 'react', conversation_id: conversationId, target_message_id: messageId,
                          reaction: key, present: !!present });
  }
  pin(conversationId, messageId, pinned) {
    return this.enqueue({ type: 'pin', conversation_id: conversationId, target_message_id: messageId, pinned: !!pinned });
  }
  // The user's conversation pin (contract §20), distinct from pin() of a
  // message: queued like the other operations; the answer and the
  // conversation_pin event both set conversation_pinned.
  pinConversation(conversationId, pinned) {
    return this.enqueue({ type: 'pin_conversation', conversation_id: conversationId, pinned: !!pinned });
  }
  // Roles, mutes and removals in a group (contract §17), queued like the
  // other writes (idempotent by their client_msg_id).  muteMember's until:
  // a Date or an ISO 8601 string, null to unmute.
  setRole(conversationId, userId, role) {
    return this.enqueue({ type: 'set_role', conversation_id: conversationId, target_user_id: userId, role });
  }
  muteMember(conversationId, userId, until) {
    const mutedUntil = until == null ? null : (until instanceof Date ? until.toISOString() : String(until));
    return this.enqueue({ type: 'mute_member', conversation_id: conversationId, target_user_id: userId,
                          muted_until: mutedUntil });
  }
  removeMember(conversationId, userId, { ban = false } = {}) {
    return this.enqueue({ type: 'remove_member', conversation_id: conversationId, target_user_id: userId, ban: !!ban });
  }

  // Loads the last historyPage positions of a conversation whose history is
  // not local (a new device's snapshot); resolves at once otherwise.  The
  // first messages(conversationId) call starts it too.
  open(conversationId) {
    const c = this.view.convs.get(conversationId);
    if (!c || c.opened || !this.view.hasOlder(c)) return Promise.resolve({ status: 'OK', loaded: 0, hasOlder: !!c && this.view.hasOlder(c) });
    let p = this.opening.get(conversationId);
    if (!p) {
      p = this.loadOlder(conversationId).then((r) => {
        if (r.status === 'OK' && this.view.convs.get(conversationId) === c) { this.view.conv(conversationId).opened = true; }
        return r;
      }).finally(() => this.opening.delete(conversationId));
      this.opening.set(conversationId, p);
    }
    return p;
  }

  // The historyPage positions before the oldest local one, through
  // fetch_messages.  A cold range (history_status PREPARING, contract §19)
  // is waited for until history_ready or historyTimeoutMs; then the answer is
  // {status: 'PREPARING', restoreTaskId}.  Otherwise {status: 'OK', loaded,
  // hasOlder}.
  async loadOlder(conversationId) {
    const c = this.view.convs.get(conversationId);
    if (!c || !this.view.hasOlder(c)) return { status: 'OK', loaded: 0, hasOlder: false };
    const upTo = c.loaded_from - 1;
    const after = Math.max((c.history_floor || 1) - 1, upTo - this.historyPage);
    const deadline = Date.now() + this.historyTimeoutMs;
    for (;;) {
      const r = await this.fetchRange(conversationId, after, upTo);
      if (this.view.convs.get(conversationId) !== c) return { status: 'OK', loaded: 0, hasOlder: false };   // a snapshot replaced the view
      if (r.status === 'OK') {
        if (c.loaded_from > after + 1) c.loaded_from = after + 1;
        this.view.conv(conversationId);
        await this.commitView();
        this.emit();
        return { status: 'OK', loaded: r.loaded, hasOlder: this.view.hasOlder(c) };
      }
      await this.commitView();
      const left = deadline - Date.now();
      const ready = left > 0 ? await this.historyReady(conversationId, r.restoreTaskId, left) : null;
      if (!ready) { this.emit(); return { status: 'PREPARING', restoreTaskId: r.restoreTaskId, loaded: r.loaded, hasOlder: true }; }
    }
  }

  // Positions (after, upTo] applied to the view, page by page.
  async fetchRange(conversationId, after, upTo) {
    const me = this.meta.user_id;
    let cursor = after; let loaded = 0;
    for (;;) {
      const r = await this.call({ type: 'fetch_messages', conversation_id: conversationId, after_seq: cursor,
                                  limit: this.historyPage, up_to_seq: upTo });
      const ids = new Set();
      for (const m of r.messages || []) {
        this.view.applyPosition(m, me); loaded++;
        if (m.kind === 'message') ids.add(m.message_id);
      }
      // reactions, edits, recalls and takedowns already local whose target arrived only
      // now (they came first, with the newer history): applied again, in order
      const later = [...(this.view.positions.get(conversationId) || new Map()).values()]
        .filter((q) => q.msg_seq > upTo && ids.has(q.target_message_id) && ['reaction', 'edit', 'recall', 'takedown'].includes(q.kind))
        .sort((a, b) => a.msg_seq - b.msg_seq);
      for (const q of later) this.view.applyPosition(q, me);
      if (r.history_status === 'PREPARING') return { status: 'PREPARING', restoreTaskId: r.restore_task_id ?? null, loaded };
      if (!r.has_more || r.next_after_seq == null || r.next_after_seq <= cursor) return { status: 'OK', loaded };
      cursor = r.next_after_seq;
    }
  }

  // A history_ready frame for this conversation (or task), or null after ms.
  historyReady(conversationId, taskId, ms) {
    return new Promise((resolve) => {
      const done = (f) => {
        if (f && f.conversation_id !== conversationId && (taskId == null || f.restore_task_id !== taskId)) return;
        clearTimeout(timer);
        this.historyWaiters.delete(done);
        resolve(f);
      };
      const timer = setTimeout(() => done(null), ms);
      this.historyWaiters.add(done);
    });
  }
  // The four facts of a message this user sent, per recipient (contract §16).
  async messageStatus(messageId) {
    const r = await this.call({ type: 'message_status', message_id: messageId });
    return r.rows || [];
  }
  // Read receipts on or off for this user (contract §20): off, others'
  // receipts carry no read state of this user (delivery still).  A direct
  // call, not queued: it answers with the setting now.
  async setReadReceipts(enabled) {
    const r = await this.call({ type: 'set_read_receipts', enabled: !!enabled });
    return r.read_receipts;
  }
  async deleteForMe(conversationId, messageId) {
    const r = await this.call({ type: 'delete_for_me', conversation_id: conversationId, message_id: messageId });
    this.requestSync();
    return r.deleted;
  }

  get userId() { return this.meta.user_id; }
  get deviceId() { return this.meta.device_id; }

  // Local view: conversations in the recent order (contract §20): pinned
  // first, most recently pinned first, then by last_activity_at, newest
  // first, ties by id.  `pinned` is the conversation's pinned-message list,
  // `conversation_pinned` the user's pin of the conversation.
  conversations() {
    const me = this.meta.user_id;
    return [...this.view.convs.values()]
      .sort(recentOrder)
      .map((c) => ({
        conversation_id: c.conversation_id, kind: c.kind, mode: c.mode, last_msg_seq: c.last_msg_seq,
        read_msg_seq: c.read_msg_seq, unread: this.view.unread(c, me), dirty: !!c.dirty,
        pinned: [...(c.pinned || [])], left: !!c.left,
        conversation_pinned: !!c.conversation_pinned, last_activity_at: c.last_activity_at ?? null,
        has_older: this.view.hasOlder(c), my_role: c.my_role ?? null, muted_until: c.muted_until ?? null,
      }));
  }

  // Local view: a conversation's positions in msg_seq order, shaped like
  // fetch_messages (recalls, edits, reactions applied; deleted ones left out).
  //
  // The user's own messages carry the receipts (contract §20): `delivered`
  // and `read`; in a group also `delivered_count`, `read_count` and
  // `member_count` (delivered / read there mean: by at least one member).
  // The first call for a conversation whose history is not local starts
  // open(conversationId); onChange fires when its page is in.
  messages(conversationId) {
    const me = String(this.meta.user_id);
    const c = this.view.convs.get(conversationId);
    if (c && !c.opened && this.view.hasOlder(c) && !this.opening.has(conversationId) && this.ws &&
        (this.state === 'ready' || this.state === 'syncing')) {
      this.open(conversationId).catch(() => { /* the next call tries again */ });
    }
    const m = this.view.positions.get(conversationId);
    if (!m) return [];
    return [...m.values()]
      .filter((p) => !p.deleted)
      .sort((a, b) => a.msg_seq - b.msg_seq)
      .map((p) => {
        const out = { kind: p.kind, conversation_id: p.conversation_id, msg_seq: p.msg_seq, message_id: p.message_id,
                      sender_id: p.sender_id, content_type: p.content_type, body: p.body,
                      target_message_id: p.target_message_id, recalled: !!p.recalled && !p.taken_down,
                      taken_down: !!p.taken_down, erased: !!p.erased, created_at: p.created_at };
        if (p.kind === 'message') {
          out.reply_to_message_id = p.reply_to_message_id;
          out.edited = !!p.edited;
          out.reactions = reactionCounts(p);
          out.my_reactions = [...((p.reactionsByUser || {})[me] || [])];
          if (String(p.sender_id) === me && c) {
            const rc = (c.msg_receipts || {})[p.message_id];
            if (rc) {
              out.delivered = rc.delivered_count > 0 || rc.read_count > 0;
              out.read = rc.read_count > 0;
              out.delivered_count = rc.delivered_count; out.read_count = rc.read_count; out.member_count = rc.member_count;
            } else {
              out.read = p.msg_seq <= (c.read_through_seq || 0);
              out.delivered = out.read || p.msg_seq <= (c.delivered_through_seq || 0);
              if (c.kind && c.kind !== 'direct') { out.delivered_count = 0; out.read_count = 0; out.member_count = null; }
            }
          }
        }
        return out;
      });
  }

  // Operations still in the outbox (sent again on the next connection).
  outboxItems() {
    return [...this.outbox.entries()].sort(([a], [b]) => (a < b ? -1 : 1)).map(([, v]) => ({ ...v }));
  }

  emit() {
    try { this.onChange(this); } catch (e) { /* a view callback never breaks sync */ }
  }
}
