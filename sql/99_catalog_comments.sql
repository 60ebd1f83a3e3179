-- Every im.* function and table explains itself in psql (\df+ im.*,
-- \dt+ im.*): a one-line comment naming its contract section.
-- Both queries must return no rows.
SELECT p.oid::regprocedure AS function_without_comment
FROM pg_proc p
WHERE p.pronamespace = 'im'::regnamespace
  AND coalesce(obj_description(p.oid, 'pg_proc'), '') !~ '\(contract §[0-9]'
ORDER BY 1;
SELECT c.oid::regclass AS table_without_comment
FROM pg_class c
WHERE c.relnamespace = 'im'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
  AND coalesce(obj_description(c.oid, 'pg_class'), '') !~ '\(contract §[0-9]'
ORDER BY 1;
