// The web page in a real browser: Debian's chromium, headless,
// driven by puppeteer-core; two pages as two devices.  Assertions are on the
// DOM; screenshots go to the test's temp directory (their paths are printed
// at the end).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import { sql, newUser, token, waitFor, Gateway, TMP, launchChromium } from './harness.mjs';
import { seedConversations, openAsNewDevice, openByClick, paneSeqs, scrollToFirst } from './new_device.mjs';

const gw = new Gateway();
let browser;
const shots = path.join(TMP, 'screenshots');
const profile = fs.mkdtempSync(path.join(TMP, 'chromium-profile-'));
const A = newUser(); const B = newUser();
let conv; let pa; let pb; let tokA; let tokB;

// The list is drawn again as the first sync pages arrive: a locator waits for
// the item to be attached, visible and still, and clicks it again if it was
// replaced in between (a bare click of the item found first can meet a
// detached node).
const openConversation = (page) =>
  page.locator(`#conversations li[data-conv="${conv}"]`).setTimeout(30000).click();

// 'ready' is the client's caught-up state of contract §20 ('online' before it)
const online = (page) => page.waitForFunction(() => ['ready', 'online'].includes(document.getElementById('status').dataset.state), { timeout: 30000, polling: 100 })
  .catch(async (e) => { throw new Error(`${e.message}; status: ${await page.$eval('#status', (x) => x.textContent).catch(() => '?')}`); });

// A page of its own context (window) per device, so both stay visible and
// running; or a new page in a given context (the same browser storage).
async function signIn(tok, context) {
  const page = await (context || await browser.createBrowserContext()).newPage();
  page.on('pageerror', (e) => console.log('page error:', e.message));
  page.on('console', (m) => console.log('page console:', m.text()));
  page.on('dialog', (d) => d.dismiss());
  await page.goto(`${gw.httpUrl}#token=${encodeURIComponent(tok)}`);
  await online(page);
  return page;
}
async function open(tok, context) {
  const page = await signIn(tok, context);
  await openConversation(page);
  return page;
}
// The page's IndexedDB databases, by name.
const databases = (page) => page.evaluate(async () => (await indexedDB.databases()).map((d) => d.name).sort());
// Every URL of the page's session history (the browser's, through CDP).
async function historyUrls(page) {
  const cdp = await page.createCDPSession();
  const { entries } = await cdp.send('Page.getNavigationHistory');
  await cdp.detach();
  return entries.map((e) => e.url);
}
// Own properties of window (and of their values, two levels down) that
// hold the token as (part of) a string.  Two levels reach a client object
// on window (its .token) and RegExp's legacy statics (RegExp.input keeps
// the last string a regular expression ran on).
const windowHolding = (page, tok) => page.evaluate((t) => {
  const holds = (v, depth) => {
    if (typeof v === 'string') return v.includes(t);
    if (depth === 0 || v == null || (typeof v !== 'object' && typeof v !== 'function')) return false;
    let keys;
    try { keys = Object.getOwnPropertyNames(v); } catch { return false; }
    // a prototype's accessors answer only on instances
    return keys.some((k) => { try { return k !== 'prototype' && holds(v[k], depth - 1); } catch { return false; } });
  };
  return Object.getOwnPropertyNames(window).filter((k) => { try { return holds(window[k], 2); } catch { return false; } });
}, tok);
const cleanedUp = (page) => page.waitForFunction(() => document.getElementById('status').dataset.cleanup === 'done', { timeout: 30000, polling: 100 });
const texts = (page) => page.$$eval('#messages li.message:not(.queued) .body', (els) => els.map((e) => e.textContent));
const unread = (page) => page.$eval(`#conversations li[data-conv="${conv}"] .unread`, (e) => Number(e.dataset.unread));
const serverUnread = (user) => Number(sql(`SELECT unread_count FROM im.conversation_list(${user}) WHERE conversation_id = ${conv}`));
const shot = (page, name) => page.screenshot({ path: path.join(shots, `${name}.png`) });
async function send(page, text) {
  await page.type('#text', text);
  await page.click('#send');
}
// Real clicks on a message's "..." button and then on an item of its menu
// (the list is drawn again as events arrive: locators find the node again).
async function menuItem(page, mid, cls) {
  const li = `#messages li[data-mid="${mid}"]`;
  if (!await page.$(`${li} .menu`)) await page.locator(`${li} .more`).setTimeout(30000).click();
  await page.locator(`${li} .menu .${cls}`).setTimeout(30000).click();
}
// The message_id of the (last) line whose body is `text`, once it is shown.
async function midOf(page, text) {
  let mid;
  await waitFor(`a line "${text}"`, async () => {
    mid = await page.$$eval('#messages li.message[data-mid]', (els, t) =>
      (els.filter((e) => e.querySelector('.body').textContent === t).pop() || { dataset: {} }).dataset.mid, text);
    return mid != null || 'not shown';
  });
  return mid;
}
const lineOf = (page, mid) => page.$eval(`#messages li[data-mid="${mid}"]`, (li) => ({
  sender: li.querySelector('.sender').textContent, time: (li.querySelector('.time') || {}).textContent,
  body: li.querySelector('.body').textContent, tick: (li.querySelector('.ticks') || { dataset: {} }).dataset.tick || null,
  edited: !!li.querySelector('.edited'), tombstone: li.classList.contains('tombstone'),
  reactions: [...li.querySelectorAll('.reaction')].map((r) => r.textContent),
  reply: (li.querySelector('.reply') || { dataset: {} }).dataset.target || null,
  buttons: [...li.querySelectorAll(':scope > button')].map((b) => b.className) }));
