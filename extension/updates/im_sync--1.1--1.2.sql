\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.2'" to load this file. \quit

/*
 * im_sync 1.1 -> 1.2: exactly what changed in the catalog (issue 10).
 * im_sync--1.2.sql is the full script of the same catalog; the upgrade
 * suite (test/suites/70-upgrade.sh) checks that both give one catalog.
 *
 * im.event loses its foreign key to im.conversation: its check (a
 * KEY SHARE lock on the conversation row, a WAL record, and a query per
 * send) guarded what the send path already holds.  An event is only
 * written by append.c in the statement after the one that updated (and so
 * locked) its conversation row, and conversation rows are never deleted
 * (membership_period, private_event and user_conversation still reference
 * them, and every conversation has periods).  im.reconcile() reports an
 * event without its conversation as event_without_conversation.
 * No data changes: outbox items, pending or done, stay as they are.
 */
ALTER TABLE im.event DROP CONSTRAINT event_conversation_id_fkey;

/*
 * Single-column value rules become domains, the cross-column rules of a
 * table one CHECK constraint (im_sync--1.2.sql says why: a table CHECK is
 * planned again at every INSERT/UPDATE, a domain's check is compiled once
 * in the type cache and applied to assigned columns only).  The rules are
 * the same; existing rows satisfy them (the old constraints held), and
 * PostgreSQL verifies it: changing a column to a domain with a check
 * rewrites the table (im.event, im.outbox and im.conversation are each
 * rewritten once here, under an ACCESS EXCLUSIVE lock), and the merged
 * constraints are validated on ADD.  Defaults are set again so they read
 * as in a fresh install.
 */
CREATE DOMAIN im.conversation_kind AS text CONSTRAINT conversation_kind_check CHECK (VALUE IN ('direct', 'group'));
CREATE DOMAIN im.conversation_mode AS text CONSTRAINT conversation_mode_check CHECK (VALUE IN ('fanout', 'shared_log'));
CREATE DOMAIN im.head_seq AS bigint CONSTRAINT head_seq_check CHECK (VALUE >= 0);
CREATE DOMAIN im.event_kind AS text
    CONSTRAINT event_kind_check CHECK (VALUE IN ('message', 'create', 'join', 'leave', 'recall', 'edit', 'mode'));
CREATE DOMAIN im.event_seq AS bigint CONSTRAINT event_seq_check CHECK (VALUE >= 1);
CREATE DOMAIN im.outbox_state AS text CONSTRAINT outbox_state_check CHECK (VALUE IN ('pending', 'done', 'dead'));

ALTER TABLE im.conversation
    DROP CONSTRAINT conversation_kind_check,
    DROP CONSTRAINT conversation_mode_check,
    DROP CONSTRAINT conversation_head_msg_seq_check,
    DROP CONSTRAINT conversation_check,
    DROP CONSTRAINT conversation_check1,
    ALTER COLUMN kind TYPE im.conversation_kind,
    ALTER COLUMN mode TYPE im.conversation_mode,
    ALTER COLUMN mode SET DEFAULT 'fanout',
    ALTER COLUMN head_msg_seq TYPE im.head_seq,
    ALTER COLUMN head_msg_seq SET DEFAULT 0;
ALTER TABLE im.conversation
    ADD CONSTRAINT conversation_direct_pair CHECK (
        ((kind = 'direct') = (direct_user_lo IS NOT NULL AND direct_user_hi IS NOT NULL))
        AND direct_user_lo < direct_user_hi);

ALTER TABLE im.event
    DROP CONSTRAINT event_msg_seq_check,
    DROP CONSTRAINT event_kind_check,
    DROP CONSTRAINT event_check,
    DROP CONSTRAINT event_check1,
    ALTER COLUMN msg_seq TYPE im.event_seq,
    ALTER COLUMN kind TYPE im.event_kind;
ALTER TABLE im.event
    ADD CONSTRAINT event_kind_fields CHECK (
        ((client_msg_id IS NULL) = (sender_id IS NULL OR kind IN ('create', 'join', 'leave', 'mode')))
        AND ((target_message_id IS NOT NULL) = (kind IN ('recall', 'edit'))));

ALTER TABLE im.outbox
    DROP CONSTRAINT outbox_state_check,
    ALTER COLUMN state TYPE im.outbox_state,
    ALTER COLUMN state SET DEFAULT 'pending';

COMMENT ON DOMAIN im.conversation_kind IS 'Kind of a conversation: direct (two members, ordered pair) or group (contract §1)';
COMMENT ON DOMAIN im.conversation_mode IS 'Delivery mode of a conversation: fanout to inboxes or shared_log (contract §4)';
COMMENT ON DOMAIN im.head_seq IS 'A conversation''s head position, 0 before its first event (contract §1)';
COMMENT ON DOMAIN im.event_kind IS 'Kind of a conversation position: message or control event (contract §1, §3)';
COMMENT ON DOMAIN im.event_seq IS 'A conversation position, from 1, gap-free (contract §1)';
COMMENT ON DOMAIN im.outbox_state IS 'State of an outbox item: pending, done or dead (contract §4)';

-- im.set_extension_owner hands the domains to the new owner too (the
-- body as in im_sync--1.2.sql; its ACL and comment stay).
CREATE OR REPLACE FUNCTION im.set_extension_owner(new_owner regrole) RETURNS int
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
