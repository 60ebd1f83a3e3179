-- Moderator takedowns (contract §17): im.takedown_message appends a
-- `takedown` position under the conversation's writer; every check and
-- SQLSTATE in order; the target a tombstone for every reader (fetch_messages,
-- sync events, snapshot items): body NULL, recalled false, taken_down true;
-- its reactions and pin cleared, replies keep reply_to_message_id, unread
-- drops it as for a recall, a later recall or edit is IS409; the body kept
-- as evidence for the moderation role only and erased by maintenance after
-- im_sync.evidence_retention; the audit row and im.moderation_log; a
-- shared_log conversation gets the takedown as an inbox event.
CREATE DATABASE im_takedown;
\c im_takedown
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
\i sql/include/try_sql.sql
\i sql/include/sync_helpers.sql
-- a position object of fetch_messages / sync, compactly, without ids or times
CREATE FUNCTION pg_temp.shown(e jsonb) RETURNS text LANGUAGE sql AS $f$
SELECT (e->>'kind') || '#' || (e->>'msg_seq')
    || ' body=' || COALESCE(e->>'body', 'NULL')
    || ' recalled=' || (e->>'recalled') || ' taken_down=' || (e->>'taken_down')
    || ' erased=' || (e->>'erased')
    || CASE WHEN e ? 'reply_to_message_id' AND e->'reply_to_message_id' <> 'null'
            THEN ' reply' ELSE '' END
    || CASE WHEN e ? 'reactions' THEN ' reactions=' || (e->>'reactions') ELSE '' END
$f$;
CREATE FUNCTION pg_temp.history(u bigint, c bigint) RETURNS SETOF text LANGUAGE sql AS $f$
SELECT pg_temp.shown(e) FROM im.fetch_messages(u, c, 0, 100) f, jsonb_array_elements(f.messages) e
$f$;

SELECT im.create_conversation('group', ARRAY[1, 2, 3]::bigint[], 1) AS c \gset
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS other \gset
SELECT state FROM im.register_device(2, 'phone');
SELECT status FROM pg_temp.activate(2, 'phone');
SELECT message_id AS m1 FROM im.send_message(1, :c, 'm-1', '{"text": "abuse"}') \gset
SELECT message_id AS m2 FROM im.send_message(2, :c, 'm-2', '{"text": "re"}', 'text', :m1) \gset
SELECT message_id AS m3 FROM im.send_message(1, :c, 'm-3', '{"text": "fine"}') \gset
SELECT message_id AS om FROM im.send_message(1, :other, 'o-1', '{"text": "elsewhere"}') \gset
SELECT created FROM im.react(2, :c, :m1, '👍', true, 'r-1');
SELECT created FROM im.react(3, :c, :m1, '👎', true, 'r-2');
SELECT created FROM im.pin_message(3, :c, :m1, true, 'p-1');
SELECT created FROM im.pin_message(3, :c, :m3, true, 'p-2');
SELECT created FROM im.edit_message(1, :c, 'e-1', :m1, '{"text": "worse abuse"}');
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT user_id, unread_count FROM im.user_conversation WHERE conversation_id = :c ORDER BY 1;

