// Benchmark of the web page opened as a new device, driven by
// new_device.sh (contract §20): CONVS conversations of MSGS messages for one
// user, then ROUNDS new devices of that user, each in a fresh browser
// context.  Per round: ms from navigation (the page's own clock) to the
// list's first item, to all CONVS listed, to the ready state; frames sent
// and bytes received by type; the top conversation opened by a click.
// Medians over the rounds.  The same frame checks as the browser suite:
// no history of a conversation not opened, at most historyPage positions
// of the one opened.
import fs from 'node:fs';
import path from 'node:path';
import { sql, token, Gateway, TMP, launchChromium } from '../client/harness.mjs';
import { seedConversations, openAsNewDevice, openByClick } from '../client/new_device.mjs';

const CONVS = Number(process.env.BENCH_CONVS || 200);
const MSGS = Number(process.env.BENCH_MSGS || 500);
const ROUNDS = Number(process.env.BENCH_ROUNDS || 3);
const HISTORY_PAGE = 50;
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

// BENCH_GATEWAY_ARGS: extra gateway options, e.g. "--statement-timeout 0"
// (its default, 10 s, cancels a snapshot that takes longer)
const gw = new Gateway();
await gw.start((process.env.BENCH_GATEWAY_ARGS || '').split(' ').filter(Boolean));
const WAIT_MS = Number(process.env.BENCH_WAIT_MS || 180000);
const V = 9_200_001; const S = 9_200_002;
let t0 = Date.now();
await seedConversations(V, S, CONVS, MSGS, { tag: 'bench', chunk: 10 });
console.log(`seeded ${CONVS} conversations x ${MSGS} messages and fanned them out in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
sql('VACUUM ANALYZE');
const top = Number(sql(`SELECT conversation_id FROM im.recent_conversations(${V}, 1)`));
// the server's part of the first screen, without the page: one snapshot
// begun through SQL (the gateway's snapshot_begin), then its first page
sql(`SELECT * FROM im.register_device(${V}, 'bench-sql')`);
t0 = Date.now();
const [pages, token0] = sql(`SELECT page_count || ' ' || snapshot_token FROM im.begin_snapshot(${V}, 'bench-sql')`).split(' ');
const beginMs = Date.now() - t0;
t0 = Date.now();
sql(`SELECT status FROM im.fetch_snapshot(${V}, 'bench-sql', '${token0}', 0)`);
console.log(`im.begin_snapshot through SQL: ${beginMs} ms (${pages} pages); its first page: ${Date.now() - t0} ms`);

const browser = await launchChromium(fs.mkdtempSync(path.join(TMP, 'chromium-new-device-')), { protocolTimeout: 120000 });
const rows = [];
let failed = 0;
for (let i = 0; i < ROUNDS; i++) {
  let opened;
  try {
    opened = await openAsNewDevice(browser, gw.httpUrl, token(V, `bench-new-${i}`), CONVS, { timeout: WAIT_MS });
  } catch (e) {
    if (!e.partial) throw e;
    const { context, counts } = e.partial;
    failed++;
    console.log(`round ${i + 1}: FAIL: no first screen within ${WAIT_MS} ms; sent ${JSON.stringify(counts.sent)}, `
                + `received ${JSON.stringify(counts.received)}`);
    console.log(`  frames: ${counts.timeline.slice(0, 12).map(([d, t, ms]) => `${d}${t.replace(/_result$/, '')} ${ms}`).join(', ')}`);
    await context.close();
    continue;
  }
  const { context, page, counts, marks } = opened;
  const fetchedBefore = Object.keys(counts.fetches).length;
  const openMs = await openByClick(page, top, Math.min(HISTORY_PAGE, MSGS));
  const other = Object.keys(counts.fetches).map(Number).filter((c) => c !== top);
  const ok = fetchedBefore === 0 && other.length === 0 && (counts.positions[top] || 0) <= HISTORY_PAGE;
  if (!ok) failed++;
  rows.push({ ...marks, openMs });
  if (i === 0) await page.screenshot({ path: path.join(TMP, 'new-device-bench.png') });
  console.log(`round ${i + 1}: first item ${marks.firstItem.toFixed(0)} ms, ${CONVS} listed ${marks.listed.toFixed(0)} ms, `
              + `ready ${marks.ready.toFixed(0)} ms; opened in ${openMs} ms (${counts.positions[top]} positions fetched); `
              + `${ok ? 'ok' : `FAIL: history fetched before opening ${fetchedBefore}, of others ${other.length}`}`);
  console.log(`  sent ${JSON.stringify(counts.sent)}; snapshot pages ${counts.snapshotPages}; bytes received ${JSON.stringify(counts.bytes)}`);
  console.log(`  frames (ms since the document request): ${counts.timeline.map(([d, t, ms]) => `${d}${t.replace(/_result$/, '')} ${ms}`).join(', ')}`);
  await context.close();
}
await browser.close();
await gw.stop();
const m = (k) => (rows.length ? median(rows.map((r) => r[k])).toFixed(0) : '-');
console.log(`new device, ${CONVS} x ${MSGS}, median of ${ROUNDS}: first item ${m('firstItem')} ms, all listed ${m('listed')} ms, `
            + `ready ${m('ready')} ms after navigation; top conversation opened in ${m('openMs')} ms; `
            + `frame checks ${failed ? `FAILED in ${failed} round(s)` : 'ok'}`);
console.log(`screenshot: ${path.join(TMP, 'new-device-bench.png')}`);
process.exit(failed ? 1 : 0);
