-- Conversations and membership (contract §2), conversation_list (§7).
-- Runs in its own fresh database so ids are deterministic whatever other
-- regression files do.
CREATE DATABASE im_h1_conv;
\c im_h1_conv
SET client_min_messages = warning;
CREATE EXTENSION btree_gist;
CREATE EXTENSION im_sync;
RESET client_min_messages;
\i sql/include/try_sql.sql
CREATE VIEW periods AS
  SELECT conversation_id, user_id, membership_period_id AS period, join_seq, leave_seq,
         join_event_id, leave_event_id FROM im.membership_period ORDER BY 1, 2, 3;
CREATE VIEW events AS
  SELECT conversation_id, msg_seq, message_id, kind, sender_id, client_msg_id, body,
         subject_user_id, mode FROM im.event ORDER BY 1, 2;

-- group: creator becomes a member, members deduplicated and sorted
SELECT im.create_conversation('group', ARRAY[3, 2, 3]::bigint[], 1);
-- the create event is msg_seq 1 with the sorted member array; periods start there
SELECT * FROM events;
SELECT * FROM periods;
SELECT conversation_id, kind, mode, head_msg_seq, direct_user_lo, direct_user_hi FROM im.conversation;
SELECT conversation_id, msg_seq, source_event_id, state FROM im.outbox ORDER BY 1, 2;
SELECT * FROM im.user_head ORDER BY 1;
SELECT user_id, conversation_id, last_msg_seq, unread_count, version FROM im.user_conversation ORDER BY 1, 2;

-- direct: get-or-create, same id for (a,b), (b,a) and create_conversation('direct')
SELECT im.direct_conversation(5, 4) AS d1, im.direct_conversation(4, 5) AS d2,
       im.create_conversation('direct', ARRAY[4]::bigint[], 5) AS d3,
       im.create_conversation('direct', ARRAY[5, 4, 4]::bigint[]) AS d4;
SELECT * FROM events WHERE conversation_id = 2;
-- group without creator
SELECT im.create_conversation('group', ARRAY[9]::bigint[]);
SELECT im.create_conversation('group', '{}'::bigint[], 8);

-- join: new period starts at the join event; joining again is idempotent
SELECT * FROM im.join_conversation(1, 7);
SELECT * FROM im.join_conversation(1, 7);
SELECT * FROM im.join_conversation(1, 2);
-- leave: leave_seq is the head before the leave event
SELECT * FROM im.leave_conversation(1, 7);
-- re-join: a separate period, nothing in between
SELECT * FROM im.join_conversation(1, 7);
SELECT * FROM events WHERE conversation_id = 1;
SELECT * FROM periods WHERE conversation_id = 1;
SELECT head_msg_seq FROM im.conversation WHERE conversation_id = 1;

-- errors: every one changes nothing
CREATE TEMP TABLE before AS
  SELECT (SELECT count(*) FROM im.event) AS events, (SELECT count(*) FROM im.membership_period) AS periods,
         (SELECT count(*) FROM im.conversation) AS convs, (SELECT count(*) FROM im.outbox) AS outbox,
         (SELECT sum(head_msg_seq) FROM im.conversation) AS heads;
