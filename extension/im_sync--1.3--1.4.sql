\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.4'" to load this file. \quit

/*
 * ---- 1.3 -> 1.4.  Each block below (issue 12: offline push, contract §13;
 * issue 13: message_facts, contract §16) is appended verbatim, without this
 * file's \echo line, to the 1.3 full script to make im_sync--1.4.sql, so the
 * two reach the same catalog (test/suites/70-upgrade.sh compares them).
 */

-- ---- 1.3 -> 1.4 (issue 13): message_facts
-- The four facts of a message for its sender, one row per recipient user,
-- without device ids (contract §16); the message_status frame calls it.
CREATE FUNCTION im.message_facts(sender_id bigint, message_id bigint)
RETURNS TABLE(user_id bigint, accepted boolean, in_sync_scope boolean,
              any_device_synced boolean, user_read boolean)
AS 'MODULE_PATHNAME', 'im_message_facts' LANGUAGE C;

COMMENT ON FUNCTION im.message_facts(bigint, bigint) IS 'For the sender of a message: per recipient user accepted, in sync scope, synced on any device, read (contract §16)';

-- issue 13's functions: SECURITY DEFINER, pinned search_path, no PUBLIC execute
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['message_facts'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;
