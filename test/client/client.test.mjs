// The reference client against a real gateway and database:
// convergence to fetch_messages under random operations, restarts with file
// storage, rollback (RECOVERY), wiped storage (snapshot), a shared_log
// switch, lost hints, a killed gateway, the outbox exactly once, kill -9
// between apply and ACK, the close codes, and message_status.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { sql, newUser, token, serverView, clientView, converge, waitFor, Gateway, client, prng, countingWS, WS,
         FileStorage, MemoryStorage, TMP } from './harness.mjs';
import { deviceTokenClaims } from '../../gateway/web/im_sync_client.js';

const gw = new Gateway();
const started = [];
function track(c) { started.push(c); return c; }

before(async () => { await gw.start(); });
after(async () => {
  for (const c of started) { try { await c.stop(); } catch { /* already stopped */ } }
  await gw.stop();
});

const dir = (name) => path.join(TMP, `store-${name}-${process.pid}`);
const group = (members) => Number(sql(`SELECT im.create_conversation('group', ARRAY[${members}]::bigint[], ${members[0]})`));
const serverSend = (u, c, text) => sql(`SELECT message_id FROM im.send_message(${u}, ${c}, 'srv-' || md5(random()::text), '{"text": "${text}"}')`);
// Sharding: against a router (IM_SHARDS_DIR, test/harness/shards.sh) no node's table
// is read: what a single node reads from im.event / im.device / im.outbox /
// im.user_conversation comes from API calls there.
const ROUTER = Boolean(process.env.IM_SHARDS_DIR);
// How many messages a send left: by its key on a single node; through the
// router by its (unique) text in the member's fetch_messages.
const count = (c, clientMsgId, text, member) => (ROUTER
  ? serverView(member, c).filter((m) => m.kind === 'message' && m.body?.text === text).length
  : Number(sql(`SELECT count(*) FROM im.event WHERE conversation_id = ${c} AND client_msg_id = '${clientMsgId}'`)));
// device_session reads the device row (the epoch only decides `current`)
const serverAck = (u, d) => Number(sql(`SELECT server_acked_sync_seq FROM im.device_session(${u}, '${d}', 0)`));

test('two devices of one user and one of another converge to fetch_messages under random operations', async () => {
  const seed = Number(process.env.IM_CLIENT_SEED || Date.now() % 100000);
  const rnd = prng(seed);
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const direct = Number(sql(`SELECT im.direct_conversation(${A}, ${B})`));
  const tokA1 = token(A, 'a1'); const tokA2 = token(A, 'a2'); const tokB1 = token(B, 'b1');
  let a1 = track(client(gw, tokA1, new FileStorage(dir('a1'))));
  const a2 = track(client(gw, tokA2, new MemoryStorage()));
  const b1 = track(client(gw, tokB1, new MemoryStorage()));
  await Promise.all([a1.start(), a2.start(), b1.start()]);
  const devices = () => [[a1, A], [a2, A], [b1, B]];
  const inFlight = [];
  const refused = [];
  const settle = (p) => inFlight.push(p.catch((e) => { if (e.code !== 'CONFLICT' && e.code !== 'STOPPED') throw e; refused.push(e.code); }));
  let restarts = 0;
  for (let i = 0; i < 80; i++) {
    const [c, user] = devices()[Math.floor(rnd() * 3)];
    const cid = rnd() < 0.8 ? conv : direct;
    const mine = c.messages(cid).filter((m) => m.kind === 'message' && m.sender_id === user && !m.recalled);
    const any = c.messages(cid).filter((m) => m.kind === 'message' && !m.recalled);
    const r = rnd();
    if (r < 0.4 || !any.length) settle(c.send(cid, { text: `m${i} <b>${seed}</b>` }, rnd() < 0.2 && any.length ? { replyTo: any[0].message_id } : {}));
    else if (r < 0.5 && mine.length) settle(c.edit(cid, mine[mine.length - 1].message_id, { text: `edited ${i}` }));
    else if (r < 0.55 && mine.length) settle(c.recall(cid, mine[0].message_id));
    else if (r < 0.7) settle(c.react(cid, any[Math.floor(rnd() * any.length)].message_id, ['👍', '🎉', 'ok'][i % 3], rnd() < 0.7));
    else if (r < 0.75) settle(c.pin(cid, any[any.length - 1].message_id, rnd() < 0.7));
    else if (r < 0.85) { const last = any[any.length - 1]; settle(c.read(cid, last.msg_seq)); }
    else if (r < 0.93) { c.setOffline(true); setTimeout(() => c.setOffline(false), 50 + rnd() * 300); }
    if (i % 30 === 29 || (r >= 0.93 && c === a1)) {
      // the process restarts on its file storage (outbox and view survive)
      await a1.stop();
      a1 = track(client(gw, tokA1, new FileStorage(dir('a1'))));
      await a1.start();
      restarts++;
    }
    if (rnd() < 0.3) await new Promise((res) => setTimeout(res, rnd() * 50));
  }
  for (const [c] of devices()) c.setOffline(false);
  await Promise.all(inFlight);
  for (const [c, user] of devices()) {
    await converge(c, user, conv);
    await converge(c, user, direct);
    assert.equal(c.outboxItems().length, 0);
  }
  console.log(`seed ${seed}: ${inFlight.length} operations, ${refused.filter((x) => x === 'CONFLICT').length} refused as CONFLICT, ${refused.filter((x) => x === 'STOPPED').length} left queued by a restart, ${restarts} restarts`);
});

