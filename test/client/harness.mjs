// Shared pieces of the client tests: psql for setup and for the server's
// truth (fetch_messages), a gateway process the tests can kill and restart,
// clients on the real module, and waiting with a deadline (no timed
// assertions).
import { execFileSync, spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
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
              body: p.body, recalled: p.recalled, target_message_id: p.target_message_id ?? null };
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
