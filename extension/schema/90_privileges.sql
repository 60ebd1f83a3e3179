-- ---- privileges: PUBLIC reads no table and runs no function of the
-- extension (contract §12); the DBA grants the API per role (README,
-- "Security").  Every API function is declared SECURITY DEFINER with the
-- pinned search_path pg_catalog, im, pg_temp; sql/00_install.sql checks
-- that none is missing it and names the exceptions (set_extension_owner
-- below and the row rules of 10_conversation.sql).

-- These tables and sequences carry an explicit ACL (their owner's
-- privileges only), the others the default ACL (NULL), which grants PUBLIC
-- nothing either.  The upgrade suite compares ACLs and initial privileges,
-- so the list is exactly the one an upgraded catalog has.
REVOKE ALL ON TABLE im.conversation, im.event, im.membership_period, im.private_event, im.outbox,
    im.fanout_quarantine, im.user_head, im.inbox, im.user_conversation, im.deleted_for_me,
    im.device, im.recovery_session, im.snapshot, im.snapshot_page, im.token_key, im.audit,
    im.maintenance_state FROM PUBLIC;
REVOKE ALL ON SEQUENCE im.event_id_seq, im.conversation_id_seq, im.membership_period_id_seq,
    im.outbox_id_seq, im.recovery_session_id_seq, im.snapshot_id_seq, im.audit_id_seq FROM PUBLIC;

-- Hands every object of the extension (tables, sequences, functions and the
-- schema) to a dedicated role, so the SECURITY DEFINER API runs as that role
-- and not as the superuser who ran CREATE EXTENSION (README "Security").  The
-- control file still says superuser = true: only a superuser can create the
-- LANGUAGE C functions, and only a superuser may run this.  Run it again after
-- every ALTER EXTENSION ... UPDATE and after a restore (neither keeps member
-- ownership).  The role must not be able to log in (its holder could ALTER the
-- API functions) unless it is a superuser (handing the extension back).
-- SECURITY INVOKER on purpose: it runs as its superuser caller.
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
COMMENT ON FUNCTION im.set_extension_owner(regrole) IS 'Hands every object of the extension to a NOLOGIN role; run after every update and restore (contract §12)';

-- No PUBLIC execute on any function of the extension: one loop over its
-- member functions, so a function added in any file cannot be forgotten.
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
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;
