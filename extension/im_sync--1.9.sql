\echo Use "CREATE EXTENSION im_sync" to load this file. \quit

/*
 * im_sync 1.9 — schema, the full install script.  An older install reaches
 * the same catalog through the im_sync--A--B.sql upgrade scripts
 * (test/suites/70-upgrade.sh compares the two).  Tables are the extension's internals; the outward
 * surface is the set of functions at the end of this file (contract:
 * extension/doc/contract.md).
 *
 * Invariants enforced here by the database, not by comments:
 *   - msg_seq unique per conversation, (sender, client_msg_id) unique;
 *   - membership periods of one (conversation, user) never overlap
 *     (EXCLUDE over int8range) and at most one is open;
 *   - sync_seq unique per user; fanout idempotency key
 *     (user_id, source_event_id, delivery_scope) with a non-NULL scope.
 * The install script inserts no rows.
 */

-- Global id source for messages, control events and private events, so a
-- source_event_id never names two things.
CREATE SEQUENCE im.event_id_seq;
CREATE SEQUENCE im.conversation_id_seq;
CREATE SEQUENCE im.membership_period_id_seq;
CREATE SEQUENCE im.outbox_id_seq;
CREATE SEQUENCE im.recovery_session_id_seq;
CREATE SEQUENCE im.snapshot_id_seq;
CREATE SEQUENCE im.audit_id_seq;

-- One row per conversation.  head_msg_seq is the single writer's counter:
-- every position is assigned while holding this row's lock.
-- Single-column value rules as domains (1.2): PostgreSQL compiles a
-- domain's check once into its type cache and applies it only to the
-- columns a statement assigns, while a table CHECK constraint is read from
-- its stored text and planned again at every INSERT or UPDATE of the table,
-- all of the table's checks each time.  The send path's statements (head
-- UPDATE, event and outbox INSERT) paid that for eleven checks per send.
CREATE DOMAIN im.conversation_kind AS text CONSTRAINT conversation_kind_check CHECK (VALUE IN ('direct', 'group'));
CREATE DOMAIN im.conversation_mode AS text CONSTRAINT conversation_mode_check CHECK (VALUE IN ('fanout', 'shared_log'));
CREATE DOMAIN im.head_seq AS bigint CONSTRAINT head_seq_check CHECK (VALUE >= 0);
CREATE DOMAIN im.event_kind AS text
    CONSTRAINT event_kind_check CHECK (VALUE IN ('message', 'create', 'join', 'leave', 'recall', 'edit', 'mode'));
CREATE DOMAIN im.event_seq AS bigint CONSTRAINT event_seq_check CHECK (VALUE >= 1);
CREATE DOMAIN im.outbox_state AS text CONSTRAINT outbox_state_check CHECK (VALUE IN ('pending', 'done', 'dead'));

CREATE TABLE im.conversation (
    conversation_id bigint PRIMARY KEY DEFAULT nextval('im.conversation_id_seq'),
    kind            im.conversation_kind NOT NULL,
    mode            im.conversation_mode NOT NULL DEFAULT 'fanout',
    head_msg_seq    im.head_seq NOT NULL DEFAULT 0,
    direct_user_lo  bigint,
    direct_user_hi  bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- a direct conversation names its ordered pair, a group none (one
    -- constraint: each is planned at every UPDATE of the head)
    CONSTRAINT conversation_direct_pair CHECK (
        ((kind = 'direct') = (direct_user_lo IS NOT NULL AND direct_user_hi IS NOT NULL))
        AND direct_user_lo < direct_user_hi),
    UNIQUE (direct_user_lo, direct_user_hi)
);

-- Every conversation position: messages and control events.  A recall sets
-- the target's body to NULL (tombstone, §12.4) and marks edits of it recalled.
-- conversation_id has no foreign key (1.2): an event is only written by
-- append.c under the conversation row's lock (the row it just updated), and
-- conversation rows are never deleted (membership_period's key still
-- forbids it); reconcile reports event_without_conversation otherwise.
CREATE TABLE im.event (
    message_id        bigint PRIMARY KEY DEFAULT nextval('im.event_id_seq'),
    conversation_id   bigint NOT NULL,
    msg_seq           im.event_seq NOT NULL,
    kind              im.event_kind NOT NULL,
    sender_id         bigint,
    client_msg_id     text,
    request_digest    bytea,          -- SHA-256 of the original request, for IS409
    content_type      text,
    body              jsonb,
    target_message_id bigint REFERENCES im.event,
    subject_user_id   bigint,         -- join/leave: who
    mode              text,           -- the conversation mode in force at this position
    recalled          boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (conversation_id, msg_seq),
    UNIQUE (sender_id, client_msg_id),
    -- which kinds carry an idempotency key and which a target (one
    -- constraint: each is planned at every INSERT)
    CONSTRAINT event_kind_fields CHECK (
        ((client_msg_id IS NULL) = (sender_id IS NULL OR kind IN ('create', 'join', 'leave', 'mode')))
        AND ((target_message_id IS NOT NULL) = (kind IN ('recall', 'edit'))))
);
CREATE INDEX event_target_idx ON im.event (target_message_id) WHERE target_message_id IS NOT NULL;

-- Membership periods [join_seq, leave_seq] (closed).  Re-joining makes a new row.
CREATE TABLE im.membership_period (
    membership_period_id bigint PRIMARY KEY DEFAULT nextval('im.membership_period_id_seq'),
    conversation_id      bigint NOT NULL REFERENCES im.conversation,
    user_id              bigint NOT NULL,
    join_seq             bigint NOT NULL,
    leave_seq            bigint,
    join_event_id        bigint NOT NULL REFERENCES im.event,
    leave_event_id       bigint REFERENCES im.event,
    CHECK (leave_seq IS NULL OR leave_seq >= join_seq),
    CHECK ((leave_seq IS NULL) = (leave_event_id IS NULL)),
    UNIQUE (conversation_id, user_id, join_seq),
    CONSTRAINT membership_period_no_overlap EXCLUDE USING gist (
        conversation_id WITH =, user_id WITH =,
        int8range(join_seq, leave_seq, '[]') WITH &&)
);
CREATE UNIQUE INDEX membership_period_one_open
    ON im.membership_period (conversation_id, user_id) WHERE leave_seq IS NULL;
CREATE INDEX membership_period_user_idx ON im.membership_period (user_id, conversation_id);
CREATE INDEX membership_period_leave_event_idx ON im.membership_period (leave_event_id) WHERE leave_event_id IS NOT NULL;

-- Private events (read_cursor, delete_for_me): recorded by the calling
-- transaction, written into the user's log by fanout alone.
CREATE TABLE im.private_event (
    private_event_id bigint PRIMARY KEY DEFAULT nextval('im.event_id_seq'),
    user_id          bigint NOT NULL,
    conversation_id  bigint NOT NULL REFERENCES im.conversation,
    kind             text   NOT NULL CHECK (kind IN ('read_cursor', 'delete_for_me')),
    read_msg_seq     bigint,
    message_id       bigint REFERENCES im.event,
    created_at       timestamptz NOT NULL DEFAULT now()
);
-- Retention (maintenance.c) collects private events oldest first.
CREATE INDEX private_event_created_idx ON im.private_event (created_at);

-- Transactional outbox: one row per conversation position or private event,
-- written in the same transaction.  Rows are kept after processing (state
-- 'done') as the evidence reconcile and message_status read.
CREATE TABLE im.outbox (
    outbox_id        bigint PRIMARY KEY DEFAULT nextval('im.outbox_id_seq'),
    conversation_id  bigint NOT NULL,
    msg_seq          bigint,            -- NULL for private events
    source_event_id  bigint NOT NULL,   -- im.event.message_id or im.private_event.private_event_id
    private_user_id  bigint,            -- set for private events
    state            im.outbox_state NOT NULL DEFAULT 'pending',
    attempts         int    NOT NULL DEFAULT 0,  -- charged failures (toward fanout_max_attempts)
    transient_failures int  NOT NULL DEFAULT 0,  -- failures never charged (contract §4), they set the backoff
    last_error       text,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    processed_at     timestamptz,
    UNIQUE (source_event_id),
    CHECK ((msg_seq IS NULL) = (private_user_id IS NOT NULL))
);
CREATE INDEX outbox_pending_idx ON im.outbox (conversation_id, msg_seq) WHERE state = 'pending';
-- Dead letters are rare: a partial index keeps metrics and reconcile cheap.
CREATE INDEX outbox_dead_idx ON im.outbox (outbox_id) WHERE state = 'dead';
-- Retention (maintenance.c) collects done items oldest-processed first.
CREATE INDEX outbox_done_idx ON im.outbox (processed_at) WHERE state = 'done';

-- Items covered by two periods of one user: kept, reported, not delivered.
CREATE TABLE im.fanout_quarantine (
    outbox_id       bigint NOT NULL REFERENCES im.outbox,
    user_id         bigint NOT NULL,
    periods         bigint[] NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (outbox_id, user_id)
);

-- Per-user sync head: the committed high watermark of the user's log.
-- gc_floor: every sync_seq <= gc_floor has been collected; the log holds
-- (gc_floor, high_watermark].
CREATE TABLE im.user_head (
    user_id         bigint PRIMARY KEY,
    high_watermark  bigint NOT NULL DEFAULT 0 CHECK (high_watermark >= 0),
    gc_floor        bigint NOT NULL DEFAULT 0 CHECK (gc_floor >= 0 AND gc_floor <= high_watermark)
);

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
    PRIMARY KEY (user_id, conversation_id)
);

CREATE TABLE im.deleted_for_me (
    user_id     bigint NOT NULL,
    message_id  bigint NOT NULL REFERENCES im.event,
    deleted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, message_id)
);

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

-- Resumable maintenance positions (maintenance.c):
--   gc_cursor                value: last user_id a gc_inbox chunk collected;
--   outbox_collected_before  at: done outbox items processed before this were
--                            collected (reconcile does not miss them).
CREATE TABLE im.maintenance_state (
    name   text PRIMARY KEY,
    value  bigint NOT NULL DEFAULT 0,
    at     timestamptz
);

-- Per-stage latency evidence for metrics: one row per processed outbox item
-- is already in im.outbox (created_at, processed_at); device ACK latency is
-- derived from im.device.acked_at.

