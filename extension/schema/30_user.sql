-- ---- the user side: logs, read state, devices, recovery, snapshots,
-- history, tokens and the audit trail (user/)

CREATE SEQUENCE im.recovery_session_id_seq;
CREATE SEQUENCE im.snapshot_id_seq;
CREATE SEQUENCE im.audit_id_seq;
SELECT pg_catalog.pg_extension_config_dump('im.recovery_session_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.snapshot_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.audit_id_seq', '');

-- Private events (read_cursor, delete_for_me): recorded by the calling
-- transaction, written into the user's log by fanout alone.
CREATE TABLE im.private_event (
    private_event_id bigint PRIMARY KEY DEFAULT nextval('im.event_id_seq'),
    user_id          bigint NOT NULL,
    conversation_id  bigint NOT NULL REFERENCES im.conversation,
    kind             text   NOT NULL CHECK (kind IN ('read_cursor', 'delete_for_me', 'receipt', 'conversation_pin')),
    read_msg_seq     bigint,
    message_id       bigint REFERENCES im.event,
    created_at       timestamptz NOT NULL DEFAULT now(),
    payload          jsonb,             -- receipt: the event's keys (contract §20)
    conversation_pinned boolean         -- conversation_pin: the pin state it reports
);
-- Retention (maintenance.c) collects private events oldest first.
CREATE INDEX private_event_created_idx ON im.private_event (created_at);
SELECT pg_catalog.pg_extension_config_dump('im.private_event', '');

-- Receipts (contract §20, receipt.c).  ACK and read report each queue one
-- row here when they move (never a row per recipient per message); the
-- producer (the fanout workers' batches, im.run_receipts) drains it.
-- No index: the producer takes every committed row with one DELETE.
CREATE TABLE im.receipt_source (
    user_id         bigint NOT NULL,   -- who ACKed or read
    conversation_id bigint,            -- read: the conversation; ACK: NULL
    from_seq        bigint NOT NULL,   -- ACK: sync_seq range, read: msg_seq range (from, to]
    to_seq          bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
SELECT pg_catalog.pg_extension_config_dump('im.receipt_source', '');

-- One row per (sender, conversation) whose receipt is due: what the sender
-- was last told (direct) or the range of its messages whose counts may
-- have changed (fanout groups), emitted at most once per
-- im_sync.receipt_interval (groups).  Written by the producer only.
CREATE TABLE im.receipt_pending (
    user_id               bigint NOT NULL,   -- the sender told
    conversation_id       bigint NOT NULL,
    delivered_through_seq bigint NOT NULL DEFAULT 0,
    read_through_seq      bigint NOT NULL DEFAULT 0,
    dirty_from_msg_seq    bigint,            -- groups: lowest msg_seq to report again
    dirty_to_msg_seq      bigint,
    dirty                 boolean NOT NULL DEFAULT false,
    emitted_at            timestamptz,
    read_hidden           boolean NOT NULL DEFAULT false,  -- direct, carried: the reader turned read receipts off
    PRIMARY KEY (user_id, conversation_id)
);
-- The producer's due rows.
CREATE INDEX receipt_pending_dirty_idx ON im.receipt_pending (user_id, conversation_id) WHERE dirty;
SELECT pg_catalog.pg_extension_config_dump('im.receipt_pending', '');

-- Receipts across nodes (sharding.md "Receipts"): on the sender's node, per
-- message of a fanout group, each other node's part (the counts of its own
-- members), carried by a transfer and replaced by the next one of that
-- node; the sender's receipt sums the parts and this node's own members.
CREATE TABLE im.receipt_part (
    message_id      bigint NOT NULL,
    node_name       text   NOT NULL,   -- the node whose members the counts are
    sender_id       bigint NOT NULL,
    conversation_id bigint NOT NULL,
    delivered_count bigint NOT NULL CHECK (delivered_count BETWEEN 0 AND member_count),
    read_count      bigint NOT NULL CHECK (read_count BETWEEN 0 AND member_count),
    member_count    bigint NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, node_name)
);
-- Maintenance collects parts a sync window after their last change, oldest first.
CREATE INDEX receipt_part_updated_idx ON im.receipt_part (updated_at);
SELECT pg_catalog.pg_extension_config_dump('im.receipt_part', '');