const lineIs = (page, mid, pred, what) => waitFor(what, async () => {
  const l = await lineOf(page, mid).catch((e) => e.message);
  return (typeof l === 'object' && pred(l)) || l;
});
const listOrder = (page) => page.$$eval('#conversations li[data-conv]', (els) => els.map((e) => Number(e.dataset.conv)));

before(async () => {
  fs.mkdirSync(shots, { recursive: true });
  conv = Number(sql(`SELECT im.create_conversation('group', ARRAY[${A}, ${B}]::bigint[], ${A})`));
  await gw.start();
  browser = await launchChromium(profile, { protocolTimeout: 60000 });
  tokA = token(A, 'web-a');
  pa = await open(tokA);
  tokB = token(B, 'web-b');
  pb = await open(tokB);
});
after(async () => {
  if (browser) await browser.close();
  await gw.stop();
  if (fs.existsSync(shots)) for (const f of fs.readdirSync(shots).sort()) console.log(`screenshot: ${path.join(shots, f)}`);
});

test('a message sent on one page appears on the other', async () => {
  await send(pa, 'hello from A');
  await pb.waitForFunction(() => [...document.querySelectorAll('#messages .body')].some((e) => e.textContent === 'hello from A'),
                           { timeout: 30000, polling: 100 });
  await shot(pb, '1-received');
});

test('a body is rendered as text: markup in it does not run', async () => {
  const evil = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>';
  await send(pa, evil);
  await pb.waitForFunction((t) => [...document.querySelectorAll('#messages .body')].some((e) => e.textContent === t),
                           { timeout: 30000, polling: 100 }, evil);
  assert.equal(await pb.evaluate(() => window.__xss), undefined);
  assert.equal(await pb.$$eval('#messages img, #messages script', (els) => els.length), 0);
  await shot(pb, '2-xss-as-text');
});

test('offline switch: messages sent meanwhile arrive exactly, in order, with unread right', async () => {
  await pb.click('#offline');
  await pb.waitForFunction(() => document.getElementById('status').dataset.state === 'offline', { polling: 100 });
  const before = await texts(pb);
  const sent = ['while offline 1', 'while offline 2', 'while offline 3'];
  for (const t of sent) {
    await send(pa, t);
    await pa.waitForFunction((x) => [...document.querySelectorAll('#messages li.message:not(.queued) .body')]
      .some((e) => e.textContent === x), { timeout: 30000, polling: 100 }, t);
  }
  await send(pb, 'queued on B');
  await pb.waitForSelector('#messages li.queued');
  assert.equal(await pb.$eval('#pending', (e) => e.textContent), '1 queued');
  await shot(pb, '3-offline');
  await pb.click('#offline');
  const want = [...before, ...sent, 'queued on B'];
  await waitFor('B caught up after the switch', async () => JSON.stringify(await texts(pb)) === JSON.stringify(want) || await texts(pb));
  await waitFor('B unread equals the server', async () => (await unread(pb)) === serverUnread(B) || [await unread(pb), serverUnread(B)]);
  assert.equal(await unread(pb), 5);   // five messages of A, none read yet
  assert.equal(Number(sql(`SELECT count(*) FROM im.event WHERE conversation_id = ${conv} AND body->>'text' = 'queued on B'`)), 1);
  await shot(pb, '4-caught-up');
});

