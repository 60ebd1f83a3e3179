-- The catalog of im_sync_router in this database as text lines:
-- catalog_description.sql's sorted lines for the router extension and its
-- schemas, then the router's own below, sorted too; for
-- test/suites/72-router-upgrade.sh to compare an upgraded router with a
-- fresh install of the latest version: any difference is a fault of an
-- upgrade script.  Beyond the members: the extensions it requires, the
-- ACLs and initial privileges of dblink's functions (the router revokes
-- them from PUBLIC) and the options of the server im_sync (its partitions).
\set ext im_sync_router
\set schemas im,im_router
\ir catalog_description.sql
WITH ext AS (SELECT oid FROM pg_extension WHERE extname = :'ext'),
line(l) AS (
  SELECT 'requires ' || e.extname
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid, ext
  WHERE d.classid = 'pg_extension'::regclass AND d.objid = ext.oid
    AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'n'
  UNION ALL
  SELECT format('dblink function %s acl=%s init_privs=%s', p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
                p.proacl, (SELECT ip.initprivs FROM pg_init_privs ip
                           WHERE ip.classoid = 'pg_proc'::regclass AND ip.objoid = p.oid AND ip.objsubid = 0))
  FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'dblink'
  UNION ALL
  SELECT 'server ' || s.srvname || ' option ' || o
  FROM pg_foreign_server s, unnest(s.srvoptions) o WHERE s.srvname = 'im_sync'
)
SELECT l FROM line ORDER BY l COLLATE "C";