-- The users who turned read receipts off (absent: on).
CREATE TABLE im.receipt_setting (
    user_id        bigint PRIMARY KEY,
    read_receipts  boolean NOT NULL
);
SELECT pg_catalog.pg_extension_config_dump('im.receipt_setting', '');

-- Per-user sync head: the committed high watermark of the user's log.
-- gc_floor: every sync_seq <= gc_floor has been collected; the log holds
-- (gc_floor, high_watermark].
CREATE TABLE im.user_head (
    user_id         bigint PRIMARY KEY,
    high_watermark  bigint NOT NULL DEFAULT 0 CHECK (high_watermark >= 0),
    gc_floor        bigint NOT NULL DEFAULT 0 CHECK (gc_floor >= 0 AND gc_floor <= high_watermark)
);
SELECT pg_catalog.pg_extension_config_dump('im.user_head', '');

-- Per-user log.  delivery_scope is the membership period for conversation
-- events and 0 for private events (never NULL, so the key is really unique).
CREATE TABLE im.inbox (
    user_id         bigint NOT NULL,
    sync_seq        bigint NOT NULL CHECK (sync_seq >= 1),
    source_event_id bigint NOT NULL,
    delivery_scope  bigint NOT NULL,
    conversation_id bigint NOT NULL,
    msg_seq         bigint,
    kind            text   NOT NULL,
    payload         jsonb,            -- private events: their extra keys
    outbox_id       bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, sync_seq),
    UNIQUE (user_id, source_event_id, delivery_scope)
);
CREATE INDEX inbox_source_idx ON im.inbox (source_event_id);
SELECT pg_catalog.pg_extension_config_dump('im.inbox', '');

-- Per-user conversation state.  Anything that changes a row here holds the
-- user's head lock first (lock order, contract §4).
CREATE TABLE im.user_conversation (
    user_id              bigint NOT NULL,
    conversation_id      bigint NOT NULL REFERENCES im.conversation,
    last_msg_seq         bigint NOT NULL DEFAULT 0,
    read_msg_seq         bigint NOT NULL DEFAULT 0,
    unread_count         bigint NOT NULL DEFAULT 0 CHECK (unread_count >= 0),
    dirty_target_msg_seq bigint NOT NULL DEFAULT 0,
    dirty_version        bigint NOT NULL DEFAULT 0,
    dirty                boolean NOT NULL DEFAULT false,
    version              bigint NOT NULL DEFAULT 0,
    -- recency (contract §20): created_at of the last visible `message`,
    -- '-infinity' for none; moved by fanout with last_msg_seq
    last_activity_at     timestamptz NOT NULL DEFAULT '-infinity',
    -- when the user pinned the conversation, '-infinity' when not pinned
    conversation_pinned_at timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (user_id, conversation_id)
);
-- recent_conversations reads a page of this index backwards: pinned first
-- (latest pin first), then latest activity first, ties by conversation_id
-- ascending (hence its negation); no NULLs, so the keyset row comparison
-- is an index condition.
CREATE INDEX user_conversation_recent_idx ON im.user_conversation
    (user_id, conversation_pinned_at, last_activity_at, (- conversation_id));
SELECT pg_catalog.pg_extension_config_dump('im.user_conversation', '');

CREATE TABLE im.deleted_for_me (
    user_id     bigint NOT NULL,
    message_id  bigint NOT NULL REFERENCES im.event,
    deleted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, message_id)
);
SELECT pg_catalog.pg_extension_config_dump('im.deleted_for_me', '');