test('the four facts move from accepted to read as the other side reads', async () => {
  await pa.waitForFunction(() => document.querySelectorAll('#messages li.mine .more').length > 0, { polling: 100 });
  // A's last own message's Status item, in its menu
  const mid = await pa.$$eval('#messages li.mine[data-mid]', (els) => els.pop().dataset.mid);
  const openFacts = async () => { await menuItem(pa, mid, 'facts-btn'); return true; };
  await waitFor('A opens the facts of its last message', openFacts);
  await pa.waitForSelector(`#facts-rows tr[data-user="${B}"]`);
  const facts = () => pa.$eval(`#facts-rows tr[data-user="${B}"]`, (tr) =>
    ['accepted', 'in-scope', 'synced', 'read'].map((c) => tr.querySelector(`.${c}`).textContent).join(','));
  await waitFor('accepted, in scope and on B\'s device, not read', async () => {
    await openFacts();
    await new Promise((r) => setTimeout(r, 100));
    return (await facts()) === 'yes,yes,yes,no' || facts();
  });
  await pb.click('#mark-read');
  await waitFor('B read on the server', () => serverUnread(B) === 0);
  await waitFor('A sees it read', async () => {
    await openFacts();
    await new Promise((r) => setTimeout(r, 100));
    return (await facts()) === 'yes,yes,yes,yes' || facts();
  });
  await pb.waitForFunction((c) => document.querySelector(`#conversations li[data-conv="${c}"] .unread`).dataset.unread === '0', { polling: 100 }, conv);
  await shot(pa, '5-facts-read');
});

test('the token leaves the URL and every history entry at once; no window property holds it or the client', async () => {
  for (const [page, tok] of [[pa, tokA], [pb, tokB]]) {
    assert.equal(await page.evaluate(() => location.hash), '');
    assert.ok(!page.url().includes(tok), page.url());
    const urls = await historyUrls(page);
    assert.ok(urls.length >= 1 && urls.every((u) => !u.includes(tok)), JSON.stringify(urls));
    assert.deepEqual(await windowHolding(page, tok), []);
    assert.equal(await page.evaluate(() => 'imClient' in window), false);
    assert.equal(await page.evaluate((t) => document.documentElement.outerHTML.includes(t), tok), false);
  }
  // the scan finds a token where one is (so an empty answer means something)
  await pb.evaluate((t) => { window.__probe = { client: { token: t } }; }, tokB);
  assert.deepEqual(await windowHolding(pb, tokB), ['__probe']);
  await pb.evaluate(() => { delete window.__probe; });
});

test('a re-issued token of the same device, on a fresh load and after a reload, finds its database: no snapshot, one database', async () => {
  const shown = await texts(pb);
  const dbs = await databases(pb);
  assert.equal(dbs.length, 1, JSON.stringify(dbs));
  // a fresh load (a new document) with a re-issued token of the device
  const tok2 = token(B, 'web-b');
  await pb.goto('about:blank');
  await pb.goto(`${gw.httpUrl}web/#token=${tok2}`);
  await online(pb);
  assert.deepEqual(await databases(pb), dbs);
  await openConversation(pb);
  await send(pa, 'after a fresh load');
  let want = [...shown, 'after a fresh load'];
  await waitFor('B shows the new message', async () => JSON.stringify(await texts(pb)) === JSON.stringify(want) || await texts(pb));
  assert.equal(await pb.$eval('#status', (e) => e.dataset.snapshots), '0');
  assert.equal(await pb.$eval('#status', (e) => e.dataset.store), dbs[0]);
  // a reload: the token went with the fragment, so the page asks for one
  await pb.reload();
  await pb.waitForSelector('#token-form:not([hidden])');
  assert.equal(await pb.$eval('#status', (e) => e.dataset.state), 'stopped');
  // a link with yet another token of the device opened on that page
  const tok3 = token(B, 'web-b');
  await pb.goto(`${gw.httpUrl}web/#token=${tok3}`);
  await online(pb);
  await openConversation(pb);
  await send(pa, 'after the reload');
  want = [...want, 'after the reload'];
  await waitFor('B shows the newer message', async () => JSON.stringify(await texts(pb)) === JSON.stringify(want) || await texts(pb));
  assert.equal(await pb.$eval('#status', (e) => e.dataset.snapshots), '0');
  await cleanedUp(pb);
  assert.deepEqual(await databases(pb), dbs);
  await shot(pb, '6-after-reload');
  const urls = await historyUrls(pb);
  for (const t of [tokB, tok2, tok3]) assert.ok(urls.every((u) => !u.includes(t)), JSON.stringify(urls));
  assert.deepEqual(await windowHolding(pb, tok3), []);
});