test('message_status: the four facts for the sender, FORBIDDEN for anyone else', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const a = track(client(gw, token(A, 'a'), new MemoryStorage()));
  const b = track(client(gw, token(B, 'b'), new MemoryStorage()));
  await Promise.all([a.start(), b.start()]);
  const sent = await a.send(conv, { text: 'facts' });
  await converge(b, B, conv);
  await waitFor('the message synced on b', async () => {
    const rows = await a.messageStatus(sent.message_id);
    return rows.length === 1 && rows[0].user_id === B && rows[0].in_sync_scope && rows[0].any_device_synced && !rows[0].user_read;
  });
  await b.read(conv, sent.msg_seq);
  const rows = await a.messageStatus(sent.message_id);
  assert.deepEqual(rows, [{ user_id: B, accepted: true, in_sync_scope: true, any_device_synced: true, user_read: true }]);
  await assert.rejects(b.messageStatus(sent.message_id), (e) => e.code === 'FORBIDDEN');
});

test('a moderator\'s takedown reaches a device through sync like a recall: a tombstone, unread drops', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const a = track(client(gw, token(A, 'a'), new MemoryStorage()));
  const b = track(client(gw, token(B, 'b'), new MemoryStorage()));
  await Promise.all([a.start(), b.start()]);
  const kept = await a.send(conv, { text: 'fine' });
  const bad = await a.send(conv, { text: 'abuse' });
  await b.react(conv, bad.message_id, '👍', true);
  await converge(b, B, conv);
  assert.equal(b.conversations().find((x) => x.conversation_id === conv).unread, 2);
  sql(`SELECT created FROM im.takedown_message('mod', ${conv}, ${bad.message_id}, 'spam', 'client-${bad.message_id}')`);
  await waitFor('the tombstone on b', () => {
    const m = b.messages(conv).find((x) => x.message_id === bad.message_id);
    return (m && m.taken_down && !m.recalled && m.body === null && JSON.stringify(m.reactions) === '{}') || m;
  });
  await converge(b, B, conv);
  await converge(a, A, conv);
  assert.equal(b.conversations().find((x) => x.conversation_id === conv).unread, 1);
  assert.equal(b.messages(conv).find((x) => x.message_id === kept.message_id).taken_down, false);
  // a recall cannot undo it
  await assert.rejects(a.recall(conv, bad.message_id), (e) => e.code === 'CONFLICT');
});

