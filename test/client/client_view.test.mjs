// The client's view against a gateway in the test process (FakeGateway):
// the recent order and conversation pins (and the fallback to the id order
// on a gateway without recent_conversations), receipts from the stream, a
// cold range (PREPARING, history_ready), the suspended close; then the
// package: declarations checked by tsc, npm pack, installed from the
// tarball into a scratch project and imported.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { FakeGateway, ImSyncClient, MemoryStorage, waitFor, TMP } from './harness.mjs';

const gatewayDir = fileURLToPath(new URL('../../gateway/', import.meta.url));

function fakeClient(fake, opts = {}) {
  return new ImSyncClient({ url: 'ws://fake/', token: 't', storage: new MemoryStorage(), WebSocket: fake.WebSocket,
                            pollMs: 0, window: null, document: null, ...opts });
}
const ids = (c) => c.conversations().map((x) => x.conversation_id);

test('recent order from recent_conversations: pinned first, then the latest message; kept current by sync and pins', async () => {
  const fake = new FakeGateway({ user: 1 });
  fake.conv(10, { messages: 3, at: 100 });     // last activity 103
  fake.conv(11, { messages: 2, at: 300 });     // 302
  fake.conv(12, { messages: 1, at: 200 });     // 201
  fake.conv(13, { messages: 0 });              // never a message: last
  fake.conv(14, { messages: 1, at: 50 });
  fake.convs.get(14).conversation_pinned = true;
  const c = fakeClient(fake);
  await c.start();
  assert.equal(fake.count('conversations'), 0);
  assert.deepEqual(ids(c), [14, 11, 12, 10, 13]);
  assert.equal(c.conversations()[0].conversation_pinned, true);
  // a message in 10 (from the sync stream) moves it up
  fake.event(fake.position(10, 2, 'news', 400));
  let changes = 0;
  c.onChange = () => { changes++; };
  fake.push({ type: 'hint', reason: 'NEW_EVENTS', high_watermark: fake.log.length });
  await waitFor('10 moved up', () => ids(c)[1] === 10 || ids(c));
  assert.ok(changes > 0);
  // a reaction does not move a conversation
  fake.event({ kind: 'reaction', conversation_id: 12, msg_seq: 2, message_id: 999, sender_id: 2, content_type: null,
               body: { user_id: 2, reactions: ['ok'] }, target_message_id: 1200001, recalled: false,
               created_at: new Date(Date.UTC(2024, 0, 2)).toISOString() });
  fake.push({ type: 'hint', reason: 'NEW_EVENTS', high_watermark: fake.log.length });
  await waitFor('the reaction applied', () => c.conversations().find((x) => x.conversation_id === 12).last_msg_seq === 2);
  assert.deepEqual(ids(c), [14, 10, 11, 12, 13]);
  // pinConversation: the frame, then the order; a later pin ranks above an earlier one
  const r = await c.pinConversation(12, true);
  assert.equal(r.conversation_pinned, true);
  assert.deepEqual(fake.sent.filter((f) => f.type === 'pin_conversation').map((f) => [f.conversation_id, f.pinned]), [[12, true]]);
  assert.deepEqual(ids(c), [12, 14, 10, 11, 13]);
  // a conversation_pin private event (another device of the user unpinned 14)
  fake.convs.get(14).conversation_pinned = false;
  fake.event({ kind: 'conversation_pin', conversation_id: 14, conversation_pinned: false });
  fake.push({ type: 'hint', reason: 'NEW_EVENTS', high_watermark: fake.log.length });
  await waitFor('14 unpinned', () => c.conversations().find((x) => x.conversation_id === 14).conversation_pinned === false);
  assert.deepEqual(ids(c), [12, 10, 11, 14, 13]);
  await c.stop();
});

test('a gateway without recent_conversations (BAD_FRAME): the conversations frame, once asked', async () => {
  const fake = new FakeGateway({ user: 1 });
  fake.recent = false;
  fake.conv(20, { messages: 1, at: 10 });
  fake.conv(21, { messages: 1, at: 20 });
  const c = fakeClient(fake);
  await c.start();
  assert.equal(fake.count('recent_conversations'), 1);
  assert.ok(fake.count('conversations') >= 1);
  assert.equal(c.state, 'ready');
  // the activity still orders the list (from the positions' created_at once loaded)
  await c.open(20); await c.open(21);
  assert.deepEqual(ids(c), [21, 20]);
  fake.event(fake.position(20, 2, 'later', 30));
  fake.push({ type: 'hint', reason: 'NEW_EVENTS', high_watermark: fake.log.length });
  await waitFor('20 moved up', () => ids(c)[0] === 20 || ids(c));
  assert.equal(fake.count('recent_conversations'), 1);   // not asked again
  await c.stop();
});