// What an earlier page left: databases named after SHA-256 of a token.
const tokenDb = (tok) => `im_sync_${crypto.createHash('sha256').update(tok).digest('hex').slice(0, 16)}`;
const makeDb = (page, name, rows) => page.evaluate((n, r) => new Promise((resolve, reject) => {
  const req = indexedDB.open(n, 1);
  req.onupgradeneeded = () => req.result.createObjectStore('kv');
  req.onerror = () => reject(req.error);
  req.onsuccess = () => {
    const tx = req.result.transaction('kv', 'readwrite');
    for (const [k, v] of r) tx.objectStore('kv').put(v, k);
    tx.oncomplete = () => { req.result.close(); resolve(); };
    tx.onerror = () => reject(tx.error);
  };
}), name, rows);

test('old token-named databases are deleted; the one of this very token is taken over, its queued send goes out once', async () => {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  await page.goto(`${gw.httpUrl}web/`);
  await page.waitForSelector('#token-form:not([hidden])');
  const tok = token(A, 'web-a-old');
  const cmid = `before-the-upgrade-${process.pid}`;
  await makeDb(page, tokenDb(tok), [
    ['meta', { user_id: A, device_id: 'web-a-old', generation: 0, applied: 0, outbox_seq: 1 }],
    ['o/000000000001', { type: 'send', conversation_id: conv, body: { text: 'queued before the upgrade' },
                         client_msg_id: cmid, queued_at: new Date().toISOString() }]]);
  await makeDb(page, tokenDb(token(A, 'web-a-older')), [['meta', { user_id: A, device_id: 'web-a-older' }]]);
  await makeDb(page, 'im_sync:999:gone', [['meta', { user_id: 999, device_id: 'gone' }]]);
  await makeDb(page, 'another-app', [['x', 1]]);
  await page.goto('about:blank');
  await page.goto(`${gw.httpUrl}web/#token=${tok}`);
  await online(page);
  const store = `im_sync:${A}:web-a-old`;
  await waitFor('only this device\'s database and another app\'s are left', async () =>
    JSON.stringify(await databases(page)) === JSON.stringify(['another-app', store]) || databases(page));
  await cleanedUp(page);
  assert.equal(await page.$eval('#status', (e) => e.dataset.store), store);
  await waitFor('the queued send reached the server', () =>
    Number(sql(`SELECT count(*) FROM im.event WHERE conversation_id = ${conv} AND client_msg_id = '${cmid}'`)) === 1);
  await openConversation(page);
  await page.waitForFunction(() => [...document.querySelectorAll('#messages li.message:not(.queued) .body')]
    .some((e) => e.textContent === 'queued before the upgrade'), { timeout: 30000, polling: 100 });
  assert.equal(Number(sql(`SELECT count(*) FROM im.event WHERE conversation_id = ${conv} AND client_msg_id = '${cmid}'`)), 1);
  await context.close();
});

test('a database another open tab uses stays; once that tab is closed, the next sign-in deletes it', async () => {
  const context = await browser.createBrowserContext();
  const C = newUser();
  const first = await signIn(token(A, 'web-shared'), context);
  const firstStore = await first.$eval('#status', (e) => e.dataset.store);
  // another user signs in in a second tab of the same browser
  const page = await signIn(token(C, 'web-shared'), context);
  await cleanedUp(page);
  const secondStore = await page.$eval('#status', (e) => e.dataset.store);
  assert.notEqual(firstStore, secondStore);
  assert.deepEqual(await databases(page), [firstStore, secondStore].sort());
  await first.close();
  await page.goto('about:blank');
  await page.goto(`${gw.httpUrl}web/#token=${token(C, 'web-shared')}`);
  await online(page);
  await cleanedUp(page);
  assert.deepEqual(await databases(page), [secondStore]);
  await context.close();
});

// ---- the page as a person reads it (pa and pb are A's and B's devices)