test('the outbox: queued offline, kept across a restart, each operation exactly once', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const tokA = token(A, 'a');
  let a = track(client(gw, tokA, new FileStorage(dir('outbox'))));
  await a.start();
  a.setOffline(true);
  for (let i = 0; i < 5; i++) a.send(conv, { text: `queued ${i}` }).catch(() => {});
  await waitFor('five operations in the outbox', () => a.outboxItems().length === 5);
  const queued = a.outboxItems();
  await a.stop();
  // a new process on the same storage sends them once the switch is back on
  a = track(client(gw, tokA, new FileStorage(dir('outbox'))));
  await a.start();
  await waitFor('the outbox drained', () => a.outboxItems().length === 0);
  for (const q of queued) assert.equal(count(conv, q.client_msg_id, q.body.text, A), 1);
  // an item sent but not removed (the answer lost): sent again with the same id
  const again = await a.send(conv, { text: 'twice' }, { clientMsgId: 'dup-once' });
  assert.equal(again.created, true);
  const repeat = await a.send(conv, { text: 'twice' }, { clientMsgId: 'dup-once' });
  assert.equal(repeat.created, false);
  assert.equal(repeat.message_id, again.message_id);
  assert.equal(count(conv, 'dup-once', 'twice', A), 1);
  await converge(a, A, conv);
  const texts = a.messages(conv).filter((m) => m.kind === 'message').map((m) => m.body.text);
  assert.deepEqual(texts, ['queued 0', 'queued 1', 'queued 2', 'queued 3', 'queued 4', 'twice']);
});

test('storage rolled back to an older copy: RECOVERY replays, nothing lost or doubled', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const tokA = token(A, 'a');
  let a = track(client(gw, tokA, new FileStorage(dir('rollback'))));
  await a.start();
  for (let i = 0; i < 3; i++) serverSend(B, conv, `before ${i}`);
  await converge(a, A, conv);
  await a.stop();
  fs.cpSync(dir('rollback'), dir('rollback-old'), { recursive: true });
  a = track(client(gw, tokA, new FileStorage(dir('rollback'))));
  await a.start();
  for (let i = 0; i < 4; i++) serverSend(B, conv, `after ${i}`);
  await converge(a, A, conv);
  await a.stop();
  fs.rmSync(dir('rollback'), { recursive: true });
  fs.cpSync(dir('rollback-old'), dir('rollback'), { recursive: true });
  a = track(client(gw, tokA, new FileStorage(dir('rollback'))));
  await a.start();
  await converge(a, A, conv);
  assert.ok(a.stats.recoveries >= 1, `expected a RECOVERY batch, stats ${JSON.stringify(a.stats)}`);
  assert.equal(a.stats.snapshots, 0);
  assert.equal(a.messages(conv).filter((m) => m.kind === 'message').length, 7);
});

test('wiped storage: a snapshot rebuilds the view', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const tokA = token(A, 'a');
  let a = track(client(gw, tokA, new FileStorage(dir('wipe'))));
  await a.start();
  const m = serverSend(B, conv, 'one');
  serverSend(B, conv, 'two');
  sql(`SELECT * FROM im.edit_message(${B}, ${conv}, 'e-${m}', ${m}, '{"text": "one, edited"}')`);
  await converge(a, A, conv);
  const ack = serverAck(A, 'a');
  await a.read(conv, a.conversations().find((c) => c.conversation_id === conv).last_msg_seq);
  await a.stop();
  fs.rmSync(dir('wipe'), { recursive: true });
  a = track(client(gw, tokA, new FileStorage(dir('wipe'))));
  await a.start();
  await converge(a, A, conv);
  assert.equal(a.stats.snapshots, 1);
  assert.ok(ack > 0);
  assert.equal(a.messages(conv).find((x) => x.message_id === Number(m)).body.text, 'one, edited');
  assert.equal(a.conversations().find((c) => c.conversation_id === conv).unread, 0);
});

