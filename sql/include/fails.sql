\set VERBOSITY default
-- fails(sql): runs sql and shows the error it raised (SQLSTATE, message,
-- detail, hint), or 'no error'.
CREATE FUNCTION pg_temp.fails(q text)
RETURNS TABLE(sqlstate text, message text, detail text, hint text)
LANGUAGE plpgsql AS $f$
DECLARE s text; m text; d text; h text;
BEGIN
    EXECUTE q;
    RETURN QUERY SELECT 'no error'::text, NULL::text, NULL::text, NULL::text;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS s = RETURNED_SQLSTATE, m = MESSAGE_TEXT,
                            d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT;
    RETURN QUERY SELECT s, m, NULLIF(d, ''), NULLIF(h, '');
END
$f$;
