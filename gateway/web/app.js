// The web page of contract §16 on the reference client.  Every body and
// name is put into the page with textContent, never as HTML, so a message
// cannot add markup or run code (the CSP forbids inline script as well).
//
// The device token: taken from the URL fragment once and removed from it at
// once (history.replaceState), so no history entry, bookmark or session
// restore holds it; after that it lives only in the client inside this
// module, never on window (a reload asks for it again; the local database
// stays).  The local database is named after the user and device the token
// names, so a re-issued token of the same device finds its history; after
// the server confirmed who this is (welcome), every other database of this
// page's naming is deleted — see forgetOtherDatabases.
import { ImSyncClient, IndexedDBStorage, deviceTokenClaims } from './im_sync_client.js';

const $ = (id) => document.getElementById(id);
let client = null;
let store = null;       // the current client's database name
let selected = null;
let replyTo = null;

const DB_PREFIX = 'im_sync:';
// an earlier page's naming: 'im_sync_' + 8 bytes of SHA-256(token) in hex
const TOKEN_DB = /^im_sync_[0-9a-f]{16}$/;
const dbName = (claims) => `${DB_PREFIX}${claims.userId}:${encodeURIComponent(claims.deviceId)}`;
// A page holds its database's lock (shared) as long as it uses it; deleting
// a database takes the lock exclusively, so an open tab's database is never
// deleted under it (and a tab opening one waits for a delete under way).
const lockName = (db) => `im_sync.db:${db}`;

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, String(v));
    else if (k === 'onclick') e.addEventListener('click', v);
    else e[k] = v;
  }
  for (const c of children) e.append(typeof c === 'string' ? document.createTextNode(c) : c);
  return e;
}

function bodyText(body) {
  if (body == null) return '';
  if (typeof body.text === 'string') return body.text;
  return JSON.stringify(body);
}

async function tokenDbName(token) {
  const d = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(token));
  return 'im_sync_' + Array.from(new Uint8Array(d).slice(0, 8), (b) => b.toString(16).padStart(2, '0')).join('');
}

const databaseNames = async () => (indexedDB.databases ? (await indexedDB.databases()).map((d) => d.name) : []);

function holdLock(db) {
  if (!navigator.locks) return Promise.resolve(() => {});
  return new Promise((granted) => {
    navigator.locks.request(lockName(db), { mode: 'shared' }, () => new Promise((release) => granted(release)));
  });
}

// The database an earlier page kept for this very token (named after its
// hash) is copied into the user's and device's one when that one is new, so
// its history and queued operations carry over (queued operations keep their
// client_msg_id: sent once).  Only a database whose meta names the token's
// user and device is taken.  It is deleted after the welcome like the rest.
async function adoptTokenDatabase(token, db, claims) {
  const names = await databaseNames();
  const old = await tokenDbName(token);
  if (!names.includes(old) || names.includes(db)) return;
  const from = new IndexedDBStorage(old);
  const rows = await from.load();
  await from.close();
  const meta = (rows.find(([k]) => k === 'meta') || [])[1];
  if (meta && meta.user_id != null && (meta.user_id !== claims.userId ||
                                        meta.device_id != null && meta.device_id !== claims.deviceId)) return;
  const to = new IndexedDBStorage(db);
  await to.load();
  await to.commit({ puts: rows });
  await to.close();
}

// Deletes every database of this page's naming except `keep`: the
// token-named ones of earlier pages and the user-and-device ones of other
// devices and other users.  A browser profile is one place: whoever uses it
// can read each database in it, so one the page no longer uses is plaintext
// history left behind, whoever it belonged to (another user on a shared
// browser signs in again with a snapshot).  A database another open tab
// uses (its lock is held) stays; a later load deletes it.  Runs only after
// the welcome, so a link with a token the server refuses deletes nothing.
async function forgetOtherDatabases(keep) {
  const doomed = (await databaseNames()).filter((n) => n !== keep && (TOKEN_DB.test(n) || n.startsWith(DB_PREFIX)));
  await Promise.all(doomed.map((n) => (navigator.locks
    ? navigator.locks.request(lockName(n), { ifAvailable: true }, (lock) => (lock ? IndexedDBStorage.wipe(n) : null))
    : IndexedDBStorage.wipe(n))));
}

function report(err) {
  $('status').textContent = `error: ${err.message}`;
}

