-- The catalog of im_sync in this database as sorted text lines, for the
-- upgrade suite to compare an upgraded database with a fresh install of
-- the latest version: any difference is a fault of an upgrade script.
-- Oids, attnums of dropped columns and creation order do not appear.
-- psql variables: ext (the extension, default im_sync) and schemas (the
-- schemas whose own lines are listed, comma separated, default im);
-- router_catalog_description.sql sets them for im_sync_router.
\if :{?ext}
\else
\set ext im_sync
\endif
\if :{?schemas}
\else
\set schemas im
\endif
WITH ext AS (SELECT oid, extconfig, extcondition, extversion, extnamespace
             FROM pg_extension WHERE extname = :'ext'),
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
  FROM pg_namespace n WHERE n.nspname = ANY (string_to_array(:'schemas', ','))
  UNION ALL
  -- the privileges pg_dump restores for the extension's objects
  SELECT format('init_privs %s %s', pg_describe_object(ip.classoid, ip.objoid, ip.objsubid), ip.initprivs)
  FROM pg_init_privs ip JOIN member m ON m.classid = ip.classoid AND m.objid = ip.objoid
)
SELECT l FROM line ORDER BY l COLLATE "C";
