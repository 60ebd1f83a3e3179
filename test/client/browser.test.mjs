// The web page in a real browser: Debian's chromium, headless,
// driven by puppeteer-core; two pages as two devices.  Assertions are on the
// DOM; screenshots go to the test's temp directory.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import { createRequire } from 'node:module';
import { sql, newUser, token, waitFor, Gateway, TMP } from './harness.mjs';

const require = createRequire(new URL('../../gateway/package.json', import.meta.url));
const puppeteer = require('puppeteer-core');

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

const online = (page) => page.waitForFunction(() => document.getElementById('status').dataset.state === 'online', { timeout: 30000, polling: 100 })
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

before(async () => {
  fs.mkdirSync(shots, { recursive: true });
  conv = Number(sql(`SELECT im.create_conversation('group', ARRAY[${A}, ${B}]::bigint[], ${A})`));
  await gw.start();
  browser = await puppeteer.launch({
    executablePath: process.env.IM_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    userDataDir: profile,
    args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage',
           // two pages are two devices: the one in the background must keep running
           '--disable-background-timer-throttling', '--disable-renderer-backgrounding',
           '--disable-backgrounding-occluded-windows'],
    protocolTimeout: 60000,
  });
  tokA = token(A, 'web-a');
  pa = await open(tokA);
  tokB = token(B, 'web-b');
  pb = await open(tokB);
});
after(async () => {
  if (browser) await browser.close();
  await gw.stop();
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
  await pa.waitForFunction(() => document.querySelectorAll('#messages li.mine .facts-btn').length > 0, { polling: 100 });
  // A's last own message's facts button, found again for every click: the
  // message list is drawn anew as receipts arrive
  const openFacts = async () => { await (await pa.$$('#messages li.mine .facts-btn')).pop().click(); return true; };
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
