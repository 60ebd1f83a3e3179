\echo Use "ALTER EXTENSION im_sync_router UPDATE TO '1.4'" to load this file. \quit


-- ---- account standing (contract §17): suspend_user and reinstate_user on
-- every node, device_session's account_state
--   * im_router.all_suspend_user / all_reinstate_user run the node function
--     on every node; im_router.suspend_user / reinstate_user fold the rows;
--     the im.* wrappers as the install script generates every wrapper,
--     revoked from PUBLIC like the others;
--   * im_router.device_session and its wrapper gain the nodes' trailing
--     account_state (nodes at 1.12): the result changes, so both are
--     dropped and made again, each keeping its owner and ACL (copied into
--     pg_proc: a GRANT here would record the DBA's grants as the
--     extension's initial privileges).
CREATE FUNCTION im_router.all_suspend_user(moderator text, user_id bigint, suspended_until timestamptz,
                                           reason text)
RETURNS TABLE(suspended boolean, sessions_closed int)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); TARGET im.suspend_user; $$;

CREATE FUNCTION im_router.all_reinstate_user(moderator text, user_id bigint)
RETURNS TABLE(reinstated boolean)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_all(); TARGET im.reinstate_user; $$;

CREATE FUNCTION im_router.suspend_user(moderator text, user_id bigint, suspended_until timestamptz,
                                       reason text)
RETURNS TABLE(suspended boolean, sessions_closed int)
LANGUAGE sql
AS $$ SELECT bool_or(s.suspended), sum(s.sessions_closed)::int
        FROM im_router.all_suspend_user(moderator, user_id, suspended_until, reason) s $$;

CREATE FUNCTION im_router.reinstate_user(moderator text, user_id bigint)
RETURNS TABLE(reinstated boolean)
LANGUAGE sql
AS $$ SELECT bool_or(r.reinstated) FROM im_router.all_reinstate_user(moderator, user_id) r $$;

SELECT im_router.create_api_wrapper('im_router.suspend_user(text, bigint, timestamptz, text)'::regprocedure);
REVOKE ALL ON FUNCTION im.suspend_user(text, bigint, timestamptz, text) FROM PUBLIC;
SELECT im_router.create_api_wrapper('im_router.reinstate_user(text, bigint)'::regprocedure);
REVOKE ALL ON FUNCTION im.reinstate_user(text, bigint) FROM PUBLIC;

SELECT pg_catalog.set_config('im_sync_router_upgrade.session_' || n.nspname,
                             p.proowner::pg_catalog.text || ' ' || COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
WHERE n.nspname OPERATOR(pg_catalog.=) ANY (ARRAY['im', 'im_router'])
  AND p.proname OPERATOR(pg_catalog.=) 'device_session';

DROP FUNCTION im.device_session(bigint, text, bigint);
DROP FUNCTION im_router.device_session(bigint, text, bigint);

-- account_state last: the nodes' trailing column (contract §17)
CREATE FUNCTION im_router.device_session(user_id bigint, device_id text, connection_epoch bigint)
RETURNS TABLE(state text, sync_generation int, server_acked_sync_seq bigint, high_watermark bigint, current boolean,
              account_state text)
LANGUAGE plproxy AS $$ CLUSTER 'im_sync'; RUN ON im_router.route_id(user_id); TARGET im.device_session; $$;

SELECT im_router.create_api_wrapper('im_router.device_session(bigint, text, bigint)'::regprocedure);
REVOKE ALL ON FUNCTION im.device_session(bigint, text, bigint) FROM PUBLIC;
DO $acl$
DECLARE
    saved text;
    old_owner oid;
    old_acl aclitem[];
    fn regprocedure;
BEGIN
    FOREACH fn IN ARRAY ARRAY['im.device_session(bigint, text, bigint)'::regprocedure,
                              'im_router.device_session(bigint, text, bigint)'::regprocedure]
    LOOP
        saved := current_setting('im_sync_router_upgrade.session_' ||
                     (SELECT n.nspname FROM pg_proc p
                        JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.oid = fn), true);
        CONTINUE WHEN saved IS NULL OR saved = '';
        -- "<owner oid> <acl>": the oid has no space, the ACL may
        old_owner := split_part(saved, ' ', 1)::oid;
        old_acl := NULLIF(substr(saved, position(' ' in saved) + 1), '')::aclitem[];
        IF old_owner <> (SELECT p.proowner FROM pg_proc p WHERE p.oid = fn) THEN
            EXECUTE format('ALTER FUNCTION %s OWNER TO %I', fn, old_owner::regrole);
        END IF;
        UPDATE pg_proc SET proacl = old_acl WHERE oid = fn;
    END LOOP;
END $acl$;
