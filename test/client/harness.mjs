// Shared pieces of the client tests: psql for setup and for the server's
// truth (fetch_messages), a gateway process the tests can kill and restart,
// clients on the real module, and waiting with a deadline (no timed
// assertions).
import { execFileSync, spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import { ImSyncClient, MemoryStorage, FileStorage } from '../../gateway/web/im_sync_client.js';

const require = createRequire(new URL('../../gateway/package.json', import.meta.url));
export const WS = require('ws');
export { ImSyncClient, MemoryStorage, FileStorage };

const env = process.env;
export const TMP = env.IM_CLIENT_TMP || fs.mkdtempSync('/tmp/im_client.');
const DB = env.IM_CLIENT_DB || 'im_test';
const PSQL = env.PGBIN ? path.join(env.PGBIN, 'psql') : 'psql';

export function sql(query) {
  return execFileSync(PSQL, ['-X', '-At', '-q', '-v', 'ON_ERROR_STOP=1', '-d', DB, '-c', query],
                      { encoding: 'utf8' }).trim();
}
export const sqlJson = (query) => JSON.parse(sql(query) || 'null');

let nextUser = 7_000_000 + (process.pid % 5000) * 200;
export function newUser() { return nextUser++; }

export function token(user, device) {
  sql(`SELECT * FROM im.register_device(${user}, '${device}')`);
  return sql(`SELECT im.issue_device_token(${user}, '${device}', '1 hour')`);
}

// The server's truth for one user: every visible position, shaped like the
// client's view (contract §6 fetch_messages).
export function serverView(user, conv) {
  const out = [];
  let after = 0;
  for (;;) {
    const r = sqlJson(`SELECT row_to_json(f) FROM im.fetch_messages(${user}, ${conv}, ${after}, 1000) f`);
    out.push(...r.messages);
    if (!r.has_more) break;
    after = r.next_after_seq;
  }
  return out.map(normalize);
}

function sortedObject(o) {
  return Object.fromEntries(Object.entries(o || {}).sort(([a], [b]) => (a < b ? -1 : 1)));
}
export function normalize(p) {
  const n = { kind: p.kind, msg_seq: p.msg_seq, message_id: p.message_id, sender_id: p.sender_id,
              body: p.body, recalled: p.recalled, taken_down: !!p.taken_down, erased: !!p.erased,
              target_message_id: p.target_message_id ?? null };
  if (p.kind === 'message') {
    n.reply_to_message_id = p.reply_to_message_id ?? null;
    n.reactions = sortedObject(p.reactions);
    n.my_reactions = [...(p.my_reactions || [])].sort();
  }
  return n;
}
export const clientView = (client, conv) => client.messages(conv).map(normalize);

export async function waitFor(what, cond, ms = 60000) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try { last = await cond(); if (last === true) return; } catch (e) { last = e; }
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}: ${last instanceof Error ? last.stack : JSON.stringify(last)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// Converged: the client's view of conv equals fetch_messages for its user,
// and its unread equals the server's count.
export async function converge(client, user, conv, ms = 60000) {
  await waitFor(`user ${user} converging on conversation ${conv}`, () => {
    const want = JSON.stringify(serverView(user, conv));
    const got = JSON.stringify(clientView(client, conv));
    if (want !== got) {
      const w = JSON.parse(want); const g = JSON.parse(got);
      let i = 0;
      while (i < w.length && i < g.length && JSON.stringify(w[i]) === JSON.stringify(g[i])) i++;
      return { lengths: [w.length, g.length], first_difference: i, want: w[i], got: g[i] };
    }
    const c = client.conversations().find((x) => x.conversation_id === conv);
    const unread = Number(sql(`SELECT unread_count FROM im.conversation_list(${user}) WHERE conversation_id = ${conv}`));
    if (!c || c.unread !== unread) return { unread_client: c && c.unread, unread_server: unread };
    return true;
  }, ms);
}

// The gateway as a child process that a test may kill -9 and start again.
export class Gateway {
  constructor(port) { this.port = port || 0; this.proc = null; }
  get url() { return `ws://127.0.0.1:${this.port}/`; }
  get httpUrl() { return `http://127.0.0.1:${this.port}/`; }
  async start(extra = []) {
    if (!this.port) this.port = await freePort();
    const bin = env.IM_GATEWAY_BIN || path.resolve('gateway/im_gateway');
    const conninfo = env.IM_GATEWAY_DB || `host=${env.PGHOST} port=${env.PGPORT} user=${env.PGUSER} dbname=${DB}`;
    const log = fs.openSync(path.join(TMP, `gateway-${this.port}.log`), 'a');
    this.proc = spawn(bin, ['--listen', `127.0.0.1:${this.port}`, '--db', conninfo, '--pool', '4', ...extra],
                      { stdio: ['ignore', log, log] });
    const proc = this.proc;
    await waitFor('the gateway to answer /healthz', async () => {
      if (proc.exitCode != null) throw new Error(`gateway exited ${proc.exitCode}`);
      const r = await fetch(this.httpUrl + 'healthz').catch(() => null);
      return !!r && r.status === 200;
    }, 20000);
  }
  kill9() {
    const p = this.proc;
    this.proc = null;
    if (!p) return Promise.resolve();
    return new Promise((resolve) => { p.once('exit', resolve); p.kill('SIGKILL'); });
  }
  stop() {
    const p = this.proc;
    this.proc = null;
    if (!p || p.exitCode != null) return Promise.resolve();
    return new Promise((resolve) => { p.once('exit', resolve); p.kill('SIGTERM'); });
  }
}

// Debian's chromium, headless, through puppeteer-core from the lockfile;
// pages in the background keep running (two pages are two devices).
export function launchChromium(userDataDir, extra = {}) {
  const puppeteer = require('puppeteer-core');
  return puppeteer.launch({
    executablePath: env.IM_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    userDataDir,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage',
           '--disable-background-timer-throttling', '--disable-renderer-backgrounding',
           '--disable-backgrounding-occluded-windows'],
    ...extra,
  });
}