SELECT try_sql($$SELECT im.create_conversation(NULL, ARRAY[1]::bigint[])$$);
SELECT try_sql($$SELECT im.create_conversation('', ARRAY[1]::bigint[])$$);
SELECT try_sql($$SELECT im.create_conversation('channel', ARRAY[1]::bigint[])$$);
SELECT try_sql($$SELECT im.create_conversation('group', NULL)$$);
SELECT try_sql($$SELECT im.create_conversation('group', ARRAY[1, NULL]::bigint[])$$);
SELECT try_sql($$SELECT im.create_conversation('group', ARRAY[1, 0]::bigint[])$$);
SELECT try_sql($$SELECT im.create_conversation('group', ARRAY[-5]::bigint[])$$);
SELECT try_sql($$SELECT im.create_conversation('group', '{}'::bigint[])$$);
SELECT try_sql($$SELECT im.create_conversation('group', ARRAY[[1,2],[3,4]]::bigint[])$$);
SELECT try_sql($$SELECT im.create_conversation('group', ARRAY[1]::bigint[], 0)$$);
SELECT try_sql($$SELECT im.create_conversation('direct', ARRAY[1, 2]::bigint[], 3)$$);
SELECT try_sql($$SELECT im.create_conversation('direct', ARRAY[1, 1]::bigint[])$$);
SELECT try_sql($$SELECT im.create_conversation('direct', ARRAY[1]::bigint[], 1)$$);
SELECT try_sql($$SELECT im.direct_conversation(1, 1)$$);
SELECT try_sql($$SELECT im.direct_conversation(NULL, 1)$$);
SELECT try_sql($$SELECT im.direct_conversation(1, 0)$$);
SELECT try_sql($$SELECT * FROM im.join_conversation(NULL, 1)$$);
SELECT try_sql($$SELECT * FROM im.join_conversation(1, NULL)$$);
SELECT try_sql($$SELECT * FROM im.join_conversation(1, -1)$$);
SELECT try_sql($$SELECT * FROM im.join_conversation(999, 1)$$);
SELECT try_sql($$SELECT * FROM im.join_conversation(2, 6)$$);
SELECT try_sql($$SELECT * FROM im.leave_conversation(2, 4)$$);
SELECT try_sql($$SELECT * FROM im.leave_conversation(999, 1)$$);
SELECT try_sql($$SELECT * FROM im.leave_conversation(1, 6)$$);
SELECT try_sql($$SELECT * FROM im.leave_conversation(NULL, 6)$$);
SELECT im.leave_conversation(1, 3);
SELECT try_sql($$SELECT * FROM im.leave_conversation(1, 3)$$);
SELECT (SELECT count(*) FROM im.event) - 1 = events AS events_unchanged,
       (SELECT count(*) FROM im.membership_period) = periods AS periods_unchanged,
       (SELECT count(*) FROM im.conversation) = convs AS convs_unchanged,
       (SELECT count(*) FROM im.outbox) - 1 = outbox AS outbox_unchanged,
       (SELECT sum(head_msg_seq) FROM im.conversation) - 1 = heads AS heads_unchanged
FROM before;

-- the database refuses overlapping periods and a second open period
SELECT try_sql($$INSERT INTO im.membership_period (conversation_id, user_id, join_seq, leave_seq, join_event_id, leave_event_id)
                 VALUES (1, 7, 3, 4, 1, 1)$$);
SELECT try_sql($$INSERT INTO im.membership_period (conversation_id, user_id, join_seq, join_event_id)
                 VALUES (1, 1, 100, 1)$$);

-- conversation_list: every conversation the user has or had a period in
SELECT * FROM im.conversation_list(7);
SELECT * FROM im.conversation_list(3);
SELECT conversation_id, kind, head_msg_seq FROM im.conversation_list(4);
-- paging
SELECT im.create_conversation('group', ARRAY[1]::bigint[]);
SELECT conversation_id FROM im.conversation_list(1, 1);
SELECT conversation_id FROM im.conversation_list(1, 1, 1);
SELECT conversation_id FROM im.conversation_list(1, 100, 5);
SELECT conversation_id FROM im.conversation_list(1, 1000, NULL);
SELECT count(*) FROM im.conversation_list(424242);
SELECT try_sql($$SELECT * FROM im.conversation_list(1, 0)$$);
SELECT try_sql($$SELECT * FROM im.conversation_list(1, 1001)$$);
SELECT try_sql($$SELECT * FROM im.conversation_list(1, NULL)$$);
SELECT try_sql($$SELECT * FROM im.conversation_list(NULL)$$);

\c im_regress
DROP DATABASE im_h1_conv;