function render() {
  if (!client) return;
  // observable page state for tests and people: never the token
  $('status').dataset.store = store;
  $('status').dataset.snapshots = String(client.stats.snapshots);
  $('who').textContent = client.userId != null ? `user ${client.userId}` : '';
  const pending = client.outboxItems().length;
  $('pending').textContent = pending ? `${pending} queued` : '';
  const list = $('conversations');
  list.replaceChildren(...client.conversations().map((c) => el('li',
    { 'data-conv': c.conversation_id, class: c.conversation_id === selected ? 'selected' : '',
      onclick: () => select(c.conversation_id) },
    `${c.kind || 'conversation'} ${c.conversation_id}${c.mode === 'shared_log' ? ' (large)' : ''}${c.left ? ' (left)' : ''}`,
    el('span', { class: 'unread', 'data-unread': c.unread }, c.unread ? String(c.unread) : ''))));
  if (selected == null) return;
  const conv = client.conversations().find((c) => c.conversation_id === selected);
  $('conversation').hidden = false;
  $('conversation-title').textContent = `${conv ? conv.kind || '' : ''} ${selected}`;
  const msgs = client.messages(selected);
  const byId = new Map(msgs.filter((m) => m.kind === 'message').map((m) => [m.message_id, m]));
  $('pinned').textContent = conv && conv.pinned.length
    ? `pinned: ${conv.pinned.map((id) => (byId.get(id) ? bodyText(byId.get(id).body) : id)).join(' · ')}` : '';
  const me = client.userId;
  const items = [];
  for (const m of msgs) {
    if (m.kind !== 'message') {
      if (['create', 'join', 'leave', 'mode'].includes(m.kind)) {
        items.push(el('li', { class: 'control', 'data-seq': m.msg_seq }, `${m.kind} ${m.body ? JSON.stringify(m.body) : ''}`));
      }
      continue;
    }
    const mine = m.sender_id === me;
    const li = el('li', { class: `message${mine ? ' mine' : ''}`, 'data-seq': m.msg_seq, 'data-mid': m.message_id });
    li.append(el('span', { class: 'sender' }, `${m.sender_id}: `));
    if (m.reply_to_message_id != null) {
      const t = byId.get(m.reply_to_message_id);
      li.append(el('span', { class: 'reply' }, `↪ ${t ? bodyText(t.body).slice(0, 30) : m.reply_to_message_id} `));
    }
    li.append(el('span', { class: 'body' }, m.recalled ? '(recalled)' : bodyText(m.body)));
    const meta = [];
    if (m.edited && !m.recalled) meta.push('edited');
    const reactions = Object.entries(m.reactions).map(([k, n]) => `${k}${n}`).join(' ');
    if (reactions) meta.push(reactions);
    li.append(el('span', { class: 'meta' }, meta.join(' · ')));
    if (!m.recalled) {
      li.append(el('button', { type: 'button', class: 'reply-btn', onclick: () => startReply(m) }, 'reply'));
      const mineReacted = m.my_reactions.includes('👍');
      li.append(el('button', { type: 'button', class: 'react-btn',
        onclick: () => client.react(selected, m.message_id, '👍', !mineReacted).catch(report) }, mineReacted ? 'un-👍' : '👍'));
      const pinned = conv && conv.pinned.includes(m.message_id);
      li.append(el('button', { type: 'button', class: 'pin-btn',
        onclick: () => client.pin(selected, m.message_id, !pinned).catch(report) }, pinned ? 'unpin' : 'pin'));
      if (mine) {
        li.append(el('button', { type: 'button', class: 'edit-btn', onclick: () => editMessage(m) }, 'edit'));
        li.append(el('button', { type: 'button', class: 'recall-btn',
          onclick: () => client.recall(selected, m.message_id).catch(report) }, 'recall'));
        li.append(el('button', { type: 'button', class: 'facts-btn', onclick: () => showFacts(m) }, 'status'));
      }
    }
    items.push(li);
  }
  for (const o of client.outboxItems()) {
    if (o.type === 'send' && o.conversation_id === selected) {
      items.push(el('li', { class: 'message mine queued' }, el('span', { class: 'sender' }, `${me}: `),
        el('span', { class: 'body' }, bodyText(o.body)), el('span', { class: 'meta' }, 'queued')));
    }
  }
  $('messages').replaceChildren(...items);
}

function select(conversationId) {
  selected = conversationId;
  $('facts').hidden = true;
  render();
}

function startReply(m) {
  replyTo = m.message_id;
  $('reply-to').hidden = false;
  $('reply-to-text').textContent = bodyText(m.body).slice(0, 40);
}

function editMessage(m) {
  const text = prompt('Edit message', bodyText(m.body));
  if (text != null) client.edit(selected, m.message_id, { text }).catch(report);
}