SELECT pg_catalog.pg_extension_config_dump('im.conversation', '');
SELECT pg_catalog.pg_extension_config_dump('im.event', '');
SELECT pg_catalog.pg_extension_config_dump('im.membership_period', '');
SELECT pg_catalog.pg_extension_config_dump('im.private_event', '');
SELECT pg_catalog.pg_extension_config_dump('im.outbox', '');
SELECT pg_catalog.pg_extension_config_dump('im.fanout_quarantine', '');
SELECT pg_catalog.pg_extension_config_dump('im.user_head', '');
SELECT pg_catalog.pg_extension_config_dump('im.inbox', '');
SELECT pg_catalog.pg_extension_config_dump('im.user_conversation', '');
SELECT pg_catalog.pg_extension_config_dump('im.deleted_for_me', '');
SELECT pg_catalog.pg_extension_config_dump('im.device', '');
SELECT pg_catalog.pg_extension_config_dump('im.recovery_session', '');
SELECT pg_catalog.pg_extension_config_dump('im.snapshot', '');
SELECT pg_catalog.pg_extension_config_dump('im.snapshot_page', '');
SELECT pg_catalog.pg_extension_config_dump('im.token_key', '');
SELECT pg_catalog.pg_extension_config_dump('im.audit', '');
SELECT pg_catalog.pg_extension_config_dump('im.maintenance_state', '');
SELECT pg_catalog.pg_extension_config_dump('im.event_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.conversation_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.membership_period_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.outbox_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.recovery_session_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.snapshot_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.audit_id_seq', '');

REVOKE ALL ON ALL TABLES IN SCHEMA im FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA im FROM PUBLIC;

/* ------------------------------------------------------------------------
 * API (contract §2–§8).  Every function is SECURITY DEFINER with a pinned
 * search_path; EXECUTE is revoked from PUBLIC at the end.
 * ------------------------------------------------------------------------ */

-- §2 conversations and membership
CREATE FUNCTION im.create_conversation(kind text, members bigint[], creator bigint DEFAULT NULL)
RETURNS bigint AS 'MODULE_PATHNAME', 'im_create_conversation' LANGUAGE C;
CREATE FUNCTION im.direct_conversation(user_a bigint, user_b bigint)
RETURNS bigint AS 'MODULE_PATHNAME', 'im_direct_conversation' LANGUAGE C;
CREATE FUNCTION im.join_conversation(conversation_id bigint, user_id bigint)
RETURNS TABLE(membership_period_id bigint, join_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_join_conversation' LANGUAGE C;
CREATE FUNCTION im.leave_conversation(conversation_id bigint, user_id bigint)
RETURNS TABLE(membership_period_id bigint, leave_seq bigint)
AS 'MODULE_PATHNAME', 'im_leave_conversation' LANGUAGE C;
CREATE FUNCTION im.conversation_members(conversation_id bigint)
RETURNS TABLE(user_id bigint, membership_period_id bigint, join_seq bigint)
AS 'MODULE_PATHNAME', 'im_conversation_members' LANGUAGE C;
CREATE FUNCTION im.set_conversation_mode(conversation_id bigint, mode text)
RETURNS text AS 'MODULE_PATHNAME', 'im_set_conversation_mode' LANGUAGE C;
-- For the gateway's shared_log hints: which of the given users (its
-- connected users) are active members.  Unlike conversation_members it names
-- nobody the caller did not name, so the gateway role needs no function that
-- lists a conversation's members (issue 8 item 6).
CREATE FUNCTION im.members_among(conversation_id bigint, candidate_user_ids bigint[])
RETURNS SETOF bigint LANGUAGE sql STABLE AS $$
  SELECT p.user_id FROM im.membership_period p
  WHERE p.conversation_id OPERATOR(pg_catalog.=) $1
    AND p.leave_seq IS NULL
    AND p.user_id OPERATOR(pg_catalog.=) ANY ($2)
  ORDER BY p.user_id
$$;

-- §3 sending
CREATE FUNCTION im.send_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                body jsonb, content_type text DEFAULT 'text')
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_send_message' LANGUAGE C;
CREATE FUNCTION im.recall_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                  target_message_id bigint)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_recall_message' LANGUAGE C;
CREATE FUNCTION im.edit_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                target_message_id bigint, body jsonb)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_edit_message' LANGUAGE C;

-- §4 fanout
CREATE FUNCTION im.run_fanout(max_items int DEFAULT 10000)
RETURNS bigint AS 'MODULE_PATHNAME', 'im_run_fanout' LANGUAGE C;

-- §5 devices and sync
CREATE FUNCTION im.register_device(user_id bigint, device_id text)
RETURNS TABLE(sync_generation int, state text)
AS 'MODULE_PATHNAME', 'im_register_device' LANGUAGE C;
CREATE FUNCTION im.revoke_device(user_id bigint, device_id text)
RETURNS boolean AS 'MODULE_PATHNAME', 'im_revoke_device' LANGUAGE C;
CREATE FUNCTION im.device_session(user_id bigint, device_id text, connection_epoch bigint)
RETURNS TABLE(state text, sync_generation int, server_acked_sync_seq bigint,
              high_watermark bigint, current boolean)
AS 'MODULE_PATHNAME', 'im_device_session' LANGUAGE C;
CREATE FUNCTION im.sync_changes(user_id bigint, device_id text, client_generation int,
                                local_applied_sync_seq bigint, page_limit int DEFAULT 200,
                                page_cursor text DEFAULT NULL)
RETURNS TABLE(status text, sync_generation int, batch_token text,
              resume_from bigint, batch_high_watermark bigint,
              server_acked_sync_seq bigint, events jsonb,
              next_cursor text, has_more boolean,
              recovery_session_id bigint, user_high_watermark bigint)
AS 'MODULE_PATHNAME', 'im_sync_changes' LANGUAGE C;
CREATE FUNCTION im.ack_sync(user_id bigint, device_id text, batch_token text, ack_seq bigint)
RETURNS TABLE(status text, acked_sync_seq bigint)
AS 'MODULE_PATHNAME', 'im_ack_sync' LANGUAGE C;

-- §6 snapshots and history
CREATE FUNCTION im.begin_snapshot(user_id bigint, device_id text)
RETURNS TABLE(status text, snapshot_id bigint, sync_generation int,
              base_sync_seq bigint, snapshot_token text, page_count int,
              manifest_digest text)
AS 'MODULE_PATHNAME', 'im_begin_snapshot' LANGUAGE C;
CREATE FUNCTION im.fetch_snapshot(user_id bigint, device_id text, snapshot_token text, page_no int)
RETURNS TABLE(status text, page int, page_count int, items jsonb, page_digest text)
AS 'MODULE_PATHNAME', 'im_fetch_snapshot' LANGUAGE C;
CREATE FUNCTION im.ack_snapshot(user_id bigint, device_id text, snapshot_token text,
                                manifest_digest text)
RETURNS TABLE(status text, acked_sync_seq bigint)
AS 'MODULE_PATHNAME', 'im_ack_snapshot' LANGUAGE C;
CREATE FUNCTION im.fetch_messages(user_id bigint, conversation_id bigint, after_seq bigint,
                                  page_limit int DEFAULT 100, up_to_seq bigint DEFAULT NULL)
RETURNS TABLE(messages jsonb, next_after_seq bigint, has_more boolean)
AS 'MODULE_PATHNAME', 'im_fetch_messages' LANGUAGE C;

-- §7 read state, large groups, message status
CREATE FUNCTION im.report_read(user_id bigint, conversation_id bigint, read_to_seq bigint)
RETURNS TABLE(read_msg_seq bigint, unread_count bigint)
AS 'MODULE_PATHNAME', 'im_report_read' LANGUAGE C;
CREATE FUNCTION im.clear_dirty(user_id bigint, conversation_id bigint, observed_version bigint,
                               saved_last_msg_seq bigint)
RETURNS TABLE(cleared boolean, dirty_target_msg_seq bigint, dirty_version bigint)
AS 'MODULE_PATHNAME', 'im_clear_dirty' LANGUAGE C;
CREATE FUNCTION im.conversation_list(user_id bigint, page_limit int DEFAULT 100,
                                     after_conversation_id bigint DEFAULT NULL)
RETURNS TABLE(conversation_id bigint, kind text, mode text,
              last_msg_seq bigint, read_msg_seq bigint, unread_count bigint,
              dirty_target_msg_seq bigint, dirty_version bigint,
              head_msg_seq bigint)
AS 'MODULE_PATHNAME', 'im_conversation_list' LANGUAGE C;
CREATE FUNCTION im.delete_for_me(user_id bigint, conversation_id bigint, message_id bigint)
RETURNS boolean AS 'MODULE_PATHNAME', 'im_delete_for_me' LANGUAGE C;
CREATE FUNCTION im.message_status(message_id bigint)
RETURNS TABLE(user_id bigint, device_id text, accepted boolean,
              in_sync_scope boolean, device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_message_status' LANGUAGE C;

-- §8 operations
CREATE FUNCTION im.gc_inbox(max_users int DEFAULT NULL)
RETURNS TABLE(user_id bigint, retained_from bigint, deleted bigint)
AS 'MODULE_PATHNAME', 'im_gc_inbox' LANGUAGE C;
CREATE FUNCTION im.reconcile()
RETURNS TABLE(check_name text, severity text, conversation_id bigint, user_id bigint, detail jsonb)
AS 'MODULE_PATHNAME', 'im_reconcile' LANGUAGE C;
-- Re-runs missing fanout through the idempotent path; reports what it cannot decide.
CREATE FUNCTION im.repair_fanout(retry_dead boolean DEFAULT false, dry_run boolean DEFAULT false)
RETURNS TABLE(action text, outbox_id bigint, conversation_id bigint, user_id bigint, detail jsonb)
AS 'MODULE_PATHNAME', 'im_repair_fanout' LANGUAGE C;
CREATE FUNCTION im.metrics()
RETURNS TABLE(name text, value double precision, help text)
AS 'MODULE_PATHNAME', 'im_metrics' LANGUAGE C;
CREATE FUNCTION im.issue_device_token(user_id bigint, device_id text, ttl interval DEFAULT '1 day')
RETURNS text AS 'MODULE_PATHNAME', 'im_issue_device_token' LANGUAGE C;
CREATE FUNCTION im.authenticate(token text)
RETURNS TABLE(user_id bigint, device_id text, connection_epoch bigint)
AS 'MODULE_PATHNAME', 'im_authenticate' LANGUAGE C;
CREATE FUNCTION im.rotate_token_key()
RETURNS int AS 'MODULE_PATHNAME', 'im_rotate_token_key' LANGUAGE C;
CREATE FUNCTION im.retire_token_key(key_id int)
RETURNS boolean AS 'MODULE_PATHNAME', 'im_retire_token_key' LANGUAGE C;

-- Pin search_path and make every API function SECURITY DEFINER, then revoke
-- EXECUTE from PUBLIC (contract §12).  One loop over the extension's member
-- functions, so a function added above cannot be forgotten.  The same block
-- ends every script that adds or replaces functions (full and upgrade
-- scripts alike; CREATE OR REPLACE resets both attributes).  It skips
-- im.set_extension_owner, which runs as its superuser caller on purpose.
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             JOIN pg_catalog.pg_depend d
               ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass
              AND d.objid OPERATOR(pg_catalog.=) p.oid
              AND d.deptype OPERATOR(pg_catalog.=) 'e'
             JOIN pg_catalog.pg_extension e
               ON d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::regclass
              AND d.refobjid OPERATOR(pg_catalog.=) e.oid
             WHERE e.extname OPERATOR(pg_catalog.=) 'im_sync'
               AND p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.<>) 'set_extension_owner'
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;
-- Hands every object of the extension (tables, sequences, functions and the
-- schema) to a dedicated role, so the SECURITY DEFINER API runs as that role
-- and not as the superuser who ran CREATE EXTENSION (README "Security").  The
-- control file still says superuser = true: only a superuser can create the
-- LANGUAGE C functions, and only a superuser may run this.  Run it again after
-- every ALTER EXTENSION ... UPDATE and after a restore (neither keeps member
-- ownership).  The role must not be able to log in (its holder could ALTER the
-- API functions) unless it is a superuser (handing the extension back).
-- SECURITY INVOKER on purpose: the loop above skips it.
CREATE FUNCTION im.set_extension_owner(new_owner regrole) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
    n int := 0;