test('a group switched to shared_log stays current through fetch_messages and clear_dirty', async () => {
  const A = newUser(); const B = newUser(); const C = newUser();
  const conv = group([A, B, C]);
  const a = track(client(gw, token(A, 'a'), new MemoryStorage()));
  await a.start();
  serverSend(B, conv, 'fanout');
  await converge(a, A, conv);
  sql(`SELECT im.set_conversation_mode(${conv}, 'shared_log')`);
  for (let i = 0; i < 5; i++) serverSend(i % 2 ? B : C, conv, `big ${i}`);
  await converge(a, A, conv);
  assert.equal(a.conversations().find((c) => c.conversation_id === conv).mode, 'shared_log');
  await waitFor('the dirty marker cleared', () => (ROUTER
    // the marker's flag is not in the API: the client's view, and a version set
    ? a.conversations().find((c) => c.conversation_id === conv).dirty === false
      && Number(sql(`SELECT dirty_version FROM im.conversation_list(${A}, 1000) WHERE conversation_id = ${conv}`)) > 0
    : sql(`SELECT dirty_version > 0 AND NOT dirty FROM im.user_conversation WHERE user_id = ${A} AND conversation_id = ${conv}`) === 't'));
});

test('lost hints: a client that drops every hint still catches up', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const a = track(client(gw, token(A, 'a'), new MemoryStorage(), { hooks: { dropHints: true }, pollMs: 300 }));
  await a.start();
  for (let i = 0; i < 3; i++) serverSend(B, conv, `unhinted ${i}`);
  await converge(a, A, conv);
});

test('a gateway killed with -9 and started again: the client reconnects and converges', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const own = new Gateway();
  await own.start();
  const a = track(client(own, token(A, 'a'), new MemoryStorage()));
  await a.start();
  serverSend(B, conv, 'before the crash');
  await converge(a, A, conv);
  await own.kill9();
  await waitFor('the client noticed', () => a.state === 'reconnecting' || a.state === 'connecting');
  const queued = a.send(conv, { text: 'sent while the gateway is down' });
  serverSend(B, conv, 'while down');
  await own.start();
  await queued;
  await converge(a, A, conv);
  await own.stop();
});

test('kill -9 between the commit of a batch and its ACK: resumes without loss or duplicates', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const tokA = token(A, 'a');
  const store = dir('kill9');
  const childScript = fileURLToPath(new URL('./crash_child.mjs', import.meta.url));
  const run = (mode) => spawn(process.execPath, [childScript, gw.url, tokA, store, mode, String(conv)],
                              { stdio: ['ignore', 'pipe', 'inherit'] });
  // first run: catches up, then stops between commit and ACK of the next batch
  let child = run('hang-before-ack');
  const lines = [];
  child.stdout.on('data', (d) => lines.push(...d.toString().split('\n').filter(Boolean)));
  await waitFor('the child caught up', () => lines.includes('READY'));
  for (let i = 0; i < 5; i++) serverSend(B, conv, `crash ${i}`);
  await waitFor('the child committed a batch and waits before its ACK', () => lines.some((l) => l.startsWith('COMMITTED')));
  const committed = Number(lines.find((l) => l.startsWith('COMMITTED')).split(' ')[1]);
  const ackAtKill = serverAck(A, 'a');
  assert.ok(ackAtKill < committed, `the server ACK ${ackAtKill} must be behind the committed ${committed}`);
  await new Promise((resolve) => { child.once('exit', resolve); child.kill('SIGKILL'); });
  // the router's run_fanout drains every node and waits for the transfers
  await waitFor('fanout of the conversation done', () => (ROUTER
    ? sql('SELECT im.run_fanout()') !== null
    : sql(`SELECT count(*) FROM im.outbox WHERE conversation_id = ${conv} AND state <> 'done'`) === '0'));
  // second run on the same files: the batch comes again and is applied once
  child = run('check');
  let out = '';
  child.stdout.on('data', (d) => { out += d.toString(); });
  const code = await new Promise((resolve) => child.once('exit', resolve));
  assert.equal(code, 0, out);
  const view = JSON.parse(out.split('\n').find((l) => l.startsWith('{')));
  assert.deepEqual(view.messages, serverView(A, conv));
  assert.ok(view.applied >= committed);
  const ackAfter = serverAck(A, 'a');
  assert.equal(ackAfter, view.applied);
});