test('a line says who sent it and when, system events are sentences, labels are plain text', async () => {
  for (const page of [pa, pb]) await openConversation(page);
  const C = newUser();
  sql(`SELECT im.join_conversation(${conv}, ${C})`);
  sql(`SELECT im.leave_conversation(${conv}, ${C})`);
  await send(pa, 'who and when');
  const mid = await midOf(pb, 'who and when');
  const onB = await lineOf(pb, mid);
  assert.equal(onB.sender, `user ${A}`);
  assert.match(onB.time, /^\d\d:\d\d$/);
  // the local time of the server's created_at
  const createdAt = sql(`SELECT to_json(created_at) #>> '{}' FROM im.event WHERE message_id = ${mid}`);
  assert.equal(onB.time, await pb.evaluate((t) => {
    const d = new Date(t);
    return `${String(d.getHours()).padStart(2, '0')}:${String(d.getMinutes()).padStart(2, '0')}`;
  }, createdAt));
  assert.equal(onB.tick, null, 'no ticks on another user\'s message');
  await lineIs(pa, mid, (l) => l.sender === 'you' && ['sent', 'delivered', 'read'].includes(l.tick), 'A\'s own line: "you" and a tick');
  assert.ok(await pb.$$eval('#messages li.day', (els) => els.some((e) => e.textContent === 'today')), 'a date separator');
  await waitFor('the sentences on B', async () => {
    const control = await pb.$$eval('#messages li.control', (els) => els.map((e) => e.textContent));
    return JSON.stringify(control) === JSON.stringify([
      `this conversation was created with user ${A} and you`, `user ${C} joined`, `user ${C} left`]) || control;
  });
  // every label outside what users wrote is printable ASCII: nothing needs
  // an emoji or symbol font (the ticks are CSS shapes)
  for (const page of [pa, pb]) {
    await page.locator(`#messages li[data-mid="${mid}"] .more`).click();
    const odd = await page.evaluate(() => {
      const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
      const out = [];
      for (let n = walk.nextNode(); n; n = walk.nextNode()) {
        if (n.parentElement.closest('.body, .reply, .conv-text, .pinned-msg, #reply-to-text, #facts-of, #status')) continue;
        if (/[^\x20-\x7e\s]/.test(n.textContent)) out.push(n.textContent);
      }
      return out;
    });
    assert.deepEqual(odd, []);
    await page.keyboard.press('Escape');
    await page.waitForFunction(() => !document.querySelector('#messages .menu'), { polling: 100 });
  }
});

test('a shared_log switch reads as a sentence', async () => {
  const c2 = Number(sql(`SELECT im.create_conversation('group', ARRAY[${A}, ${B}]::bigint[], ${A})`));
  sql(`SELECT im.set_conversation_mode(${c2}, 'shared_log')`);
  await pb.locator(`#conversations li[data-conv="${c2}"]`).setTimeout(30000).click();
  await pb.waitForFunction(() => [...document.querySelectorAll('#messages li.control')]
    .some((e) => e.textContent === 'the conversation switched to shared log mode'), { timeout: 30000, polling: 100 });
  await openConversation(pb);
});

test('actions in a menu per message: react, pin, reply, edit, recall; reactions as counts, a tombstone, a takedown', async () => {
  await openConversation(pa);
  await openConversation(pb);
  // one "..." button per line, no menu open, no action buttons on the lines
  const lines = await pa.$$eval('#messages li.message:not(.queued):not(.tombstone)', (els) => els.map((li) =>
    [...li.querySelectorAll(':scope > button')].map((b) => b.className).filter((c) => c !== 'reply')));
  assert.ok(lines.length > 0 && lines.every((b) => JSON.stringify(b) === '["more"]'), JSON.stringify(lines));
  assert.equal(await pa.$$eval('#messages .menu', (els) => els.length), 0);

  await send(pb, 'please react');
  const target = await midOf(pa, 'please react');
  await menuItem(pa, target, 'react-like');
  for (const page of [pa, pb]) await lineIs(page, target, (l) => JSON.stringify(l.reactions) === '["like 1"]', 'like 1 under the message');
  await menuItem(pa, target, 'pin-btn');
  await pb.waitForFunction((t) => [...document.querySelectorAll('#pinned .pinned-msg')].some((e) => e.dataset.target === t),
                           { timeout: 30000, polling: 100 }, target);
  await menuItem(pa, target, 'reply-btn');
  await pa.waitForSelector('#reply-to:not([hidden])');
  await send(pa, 'a reply to it');
  const reply = await midOf(pb, 'a reply to it');
  await lineIs(pb, reply, (l) => l.reply === target, 'the reply quotes its target');
  // names as each reader reads them: B wrote the target
  await lineIs(pa, reply, (l) => l.reply === target, 'A shows the reply with its quote');
  assert.equal(await pa.$eval(`#messages li[data-mid="${reply}"] .reply`, (e) => e.textContent), `reply to user ${B}: please react`);
  assert.equal(await pb.$eval(`#messages li[data-mid="${reply}"] .reply`, (e) => e.textContent), 'reply to you: please react');
  await pb.click(`#messages li[data-mid="${reply}"] .reply`);   // the quote is a link to the target
  assert.equal(await pb.evaluate((t) => document.getElementById(`m-${t}`).classList.contains('flash'), target), true);

  await send(pa, 'a typo mesage');
  const typo = await midOf(pa, 'a typo mesage');
  await menuItem(pa, typo, 'edit-btn');
  await pa.waitForSelector('#editing:not([hidden])');
  assert.equal(await pa.$eval('#text', (e) => e.value), 'a typo mesage');
  await pa.$eval('#text', (e) => { e.value = ''; });
  await send(pa, 'a typo message, fixed');
  await lineIs(pb, typo, (l) => l.body === 'a typo message, fixed' && l.edited, 'B sees the edit, marked edited');

  await send(pa, 'to be recalled');
  const gone = await midOf(pa, 'to be recalled');
  await menuItem(pa, gone, 'recall-btn');
  for (const page of [pa, pb]) {
    await lineIs(page, gone, (l) => l.tombstone && l.body === 'message recalled' && JSON.stringify(l.buttons) === '[]', 'a tombstone');
  }
  // a moderator's takedown reaches both pages through sync: "removed by a moderator"
  await send(pb, 'to be taken down');
  const removed = await midOf(pa, 'to be taken down');
  sql(`SELECT created FROM im.takedown_message('mod', ${conv}, ${removed}, 'spam', 'browser-${removed}')`);
  for (const page of [pa, pb]) {
    await lineIs(page, removed, (l) => l.tombstone && l.body === 'removed by a moderator' && JSON.stringify(l.buttons) === '[]',
                 'a moderator\'s tombstone');
  }
  // B reacts too: the count is the number of users
  await menuItem(pb, target, 'react-like');
  for (const page of [pa, pb]) await lineIs(page, target, (l) => JSON.stringify(l.reactions) === '["like 2"]', 'like 2');
  await shot(pa, '7-reply-reactions-tombstone-device-a');
  await shot(pb, '8-reply-reactions-tombstone-device-b');
});