BEGIN
    IF pg_catalog.current_setting('is_superuser') OPERATOR(pg_catalog.<>) 'on' THEN
        RAISE EXCEPTION 'permission denied to change the owner of extension im_sync'
            USING ERRCODE = '42501', DETAIL = 'Only a superuser can hand the extension''s objects to another role.';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles a
               WHERE a.oid OPERATOR(pg_catalog.=) new_owner AND a.rolcanlogin AND NOT a.rolsuper) THEN
        RAISE EXCEPTION 'role % can log in', new_owner
            USING ERRCODE = '22023',
                  DETAIL = 'The owner of the SECURITY DEFINER API must be a NOLOGIN role (or a superuser).',
                  HINT = pg_catalog.format('ALTER ROLE %s NOLOGIN', new_owner);
    END IF;
    -- tables first: their owned sequences follow them
    FOR r IN SELECT d.classid, d.objid, c.relkind, c.relowner
             FROM pg_catalog.pg_depend d
             LEFT JOIN pg_catalog.pg_class c
               ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::regclass
              AND c.oid OPERATOR(pg_catalog.=) d.objid
             WHERE d.deptype OPERATOR(pg_catalog.=) 'e'
               AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::regclass
               AND d.refobjid OPERATOR(pg_catalog.=)
                   (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'im_sync')
             ORDER BY c.relkind OPERATOR(pg_catalog.<>) 'r', d.objid
    LOOP
        IF r.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass THEN
            EXECUTE pg_catalog.format('ALTER ROUTINE %s OWNER TO %s', r.objid::regprocedure, new_owner);
        ELSIF r.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_type'::regclass THEN
            -- the domains of 1.2 (their array types follow them)
            EXECUTE pg_catalog.format('ALTER DOMAIN %s OWNER TO %s', r.objid::regtype, new_owner);
        ELSIF r.relkind OPERATOR(pg_catalog.=) 'r' THEN
            EXECUTE pg_catalog.format('ALTER TABLE %s OWNER TO %s', r.objid::regclass, new_owner);
        ELSIF r.relkind OPERATOR(pg_catalog.=) 'S' THEN
            IF (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) r.objid)
               OPERATOR(pg_catalog.<>) new_owner THEN
                EXECUTE pg_catalog.format('ALTER SEQUENCE %s OWNER TO %s', r.objid::regclass, new_owner);
            END IF;
        ELSE
            CONTINUE;
        END IF;
        n := n OPERATOR(pg_catalog.+) 1;
    END LOOP;
    EXECUTE pg_catalog.format('ALTER SCHEMA im OWNER TO %s', new_owner);
    RETURN n;
END
$fn$;
REVOKE ALL ON FUNCTION im.set_extension_owner(regrole) FROM PUBLIC;

-- psql's \dt+ im.* and \df+ im.* explain each object (contract section in
-- brackets: extension/doc/contract.md).  sql/99_catalog_comments fails when
-- an object has none.
COMMENT ON DOMAIN im.conversation_kind IS 'Kind of a conversation: direct (two members, ordered pair) or group (contract §1)';
COMMENT ON DOMAIN im.conversation_mode IS 'Delivery mode of a conversation: fanout to inboxes or shared_log (contract §4)';
COMMENT ON DOMAIN im.head_seq IS 'A conversation''s head position, 0 before its first event (contract §1)';
COMMENT ON DOMAIN im.event_kind IS 'Kind of a conversation position: message or control event (contract §1, §3)';
COMMENT ON DOMAIN im.event_seq IS 'A conversation position, from 1, gap-free (contract §1)';
COMMENT ON DOMAIN im.outbox_state IS 'State of an outbox item: pending, done or dead (contract §4)';
COMMENT ON TABLE im.conversation IS 'One row per conversation; head_msg_seq is the single writer''s position counter, assigned under this row''s lock (contract §1, §2)';
COMMENT ON TABLE im.event IS 'Every conversation position: messages and control events, gap-free msg_seq per conversation; a recall tombstones its target (contract §1, §3)';
COMMENT ON TABLE im.membership_period IS 'Membership periods [join_seq, leave_seq] of a user in a conversation, never overlapping, at most one open (contract §2)';
COMMENT ON TABLE im.private_event IS 'Read cursors and delete-for-me of one user, recorded by the caller and written into the user''s log by fanout (contract §4, §7)';
COMMENT ON TABLE im.outbox IS 'Transactional outbox: one item per conversation position or private event; done items stay as fanout evidence until retention (contract §4)';
COMMENT ON TABLE im.fanout_quarantine IS 'Outbox items covered by two membership periods of one user: kept and reported, never delivered (contract §4, §8)';
COMMENT ON TABLE im.user_head IS 'Per-user log head: committed high watermark and GC floor of the user''s sync log (contract §5, §8)';
COMMENT ON TABLE im.inbox IS 'Per-user sync log: gap-free sync_seq, one entry per (source event, delivery scope) (contract §4, §5)';
COMMENT ON TABLE im.user_conversation IS 'Per-user conversation state: last and read positions, unread count, large-group dirty marker (contract §7)';
COMMENT ON TABLE im.deleted_for_me IS 'Messages a user deleted for themselves only (contract §7)';
COMMENT ON TABLE im.device IS 'Devices of a user: state, sync generation, ACKed and issued sync positions, registration counter bound into tokens (contract §5)';
COMMENT ON TABLE im.recovery_session IS 'Recovery sessions of a device: an active one holds the GC fence at resume_from (contract §5, §8)';
COMMENT ON TABLE im.snapshot IS 'Snapshots for a new or too-far-behind device, immutable once written (contract §6)';
COMMENT ON TABLE im.snapshot_page IS 'Pages of a snapshot with their digests; the manifest digest covers them all (contract §6)';
COMMENT ON TABLE im.token_key IS 'Signing keys of device, batch and snapshot tokens; the newest signs, retired keys keep their id without a secret (contract §8, §12)';
COMMENT ON TABLE im.audit IS 'Audit trail of registrations, token issues and revocations, never a token (contract §8, §12)';
COMMENT ON TABLE im.maintenance_state IS 'Resumable positions of the maintenance rounds: GC cursor, outbox retention horizon (contract §8)';

