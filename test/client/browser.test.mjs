// The web page in a real browser (issue 13): Debian's chromium, headless,
// driven by puppeteer-core; two pages as two devices.  Assertions are on the
// DOM; screenshots go to the test's temp directory.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { sql, newUser, token, waitFor, Gateway, TMP } from './harness.mjs';

const require = createRequire(new URL('../../gateway/package.json', import.meta.url));
const puppeteer = require('puppeteer-core');

const gw = new Gateway();
let browser;
const shots = path.join(TMP, 'screenshots');
const profile = fs.mkdtempSync(path.join(TMP, 'chromium-profile-'));
const A = newUser(); const B = newUser();
let conv; let pa; let pb; let tokB;

// The list is drawn again as the first sync pages arrive: a locator waits for
// the item to be attached, visible and still, and clicks it again if it was
// replaced in between (a bare click of the item found first can meet a
// detached node).
const openConversation = (page) =>
  page.locator(`#conversations li[data-conv="${conv}"]`).setTimeout(30000).click();

async function open(tok) {
  // a context (window) of its own per device: both stay visible and running
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  page.on('pageerror', (e) => console.log('page error:', e.message));
  page.on('console', (m) => console.log('page console:', m.text()));
  page.on('dialog', (d) => d.dismiss());
  await page.goto(`${gw.httpUrl}#token=${encodeURIComponent(tok)}`);
  await page.waitForFunction(() => document.getElementById('status').dataset.state === 'online', { timeout: 30000, polling: 100 })
    .catch(async (e) => { throw new Error(`${e.message}; status: ${await page.$eval('#status', (x) => x.textContent).catch(() => '?')}`); });
  await openConversation(page);
  return page;
}
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
  pa = await open(token(A, 'web-a'));
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

test('a reload resumes from IndexedDB without a snapshot', async () => {
  const shown = await texts(pb);
  await pb.reload();
  await pb.waitForFunction(() => window.imClient && document.getElementById('status').dataset.state === 'online', { timeout: 30000, polling: 100 });
  await openConversation(pb);
  await send(pa, 'after the reload');
  const want = [...shown, 'after the reload'];
  await waitFor('B shows the new message', async () => JSON.stringify(await texts(pb)) === JSON.stringify(want) || await texts(pb));
  const stats = await pb.evaluate(() => window.imClient.stats);
  assert.equal(stats.snapshots, 0, JSON.stringify(stats));
  await shot(pb, '6-after-reload');
});
