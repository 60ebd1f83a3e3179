// The web page of contract §16 on the reference client.  Every body and
// name is put into the page with textContent, never as HTML, so a message
// cannot add markup or run code (the CSP forbids inline script as well).
import { ImSyncClient, IndexedDBStorage } from './im_sync_client.js';

const $ = (id) => document.getElementById(id);
let client = null;
let selected = null;
let replyTo = null;

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

async function storeName(token) {
  const d = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(token));
  return 'im_sync_' + Array.from(new Uint8Array(d).slice(0, 8), (b) => b.toString(16).padStart(2, '0')).join('');
}

function report(err) {
  $('status').textContent = `error: ${err.message}`;
}

function render() {
  if (!client) return;
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

async function start(token) {
  const url = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/`;
  client = new ImSyncClient({
    url, token, storage: new IndexedDBStorage(await storeName(token)),
    onChange: render,
    onStatus: ({ state, detail }) => {
      $('status').dataset.state = state;
      const words = { needs_token: 'the token was refused: paste a new one', revoked: 'this device was revoked',
                      superseded: 'this device connected elsewhere' };
      $('status').textContent = words[state] || state + (detail && typeof detail === 'string' ? `: ${detail}` : '');
      if (state === 'needs_token') $('token-form').hidden = false;
    },
  });
  window.imClient = client;     // for the browser tests and the console
  client.start().then(render).catch(report);
  render();
}

$('composer').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const text = $('text').value;
  if (!text || selected == null) return;
  $('text').value = '';
  const opts = replyTo != null ? { replyTo } : {};
  replyTo = null;
  $('reply-to').hidden = true;
  client.send(selected, { text }, opts).catch(report);
  render();
});
$('reply-cancel').addEventListener('click', () => { replyTo = null; $('reply-to').hidden = true; });
$('mark-read').addEventListener('click', () => {
  const c = client.conversations().find((x) => x.conversation_id === selected);
  if (c) client.read(selected, c.last_msg_seq).catch(report);
});
$('offline').addEventListener('change', (ev) => client && client.setOffline(ev.target.checked));
$('token-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const token = $('token').value.trim();
  if (!token) return;
  $('token-form').hidden = true;
  if (client) client.setToken(token);
  else start(token);
});

const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get('token')) start(fragment.get('token'));
else $('token-form').hidden = false;
