// The web page of contract §16 and §20 on the reference client.  Every body
// and name is put into the page with textContent, never as HTML, so a
// message cannot add markup or run code (the CSP forbids inline script as
// well).  Newer parts of the client (receipts, conversation pins, loadOlder,
// the state 'ready') are used where the client has them.
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
    else if (k.startsWith('data-') || k.startsWith('aria-') || k === 'role') e.setAttribute(k, String(v));
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
  // contract §17: a muted member's write is FORBIDDEN with reason "muted"
  const muted = err && err.code === 'FORBIDDEN' && err.frame && err.frame.reason === 'muted';
  $('status').textContent = muted ? 'you are muted in this conversation: you can read but not write'
    : `error: ${err.message}`;
}

// ---- what a person reads: names, times, ticks, sentences
const pad2 = (n) => String(n).padStart(2, '0');
const isReady = (state) => state === 'ready' || state === 'online';   // 'online' before contract §20
const whoIs = (id) => (id == null ? 'someone' : client && id === client.userId ? 'you' : `user ${id}`);
const listWords = (words) => (words.length < 2 ? words.join('')
  : `${words.slice(0, -1).join(', ')} and ${words[words.length - 1]}`);
const timeOf = (iso) => { const d = new Date(iso); return Number.isNaN(d.getTime()) ? null : d; };
const hhmm = (d) => `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
const dayKey = (d) => `${d.getFullYear()}-${d.getMonth()}-${d.getDate()}`;
function dayLabel(d) {
  const today = new Date();
  const yesterday = new Date(today.getFullYear(), today.getMonth(), today.getDate() - 1);
  if (dayKey(d) === dayKey(today)) return 'today';
  if (dayKey(d) === dayKey(yesterday)) return 'yesterday';
  return d.toLocaleDateString(undefined, { weekday: 'short', year: 'numeric', month: 'short', day: 'numeric' });
}

// Reaction keys and the words shown for them: a key is any string (other
// clients may send emoji), but the page never needs an emoji font to say
// what a reaction is or to offer one.
const REACTIONS = [['👍', 'like'], ['❤️', 'love'], ['😂', 'laugh']];
const reactionWord = (key) => (REACTIONS.find(([k]) => k === key) || [null, key])[1];

// The sentence of a system event, or null for kinds that only change
// another line (recall, edit, reaction, pin, takedown).
function sentence(m) {
  const b = m.body || {};
  switch (m.kind) {
    case 'create': {
      const members = Array.isArray(m.body) ? m.body : [];
      if (m.sender_id != null) {
        const others = members.filter((u) => u !== m.sender_id).map(whoIs);
        return `${whoIs(m.sender_id)} created this conversation${others.length ? ` with ${listWords(others)}` : ''}`;
      }
      // the create event names the members, not who created it
      return `this conversation was created with ${listWords(members.map(whoIs))}`;
    }
    case 'join': return `${whoIs(b.user_id)} joined`;
    case 'leave':
      if (b.removed_by != null) return `${whoIs(b.user_id)} was removed by ${whoIs(b.removed_by)}${b.banned ? ' and banned' : ''}`;
      return `${whoIs(b.user_id)} left`;
    case 'mode': return `the conversation switched to ${String(b.mode || '').replace(/_/g, ' ')} mode`;
    case 'role': return m.sender_id != null ? `${whoIs(m.sender_id)} made ${whoIs(b.user_id)} ${b.role}` : `${whoIs(b.user_id)} is now ${b.role}`;
    case 'mute': {
      const until = b.muted_until && timeOf(b.muted_until);
      return until && until > new Date() ? `${whoIs(b.user_id)} was muted until ${dayLabel(until)} ${hhmm(until)}` : `${whoIs(b.user_id)} was unmuted`;
    }
    default: return null;
  }
}

// What a sender's message has reached: 'sent' (the server has it),
// 'delivered' (on a device of every recipient), 'read' (every recipient
// read it).  Receipts of contract §20 when the client offers them (live);
// otherwise the four facts fetched on demand (message_status), kept in
// `facts` until the next fetch.
const facts = new Map();   // message_id -> message_status rows
function liveTick(m, conv) {
  // shared_log groups have no receipts (contract §20): on demand there
  if (conv && conv.mode === 'shared_log') return null;
  if (typeof m.status === 'string' && ['sent', 'delivered', 'read'].includes(m.status)) return m.status;
  const r = m.receipt || m.receipts;
  if (r && typeof r === 'object') {
    if ('read_count' in r || 'delivered_count' in r) {
      const others = Math.max(1, (r.member_count || 2) - 1);
      return (r.read_count || 0) >= others ? 'read' : (r.delivered_count || 0) >= others ? 'delivered' : 'sent';
    }
    if ('read' in r || 'delivered' in r) return r.read ? 'read' : r.delivered ? 'delivered' : 'sent';
  }
  // the client's view: delivered / read (in a group: by at least one member)
  if ('read' in m || 'delivered' in m) return m.read ? 'read' : m.delivered ? 'delivered' : 'sent';
  if (conv && ('read_through_seq' in conv || 'delivered_through_seq' in conv)) {
    if ((conv.read_through_seq || 0) >= m.msg_seq) return 'read';
    if ((conv.delivered_through_seq || 0) >= m.msg_seq) return 'delivered';
    return 'sent';
  }
  return null;
}
function factsTick(m) {
  const rows = facts.get(m.message_id);
  if (!rows || !rows.length) return { state: 'sent', detail: '' };
  const synced = rows.filter((r) => r.any_device_synced).length;
  const read = rows.filter((r) => r.user_read).length;
  const detail = rows.length > 1 ? ` (delivered to ${synced} of ${rows.length}, read by ${read})` : '';
  return { state: read === rows.length ? 'read' : synced === rows.length ? 'delivered' : 'sent', detail };
}
function ticks(state, detail = '') {
  const n = state === 'sent' ? 1 : state === 'queued' ? 0 : 2;
  const t = el('span', { class: 'ticks', 'data-tick': state, title: state + detail });
  for (let i = 0; i < n; i++) t.append(el('span', { class: 'tick', 'aria-hidden': 'true' }));
  // the word for people and screen readers; ticks are drawn by CSS, not a font
  t.append(el('span', { class: state === 'queued' ? 'tick-word' : 'tick-word sr-only' }, state));
  return t;
}

// The list reads only what is local: a client with lazy history (contract
// §20) loads a conversation's history when messages() is first called for
// it, so the list asks only for conversations with all history local
// (has_older false) or opened on this page.
const opened = new Set();
const localMessages = (c) => (!c.has_older || opened.has(c.conversation_id) ? client.messages(c.conversation_id) : []);

// Conversation names from what the local view knows: the create event's
// members when it is loaded.
function conversationName(c) {
  const create = localMessages(c).find((m) => m.kind === 'create');
  const others = create && Array.isArray(create.body) ? create.body.filter((u) => u !== client.userId) : [];
  if (c.kind === 'direct' && others.length === 1) return whoIs(others[0]);
  if (others.length) return `group ${c.conversation_id}: you, ${listWords(others.map(whoIs))}`;
  return `${c.kind || 'conversation'} ${c.conversation_id}`;
}
function lastMessage(c) {
  const msgs = localMessages(c);
  for (let i = msgs.length - 1; i >= 0; i--) if (msgs[i].kind === 'message') return msgs[i];
  return null;
}
// Recent order, pinned ones on top: the client's recent order and pins
// (contract §20) when it has them; before that, the last message of the
// local view.  Pinned keep the client's order among themselves; the rest
// newest first, ties by id.
function orderedConversations() {
  const list = client.conversations().map((c, i) => {
    const last = lastMessage(c);
    const at = timeOf(c.last_activity_at || (last && last.created_at));
    return { c, i, last, at: at ? at.getTime() : 0, pinned: !!c.conversation_pinned };
  });
  return list.sort((a, b) => (a.pinned !== b.pinned ? (a.pinned ? -1 : 1)
    : a.pinned ? a.i - b.i : b.at - a.at || a.c.conversation_id - b.c.conversation_id));
}

function conversationItem({ c, last, at }) {
  const name = conversationName(c);
  const line = el('div', { class: 'conv-line' },
    el('span', { class: 'conv-name' }, name + (c.mode === 'shared_log' ? ' (large)' : '') + (c.left || c.left_conversation ? ' (left)' : '')),
    el('span', { class: 'unread', 'data-unread': c.unread }, c.unread ? String(c.unread) : ''));
  const preview = el('div', { class: 'conv-preview' });
  if (last) {
    preview.append(el('span', { class: 'conv-text' },
      `${whoIs(last.sender_id)}: ${isGone(last) ? tombText(last) : bodyText(last.body)}`.slice(0, 60)));
  }
  if (at) preview.append(el('span', { class: 'conv-time' }, dayKey(new Date(at)) === dayKey(new Date()) ? hhmm(new Date(at)) : dayLabel(new Date(at))));
  const li = el('li', { 'data-conv': c.conversation_id, 'data-pinned': String(!!c.conversation_pinned),
                        class: c.conversation_id === selected ? 'selected' : '', onclick: () => select(c.conversation_id) },
  line, preview);
  if (c.conversation_pinned) line.prepend(el('span', { class: 'conv-pinned' }, 'pinned'));
  if (typeof client.pinConversation === 'function') {
    li.append(el('button', { type: 'button', class: 'conv-pin-btn', onclick: (ev) => {
      ev.stopPropagation();
      client.pinConversation(c.conversation_id, !c.conversation_pinned).catch(report);
    } }, c.conversation_pinned ? 'unpin' : 'pin'));
  }
  return li;
}

// The actions of one message, in a menu opened by its "..." button.
function messageMenu(m, mine, conv) {
  const item = (cls, label, fn) => el('button', { type: 'button', class: cls, role: 'menuitem',
    onclick: (ev) => { ev.stopPropagation(); menuFor = null; fn(); render(); } }, label);
  const menu = el('div', { class: 'menu', role: 'menu' });
  menu.append(item('reply-btn', 'Reply', () => startReply(m)));
  for (const [key, word] of REACTIONS) {
    const on = m.my_reactions.includes(key);
    menu.append(item(`react-btn react-${word}${on ? ' on' : ''}`, on ? `Remove ${word}` : `React: ${word}`,
      () => client.react(selected, m.message_id, key, !on).catch(report)));
  }
  const pinned = conv && conv.pinned.includes(m.message_id);
  menu.append(item('pin-btn', pinned ? 'Unpin' : 'Pin', () => client.pin(selected, m.message_id, !pinned).catch(report)));
  if (mine) {
    menu.append(item('edit-btn', 'Edit', () => startEdit(m)));
    menu.append(item('recall-btn', 'Recall', () => client.recall(selected, m.message_id).catch(report)));
    menu.append(item('facts-btn', 'Status', () => showFacts(m)));
  }
  // an owner or admin acts on the sender (contract §17); the server decides
  // who may act on whom (42501 otherwise, shown in the status line)
  const role = conv && conv.kind === 'group' ? conv.my_role : null;
  if (!mine && m.sender_id != null && (role === 'owner' || role === 'admin')) {
    const who = m.sender_id;
    menu.append(item('mute-btn', 'Mute sender for 1 hour',
      () => client.muteMember(selected, who, new Date(Date.now() + 3600e3)).catch(report)));
    menu.append(item('unmute-btn', 'Unmute sender', () => client.muteMember(selected, who, null).catch(report)));
    if (role === 'owner') {
      menu.append(item('admin-btn', 'Make sender an admin', () => client.setRole(selected, who, 'admin').catch(report)));
      menu.append(item('member-btn', 'Make sender a member', () => client.setRole(selected, who, 'member').catch(report)));
    }
    menu.append(item('remove-btn', 'Remove sender from the group',
      () => client.removeMember(selected, who).catch(report)));
  }
  return menu;
}

// a tombstone: recalled by its sender, removed by a moderator (contract
// §17) or erased (§18); what the line shows instead of the body
function isGone(m) { return !!(m.recalled || m.taken_down || m.erased); }
function tombText(m) {
  return m.taken_down ? 'removed by a moderator' : m.erased ? 'message erased' : 'message recalled';
}

function messageItem(m, conv, byId, live) {
  const mine = m.sender_id === client.userId;
  const gone = isGone(m);
  const li = el('li', { class: `message${mine ? ' mine' : ''}${gone ? ' tombstone' : ''}${shown === m.message_id ? ' flash' : ''}`, id: `m-${m.message_id}`,
                        'data-seq': m.msg_seq, 'data-mid': m.message_id });
  const at = timeOf(m.created_at);
  const head = el('div', { class: 'head' }, el('span', { class: 'sender' }, whoIs(m.sender_id)));
  if (at) head.append(el('time', { class: 'time', dateTime: m.created_at, title: at.toLocaleString() }, hhmm(at)));
  li.append(head);
  if (m.reply_to_message_id != null && !gone) {
    const t = byId.get(m.reply_to_message_id);
    const quote = t ? `${whoIs(t.sender_id)}: ${isGone(t) ? tombText(t) : bodyText(t.body)}` : 'an earlier message';
    li.append(el('button', { type: 'button', class: 'reply', 'data-target': m.reply_to_message_id,
      title: 'show the message this replies to', onclick: () => showMessage(m.reply_to_message_id) },
    `reply to ${quote.length > 40 ? `${quote.slice(0, 40)}...` : quote}`));
  }
  const tomb = tombText(m);
  li.append(el('span', { class: 'body' }, gone ? tomb : bodyText(m.body)));
  if (m.edited && !gone) li.append(el('span', { class: 'edited' }, 'edited'));
  if (mine && !gone) {
    const state = live ? liveTick(m, conv) : null;
    const counts = m.delivered_count != null && m.member_count != null
      ? ` (delivered to ${m.delivered_count} of ${m.member_count}, read by ${m.read_count || 0})` : '';
    const t = state ? { state, detail: counts } : factsTick(m);
    li.append(ticks(t.state, t.detail));
  }
  const counts = Object.entries(m.reactions || {}).filter(([, n]) => n > 0);
  if (counts.length && !gone) {
    li.append(el('div', { class: 'reactions' }, ...counts.map(([k, n]) => {
      const on = m.my_reactions.includes(k);
      return el('button', { type: 'button', class: `reaction${on ? ' on' : ''}`, 'data-key': k, 'data-count': n,
        title: on ? 'you reacted: click to take it back' : 'react too',
        onclick: () => client.react(selected, m.message_id, k, !on).catch(report) }, `${reactionWord(k)} ${n}`);
    })));
  }
  if (!gone) {
    li.append(el('button', { type: 'button', class: 'more', 'aria-label': 'More actions', 'aria-haspopup': 'menu',
      'aria-expanded': String(menuFor === m.message_id), title: 'More actions',
      onclick: (ev) => { ev.stopPropagation(); menuFor = menuFor === m.message_id ? null : m.message_id; render(); } }, '...'));
    if (menuFor === m.message_id) li.append(messageMenu(m, mine, conv));
  }
  return li;
}

let menuFor = null;      // the message whose menu is open
let editing = null;      // the message being edited in the composer
const older = { busy: false, done: new Set(), preparing: null };

function render() {
  if (!client) return;
  // observable page state for tests and people: never the token
  $('status').dataset.store = store;
  $('status').dataset.snapshots = String(client.stats.snapshots);
  $('who').textContent = client.userId != null ? `signed in as user ${client.userId}` : '';
  const pending = client.outboxItems().length;
  $('pending').textContent = pending ? `${pending} queued` : '';
  $('conversations').replaceChildren(...orderedConversations().map(conversationItem));
  if (selected == null) return;
  const conv = client.conversations().find((c) => c.conversation_id === selected);
  $('conversation').hidden = false;
  $('conversation-title').textContent = conv ? conversationName(conv) : `conversation ${selected}`;
  // the user's standing here (contract §17): a role in a group, a mute
  const role = conv && conv.kind === 'group' ? conv.my_role : null;
  $('my-role').textContent = role === 'owner' ? 'you are the owner' : role === 'admin' ? 'you are an admin' : '';
  $('my-role').dataset.role = role || '';
  const mutedUntil = conv && conv.muted_until ? timeOf(conv.muted_until) : null;
  const muted = !!mutedUntil && mutedUntil > new Date();
  $('muted').hidden = !muted;
  $('muted').textContent = muted ? `you are muted until ${dayLabel(mutedUntil)} ${hhmm(mutedUntil)}: you can read but not write` : '';
  $('send').disabled = muted;
  const msgs = client.messages(selected);
  const byId = new Map(msgs.filter((m) => m.kind === 'message').map((m) => [m.message_id, m]));
  $('pinned').replaceChildren(...(conv && conv.pinned.length
    ? [el('span', { class: 'label' }, 'pinned:'), ...conv.pinned.map((id) => el('button', { type: 'button', class: 'pinned-msg',
      'data-target': id, onclick: () => showMessage(id) }, byId.get(id) ? bodyText(byId.get(id).body).slice(0, 40) : `message ${id}`))]
    : []));
  const me = client.userId;
  const live = msgs.some((m) => m.kind === 'message' && m.sender_id === me && liveTick(m, conv) != null);
  const box = $('messages');
  box.dataset.receipts = live ? 'live' : 'on-demand';
  $('refresh-ticks').hidden = live;
  const items = [];
  const first = msgs[0];
  const hasOlder = conv && 'has_older' in conv ? conv.has_older : first && first.msg_seq > 1;
  if (typeof client.loadOlder === 'function' && hasOlder && !older.done.has(selected)) {
    items.push(el('li', { class: 'older' }, el('button', { type: 'button', class: 'older-btn', onclick: loadOlder },
      older.busy ? 'loading older messages...' : 'load older messages'),
    older.preparing === selected ? el('div', { class: 'notice' }, 'older history is being prepared: try again in a moment') : ''));
  }
  let day = null;
  const dated = (m) => {
    const d = timeOf(m.created_at);
    if (d && dayKey(d) !== day) { day = dayKey(d); items.push(el('li', { class: 'day' }, dayLabel(d))); }
  };
  for (const m of msgs) {
    if (m.kind === 'message') { dated(m); items.push(messageItem(m, conv, byId, live)); continue; }
    const s = sentence(m);
    if (s) { dated(m); items.push(el('li', { class: `control ${m.kind}`, 'data-seq': m.msg_seq }, s)); }
  }
  for (const o of client.outboxItems()) {
    if (o.type === 'send' && o.conversation_id === selected) {
      items.push(el('li', { class: 'message mine queued' },
        el('div', { class: 'head' }, el('span', { class: 'sender' }, 'you')),
        el('span', { class: 'body' }, bodyText(o.body)), ticks('queued')));
    }
  }
  // keep the reader's place: at the bottom stays at the bottom, older
  // messages put above do not move what is on screen
  const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 30;
  const firstSeq = box.dataset.firstSeq ? Number(box.dataset.firstSeq) : null;
  const oldHeight = box.scrollHeight; const oldTop = box.scrollTop;
  box.replaceChildren(...items);
  box.dataset.firstSeq = first ? String(first.msg_seq) : '';
  if (box.dataset.conv !== String(selected) || atBottom) box.scrollTop = box.scrollHeight;
  else if (first && firstSeq != null && first.msg_seq < firstSeq) box.scrollTop = oldTop + box.scrollHeight - oldHeight;
  box.dataset.conv = String(selected);
}

// Older history: the client pages back (contract §20 loadOlder) when asked
// by scrolling to the top or by the button.
function loadOlder() {
  if (!client || typeof client.loadOlder !== 'function' || older.busy || selected == null || older.done.has(selected)) return;
  const id = selected;
  const before = client.messages(id).length;
  older.busy = true;
  render();
  Promise.resolve(client.loadOlder(id)).then((r) => {
    // a cold range: the client waited for history_ready and gave up (PREPARING)
    older.preparing = r && r.status === 'PREPARING' ? id : null;
    if (older.preparing) return;
    if (r === false || r === 0 || (r && (r.has_more === false || r.hasOlder === false)) || client.messages(id).length === before) older.done.add(id);
  }, report).finally(() => { older.busy = false; render(); });
}

// A reply's quote and a pinned message lead to their target: it is
// scrolled to and marked until another is shown or the conversation changes.
let shown = null;
function showMessage(messageId) {
  shown = messageId;
  render();
  const target = document.getElementById(`m-${messageId}`);
  if (target) target.scrollIntoView({ block: 'center' });
}

function select(conversationId) {
  selected = conversationId;
  menuFor = null;
  shown = null;
  $('facts').hidden = true;
  opened.add(conversationId);
  // a client with lazy history loads a conversation's last page when it is opened
  if (client && typeof client.loadOlder === 'function' && typeof client.open === 'function') {
    Promise.resolve(client.open(conversationId)).catch(report);
  }
  render();
}

function startReply(m) {
  stopEdit();
  replyTo = m.message_id;
  $('reply-to').hidden = false;
  $('reply-to-text').textContent = `${whoIs(m.sender_id)}: ${bodyText(m.body).slice(0, 40)}`;
  $('text').focus();
}

function startEdit(m) {
  replyTo = null;
  $('reply-to').hidden = true;
  editing = m.message_id;
  $('editing').hidden = false;
  $('text').value = bodyText(m.body);
  $('send').textContent = 'Save';
  $('text').focus();
}
function stopEdit() {
  editing = null;
  $('editing').hidden = true;
  $('send').textContent = 'Send';
}

async function showFacts(m) {
  $('facts').hidden = false;
  $('facts-of').textContent = bodyText(m.body).slice(0, 40);
  $('facts').dataset.mid = m.message_id;
  const rows = await client.messageStatus(m.message_id).catch((e) => { report(e); return null; });
  if (!rows) return;
  facts.set(m.message_id, rows);
  const yes = (v) => (v == null ? '-' : v ? 'yes' : 'no');
  $('facts-rows').replaceChildren(...rows.map((r) => el('tr', { 'data-user': r.user_id },
    el('td', {}, whoIs(r.user_id)), el('td', { class: 'accepted' }, yes(r.accepted)),
    el('td', { class: 'in-scope' }, yes(r.in_sync_scope)), el('td', { class: 'synced' }, yes(r.any_device_synced)),
    el('td', { class: 'read' }, yes(r.user_read)))));
  $('facts').dataset.loaded = String(Date.now());
  render();
}

// Without live receipts: the ticks of this user's last messages in the open
// conversation from message_status, when the person asks.
let refreshing = false;
async function refreshTicks() {
  if (!client || selected == null || refreshing) return;
  refreshing = true;
  try { await refreshTicksOnce(); } finally { refreshing = false; }
}
async function refreshTicksOnce() {
  const mine = client.messages(selected).filter((m) => m.kind === 'message' && m.sender_id === client.userId && !m.recalled).slice(-20);
  for (const m of mine) {
    const rows = await client.messageStatus(m.message_id).catch((e) => { report(e); return null; });
    if (rows) facts.set(m.message_id, rows);
  }
  $('refresh-ticks').dataset.refreshed = String(Number($('refresh-ticks').dataset.refreshed || 0) + 1);
  render();
}

function showStatus(state, detail) {
  $('status').dataset.state = state;
  const words = { needs_token: 'the token was refused: paste a new one', revoked: 'this device was revoked',
                  superseded: 'this device connected elsewhere', not_a_token: 'that is not a device token',
                  suspended: 'this account is suspended: it cannot sign in until a moderator reinstates it' };
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
      if (!isReady(state) || welcomed) return;
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
    opened.clear();
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
  if (editing != null) {
    const id = editing;
    stopEdit();
    client.edit(selected, id, { text }).catch(report);
    return;
  }
  const opts = replyTo != null ? { replyTo } : {};
  replyTo = null;
  $('reply-to').hidden = true;
  client.send(selected, { text }, opts).catch(report);
  render();
});
$('edit-cancel').addEventListener('click', () => { stopEdit(); $('text').value = ''; });
$('refresh-ticks').addEventListener('click', () => { refreshTicks().catch(report); });
$('messages').addEventListener('scroll', () => { if ($('messages').scrollTop < 40) loadOlder(); });
// a click outside an open message menu, or Escape, closes it
document.addEventListener('keydown', (ev) => {
  if (ev.key === 'Escape' && menuFor != null) { menuFor = null; render(); }
});
document.addEventListener('click', (ev) => {
  if (menuFor != null && !ev.target.closest('.menu')) { menuFor = null; render(); }
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