-- Devices.  registration bumps on every (re-)registration; tokens bind it, so
-- a revocation kills every earlier token even after re-registration.
CREATE TABLE im.device (
    user_id          bigint NOT NULL,
    device_id        text   NOT NULL CHECK (device_id ~ '^[A-Za-z0-9._-]{1,64}$'),
    state            text   NOT NULL CHECK (state IN ('NEW', 'ACTIVE', 'RECOVERING', 'RESETTING', 'REVOKED')),
    sync_generation  int    NOT NULL DEFAULT 1,
    acked_sync_seq   bigint NOT NULL DEFAULT 0,
    issued_sync_seq  bigint NOT NULL DEFAULT 0,
    connection_epoch bigint NOT NULL DEFAULT 0,
    registration     int    NOT NULL DEFAULT 1,
    registered_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at     timestamptz NOT NULL DEFAULT now(),
    acked_at         timestamptz,
    revoked_at       timestamptz,
    PRIMARY KEY (user_id, device_id)
);
SELECT pg_catalog.pg_extension_config_dump('im.device', '');

-- Recovery sessions (§7.2): at most one ACTIVE per device and generation;
-- an active session's resume_from holds the GC fence (retention lease).
CREATE TABLE im.recovery_session (
    recovery_session_id  bigint PRIMARY KEY DEFAULT nextval('im.recovery_session_id_seq'),
    user_id              bigint NOT NULL,
    device_id            text   NOT NULL,
    sync_generation      int    NOT NULL,
    resume_from          bigint NOT NULL,
    batch_high_watermark bigint NOT NULL,
    state                text   NOT NULL DEFAULT 'ACTIVE' CHECK (state IN ('ACTIVE', 'COMPLETED', 'ENDED', 'EXPIRED')),
    created_at           timestamptz NOT NULL DEFAULT now(),
    expires_at           timestamptz NOT NULL,
    ended_at             timestamptz,
    FOREIGN KEY (user_id, device_id) REFERENCES im.device
);
CREATE UNIQUE INDEX recovery_session_one_active
    ON im.recovery_session (user_id, device_id, sync_generation) WHERE state = 'ACTIVE';
SELECT pg_catalog.pg_extension_config_dump('im.recovery_session', '');

