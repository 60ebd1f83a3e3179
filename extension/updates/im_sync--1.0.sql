\echo Use "CREATE EXTENSION im_sync" to load this file. \quit

/*
 * im_sync 1.0 — schema.  Tables are the extension's internals; the outward
 * surface is the set of functions at the end of this file (CONTRACT.md).
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
CREATE TABLE im.conversation (
    conversation_id bigint PRIMARY KEY DEFAULT nextval('im.conversation_id_seq'),
    kind            text   NOT NULL CHECK (kind IN ('direct', 'group')),
    mode            text   NOT NULL DEFAULT 'fanout' CHECK (mode IN ('fanout', 'shared_log')),
    head_msg_seq    bigint NOT NULL DEFAULT 0 CHECK (head_msg_seq >= 0),
    direct_user_lo  bigint,
    direct_user_hi  bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'direct') = (direct_user_lo IS NOT NULL AND direct_user_hi IS NOT NULL)),
    CHECK (direct_user_lo < direct_user_hi),
    UNIQUE (direct_user_lo, direct_user_hi)
);

-- Every conversation position: messages and control events.  A recall sets
-- the target's body to NULL (tombstone, §12.4) and marks edits of it recalled.
CREATE TABLE im.event (
    message_id        bigint PRIMARY KEY DEFAULT nextval('im.event_id_seq'),
    conversation_id   bigint NOT NULL REFERENCES im.conversation,
    msg_seq           bigint NOT NULL CHECK (msg_seq >= 1),
    kind              text   NOT NULL CHECK (kind IN ('message', 'create', 'join', 'leave', 'recall', 'edit', 'mode')),
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
    CHECK ((client_msg_id IS NULL) = (sender_id IS NULL OR kind IN ('create', 'join', 'leave', 'mode'))),
    CHECK ((target_message_id IS NOT NULL) = (kind IN ('recall', 'edit')))
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
    state            text   NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'dead')),
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

-- Counters that must be durable (GC deletions, resets, refused stale ACKs…);
-- updated in the transaction that does the counted thing.
CREATE TABLE im.counter (
    name   text PRIMARY KEY,
    value  bigint NOT NULL DEFAULT 0
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
SELECT pg_catalog.pg_extension_config_dump('im.counter', '');
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
-- EXECUTE from PUBLIC (contract §12).  Done in one loop so a function added
-- above cannot be forgotten.
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
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
-- SECURITY INVOKER on purpose: it is created after the loop above.
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