-- arguments 22023
SELECT try_sql(format($$SELECT * FROM im.takedown_message(NULL, %s, %s, 'spam', 'k-1')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('', %s, %s, 'spam', 'k-1')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', NULL, %s, 'spam', 'k-1')$$, :m1));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, NULL, 'spam', 'k-1')$$, :c));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, %s, 'spam', NULL)$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, %s, repeat('x', 1001), 'k-1')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, %s, '', 'k-1')$$, :c, :m1));
-- unknown conversation, then unknown targets P0002: none, another
-- conversation's message, a position that is not a message
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', 999999, %s, 'spam', 'k-1')$$, :m1));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, 999999, 'spam', 'k-1')$$, :c));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, %s, 'spam', 'k-1')$$, :c, :om));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, (SELECT message_id FROM im.event WHERE conversation_id = %s AND kind = 'pin' LIMIT 1), 'spam', 'k-1')$$, :c, :c));
-- bad input changed nothing
SELECT count(*) AS takedowns FROM im.event WHERE kind = 'takedown';

-- the takedown: one position, created; the target a tombstone with its
-- edits and reactions; the pin list without it at the next position
SELECT head_msg_seq AS head_before FROM im.conversation WHERE conversation_id = :c \gset
SELECT message_id AS td, msg_seq - :head_before AS at_next, created
  FROM im.takedown_message('mod-a', :c, :m1, 'spam', 'k-1') \gset
SELECT :at_next AS at_next, :'created' AS created;
SELECT kind, sender_id, client_msg_id, target_message_id = :m1 AS on_m1, body
  FROM im.event WHERE message_id = :td;
SELECT kind, body, recalled, taken_down FROM im.event
 WHERE message_id = :m1 OR target_message_id = :m1 ORDER BY msg_seq;
SELECT msg_seq - :head_before AS after_takedown, body->'pinned' = jsonb_build_array(:m3) AS only_m3
  FROM im.event WHERE conversation_id = :c AND kind = 'pin' ORDER BY msg_seq DESC LIMIT 1;
-- replay: the original, created false; another request under the key IS409,
-- in this conversation or another
SELECT message_id = :td AS same, created FROM im.takedown_message('mod-a', :c, :m1, 'spam', 'k-1');
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, %s, 'other reason', 'k-1')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, %s, 'spam', 'k-1')$$, :c, :m3));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, %s, 'spam', 'k-1')$$, :other, :om));
-- the key is the moderator's: another moderator's k-1 is a new request,
-- and the target is already taken down (IS409)
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-b', %s, %s, 'spam', 'k-1')$$, :c, :m1));
-- a later recall, edit, reaction, pin or reply of it is IS409
SELECT try_sql(format($$SELECT * FROM im.recall_message(1, %s, 'rc-1', %s)$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.edit_message(1, %s, 'ed-2', %s, '{"text": "x"}')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.react(2, %s, %s, 'x', true, 'r-3')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.pin_message(2, %s, %s, true, 'p-3')$$, :c, :m1));
SELECT try_sql(format($$SELECT * FROM im.send_message(2, %s, 'm-4', '{"text": "re"}', 'text', %s)$$, :c, :m1));

-- every reader sees the tombstone: fetch_messages (the reply keeps its
-- target, the takedown carries its reason; the reactions are gone)
SELECT * FROM pg_temp.history(3, :c);
SELECT (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(e) k) AS keys
  FROM im.fetch_messages(3, :c, 0, 100) f, jsonb_array_elements(f.messages) e
 WHERE e->>'kind' = 'message' LIMIT 1;
SELECT e->'reply_to_message_id' = to_jsonb(:m1) AS reply_kept
  FROM im.fetch_messages(3, :c, 0, 100) f, jsonb_array_elements(f.messages) e
 WHERE (e->>'message_id')::bigint = :m2;
-- unread: the taken-down message stops counting, as for a recall
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT user_id, unread_count FROM im.user_conversation WHERE conversation_id = :c ORDER BY 1;
SELECT count(*) AS reconcile_findings FROM im.reconcile();
-- sync: the device sees the message as a tombstone and the takedown event
SELECT e->>'kind' AS kind, e->'body' AS body, e->'recalled' AS recalled, e->'taken_down' AS taken_down,
       e->'erased' AS erased, e->'target_message_id' = to_jsonb(:m1) AS on_m1
  FROM im.sync_changes(2, 'phone', 2, 0) s, jsonb_array_elements(s.events) e
 WHERE (e->>'message_id')::bigint = :m1 OR e->>'kind' = 'takedown' ORDER BY (e->>'sync_seq')::bigint;
-- snapshot items name the taken-down targets
SELECT state FROM im.register_device(3, 'tablet');
SELECT status FROM im.begin_snapshot(3, 'tablet');
SELECT i->'recalled_message_ids' AS recalled, i->'taken_down_message_ids' = jsonb_build_array(:m1) AS taken_down
  FROM im.snapshot s JOIN im.snapshot_page p USING (snapshot_id), jsonb_array_elements(p.items) i
 WHERE s.user_id = 3 AND (i->>'conversation_id')::bigint = :c;

-- a recalled message cannot be taken down (the recall won; its body is gone)
SELECT created FROM im.recall_message(1, :c, 'rc-3', :m3);
SELECT try_sql(format($$SELECT * FROM im.takedown_message('mod-a', %s, %s, NULL, 'k-2')$$, :c, :m3));

