// The web page opened as a new device (contract §20: a new device shows
// the recent conversations first and loads only the last historyPage
// positions of the conversation it opens), shared by the browser suite
// (test/client/browser.test.mjs, a small history) and its benchmark
// (test/bench/new_device.mjs, 200 conversations of 500 messages): seeding
// through SQL, counting the frames the page sends and receives (Chrome's
// DevTools protocol sees the page's WebSocket; the page is not changed),
// the times of its first screen, and paging back by scrolling.
import { sql, waitFor } from './harness.mjs';

// nConvs groups of viewer and sender, each with nMsgs messages of the
// sender (bodies "m1".."mN", msg_seq 2..N+1 after the create event), sent
// chunk conversations per transaction; resolves once all are fanned out,
// so they reach a device registered afterwards by its snapshot, not by sync.
// Returns the conversation ids.
export async function seedConversations(viewer, sender, nConvs, nMsgs, { tag = `${process.pid}`, chunk = 10 } = {}) {
  const ids = sql(`SELECT string_agg(im.create_conversation('group', ARRAY[${viewer}, ${sender}]::bigint[], ${sender})::text, ',')
                   FROM pg_catalog.generate_series(1, ${nConvs}) g`).split(',').map(Number);
  for (let i = 0; i < ids.length; i += chunk) {
    const part = ids.slice(i, i + chunk);
    sql(`SELECT pg_catalog.count(*) FROM pg_catalog.unnest(ARRAY[${part}]::bigint[]) c(id),
           LATERAL pg_catalog.generate_series(1, ${nMsgs}) g,
           LATERAL im.send_message(${sender}, c.id, 'nd-${tag}-' || c.id || '-' || g, pg_catalog.jsonb_build_object('text', 'm' || g))`);
  }
  await waitFor('the seeded history fanned out', () =>
    sql(`SELECT pg_catalog.count(*) FROM im.outbox WHERE conversation_id = ANY (ARRAY[${ids}]::bigint[]) AND state <> 'done'`) === '0'
    || sql(`SELECT pg_catalog.count(*) FROM im.outbox WHERE conversation_id = ANY (ARRAY[${ids}]::bigint[]) AND state <> 'done'`),
  Math.max(60000, nConvs * nMsgs * 20));
  return ids;
}

// What the page sends and receives on its WebSocket, through a DevTools
// session of its own: frames sent by type; per conversation the
// fetch_messages frames and the positions their answers carried (and the
// largest limit asked); bytes received by type; the snapshot's page count;
// the timeline of frames (direction, type, ms since the document request).
export async function frameCounter(page) {
  const cdp = await page.createCDPSession();
  await cdp.send('Network.enable');
  const counts = { sent: {}, fetches: {}, positions: {}, limits: {}, bytes: {}, received: {}, snapshotPages: null,
                   timeline: [], navigatedAt: null };
  const asked = new Map();
  // ms since the document was requested, in the protocol's clock
  const at = (timestamp) => (counts.navigatedAt == null ? null : Math.round(timestamp * 1000 - counts.navigatedAt));
  cdp.on('Network.requestWillBeSent', ({ type, timestamp }) => {
    if (type === 'Document' && counts.navigatedAt == null) counts.navigatedAt = timestamp * 1000;
  });
  cdp.on('Network.webSocketFrameSent', ({ response, timestamp }) => {
    if (response.opcode !== 1) return;
    const f = JSON.parse(response.payloadData);
    counts.timeline.push(['>', f.type, at(timestamp)]);
    counts.sent[f.type] = (counts.sent[f.type] || 0) + 1;
    if (f.type === 'fetch_messages') {
      const c = f.conversation_id;
      asked.set(f.id, c);
      counts.fetches[c] = (counts.fetches[c] || 0) + 1;
      counts.limits[c] = Math.max(counts.limits[c] || 0, f.limit || 0);
    }
  });
  cdp.on('Network.webSocketFrameReceived', ({ response, timestamp }) => {
    if (response.opcode !== 1) return;
    const f = JSON.parse(response.payloadData);
    counts.timeline.push(['<', f.type, at(timestamp)]);
    counts.received[f.type] = (counts.received[f.type] || 0) + 1;
    counts.bytes[f.type] = (counts.bytes[f.type] || 0) + response.payloadData.length;
    if (f.type === 'snapshot_begin_result' && f.page_count != null) counts.snapshotPages = f.page_count;
    if (f.type === 'fetch_messages_result' && asked.has(f.id)) {
      const c = asked.get(f.id);
      counts.positions[c] = (counts.positions[c] || 0) + (f.messages || []).length;
    }
  });
  return counts;
}