test('close codes: a revoked device stops, a superseded one stops, a bad token asks for a new one', async () => {
  const A = newUser();
  const tok = token(A, 'a');
  const a = track(client(gw, tok, new MemoryStorage()));
  await a.start();
  // a second connection of the same device supersedes the first (4008)
  const a2 = track(client(gw, token(A, 'a'), new MemoryStorage()));
  await a2.start();
  await waitFor('the first connection superseded', () => a.state === 'superseded');
  sql(`SELECT im.revoke_device(${A}, 'a')`);
  await waitFor('the second connection revoked', () => a2.state === 'revoked');
  const bad = track(client(gw, 'not-a-token', new MemoryStorage()));
  await assert.rejects(bad.start(), (e) => e.code === 'NEEDS_TOKEN');
  assert.equal(bad.state, 'needs_token');
});

// contract §17: a suspension closes the live session with 4005; the client
// stops in `suspended` and sends no further hello (no reconnect loop); a
// client started while the account is suspended stops the same way.
test('close 4005: a suspended account stops the client in suspended, without reconnecting', async () => {
  const A = newUser();
  const counts = {};
  const a = track(client(gw, token(A, 'a'), new MemoryStorage(), { WebSocket: countingWS(WS, counts) }));
  await a.start();
  const reconnects = a.stats.reconnects;
  sql(`SELECT * FROM im.suspend_user('client-test', ${A}, NULL, 'test')`);
  await waitFor('the session closed 4005', () => a.state === 'suspended');
  await new Promise((res) => setTimeout(res, 1500));
  assert.equal(a.state, 'suspended');
  assert.equal(a.stats.reconnects, reconnects);
  assert.equal(counts.frames.hello, 1);
  // a token issued before the suspension: the hello is refused with 4005
  sql(`SELECT * FROM im.reinstate_user('client-test', ${A})`);
  const tokB = token(A, 'b');
  sql(`SELECT * FROM im.suspend_user('client-test', ${A}, NULL, 'test')`);
  const b = track(client(gw, tokB, new MemoryStorage()));
  await assert.rejects(b.start(), (e) => e.code === 'SUSPENDED' || (e.code === 'FORBIDDEN' && e.reason === 'suspended'));
  await waitFor('the hello closed 4005', () => b.state === 'suspended');
  sql(`SELECT * FROM im.reinstate_user('client-test', ${A})`);
});

// The page keys its database by the user and device a token names, read
// before connecting: the reading must agree with the server's.
test('deviceTokenClaims reads the user and device the server authenticates; anything else is null', () => {
  const A = newUser();
  for (const dev of ['web', 'd'.repeat(64), 'Tablet.2_x-Y']) {
    const tok = token(A, dev);
    const [u, d] = sql(`SELECT user_id || '|' || device_id FROM im.authenticate('${tok}')`).split('|');
    assert.deepEqual(deviceTokenClaims(tok), { userId: Number(u), deviceId: d });
    assert.deepEqual(deviceTokenClaims(tok), { userId: A, deviceId: dev });
  }
  const tok = token(A, 'web');
  const raw = Buffer.from(tok, 'base64url');
  raw[0] = 'B'.charCodeAt(0);                      // a batch token's purpose
  assert.equal(deviceTokenClaims(raw.toString('base64url')), null);
  for (const bad of ['', 'not-a-token', tok.slice(0, 60), `${tok}!`, null, 42]) assert.equal(deviceTokenClaims(bad), null, String(bad));
});

