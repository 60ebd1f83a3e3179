-- The install script creates the schema and inserts no rows.
SELECT extname, extversion FROM pg_extension WHERE extname = 'im_sync';
SELECT count(*) AS api_functions FROM pg_proc WHERE pronamespace = 'im'::regnamespace;
-- every API function is SECURITY DEFINER with a pinned search_path, no PUBLIC execute
SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'im'::regnamespace
  AND p.proname NOT IN ('set_extension_owner', 'event_fields_valid', 'conversation_pair_valid', 'conversation_pair_check',
                         'user_suspension_written')
  AND (NOT p.prosecdef OR p.proconfig IS NULL OR has_function_privilege('public', p.oid, 'EXECUTE'))
ORDER BY 1;
-- the exception set_extension_owner runs as its (superuser) caller; no PUBLIC execute
SELECT p.proname, p.prosecdef, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
FROM pg_proc p WHERE p.pronamespace = 'im'::regnamespace AND p.proname = 'set_extension_owner';
-- The row rules the CHECK and the trigger call (row_rules.c) run no SQL: C (the CHECK's immutable), not SECURITY
-- DEFINER (no per-row GUC save and restore), no PUBLIC execute
SELECT p.proname, l.lanname AS language, p.provolatile, p.prosecdef,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = 'im'::regnamespace AND p.proname IN ('event_fields_valid', 'conversation_pair_valid', 'conversation_pair_check')
ORDER BY 1;
-- the suspension table's statement trigger (standing.c) runs no SQL either: not SECURITY DEFINER, no PUBLIC execute
SELECT p.proname, l.lanname AS language, p.prosecdef, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = 'im'::regnamespace AND p.proname = 'user_suspension_written';
-- no rows in any data table
SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'im'::regnamespace AND c.relkind = 'r'
  AND (xpath('/row/n/text()', query_to_xml(format('SELECT count(*) AS n FROM im.%I', c.relname), false, true, '')))[1]::text::int > 0;
-- every table and sequence is registered for pg_dump
SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'im'::regnamespace AND c.relkind IN ('r', 'S')
  AND c.oid NOT IN (SELECT unnest(extconfig) FROM pg_extension WHERE extname = 'im_sync')
ORDER BY 1;
