-- Contract §12: after im.set_extension_owner(role) the
-- SECURITY DEFINER API runs as a dedicated NOLOGIN role instead of the
-- superuser who installed it, and the whole API still works for the
-- gateway's and the application's roles.  The schema and set_extension_owner
-- itself stay the superuser's (test/worker/owner_check.py tests the rest of
-- the containment with the workers running).  Rolled back at the end (ALTER
-- OWNER and CREATE ROLE are transactional).
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
SELECT plan(14);

CREATE ROLE im_tap_owner NOLOGIN;
CREATE ROLE im_tap_login LOGIN;
CREATE ROLE im_tap_caller NOLOGIN;
GRANT USAGE ON SCHEMA im TO im_tap_caller;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA im TO im_tap_caller;
REVOKE EXECUTE ON FUNCTION im.set_extension_owner(regrole) FROM im_tap_caller;

CREATE TEMP VIEW im_members AS
SELECT d.classid, d.objid,
       coalesce((SELECT c.relowner FROM pg_class c WHERE d.classid = 'pg_class'::regclass AND c.oid = d.objid),
                (SELECT p.proowner FROM pg_proc p WHERE d.classid = 'pg_proc'::regclass AND p.oid = d.objid),
                (SELECT t.typowner FROM pg_type t WHERE d.classid = 'pg_type'::regclass AND t.oid = d.objid)) AS owner
FROM pg_depend d
WHERE d.deptype = 'e' AND d.refclassid = 'pg_extension'::regclass
  AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'im_sync');
GRANT SELECT ON im_members TO im_tap_caller;

SELECT ok((SELECT bool_and(r.rolsuper) FROM im_members m JOIN pg_roles r ON r.oid = m.owner),
          'before: every member object is owned by a superuser');

SELECT throws_ok($$SELECT im.set_extension_owner('im_tap_login')$$, '42501', NULL,
                 'a role that can log in is refused as owner');

SELECT cmp_ok(im.set_extension_owner('im_tap_owner'), '>', 40, 'set_extension_owner changes every member object');

SELECT is((SELECT count(*) FROM im_members WHERE owner <> 'im_tap_owner'::regrole
             AND objid <> 'im.set_extension_owner(regrole)'::regprocedure), 0::bigint,
          'after: no member object (table, sequence, function) but set_extension_owner is owned by anyone else');
SELECT ok((SELECT r.rolsuper FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner WHERE n.nspname = 'im')
          AND (SELECT r.rolsuper FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
               WHERE p.oid = 'im.set_extension_owner(regrole)'::regprocedure)
          AND has_schema_privilege('im_tap_owner', 'im', 'USAGE')
          AND NOT has_schema_privilege('im_tap_owner', 'im', 'CREATE'),
          'the schema im and set_extension_owner stay a superuser''s; the owner has USAGE on im, no CREATE');
SELECT is((SELECT count(*) FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner
           WHERE p.pronamespace = 'im'::regnamespace AND p.prosecdef AND r.rolsuper), 0::bigint,
          'no SECURITY DEFINER function of im runs as a superuser');
SELECT ok(NOT has_table_privilege('im_tap_caller', 'im.token_key', 'SELECT'),
          'the signing keys stay readable by the owner only');

-- the API as a non-superuser caller, running as the new owner
SET ROLE im_tap_caller;
SELECT im.create_conversation('group', ARRAY[9001, 9002]::bigint[]) AS own_conv \gset
SELECT is((SELECT created FROM im.send_message(9001, :own_conv, 'own-1', '{"t": "hi"}')), true,
          'send_message works when the extension is owned by a NOLOGIN role');
SELECT cmp_ok(im.run_fanout(), '>=', 2::bigint, 'run_fanout works');
SELECT is((SELECT state FROM im.register_device(9002, 'phone')), 'NEW', 'register_device works');
SELECT im.issue_device_token(9002, 'phone') AS own_tok \gset
SELECT is((SELECT user_id FROM im.authenticate(:'own_tok')), 9002::bigint, 'issue_device_token and authenticate work');
SELECT is((SELECT status FROM im.begin_snapshot(9002, 'phone')), 'READY', 'begin_snapshot works');
SELECT throws_ok($$SELECT im.set_extension_owner('im_tap_caller')$$, '42501', NULL,
                 'only a superuser may hand the extension over');
RESET ROLE;
SELECT is((SELECT count(*) FROM im.reconcile()), 0::bigint, 'reconcile is clean');

SELECT * FROM finish();
ROLLBACK;