test('a storage of another device of the same user refuses the welcome: two devices never share a view', async () => {
  const A = newUser();
  const storage = new MemoryStorage();
  const a = track(client(gw, token(A, 'one'), storage));
  await a.start();
  await a.stop();
  const b = track(client(gw, token(A, 'two'), storage));
  await assert.rejects(b.start(), (e) => e.code === 'WRONG_ACCOUNT');
  assert.equal(b.state, 'wrong_account');
});

test('the command-line client: send, list, messages, read, follow', async () => {
  const { execFileSync } = await import('node:child_process');
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const cli = fileURLToPath(new URL('../../gateway/cli/im_sync_cli.mjs', import.meta.url));
  const tokA = token(A, 'cli'); const tokB = token(B, 'cli');
  const run = (tok, ...args) => execFileSync(process.execPath, [cli, '--url', gw.url, '--token', tok, '--store', dir(`cli-${tok.slice(-6)}`), ...args],
                                             { encoding: 'utf8', timeout: 30000 });
  // B follows while A sends
  const follow = spawn(process.execPath, [cli, '--url', gw.url, '--token', tokB, 'follow', String(conv)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let followed = '';
  follow.stdout.on('data', (d) => { followed += d.toString(); });
  assert.match(run(tokA, 'send', String(conv), 'hello', 'from', 'the', 'terminal'), /^sent message \d+ at 2\n$/);
  await waitFor('follow printed the message', () => followed.includes(': hello from the terminal') || followed);
  follow.kill('SIGINT');
  await waitFor('B\'s message delivered', () => {
    const out = run(tokB, 'list');
    return out.includes(`${conv}\tgroup\tfanout\tunread 1\tlast 2`) || out;
  });
  assert.match(run(tokB, 'messages', String(conv)), new RegExp(`^${conv}#2 ${A}: hello from the terminal\\n$`));
  assert.match(run(tokB, 'read', String(conv)), /^read to 2, unread 0\n$/);
});

test('RATE_LIMITED: the client waits retry_after_ms and every operation lands once', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const slow = new Gateway();
  await slow.start(['--rate', '4', '--burst', '2']);
  // a failure must not leave this gateway running (it kept the runner alive)
  try {
    const a = track(client(slow, token(A, 'a'), new MemoryStorage()));
    await a.start();
    const sends = [];
    for (let i = 0; i < 8; i++) sends.push(a.send(conv, { text: `paced ${i}` }, { clientMsgId: `paced-${A}-${i}` }));
    await Promise.all(sends);
    for (let i = 0; i < 8; i++) assert.equal(count(conv, `paced-${A}-${i}`, `paced ${i}`, A), 1);
    const limited = Number((await (await fetch(slow.httpUrl + 'metrics')).text())
      .split('\n').find((l) => l.startsWith('im_gateway_errors_total{code="RATE_LIMITED"}'))?.split(' ')[1] || 0);
    assert.ok(limited > 0, 'the gateway never rate-limited: the test did not exercise retry_after_ms');
    await converge(a, A, conv);
    await a.stop();
  } finally {
    await slow.stop();
  }
});

test('refused hellos (admission full, close 4029): clients wait retry_after_ms, come back and all get in', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const tight = new Gateway();
  // one hello in flight, one waiting: the rest of a burst is refused
  await tight.start(['--max-pending-hello', '1', '--max-waiting-hello', '1']);
  const clients = [];
  for (let i = 0; i < 8; i++) clients.push(track(client(tight, token(i % 2 ? A : B, `burst${i}`), new MemoryStorage())));
  await Promise.all(clients.map((c) => c.start()));
  const refused = clients.reduce((n, c) => n + c.stats.refusedHellos, 0);
  const metrics = await (await fetch(tight.httpUrl + 'metrics')).text();
  const gwRefusals = Number(metrics.split('\n').find((l) => l.startsWith('im_gateway_refusals_total '))?.split(' ')[1] || 0);
  assert.ok(refused > 0 && gwRefusals > 0, `no hello was refused (client ${refused}, gateway ${gwRefusals}): the test did not exercise 4029`);
  for (const c of clients.filter((x) => x.stats.refusedHellos > 0)) assert.ok(c.stats.reconnects >= 1);
  for (const c of clients) await converge(c, clients.indexOf(c) % 2 ? A : B, conv);
  for (const c of clients) await c.stop();
  await tight.stop();
});