export async function freePort() {
  const net = await import('node:net');
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

export function client(gw, tok, storage, opts = {}) {
  return new ImSyncClient({ url: gw.url, token: tok, storage: storage || new MemoryStorage(), WebSocket: WS,
                            pollMs: 2000, ...opts });
}

// A deterministic PRNG (mulberry32), so a failing run can be repeated with IM_CLIENT_SEED.
export function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// A gateway in the test process (a test double of contract §10): the frames
// a client sends are recorded in `sent`; `reply(frame)` answers them from a
// small model (one user's log, conversations and positions) that a test
// edits or overrides; `push(frame)` sends an unrequested frame; `closeAll`
// closes every socket with a code.  No timers decide anything: replies go
// out on the next turn of the event loop.
export class FakeGateway {
  constructor({ user = 1, device = 'fake' } = {}) {
    this.user = user; this.device = device;
    this.sent = [];
    this.sockets = new Set();
    this.log = [];                  // the user's events (sync_seq from 1)
    this.convs = new Map();         // id → {kind, mode, positions: [], pinned, last_activity_at, unread}
    this.recent = true;             // false: recent_conversations is an unknown type (BAD_FRAME)
    this.hello = null;              // (socket, frame) => true to take over the answer
    this.handlers = {};             // type → (frame) => reply, before the model
    const fake = this;
    this.WebSocket = class FakeSocket {
      constructor(url, protocol) {
        this.url = url; this.protocol = protocol; this.open = true;
        this.onopen = null; this.onmessage = null; this.onclose = null; this.onerror = null;
        fake.sockets.add(this);
        setImmediate(() => this.onopen && this.onopen({}));
      }
      send(text) {
        const f = JSON.parse(text);
        fake.sent.push(f);
        if (f.type === 'hello' && fake.hello && fake.hello(this, f)) return;
        const r = fake.answer(f);
        if (r !== undefined) this.deliver({ ...r, id: f.id });
      }
      deliver(frame) { setImmediate(() => { if (this.open && this.onmessage) this.onmessage({ data: JSON.stringify(frame) }); }); }
      close(code = 1000, reason = '') {
        if (!this.open) return;
        this.open = false;
        fake.sockets.delete(this);
        setImmediate(() => this.onclose && this.onclose({ code, reason }));
      }
    };
  }

  conv(id, { kind = 'group', mode = 'fanout', messages = 0, sender = 2, at = 0 } = {}) {
    const c = { kind, mode, positions: [], conversation_pinned: false, unread: 0 };
    this.convs.set(id, c);
    for (let i = 1; i <= messages; i++) this.position(id, sender, `m${i}`, at + i);
    return c;
  }
  // A message position, at second `at` of the test's day (its created_at).
  position(id, sender, text, at) {
    const c = this.convs.get(id);
    const seq = c.positions.length + 1;
    const p = { kind: 'message', conversation_id: id, msg_seq: seq, message_id: id * 100000 + seq, sender_id: sender,
                content_type: null, body: { text }, target_message_id: null, recalled: false,
                created_at: new Date(Date.UTC(2024, 0, 1) + at * 1000).toISOString().replace('Z', '+00:00'),
                reply_to_message_id: null };
    c.positions.push(p);
    c.last_activity_at = p.created_at;
    return p;
  }
  event(e) { const ev = { ...e, sync_seq: this.log.length + 1 }; this.log.push(ev); return ev; }
  count(type) { return this.sent.filter((f) => f.type === type).length; }
  push(frame) { for (const s of this.sockets) s.deliver(frame); }
  closeAll(code, reason = '') {
    for (const s of [...this.sockets]) {
      s.open = false; this.sockets.delete(s);
      setImmediate(() => s.onclose && s.onclose({ code, reason }));
    }
  }

  rows() {
    const rows = [...this.convs.entries()].map(([id, c]) => ({
      conversation_id: id, kind: c.kind, mode: c.mode, last_msg_seq: c.positions.length, read_msg_seq: 0,
      unread_count: c.unread, dirty_target_msg_seq: 0, dirty_version: 0, head_msg_seq: c.positions.length,
      last_activity_at: c.last_activity_at || null, conversation_pinned: c.conversation_pinned,
      left_conversation: false, my_role: 'member', muted_until: null,
    }));
    return rows;
  }

  answer(f) {
    if (this.handlers[f.type]) {
      const r = this.handlers[f.type](f);
      if (r !== undefined) return r;
    }
    const hw = this.log.length;
    switch (f.type) {
      case 'hello':
        return { type: 'welcome', user_id: this.user, device_id: this.device, connection_epoch: 1, sync_generation: 1,
                 server_acked_sync_seq: 0, high_watermark: hw };
      case 'snapshot_begin':
        this.base = hw;
        return { type: 'snapshot_begin_result', status: 'READY', snapshot_id: 1, sync_generation: 1, base_sync_seq: hw,
                 snapshot_token: 'snap', page_count: 1, manifest_digest: sha256Hex('page0') };
      case 'snapshot_fetch':
        return { type: 'snapshot_fetch_result', status: 'OK', page: 0, page_count: 1, page_digest: 'page0',
                 items: this.rows().map((r) => ({ conversation_id: r.conversation_id, kind: r.kind, mode: r.mode, version: 1,
                                                  periods: [{ membership_period_id: 1, join_seq: 1, leave_seq: null }],
                                                  last_msg_seq: r.last_msg_seq, read_msg_seq: 0, unread_count: r.unread_count,
                                                  dirty_target_msg_seq: 0, dirty_version: 0, recalled_message_ids: [],
                                                  conversation_pinned: r.conversation_pinned, digest: 'x' })) };
      case 'snapshot_ack':
        return { type: 'snapshot_ack_result', status: 'OK', acked_sync_seq: this.base };
      case 'sync':
        return { type: 'sync_result', status: 'OK', sync_generation: 1, batch_token: `b${hw}`,
                 events: this.log.filter((e) => e.sync_seq > (f.local_applied_sync_seq || 0)),
                 batch_high_watermark: hw, user_high_watermark: hw, has_more: false, next_cursor: null };
      case 'ack':
        return { type: 'ack_result', status: 'OK', acked_sync_seq: f.acked_sync_seq };
      case 'recent_conversations': {
        if (!this.recent) return { type: 'error', code: 'BAD_FRAME', message: 'unknown type' };
        const at = (r) => (r.last_activity_at ? Date.parse(r.last_activity_at) : -Infinity);
        const rows = this.rows().sort((a, b) => (b.conversation_pinned - a.conversation_pinned) ||
                                                (at(b) - at(a)) || (a.conversation_id - b.conversation_id));
        const from = f.after_cursor ? Number(f.after_cursor) : 0;
        const page = rows.slice(from, from + (f.limit || 50)).map((r, i) => ({ ...r, next_cursor: String(from + i + 1) }));
        return { type: 'recent_conversations_result', rows: page };
      }
      case 'conversations': {
        const rows = this.rows().filter((r) => r.conversation_id > (f.after_conversation_id || 0))
          .sort((a, b) => a.conversation_id - b.conversation_id).slice(0, f.limit || 100);
        return { type: 'conversations_result', rows };
      }
      case 'fetch_messages': {
        const c = this.convs.get(f.conversation_id);
        const upTo = f.up_to_seq ?? c.positions.length;
        const all = c.positions.filter((p) => p.msg_seq > f.after_seq && p.msg_seq <= upTo);
        const page = all.slice(0, f.limit || 100);
        return { type: 'fetch_messages_result', messages: page, has_more: all.length > page.length,
                 next_after_seq: page.length ? page[page.length - 1].msg_seq : f.after_seq,
                 expired_through_seq: 0, history_status: 'OK', restore_task_id: null };
      }
      case 'pin_conversation': {
        const c = this.convs.get(f.conversation_id);
        c.conversation_pinned = !!f.pinned;
        return { type: 'pin_conversation_result', conversation_pinned: c.conversation_pinned };
      }
      case 'clear_dirty':
        return { type: 'clear_dirty_result', cleared: true, dirty_target_msg_seq: 0, dirty_version: 0 };
      default:
        return { type: 'error', code: 'BAD_FRAME', message: `the fake does not know ${f.type}` };
    }
  }
}

function sha256Hex(text) {
  return createHash('sha256').update(text).digest('hex');
}

// A WebSocket class that counts what a client sends (by type) and the
// positions each fetch_messages answer carried (by conversation).
export function countingWS(Base, counts) {
  counts.frames = counts.frames || {};
  counts.positions = counts.positions || {};
  const asked = new Map();
  return class extends Base {
    constructor(...args) {
      super(...args);
      this.addEventListener('message', (ev) => {
        const f = JSON.parse(String(ev.data));
        if (f.type === 'fetch_messages_result' && asked.has(f.id)) {
          const cid = asked.get(f.id);
          counts.positions[cid] = (counts.positions[cid] || 0) + (f.messages || []).length;
        }
      });
    }
    send(data, ...rest) {
      const f = JSON.parse(data);
      counts.frames[f.type] = (counts.frames[f.type] || 0) + 1;
      if (f.type === 'fetch_messages') asked.set(f.id, f.conversation_id);
      return super.send(data, ...rest);
    }
  };
}