-- Snapshots (§7.5): immutable once written; pages hold the manifest.
CREATE TABLE im.snapshot (
    snapshot_id      bigint PRIMARY KEY DEFAULT nextval('im.snapshot_id_seq'),
    user_id          bigint NOT NULL,
    device_id        text   NOT NULL,
    sync_generation  int    NOT NULL,
    base_sync_seq    bigint NOT NULL,
    page_count       int    NOT NULL,
    manifest_digest  text   NOT NULL,
    state            text   NOT NULL DEFAULT 'READY' CHECK (state IN ('BUILDING', 'READY', 'INSTALLED', 'ABANDONED')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    installed_at     timestamptz,
    FOREIGN KEY (user_id, device_id) REFERENCES im.device
);
CREATE TABLE im.snapshot_page (
    snapshot_id  bigint NOT NULL REFERENCES im.snapshot ON DELETE CASCADE,
    page_no      int    NOT NULL,
    items        jsonb  NOT NULL,
    page_digest  text   NOT NULL,
    PRIMARY KEY (snapshot_id, page_no)
);
SELECT pg_catalog.pg_extension_config_dump('im.snapshot', '');
SELECT pg_catalog.pg_extension_config_dump('im.snapshot_page', '');

-- Signing keys for device, batch and snapshot tokens.  Only the extension
-- owner can read this table (no grants; the API is SECURITY DEFINER).
-- The newest key signs; every key with a secret verifies (contract §8).
--   superseded_at          when a newer key took over signing (NULL: newest);
--   device_tokens_expire   latest expiry of any device token it signed;
--   retired_at             retired: the secret is wiped (NULL), so neither
--                          the live table nor a later pg_dump holds it; the
--                          row stays so key ids are never reused and
--                          retiring it again answers false, not "unknown".
CREATE TABLE im.token_key (
    key_id               int PRIMARY KEY,
    secret               bytea CHECK (octet_length(secret) = 32),
    created_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    superseded_at        timestamptz,
    device_tokens_expire timestamptz,
    retired_at           timestamptz,
    CHECK ((secret IS NULL) = (retired_at IS NOT NULL))
);
SELECT pg_catalog.pg_extension_config_dump('im.token_key', '');

-- Audit trail: registration, token issue, revocation (never a token).
CREATE TABLE im.audit (
    audit_id    bigint PRIMARY KEY DEFAULT nextval('im.audit_id_seq'),
    at          timestamptz NOT NULL DEFAULT now(),
    actor       name NOT NULL DEFAULT session_user,
    action      text NOT NULL,
    user_id     bigint NOT NULL,
    device_id   text,
    detail      jsonb
);
-- Retention (maintenance.c, im_sync.audit_retention) collects oldest first.
CREATE INDEX audit_at_idx ON im.audit (at);
SELECT pg_catalog.pg_extension_config_dump('im.audit', '');

COMMENT ON TABLE im.private_event IS 'Read cursors and delete-for-me of one user, recorded by the caller and written into the user''s log by fanout (contract §4, §7)';
COMMENT ON TABLE im.user_head IS 'Per-user log head: committed high watermark and GC floor of the user''s sync log (contract §5, §8)';
COMMENT ON TABLE im.inbox IS 'Per-user sync log: gap-free sync_seq, one entry per (source event, delivery scope) (contract §4, §5)';
COMMENT ON TABLE im.user_conversation IS 'Per-user conversation state: last and read positions, unread count, large-group dirty marker, last activity and conversation pin (contract §7, §20)';
COMMENT ON TABLE im.deleted_for_me IS 'Messages a user deleted for themselves only (contract §7)';
COMMENT ON TABLE im.device IS 'Devices of a user: state, sync generation, ACKed and issued sync positions, registration counter bound into tokens (contract §5)';
COMMENT ON TABLE im.recovery_session IS 'Recovery sessions of a device: an active one holds the GC fence at resume_from (contract §5, §8)';
COMMENT ON TABLE im.snapshot IS 'Snapshots for a new or too-far-behind device, immutable once written (contract §6)';
COMMENT ON TABLE im.snapshot_page IS 'Pages of a snapshot with their digests; the manifest digest covers them all (contract §6)';
COMMENT ON TABLE im.token_key IS 'Signing keys of device, batch and snapshot tokens; the newest signs, retired keys keep their id without a secret (contract §8, §12)';
COMMENT ON TABLE im.audit IS 'Audit trail of registrations, token issues and revocations, never a token (contract §8, §12)';

-- §5 devices and sync
CREATE FUNCTION im.register_device(user_id bigint, device_id text)
RETURNS TABLE(sync_generation int, state text)
AS 'MODULE_PATHNAME', 'im_register_device' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.revoke_device(user_id bigint, device_id text)
RETURNS boolean AS 'MODULE_PATHNAME', 'im_revoke_device' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.device_session(user_id bigint, device_id text, connection_epoch bigint)
RETURNS TABLE(state text, sync_generation int, server_acked_sync_seq bigint,
              high_watermark bigint, current boolean, account_state text)
AS 'MODULE_PATHNAME', 'im_device_session' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.sync_changes(user_id bigint, device_id text, client_generation int,
                                local_applied_sync_seq bigint, page_limit int DEFAULT 200,
                                page_cursor text DEFAULT NULL)
RETURNS TABLE(status text, sync_generation int, batch_token text,
              resume_from bigint, batch_high_watermark bigint,
              server_acked_sync_seq bigint, events jsonb,
              next_cursor text, has_more boolean,
              recovery_session_id bigint, user_high_watermark bigint)
AS 'MODULE_PATHNAME', 'im_sync_changes' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.ack_sync(user_id bigint, device_id text, batch_token text, ack_seq bigint)
RETURNS TABLE(status text, acked_sync_seq bigint)
AS 'MODULE_PATHNAME', 'im_ack_sync' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

-- §6 snapshots and history
CREATE FUNCTION im.begin_snapshot(user_id bigint, device_id text)
RETURNS TABLE(status text, snapshot_id bigint, sync_generation int,
              base_sync_seq bigint, snapshot_token text, page_count int,
              manifest_digest text)
AS 'MODULE_PATHNAME', 'im_begin_snapshot' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.fetch_snapshot(user_id bigint, device_id text, snapshot_token text, page_no int)
RETURNS TABLE(status text, page int, page_count int, items jsonb, page_digest text)
AS 'MODULE_PATHNAME', 'im_fetch_snapshot' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.ack_snapshot(user_id bigint, device_id text, snapshot_token text,
                                manifest_digest text)
RETURNS TABLE(status text, acked_sync_seq bigint)
AS 'MODULE_PATHNAME', 'im_ack_snapshot' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.fetch_messages(user_id bigint, conversation_id bigint, after_seq bigint,
                                  page_limit int DEFAULT 100, up_to_seq bigint DEFAULT NULL)
RETURNS TABLE(messages jsonb, next_after_seq bigint, has_more boolean)
AS 'MODULE_PATHNAME', 'im_fetch_messages' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

-- §7 read state, large groups, message status
CREATE FUNCTION im.report_read(user_id bigint, conversation_id bigint, read_to_seq bigint,
                               trace_id text DEFAULT NULL)
RETURNS TABLE(read_msg_seq bigint, unread_count bigint)
AS 'MODULE_PATHNAME', 'im_report_read' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.clear_dirty(user_id bigint, conversation_id bigint, observed_version bigint,
                               saved_last_msg_seq bigint, trace_id text DEFAULT NULL)
RETURNS TABLE(cleared boolean, dirty_target_msg_seq bigint, dirty_version bigint)
AS 'MODULE_PATHNAME', 'im_clear_dirty' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.conversation_list(user_id bigint, page_limit int DEFAULT 100,
                                     after_conversation_id bigint DEFAULT NULL)
RETURNS TABLE(conversation_id bigint, kind text, mode text,
              last_msg_seq bigint, read_msg_seq bigint, unread_count bigint,
              dirty_target_msg_seq bigint, dirty_version bigint,
              head_msg_seq bigint, head_stale boolean, my_role text,
              muted_until timestamptz)
AS 'MODULE_PATHNAME', 'im_conversation_list' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.recent_conversations(user_id bigint, page_limit int DEFAULT 50,
                                        after_cursor text DEFAULT NULL)
RETURNS TABLE(conversation_id bigint, kind text, mode text, last_msg_seq bigint,
              read_msg_seq bigint, unread_count bigint, dirty_target_msg_seq bigint,
              dirty_version bigint, head_msg_seq bigint, last_activity_at timestamptz,
              conversation_pinned boolean, left_conversation boolean, my_role text,
              muted_until timestamptz, next_cursor text)
AS 'MODULE_PATHNAME', 'im_recent_conversations' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.pin_conversation(user_id bigint, conversation_id bigint, pin boolean,
                                    trace_id text DEFAULT NULL)
RETURNS TABLE(conversation_pinned boolean)
AS 'MODULE_PATHNAME', 'im_pin_conversation' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.delete_for_me(user_id bigint, conversation_id bigint, message_id bigint,
                                 trace_id text DEFAULT NULL)
RETURNS boolean AS 'MODULE_PATHNAME', 'im_delete_for_me' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.message_status(message_id bigint)
RETURNS TABLE(user_id bigint, device_id text, accepted boolean,
              in_sync_scope boolean, device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_message_status' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
-- The four facts of a message for its sender, one row per recipient user,
-- without device ids (contract §16); the message_status frame calls it.
CREATE FUNCTION im.set_read_receipts(user_id bigint, enabled boolean, trace_id text DEFAULT NULL)
RETURNS TABLE(read_receipts boolean)
AS 'MODULE_PATHNAME', 'im_set_read_receipts' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.run_receipts(max_rows int DEFAULT 10000)
RETURNS bigint AS 'MODULE_PATHNAME', 'im_run_receipts' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.message_facts(sender_id bigint, message_id bigint)
RETURNS TABLE(user_id bigint, accepted boolean, in_sync_scope boolean,
              any_device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_message_facts' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

-- §8 tokens
CREATE FUNCTION im.issue_device_token(user_id bigint, device_id text, ttl interval DEFAULT '1 day')
RETURNS text AS 'MODULE_PATHNAME', 'im_issue_device_token' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.authenticate(token text)
RETURNS TABLE(user_id bigint, device_id text, connection_epoch bigint)
AS 'MODULE_PATHNAME', 'im_authenticate' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.rotate_token_key()
RETURNS int AS 'MODULE_PATHNAME', 'im_rotate_token_key' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.retire_token_key(key_id int)
RETURNS boolean AS 'MODULE_PATHNAME', 'im_retire_token_key' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

COMMENT ON FUNCTION im.register_device(bigint, text) IS 'Registers or re-registers a device of a user (contract §5)';
COMMENT ON FUNCTION im.revoke_device(bigint, text) IS 'Revokes a device: its tokens and leases end (contract §5, §12)';
COMMENT ON FUNCTION im.device_session(bigint, text, bigint) IS 'A device''s sync state at connect, fencing older connection epochs, and its account''s standing (contract §5, §17)';
COMMENT ON FUNCTION im.sync_changes(bigint, text, integer, bigint, integer, text) IS 'Returns the next page of a device''s sync batch with its batch token (contract §5)';
COMMENT ON FUNCTION im.ack_sync(bigint, text, text, bigint) IS 'ACKs a device''s sync batch up to ack_seq: SYNC_ACK (contract §5)';
COMMENT ON FUNCTION im.begin_snapshot(bigint, text) IS 'Builds a snapshot for a device and returns its token and manifest (contract §6)';
COMMENT ON FUNCTION im.fetch_snapshot(bigint, text, text, integer) IS 'Returns one page of a device''s snapshot (contract §6)';
COMMENT ON FUNCTION im.ack_snapshot(bigint, text, text, text) IS 'Installs a snapshot on its device once the manifest digest matches (contract §6)';
COMMENT ON FUNCTION im.fetch_messages(bigint, bigint, bigint, integer, bigint) IS 'Conversation history a member may see, after a position, page by page (contract §6)';
COMMENT ON FUNCTION im.report_read(bigint, bigint, bigint, text) IS 'Moves the user''s read cursor forward and recounts unread (contract §7)';
COMMENT ON FUNCTION im.clear_dirty(bigint, bigint, bigint, bigint, text) IS 'Clears a large-group dirty marker the client has caught up with (contract §7)';
COMMENT ON FUNCTION im.conversation_list(bigint, integer, bigint) IS 'The user''s conversations with positions, unread counts and dirty markers (contract §7)';
COMMENT ON FUNCTION im.recent_conversations(bigint, integer, text) IS 'The user''s conversations pinned first, then by latest activity, paged by a keyset cursor (contract §20)';
COMMENT ON FUNCTION im.pin_conversation(bigint, bigint, boolean, text) IS 'Pins or unpins a conversation for the user; synced to the user''s devices as a conversation_pin event (contract §20)';
COMMENT ON FUNCTION im.delete_for_me(bigint, bigint, bigint, text) IS 'Deletes a message for the calling user only (contract §7)';
COMMENT ON FUNCTION im.message_status(bigint) IS 'Per user and device: accepted, in sync scope, synced, read for one message (contract §7)';
COMMENT ON FUNCTION im.message_facts(bigint, bigint) IS 'For the sender of a message: per recipient user accepted, in sync scope, synced on any device, read (contract §16)';
COMMENT ON FUNCTION im.set_read_receipts(bigint, boolean, text) IS 'Turns the user''s read receipts on or off; off, others learn no read state of the user (contract §20)';
COMMENT ON FUNCTION im.run_receipts(integer) IS 'Turns queued ACKs and read reports into receipt private events now, as the fanout workers do (contract §20)';
COMMENT ON TABLE im.receipt_source IS 'ACKs and read reports not yet turned into receipts, one row per call that moved (contract §20)';
COMMENT ON TABLE im.receipt_pending IS 'Per sender and conversation: the receipt state last emitted and what is due (contract §20)';
COMMENT ON TABLE im.receipt_part IS 'Per message of a fanout group, the receipt counts another node carried for its own members (contract §15, §20)';
COMMENT ON COLUMN im.receipt_pending.read_hidden IS 'A carried direct receipt''s reader turned read receipts off: no read state is emitted (contract §20)';
COMMENT ON TABLE im.receipt_setting IS 'Users who turned read receipts off (contract §20)';
COMMENT ON COLUMN im.private_event.payload IS 'A receipt''s keys besides conversation_id (contract §20), NULL for other kinds';
COMMENT ON FUNCTION im.issue_device_token(bigint, text, interval) IS 'Issues a signed device token bound to the device''s registration (contract §8, §12)';
COMMENT ON FUNCTION im.authenticate(text) IS 'Verifies a device token and returns its user, device and connection epoch (contract §8, §12)';
COMMENT ON FUNCTION im.rotate_token_key() IS 'Adds a new signing key; older keys still verify (contract §8)';
COMMENT ON FUNCTION im.retire_token_key(integer) IS 'Wipes the secret of a superseded key whose tokens have expired (contract §8)';

-- ---- account standing (contract §17): suspensions, standing.c and
-- suspension.c.  One row per suspended user, on every node (suspend_user
-- writes on every node); active while suspended_until is NULL or later than
-- now(), so a timed suspension ends by itself.  reinstate_user deletes the
-- row; im.audit keeps the history.
CREATE TABLE im.user_suspension (
    user_id         bigint PRIMARY KEY,
    suspended_at    timestamptz NOT NULL DEFAULT now(),
    suspended_until timestamptz,       -- NULL: until reinstated
    moderator       text NOT NULL,
    reason          text
);
SELECT pg_catalog.pg_extension_config_dump('im.user_suspension', '');
-- Any writer (COPY and restores too) tells shared memory before it commits,
-- so the checks' fast path never misses a suspension (standing.c).
CREATE FUNCTION im.user_suspension_written() RETURNS trigger
AS 'MODULE_PATHNAME', 'im_user_suspension_written' LANGUAGE C
SET search_path = pg_catalog, im, pg_temp;
CREATE TRIGGER user_suspension_written BEFORE INSERT OR UPDATE ON im.user_suspension
    FOR EACH STATEMENT EXECUTE FUNCTION im.user_suspension_written();
CREATE FUNCTION im.suspend_user(moderator text, user_id bigint, suspended_until timestamptz,
                                reason text)
RETURNS TABLE(suspended boolean, sessions_closed int)
AS 'MODULE_PATHNAME', 'im_suspend_user' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.reinstate_user(moderator text, user_id bigint)
RETURNS TABLE(reinstated boolean)
AS 'MODULE_PATHNAME', 'im_reinstate_user' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
COMMENT ON TABLE im.user_suspension IS 'Suspended accounts: active while suspended_until is NULL or in the future (contract §17)';
COMMENT ON FUNCTION im.user_suspension_written() IS 'Tells the account-standing checks that a suspension is being written (contract §17)';
COMMENT ON FUNCTION im.suspend_user(text, bigint, timestamp with time zone, text) IS 'Suspends an account until a time or until reinstated: its calls fail with IS403, its sessions close (contract §17)';
COMMENT ON FUNCTION im.reinstate_user(text, bigint) IS 'Lifts an account''s suspension (contract §17)';