test('file storage: a torn last journal line (a commit that never returned) is dropped at load', async () => {
  const d = dir('torn');
  const s1 = new FileStorage(d);
  await s1.load();
  await s1.commit({ puts: [['k1', { v: 1 }]] });
  await s1.commit({ puts: [['k2', { v: 2 }]], deletes: ['k1'] });
  await s1.close();
  fs.appendFileSync(path.join(d, 'journal.log'), '{"puts":[["k3",{"v":');   // cut mid-write
  const s2 = new FileStorage(d);
  assert.deepEqual(await s2.load(), [['k2', { v: 2 }]]);
  await s2.commit({ puts: [['k4', { v: 4 }]] });                            // appends after the cut
  await s2.close();
  const s3 = new FileStorage(d, { compactBytes: 1 });
  assert.deepEqual((await s3.load()).sort(), [['k2', { v: 2 }], ['k4', { v: 4 }]]);
  await s3.commit({ clear: ['k'], puts: [['k5', { v: 5 }]] });               // compacts
  await s3.close();
  assert.deepEqual(await new FileStorage(d).load(), [['k5', { v: 5 }]]);
});

test('states: connecting, syncing, ready only once caught up; reconnecting, offline, and back to ready', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  for (let i = 0; i < 30; i++) serverSend(B, conv, `backlog ${i}`);
  await waitFor('the backlog fanned out', () => (ROUTER ? sql('SELECT im.run_fanout()') !== null
    : sql(`SELECT count(*) FROM im.outbox WHERE conversation_id = ${conv} AND state <> 'done'`) === '0'));
  const own = new Gateway();
  await own.start();
  try {
    const states = [];
    const atReady = [];
    const tokA = token(A, 'a');
    const hw = Number(sql(`SELECT high_watermark FROM im.device_session(${A}, 'a', 0)`));
    // small pages: the catch-up takes several batches, all before ready
    const a = track(client(own, tokA, new MemoryStorage(), {
      pageLimit: 4,
      onStatus: (s) => { states.push(s.state); if (s.state === 'ready') atReady.push(a.meta.applied); },
    }));
    await a.start();
    assert.deepEqual(states, ['connecting', 'syncing', 'ready']);
    assert.ok(a.stats.batches >= 1);
    assert.ok(atReady[0] >= hw, `ready at ${atReady[0]}, the watermark was ${hw}`);
    a.setOffline(true);
    assert.equal(a.state, 'offline');
    a.setOffline(false);
    await waitFor('ready after the switch', () => a.state === 'ready');
    const mark = states.length;
    await own.kill9();
    await waitFor('reconnecting', () => a.state === 'reconnecting');
    await own.start();
    await waitFor('ready after the restart', () => a.state === 'ready');
    const after = states.slice(mark);
    assert.equal(after[0], 'reconnecting');
    assert.deepEqual(after.slice(-3), ['connecting', 'syncing', 'ready']);
    assert.deepEqual(states.slice(3, 7), ['offline', 'connecting', 'syncing', 'ready']);
    await a.stop();
  } finally {
    await own.stop();
  }
});

