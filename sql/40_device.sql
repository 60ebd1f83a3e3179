-- Device lifecycle (contract §5): register, re-register, revoke, session.
-- Users 4001..4099 belong to this file.
\i sql/include/fails.sql
SELECT * FROM im.register_device(4001, 'phone');
-- existing device: same generation and state, no second audit row
SELECT * FROM im.register_device(4001, 'phone');
SELECT * FROM im.register_device(4001, 'desk-top_1.0');
-- registration creates the user's sync head
SELECT user_id, high_watermark, gc_floor FROM im.user_head WHERE user_id = 4001;
-- bad arguments: 22023, nothing changes
SELECT * FROM pg_temp.fails($$SELECT * FROM im.register_device(4001, 'has space')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.register_device(4001, 'a:b')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.register_device(4001, '')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.register_device(4001, repeat('x', 65))$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.register_device(4001, NULL)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.register_device(0, 'phone')$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.register_device(NULL, 'phone')$$);
SELECT count(*) AS devices FROM im.device WHERE user_id = 4001;
-- device_session: the gateway's welcome data; current = same connection epoch
SELECT * FROM im.device_session(4001, 'phone', 0);
SELECT * FROM im.device_session(4001, 'phone', 1);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.device_session(4001, 'phone', NULL)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.device_session(4001, 'tablet', 0)$$);
-- revoke: true now, false when already revoked, P0002 when unknown
SELECT im.revoke_device(4001, 'phone');
SELECT im.revoke_device(4001, 'phone');
SELECT * FROM pg_temp.fails($$SELECT im.revoke_device(4001, 'tablet')$$);
SELECT * FROM pg_temp.fails($$SELECT im.revoke_device(4099, 'phone')$$);
SELECT state, sync_generation, registration, revoked_at IS NOT NULL AS revoked_at_set
  FROM im.device WHERE user_id = 4001 AND device_id = 'phone';
SELECT * FROM im.device_session(4001, 'phone', 0);
-- re-registration of a revoked device: NEW, generation + 1, registration + 1
SELECT * FROM im.register_device(4001, 'phone');
SELECT state, sync_generation, registration, revoked_at IS NULL AS revoked_at_cleared
  FROM im.device WHERE user_id = 4001 AND device_id = 'phone';
-- revoked and re-registered again
SELECT im.revoke_device(4001, 'phone');
SELECT * FROM im.register_device(4001, 'phone');
-- the other device was untouched
SELECT state, sync_generation, registration FROM im.device
 WHERE user_id = 4001 AND device_id = 'desk-top_1.0';
-- audit: who, which device, what; never a token
SELECT action, user_id, device_id, actor = session_user AS by_caller, detail
  FROM im.audit WHERE user_id = 4001 ORDER BY audit_id;
-- every function naming a never-registered device raises P0002
SELECT * FROM pg_temp.fails($$SELECT * FROM im.sync_changes(4001, 'ghost', 1, 0)$$);
SELECT * FROM pg_temp.fails($$SELECT * FROM im.ack_sync(4001, 'ghost', 'x', 0)$$);
SELECT * FROM pg_temp.fails($$SELECT im.issue_device_token(4001, 'ghost')$$);