test('roles and mutes on the page: the owner mutes a sender from its menu, the muted page says so and is refused; unmuted it writes again', async () => {
  await openConversation(pa);
  await openConversation(pb);
  // A created the group: its owner; B a member, whose menu has no moderation items
  await pa.waitForFunction(() => document.getElementById('my-role').dataset.role === 'owner', { timeout: 30000, polling: 100 });
  await pb.waitForFunction(() => document.getElementById('my-role').dataset.role === 'member', { timeout: 30000, polling: 100 });
  assert.equal(await pb.$eval('#my-role', (e) => e.textContent), '');
  await send(pa, 'from the owner');
  const own = await midOf(pb, 'from the owner');
  await pb.locator(`#messages li[data-mid="${own}"] .more`).setTimeout(30000).click();
  assert.equal(await pb.$$eval(`#messages li[data-mid="${own}"] .menu .mute-btn`, (els) => els.length), 0);
  await pb.keyboard.press('Escape');

  await send(pb, 'mute me');
  const target = await midOf(pa, 'mute me');
  await menuItem(pa, target, 'mute-btn');
  await pb.waitForSelector('#muted:not([hidden])', { timeout: 30000 });
  assert.match(await pb.$eval('#muted', (e) => e.textContent), /^you are muted until .*: you can read but not write$/);
  assert.equal(await pb.$eval('#send', (e) => e.disabled), true);
  for (const page of [pa, pb]) {
    await page.waitForFunction(() => [...document.querySelectorAll('#messages li.control.mute')].some((e) => /was muted until/.test(e.textContent)),
                               { timeout: 30000, polling: 100 });
  }
  // a write the page still offers (a reaction) is refused by the server: FORBIDDEN, reason muted
  await menuItem(pb, own, 'react-like');
  await pb.waitForFunction(() => /you are muted in this conversation/.test(document.getElementById('status').textContent),
                           { timeout: 30000, polling: 100 });
  await shot(pb, '15-muted-member');
  assert.equal(Number(sql(`SELECT count(*) FROM im.event WHERE conversation_id = ${conv} AND kind = 'reaction' AND target_message_id = ${own}`)), 0);

  await menuItem(pa, target, 'unmute-btn');
  await pb.waitForSelector('#muted[hidden]', { timeout: 30000 });
  assert.equal(await pb.$eval('#send', (e) => e.disabled), false);
  await send(pb, 'unmuted again');
  await midOf(pa, 'unmuted again');
  // the owner makes B an admin, B's page says so; then a member again
  await menuItem(pa, target, 'admin-btn');
  await pb.waitForFunction(() => document.getElementById('my-role').dataset.role === 'admin', { timeout: 30000, polling: 100 });
  await shot(pa, '16-owner-menu');
  await menuItem(pa, target, 'member-btn');
  await pb.waitForFunction(() => document.getElementById('my-role').dataset.role === 'member', { timeout: 30000, polling: 100 });
});