test('receipts from the stream: direct delivered/read through a position, group counts per message', async () => {
  const fake = new FakeGateway({ user: 1 });
  fake.conv(30, { kind: 'direct', messages: 0 });
  fake.conv(31, { kind: 'group', messages: 0 });
  const c = fakeClient(fake);
  await c.start();
  const mine = [];
  for (let i = 0; i < 3; i++) mine.push(fake.event(fake.position(30, 1, `d${i}`, i)));
  fake.event(fake.position(30, 2, 'theirs', 9));
  const g = fake.event(fake.position(31, 1, 'to the group', 10));
  fake.push({ type: 'hint', reason: 'NEW_EVENTS', high_watermark: fake.log.length });
  await waitFor('the messages synced', () => c.messages(30).length === 4 && c.messages(31).length === 1);
  const ticks = (cid) => c.messages(cid).map((m) => [m.msg_seq, m.delivered ?? null, m.read ?? null]);
  assert.deepEqual(ticks(30), [[1, false, false], [2, false, false], [3, false, false], [4, null, null]]);
  let changes = 0;
  c.onChange = () => { changes++; };
  fake.event({ kind: 'receipt', conversation_id: 30, delivered_through_seq: 2, read_through_seq: 1 });
  fake.event({ kind: 'receipt', conversation_id: 31, message_id: g.message_id, delivered_count: 3, read_count: 1, member_count: 5 });
  fake.push({ type: 'hint', reason: 'NEW_EVENTS', high_watermark: fake.log.length });
  await waitFor('the receipts applied', () => c.messages(30)[0].read === true);
  assert.ok(changes > 0);
  assert.deepEqual(ticks(30), [[1, true, true], [2, true, false], [3, false, false], [4, null, null]]);
  const gm = c.messages(31)[0];
  assert.deepEqual([gm.delivered, gm.read, gm.delivered_count, gm.read_count, gm.member_count], [true, true, 3, 1, 5]);
  // an older receipt (a replay) takes no tick back
  fake.event({ kind: 'receipt', conversation_id: 30, delivered_through_seq: 1, read_through_seq: 0 });
  fake.event({ kind: 'receipt', conversation_id: 30, delivered_through_seq: 3, read_through_seq: 1 });
  fake.push({ type: 'hint', reason: 'NEW_EVENTS', high_watermark: fake.log.length });
  await waitFor('the third delivered', () => c.messages(30)[2].delivered === true);
  assert.deepEqual(ticks(30), [[1, true, true], [2, true, false], [3, true, false], [4, null, null]]);
  await c.stop();
});

test('loadOlder over a cold range: waits for history_ready, or reports PREPARING after historyTimeoutMs', async () => {
  const fake = new FakeGateway({ user: 1 });
  fake.conv(40, { messages: 120 });
  let cold = true;
  fake.handlers.fetch_messages = (f) => (cold && f.after_seq < 20
    ? { type: 'fetch_messages_result', messages: [], has_more: true, next_after_seq: f.after_seq, expired_through_seq: 0,
        history_status: 'PREPARING', restore_task_id: 77 }
    : undefined);
  const c = fakeClient(fake, { historyPage: 50 });
  await c.start();
  assert.deepEqual(await c.open(40), { status: 'OK', loaded: 50, hasOlder: true });      // 71..120
  assert.deepEqual(await c.loadOlder(40), { status: 'OK', loaded: 50, hasOlder: true });  // 21..70
  // 1..20 is cold: history_ready ends the wait and the page comes
  const waiting = c.loadOlder(40);
  await waitFor('the cold page asked', () => fake.sent.filter((f) => f.type === 'fetch_messages' && f.after_seq === 0).length === 1);
  cold = false;
  fake.push({ type: 'history_ready', conversation_id: 40, restore_task_id: 77 });
  assert.deepEqual(await waiting, { status: 'OK', loaded: 20, hasOlder: false });
  assert.deepEqual(c.messages(40).map((m) => m.msg_seq), Array.from({ length: 120 }, (_, i) => i + 1));
  await c.stop();
  // no history_ready within the timeout: PREPARING with the task
  const fake2 = new FakeGateway({ user: 1 });
  fake2.conv(41, { messages: 10 });
  fake2.handlers.fetch_messages = () => ({ type: 'fetch_messages_result', messages: [], has_more: true, next_after_seq: 0,
                                           expired_through_seq: 0, history_status: 'PREPARING', restore_task_id: 78 });
  const c2 = fakeClient(fake2, { historyTimeoutMs: 200 });
  await c2.start();
  const r = await c2.loadOlder(41);
  assert.equal(r.status, 'PREPARING');
  assert.equal(r.restoreTaskId, 78);
  assert.equal(c2.conversations()[0].has_older, true);
  await c2.stop();
});

test('states: connecting, syncing, ready; suspended (close 4005) stops the client', async () => {
  const fake = new FakeGateway({ user: 1 });
  fake.conv(50, { messages: 1 });
  const states = [];
  const c = fakeClient(fake, { onStatus: (s) => states.push(s.state) });
  await c.start();
  assert.deepEqual(states, ['connecting', 'syncing', 'ready']);
  fake.closeAll(4005, 'suspended');
  await waitFor('suspended', () => c.state === 'suspended');
  const sockets = fake.sent.filter((f) => f.type === 'hello').length;
  assert.deepEqual(states.slice(3), ['suspended']);
  assert.equal(fake.sockets.size, 0);
  assert.equal(sockets, 1);                 // no reconnect after a suspension
  await c.stop();
});

