// Type declarations of im_sync_client.js, the im_sync reference client
// (contract §16, §20).  Ids are JSON numbers (the server keeps them below 2^53).

/** The states reported through onStatus (contract §20), and the few the
 * client adds: `superseded` (a newer connection of this device, close 4008),
 * `wrong_account` (the storage belongs to another user or device), `error`
 * (a refusal that a retry cannot fix) and `stopped` (after stop()). */
export type ClientState =
  | 'connecting' | 'syncing' | 'ready' | 'offline' | 'reconnecting'
  | 'revoked' | 'suspended' | 'needs_token'
  | 'superseded' | 'wrong_account' | 'error' | 'stopped';

export interface Status { state: ClientState; detail: unknown; }

/** A key/value store whose commit applies clears, then deletes, then puts,
 * all or nothing. */
export interface StorageChange {
  puts?: Array<[string, unknown]>;
  deletes?: string[];
  clear?: string[];
}
export interface Storage {
  load(): Promise<Array<[string, unknown]>>;
  commit(change: StorageChange): Promise<void>;
  close(): Promise<void>;
}
export class MemoryStorage implements Storage {
  constructor();
  load(): Promise<Array<[string, unknown]>>;
  commit(change: StorageChange): Promise<void>;
  close(): Promise<void>;
}
/** Node only: snapshot.json + journal.log in a directory. */
export class FileStorage implements Storage {
  constructor(dir: string, options?: { compactBytes?: number });
  load(): Promise<Array<[string, unknown]>>;
  commit(change: StorageChange): Promise<void>;
  close(): Promise<void>;
}
/** Browsers only. */
export class IndexedDBStorage implements Storage {
  constructor(name?: string);
  load(): Promise<Array<[string, unknown]>>;
  commit(change: StorageChange): Promise<void>;
  close(): Promise<void>;
  static wipe(name?: string): Promise<void>;
}

export class ImSyncError extends Error {
  constructor(code: string, message: string, frame?: object | null);
  /** BAD_FRAME, INVALID_ARGUMENT, FORBIDDEN, NOT_FOUND, CONFLICT,
   * RATE_LIMITED, UNAVAILABLE, INTERNAL, DISCONNECTED, STOPPED, … */
  readonly code: string;
  readonly frame: object | null;
  readonly retryAfterMs: number | null;
  /** FORBIDDEN's `reason` (contract §17): `suspended` or `muted`; null otherwise. */
  readonly reason: string | null;
}

/** The user and device a device token names (not verified), or null. */
export function deviceTokenClaims(token: unknown): { userId: number | null; deviceId: string } | null;

/** What the client needs of a WebSocket: the browser's, or the ws package's. */
export interface WebSocketLike {
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: any) => void) | null;
  onmessage: ((ev: { data: any }) => void) | null;
  onerror: ((ev: any) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
}
export type WebSocketConstructor = new (url: string, protocol?: string | string[]) => WebSocketLike;

/** Where 'online' and 'visibilitychange' come from (window and document in a browser). */
export interface EventSource {
  addEventListener(type: string, listener: () => void): void;
  removeEventListener(type: string, listener: () => void): void;
}
export interface VisibilitySource extends EventSource { readonly visibilityState?: string; }

export interface ClientOptions {
  url: string;
  token?: string;
  storage?: Storage;
  /** Required where there is no global WebSocket. */
  WebSocket?: WebSocketConstructor;
  onChange?: (client: ImSyncClient) => void;
  onStatus?: (status: Status) => void;
  /** Events per sync page (500). */
  pageLimit?: number;
  /** A sync this often while ready, for lost hints (30000; 0: never). */
  pollMs?: number;
  /** Positions loaded when a conversation is opened, and per loadOlder() (50). */
  historyPage?: number;
  /** How long loadOlder() waits for a cold range (30000). */
  historyTimeoutMs?: number;
  /** The globals in a browser; null: none. */
  window?: EventSource | null;
  document?: VisibilitySource | null;
  /** For tests. */
  hooks?: { beforeAck?: (batch: { status: string; high_watermark: number; events: number }) => unknown;
            dropHints?: boolean; backoffMs?: number };
}

