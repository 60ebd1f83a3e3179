-- The install script creates the schema and inserts no rows.
SELECT extname, extversion FROM pg_extension WHERE extname = 'im_sync';
SELECT count(*) AS api_functions FROM pg_proc WHERE pronamespace = 'im'::regnamespace;
-- every API function is SECURITY DEFINER with a pinned search_path, no PUBLIC execute
SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'im'::regnamespace
  AND p.proname <> 'set_extension_owner'
  AND (NOT p.prosecdef OR p.proconfig IS NULL OR has_function_privilege('public', p.oid, 'EXECUTE'))
ORDER BY 1;
-- the one exception, set_extension_owner, runs as its (superuser) caller; no PUBLIC execute
SELECT p.proname, p.prosecdef, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
FROM pg_proc p WHERE p.pronamespace = 'im'::regnamespace AND p.proname = 'set_extension_owner';
-- no rows in any data table
SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'im'::regnamespace AND c.relkind = 'r'
  AND (xpath('/row/n/text()', query_to_xml(format('SELECT count(*) AS n FROM im.%I', c.relname), false, true, '')))[1]::text::int > 0;
-- every table and sequence is registered for pg_dump
SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'im'::regnamespace AND c.relkind IN ('r', 'S')
  AND c.oid NOT IN (SELECT unnest(extconfig) FROM pg_extension WHERE extname = 'im_sync')
ORDER BY 1;
