-- Device tokens and authenticate (contract §8, §12).  Users 4501..4599.
-- Tokens are random (keys come from pg_strong_random): never printed.
\i sql/include/fails.sql
SELECT * FROM im.register_device(4501, 'phone');
SELECT * FROM im.register_device(4501, 'tablet');
SELECT * FROM im.register_device(4502, 'phone');
-- failed authentications are counted in shared memory (survive the rollback)
SELECT value AS auth_failures_before FROM im.metrics() WHERE name = 'im_auth_failures_total' \gset
SELECT im.issue_device_token(4501, 'phone') AS t1 \gset
SELECT im.issue_device_token(4501, 'tablet') AS t_tab \gset
SELECT :'t1' ~ '^[A-Za-z0-9_-]+$' AS base64url, length(:'t1') < 200 AS compact;
-- authenticate: user and device from the token; every success is a newer connection
SELECT * FROM im.authenticate(:'t1');
SELECT * FROM im.device_session(4501, 'phone', 1);
SELECT * FROM im.authenticate(:'t1');
SELECT current FROM im.device_session(4501, 'phone', 1);
SELECT current FROM im.device_session(4501, 'phone', 2);
SELECT * FROM im.authenticate(:'t_tab');
-- ttl must be positive
SELECT * FROM pg_temp.fails($$SELECT im.issue_device_token(4501, 'phone', '0 seconds')$$);
SELECT * FROM pg_temp.fails($$SELECT im.issue_device_token(4501, 'phone', '-1 day')$$);
SELECT * FROM pg_temp.fails($$SELECT im.issue_device_token(4501, 'phone', NULL)$$);
SELECT im.issue_device_token(4501, 'phone', '1 month') IS NOT NULL AS months_ok;
-- malformed tokens: 28000, and a failure changes nothing
SELECT * FROM pg_temp.fails($$SELECT * FROM im.authenticate(NULL)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.authenticate('')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.authenticate('not a token')$$);
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.authenticate(%L)', :'t1' || 'A'));
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.authenticate(%L)', left(:'t1', -1)));
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.authenticate(%L)', upper(:'t1')));
SELECT connection_epoch FROM im.device WHERE user_id = 4501 AND device_id = 'phone';
-- flip every character of the token, one at a time: each variant fails with
-- 28000 (canonical base64url + HMAC over every byte)
DO $$
DECLARE
    tok text := (SELECT im.issue_device_token(4501, 'phone'));
    bad text;
    c text;
    failed int := 0;
BEGIN
    FOR i IN 1 .. length(tok) LOOP
        c := substr(tok, i, 1);
        bad := overlay(tok PLACING (CASE WHEN c = 'A' THEN 'B' ELSE 'A' END) FROM i FOR 1);
        BEGIN
            PERFORM im.authenticate(bad);
        EXCEPTION WHEN invalid_authorization_specification THEN
            failed := failed + 1;
        END;
    END LOOP;
    RAISE NOTICE 'tampered variants refused: % of %', failed, length(tok);
    -- and the untampered one still works
    PERFORM im.authenticate(tok);
END
$$;
-- expired: a 1 microsecond token has expired by the next statement
SELECT im.issue_device_token(4501, 'phone', '1 microsecond') AS t_exp \gset
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.authenticate(%L)', :'t_exp'));
-- key rotation: old tokens stay valid, new tokens are signed by the new key
SELECT im.rotate_token_key() AS new_key \gset
SELECT :new_key = (SELECT max(key_id) FROM im.token_key) AS rotated_to_newest,
       (SELECT count(*) FROM im.token_key) >= 2 AS old_key_kept;
SELECT im.issue_device_token(4501, 'phone') AS t2 \gset
SELECT user_id, device_id FROM im.authenticate(:'t1');
SELECT user_id, device_id FROM im.authenticate(:'t2');
-- revocation kills every token issued before it, also after re-registration
SELECT im.revoke_device(4501, 'phone');
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.authenticate(%L)', :'t1'));
SELECT * FROM pg_temp.fails($$SELECT im.issue_device_token(4501, 'phone')$$);
SELECT * FROM im.register_device(4501, 'phone');
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.authenticate(%L)', :'t1'));
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.authenticate(%L)', :'t2'));
SELECT im.issue_device_token(4501, 'phone') AS t3 \gset
SELECT user_id, device_id, connection_epoch > 0 AS epoch_bumped FROM im.authenticate(:'t3');
-- the other device's token is unaffected
SELECT user_id, device_id FROM im.authenticate(:'t_tab');
-- audit rows: registration, issue, revocation; no token anywhere
SELECT action, device_id, detail ? 'registration' AS has_registration,
       detail ? 'expires_at' AS has_expiry
  FROM im.audit WHERE user_id = 4501 ORDER BY audit_id;
SELECT count(*) AS audit_rows_with_token FROM im.audit
 WHERE detail::text LIKE '%' || left(:'t3', 40) || '%' OR detail::text LIKE '%' || left(:'t1', 40) || '%';
SELECT value - :auth_failures_before AS auth_failures_counted
  FROM im.metrics() WHERE name = 'im_auth_failures_total';
-- only the extension owner reads the keys
SELECT has_table_privilege('public', 'im.token_key', 'SELECT') AS public_can_read_keys;
