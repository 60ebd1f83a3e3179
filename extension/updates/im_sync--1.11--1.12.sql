\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.12'" to load this file. \quit

-- ---- moderator takedowns (contract §17): the `takedown` kind, the
-- target's taken_down flag, the evidence table and the moderation functions
--   * im.event_kind accepts 'takedown'; im.event gains taken_down at the
--     end of the row (false: no existing row is taken down);
--   * im.takedown_evidence is new;
--   * im.takedown_message, im.moderation_evidence, im.moderation_log are new
--     (no PUBLIC execute).
-- (one drop and add for every kind this version adds: role and mute below too)
ALTER DOMAIN im.event_kind DROP CONSTRAINT event_kind_check;
ALTER DOMAIN im.event_kind ADD CONSTRAINT event_kind_check
    CHECK (VALUE IN ('message', 'create', 'join', 'leave', 'recall', 'edit', 'mode', 'reaction', 'pin',
                     'role', 'mute', 'takedown'));
ALTER TABLE im.event ADD COLUMN taken_down boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN im.event.recalled IS 'A tombstone: recalled by its sender, or taken down (then taken_down is true too and readers show recalled false) (contract §3, §17)';
COMMENT ON COLUMN im.event.taken_down IS 'Taken down by a moderator: a tombstone for every reader, its body kept apart in im.takedown_evidence (contract §17)';

-- The body of a taken-down message, kept apart from im.event: only the
-- extension owner reads this table (no grant to anyone), the moderation
-- role through im.moderation_evidence.  One row per target; the row is also
-- the takedown's idempotency key (moderator, client_msg_id): a moderator has
-- no user id, so the key lives in the moderator's own namespace
-- (extension/doc/decisions.md).  Maintenance erases the body (body NULL,
-- erased_at set) once taken_down_at is older than im_sync.evidence_retention,
-- unless a legal hold covers it; the row stays, so a retry is still answered.
CREATE TABLE im.takedown_evidence (
    target_message_id   bigint PRIMARY KEY,
    takedown_message_id bigint NOT NULL UNIQUE,
    conversation_id     bigint NOT NULL,
    sender_id           bigint,
    moderator           text NOT NULL,
    client_msg_id       text NOT NULL,
    request_digest      bytea NOT NULL,
    body                jsonb,
    taken_down_at       timestamptz NOT NULL DEFAULT now(),
    erased_at           timestamptz,
    UNIQUE (moderator, client_msg_id),
    CHECK (body IS NULL OR erased_at IS NULL)
);
-- Evidence expiry (maintenance.c) takes the oldest unerased bodies first.
CREATE INDEX takedown_evidence_erase_idx ON im.takedown_evidence (taken_down_at)
    WHERE erased_at IS NULL;
SELECT pg_catalog.pg_extension_config_dump('im.takedown_evidence', '');
COMMENT ON TABLE im.takedown_evidence IS 'Bodies of taken-down messages, readable by the moderation role only through moderation_evidence, erased after im_sync.evidence_retention; the takedown''s idempotency key (contract §17)';