// Marks, in the page's own clock (ms since its navigation started), when
// the conversation list first shows an item, when it shows `listed` items
// and when the status first reads ready; installed before any script of
// the document runs.
function markFirstScreen(listed) {
  const marks = {};
  Object.defineProperty(window, '__imMarks', { value: marks });
  const look = () => {
    const n = document.querySelectorAll('#conversations li[data-conv]').length;
    if (n > 0 && marks.firstItem == null) marks.firstItem = performance.now();
    if (n >= listed && marks.listed == null) marks.listed = performance.now();
    const s = document.getElementById('status');
    if (s && s.dataset.state === 'ready' && marks.ready == null) marks.ready = performance.now();
  };
  new MutationObserver(look).observe(document, { childList: true, subtree: true, attributes: true, attributeFilter: ['data-state'] });
}

// A new browser context (no local database: a new device) signs in with
// tok; resolves once `listed` conversations are shown and the status is
// ready, with the page, its frame counts and the first-screen marks (on a
// timeout the error carries them as .partial).
export async function openAsNewDevice(browser, url, tok, listed, { timeout = 120000 } = {}) {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  page.on('pageerror', (e) => console.log('page error:', e.message));
  const counts = await frameCounter(page);
  await page.evaluateOnNewDocument(markFirstScreen, listed);
  await page.goto(`${url}#token=${encodeURIComponent(tok)}`);
  try {
    await page.waitForFunction(() => window.__imMarks.listed != null && window.__imMarks.ready != null,
                               { timeout, polling: 100 });
  } catch (e) {
    e.partial = { context, page, counts };
    throw e;
  }
  const marks = await page.evaluate(() => ({ ...window.__imMarks }));
  return { context, page, counts, marks };
}

// Opens a conversation by a click on its list item; resolves once its last
// page is shown (`shown` lines of messages), with the ms it took.
export async function openByClick(page, conv, shown) {
  const t0 = Date.now();
  await page.locator(`#conversations li[data-conv="${conv}"]`).setTimeout(30000).click();
  await page.waitForFunction((n) => document.querySelectorAll('#messages li.message').length >= n,
                             { timeout: 60000, polling: 'mutation' }, shown);
  return Date.now() - t0;
}

// The msg_seq of every line in the message pane, top to bottom.
export const paneSeqs = (page) => page.$$eval('#messages li[data-seq]', (els) => els.map((e) => Number(e.dataset.seq)));

// Scrolls the message pane up with the mouse wheel, as a person would,
// until its first line is msg_seq 1 and nothing older is offered; after
// every step the lines must be in msg_seq order without duplicates.
// Returns the number of steps (a wheel, then older lines shown).
export async function scrollToFirst(page) {
  const inOrder = (s) => s.every((x, i) => i === 0 || x > s[i - 1]);
  await page.hover('#messages');
  let loads = 0;
  for (;;) {
    const before = await paneSeqs(page);
    if (!inOrder(before)) throw new Error(`lines out of order or duplicated: ${before}`);
    if (before[0] === 1 && !await page.$('#messages li.older')) return loads;
    await waitFor(`older lines above msg_seq ${before[0]}`, async () => {
      const now = await paneSeqs(page);
      if (now[0] < before[0] || (now[0] === 1 && !await page.$('#messages li.older'))) return true;
      // one wheel per load: none while the page says it is loading
      const loading = await page.$eval('#messages li.older', (e) => /loading/.test(e.textContent)).catch(() => false);
      if (!loading) await page.mouse.wheel({ deltaY: -4000 });
      return now.slice(0, 3);
    });
    loads++;
  }
}
