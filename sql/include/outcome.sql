-- outcome(q): 'ok', or "SQLSTATE: message" of the error q raised (the
-- exception block undoes whatever q did, so a refused call changes nothing).
CREATE FUNCTION pg_temp.outcome(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE q;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
