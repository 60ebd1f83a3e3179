-- Notification settings and presence (contract §13).
-- Users 2801..2899 belong to this file.
\i sql/include/fails.sql
SELECT im.create_conversation('group', ARRAY[2801, 2802]::bigint[], 2801) AS c \gset
SELECT im.create_conversation('group', ARRAY[2802]::bigint[], 2802) AS other \gset
CREATE VIEW settings AS
  SELECT conversation_id = 0 AS account, CASE WHEN mute_until IS NULL THEN 'unset'
         WHEN mute_until = 'infinity' THEN 'for ever' WHEN mute_until > now() THEN 'future' ELSE 'past' END AS mute,
         coalesce(preview, 'unset') AS preview
  FROM im.notify_setting WHERE user_id = 2801 ORDER BY conversation_id;
-- account default: mute for ever; NULL keeps the other field
SELECT im.set_notify(2801, mute_until => 'infinity');
SELECT * FROM settings;
SELECT im.set_notify(2801, preview => 'sender');
SELECT * FROM settings;
-- a past time unmutes (and is kept: an override's past time beats an account mute)
SELECT im.set_notify(2801, mute_until => now() - interval '1 minute');
SELECT * FROM settings;
-- a conversation override, field by field
SELECT im.set_notify(2801, :c, mute_until => now() + interval '1 hour');
SELECT * FROM settings;
SELECT im.set_notify(2801, :c, preview => 'none');
SELECT * FROM settings;
-- clear drops the override; with a field it starts a fresh one
SELECT im.set_notify(2801, :c, clear => true);
SELECT * FROM settings;
SELECT im.set_notify(2801, :c, preview => 'full', clear => true);
SELECT * FROM settings;
SELECT im.set_notify(2801, :c, clear => true);
-- nothing given: nothing changes
SELECT im.set_notify(2801, :c);
SELECT * FROM settings;
-- bad arguments
SELECT * FROM pg_temp.fails($$SELECT im.set_notify(2801, preview => 'all')$$);
SELECT * FROM pg_temp.fails($$SELECT im.set_notify(2801, clear => true)$$);
SELECT * FROM pg_temp.fails(format($$SELECT im.set_notify(2801, %s, preview => 'none')$$, :other));
SELECT * FROM pg_temp.fails($$SELECT im.set_notify(2801, 0, preview => 'none')$$);
SELECT * FROM pg_temp.fails($$SELECT im.set_notify(0)$$);
SELECT * FROM pg_temp.fails($$SELECT im.set_notify(NULL)$$);
SELECT * FROM settings;

-- presence: only the device's current connection epoch counts
SELECT * FROM im.register_device(2801, 'phone');
SELECT * FROM im.register_device(2801, 'tablet');
SELECT connection_epoch FROM im.authenticate(im.issue_device_token(2801, 'phone'));
CREATE VIEW online AS
  SELECT p.device_id, p.connection_epoch, p.expires_at > now() AS unexpired,
         p.connection_epoch = d.connection_epoch AS current_epoch
  FROM im.presence p JOIN im.device d USING (user_id, device_id) WHERE p.user_id = 2801 ORDER BY 1;
SELECT im.set_presence(2801, 'phone', 1, true) AS current;
SELECT im.set_presence(2801, 'phone', 0, true) AS older_epoch;
SELECT im.set_presence(2801, 'tablet', 0, true, '30 seconds') AS current;
SELECT * FROM online;
-- refresh: many at once; unknown, superseded or closed sessions are not renewed
SELECT im.refresh_presence('{2801,2801,2801,2801}', '{phone,tablet,tablet,watch}', '{1,0,0,0}', '2 minutes') AS refreshed;
SELECT im.refresh_presence('{2801}', '{phone}', '{0}') AS refreshed_old_epoch;
SELECT im.refresh_presence('{}', '{}', '{}') AS refreshed_none;
SELECT device_id, expires_at > now() + interval '100 seconds' AS renewed FROM im.presence WHERE user_id = 2801 ORDER BY 1;
-- a close of the older epoch changes nothing; the current one goes offline
SELECT im.set_presence(2801, 'phone', 0, false) AS older_epoch;
SELECT im.set_presence(2801, 'phone', 1, false) AS current;
SELECT * FROM online;
SELECT im.refresh_presence('{2801}', '{phone}', '{1}') AS refreshed_after_close;
-- a new connection epoch supersedes the old presence
SELECT connection_epoch FROM im.authenticate(im.issue_device_token(2801, 'tablet'));
SELECT im.set_presence(2801, 'tablet', 0, false) AS superseded_close;
SELECT * FROM online;
-- bad arguments
SELECT * FROM pg_temp.fails($$SELECT im.set_presence(2801, 'phone', 1, true, '0 seconds')$$);
SELECT * FROM pg_temp.fails($$SELECT im.set_presence(2801, 'phone', 1, true, '2 days')$$);
SELECT * FROM pg_temp.fails($$SELECT im.set_presence(2801, 'phone', NULL, true)$$);
SELECT * FROM pg_temp.fails($$SELECT im.set_presence(2801, 'phone', 1, NULL)$$);
SELECT * FROM pg_temp.fails($$SELECT im.set_presence(2801, 'b d', 7, true)$$);
SELECT * FROM pg_temp.fails($$SELECT im.set_presence(-1, 'phone', 1, true)$$);
SELECT * FROM pg_temp.fails($$SELECT im.refresh_presence('{2801}', '{phone,tablet}', '{1}')$$);
SELECT * FROM pg_temp.fails($$SELECT im.refresh_presence('{2801}', '{NULL}', '{7}')$$);
SELECT * FROM pg_temp.fails($$SELECT im.refresh_presence('{0}', '{phone}', '{7}')$$);
SELECT * FROM pg_temp.fails($$SELECT im.refresh_presence(NULL, '{phone}', '{7}')$$);
SELECT * FROM pg_temp.fails($$SELECT im.refresh_presence('{{2801}}', '{{phone}}', '{{7}}')$$);
SELECT * FROM pg_temp.fails($$SELECT im.refresh_presence('{2801}', '{phone}', '{7}', '-1 second')$$);
-- an unknown device is not current
SELECT im.set_presence(2801, 'watch', 0, true) AS unknown_device;
