\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.12'" to load this file. \quit


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