-- evidence: the body as it was (the edit's), for the moderation role only
SELECT conversation_id = :c AS conv, sender_id, body, erase_after - taken_down_at AS kept
  FROM im.moderation_evidence(:m1);
SELECT try_sql('SELECT * FROM im.moderation_evidence(NULL)');
SELECT try_sql(format('SELECT * FROM im.moderation_evidence(%s)', :m3));
SET client_min_messages = warning;
DROP ROLE IF EXISTS im_takedown_moderator;
DROP ROLE IF EXISTS im_takedown_gateway;
RESET client_min_messages;
CREATE ROLE im_takedown_moderator NOLOGIN;
CREATE ROLE im_takedown_gateway NOLOGIN;
GRANT USAGE ON SCHEMA im TO im_takedown_moderator, im_takedown_gateway;
GRANT EXECUTE ON FUNCTION im.takedown_message(text, bigint, bigint, text, text),
  im.moderation_evidence(bigint), im.moderation_log(bigint, int) TO im_takedown_moderator;
GRANT EXECUTE ON FUNCTION im.fetch_messages(bigint, bigint, bigint, int, bigint) TO im_takedown_gateway;
SET ROLE im_takedown_moderator;
SELECT body FROM im.moderation_evidence(:m1);
SELECT try_sql('SELECT * FROM im.takedown_evidence');
RESET ROLE;
SET ROLE im_takedown_gateway;
SELECT try_sql(format('SELECT * FROM im.moderation_evidence(%s)', :m1));
SELECT try_sql(format($$SELECT * FROM im.takedown_message('gw', %s, %s, NULL, 'k-9')$$, :c, :m2));
SELECT try_sql('SELECT * FROM im.takedown_evidence');
SELECT try_sql('SELECT * FROM im.moderation_log()');
RESET ROLE;
-- no PUBLIC execute on the moderation functions
SELECT p.oid::regprocedure AS f, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
  FROM pg_proc p WHERE p.proname IN ('takedown_message', 'moderation_evidence', 'moderation_log')
 ORDER BY 1;

-- the audit row and the moderation log
SELECT action, user_id, detail - 'conversation_id' - 'message_id' - 'takedown_message_id' AS detail,
       (detail->>'message_id')::bigint = :m1 AS on_m1
  FROM im.audit WHERE action = 'takedown';
SELECT message_id AS m5 FROM im.send_message(2, :c, 'm-5', '{"text": "more"}') \gset
SELECT created FROM im.takedown_message('mod-b', :c, :m5, NULL, 'k-1');
SELECT moderator, action, user_id, conversation_id = :c AS conv, message_id IN (:m1, :m5) AS target, reason
  FROM im.moderation_log() ORDER BY id;
SELECT id AS first_id FROM im.moderation_log(0, 1) \gset
SELECT moderator FROM im.moderation_log(:first_id, 10);
SELECT try_sql('SELECT * FROM im.moderation_log(-1, 10)');
SELECT try_sql('SELECT * FROM im.moderation_log(NULL, 10)');
SELECT try_sql('SELECT * FROM im.moderation_log(0, 0)');
SELECT try_sql('SELECT * FROM im.moderation_log(0, 1001)');

-- evidence expiry: maintenance (here gc_inbox) erases bodies taken down
-- longer ago than im_sync.evidence_retention, keeps the row (the key) and
-- the younger bodies
UPDATE im.takedown_evidence SET taken_down_at = taken_down_at - interval '2 hours'
 WHERE target_message_id = :m1;
SELECT count(*) >= 0 AS ran FROM im.gc_inbox();
SELECT body IS NOT NULL AS kept FROM im.moderation_evidence(:m1);
SET im_sync.evidence_retention = '1h';
SELECT count(*) >= 0 AS ran FROM im.gc_inbox();
SELECT target_message_id = :m1 AS is_m1, body, erased_at IS NOT NULL AS erased
  FROM im.takedown_evidence ORDER BY taken_down_at;
SELECT body, erase_after = taken_down_at + interval '1h' AS erase_after_ok FROM im.moderation_evidence(:m1);
RESET im_sync.evidence_retention;
-- a retry still answers after the erasure
SELECT message_id = :td AS same, created FROM im.takedown_message('mod-a', :c, :m1, 'spam', 'k-1');

-- shared_log: the takedown is a control event, delivered as an inbox event
SELECT im.set_conversation_mode(:other, 'shared_log') AS mode;
SELECT message_id AS sm FROM im.send_message(1, :other, 'o-2', '{"text": "big group"}') \gset
SELECT created FROM im.takedown_message('mod-a', :other, :sm, 'spam', 'k-3');
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT user_id, kind FROM im.inbox i WHERE i.conversation_id = :other AND i.kind IN ('message', 'takedown')
 ORDER BY user_id, sync_seq;
SELECT * FROM pg_temp.history(2, :other);

\c im_regress
DROP DATABASE im_takedown;
DROP ROLE im_takedown_moderator;
DROP ROLE im_takedown_gateway;
