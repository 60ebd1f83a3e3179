-- fetch_messages (contract §6) and the visibility rule of contract §1:
-- closed intervals over several periods, recall/edit by their target's
-- coverage, the leaver's own leave event, deleted-for-me hidden, errors.
-- Sequences are pinned so ids in the output are deterministic.
SELECT setval('im.conversation_id_seq', 8000) IS NOT NULL AS pinned,
       setval('im.event_id_seq', 80000) IS NOT NULL AS pinned_events,
       setval('im.membership_period_id_seq', 8000) IS NOT NULL AS pinned_periods;

\i sql/include/err.sql
-- positions of a page as "msg_seq:kind", plus the paging columns
CREATE FUNCTION pg_temp.page(u bigint, c bigint, a bigint, l int DEFAULT 100, t bigint DEFAULT NULL)
RETURNS TABLE(positions text, next_after_seq bigint, has_more boolean)
LANGUAGE sql AS $$
  SELECT (SELECT string_agg(format('%s:%s', m->>'msg_seq', m->>'kind'), ' ' ORDER BY (m->>'msg_seq')::int)
          FROM jsonb_array_elements(f.messages) m),
         f.next_after_seq, f.has_more
  FROM im.fetch_messages(u, c, a, l, t) f $$;
-- the positions of one user, with body and recall state
CREATE FUNCTION pg_temp.view(u bigint, c bigint)
RETURNS TABLE(msg_seq int, kind text, sender_id bigint, body jsonb, target_message_id bigint, recalled boolean)
LANGUAGE sql AS $$
  SELECT (m->>'msg_seq')::int, m->>'kind', (m->>'sender_id')::bigint, m->'body',
         (m->>'target_message_id')::bigint, (m->>'recalled')::boolean
  FROM im.fetch_messages(u, c, 0, 1000) f, jsonb_array_elements(f.messages) m
  ORDER BY 1 $$;

-- 8001 alice, 8002 bob, 8003 carol (leaves, rejoins), 8004 dave (joins late), 8005 never a member
SELECT im.create_conversation('group', ARRAY[8001, 8002, 8003]::bigint[], 8001) AS c \gset
SELECT msg_seq FROM im.send_message(8001, :c, 'h-1', '{"text": "one"}');           -- 2
SELECT msg_seq FROM im.send_message(8002, :c, 'h-2', '{"text": "two"}');           -- 3
SELECT leave_seq FROM im.leave_conversation(:c, 8003);                             -- leave event 4
SELECT msg_seq FROM im.send_message(8001, :c, 'h-3', '{"text": "three"}');         -- 5
SELECT join_seq FROM im.join_conversation(:c, 8004);                               -- 6
SELECT message_id AS m2 FROM im.event WHERE conversation_id = :c AND msg_seq = 2 \gset
SELECT message_id AS m5 FROM im.event WHERE conversation_id = :c AND msg_seq = 5 \gset
SELECT msg_seq FROM im.recall_message(8001, :c, 'h-r2', :m2);                      -- 7
SELECT msg_seq FROM im.edit_message(8001, :c, 'h-e5', :m5, '{"text": "three!"}');  -- 8
SELECT join_seq FROM im.join_conversation(:c, 8003);                               -- 9
SELECT message_id AS m10 FROM im.send_message(8002, :c, 'h-4', '{"text": "four"}') \gset
SELECT msg_seq FROM im.edit_message(8002, :c, 'h-e10', :m10, '{"text": "four!"}'); -- 11
SELECT message_id AS m12 FROM im.send_message(8001, :c, 'h-5', '{"text": "five"}') \gset
SELECT msg_seq FROM im.edit_message(8001, :c, 'h-e12', :m12, '{"text": "five!"}'); -- 13
SELECT msg_seq FROM im.recall_message(8001, :c, 'h-r12', :m12);                    -- 14

-- exactly the keys of contract §11
SELECT array_agg(k ORDER BY k) AS keys
FROM im.fetch_messages(8001, :c, 0, 1) f, jsonb_object_keys(f.messages->0) k;

-- alice: every position; recalled message 2 and the edit 13 of the recalled
-- message 12 carry no body; message 5 shows the edited text
SELECT * FROM pg_temp.view(8001, :c);

-- carol: first period [1,3] plus her own leave (4), the recall 7 of message 2
-- (target inside her first period), nothing of 5..8 otherwise (the edit 8
-- targets message 5, outside her periods), then her second period from 9
SELECT * FROM pg_temp.view(8003, :c);

-- dave joined at 6: neither message 2 nor its recall 7, nor the edit 8 of
-- message 5 (sent before he joined)
SELECT * FROM pg_temp.view(8004, :c);