async function showFacts(m) {
  $('facts').hidden = false;
  $('facts-of').textContent = bodyText(m.body).slice(0, 40);
  $('facts').dataset.mid = m.message_id;
  const rows = await client.messageStatus(m.message_id).catch((e) => { report(e); return []; });
  const yes = (v) => (v == null ? '—' : v ? 'yes' : 'no');
  $('facts-rows').replaceChildren(...rows.map((r) => el('tr', { 'data-user': r.user_id },
    el('td', {}, String(r.user_id)), el('td', { class: 'accepted' }, yes(r.accepted)),
    el('td', { class: 'in-scope' }, yes(r.in_sync_scope)), el('td', { class: 'synced' }, yes(r.any_device_synced)),
    el('td', { class: 'read' }, yes(r.user_read)))));
  $('facts').dataset.loaded = String(Date.now());
}

function showStatus(state, detail) {
  $('status').dataset.state = state;
  const words = { needs_token: 'the token was refused: paste a new one', revoked: 'this device was revoked',
                  superseded: 'this device connected elsewhere', not_a_token: 'that is not a device token' };
  $('status').textContent = words[state] || state + (detail && typeof detail === 'string' ? `: ${detail}` : '');
  if (['needs_token', 'not_a_token', 'wrong_account'].includes(state)) $('token-form').hidden = false;
}

let release = () => {};

async function start(token, claims) {
  const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/`;
  const db = dbName(claims);
  release = await holdLock(db);
  await adoptTokenDatabase(token, db, claims).catch(report);
  let welcomed = false;
  const c = new ImSyncClient({
    url, token, storage: new IndexedDBStorage(db),
    onChange: () => { if (c === client) render(); },
    onStatus: ({ state, detail }) => {
      if (c !== client) return;
      showStatus(state, detail);
      if (state !== 'online' || welcomed) return;
      welcomed = true;
      // the welcome is the server's word on who this is; the database was
      // chosen by the token's unverified claims
      if (c.userId !== claims.userId || c.deviceId !== claims.deviceId) {
        c.stop().finally(() => showStatus('error', 'the token names another user or device than the server'));
        return;
      }
      forgetOtherDatabases(db)
        .then(() => { $('status').dataset.cleanup = 'done'; }, report);
    },
  });
  client = c;
  store = db;
  delete $('status').dataset.cleanup;
  c.start().then(render).catch(report);
  render();
}

async function stopClient() {
  if (!client) return;
  const c = client;
  client = null;
  await c.stop().catch(() => {});
  release();
  release = () => {};
}

// A token from the form or the fragment: the same device goes on with it;
// another user or device gets a client (and database) of its own.
let switching = Promise.resolve();
function useToken(token) {
  switching = switching.then(async () => {
    const claims = deviceTokenClaims(token);
    if (!claims || claims.userId == null) { showStatus('not_a_token'); return; }
    if (client && store === dbName(claims) && client.state !== 'wrong_account') { client.setToken(token); return; }
    await stopClient();
    selected = null;
    $('conversation').hidden = true;
    await start(token, claims);
  }).catch(report);
}

// Takes the token out of the fragment and out of this history entry.
function tokenFromFragment() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  if (!fragment.has('token')) return null;
  const token = fragment.get('token');
  fragment.delete('token');
  const rest = fragment.toString();
  history.replaceState(history.state, '', location.pathname + location.search + (rest ? `#${rest}` : ''));
  return token;
}

$('composer').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const text = $('text').value;
  if (!client || !text || selected == null) return;
  $('text').value = '';
  const opts = replyTo != null ? { replyTo } : {};
  replyTo = null;
  $('reply-to').hidden = true;
  client.send(selected, { text }, opts).catch(report);
  render();
});
$('reply-cancel').addEventListener('click', () => { replyTo = null; $('reply-to').hidden = true; });
$('mark-read').addEventListener('click', () => {
  if (!client) return;
  const c = client.conversations().find((x) => x.conversation_id === selected);
  if (c) client.read(selected, c.last_msg_seq).catch(report);
});
$('offline').addEventListener('change', (ev) => client && client.setOffline(ev.target.checked));
$('token-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const token = $('token').value.trim();
  $('token').value = '';
  if (!token) return;
  $('token-form').hidden = true;
  useToken(token);
});
// a link with a token opened on this page already (no reload)
window.addEventListener('hashchange', () => {
  const token = tokenFromFragment();
  if (token) useToken(token);
});

const first = tokenFromFragment();
if (first) useToken(first);
else $('token-form').hidden = false;