CREATE FUNCTION im.takedown_message(moderator text, conversation_id bigint, target_message_id bigint,
                                    reason text, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_takedown_message' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.moderation_evidence(target_message_id bigint)
RETURNS TABLE(conversation_id bigint, sender_id bigint, body jsonb,
              taken_down_at timestamptz, erase_after timestamptz)
AS 'MODULE_PATHNAME', 'im_moderation_evidence' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.moderation_log(after_id bigint DEFAULT 0, page_limit int DEFAULT 100)
RETURNS TABLE(id bigint, at timestamptz, moderator text, action text,
              user_id bigint, conversation_id bigint, message_id bigint,
              reason text)
AS 'MODULE_PATHNAME', 'im_moderation_log' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
COMMENT ON FUNCTION im.takedown_message(text, bigint, bigint, text, text) IS 'A moderator''s takedown: a takedown position, the target a tombstone for every reader, its body kept as evidence (contract §17)';
COMMENT ON FUNCTION im.moderation_evidence(bigint) IS 'The kept body of a taken-down message, NULL once erased (contract §17); for the moderation role only';
COMMENT ON FUNCTION im.moderation_log(bigint, integer) IS 'Pages of the moderation actions of im.audit, oldest first (contract §17)';
REVOKE ALL ON FUNCTION im.takedown_message(text, bigint, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.moderation_evidence(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.moderation_log(bigint, integer) FROM PUBLIC;
-- ---- receipts across nodes (contract §20)
-- A receipt is produced on the reader's node and carried to the sender's
-- node by a transfer (user/receipt.c, sharding.md "Receipts"): a direct
-- conversation's cumulative seqs, a fanout group's per-node parts.
ALTER TABLE im.receipt_pending ADD COLUMN read_hidden boolean NOT NULL DEFAULT false;
CREATE TABLE im.receipt_part (
    message_id      bigint NOT NULL,
    node_name       text   NOT NULL,
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
COMMENT ON TABLE im.receipt_part IS 'Per message of a fanout group, the receipt counts another node carried for its own members (contract §15, §20)';
COMMENT ON COLUMN im.receipt_pending.read_hidden IS 'A carried direct receipt''s reader turned read receipts off: no read state is emitted (contract §20)';

-- ---- roles, mutes, removals and bans in groups (contract §17)
--   * the event kinds role and mute (im.event_kind: see above); a leave may carry its remover's key
--     (the row rule is C: im.event_fields_valid, nothing to change here);
--   * im.membership_period gains role and muted_until at the end of the
--     row; every group's earliest active member (lowest join_seq, then
--     period id: the creator was not recorded before) becomes its owner;
--   * im.conversation_ban; the four functions set_member_role,
--     mute_member, remove_member, unban_member;
--   * im.conversation_list's result gains head_stale, my_role, muted_until:
--     DROP + CREATE with the old owner and ACL carried over (copied into
--     pg_proc after the REVOKE records the extension's initial privileges).
-- (im.event_kind's CHECK accepts role and mute: the takedown section's
-- drop and add above)

ALTER TABLE im.membership_period
    ADD COLUMN role text DEFAULT 'member'
        CONSTRAINT membership_period_role_check CHECK (role IN ('owner', 'admin', 'member')),
    ADD COLUMN muted_until timestamptz;
UPDATE im.membership_period p SET role = 'owner'
WHERE p.membership_period_id IN (
    SELECT DISTINCT ON (q.conversation_id) q.membership_period_id
    FROM im.membership_period q
    JOIN im.conversation c ON c.conversation_id OPERATOR(pg_catalog.=) q.conversation_id
    WHERE c.kind OPERATOR(pg_catalog.=) 'group' AND q.leave_seq IS NULL
    ORDER BY q.conversation_id, q.join_seq, q.membership_period_id);
COMMENT ON COLUMN im.membership_period.role IS 'The member''s role in a group during this period: owner, admin or member (contract §17)';
COMMENT ON COLUMN im.membership_period.muted_until IS 'The end of the member''s mute; a write before it is IS403 (contract §17)';

CREATE TABLE im.conversation_ban (
    conversation_id  bigint NOT NULL,
    user_id          bigint NOT NULL,
    banned_by        bigint NOT NULL,
    removal_event_id bigint NOT NULL,
    banned_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, user_id)
);
SELECT pg_catalog.pg_extension_config_dump('im.conversation_ban', '');
REVOKE ALL ON TABLE im.conversation_ban FROM PUBLIC;
COMMENT ON TABLE im.conversation_ban IS 'Users removed with a ban: join_conversation refuses them until unban_member (contract §17)';

CREATE FUNCTION im.set_member_role(actor_id bigint, conversation_id bigint, user_id bigint,
                                   role text, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_set_member_role' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.mute_member(actor_id bigint, conversation_id bigint, user_id bigint,
                               muted_until timestamptz, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_mute_member' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.remove_member(actor_id bigint, conversation_id bigint, user_id bigint,
                                 ban boolean, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_remove_member' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.unban_member(actor_id bigint, conversation_id bigint, user_id bigint)
RETURNS TABLE(unbanned boolean)
AS 'MODULE_PATHNAME', 'im_unban_member' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
REVOKE ALL ON FUNCTION im.set_member_role(bigint, bigint, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.mute_member(bigint, bigint, bigint, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.remove_member(bigint, bigint, bigint, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.unban_member(bigint, bigint, bigint) FROM PUBLIC;
COMMENT ON FUNCTION im.set_member_role(bigint, bigint, bigint, text, text) IS 'The owner sets a member''s role or hands over ownership: a role position (contract §17)';
COMMENT ON FUNCTION im.mute_member(bigint, bigint, bigint, timestamptz, text) IS 'Mutes a member until a time, NULL or a past time unmutes: a mute position (contract §17)';
COMMENT ON FUNCTION im.remove_member(bigint, bigint, bigint, boolean, text) IS 'Removes a member, optionally banned: a leave position naming who removed them (contract §17)';
COMMENT ON FUNCTION im.unban_member(bigint, bigint, bigint) IS 'Lifts a ban so the user may join again (contract §17)';

SELECT pg_catalog.set_config('im_sync_upgrade.conversation_list_owner', p.proowner::pg_catalog.text, true),
       pg_catalog.set_config('im_sync_upgrade.conversation_list_acl', COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p
WHERE p.oid OPERATOR(pg_catalog.=) 'im.conversation_list(bigint, integer, bigint)'::pg_catalog.regprocedure;
DROP FUNCTION im.conversation_list(bigint, integer, bigint);
CREATE FUNCTION im.conversation_list(user_id bigint, page_limit int DEFAULT 100,
                                     after_conversation_id bigint DEFAULT NULL)
RETURNS TABLE(conversation_id bigint, kind text, mode text,
              last_msg_seq bigint, read_msg_seq bigint, unread_count bigint,
              dirty_target_msg_seq bigint, dirty_version bigint,
              head_msg_seq bigint, head_stale boolean, my_role text,
              muted_until timestamptz)
AS 'MODULE_PATHNAME', 'im_conversation_list' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
REVOKE ALL ON FUNCTION im.conversation_list(bigint, integer, bigint) FROM PUBLIC;
DO $do$
DECLARE
    old_owner oid;
    old_acl aclitem[];
BEGIN
    old_owner := pg_catalog.current_setting('im_sync_upgrade.conversation_list_owner')::pg_catalog.oid;
    old_acl := NULLIF(pg_catalog.current_setting('im_sync_upgrade.conversation_list_acl'), '')::pg_catalog.aclitem[];
    IF old_owner OPERATOR(pg_catalog.<>) (SELECT p.proowner FROM pg_catalog.pg_proc p
            WHERE p.oid OPERATOR(pg_catalog.=) 'im.conversation_list(bigint, integer, bigint)'::pg_catalog.regprocedure) THEN
        EXECUTE pg_catalog.format('ALTER FUNCTION im.conversation_list(bigint, integer, bigint) OWNER TO %I',
                                  old_owner::pg_catalog.regrole);
    END IF;
    UPDATE pg_catalog.pg_proc SET proacl = old_acl
    WHERE oid OPERATOR(pg_catalog.=) 'im.conversation_list(bigint, integer, bigint)'::pg_catalog.regprocedure;
END
$do$;
COMMENT ON FUNCTION im.conversation_list(bigint, integer, bigint) IS 'The user''s conversations with positions, unread counts and dirty markers (contract §7)';

-- contract §17 on several nodes: a user's role and mute in conversations
-- this node owns (the authoritative periods), for the router's
-- conversation_list (the user node's copies of periods keep the role they
-- were copied with).  NULL role: no open period or a direct conversation.
CREATE FUNCTION im.shard_member_roles(user_id bigint, conversation_ids bigint[])
RETURNS TABLE(conversation_id bigint, my_role text, muted_until timestamptz)
AS 'MODULE_PATHNAME', 'im_shard_member_roles' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
COMMENT ON FUNCTION im.shard_member_roles(bigint, bigint[]) IS 'A user''s role and mute in force in conversations this node owns, for the router''s conversation_list (contract §15, §17)';
REVOKE ALL ON FUNCTION im.shard_member_roles(bigint, bigint[]) FROM PUBLIC;

-- ---- account standing and the device cap (contract §17)
--   * im.user_suspension (one row per suspended user) with its statement
--     trigger that tells the checks' shared memory (standing.c);
--   * im.suspend_user and im.reinstate_user;
--   * im.device_session gains a trailing account_state column (active |
--     suspended): its result type changes, so it is dropped and created
--     again with the same attributes, comment, owner and ACL (the ACL is
--     copied into pg_proc, not GRANTed, so a DBA's grants survive and are
--     not recorded as the extension's initial privileges).
--   The device cap is a setting (im_sync.max_devices_per_user): no catalog.
CREATE TABLE im.user_suspension (
    user_id         bigint PRIMARY KEY,
    suspended_at    timestamptz NOT NULL DEFAULT now(),
    suspended_until timestamptz,       -- NULL: until reinstated
    moderator       text NOT NULL,
    reason          text
);
SELECT pg_catalog.pg_extension_config_dump('im.user_suspension', '');
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
REVOKE ALL ON FUNCTION im.user_suspension_written() FROM PUBLIC;
REVOKE ALL ON FUNCTION im.suspend_user(text, bigint, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.reinstate_user(text, bigint) FROM PUBLIC;
COMMENT ON TABLE im.user_suspension IS 'Suspended accounts: active while suspended_until is NULL or in the future (contract §17)';
COMMENT ON FUNCTION im.user_suspension_written() IS 'Tells the account-standing checks that a suspension is being written (contract §17)';
COMMENT ON FUNCTION im.suspend_user(text, bigint, timestamp with time zone, text) IS 'Suspends an account until a time or until reinstated: its calls fail with IS403, its sessions close (contract §17)';
COMMENT ON FUNCTION im.reinstate_user(text, bigint) IS 'Lifts an account''s suspension (contract §17)';

SELECT pg_catalog.set_config('im_sync_upgrade.device_session_owner', p.proowner::pg_catalog.text, true),
       pg_catalog.set_config('im_sync_upgrade.device_session_acl', COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p
WHERE p.oid OPERATOR(pg_catalog.=) 'im.device_session(bigint, text, bigint)'::pg_catalog.regprocedure;
DROP FUNCTION im.device_session(bigint, text, bigint);
CREATE FUNCTION im.device_session(user_id bigint, device_id text, connection_epoch bigint)
RETURNS TABLE(state text, sync_generation int, server_acked_sync_seq bigint,
              high_watermark bigint, current boolean, account_state text)
AS 'MODULE_PATHNAME', 'im_device_session' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
REVOKE ALL ON FUNCTION im.device_session(bigint, text, bigint) FROM PUBLIC;
DO $do$
DECLARE
    old_owner oid;
    old_acl aclitem[];
BEGIN
    old_owner := pg_catalog.current_setting('im_sync_upgrade.device_session_owner')::pg_catalog.oid;
    old_acl := NULLIF(pg_catalog.current_setting('im_sync_upgrade.device_session_acl'), '')::pg_catalog.aclitem[];
    IF old_owner OPERATOR(pg_catalog.<>) (SELECT p.proowner FROM pg_catalog.pg_proc p
            WHERE p.oid OPERATOR(pg_catalog.=) 'im.device_session(bigint, text, bigint)'::pg_catalog.regprocedure) THEN
        EXECUTE pg_catalog.format('ALTER FUNCTION im.device_session(bigint, text, bigint) OWNER TO %I',
                                  old_owner::pg_catalog.regrole);
    END IF;
    UPDATE pg_catalog.pg_proc SET proacl = old_acl
    WHERE oid OPERATOR(pg_catalog.=) 'im.device_session(bigint, text, bigint)'::pg_catalog.regprocedure;
END
$do$;
COMMENT ON FUNCTION im.device_session(bigint, text, bigint) IS 'A device''s sync state at connect, fencing older connection epochs, and its account''s standing (contract §5, §17)';
