\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.3'" to load this file. \quit

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
