-- ---- privileges: PUBLIC reads no table and runs no function of the
-- extension (contract §12); the DBA grants the API per role (README "Grants",
-- extension/doc/security.md).  Every API function is declared SECURITY DEFINER with the
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
    im.maintenance_state, im.conversation_ban FROM PUBLIC;
REVOKE ALL ON SEQUENCE im.event_id_seq, im.conversation_id_seq, im.membership_period_id_seq,
    im.outbox_id_seq, im.recovery_session_id_seq, im.snapshot_id_seq, im.audit_id_seq FROM PUBLIC;

-- Hands every table, sequence, domain and function of the extension but
-- itself to a dedicated role, so the SECURITY DEFINER API runs as that role
-- and not as the superuser who ran CREATE EXTENSION
-- (extension/doc/extension_owner.md).  The control file still says
-- superuser = true: only a superuser can create the LANGUAGE C functions,
-- and only a superuser may run this.  Run it again after every ALTER
-- EXTENSION ... UPDATE and after a restore (neither keeps member
-- ownership).  It refuses (42501) an owner someone else could act as: a
-- non-superuser role that can log in, has CREATEROLE or has members (the
-- fanout workers check the same rule in every transaction and act as the
-- owner).  This function and the schema im stay the superuser's (the owner
-- gets USAGE), so the owner can neither rewrite what a superuser runs nor
-- add an overload a superuser's call could resolve to.
-- SECURITY INVOKER on purpose: it runs as its superuser caller.
CREATE FUNCTION im.set_extension_owner(new_owner regrole) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r record;
    n int := 0;
    self oid := 'im.set_extension_owner(pg_catalog.regrole)'::pg_catalog.regprocedure;
    new_super boolean;
    old_owner oid;
    member oid;
BEGIN
    IF pg_catalog.current_setting('is_superuser') OPERATOR(pg_catalog.<>) 'on'
       OR NOT COALESCE((SELECT a.rolsuper FROM pg_catalog.pg_roles a
                        WHERE a.rolname OPERATOR(pg_catalog.=) CURRENT_USER), false) THEN
        RAISE EXCEPTION 'permission denied to change the owner of extension im_sync'
            USING ERRCODE = '42501', DETAIL = 'Only a superuser can hand the extension''s objects to another role.';
    END IF;
    SELECT a.rolsuper INTO new_super FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) new_owner;
    IF NOT new_super THEN
        IF (SELECT a.rolcanlogin FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) new_owner) THEN
            RAISE EXCEPTION 'role % can log in', new_owner
                USING ERRCODE = '42501',
                      DETAIL = 'The owner of the SECURITY DEFINER API must be a role nobody can act as: NOLOGIN, NOCREATEROLE, without members (or a superuser).',
                      HINT = pg_catalog.format('ALTER ROLE %s NOLOGIN', new_owner);
        END IF;
        IF (SELECT a.rolcreaterole FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) new_owner) THEN
            RAISE EXCEPTION 'role % has CREATEROLE', new_owner
                USING ERRCODE = '42501',
                      DETAIL = 'The owner of the SECURITY DEFINER API must be a role nobody can act as: NOLOGIN, NOCREATEROLE, without members (or a superuser).',
                      HINT = pg_catalog.format('ALTER ROLE %s NOCREATEROLE', new_owner);
        END IF;
        SELECT m.member INTO member FROM pg_catalog.pg_auth_members m
        WHERE m.roleid OPERATOR(pg_catalog.=) new_owner ORDER BY m.member LIMIT 1;
        IF member IS NOT NULL THEN
            RAISE EXCEPTION 'role % has members', new_owner
                USING ERRCODE = '42501',
                      DETAIL = pg_catalog.format('Role %s is a member of %s and could act as the owner of the SECURITY DEFINER API.',
                                                 member::pg_catalog.regrole, new_owner),
                      HINT = pg_catalog.format('REVOKE %s FROM %s', new_owner, member::pg_catalog.regrole);
        END IF;
    END IF;
    SELECT c.relowner INTO old_owner FROM pg_catalog.pg_class c
    WHERE c.oid OPERATOR(pg_catalog.=) 'im.outbox'::pg_catalog.regclass;
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
            -- this function stays its superuser's: it runs as its caller
            CONTINUE WHEN r.objid OPERATOR(pg_catalog.=) self;
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
    -- the schema and this function: a superuser's (an earlier switch
    -- handed them over); the owner reaches its objects through USAGE
    IF NOT (SELECT a.rolsuper FROM pg_catalog.pg_namespace s JOIN pg_catalog.pg_roles a
              ON a.oid OPERATOR(pg_catalog.=) s.nspowner
            WHERE s.nspname OPERATOR(pg_catalog.=) 'im') THEN
        EXECUTE pg_catalog.format('ALTER SCHEMA im OWNER TO %I', CURRENT_USER);
    END IF;
    IF NOT (SELECT a.rolsuper FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_roles a
              ON a.oid OPERATOR(pg_catalog.=) p.proowner
            WHERE p.oid OPERATOR(pg_catalog.=) self) THEN
        EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', self::regprocedure, CURRENT_USER);
    END IF;
    IF NOT new_super THEN
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA im TO %s', new_owner);
    END IF;
    IF old_owner OPERATOR(pg_catalog.<>) new_owner
       AND NOT (SELECT a.rolsuper FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) old_owner) THEN
        EXECUTE pg_catalog.format('REVOKE USAGE ON SCHEMA im FROM %s', old_owner::regrole);
    END IF;
    RETURN n;
END
$fn$;
COMMENT ON FUNCTION im.set_extension_owner(regrole) IS 'Hands every table, sequence and function of the extension (but itself and the schema) to a role nobody can act as; run after every update and restore (contract §12)';

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
