\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.10'" to load this file. \quit


-- ---- trace ids kept with the event and its outbox item
ALTER TABLE im.event ADD COLUMN trace_id text;
ALTER TABLE im.outbox ADD COLUMN trace_id text;

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
