// A client process for the kill -9 test: "hang-before-ack" catches up,
// prints READY, and on the next batch prints COMMITTED <watermark> after the
// storage commit and waits forever before the ACK (the parent kills it -9
// there); "check" starts on the same files, catches up and prints its view.
import { client, FileStorage, normalize } from './harness.mjs';

const [url, tok, store, mode, conv] = process.argv.slice(2);
const gw = { url };
let ready = false;
const hooks = mode === 'hang-before-ack' ? {
  beforeAck: async (batch) => {
    if (!ready) return;
    process.stdout.write(`COMMITTED ${batch.high_watermark}\n`);
    await new Promise(() => {});
  },
} : {};
const c = client(gw, tok, new FileStorage(store), { hooks, pollMs: 500 });
await c.start();
if (mode === 'hang-before-ack') {
  ready = true;
  process.stdout.write('READY\n');
} else {
  await c.open(Number(conv));       // a first start loads history when opened
  const view = { applied: c.meta.applied, messages: c.messages(Number(conv)).map(normalize) };
  await c.stop();
  process.stdout.write(JSON.stringify(view) + '\n');
  process.exit(0);
}