test('ticks on the sender\'s page: sent, then delivered, then read', async () => {
  await openConversation(pa);
  await openConversation(pb);
  await send(pa, 'tick me');
  const mid = await midOf(pa, 'tick me');
  const live = (await pa.$eval('#messages', (e) => e.dataset.receipts)) === 'live';
  console.log(`ticks: ${live ? 'live receipts (no action on the sender\'s page)' : 'on demand: "Update ticks" (message_status)'}`);
  const tick = () => lineOf(pa, mid).then((l) => l.tick);
  // on demand: nothing is known beyond the server having it until asked
  if (!live) assert.equal(await tick(), 'sent');
  const until = (want) => waitFor(`A's tick ${want}`, async () => {
    if (!live) await pa.click('#refresh-ticks');
    return (await tick()) === want || tick();
  });
  await pb.waitForFunction(() => [...document.querySelectorAll('#messages .body')].some((e) => e.textContent === 'tick me'),
                           { timeout: 30000, polling: 100 });
  await until('delivered');
  await shot(pa, '9-ticks-delivered');
  await pb.click('#mark-read');
  await until('read');
  await shot(pa, '10-ticks-read');
});

test('the conversation list: most recent first, unread counts; pinned on top when the client pins', async (t) => {
  const c3 = Number(sql(`SELECT im.create_conversation('group', ARRAY[${A}, ${B}]::bigint[], ${A})`));
  sql(`SELECT msg_seq FROM im.send_message(${B}, ${c3}, 'recent-${process.pid}', '{"text": "newest"}')`);
  await waitFor('the new conversation first on A, one unread', async () => {
    const order = await listOrder(pa);
    const n = await pa.$eval(`#conversations li[data-conv="${c3}"] .unread`, (e) => e.dataset.unread).catch(() => null);
    return (order[0] === c3 && n === '1') || [order, n];
  });
  await openConversation(pa);
  await send(pa, 'back on top');
  await waitFor('the conversation written in moves to the top', async () => {
    const order = await listOrder(pa);
    return (order[0] === conv && order[1] === c3) || order;
  });
  if (!await pa.$(`#conversations li[data-conv="${c3}"] .conv-pin-btn`)) {
    t.skip('the client has no pinConversation yet (contract §20)');
    return;
  }
  await pa.click(`#conversations li[data-conv="${c3}"] .conv-pin-btn`);
  // a pin is the pinning user's own (contract §20): A's page only; B's list keeps its order
  await waitFor('the pinned conversation on top of A\'s list', async () => {
    const order = await listOrder(pa);
    const pinned = await pa.$eval(`#conversations li[data-conv="${c3}"]`, (e) => e.dataset.pinned).catch(() => null);
    return (order[0] === c3 && pinned === 'true') || [order, pinned];
  });
  const pinnedForB = await pb.$eval(`#conversations li[data-conv="${c3}"]`, (e) => e.dataset.pinned).catch(() => null);
  assert.notEqual(pinnedForB, 'true', 'A\'s pin is not B\'s');
  await shot(pa, '11-pinned-conversation');
  await pa.click(`#conversations li[data-conv="${c3}"] .conv-pin-btn`);
  await waitFor('unpinned', async () => (await listOrder(pa))[0] === conv || listOrder(pa));
});

// ---- a new device (contract §20): the recent conversations first, only
// the last historyPage positions of the conversation it opens, older ones
// as the pane is scrolled up.  A small history here; 200 conversations of
// 500 messages and the first screen's times are test/bench/new_device.sh.
const ND_CONVS = 20; const ND_MSGS = 100; const HISTORY_PAGE = 50;
const bodiesShown = (page) => page.$$eval('#messages li.message .body', (els) => els.map((e) => e.textContent));
const range = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => from + i);
let nd = null;   // the new device's page, its frame counts, the opened conversation

