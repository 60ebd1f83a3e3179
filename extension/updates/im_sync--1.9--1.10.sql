\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.10'" to load this file. \quit


-- ---- trace ids (contract §21): a trailing trace_id argument on every
-- write, kept with the event and its outbox item
--   * im.event and im.outbox gain a nullable trace_id column at the end of
--     the row (a private event's trace id is kept on its outbox item only);
--   * im.send_message, im.recall_message, im.edit_message, im.react,
--     im.pin_message, im.report_read, im.clear_dirty and im.delete_for_me
--     are each replaced by the same function with a trailing
--     `trace_id text DEFAULT NULL`: same result and attributes, comment,
--     owner and ACL carried over, so calls with the older argument lists
--     resolve to the one function (never 42725).
ALTER TABLE im.event ADD COLUMN trace_id text;
ALTER TABLE im.outbox ADD COLUMN trace_id text;
COMMENT ON COLUMN im.event.trace_id IS 'The trace id of the request that wrote this position, NULL for none (contract §21)';
COMMENT ON COLUMN im.outbox.trace_id IS 'The trace id of the request that queued this item, NULL for none; the workers log it (contract §21)';

-- Each replaced function's owner and ACL, kept for the block after the
-- CREATEs.  The ACL is copied into pg_proc directly, not by GRANT: a GRANT
-- inside an extension script would record the DBA's grants as the
-- extension's initial privileges.
SELECT pg_catalog.set_config('im_sync_upgrade.trace_' || p.proname || '_owner', p.proowner::pg_catalog.text, true),
       pg_catalog.set_config('im_sync_upgrade.trace_' || p.proname || '_acl', COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p
WHERE p.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
    'im.send_message(bigint, bigint, text, jsonb, text, bigint)'::pg_catalog.regprocedure,
    'im.recall_message(bigint, bigint, text, bigint)'::pg_catalog.regprocedure,
    'im.edit_message(bigint, bigint, text, bigint, jsonb)'::pg_catalog.regprocedure,
    'im.react(bigint, bigint, bigint, text, boolean, text)'::pg_catalog.regprocedure,
    'im.pin_message(bigint, bigint, bigint, boolean, text)'::pg_catalog.regprocedure,
    'im.report_read(bigint, bigint, bigint)'::pg_catalog.regprocedure,
    'im.clear_dirty(bigint, bigint, bigint, bigint)'::pg_catalog.regprocedure,
    'im.delete_for_me(bigint, bigint, bigint)'::pg_catalog.regprocedure]);

DROP FUNCTION im.send_message(bigint, bigint, text, jsonb, text, bigint);
DROP FUNCTION im.recall_message(bigint, bigint, text, bigint);
DROP FUNCTION im.edit_message(bigint, bigint, text, bigint, jsonb);
DROP FUNCTION im.react(bigint, bigint, bigint, text, boolean, text);
DROP FUNCTION im.pin_message(bigint, bigint, bigint, boolean, text);
DROP FUNCTION im.report_read(bigint, bigint, bigint);
DROP FUNCTION im.clear_dirty(bigint, bigint, bigint, bigint);
DROP FUNCTION im.delete_for_me(bigint, bigint, bigint);

CREATE FUNCTION im.send_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                body jsonb, content_type text DEFAULT 'text',
                                reply_to_message_id bigint DEFAULT NULL,
                                trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_send_message' LANGUAGE C;
