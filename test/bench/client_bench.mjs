// Benchmark of the reference client, driven by client_bench.sh.
//  1. catch-up of EVENTS events: the Node client with file storage (pages,
//     one fdatasync'ed commit per batch, ACK) against the raw sync frames
//     (sync, cursor pages, ack; nothing stored) through the same gateway,
//     alternating ROUNDS times; each side on its own device of one user,
//     every device activated at the same cut before the events were written.
//  2. send on one page → display on the other (headless chromium, two
//     devices of two users): p50/p99 over MESSAGES messages, one at a time.
import fs from 'node:fs';
import path from 'node:path';
import { sql, token, waitFor, Gateway, TMP, client, FileStorage, WS, launchChromium } from '../client/harness.mjs';

const EVENTS = Number(process.env.BENCH_EVENTS || 10000);
const ROUNDS = Number(process.env.BENCH_ROUNDS || 3);
const MESSAGES = Number(process.env.BENCH_MESSAGES || 100);
const PAGE = Number(process.env.BENCH_PAGE || 500);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const pct = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))];

const gw = new Gateway();
await gw.start();
const U = 9_100_001; const S = 9_100_002;
const conv = Number(sql(`SELECT im.create_conversation('group', ARRAY[${U}, ${S}]::bigint[], ${S})`));
const store = (i) => path.join(TMP, `bench-store-${i}`);

// every device at the same cut: the client ones by a first start (snapshot,
// saved in its file storage), the raw ones by a snapshot through SQL
const rawDevices = [];
const clientTokens = [];
for (let i = 0; i < ROUNDS; i++) {
  const tok = token(U, `client-${i}`);
  const c = client(gw, tok, new FileStorage(store(i)), { pageLimit: PAGE, pollMs: 0 });
  await c.start();
  await c.stop();
  clientTokens.push(tok);
  const raw = `raw-${i}`;
  sql(`SELECT * FROM im.register_device(${U}, '${raw}')`);
  sql(`SELECT a.status FROM im.begin_snapshot(${U}, '${raw}') b, im.ack_snapshot(${U}, '${raw}', b.snapshot_token, b.manifest_digest) a`);
  rawDevices.push({ tok: token(U, raw) });
}
const base = Number(sql(`SELECT high_watermark FROM im.device_session(${U}, 'raw-0', 0)`));
sql(`DO $$ BEGIN FOR i IN 1..${EVENTS} LOOP
       PERFORM im.send_message(${S}, ${conv}, 'bench-' || i, jsonb_build_object('text', 'catch-up message ' || i));
     END LOOP; END $$`);
await waitFor('fanout of the events', () =>
  Number(sql(`SELECT high_watermark FROM im.device_session(${U}, 'raw-0', 0)`)) >= base + EVENTS, 600000);
const target = Number(sql(`SELECT high_watermark FROM im.device_session(${U}, 'raw-0', 0)`));

// the raw frames: what a client that stores nothing would do
function rawCatchUp(tok) {
  return new Promise((resolve, reject) => {
    const ws = new WS(gw.url, 'im-sync.v1');
    let id = 0; let gen = 0; let applied = 0; let events = 0; let t0 = 0; let batch = null;
    const send = (f) => ws.send(JSON.stringify({ ...f, id: ++id }));
    ws.on('open', () => send({ type: 'hello', token: tok }));
    ws.on('message', (data) => {
      const f = JSON.parse(data.toString());
      if (f.type === 'welcome') {
        gen = f.sync_generation; applied = f.server_acked_sync_seq;
        t0 = performance.now();
        send({ type: 'sync', sync_generation: gen, local_applied_sync_seq: applied, limit: PAGE });
      } else if (f.type === 'sync_result') {
        if (f.status !== 'OK') { reject(new Error(`raw sync: ${f.status}`)); return; }
        if (f.batch_token && (!batch || f.batch_token !== batch.batch_token)) batch = f;
        events += f.events.length;
        if (f.has_more) send({ type: 'sync', cursor: f.next_cursor, limit: PAGE });
        else send({ type: 'ack', batch_token: batch.batch_token, acked_sync_seq: batch.batch_high_watermark });
      } else if (f.type === 'ack_result') {
        applied = batch.batch_high_watermark; gen = batch.sync_generation;
        if (applied >= target) { const ms = performance.now() - t0; ws.close(); resolve({ ms, events }); return; }
        batch = null;
        send({ type: 'sync', sync_generation: gen, local_applied_sync_seq: applied, limit: PAGE });
      } else if (f.type === 'error') reject(new Error(JSON.stringify(f)));
    });
    ws.on('error', reject);
  });
}

