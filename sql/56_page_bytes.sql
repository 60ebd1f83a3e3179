-- Pages bounded by bytes: with im_sync.max_page_bytes
-- shrunk, sync_changes and fetch_messages pages end before the event that
-- would push their JSON text over it (at least one event per page, has_more
-- true, a cursor / next_after_seq right after the last event), so every
-- event is obtained exactly once and in order; snapshot pages are bounded
-- the same way.  5601 reads, 5602 sends; bodies of 40 to 1,600 bytes.
SHOW im_sync.max_page_bytes;
SELECT im.create_conversation('group', ARRAY[5601, 5602]::bigint[], 5602) AS c \gset
SELECT state FROM im.register_device(5601, 'phone');
SELECT count(*) AS sent FROM generate_series(1, 60) g,
       LATERAL im.send_message(5602, :c, 'pb-' || g,
                               jsonb_build_object('i', g, 't', repeat('x', (g * 37) % 400 + 40)));
-- one body larger than any page below: it travels alone
SELECT msg_seq FROM im.send_message(5602, :c, 'pb-big', jsonb_build_object('i', 61, 't', repeat('y', 1600)));
SELECT count(*) AS sent FROM generate_series(62, 70) g,
       LATERAL im.send_message(5602, :c, 'pb-' || g, jsonb_build_object('i', g, 't', repeat('z', 100)));
SELECT im.run_fanout() > 0 AS fanned_out;

-- the device installs an empty-ish snapshot first, then syncs the log
SELECT snapshot_token AS tok, manifest_digest AS dig, sync_generation AS gen
FROM im.begin_snapshot(5601, 'phone') \gset
SELECT status FROM im.ack_snapshot(5601, 'phone', :'tok', :'dig');
SELECT count(*) AS resent FROM generate_series(1, 70) g,
       LATERAL im.send_message(5602, :c, 'pb2-' || g,
                               jsonb_build_object('i', g, 't', repeat('w', (g * 53) % 500 + 20)));
SELECT msg_seq FROM im.send_message(5602, :c, 'pb2-big', jsonb_build_object('i', 71, 't', repeat('v', 1600)));
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT high_watermark AS hw FROM im.user_head WHERE user_id = 5601 \gset
SELECT acked_sync_seq AS ack FROM im.device WHERE user_id = 5601 AND device_id = 'phone' \gset

SET im_sync.max_page_bytes = 1000;

-- every page of one sync batch: (page, events, bytes, has_more)
CREATE FUNCTION pg_temp.sync_pages(u bigint, d text, gen int, la bigint)
RETURNS TABLE(page int, n int, bytes int, first_seq bigint, last_seq bigint, has_more boolean)
LANGUAGE plpgsql AS $$
DECLARE r record; cur text := NULL; p int := 0;
BEGIN
  LOOP
    SELECT * INTO r FROM im.sync_changes(u, d, gen, la, 1000, cur);
    p := p + 1;
    page := p; n := jsonb_array_length(r.events); bytes := octet_length(r.events::text);
    first_seq := (r.events->0->>'sync_seq')::bigint; last_seq := (r.events->-1->>'sync_seq')::bigint;
    has_more := r.has_more;
    INSERT INTO got_sync SELECT (e->>'sync_seq')::bigint, octet_length(e::text) FROM jsonb_array_elements(r.events) e;
    RETURN NEXT;
    EXIT WHEN NOT r.has_more OR p > 200;
    cur := r.next_cursor;
  END LOOP;
END $$;
CREATE TEMP TABLE got_sync (sync_seq bigint, len int);
CREATE TEMP TABLE sync_page AS SELECT * FROM pg_temp.sync_pages(5601, 'phone', :gen, :ack);
-- more than one page, every page within the limit or a single event, only
-- the last without has_more
SELECT count(*) > 10 AS many_pages,
       bool_and(bytes <= 1000 OR n = 1) AS within_limit,
       count(*) FILTER (WHERE bytes > 1000) AS single_oversized_pages,
       bool_and(has_more = (page < (SELECT max(page) FROM sync_page))) AS has_more_until_last,
       bool_and(n >= 1) AS never_empty
FROM sync_page;
-- exactly the log (ack, hw], once each, in order
SELECT (SELECT array_agg(sync_seq ORDER BY sync_seq) FROM got_sync)
       = (SELECT array_agg(i.sync_seq ORDER BY i.sync_seq) FROM im.inbox i
          WHERE i.user_id = 5601 AND i.sync_seq > :ack)
       AS every_event_once,
       (SELECT count(*) = count(DISTINCT sync_seq) FROM got_sync) AS no_repeats,
       (SELECT max(last_seq) FROM sync_page) = :hw AS reaches_watermark,
       (SELECT bool_and(s1.first_seq = s0.last_seq + 1) FROM sync_page s0 JOIN sync_page s1 ON s1.page = s0.page + 1)
       AS pages_adjacent;
