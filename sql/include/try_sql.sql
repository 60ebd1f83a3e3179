-- try_sql(q): run q, report the outcome as one line (SQLSTATE, message,
-- detail, hint); the failing call is rolled back by the exception block.
CREATE FUNCTION try_sql(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; det text; hin text;
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN others THEN
  GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                          det = PG_EXCEPTION_DETAIL, hin = PG_EXCEPTION_HINT;
  RETURN st || ': ' || msg || coalesce(' | ' || nullif(det, ''), '') || coalesce(' | ' || nullif(hin, ''), '');
END $$;