CREATE FUNCTION im.recall_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                  target_message_id bigint, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_recall_message' LANGUAGE C;
CREATE FUNCTION im.edit_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                target_message_id bigint, body jsonb, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_edit_message' LANGUAGE C;
CREATE FUNCTION im.react(user_id bigint, conversation_id bigint, target_message_id bigint,
                         reaction text, present boolean, client_msg_id text,
                         trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_react' LANGUAGE C;
CREATE FUNCTION im.pin_message(user_id bigint, conversation_id bigint, target_message_id bigint,
                               pinned boolean, client_msg_id text, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_pin_message' LANGUAGE C;
CREATE FUNCTION im.report_read(user_id bigint, conversation_id bigint, read_to_seq bigint,
                               trace_id text DEFAULT NULL)
RETURNS TABLE(read_msg_seq bigint, unread_count bigint)
AS 'MODULE_PATHNAME', 'im_report_read' LANGUAGE C;
CREATE FUNCTION im.clear_dirty(user_id bigint, conversation_id bigint, observed_version bigint,
                               saved_last_msg_seq bigint, trace_id text DEFAULT NULL)
RETURNS TABLE(cleared boolean, dirty_target_msg_seq bigint, dirty_version bigint)
AS 'MODULE_PATHNAME', 'im_clear_dirty' LANGUAGE C;
CREATE FUNCTION im.delete_for_me(user_id bigint, conversation_id bigint, message_id bigint,
                                 trace_id text DEFAULT NULL)
RETURNS boolean AS 'MODULE_PATHNAME', 'im_delete_for_me' LANGUAGE C;

-- attributes of the API, then the old owner and ACL (after the REVOKE,
-- which also recorded the extension's initial privileges of the new
-- function)
DO $do$
DECLARE
    f regprocedure;
    old_owner oid;
    old_acl aclitem[];
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['send_message', 'recall_message',
                   'edit_message', 'react', 'pin_message', 'report_read', 'clear_dirty', 'delete_for_me'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        old_owner := NULLIF(pg_catalog.current_setting('im_sync_upgrade.trace_' ||
                        (SELECT p.proname FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) f) || '_owner'), '')::pg_catalog.oid;
        old_acl := NULLIF(pg_catalog.current_setting('im_sync_upgrade.trace_' ||
                        (SELECT p.proname FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) f) || '_acl'), '')::pg_catalog.aclitem[];
        IF old_owner OPERATOR(pg_catalog.<>) (SELECT p.proowner FROM pg_catalog.pg_proc p
                                              WHERE p.oid OPERATOR(pg_catalog.=) f) THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', f, old_owner::pg_catalog.regrole);
        END IF;
        UPDATE pg_catalog.pg_proc SET proacl = old_acl WHERE oid OPERATOR(pg_catalog.=) f;
    END LOOP;
END
$do$;

COMMENT ON FUNCTION im.send_message(bigint, bigint, text, jsonb, text, bigint, text) IS 'Appends a message (optionally a reply) at the next msg_seq, idempotent per (sender, client_msg_id): SEND_ACK (contract §3, §14)';
COMMENT ON FUNCTION im.recall_message(bigint, bigint, text, bigint, text) IS 'Recalls the sender''s message: a recall position and a tombstone (contract §3)';
COMMENT ON FUNCTION im.edit_message(bigint, bigint, text, bigint, jsonb, text) IS 'Appends an edit of the sender''s message (contract §3)';
COMMENT ON FUNCTION im.react(bigint, bigint, bigint, text, boolean, text, text) IS 'Sets or clears one reaction key of the caller on a message: a reaction position carrying the caller''s whole set (contract §14)';
COMMENT ON FUNCTION im.pin_message(bigint, bigint, bigint, boolean, text, text) IS 'Pins or unpins a message for the conversation: a pin position carrying the whole list (contract §14)';
COMMENT ON FUNCTION im.report_read(bigint, bigint, bigint, text) IS 'Moves the user''s read cursor forward and recounts unread (contract §7)';
COMMENT ON FUNCTION im.clear_dirty(bigint, bigint, bigint, bigint, text) IS 'Clears a large-group dirty marker the client has caught up with (contract §7)';
COMMENT ON FUNCTION im.delete_for_me(bigint, bigint, bigint, text) IS 'Deletes a message for the calling user only (contract §7)';

-- ---- push jobs carry the trace id of their message (contract §21)
-- im.push_job gains trace_id; im.claim_push_jobs returns it as a trailing
-- result column, so relays that name their columns keep working.  The
-- result type changes, so the function is dropped and created again with
-- the same attributes, comment, owner and ACL (a role the DBA granted
-- EXECUTE keeps it; the ACL is copied into pg_proc, not GRANTed, so the
-- DBA's grants are not recorded as the extension's initial privileges).
ALTER TABLE im.push_job ADD COLUMN trace_id text;
SELECT pg_catalog.set_config('im_sync_upgrade.claim_push_jobs_owner', p.proowner::pg_catalog.text, true),
       pg_catalog.set_config('im_sync_upgrade.claim_push_jobs_acl', COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p
WHERE p.oid OPERATOR(pg_catalog.=) 'im.claim_push_jobs(text, integer, interval)'::pg_catalog.regprocedure;
DROP FUNCTION im.claim_push_jobs(text, integer, interval);
CREATE FUNCTION im.claim_push_jobs(relay_id text, max_jobs int DEFAULT 100,
                                   lease interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, push_target_id bigint, provider text,
              app_id text, sealed_token text, notification jsonb, trace_id text)
AS 'MODULE_PATHNAME', 'im_claim_push_jobs' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
-- a fresh install's initial privileges (90_privileges.sql), then the old ACL
REVOKE ALL ON FUNCTION im.claim_push_jobs(text, integer, interval) FROM PUBLIC;
DO $do$
DECLARE
    old_owner oid;
    old_acl aclitem[];
BEGIN
    old_owner := pg_catalog.current_setting('im_sync_upgrade.claim_push_jobs_owner')::pg_catalog.oid;
    old_acl := NULLIF(pg_catalog.current_setting('im_sync_upgrade.claim_push_jobs_acl'), '')::pg_catalog.aclitem[];
    IF old_owner OPERATOR(pg_catalog.<>) (SELECT p.proowner FROM pg_catalog.pg_proc p
            WHERE p.oid OPERATOR(pg_catalog.=) 'im.claim_push_jobs(text, integer, interval)'::pg_catalog.regprocedure) THEN
        EXECUTE pg_catalog.format('ALTER FUNCTION im.claim_push_jobs(text, integer, interval) OWNER TO %I',
                                  old_owner::pg_catalog.regrole);
    END IF;
    UPDATE pg_catalog.pg_proc SET proacl = old_acl
    WHERE oid OPERATOR(pg_catalog.=) 'im.claim_push_jobs(text, integer, interval)'::pg_catalog.regprocedure;
END
$do$;
COMMENT ON FUNCTION im.claim_push_jobs(text, integer, interval) IS 'Hands claimable push jobs to a relay under a lease, each with the trace id of its message (contract §13, §21)';
