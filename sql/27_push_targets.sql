-- Push targets (contract §13): one per device, sealed tokens, a token
-- moving between devices, removal with the target or the device.
-- Users 2701..2799 belong to this file.
\i sql/include/fails.sql
\getenv abs_srcdir PG_ABS_SRCDIR
SELECT * FROM im.register_device(2701, 'phone');
SELECT * FROM im.register_device(2701, 'tablet');
SELECT * FROM im.register_device(2702, 'phone');
-- without im_sync.push_public_key_file (whatever the server sets): 55000, nothing stored
SET im_sync.push_public_key_file = '';
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701')$$);
-- a file that holds no usable key: 55000 (paths left out of the output)
SELECT set_config('im_sync.push_public_key_file', :'abs_srcdir' || '/test/push/missing.pem', false) IS NOT NULL AS set;
SELECT sqlstate, regexp_replace(message, '"[^"]*"', '"…"') AS message, hint
FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701')$$);
SELECT set_config('im_sync.push_public_key_file', :'abs_srcdir' || '/test/push/not_a_key.pem', false) IS NOT NULL AS set;
SELECT sqlstate, regexp_replace(message, '"[^"]*"', '"…"') AS message
FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701')$$);
SELECT set_config('im_sync.push_public_key_file', :'abs_srcdir' || '/test/push/small_pub.pem', false) IS NOT NULL AS set;
SELECT sqlstate, regexp_replace(message, '"[^"]*"', '"…"') AS message
FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701')$$);
SELECT set_config('im_sync.push_public_key_file', :'abs_srcdir' || '/test/push/ec_pub.pem', false) IS NOT NULL AS set;
SELECT sqlstate, regexp_replace(message, '"[^"]*"', '"…"') AS message
FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701')$$);
SELECT count(*) AS targets FROM im.push_target WHERE user_id = 2701;
-- the relay's key
SELECT set_config('im_sync.push_public_key_file', :'abs_srcdir' || '/test/push/relay_pub.pem', false) IS NOT NULL AS set;
-- bad arguments: 22023 (P0002 for an unknown device), nothing changes
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'FCM', 'app', 'TOKEN-CLEAR-2701')$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', repeat('a', 33), 'app', 'TOKEN-CLEAR-2701')$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', '', 'app', 'TOKEN-CLEAR-2701')$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', '', 'TOKEN-CLEAR-2701')$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', repeat('a', 65), 'TOKEN-CLEAR-2701')$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', '')$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', repeat('t', 4097))$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', NULL)$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701', 'all')$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701', NULL)$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'watch', 'fcm', 'app', 'TOKEN-CLEAR-2701')$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(0, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701')$$);
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'bad id', 'fcm', 'app', 'TOKEN-CLEAR-2701')$$);
SELECT count(*) AS targets FROM im.push_target WHERE user_id = 2701;
-- a 4096-byte token is accepted
SELECT im.register_push_target(2702, 'phone', 'apns', 'app', repeat('t', 4096)) > 0 AS registered;
-- register: one target per device; the token is sealed, never stored in the clear
CREATE TEMP TABLE t1 AS SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701') AS id;
SELECT user_id, device_id, provider, app_id, preview, rejections, disabled_at IS NULL AS enabled,
       sealed_token !~ 'TOKEN' AND position('TOKEN'::bytea IN decode(sealed_token, 'base64')) = 0 AS sealed,
       octet_length(decode(sealed_token, 'base64')) AS sealed_bytes,
       get_byte(decode(sealed_token, 'base64'), 0) AS version
FROM im.push_target WHERE user_id = 2701;
-- the key id is the SHA-256 of the public key's DER, cut to 8 bytes
SELECT substr(decode(sealed_token, 'base64'), 2, 8) =
       substr(sha256(decode(regexp_replace(pg_read_file(:'abs_srcdir' || '/test/push/relay_pub.pem'),
                                           '-----[A-Z ]+-----|\n', '', 'g'), 'base64')), 1, 8) AS key_id_matches
FROM im.push_target WHERE user_id = 2701;
-- sealing is randomized: the same token twice gives two different texts, the same digest
CREATE TEMP TABLE before AS SELECT sealed_token, token_digest FROM im.push_target WHERE user_id = 2701;
SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701', 'sender') = (SELECT id FROM t1) AS same_target;
SELECT p.sealed_token <> b.sealed_token AS resealed, p.token_digest = b.token_digest AS same_digest, p.preview
FROM im.push_target p, before b WHERE p.user_id = 2701;
-- a new token for the device replaces the old one (same target), rejections reset
UPDATE im.push_target SET rejections = 2, disabled_at = now() WHERE user_id = 2701;
SELECT im.register_push_target(2701, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701-NEW') = (SELECT id FROM t1) AS same_target;
SELECT count(*) AS targets, bool_and(rejections = 0 AND disabled_at IS NULL) AS fresh,
       bool_and(p.token_digest <> b.token_digest) AS new_digest
FROM im.push_target p, before b WHERE p.user_id = 2701;
-- the same token registered to another device moves there
SELECT im.register_push_target(2701, 'tablet', 'fcm', 'app', 'TOKEN-CLEAR-2701-NEW') <> (SELECT id FROM t1) AS new_target;
SELECT device_id FROM im.push_target WHERE user_id = 2701 ORDER BY 1;
-- ... also to another user's device; another provider or app_id is another token
SELECT im.register_push_target(2702, 'phone', 'fcm', 'app', 'TOKEN-CLEAR-2701-NEW') > 0 AS registered;
SELECT im.register_push_target(2701, 'phone', 'fcm', 'other-app', 'TOKEN-CLEAR-2701-NEW') > 0 AS registered;
SELECT user_id, device_id, app_id FROM im.push_target WHERE user_id IN (2701, 2702) ORDER BY 1, 2;
-- audit rows name the device, never the token
SELECT action, user_id, device_id, detail - 'push_target_id' AS detail FROM im.audit
WHERE user_id IN (2701, 2702) AND action LIKE '%push%' ORDER BY audit_id;
SELECT count(*) AS audit_rows_with_token FROM im.audit WHERE detail::text ~ 'TOKEN';
-- remove: true once, then false; bad arguments 22023
SELECT im.remove_push_target(2701, 'phone') AS removed, im.remove_push_target(2701, 'phone') AS again;
SELECT im.remove_push_target(2701, 'never') AS unknown_device;
SELECT * FROM pg_temp.fails($$SELECT im.remove_push_target(0, 'phone')$$);
SELECT * FROM pg_temp.fails($$SELECT im.remove_push_target(2701, NULL)$$);
-- revoking a device removes its target
SELECT im.register_push_target(2701, 'tablet', 'fcm', 'app', 'TOKEN-CLEAR-2701-T') > 0 AS registered;
SELECT im.revoke_device(2701, 'tablet');
SELECT count(*) AS targets_of_revoked FROM im.push_target WHERE user_id = 2701 AND device_id = 'tablet';
-- a revoked device cannot register a target
SELECT * FROM pg_temp.fails($$SELECT im.register_push_target(2701, 'tablet', 'fcm', 'app', 'TOKEN-CLEAR-2701-T')$$);
-- the digest key exists once; a role without table privileges sees nothing
SELECT count(*) AS digest_keys FROM im.push_secret;
RESET im_sync.push_public_key_file;