async function clientCatchUp(i) {
  const c = client(gw, clientTokens[i], new FileStorage(store(i)), { pageLimit: PAGE, pollMs: 0 });
  const t0 = performance.now();
  await c.start();
  const ms = performance.now() - t0;
  const n = c.messages(conv).length;
  await c.stop();
  if (c.meta.applied < target || n < EVENTS) throw new Error(`client caught up to ${c.meta.applied}/${target}, ${n} positions`);
  return { ms, events: c.stats.events };
}

const ratios = []; const rawRates = []; const clientRates = [];
for (let i = 0; i < ROUNDS; i++) {
  const r = await rawCatchUp(rawDevices[i].tok);
  const c = await clientCatchUp(i);
  const rr = r.events / (r.ms / 1000); const cr = c.events / (c.ms / 1000);
  rawRates.push(rr); clientRates.push(cr); ratios.push(cr / rr);
  console.log(`round ${i + 1}: raw frames ${r.events} events in ${r.ms.toFixed(0)} ms (${rr.toFixed(0)}/s); ` +
              `client+file storage ${c.events} events in ${c.ms.toFixed(0)} ms (${cr.toFixed(0)}/s); ratio ${(cr / rr).toFixed(2)}`);
}
console.log(`catch-up of ${EVENTS} events, median of ${ROUNDS}: client with file storage ${median(clientRates).toFixed(0)} events/s, ` +
            `raw sync frames ${median(rawRates).toFixed(0)} events/s, ratio ${median(ratios).toFixed(2)}`);

// ---- 2. send on one page → display on the other
const A = 9_100_011; const B = 9_100_012;
const c2 = Number(sql(`SELECT im.create_conversation('group', ARRAY[${A}, ${B}]::bigint[], ${A})`));
const browser = await launchChromium(fs.mkdtempSync(path.join(TMP, 'chromium-bench-')));
async function open(tok) {
  const page = await (await browser.createBrowserContext()).newPage();
  await page.goto(`${gw.httpUrl}web/#token=${encodeURIComponent(tok)}`);
  await page.waitForFunction(() => ['ready', 'online'].includes(document.getElementById('status').dataset.state), { polling: 50, timeout: 60000 });
  await page.waitForSelector(`#conversations li[data-conv="${c2}"]`);
  await page.click(`#conversations li[data-conv="${c2}"]`);
  return page;
}
const pa = await open(token(A, 'bench-web'));
const pb = await open(token(B, 'bench-web'));
// B records when each text first appears in its message list
await pb.evaluate(() => {
  window.__seen = {};
  new MutationObserver(() => {
    for (const e of document.querySelectorAll('#messages li.message .body')) {
      if (!(e.textContent in window.__seen)) window.__seen[e.textContent] = Date.now();
    }
  }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
});
const lat = [];
for (let i = 0; i < MESSAGES; i++) {
  const text = `latency ${i}`;
  // sent through the page's composer (the page keeps its client off window)
  const t0 = await pa.evaluate((t) => {
    const now = Date.now();
    document.getElementById('text').value = t;
    document.getElementById('composer').requestSubmit();
    return now;
  }, text);
  await pb.waitForFunction((t) => t in window.__seen, { polling: 5, timeout: 30000 }, text);
  lat.push((await pb.evaluate((t) => window.__seen[t], text)) - t0);
}
console.log(`send on one page -> shown on the other, ${MESSAGES} messages one at a time: ` +
            `p50 ${pct(lat, 0.5)} ms, p99 ${pct(lat, 0.99)} ms, max ${Math.max(...lat)} ms`);
await browser.close();
await gw.stop();
process.exit(0);
