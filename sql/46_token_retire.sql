-- Retiring signing keys (contract §8).  Users 4601..4699.
-- Own database: keys are per database.  The automatic rules are exercised
-- by moving key timestamps back (superuser), never by sleeping.  Tokens are
-- random: kept in psql variables or pg_temp.tok, never printed.
\set regress_db :DBNAME
CREATE DATABASE im_token_retire_test;
\c im_token_retire_test
SET client_min_messages = warning;
CREATE EXTENSION im_sync CASCADE;
RESET client_min_messages;
\i sql/include/fails.sql
\i sql/include/sync_helpers.sql

SELECT count(*) AS keys_before_first_use FROM im.token_key;
SELECT im.create_conversation('group', ARRAY[4601, 4602]::bigint[], 4602) AS c \gset
SELECT * FROM im.register_device(4601, 'phone');
SELECT * FROM pg_temp.activate(4601, 'phone');
SELECT gen FROM pg_temp.dev(4601, 'phone') \gset
SELECT count(*) FROM im.send_message(4602, :c, 'k1', '{"t":"a"}');
SELECT im.run_fanout() > 0 AS delivered;
-- a batch token and a device token, both signed by key 1
SELECT status, wm, events FROM pg_temp.sync('b1', 4601, 'phone', :gen, 0);
SELECT im.issue_device_token(4601, 'phone') AS t1 \gset
-- the device token's expiry (1 day) is kept on the key that signed it
SELECT key_id, secret IS NOT NULL AS has_secret, superseded_at IS NULL AS signing,
       device_tokens_expire BETWEEN now() + interval '23 h' AND now() + interval '25 h' AS device_expiry_kept
  FROM im.token_key ORDER BY key_id;
-- a shorter-lived token leaves it; a longer-lived one raises it (stored
-- rounded up to the second: never earlier than the token's expiry)
SELECT im.issue_device_token(4601, 'phone', '1 hour') IS NOT NULL AS issued;
SELECT device_tokens_expire BETWEEN now() + interval '23 h' AND now() + interval '25 h' AS unchanged
  FROM im.token_key;
SELECT im.issue_device_token(4601, 'phone', '2 days') IS NOT NULL AS issued;
SELECT device_tokens_expire >= now() + interval '2 days' AS raised FROM im.token_key;

-- the newest key cannot be retired (22023); unknown key P0002; NULL 22023
SELECT * FROM pg_temp.fails('SELECT im.retire_token_key(1)');
SELECT * FROM pg_temp.fails('SELECT im.retire_token_key(99)');
SELECT * FROM pg_temp.fails('SELECT im.retire_token_key(NULL)');

-- rotation: key 1 stops signing (superseded) but still verifies
SELECT im.rotate_token_key() AS rotated_to;
SELECT key_id, superseded_at IS NOT NULL AS superseded FROM im.token_key ORDER BY key_id;
SELECT user_id, device_id FROM im.authenticate(:'t1');
SELECT im.issue_device_token(4601, 'phone') AS t2 \gset
-- maintenance leaves key 1 alone: tokens it signed are still live
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT key_id, retired_at IS NOT NULL AS retired FROM im.token_key ORDER BY key_id;

-- retire key 1 by hand: every token it signed fails from now on
SELECT im.retire_token_key(1) AS retired_now;
SELECT im.retire_token_key(1) AS retired_again;
-- the row stays (ids are never reused) but its secret is gone, so a dump
-- taken from now on carries nothing that signs or verifies
SELECT key_id, secret IS NULL AS secret_wiped, retired_at IS NOT NULL AS retired
  FROM im.token_key ORDER BY key_id;
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.authenticate(%L)', :'t1'));
SELECT * FROM pg_temp.ack(4601, 'phone', 'b1', 2);
-- tokens of the newer key are unaffected
SELECT user_id, device_id FROM im.authenticate(:'t2');
SELECT * FROM pg_temp.fails('SELECT im.retire_token_key(2)');

-- automatic rotation once the newest key is older than token_key_max_age
SET im_sync.token_key_max_age = '1h';
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT max(key_id) AS newest_while_young FROM im.token_key;
UPDATE im.token_key SET created_at = now() - interval '2 h' WHERE key_id = 2;
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT key_id, superseded_at IS NOT NULL AS superseded, retired_at IS NOT NULL AS retired
  FROM im.token_key ORDER BY key_id;
RESET im_sync.token_key_max_age;

-- automatic retirement waits for the latest expiry of every token a key
-- signed.  Key 2 stopped signing long ago (past superseded_at + the largest
-- of token_ttl, recovery_ttl, snapshot_ttl = 1 h) but signed t2, valid for
-- a day: it stays, and t2 keeps working
UPDATE im.token_key SET superseded_at = now() - interval '2 h' WHERE key_id = 2;
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT key_id, retired_at IS NOT NULL AS retired FROM im.token_key ORDER BY key_id;
SELECT user_id, device_id FROM im.authenticate(:'t2');
-- past t2's expiry it is retired, and t2 fails
UPDATE im.token_key SET device_tokens_expire = now() - interval '1 s' WHERE key_id = 2;
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT key_id, secret IS NULL AS secret_wiped FROM im.token_key ORDER BY key_id;
SELECT * FROM pg_temp.fails(format('SELECT * FROM im.authenticate(%L)', :'t2'));

-- a key that signed only batch tokens: kept until superseded_at + 1 h
SELECT count(*) FROM im.send_message(4602, :c, 'k2', '{"t":"b"}');
SELECT im.run_fanout() > 0 AS delivered;
SELECT status, wm, events FROM pg_temp.sync('b3', 4601, 'phone', :gen, 0);
SELECT im.rotate_token_key() AS rotated_to;
UPDATE im.token_key SET superseded_at = now() - interval '59 min' WHERE key_id = 3;
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT key_id, retired_at IS NOT NULL AS retired FROM im.token_key ORDER BY key_id;
SELECT * FROM pg_temp.ack(4601, 'phone', 'b3', 3);
UPDATE im.token_key SET superseded_at = now() - interval '61 min' WHERE key_id = 3;
SELECT count(*) AS gc_rows FROM im.gc_inbox();
SELECT key_id, retired_at IS NOT NULL AS retired FROM im.token_key ORDER BY key_id;
-- the same ACK again would be OK (idempotent): refused now
SELECT * FROM pg_temp.ack(4601, 'phone', 'b3', 3);
-- the newest key is never retired automatically either
SELECT count(*) AS signing_keys FROM im.token_key WHERE retired_at IS NULL;

\c :regress_db
DROP DATABASE im_token_retire_test;
