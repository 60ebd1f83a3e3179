-- an error as "SQLSTATE: message [detail] [hint]" (the statement changes nothing)
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE d text; h text;
BEGIN
  EXECUTE q;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT;
  RETURN SQLSTATE || ': ' || SQLERRM || COALESCE(' [' || NULLIF(d, '') || ']', '') || COALESCE(' [' || NULLIF(h, '') || ']', '');
END $$;
