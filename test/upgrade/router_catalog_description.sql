-- The catalog of im_sync_router in this database as sorted text lines
-- (catalog_description.sql's lines for the router extension), for
-- test/suites/72-router-upgrade.sh to compare an upgraded router with a
-- fresh install of the latest version: any difference is a fault of an
-- upgrade script.  Beyond the members: the extensions it requires, the
-- ACLs and initial privileges of dblink's functions (the router revokes
-- them from PUBLIC) and the options of the server im_sync (its partitions).
-- Oids, attnums of dropped columns and creation order do not appear.
WITH ext AS (SELECT oid, extconfig, extcondition, extversion, extnamespace
             FROM pg_extension WHERE extname = 'im_sync_router'),
member AS (SELECT d.classid, d.objid FROM pg_depend d, ext
           WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
fn AS (SELECT p.* FROM pg_proc p JOIN member m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid),
rel AS (SELECT c.* FROM pg_class c JOIN member m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid),
line(l) AS (
  SELECT 'extension version=' || extversion || ' schema=' || extnamespace::regnamespace FROM ext
  UNION ALL
  SELECT 'member ' || pg_describe_object(classid, objid, 0) FROM member
  UNION ALL
  SELECT 'extconfig ' || t.cfg::regclass || ' where=' || coalesce(quote_literal(t.cond), 'NULL')
  FROM ext, unnest(ext.extconfig, ext.extcondition) AS t(cfg, cond)
  UNION ALL
  SELECT format('function %s returns %s args(%s) lang=%s kind=%s secdef=%s volatile=%s strict=%s leakproof=%s parallel=%s retset=%s cost=%s rows=%s config=%s src=%s bin=%s owner=%s acl=%s comment=%s',
                p.oid::regprocedure, pg_get_function_result(p.oid), pg_get_function_arguments(p.oid),
                l.lanname, p.prokind, p.prosecdef, p.provolatile, p.proisstrict, p.proleakproof,
                p.proparallel, p.proretset, p.procost, p.prorows, p.proconfig, md5(p.prosrc), p.probin,
                p.proowner::regrole, p.proacl, quote_literal(obj_description(p.oid, 'pg_proc')))
  FROM fn p JOIN pg_language l ON l.oid = p.prolang
  UNION ALL
  SELECT format('relation %s kind=%s persistence=%s options=%s owner=%s acl=%s comment=%s',
                c.oid::regclass, c.relkind, c.relpersistence, c.reloptions, c.relowner::regrole,
                c.relacl, quote_literal(obj_description(c.oid, 'pg_class')))
  FROM rel c
  UNION ALL
  -- column order is the order of the non-dropped columns
  SELECT format('column %s #%s %s %s notnull=%s default=%s collation=%s identity=%s generated=%s comment=%s',
                c.oid::regclass,
                row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
                a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                pg_get_expr(ad.adbin, ad.adrelid), a.attcollation::regcollation, a.attidentity,
                a.attgenerated, quote_literal(col_description(c.oid, a.attnum)))
  FROM rel c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  LEFT JOIN pg_attrdef ad ON ad.adrelid = c.oid AND ad.adnum = a.attnum
  WHERE c.relkind IN ('r', 'p', 'v', 'm')
  UNION ALL
  SELECT format('constraint %s %s: %s deferrable=%s validated=%s comment=%s', co.conrelid::regclass,
                co.conname, pg_get_constraintdef(co.oid), co.condeferrable, co.convalidated,
                quote_literal(obj_description(co.oid, 'pg_constraint')))
  FROM pg_constraint co JOIN rel c ON c.oid = co.conrelid
  UNION ALL
  SELECT format('index %s: %s comment=%s', i.indexrelid::regclass, pg_get_indexdef(i.indexrelid),
                quote_literal(obj_description(i.indexrelid, 'pg_class')))
  FROM pg_index i JOIN rel c ON c.oid = i.indrelid
  UNION ALL
  SELECT format('trigger %s %s: %s enabled=%s', t.tgrelid::regclass, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled)
  FROM pg_trigger t JOIN rel c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal
  UNION ALL
  SELECT format('sequence %s type=%s start=%s increment=%s min=%s max=%s cache=%s cycle=%s owned_by=%s',
                s.seqrelid::regclass, s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmin, s.seqmax,
                s.seqcache, s.seqcycle,
                (SELECT d.refobjid::regclass || '.' || a.attname FROM pg_depend d
                 JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                 WHERE d.classid = 'pg_class'::regclass AND d.objid = s.seqrelid AND d.deptype IN ('a', 'i')
                   AND d.refclassid = 'pg_class'::regclass))
  FROM pg_sequence s JOIN rel c ON c.oid = s.seqrelid
  UNION ALL
  -- types the extension owns (domains): base type, default, constraints
  SELECT format('type %s kind=%s base=%s notnull=%s default=%s owner=%s acl=%s comment=%s',
                t.oid::regtype, t.typtype, t.typbasetype::regtype, t.typnotnull, t.typdefault,
                t.typowner::regrole, t.typacl, quote_literal(obj_description(t.oid, 'pg_type')))
  FROM pg_type t JOIN member m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
  UNION ALL
  SELECT format('domain constraint %s %s: %s validated=%s', co.contypid::regtype, co.conname,
                pg_get_constraintdef(co.oid), co.convalidated)
  FROM pg_constraint co JOIN member m ON m.classid = 'pg_type'::regclass AND m.objid = co.contypid
  UNION ALL
  SELECT format('schema %s owner=%s acl=%s comment=%s', n.nspname, n.nspowner::regrole, n.nspacl,
                quote_literal(obj_description(n.oid, 'pg_namespace')))
  FROM pg_namespace n WHERE n.nspname IN ('im', 'im_router')
  UNION ALL
  -- the privileges pg_dump restores for the extension's objects
  SELECT format('init_privs %s %s', pg_describe_object(ip.classoid, ip.objoid, ip.objsubid), ip.initprivs)
  FROM pg_init_privs ip JOIN member m ON m.classid = ip.classoid AND m.objid = ip.objoid
  UNION ALL
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