-- every page cut by bytes is full: its next event would have pushed it over
-- (the text length of each event is summed in C, event_json.c)
SELECT bool_and(s.bytes + g.len + 2 > 1000) AS cut_pages_full
FROM sync_page s JOIN got_sync g ON g.sync_seq = s.last_seq + 1
WHERE s.has_more;
-- a page cut by bytes still fits a whole page limit's worth when events are small
SELECT n AS events_in_first_page, has_more FROM pg_temp.sync_pages(5601, 'phone', :gen, :ack) LIMIT 1;

-- fetch_messages: every page of the conversation for 5601
CREATE FUNCTION pg_temp.history_pages(u bigint, c bigint)
RETURNS TABLE(page int, n int, bytes int, first_seq bigint, last_seq bigint, has_more boolean)
LANGUAGE plpgsql AS $$
DECLARE r record; after bigint := 0; p int := 0;
BEGIN
  LOOP
    SELECT * INTO r FROM im.fetch_messages(u, c, after, 1000);
    p := p + 1;
    page := p; n := jsonb_array_length(r.messages); bytes := octet_length(r.messages::text);
    first_seq := (r.messages->0->>'msg_seq')::bigint; last_seq := (r.messages->-1->>'msg_seq')::bigint;
    has_more := r.has_more;
    INSERT INTO got_msg SELECT (m->>'msg_seq')::bigint FROM jsonb_array_elements(r.messages) m;
    RETURN NEXT;
    EXIT WHEN NOT r.has_more OR p > 400;
    IF r.next_after_seq <> last_seq THEN RAISE 'next_after_seq % is not the last position %', r.next_after_seq, last_seq; END IF;
    after := r.next_after_seq;
  END LOOP;
END $$;
CREATE TEMP TABLE got_msg (msg_seq bigint);
CREATE TEMP TABLE history_page AS SELECT * FROM pg_temp.history_pages(5601, :c);
SELECT count(*) > 20 AS many_pages,
       bool_and(bytes <= 1000 OR n = 1) AS within_limit,
       count(*) FILTER (WHERE bytes > 1000) AS single_oversized_pages,
       bool_and(has_more = (page < (SELECT max(page) FROM history_page))) AS has_more_until_last,
       bool_and(n >= 1) AS never_empty
FROM history_page;
SELECT (SELECT array_agg(msg_seq ORDER BY msg_seq) FROM got_msg)
       = (SELECT array_agg(g ORDER BY g) FROM generate_series(1, (SELECT head_msg_seq FROM im.conversation WHERE conversation_id = :c)) g)
       AS every_position_once,
       (SELECT count(*) = count(DISTINCT msg_seq) FROM got_msg) AS no_repeats;

-- snapshot pages: 5603 is in 40 conversations (with 5701..5740); each page within the limit
-- (or one item), every conversation once, the digests still prove the pages
SELECT count(*) AS conversations FROM generate_series(1, 40) g,
       LATERAL im.create_conversation('group', ARRAY[5603, 5700 + g]::bigint[], 5700 + g) c;
SELECT state FROM im.register_device(5603, 'phone');
SELECT im.run_fanout() > 0 AS fanned_out;
SELECT snapshot_token AS tok3, manifest_digest AS dig3, page_count AS pages3
FROM im.begin_snapshot(5603, 'phone') \gset
SELECT :pages3 > 1 AS several_pages,
       bool_and(octet_length(f.items::text) <= 1000 OR jsonb_array_length(f.items) = 1) AS within_limit,
       sum(jsonb_array_length(f.items)) AS items,
       bool_and(f.page_digest = encode(sha256(convert_to(f.items::text, 'UTF8')), 'hex')) AS page_digests_ok
FROM generate_series(0, :pages3 - 1) p, im.fetch_snapshot(5603, 'phone', :'tok3', p) f;
SELECT count(DISTINCT i->>'conversation_id') AS distinct_conversations,
       array_agg((i->>'conversation_id')::bigint ORDER BY p, o)
         = array_agg((i->>'conversation_id')::bigint ORDER BY (i->>'conversation_id')::bigint) AS in_order
FROM generate_series(0, :pages3 - 1) p, im.fetch_snapshot(5603, 'phone', :'tok3', p) f,
     jsonb_array_elements(f.items) WITH ORDINALITY AS x(i, o);
SELECT encode(sha256(convert_to(string_agg(f.page_digest, '' ORDER BY f.page), 'UTF8')), 'hex') = :'dig3' AS manifest_ok
FROM generate_series(0, :pages3 - 1) p, im.fetch_snapshot(5603, 'phone', :'tok3', p) f;
SELECT status FROM im.ack_snapshot(5603, 'phone', :'tok3', :'dig3');
RESET im_sync.max_page_bytes;
-- with the default, the same snapshot would be one page of 40 items
SELECT page_count AS default_pages FROM im.begin_snapshot(5603, 'phone');