test('the online event connects at once instead of waiting out the back-off', async () => {
  const fake = new FakeGateway({ user: 1 });
  fake.conv(60, { messages: 1 });
  const win = new EventTarget();
  const c = fakeClient(fake, { window: win, hooks: { backoffMs: 3600000 } });
  await c.start();
  fake.closeAll(1006);
  await waitFor('reconnecting', () => c.state === 'reconnecting');
  win.dispatchEvent(new Event('online'));
  await waitFor('ready again', () => c.state === 'ready');
  assert.equal(fake.count('hello'), 2);
  await c.stop();
});

test('the package: tsc checks the declarations against a typed example; npm pack installs and imports', async () => {
  const scratch = fs.mkdtempSync(path.join(TMP, 'pkg-'));
  const npm = (args, cwd) => execFileSync('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], { cwd, encoding: 'utf8' });
  const packed = npm(['pack', '--pack-destination', scratch], path.join(gatewayDir, 'client')).trim().split('\n').pop();
  const tarball = path.join(scratch, packed);
  const files = execFileSync('tar', ['tzf', tarball], { encoding: 'utf8' }).trim().split('\n').sort();
  assert.deepEqual(files, ['package/im_sync_client.d.ts', 'package/im_sync_client.js', 'package/package.json']);
  assert.equal(fs.existsSync(path.join(gatewayDir, 'client', 'im_sync_client.js')), false);   // the copy is gone again
  // a scratch project installs it from the tarball alone (no registry)
  const proj = path.join(scratch, 'app');
  fs.mkdirSync(proj);
  fs.writeFileSync(path.join(proj, 'package.json'), JSON.stringify({ name: 'scratch-app', private: true, type: 'module' }));
  npm(['install', '--offline', tarball], proj);
  fs.writeFileSync(path.join(proj, 'use.mjs'), `
    import { ImSyncClient, MemoryStorage, deviceTokenClaims } from 'im-sync-client';
    const c = new ImSyncClient({ url: 'ws://127.0.0.1:1/', WebSocket: class {}, storage: new MemoryStorage() });
    console.log(JSON.stringify({ state: c.state, claims: deviceTokenClaims('x'), list: c.conversations() }));
  `);
  const out = JSON.parse(execFileSync(process.execPath, ['use.mjs'], { cwd: proj, encoding: 'utf8' }));
  assert.deepEqual(out, { state: 'stopped', claims: null, list: [] });
  // the typed example, against the installed package's declarations
  fs.writeFileSync(path.join(proj, 'example.ts'), `
    import { ImSyncClient, MemoryStorage, ImSyncError, type Conversation, type Position, type Status, type WebSocketConstructor } from 'im-sync-client';
    declare const WS: WebSocketConstructor;
    const c = new ImSyncClient({ url: 'ws://x/', token: 't', storage: new MemoryStorage(), WebSocket: WS,
                                 historyPage: 20, historyTimeoutMs: 1000, window: null,
                                 onStatus: (s: Status) => { if (s.state === 'ready') console.log('ready'); } });
    async function main(): Promise<void> {
      await c.start();
      const list: Conversation[] = c.conversations();
      const first = list[0];
      if (first.conversation_pinned) await c.pinConversation(first.conversation_id, false);
      const r = await c.open(first.conversation_id);
      if (r.status === 'PREPARING') console.log(r.restoreTaskId);
      const older = await c.loadOlder(first.conversation_id);
      console.log(older.hasOlder);
      const rows: Position[] = c.messages(first.conversation_id);
      for (const m of rows) if (m.delivered && m.read_count !== undefined) console.log(m.read_count);
      const sent = await c.send(first.conversation_id, { text: 'hi' }, { replyTo: rows[0]?.message_id ?? null });
      console.log(sent.msg_seq);
      try { await c.messageStatus(sent.message_id); } catch (e) { if (e instanceof ImSyncError) console.log(e.code); }
      await c.stop();
    }
    main();
  `);
  fs.writeFileSync(path.join(proj, 'bad.ts'), `
    import { ImSyncClient } from 'im-sync-client';
    const c = new ImSyncClient({ url: 'ws://x/' });
    c.pinConversation('12', 'yes');
  `);
  const tsc = path.join(gatewayDir, 'node_modules', 'typescript', 'bin', 'tsc');
  const tsArgs = ['--noEmit', '--strict', '--module', 'nodenext', '--moduleResolution', 'nodenext', '--target', 'es2022',
                  '--lib', 'es2022,dom'];
  execFileSync(process.execPath, [tsc, ...tsArgs, 'example.ts'], { cwd: proj, encoding: 'utf8' });
  // the declarations do check: a wrong call is refused
  assert.throws(() => execFileSync(process.execPath, [tsc, ...tsArgs, 'bad.ts'], { cwd: proj, encoding: 'utf8', stdio: 'pipe' }),
                (e) => /TS2345/.test(String(e.stdout)));
});