COMMENT ON FUNCTION im.create_conversation(text, bigint[], bigint) IS 'Creates a direct or group conversation with its first members (contract §2)';
COMMENT ON FUNCTION im.direct_conversation(bigint, bigint) IS 'Returns the direct conversation of two users, creating it once (contract §2)';
COMMENT ON FUNCTION im.join_conversation(bigint, bigint) IS 'Opens a membership period for a user, idempotent while one is open (contract §2)';
COMMENT ON FUNCTION im.leave_conversation(bigint, bigint) IS 'Closes the user''s open membership period at a leave position (contract §2)';
COMMENT ON FUNCTION im.conversation_members(bigint) IS 'Lists the active members of a conversation with their open periods (contract §2)';
COMMENT ON FUNCTION im.set_conversation_mode(bigint, text) IS 'Switches a conversation between fanout and shared_log delivery at a mode position (contract §2, §7)';
COMMENT ON FUNCTION im.members_among(bigint, bigint[]) IS 'Which of the given users are active members: the gateway''s shared_log hints without listing members (contract §2, §12)';
COMMENT ON FUNCTION im.send_message(bigint, bigint, text, jsonb, text) IS 'Appends a message at the next msg_seq, idempotent per (sender, client_msg_id): SEND_ACK (contract §3)';
COMMENT ON FUNCTION im.recall_message(bigint, bigint, text, bigint) IS 'Recalls the sender''s message: a recall position and a tombstone (contract §3)';
COMMENT ON FUNCTION im.edit_message(bigint, bigint, text, bigint, jsonb) IS 'Appends an edit of the sender''s message (contract §3)';
COMMENT ON FUNCTION im.run_fanout(integer) IS 'Runs fanout of pending outbox items into the members'' logs now, as the workers do (contract §4)';
COMMENT ON FUNCTION im.register_device(bigint, text) IS 'Registers or re-registers a device of a user (contract §5)';
COMMENT ON FUNCTION im.revoke_device(bigint, text) IS 'Revokes a device: its tokens and leases end (contract §5, §12)';
COMMENT ON FUNCTION im.device_session(bigint, text, bigint) IS 'A device''s sync state at connect, fencing older connection epochs (contract §5)';
COMMENT ON FUNCTION im.sync_changes(bigint, text, integer, bigint, integer, text) IS 'Returns the next page of a device''s sync batch with its batch token (contract §5)';
COMMENT ON FUNCTION im.ack_sync(bigint, text, text, bigint) IS 'ACKs a device''s sync batch up to ack_seq: SYNC_ACK (contract §5)';
COMMENT ON FUNCTION im.begin_snapshot(bigint, text) IS 'Builds a snapshot for a device and returns its token and manifest (contract §6)';
COMMENT ON FUNCTION im.fetch_snapshot(bigint, text, text, integer) IS 'Returns one page of a device''s snapshot (contract §6)';
COMMENT ON FUNCTION im.ack_snapshot(bigint, text, text, text) IS 'Installs a snapshot on its device once the manifest digest matches (contract §6)';
COMMENT ON FUNCTION im.fetch_messages(bigint, bigint, bigint, integer, bigint) IS 'Conversation history a member may see, after a position, page by page (contract §6)';
COMMENT ON FUNCTION im.report_read(bigint, bigint, bigint) IS 'Moves the user''s read cursor forward and recounts unread (contract §7)';
COMMENT ON FUNCTION im.clear_dirty(bigint, bigint, bigint, bigint) IS 'Clears a large-group dirty marker the client has caught up with (contract §7)';
COMMENT ON FUNCTION im.conversation_list(bigint, integer, bigint) IS 'The user''s conversations with positions, unread counts and dirty markers (contract §7)';
COMMENT ON FUNCTION im.delete_for_me(bigint, bigint, bigint) IS 'Deletes a message for the calling user only (contract §7)';
COMMENT ON FUNCTION im.message_status(bigint) IS 'Per user and device: accepted, in sync scope, synced, read for one message (contract §7)';
COMMENT ON FUNCTION im.gc_inbox(integer) IS 'Collects log entries every device has ACKed, behind the retention fence (contract §8)';
COMMENT ON FUNCTION im.reconcile() IS 'Checks positions, periods, fanout and logs against each other and reports findings (contract §8)';
COMMENT ON FUNCTION im.repair_fanout(boolean, boolean) IS 'Requeues missing fanout, reports quarantine, optionally retries dead letters (contract §8)';
COMMENT ON FUNCTION im.metrics() IS 'Counters, gauges and latency histograms for monitoring (contract §8)';
COMMENT ON FUNCTION im.issue_device_token(bigint, text, interval) IS 'Issues a signed device token bound to the device''s registration (contract §8, §12)';
COMMENT ON FUNCTION im.authenticate(text) IS 'Verifies a device token and returns its user, device and connection epoch (contract §8, §12)';
COMMENT ON FUNCTION im.rotate_token_key() IS 'Adds a new signing key; older keys still verify (contract §8)';
COMMENT ON FUNCTION im.retire_token_key(integer) IS 'Wipes the secret of a superseded key whose tokens have expired (contract §8)';
COMMENT ON FUNCTION im.set_extension_owner(regrole) IS 'Hands every object of the extension to a NOLOGIN role; run after every update and restore (contract §12)';

/*
 * ---- 1.2 -> 1.3 (issue 11): reactions, pins and replies (contract §14).
 * This block is im_sync--1.2--1.3.sql without its \echo line, appended
 * verbatim to the 1.2 full script to make im_sync--1.3.sql, so the two
 * reach the same catalog (test/suites/70-upgrade.sh compares them).
 * In-place edits of earlier objects are statements here, not edits above:
 *   - domain im.event_kind gains 'reaction' and 'pin'; im.event's CHECK
 *     event_kind_fields (target_message_id set exactly for recall, edit)
 *     gains 'reaction'; new columns reply_to_message_id (a message's reply
 *     target) and pin_message_id (a pin's target; NULL for the list change
 *     a recall makes), each with its CHECK (no foreign key: see below);
 *   - im.send_message(bigint, bigint, text, jsonb, text) is replaced by the
 *     6-argument im.send_message(..., reply_to_message_id bigint DEFAULT
 *     NULL): same result and attributes, owner and ACL carried over, so 4-
 *     and 5-argument calls resolve to the one function (never 42725);
 *   - new functions im.react and im.pin_message, two partial indexes.
 */

-- Kinds `reaction` and `pin` (contract §14).  A reaction's target is in
-- target_message_id (its visibility needs the target's coverage, like a
-- recall or edit); a pin's target is in pin_message_id, because a pin
-- follows its own position and must never be hidden by its target's
-- coverage or a delete-for-me of it.
ALTER DOMAIN im.event_kind DROP CONSTRAINT event_kind_check;
ALTER DOMAIN im.event_kind ADD CONSTRAINT event_kind_check
    CHECK (VALUE IN ('message', 'create', 'join', 'leave', 'recall', 'edit', 'mode', 'reaction', 'pin'));
ALTER TABLE im.event DROP CONSTRAINT event_kind_fields;
ALTER TABLE im.event ADD CONSTRAINT event_kind_fields CHECK (
    ((client_msg_id IS NULL) = (sender_id IS NULL OR kind IN ('create', 'join', 'leave', 'mode')))
    AND ((target_message_id IS NOT NULL) = (kind IN ('recall', 'edit', 'reaction'))));
-- No foreign keys on the two new columns: the functions check the target
-- under the conversation lock (contract §14) and events are never deleted,
-- while a foreign key would lock the target row (FOR KEY SHARE: a WAL
-- record and a dirtied page) on every reply and pin; reconcile checks them
-- (relation_target).
ALTER TABLE im.event ADD COLUMN reply_to_message_id bigint;
ALTER TABLE im.event ADD COLUMN pin_message_id bigint;
ALTER TABLE im.event ADD CONSTRAINT event_reply_to_check
    CHECK (reply_to_message_id IS NULL OR kind = 'message');
ALTER TABLE im.event ADD CONSTRAINT event_pin_check
    CHECK (pin_message_id IS NULL OR kind = 'pin');
-- A caller's current set for a target: its latest reaction position
-- (react reads it under the conversation lock; fetch_messages counts from it).
CREATE INDEX event_reaction_idx ON im.event (target_message_id, sender_id, msg_seq)
    WHERE kind = 'reaction';
-- The conversation's current pin list: the body of its latest pin position.
CREATE INDEX event_pin_idx ON im.event (conversation_id, msg_seq) WHERE kind = 'pin';