-- paging: page_limit, next_after_seq, has_more, up_to_seq
SELECT * FROM pg_temp.page(8003, :c, 0, 2);
SELECT * FROM pg_temp.page(8003, :c, 3, 2);
SELECT * FROM pg_temp.page(8003, :c, 7, 2);
SELECT * FROM pg_temp.page(8003, :c, 10, 2);
SELECT * FROM pg_temp.page(8003, :c, 14, 2);
SELECT * FROM pg_temp.page(8003, :c, 0, 100, 8);
SELECT * FROM pg_temp.page(8003, :c, 4, 100, 8);      -- in (4,8] only the recall 7
SELECT * FROM pg_temp.page(8003, :c, 0, 1000, 1000);  -- up_to_seq beyond the head

-- deleted for me: dave hides message 10, and with it its edit 11
SELECT im.delete_for_me(8004, :c, :m10) AS deleted;
SELECT im.delete_for_me(8004, :c, :m10) AS deleted_again;
SELECT * FROM pg_temp.page(8004, :c, 0);
SELECT * FROM pg_temp.page(8002, :c, 0);               -- bob still has it

-- errors: each changes nothing
SELECT pg_temp.err(format('SELECT im.fetch_messages(8005, %s, 0)', :c)) AS never_member;
SELECT pg_temp.err('SELECT im.fetch_messages(8001, 999999999, 0)') AS unknown_conversation;
SELECT pg_temp.err(format('SELECT im.fetch_messages(8001, %s, 0, 0)', :c)) AS page_limit_0;
SELECT pg_temp.err(format('SELECT im.fetch_messages(8001, %s, 0, 1001)', :c)) AS page_limit_1001;
SELECT pg_temp.err(format('SELECT im.fetch_messages(8001, %s, NULL)', :c)) AS after_seq_null;
SELECT pg_temp.err(format('SELECT im.fetch_messages(8001, %s, -1)', :c)) AS after_seq_negative;
SELECT pg_temp.err(format('SELECT im.fetch_messages(8001, %s, 0, 10, -5)', :c)) AS up_to_seq_negative;
SELECT pg_temp.err(format('SELECT im.fetch_messages(NULL, %s, 0)', :c)) AS user_null;
SELECT pg_temp.err('SELECT im.fetch_messages(8001, 0, 0)') AS conversation_zero;
SELECT pg_temp.err(format('SELECT im.delete_for_me(8004, %s, %s)', :c, :m2)) AS delete_invisible;
SELECT pg_temp.err(format('SELECT im.delete_for_me(8005, %s, %s)', :c, :m10)) AS delete_never_member;

-- shared_log conversations are read through the same rule
SELECT im.create_conversation('group', ARRAY[8001, 8002]::bigint[], 8001) AS c2 \gset
SELECT im.set_conversation_mode(:c2, 'shared_log');
SELECT msg_seq FROM im.send_message(8002, :c2, 'h-s1', '{"text": "big"}');
SELECT join_seq FROM im.join_conversation(:c2, 8003);
SELECT msg_seq FROM im.send_message(8001, :c2, 'h-s2', '{"text": "bigger"}');
SELECT * FROM pg_temp.page(8001, :c2, 0);
SELECT * FROM pg_temp.page(8003, :c2, 0);

-- 撤回 (§12.4): a device offline while a message is sent and recalled never
-- gets the recalled body, neither through sync nor through fetch_messages
SELECT im.direct_conversation(8001, 8006) AS d \gset
SELECT state FROM im.register_device(8006, 'old-phone');
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT snapshot_token AS tok, manifest_digest AS md, sync_generation AS g, base_sync_seq AS s
FROM im.begin_snapshot(8006, 'old-phone') \gset
SELECT status, acked_sync_seq FROM im.ack_snapshot(8006, 'old-phone', :'tok', :'md');
-- the device goes offline; the message is sent, fanned out, recalled, fanned out
SELECT message_id AS secret FROM im.send_message(8001, :d, 'h-secret', '{"text": "secret"}') \gset
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
SELECT msg_seq FROM im.recall_message(8001, :d, 'h-r-secret', :secret);
SELECT im.run_fanout() IS NOT NULL AS fanned_out;
-- back online: it syncs from its ACK
SELECT ev->>'sync_seq' AS sync_seq, ev->>'kind' AS kind, ev->'body' AS body, ev->>'recalled' AS recalled
FROM im.sync_changes(8006, 'old-phone', :g, :s) sc, jsonb_array_elements(sc.events) ev
ORDER BY (ev->>'sync_seq')::int;
SELECT count(*) AS bodies_with_secret
FROM im.sync_changes(8006, 'old-phone', :g, :s) sc, jsonb_array_elements(sc.events) ev
WHERE ev::text LIKE '%secret%';
SELECT count(*) AS fetched_with_secret
FROM im.fetch_messages(8006, :d, 0) f, jsonb_array_elements(f.messages) m
WHERE m::text LIKE '%secret%';
