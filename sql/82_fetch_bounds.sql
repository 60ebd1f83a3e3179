-- fetch_messages reads what the user's periods bound, not the range up to
-- the head: a former member whose period ended at msg_seq
-- 10 of a conversation with 5,000 positions reads a few dozen rows of
-- im.event, counted from this backend's own statistics of the transaction
-- (pg_stat_xact_user_tables: rows read by sequential and index scans).
-- 8201 is the former member, 8202 the sender, 8203 an active member.
SELECT im.create_conversation('group', ARRAY[8201, 8202, 8203]::bigint[], 8202) AS c \gset
SELECT count(*) AS sent FROM generate_series(2, 10) g,
       LATERAL im.send_message(8202, :c, 'fb-' || g, jsonb_build_object('n', g));
SELECT leave_seq FROM im.leave_conversation(:c, 8201);
SELECT count(*) AS sent FROM generate_series(12, 5000) g,
       LATERAL im.send_message(8202, :c, 'fb-' || g, jsonb_build_object('n', g));
-- after the leave: a recall and an edit of messages inside 8201's period
-- (8201 sees both), an edit of a message after it (8201 sees nothing)
SELECT message_id AS m5 FROM im.event WHERE conversation_id = :c AND msg_seq = 5 \gset
SELECT message_id AS m6 FROM im.event WHERE conversation_id = :c AND msg_seq = 6 \gset
SELECT message_id AS m100 FROM im.event WHERE conversation_id = :c AND msg_seq = 100 \gset
SELECT msg_seq FROM im.recall_message(8202, :c, 'fb-r5', :m5);
SELECT msg_seq FROM im.edit_message(8202, :c, 'fb-e6', :m6, '{"n": "six"}');
SELECT msg_seq FROM im.edit_message(8202, :c, 'fb-e100', :m100, '{"n": "hundred"}');
ANALYZE im.event, im.membership_period;

-- rows of im.event this transaction has read so far
CREATE FUNCTION pg_temp.event_rows_read() RETURNS bigint LANGUAGE sql AS $$
  SELECT seq_tup_read + COALESCE(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
  WHERE relid = 'im.event'::regclass $$;
-- one fetch_messages page: its positions, paging columns and the rows read
CREATE FUNCTION pg_temp.fetch_counted(u bigint, c bigint, a bigint, l int)
RETURNS TABLE(positions text, next_after_seq bigint, has_more boolean, rows_read bigint)
LANGUAGE plpgsql AS $$
DECLARE before bigint := pg_temp.event_rows_read();
BEGIN
  RETURN QUERY
  SELECT (SELECT string_agg(format('%s:%s', m->>'msg_seq', m->>'kind'), ' ' ORDER BY (m->>'msg_seq')::int)
          FROM jsonb_array_elements(f.messages) m),
         f.next_after_seq, f.has_more, pg_temp.event_rows_read() - before
  FROM im.fetch_messages(u, c, a, l) f;
END $$;

SELECT head_msg_seq FROM im.conversation WHERE conversation_id = :c;

-- The former member: its period 1..10, its own leave 11, the recall and the
-- edit of its messages.  Before this change the page query scanned (0, head]
-- and read all 5,003 rows; now a few dozen (the period, the targets' index
-- probes, the page).
BEGIN;
SELECT positions, next_after_seq, has_more, rows_read <= 60 AS bounded_by_period
FROM pg_temp.fetch_counted(8201, :c, 0, 100);
SELECT positions, next_after_seq, has_more, rows_read <= 30 AS bounded_by_period
FROM pg_temp.fetch_counted(8201, :c, 11, 100);
SELECT positions, next_after_seq, has_more, rows_read <= 30 AS bounded_by_page
FROM pg_temp.fetch_counted(8201, :c, 0, 5);
-- an active member reads about one page, wherever it starts
SELECT positions, next_after_seq, has_more, rows_read <= 30 AS bounded_by_page
FROM pg_temp.fetch_counted(8203, :c, 4900, 5);
SELECT rows_read <= 3 * 101 AS bounded_by_page FROM pg_temp.fetch_counted(8203, :c, 0, 100);
COMMIT;

-- 8201 joins again: its second period is read from the join on, the stretch
-- between the periods is never scanned
SELECT join_seq FROM im.join_conversation(:c, 8201);
SELECT count(*) AS sent FROM generate_series(1, 3) g,
       LATERAL im.send_message(8202, :c, 'fb-again-' || g, jsonb_build_object('n', g));
BEGIN;
SELECT positions, next_after_seq, has_more, rows_read <= 40 AS bounded_by_periods
FROM pg_temp.fetch_counted(8201, :c, 10, 100);
COMMIT;