test('lazy history: a new device lists first, fetches at most historyPage positions of what it opens and none of the rest', async () => {
  const A = newUser(); const B = newUser();
  const convs = [group([A, B]), group([A, B]), group([A, B]), Number(sql(`SELECT im.direct_conversation(${A}, ${B})`))];
  for (const c of convs) {
    sql(`SELECT count(*) FROM generate_series(1, 120) g, LATERAL im.send_message(${B}, ${c}, 'lazy-' || ${c} || '-' || g, jsonb_build_object('text', 'h' || g))`);
  }
  // the history is fanned out before the device comes (what arrives later reaches it by sync, not by history)
  await waitFor('fanout done', () => (ROUTER ? sql('SELECT im.run_fanout()') !== null
    : sql(`SELECT count(*) FROM im.outbox WHERE conversation_id = ANY (ARRAY[${convs}]) AND state <> 'done'`) === '0'));
  const counts = {};
  const a = track(client(gw, token(A, 'new'), new MemoryStorage(), { WebSocket: countingWS(WS, counts), historyPage: 50 }));
  await a.start();
  assert.equal(a.stats.snapshots, 1);
  assert.deepEqual(a.conversations().map((c) => c.conversation_id).sort((x, y) => x - y), [...convs].sort((x, y) => x - y));
  assert.equal(counts.frames.fetch_messages || 0, 0, 'nothing fetched before a conversation is opened');
  const unread = a.conversations().find((c) => c.conversation_id === convs[0]).unread;
  assert.equal(unread, 120);   // from the server's count, history not loaded
  const r = await a.open(convs[0]);
  assert.equal(r.status, 'OK');
  assert.ok(counts.positions[convs[0]] <= 50, `opened: ${counts.positions[convs[0]]} positions fetched`);
  const want = serverView(A, convs[0]);
  assert.deepEqual(clientView(a, convs[0]), want.slice(-50));
  for (const c of convs.slice(1)) assert.equal(counts.positions[c] || 0, 0, `conversation ${c} not opened, nothing fetched`);
  // the first messages() call opens the direct conversation
  a.messages(convs[3]);
  // at least the last historyPage positions, fetching no more than that (through a router, positions
  // fanned out after the snapshot's base arrive by sync besides)
  await waitFor('the direct conversation loaded', () => a.messages(convs[3]).length >= 50 || a.messages(convs[3]).length);
  assert.ok(counts.positions[convs[3]] <= 50, `direct: ${counts.positions[convs[3]]} positions fetched`);
  // loadOlder pages back, historyPage at a time, until the first position
  let older;
  do { older = await a.loadOlder(convs[0]); } while (older.hasOlder);
  assert.deepEqual(clientView(a, convs[0]), want);
  assert.equal(counts.positions[convs[0]], want.length);
  assert.equal(counts.positions[convs[1]] || 0, 0);
  assert.equal(counts.positions[convs[2]] || 0, 0);
  await a.stop();
});

test('a document coming to the foreground syncs at once (no hint, no poll); a hidden one does not', async () => {
  const A = newUser(); const B = newUser();
  const conv = group([A, B]);
  const doc = new EventTarget();
  doc.visibilityState = 'hidden';
  const a = track(client(gw, token(A, 'a'), new MemoryStorage(), { hooks: { dropHints: true }, pollMs: 0, document: doc }));
  await a.start();
  await a.open(conv);
  serverSend(B, conv, 'while in the background');
  await waitFor('fanout done', () => (ROUTER ? sql('SELECT im.run_fanout()') !== null
    : sql(`SELECT count(*) FROM im.outbox WHERE conversation_id = ${conv} AND state <> 'done'`) === '0'));
  const batches = a.stats.batches;
  doc.dispatchEvent(new Event('visibilitychange'));          // still hidden: nothing
  assert.equal(a.stats.wakeups, 0);
  doc.visibilityState = 'visible';
  doc.dispatchEvent(new Event('visibilitychange'));
  await converge(a, A, conv);
  assert.ok(a.stats.batches > batches);
  assert.equal(a.stats.wakeups, 1);
});

test('the web mount serves the page, not the package files beside it', async () => {
  for (const f of ['package.json', 'im_sync_client.d.ts', '../client/package.json', '../package.json']) {
    assert.equal((await fetch(`${gw.httpUrl}web/${f}`)).status, 404, f);
  }
  assert.equal((await fetch(`${gw.httpUrl}web/im_sync_client.js`)).status, 200);
});