export interface Conversation {
  conversation_id: number;
  kind: 'direct' | 'group' | string | null;
  mode: 'fanout' | 'shared_log' | string;
  last_msg_seq: number;
  read_msg_seq: number;
  unread: number;
  dirty: boolean;
  /** The conversation's pinned-message ids. */
  pinned: number[];
  left: boolean;
  /** The user's pin of the conversation (pinConversation). */
  conversation_pinned: boolean;
  last_activity_at: string | null;
  /** Older positions not local yet (loadOlder() loads them). */
  has_older: boolean;
  /** The user's role in a group (contract §17); null in a direct conversation. */
  my_role: 'owner' | 'admin' | 'member' | null;
  /** The end of the user's mute in this conversation (ISO 8601), or null. */
  muted_until: string | null;
}

export interface Position {
  kind: 'message' | 'create' | 'join' | 'leave' | 'recall' | 'edit' | 'mode' | 'reaction' | 'pin' | 'takedown' | 'role' | 'mute' | string;
  conversation_id: number;
  msg_seq: number;
  message_id: number | null;
  sender_id: number | null;
  content_type: string | null;
  body: any;
  target_message_id: number | null;
  recalled: boolean;
  /** Taken down by a moderator (contract §17): a tombstone, body null, recalled false. */
  taken_down: boolean;
  /** Erased (contract §18): a tombstone, body null. */
  erased: boolean;
  created_at: string;
  /** Messages only. */
  reply_to_message_id?: number | null;
  edited?: boolean;
  reactions?: Record<string, number>;
  my_reactions?: string[];
  /** The user's own messages only: receipts. */
  delivered?: boolean;
  read?: boolean;
  /** Groups only. */
  delivered_count?: number;
  read_count?: number;
  member_count?: number | null;
}

export interface SendResult { message_id: number; msg_seq: number; created: boolean; [column: string]: unknown; }
export interface MessageFacts { user_id: number; accepted: boolean; in_sync_scope: boolean; any_device_synced: boolean; user_read: boolean; }
export type HistoryResult =
  | { status: 'OK'; loaded: number; hasOlder: boolean }
  | { status: 'PREPARING'; restoreTaskId: number | null; loaded: number; hasOlder: true };

export class ImSyncClient {
  constructor(options: ClientOptions);
  readonly state: ClientState | string;
  readonly userId: number | null;
  readonly deviceId: string | null;
  readonly stats: { snapshots: number; recoveries: number; batches: number; events: number;
                    reconnects: number; refusedHellos: number; wakeups: number };
  start(): Promise<void>;
  stop(): Promise<void>;
  setOffline(offline: boolean): void;
  setToken(token: string): void;
  send(conversationId: number, body: object, options?: { contentType?: string | null; replyTo?: number | null; clientMsgId?: string | null }): Promise<SendResult>;
  read(conversationId: number, msgSeq: number): Promise<{ [column: string]: unknown }>;
  recall(conversationId: number, messageId: number): Promise<{ [column: string]: unknown }>;
  edit(conversationId: number, messageId: number, body: object): Promise<{ [column: string]: unknown }>;
  react(conversationId: number, messageId: number, key: string, present: boolean): Promise<{ [column: string]: unknown }>;
  pin(conversationId: number, messageId: number, pinned: boolean): Promise<{ [column: string]: unknown }>;
  pinConversation(conversationId: number, pinned: boolean): Promise<{ conversation_pinned: boolean; [column: string]: unknown }>;
  /** Roles, mutes, removals in a group (contract §17); the actor is the session's user. A muted member's writes reject with code FORBIDDEN, reason "muted". */
  setRole(conversationId: number, userId: number, role: 'owner' | 'admin' | 'member'): Promise<SendResult>;
  muteMember(conversationId: number, userId: number, until: Date | string | null): Promise<SendResult>;
  removeMember(conversationId: number, userId: number, options?: { ban?: boolean }): Promise<SendResult>;
  messageStatus(messageId: number): Promise<MessageFacts[]>;
  /** Read receipts on or off for this user (contract §20); resolves with the setting now. */
  setReadReceipts(enabled: boolean): Promise<boolean>;
  deleteForMe(conversationId: number, messageId: number): Promise<boolean>;
  open(conversationId: number): Promise<HistoryResult>;
  loadOlder(conversationId: number): Promise<HistoryResult>;
  conversations(): Conversation[];
  messages(conversationId: number): Position[];
  outboxItems(): Array<{ type: string; conversation_id: number; client_msg_id: string; [field: string]: unknown }>;
}