-- send_message keeps ONE signature: the 6-argument function replaces the
-- 5-argument one with the same result, attributes, owner and ACL (the
-- SECURITY DEFINER loop below sets the attributes; owner and ACL are copied
-- here, so a role the DBA granted EXECUTE keeps it).  The ACL is copied into
-- pg_proc directly, not by GRANT: a GRANT inside an extension script would
-- record the DBA's grants as the extension's initial privileges.
SELECT pg_catalog.set_config('im_sync_upgrade.send_message_owner', p.proowner::pg_catalog.text, true),
       pg_catalog.set_config('im_sync_upgrade.send_message_acl', COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p
WHERE p.oid OPERATOR(pg_catalog.=) 'im.send_message(bigint, bigint, text, jsonb, text)'::pg_catalog.regprocedure;
DROP FUNCTION im.send_message(bigint, bigint, text, jsonb, text);
CREATE FUNCTION im.send_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                body jsonb, content_type text DEFAULT 'text',
                                reply_to_message_id bigint DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_send_message' LANGUAGE C;

-- §14 reactions and pins
CREATE FUNCTION im.react(user_id bigint, conversation_id bigint, target_message_id bigint,
                         reaction text, present boolean, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_react' LANGUAGE C;
CREATE FUNCTION im.pin_message(user_id bigint, conversation_id bigint, target_message_id bigint,
                               pinned boolean, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_pin_message' LANGUAGE C;

-- the block that ends every script adding or replacing functions
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             JOIN pg_catalog.pg_depend d
               ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass
              AND d.objid OPERATOR(pg_catalog.=) p.oid
              AND d.deptype OPERATOR(pg_catalog.=) 'e'
             JOIN pg_catalog.pg_extension e
               ON d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::regclass
              AND d.refobjid OPERATOR(pg_catalog.=) e.oid
             WHERE e.extname OPERATOR(pg_catalog.=) 'im_sync'
               AND p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.<>) 'set_extension_owner'
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;

-- the old send_message's owner, then its ACL (after the loop's REVOKE, which
-- also recorded the extension's initial privileges of the new function)
DO $do$
DECLARE
    old_owner oid;
    old_acl aclitem[];
BEGIN
    old_owner := pg_catalog.current_setting('im_sync_upgrade.send_message_owner')::pg_catalog.oid;
    old_acl := NULLIF(pg_catalog.current_setting('im_sync_upgrade.send_message_acl'), '')::pg_catalog.aclitem[];
    IF old_owner OPERATOR(pg_catalog.<>) (SELECT p.proowner FROM pg_catalog.pg_proc p
            WHERE p.oid OPERATOR(pg_catalog.=) 'im.send_message(bigint, bigint, text, jsonb, text, bigint)'::pg_catalog.regprocedure) THEN
        EXECUTE pg_catalog.format('ALTER FUNCTION im.send_message(bigint, bigint, text, jsonb, text, bigint) OWNER TO %I',
                                  old_owner::pg_catalog.regrole);
    END IF;
    UPDATE pg_catalog.pg_proc SET proacl = old_acl
    WHERE oid OPERATOR(pg_catalog.=) 'im.send_message(bigint, bigint, text, jsonb, text, bigint)'::pg_catalog.regprocedure;
END
$do$;

COMMENT ON FUNCTION im.send_message(bigint, bigint, text, jsonb, text, bigint) IS 'Appends a message (optionally a reply) at the next msg_seq, idempotent per (sender, client_msg_id): SEND_ACK (contract §3, §14)';
COMMENT ON FUNCTION im.react(bigint, bigint, bigint, text, boolean, text) IS 'Sets or clears one reaction key of the caller on a message: a reaction position carrying the caller''s whole set (contract §14)';
COMMENT ON FUNCTION im.pin_message(bigint, bigint, bigint, boolean, text) IS 'Pins or unpins a message for the conversation: a pin position carrying the whole list (contract §14)';
COMMENT ON COLUMN im.event.reply_to_message_id IS 'A message''s reply target, a message of the same conversation (contract §14)';
COMMENT ON COLUMN im.event.pin_message_id IS 'A pin position''s target; NULL for the list change a recall makes (contract §14)';

/*
 * ---- 1.3 -> 1.4.  The blocks below (issue 12: offline push, contract §13;
 * issue 13: message_facts, contract §16) and the closing loop over 1.4's
 * functions are appended verbatim, without this
 * file's \echo line, to the 1.3 full script to make im_sync--1.4.sql, so the
 * two reach the same catalog (test/suites/70-upgrade.sh compares them).
 */

-- ---- 1.3 -> 1.4 (issue 12): offline push
-- Push targets, notification settings, presence and the push queue
-- (contract §13).  Everything here is on the user side of the seam.

CREATE SEQUENCE im.push_target_id_seq;
CREATE SEQUENCE im.push_job_id_seq;

-- One push target per device.  The token is never stored in the clear:
-- sealed_token is sealed with the relay's public key, token_digest is a
-- keyed digest (im.push_secret) that finds the same token on another device.
CREATE TABLE im.push_target (
    push_target_id bigint PRIMARY KEY DEFAULT nextval('im.push_target_id_seq'),
    user_id        bigint NOT NULL,
    device_id      text   NOT NULL,
    provider       text   NOT NULL CHECK (provider ~ '^[a-z0-9_-]{1,32}$'),
    app_id         text   NOT NULL CHECK (length(app_id) BETWEEN 1 AND 64),
    token_digest   bytea  NOT NULL CHECK (octet_length(token_digest) = 32),
    sealed_token   text   NOT NULL,
    preview        text   NOT NULL DEFAULT 'none' CHECK (preview IN ('none', 'sender', 'full')),
    rejections     int    NOT NULL DEFAULT 0,
    disabled_at    timestamptz,
    registered_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (user_id, device_id),
    UNIQUE (provider, app_id, token_digest),
    FOREIGN KEY (user_id, device_id) REFERENCES im.device
);

-- The key of token_digest: one random row, readable by the extension owner only.
CREATE TABLE im.push_secret (
    secret_id  int PRIMARY KEY CHECK (secret_id = 1),
    digest_key bytea NOT NULL CHECK (octet_length(digest_key) = 32),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Notification settings: conversation_id 0 is the account default, any
-- other a conversation override.  A NULL field is unset (resolves to the
-- account's, then to unmuted / 'full').
CREATE TABLE im.notify_setting (
    user_id         bigint NOT NULL,
    conversation_id bigint NOT NULL CHECK (conversation_id >= 0),
    mute_until      timestamptz,
    preview         text CHECK (preview IN ('none', 'sender', 'full')),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, conversation_id)
);

-- Presence written by the gateway: a device is online while a row of its
-- current connection epoch has not expired.
CREATE TABLE im.presence (
    user_id          bigint NOT NULL,
    device_id        text   NOT NULL,
    connection_epoch bigint NOT NULL,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (user_id, device_id),
    FOREIGN KEY (user_id, device_id) REFERENCES im.device ON DELETE CASCADE
);

-- The push queue.  pending/retry jobs coalesce per (target, conversation);
-- claimed jobs carry a lease; delivered, dead, expired, suppressed and
-- target_disabled are final (collected after im_sync.push_max_age).
CREATE TABLE im.push_job (
    job_id          bigint PRIMARY KEY DEFAULT nextval('im.push_job_id_seq'),
    push_target_id  bigint NOT NULL REFERENCES im.push_target ON DELETE CASCADE,
    user_id         bigint NOT NULL,
    device_id       text   NOT NULL,
    conversation_id bigint NOT NULL,
    message_id      bigint NOT NULL,
    msg_seq         bigint NOT NULL,
    sync_seq        bigint NOT NULL,   -- the event's place in the user's log: an ACK at or past it suppresses
    state           text   NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'claimed', 'retry', 'delivered', 'dead', 'expired',
                                     'suppressed', 'target_disabled')),
    coalesced       int    NOT NULL DEFAULT 0,
    attempts        int    NOT NULL DEFAULT 0,
    queued_at       timestamptz NOT NULL DEFAULT now(),
    not_before      timestamptz NOT NULL,
    relay_id        text,
    claimed_at      timestamptz,       -- the last hand-out: a rejection counts only against the token sent then
    lease_until     timestamptz,
    last_result     text CHECK (last_result IN ('delivered', 'rejected', 'rate_limited', 'transient', 'permanent')),
    http_status     int,
    provider_ref    text,
    finished_at     timestamptz
);
CREATE UNIQUE INDEX push_job_coalesce ON im.push_job (push_target_id, conversation_id)
    WHERE state IN ('pending', 'retry');
CREATE INDEX push_job_due ON im.push_job (not_before) WHERE state IN ('pending', 'retry');
CREATE INDEX push_job_leased ON im.push_job (lease_until) WHERE state = 'claimed';
CREATE INDEX push_job_finished ON im.push_job (finished_at) WHERE finished_at IS NOT NULL;

-- When each (target, conversation) was last handed to a relay
-- (im_sync.push_min_interval).
CREATE TABLE im.push_pace (
    push_target_id  bigint NOT NULL REFERENCES im.push_target ON DELETE CASCADE,
    conversation_id bigint NOT NULL,
    last_claimed_at timestamptz NOT NULL,
    PRIMARY KEY (push_target_id, conversation_id)
);

SELECT pg_catalog.pg_extension_config_dump('im.push_target', '');
SELECT pg_catalog.pg_extension_config_dump('im.push_secret', '');
SELECT pg_catalog.pg_extension_config_dump('im.notify_setting', '');
SELECT pg_catalog.pg_extension_config_dump('im.presence', '');
SELECT pg_catalog.pg_extension_config_dump('im.push_job', '');
SELECT pg_catalog.pg_extension_config_dump('im.push_pace', '');
SELECT pg_catalog.pg_extension_config_dump('im.push_target_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.push_job_id_seq', '');

CREATE FUNCTION im.register_push_target(user_id bigint, device_id text, provider text,
                                        app_id text, push_token text, preview text DEFAULT 'none')
RETURNS bigint AS 'MODULE_PATHNAME', 'im_register_push_target' LANGUAGE C;
CREATE FUNCTION im.remove_push_target(user_id bigint, device_id text)
RETURNS boolean AS 'MODULE_PATHNAME', 'im_remove_push_target' LANGUAGE C;
CREATE FUNCTION im.set_notify(user_id bigint, conversation_id bigint DEFAULT NULL,
                              mute_until timestamptz DEFAULT NULL, preview text DEFAULT NULL,
                              clear boolean DEFAULT false)
RETURNS void AS 'MODULE_PATHNAME', 'im_set_notify' LANGUAGE C;
CREATE FUNCTION im.set_presence(user_id bigint, device_id text, connection_epoch bigint,
                                online boolean, ttl interval DEFAULT '90 seconds')
RETURNS boolean AS 'MODULE_PATHNAME', 'im_set_presence' LANGUAGE C;
CREATE FUNCTION im.refresh_presence(user_ids bigint[], device_ids text[], connection_epochs bigint[],
                                    ttl interval DEFAULT '90 seconds')
RETURNS int AS 'MODULE_PATHNAME', 'im_refresh_presence' LANGUAGE C;
CREATE FUNCTION im.claim_push_jobs(relay_id text, max_jobs int DEFAULT 100,
                                   lease interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, push_target_id bigint, provider text,
              app_id text, sealed_token text, notification jsonb)
AS 'MODULE_PATHNAME', 'im_claim_push_jobs' LANGUAGE C;
CREATE FUNCTION im.complete_push_job(job_id bigint, relay_id text, result text,
                                     http_status int DEFAULT NULL, retry_after_ms int DEFAULT NULL,
                                     provider_ref text DEFAULT NULL)
RETURNS text AS 'MODULE_PATHNAME', 'im_complete_push_job' LANGUAGE C;

COMMENT ON TABLE im.push_target IS 'One push target per device: provider, app_id, the token sealed for the relay and its keyed digest (contract §13)';
COMMENT ON TABLE im.push_secret IS 'The key of push_target.token_digest, readable by the extension owner only (contract §13, §12)';
COMMENT ON TABLE im.notify_setting IS 'Account (conversation_id 0) and per-conversation notification settings: mute and preview (contract §13)';
COMMENT ON TABLE im.presence IS 'Devices connected to a gateway: a lease per current connection epoch (contract §13)';
COMMENT ON TABLE im.push_job IS 'The push queue filled by fanout and drained by relays under leases (contract §13)';
COMMENT ON TABLE im.push_pace IS 'When each (target, conversation) was last handed to a relay, for im_sync.push_min_interval (contract §13)';
COMMENT ON FUNCTION im.register_push_target(bigint, text, text, text, text, text) IS 'Registers a device''s push target, its token sealed for the relay (contract §13)';
COMMENT ON FUNCTION im.remove_push_target(bigint, text) IS 'Removes a device''s push target and its jobs (contract §13)';
COMMENT ON FUNCTION im.set_notify(bigint, bigint, timestamp with time zone, text, boolean) IS 'Sets the account''s or a conversation''s mute and preview (contract §13)';
COMMENT ON FUNCTION im.set_presence(bigint, text, bigint, boolean, interval) IS 'Marks a device online or offline for its current connection epoch (contract §13)';
COMMENT ON FUNCTION im.refresh_presence(bigint[], text[], bigint[], interval) IS 'Renews the presence leases of many sessions (contract §13)';
COMMENT ON FUNCTION im.claim_push_jobs(text, integer, interval) IS 'Hands claimable push jobs to a relay under a lease (contract §13)';
COMMENT ON FUNCTION im.complete_push_job(bigint, text, text, integer, integer, text) IS 'Records a relay''s result for a push job and returns its state after (contract §13)';

-- ---- 1.3 -> 1.4 (issue 13): message_facts
-- The four facts of a message for its sender, one row per recipient user,
-- without device ids (contract §16); the message_status frame calls it.
CREATE FUNCTION im.message_facts(sender_id bigint, message_id bigint)
RETURNS TABLE(user_id bigint, accepted boolean, in_sync_scope boolean,
              any_device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_message_facts' LANGUAGE C;

COMMENT ON FUNCTION im.message_facts(bigint, bigint) IS 'For the sender of a message: per recipient user accepted, in sync scope, synced on any device, read (contract §16)';

-- 1.4's functions (both blocks): SECURITY DEFINER, pinned search_path, no PUBLIC execute
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['register_push_target', 'remove_push_target',
                   'set_notify', 'set_presence', 'refresh_presence', 'claim_push_jobs', 'complete_push_job',
                   'message_facts'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;


/*
 * ---- 1.4 -> 1.5.  The blocks below are appended verbatim, without this
 * file's \echo line, to the 1.4 full script to make im_sync--1.5.sql, so the
 * two reach the same catalog (test/suites/70-upgrade.sh compares them).
 */

-- ---- 1.4 -> 1.5 (issue 15): shards — placement, transfers, node functions
-- A node with no row in im.shard_config is the single-node im_sync (ids,
-- outputs unchanged).  A configured node owns the buckets whose entry names
-- it; ids of conversations, events and push jobs carry their bucket in the
-- low 6 bits (shard_map.c).
CREATE TABLE im.shard_config (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    self_name     text NOT NULL CHECK (self_name ~ '^[a-z][a-z0-9_]{0,40}$'),
    bucket_nodes  text[] NOT NULL CHECK (pg_catalog.cardinality(bucket_nodes) = 64
                                         AND pg_catalog.array_position(bucket_nodes, NULL) IS NULL),
    configured_at timestamptz NOT NULL DEFAULT now()
);
SELECT pg_catalog.pg_extension_config_dump('im.shard_config', '');

-- Transfers (transfer_out.c, transfer_in.c, transfer_ack.c).  One row per
-- (outbox item, destination node) written by the conversation node's fanout
-- transaction; publication im_to_<node> (publish = 'insert', row filter on
-- dest_node) carries it.  On the destination the ALWAYS trigger turns the
-- replicated row into an im.transfer_in row and drops it (returns NULL), so
-- nothing of a replicated row ever reaches a unique key in the apply worker.
CREATE SEQUENCE im.transfer_id_seq;
SELECT pg_catalog.pg_extension_config_dump('im.transfer_id_seq', '');
CREATE TABLE im.transfer_out (
    transfer_id     bigint PRIMARY KEY DEFAULT nextval('im.transfer_id_seq'),
    source_node     text   NOT NULL,
    dest_node       text   NOT NULL,
    outbox_id       bigint NOT NULL,
    conversation_id bigint NOT NULL,
    msg_seq         bigint NOT NULL,
    source_event_id bigint NOT NULL,
    payload         jsonb  NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX transfer_out_dest_idx ON im.transfer_out (dest_node, transfer_id);
CREATE INDEX transfer_out_outbox_idx ON im.transfer_out (outbox_id);
SELECT pg_catalog.pg_extension_config_dump('im.transfer_out', '');

-- What a destination received: exact (source node, transfer id) pairs, the
-- duplicate filter (never "below the highest seen": ids are drawn before
-- commit, so they arrive out of order).  state: pending → applied, or
-- quarantined with the error of the failed apply (reconcile reports it).
CREATE TABLE im.transfer_in (
    source_node     text   NOT NULL,
    transfer_id     bigint NOT NULL,
    conversation_id bigint NOT NULL,
    msg_seq         bigint NOT NULL,
    source_event_id bigint NOT NULL,
    payload         jsonb,            -- NULL once applied (the copies hold it)
    state           text   NOT NULL DEFAULT 'pending'
                    CHECK (state IN ('pending', 'applied', 'quarantined')),
    last_error      text,
    sent_at         timestamptz NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now(),
    applied_at      timestamptz,
    duplicates      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (source_node, transfer_id)
);
CREATE INDEX transfer_in_pending_idx ON im.transfer_in (conversation_id, msg_seq) WHERE state = 'pending';
CREATE INDEX transfer_in_quarantined_idx ON im.transfer_in (source_node, transfer_id) WHERE state = 'quarantined';
SELECT pg_catalog.pg_extension_config_dump('im.transfer_in', '');

-- The back channel (PostgreSQL 15 has no origin = none): the destination
-- inserts one row per applied transfer; publication im_to_<source> carries
-- it (row filter on source_node); on the source the ALWAYS trigger deletes
-- exactly that transfer_out row and drops the ack row.
CREATE TABLE im.transfer_ack (
    source_node  text   NOT NULL,
    transfer_id  bigint NOT NULL,
    applied_by   text   NOT NULL,
    applied_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_node, transfer_id, applied_by)
);
SELECT pg_catalog.pg_extension_config_dump('im.transfer_ack', '');

CREATE FUNCTION im.transfer_out_arrive() RETURNS trigger
AS 'MODULE_PATHNAME', 'im_transfer_out_arrive' LANGUAGE C;
CREATE TRIGGER transfer_out_arrive BEFORE INSERT ON im.transfer_out
    FOR EACH ROW EXECUTE FUNCTION im.transfer_out_arrive();
ALTER TABLE im.transfer_out ENABLE ALWAYS TRIGGER transfer_out_arrive;
CREATE FUNCTION im.transfer_ack_arrive() RETURNS trigger
AS 'MODULE_PATHNAME', 'im_transfer_ack_arrive' LANGUAGE C;
CREATE TRIGGER transfer_ack_arrive BEFORE INSERT ON im.transfer_ack
    FOR EACH ROW EXECUTE FUNCTION im.transfer_ack_arrive();
ALTER TABLE im.transfer_ack ENABLE ALWAYS TRIGGER transfer_ack_arrive;

CREATE FUNCTION im.shard_configure(self_name text, bucket_nodes text[]) RETURNS void
AS 'MODULE_PATHNAME', 'im_shard_configure' LANGUAGE C;
CREATE FUNCTION im.shard_self() RETURNS text
AS 'MODULE_PATHNAME', 'im_shard_self' LANGUAGE C STABLE;
CREATE FUNCTION im.shard_pending()
RETURNS TABLE(outbox_pending bigint, transfers_unacked bigint, inbound_unapplied bigint)
AS 'MODULE_PATHNAME', 'im_shard_pending' LANGUAGE C;
CREATE FUNCTION im.shard_apply_transfers(max_transfers int DEFAULT 10000) RETURNS bigint
AS 'MODULE_PATHNAME', 'im_shard_apply_transfers' LANGUAGE C;
CREATE FUNCTION im.shard_retry_quarantined(source_node text, transfer_id bigint) RETURNS boolean
AS 'MODULE_PATHNAME', 'im_shard_retry_quarantined' LANGUAGE C;
CREATE FUNCTION im.conversation_heads(conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, head_msg_seq bigint)
AS 'MODULE_PATHNAME', 'im_conversation_heads' LANGUAGE C;
CREATE FUNCTION im.message_audience(message_id bigint)
RETURNS TABLE(user_id bigint, conversation_id bigint, msg_seq bigint, accepted boolean)
AS 'MODULE_PATHNAME', 'im_message_audience' LANGUAGE C;
CREATE FUNCTION im.shard_message_status(message_id bigint, user_ids bigint[])
RETURNS TABLE(user_id bigint, device_id text, accepted boolean,
              in_sync_scope boolean, device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_shard_message_status' LANGUAGE C;
CREATE FUNCTION im.shard_message_facts(message_id bigint, user_ids bigint[])
RETURNS TABLE(user_id bigint, accepted boolean, in_sync_scope boolean,
              any_device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_shard_message_facts' LANGUAGE C;
CREATE FUNCTION im.shard_received_positions(user_ids bigint[])
RETURNS TABLE(user_id bigint, conversation_id bigint, msg_seq bigint, source_event_id bigint, delivery_scope bigint)
AS 'MODULE_PATHNAME', 'im_shard_received_positions' LANGUAGE C;

COMMENT ON FUNCTION im.shard_configure(text, text[]) IS 'Stores this node''s name and the 64-bucket node map; idempotent (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_self() IS 'This node''s name, NULL when not sharded (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_pending() IS 'Outbox items pending, transfers not yet acknowledged, inbound transfers not applied (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_apply_transfers(integer) IS 'Applies pending inbound transfers into the local copies and outbox (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_retry_quarantined(text, bigint) IS 'Puts a quarantined inbound transfer back to pending (contract §15, issue 15)';
COMMENT ON FUNCTION im.conversation_heads(bigint[]) IS 'Authoritative heads of the conversations this node owns (contract §15, issue 15)';
COMMENT ON FUNCTION im.message_audience(bigint) IS 'The users contract §1 lets see a message, on its conversation node (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_message_status(bigint, bigint[]) IS 'message_status''s device rows for these users of this node, from its copies (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_message_facts(bigint, bigint[]) IS 'message_facts'' user rows for these users of this node, from its copies (contract §15, issue 15)';
COMMENT ON FUNCTION im.shard_received_positions(bigint[]) IS 'The conversation positions in these local users'' logs, for the cross-node check (contract §15, issue 15)';

COMMENT ON TABLE im.shard_config IS 'This node''s name and the 64-bucket node map; no row = not sharded (contract §15)';
COMMENT ON TABLE im.transfer_out IS 'Transfers this node''s fanout wrote for other nodes, kept until their applied record comes back (contract §15)';
COMMENT ON TABLE im.transfer_in IS 'Transfers received from other nodes by exact (source node, transfer id): pending, applied or quarantined (contract §15)';
COMMENT ON TABLE im.transfer_ack IS 'Applied records this node sends back to the transfers'' sources (contract §15)';
COMMENT ON FUNCTION im.transfer_out_arrive() IS 'Trigger: records a replicated transfer for this node in im.transfer_in and drops the row (contract §15)';
COMMENT ON FUNCTION im.transfer_ack_arrive() IS 'Trigger: deletes the acknowledged transfer on its source and drops the row (contract §15)';

-- issue 15's functions: SECURITY DEFINER, pinned search_path, no PUBLIC execute
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['shard_configure', 'shard_self',
                   'shard_pending', 'shard_apply_transfers', 'shard_retry_quarantined',
                   'conversation_heads', 'message_audience', 'shard_received_positions',
                   'shard_message_status', 'shard_message_facts',
                   'transfer_out_arrive', 'transfer_ack_arrive'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;



/*
 * ---- 1.5 -> 1.6.  The blocks below are appended verbatim, without this
 * file's \echo line, to the 1.5 full script to make im_sync--1.6.sql, so the
 * two reach the same catalog (test/suites/70-upgrade.sh compares them).
 */

-- ---- 1.5 -> 1.6 (issue 15, router checks): the node functions of the
-- router's cross-node §18.3 check, im.shard_expected_receipts (conversation
-- node) and im.shard_check_receipts (user node).  Helper shops' block; the
-- other issue-15 block (helper shnode) is separate.
--
-- The router's im.reconcile() asks each conversation node what its periods
-- say each member on another node may receive, for its newest processed
-- positions (bounded: max_positions, the newest outbox items by id), and
-- hands each destination its part; the destination compares that with its
-- users' logs and answers with reconcile rows named like the single node's
-- delivery audit (fanout_missing / fanout_extra).  A position whose
-- transfer to a node is not yet acknowledged (conversation side) or not
-- applied (user side: pending or quarantined) is not checked there: the
-- transfer checks report those.  The expected recipients are derived here
-- on their own, with the period predicate of reconcile.c's audit written
-- out, not fanout's: a checker must not share the code it checks.

-- Conversation node: one row per other node, `expected` a JSON array of
-- {e: source event id, c: conversation, s: msg_seq, k: kind, sh: a
-- shared_log position (marker, not an event), t: the event's created_at,
-- u: user, p: delivery scope}; one element with u = NULL per checked
-- position (so the destination also sees positions it must have no event
-- for), one per expected (user, period) placed on that node.
CREATE FUNCTION im.shard_expected_receipts(max_positions int DEFAULT 10000)
RETURNS TABLE(dest_node text, expected jsonb)
LANGUAGE sql STABLE AS $$
  WITH cfg AS (SELECT c.self_name, c.bucket_nodes FROM im.shard_config c),
  item AS (
    SELECT o.outbox_id, o.conversation_id, o.msg_seq, o.source_event_id, e.kind, e.created_at,
           (e.kind IN ('message', 'reaction', 'pin') AND e.mode OPERATOR(pg_catalog.=) 'shared_log') IS TRUE AS shared,
           COALESCE(t.msg_seq, e.msg_seq) AS vis_seq,
           CASE WHEN e.kind OPERATOR(pg_catalog.=) 'reaction' THEN e.msg_seq END AS own_seq
      FROM im.outbox o CROSS JOIN cfg
      JOIN im.event e ON e.message_id OPERATOR(pg_catalog.=) o.source_event_id
      LEFT JOIN im.event t ON t.message_id OPERATOR(pg_catalog.=) e.target_message_id
     WHERE o.state OPERATOR(pg_catalog.=) 'done' AND o.private_user_id IS NULL
       AND cfg.bucket_nodes[o.conversation_id OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1]
           OPERATOR(pg_catalog.=) cfg.self_name
     ORDER BY o.outbox_id DESC
     LIMIT $1),
  exp AS (
    SELECT i.outbox_id, p.user_id, p.membership_period_id AS scope
      FROM item i JOIN im.membership_period p ON p.conversation_id OPERATOR(pg_catalog.=) i.conversation_id
       AND p.join_seq OPERATOR(pg_catalog.<=) i.vis_seq
       AND (p.leave_seq IS NULL OR p.leave_seq OPERATOR(pg_catalog.>=) i.vis_seq)
       AND (i.own_seq IS NULL OR p.leave_seq IS NULL OR p.leave_seq OPERATOR(pg_catalog.>=) i.own_seq)
    UNION
    SELECT i.outbox_id, p.user_id, p.membership_period_id
      FROM item i JOIN im.membership_period p ON p.leave_event_id OPERATOR(pg_catalog.=) i.source_event_id
     WHERE i.kind OPERATOR(pg_catalog.=) 'leave'),
  dest AS (
    SELECT DISTINCT n AS dest_node FROM cfg, pg_catalog.unnest(cfg.bucket_nodes) n
     WHERE n OPERATOR(pg_catalog.<>) cfg.self_name),
  want AS (
    SELECT d.dest_node, i.outbox_id, NULL::bigint AS user_id, NULL::bigint AS scope
      FROM dest d CROSS JOIN item i
    UNION ALL
    SELECT cfg.bucket_nodes[x.user_id OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1], x.outbox_id, x.user_id, x.scope
      FROM exp x CROSS JOIN cfg
     WHERE cfg.bucket_nodes[x.user_id OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1]
           OPERATOR(pg_catalog.<>) cfg.self_name
       AND NOT EXISTS (SELECT 1 FROM im.fanout_quarantine q
                        WHERE q.outbox_id OPERATOR(pg_catalog.=) x.outbox_id
                          AND q.user_id OPERATOR(pg_catalog.=) x.user_id))
  SELECT w.dest_node,
         pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
             'e', i.source_event_id, 'c', i.conversation_id, 's', i.msg_seq, 'k', i.kind,
             'sh', i.shared, 't', i.created_at, 'u', w.user_id, 'p', w.scope)
           ORDER BY i.outbox_id, w.user_id NULLS FIRST, w.scope)
    FROM want w JOIN item i ON i.outbox_id OPERATOR(pg_catalog.=) w.outbox_id
   WHERE NOT EXISTS (SELECT 1 FROM im.transfer_out tr
                      WHERE tr.outbox_id OPERATOR(pg_catalog.=) w.outbox_id
                        AND tr.dest_node OPERATOR(pg_catalog.=) w.dest_node)
   GROUP BY w.dest_node
   ORDER BY w.dest_node
$$;

-- User node: compares shard_expected_receipts' part for this node (from
-- conversation node $1) with the logs of the users placed here.  Rows as
-- im.reconcile()'s: fanout_missing (error) for an expected (user, period)
-- without its event — unless the position is a shared_log one whose marker
-- reaches it, or the user's log was collected past the event (GC'd history
-- is not checked, as on one node) — and fanout_extra (critical) for an
-- event of a checked position nobody's period calls for.
CREATE FUNCTION im.shard_check_receipts(source_node text, expected jsonb)
RETURNS TABLE(check_name text, severity text, conversation_id bigint, user_id bigint, detail jsonb)
LANGUAGE sql STABLE AS $$
  WITH cfg AS (SELECT c.self_name, c.bucket_nodes FROM im.shard_config c),
  x AS (
    SELECT * FROM pg_catalog.jsonb_to_recordset($2)
        AS x(e bigint, c bigint, s bigint, k text, sh boolean, t timestamptz, u bigint, p bigint)),
  pos AS (
    SELECT DISTINCT ON (x.e) x.e, x.c, x.s, x.k, x.sh, x.t FROM x
     WHERE NOT EXISTS (SELECT 1 FROM im.transfer_in ti
                        WHERE ti.source_node OPERATOR(pg_catalog.=) $1
                          AND ti.source_event_id OPERATOR(pg_catalog.=) x.e
                          AND ti.state OPERATOR(pg_catalog.<>) 'applied')
     ORDER BY x.e),
  exp AS (
    SELECT x.u, x.e, x.p FROM x CROSS JOIN cfg
     WHERE x.u IS NOT NULL
       AND cfg.bucket_nodes[x.u OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1] OPERATOR(pg_catalog.=) cfg.self_name),
  act AS (
    SELECT b.user_id AS u, b.source_event_id AS e, b.delivery_scope AS p FROM im.inbox b
     WHERE b.source_event_id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT pos.e FROM pos))),
  cmp AS (
    SELECT COALESCE(w.u, a.u) AS u, COALESCE(w.e, a.e) AS e, COALESCE(w.p, a.p) AS p,
           w.u IS NOT NULL AS expected, a.u IS NOT NULL AS delivered
      FROM exp w FULL JOIN act a ON a.u OPERATOR(pg_catalog.=) w.u AND a.e OPERATOR(pg_catalog.=) w.e
       AND a.p OPERATOR(pg_catalog.=) w.p)
  SELECT CASE WHEN m.expected THEN 'fanout_missing' ELSE 'fanout_extra' END,
         CASE WHEN m.expected THEN 'error' ELSE 'critical' END,
         pos.c, m.u,
         pg_catalog.jsonb_build_object('source_event_id', pos.e, 'msg_seq', pos.s, 'delivery_scope', m.p,
                                       'kind', pos.k, 'conversation_node', $1)
    FROM cmp m JOIN pos ON pos.e OPERATOR(pg_catalog.=) m.e
   WHERE m.expected IS DISTINCT FROM m.delivered
     AND NOT (m.expected AND pos.sh AND EXISTS (
           SELECT 1 FROM im.user_conversation uc
            WHERE uc.user_id OPERATOR(pg_catalog.=) m.u AND uc.conversation_id OPERATOR(pg_catalog.=) pos.c
              AND uc.dirty_target_msg_seq OPERATOR(pg_catalog.>=) pos.s))
     AND NOT (m.expected AND EXISTS (
           SELECT 1 FROM im.user_head h
            WHERE h.user_id OPERATOR(pg_catalog.=) m.u AND h.gc_floor OPERATOR(pg_catalog.>) 0
              AND NOT COALESCE((SELECT pg_catalog.min(b.created_at) FROM im.inbox b
                                 WHERE b.user_id OPERATOR(pg_catalog.=) m.u) OPERATOR(pg_catalog.<) pos.t, false)))
   ORDER BY pos.c, m.u, pos.s, m.p
$$;

COMMENT ON FUNCTION im.shard_expected_receipts(integer) IS 'What this conversation node''s periods say users on each other node may receive, for its newest processed positions: the router''s cross-node check (contract §15, §18.3, issue 15)';
COMMENT ON FUNCTION im.shard_check_receipts(text, jsonb) IS 'This user node''s logs against shard_expected_receipts'' part for it: fanout_missing / fanout_extra rows (contract §15, §18.3, issue 15)';

-- issue 15 (router checks): SECURITY DEFINER, pinned search_path, no PUBLIC execute
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['shard_expected_receipts', 'shard_check_receipts'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;
-- ---- 1.5 -> 1.6 (issue 10): one CHECK per send-path table, its rule in C
-- PostgreSQL reads each table CHECK from its stored node text and plans it
-- again at every INSERT or UPDATE statement (ExecRelCheck): the event's three
-- CHECKs (4.5 kB of node text) at every send, the conversation's at every
-- head UPDATE.  Each becomes one CHECK calling an immutable C function with
-- the columns as arguments (row_rules.c: the same rules, NULL passes as
-- before).  Adding a constraint validates the existing rows (one scan of
-- each table under its ACCESS EXCLUSIVE lock).  The functions run no SQL, so
-- they are not SECURITY DEFINER (a pinned search_path would cost a GUC
-- save and restore per row); PUBLIC cannot execute them.
CREATE FUNCTION im.event_fields_valid(kind text, sender bigint, idempotency_key text,
                                      target bigint, reply_to bigint, pin bigint) RETURNS boolean
AS 'MODULE_PATHNAME', 'im_event_fields_valid' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION im.conversation_pair_valid(kind text, lo bigint, hi bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'im_conversation_pair_valid' LANGUAGE C IMMUTABLE PARALLEL SAFE;
REVOKE ALL ON FUNCTION im.event_fields_valid(text, bigint, text, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.conversation_pair_valid(text, bigint, bigint) FROM PUBLIC;
COMMENT ON FUNCTION im.event_fields_valid(text, bigint, text, bigint, bigint, bigint) IS 'CHECK event_kind_fields: which kinds carry an idempotency key, a target, a reply or pin target (contract §3, §14)';
COMMENT ON FUNCTION im.conversation_pair_valid(text, bigint, bigint) IS 'CHECK conversation_direct_pair: a direct conversation names its ordered pair, a group none (contract §1)';
ALTER TABLE im.event
    DROP CONSTRAINT event_kind_fields,
    DROP CONSTRAINT event_reply_to_check,
    DROP CONSTRAINT event_pin_check,
    ADD CONSTRAINT event_kind_fields CHECK (im.event_fields_valid(kind, sender_id, client_msg_id,
        target_message_id, reply_to_message_id, pin_message_id));
ALTER TABLE im.conversation
    DROP CONSTRAINT conversation_direct_pair,
    ADD CONSTRAINT conversation_direct_pair CHECK (im.conversation_pair_valid(kind, direct_user_lo,
        direct_user_hi));

-- ---- 1.5 -> 1.6 (issue 10): no foreign key on im.event.target_message_id
-- Its check was an AFTER trigger queued and fired for every event insert
-- (every send), and on a recall, edit or reaction a FOR KEY SHARE lock of
-- the target (a WAL record and a dirtied page).  The target is checked
-- under the conversation lock by the function that writes the event
-- (send.c check_target, relation.c), events are never deleted, and
-- im.reconcile() reports a missing or foreign target (relation_target_mismatch),
-- as for reply and pin targets since 1.3.
ALTER TABLE im.event DROP CONSTRAINT event_target_message_id_fkey;

-- ---- 1.5 -> 1.6 (issue 15): copies leave the sender's idempotency key
-- Contract §15 keys a sharded installation's idempotency by (sender,
-- conversation, client_msg_id), so a sender may reuse a client_msg_id in
-- conversations on two nodes; a user node holding copies of both must take
-- both.  The key (sender_id, client_msg_id) now covers exactly the events
-- that can answer a retry: those carrying their request's digest, i.e. the
-- events this node accepted itself.  A copy of a remote conversation's
-- event never carries one (transfer_in.c drops it: retries and IS409 are
-- answered by the conversation's own node), so copies never take part in
-- the key, while on a single node and for a node's own conversations it is
-- exactly the old UNIQUE constraint (every keyed event has a digest;
-- send.c has always answered IS409 for one without).  Copies received
-- before 1.6 lose their digest here.
UPDATE im.event e SET request_digest = NULL
  FROM im.shard_config c
 WHERE e.request_digest IS NOT NULL
   AND c.bucket_nodes[(e.conversation_id OPERATOR(pg_catalog.%) 64) OPERATOR(pg_catalog.+) 1]
       OPERATOR(pg_catalog.<>) c.self_name;
ALTER TABLE im.event DROP CONSTRAINT event_sender_id_client_msg_id_key;
CREATE UNIQUE INDEX event_sender_id_client_msg_id_key ON im.event (sender_id, client_msg_id)
    WHERE request_digest IS NOT NULL;
COMMENT ON INDEX im.event_sender_id_client_msg_id_key IS 'The idempotency key (sender, client_msg_id) of the events this node accepted; copies carry no digest (contract §3, §15)';

-- ---- 1.5 -> 1.6 (issue 15): an ex-member's conversation_list shows the mode in force now
-- One node's conversation_list reads the conversation row: the current
-- head and mode, for members and ex-members alike.  A mode switch of a
-- group with no member left on a node reaches no copy there, so the router
-- takes both from the conversation's node (im.conversation_heads gave the
-- head only; it stays for the 1.5 router API).
CREATE FUNCTION im.conversation_current(conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, head_msg_seq bigint, mode text)
AS 'MODULE_PATHNAME', 'im_conversation_current' LANGUAGE C;
COMMENT ON FUNCTION im.conversation_current(bigint[]) IS 'Authoritative head and mode of the conversations this node owns, for the router''s conversation_list (contract §15, issue 15)';

DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['conversation_current'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;

-- ---- 1.6 -> 1.7 (issue 15, quarantine order): an inbound transfer that
-- fails to apply is retried with fanout's backoff (attempts,
-- transient_failures, next_attempt_at as on im.outbox) and is 'dead' after
-- im_sync.fanout_max_attempts charged attempts; while quarantined it holds
-- the later transfers of its conversation on this node (transfer_in.c,
-- transfer.h).  A quarantine recorded before 1.7 has no next_attempt_at:
-- it holds nothing and waits for im.shard_retry_quarantined, as in 1.6.
-- held_at: when a pending transfer was found held behind a quarantined one
-- (its applied record goes at the next pass, once the mark is on the
-- synchronous standby: the failover window below).
ALTER TABLE im.transfer_in
    ADD COLUMN attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN transient_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN next_attempt_at timestamptz,
    ADD COLUMN held_at timestamptz,
    DROP CONSTRAINT transfer_in_state_check,
    ADD CONSTRAINT transfer_in_state_check
        CHECK (state IN ('pending', 'applied', 'quarantined', 'dead'));
CREATE INDEX transfer_in_quarantined_order_idx ON im.transfer_in (conversation_id, msg_seq, transfer_id)
    WHERE state = 'quarantined';
COMMENT ON TABLE im.transfer_in IS 'Transfers received from other nodes by exact (source node, transfer id): pending, applied, quarantined (retried; holds the later ones of its conversation) or dead (contract §15)';
COMMENT ON FUNCTION im.shard_retry_quarantined(text, bigint) IS 'Puts a quarantined or dead inbound transfer back to pending, attempts cleared (contract §15, issue 15)';

-- ---- 1.6 -> 1.7 (issue 15, failover window): a settled transfer's applied
-- record is written by a later apply pass, once the settling transaction is
-- visible (so on the synchronous standby): transfer_in.applied_at stays NULL
-- until then (transfer_ack.c, im_transfer_ack_release); this index finds them.
CREATE INDEX transfer_in_ack_due_idx ON im.transfer_in (source_node, transfer_id)
    WHERE state <> 'pending' AND applied_at IS NULL;
COMMENT ON COLUMN im.transfer_in.applied_at IS 'When its applied record was written (NULL while pending, and while settled but not yet on the synchronous standby)';

-- ---- 1.7 -> 1.8 (issue 10): no table CHECK is planned under the conversation lock
-- PostgreSQL reads a table's CHECKs from their node text and plans them at
-- the start of every INSERT or UPDATE statement (ExecRelCheck), and a send
-- runs two such statements while it holds its conversation's row lock: the
-- head UPDATE, which paid for conversation_direct_pair although it never
-- writes the columns that CHECK reads, and the outbox insert, which paid
-- for outbox_check (about 5 us each of the 190 us a send spends under the
-- lock on one client, and more when eight share two cores).
-- The pair rule becomes the AFTER trigger conversation_direct_pair on the
-- columns it reads: every insert and every UPDATE naming kind,
-- direct_user_lo or direct_user_hi runs it, a head UPDATE never does (an
-- AFTER trigger, because a BEFORE UPDATE row trigger locks the row first).
-- It answers with the CHECK's SQLSTATE (23514) and message, and is enabled
-- ALWAYS, so a replica session role cannot skip it any more than the CHECK.
-- The outbox's shape rule (a position item has its msg_seq, a private
-- event's item its user and no msg_seq) is kept by the three statements
-- that write the outbox (append.c, read_state.c, transfer_in.c) and checked
-- by im.reconcile() (outbox_item_malformed), as im.event's targets are
-- since 1.6.
CREATE FUNCTION im.conversation_pair_check() RETURNS trigger
AS 'MODULE_PATHNAME', 'im_conversation_pair_check' LANGUAGE C;
REVOKE ALL ON FUNCTION im.conversation_pair_check() FROM PUBLIC;
COMMENT ON FUNCTION im.conversation_pair_check() IS 'Trigger conversation_direct_pair: a direct conversation names its ordered pair, a group none (contract §1)';
ALTER TABLE im.conversation DROP CONSTRAINT conversation_direct_pair;
CREATE TRIGGER conversation_direct_pair
    AFTER INSERT OR UPDATE OF kind, direct_user_lo, direct_user_hi ON im.conversation
    FOR EACH ROW EXECUTE FUNCTION im.conversation_pair_check();
ALTER TABLE im.conversation ENABLE ALWAYS TRIGGER conversation_direct_pair;
ALTER TABLE im.outbox DROP CONSTRAINT outbox_check;

-- ---- second hardening round (README "Security")

-- ---- trust between nodes: refused arrivals (transfer_trust.c)
-- A replicated transfer or ack that fails the arrival checks (its
-- subscription does not name its source or acker, it claims this node, the
-- map places its conversation elsewhere, it is addressed to another node) is
-- dropped in the apply worker — an error there would stop the subscription
-- for good — with a WARNING and a row here; reconcile reports each row
-- (transfer_refused) until an operator deletes it.  Nothing of a refused row
-- is applied; a real transfer refused by mistake stays on its source,
-- unacknowledged.
CREATE TABLE im.transfer_refused (
    refused_id      bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    refused_at      timestamptz NOT NULL DEFAULT now(),
    kind            text   NOT NULL CHECK (kind IN ('transfer', 'ack')),
    subscription    text,             -- the subscription whose apply worker delivered it
    delivered_by    text,             -- the node that subscription names (NULL: none)
    source_node     text,
    dest_node       text,             -- a transfer's
    applied_by      text,             -- an ack's
    transfer_id     bigint NOT NULL,
    conversation_id bigint,           -- a transfer's
    reason          text   NOT NULL
);
SELECT pg_catalog.pg_extension_config_dump('im.transfer_refused', '');
SELECT pg_catalog.pg_extension_config_dump('im.transfer_refused_refused_id_seq', '');
COMMENT ON TABLE im.transfer_refused IS 'Replicated transfers and acks this node refused at arrival, with the reason (contract §15)';
