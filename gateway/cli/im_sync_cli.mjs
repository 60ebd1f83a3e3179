#!/usr/bin/env node
// im_sync_cli.mjs — the terminal equivalent of the web page, on the same
// module (contract §16).  Node ≥ 20, with the ws package from gateway/.
//   node gateway/cli/im_sync_cli.mjs --url ws://127.0.0.1:PORT/ --token T [--store DIR] COMMAND
//     list                      conversations with unread counts
//     messages CONV             a conversation's messages
//     send CONV TEXT            send (retried with the same client_msg_id until acknowledged)
//     read CONV                 mark the conversation read
//     follow [CONV]             print new messages as they arrive (Ctrl-C ends)
// --store DIR keeps the local view and the outbox in DIR (file storage), so
// the next run resumes instead of taking a snapshot.  IM_TOKEN may hold the token.
import { createRequire } from 'node:module';
import { ImSyncClient, FileStorage, MemoryStorage } from '../web/im_sync_client.js';

const require = createRequire(new URL('../package.json', import.meta.url));
const WebSocket = require('ws');

function usage(msg) {
  if (msg) process.stderr.write(`${msg}\n`);
  process.stderr.write('usage: im_sync_cli.mjs --url URL --token TOKEN [--store DIR] list|messages C|send C TEXT|read C|follow [C]\n');
  process.exit(2);
}

const args = process.argv.slice(2);
const opts = { token: process.env.IM_TOKEN };
const rest = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--url') opts.url = args[++i];
  else if (args[i] === '--token') opts.token = args[++i];
  else if (args[i] === '--store') opts.store = args[++i];
  else rest.push(args[i]);
}
if (!opts.url || !opts.token || !rest.length) usage();
const [command, ...params] = rest;
const text = (m) => (m.taken_down ? '(removed by a moderator)' : m.body == null ? '(recalled)'
  : typeof m.body.text === 'string' ? m.body.text : JSON.stringify(m.body));
const line = (m) => `${m.conversation_id}#${m.msg_seq} ${m.sender_id}: ${text(m)}${m.edited ? ' (edited)' : ''}` +
  (Object.keys(m.reactions).length ? ` ${JSON.stringify(m.reactions)}` : '');

let printed = new Map();
const client = new ImSyncClient({
  url: opts.url, token: opts.token, WebSocket,
  storage: opts.store ? new FileStorage(opts.store) : new MemoryStorage(),
  onStatus: ({ state, detail }) => {
    if (['needs_token', 'revoked', 'superseded', 'wrong_account', 'error'].includes(state)) {
      process.stderr.write(`im_sync: ${state}${detail ? `: ${typeof detail === 'string' ? detail : JSON.stringify(detail)}` : ''}\n`);
      process.exit(1);
    }
    if (command === 'follow' && state !== 'ready') process.stderr.write(`im_sync: ${state}\n`);
  },
  onChange: () => {
    if (command !== 'follow') return;
    const only = params[0] != null ? Number(params[0]) : null;
    for (const c of client.conversations()) {
      if (only != null && c.conversation_id !== only) continue;
      const seen = printed.get(c.conversation_id) || 0;
      for (const m of client.messages(c.conversation_id)) {
        if (m.kind === 'message' && m.msg_seq > seen) process.stdout.write(line(m) + '\n');
      }
      printed.set(c.conversation_id, c.last_msg_seq);
    }
  },
});

const conv = () => { const c = Number(params[0]); if (!Number.isSafeInteger(c)) usage('CONV must be a conversation id'); return c; };
try {
  if (command === 'follow') printed = new Map();
  await client.start();
  switch (command) {
    case 'list':
      for (const c of client.conversations()) {
        process.stdout.write(`${c.conversation_id}\t${c.kind}\t${c.mode}\tunread ${c.unread}\tlast ${c.last_msg_seq}\n`);
      }
      break;
    case 'messages':
      await client.open(conv());    // a new store loads history when a conversation is opened
      for (const m of client.messages(conv())) if (m.kind === 'message') process.stdout.write(line(m) + '\n');
      break;
    case 'send': {
      if (params.length < 2) usage('send CONV TEXT');
      const r = await client.send(conv(), { text: params.slice(1).join(' ') });
      process.stdout.write(`sent message ${r.message_id} at ${r.msg_seq}${r.created ? '' : ' (already sent)'}\n`);
      break;
    }
    case 'read': {
      const c = client.conversations().find((x) => x.conversation_id === conv());
      const r = await client.read(conv(), c ? c.last_msg_seq : 0);
      process.stdout.write(`read to ${r.read_msg_seq}, unread ${r.unread_count}\n`);
      break;
    }
    case 'follow':
      client.onChange(client);
      await new Promise((resolve) => process.once('SIGINT', resolve));
      break;
    default:
      usage(`unknown command ${command}`);
  }
  await client.stop();
  process.exit(0);
} catch (e) {
  process.stderr.write(`im_sync: ${e.message}\n`);
  process.exit(1);
}