test('a new device lists the recent conversations first; it fetches no history but the last historyPage positions of the one it opens', async () => {
  const V = newUser(); const S = newUser();
  const t0 = Date.now();
  await seedConversations(V, S, ND_CONVS, ND_MSGS);
  const seeded = Date.now() - t0;
  const { context, page, counts, marks } = await openAsNewDevice(browser, gw.httpUrl, token(V, 'new-device'), ND_CONVS);
  console.log(`new device, ${ND_CONVS} x ${ND_MSGS} (seeded in ${seeded} ms): first item ${Math.round(marks.firstItem)} ms, `
              + `${ND_CONVS} listed ${Math.round(marks.listed)} ms, ready ${Math.round(marks.ready)} ms after navigation; `
              + `sent ${JSON.stringify(counts.sent)}`);
  // the list: every conversation, in the server's recent order, with its unread count
  const want = sql(`SELECT string_agg(conversation_id::text, ',' ORDER BY n) FROM im.recent_conversations(${V}, 1000) WITH ORDINALITY r(conversation_id, kind, mode, last_msg_seq, read_msg_seq, unread_count, dirty_target_msg_seq, dirty_version, head_msg_seq, last_activity_at, conversation_pinned, left_conversation, my_role, muted_until, next_cursor, n)`)
    .split(',').map(Number);
  assert.equal(want.length, ND_CONVS);
  await waitFor('the list in the recent order', async () => JSON.stringify(await listOrder(page)) === JSON.stringify(want) || listOrder(page));
  const unreads = await page.$$eval('#conversations li[data-conv] .unread', (els) => els.map((e) => Number(e.dataset.unread)));
  assert.deepEqual(unreads, want.map(() => ND_MSGS));
  assert.equal(await page.$eval('#status', (e) => e.dataset.snapshots), '1');
  // the first screen came from one snapshot and the list pages: no history
  assert.equal(counts.sent.snapshot_begin, 1);
  assert.equal(counts.sent.snapshot_fetch, counts.snapshotPages);
  assert.ok(counts.sent.recent_conversations >= 1, JSON.stringify(counts.sent));
  assert.deepEqual(counts.fetches, {}, 'no history fetched before a conversation is opened');
  await shot(page, '12-new-device-list');
  // open the top one: its last historyPage positions, nothing of the rest
  const top = want[0];
  const openMs = await openByClick(page, top, HISTORY_PAGE);
  console.log(`new device: conversation opened, ${HISTORY_PAGE} lines shown in ${openMs} ms`);
  assert.deepEqual(await bodiesShown(page), range(ND_MSGS - HISTORY_PAGE + 1, ND_MSGS).map((i) => `m${i}`));
  assert.deepEqual(Object.keys(counts.fetches).map(Number), [top], `history fetched only for the opened conversation: ${JSON.stringify(counts.fetches)}`);
  assert.ok(counts.positions[top] <= HISTORY_PAGE, `opened: ${counts.positions[top]} positions fetched`);
  assert.ok(counts.limits[top] <= HISTORY_PAGE, `opened: a fetch asked for ${counts.limits[top]}`);
  assert.ok(await page.$('#messages li.older'), 'older history is offered');
  await shot(page, '13-new-device-opened');
  nd = { context, page, counts, conv: top };
});

test('older history on scroll: the pane scrolled to the top pages back, in order, without duplicates, to the first message', async (t) => {
  if (!nd) { t.skip('the new device did not open'); return; }
  const { context, page, counts, conv } = nd;
  const loads = await scrollToFirst(page);
  // the create event (msg_seq 1) and every message once, in order
  assert.deepEqual(await paneSeqs(page), range(1, ND_MSGS + 1));
  assert.deepEqual(await bodiesShown(page), range(1, ND_MSGS).map((i) => `m${i}`));
  console.log(`older history: ${loads} scroll steps, ${counts.fetches[conv]} fetches in all`);
  // every position fetched once, historyPage at a time (the opening page and
  // one page per load); still nothing of the other conversations
  assert.equal(counts.positions[conv], ND_MSGS + 1);
  assert.equal(counts.fetches[conv], Math.ceil((ND_MSGS + 1) / HISTORY_PAGE));
  assert.ok(counts.limits[conv] <= HISTORY_PAGE);
  assert.deepEqual(Object.keys(counts.fetches).map(Number), [conv]);
  await shot(page, '14-older-history-first-message');
  await context.close();
});

// contract §17: a suspension closes the page's session with 4005; the page
// says the account is suspended and does not reconnect.
test('a suspended account: the page shows the notice and stays stopped', async () => {
  const C = newUser();
  sql(`SELECT im.create_conversation('group', ARRAY[${C}, ${A}]::bigint[], ${C})`);
  const pc = await signIn(token(C, 'web'));
  sql(`SELECT * FROM im.suspend_user('browser-test', ${C}, NULL, 'test')`);
  await pc.waitForFunction(() => document.getElementById('status').dataset.state === 'suspended', { timeout: 10000, polling: 100 });
  assert.match(await pc.$eval('#status', (e) => e.textContent), /suspended/);
  await new Promise((res) => setTimeout(res, 1500));
  assert.equal(await pc.$eval('#status', (e) => e.dataset.state), 'suspended');
  await shot(pc, '17-suspended');
  sql(`SELECT * FROM im.reinstate_user('browser-test', ${C})`);
  await pc.close();
});
