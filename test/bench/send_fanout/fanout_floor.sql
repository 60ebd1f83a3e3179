-- The fanout floor: the same inbox rows (one per member per pending
-- message, sync_seq numbered per user) in one bare INSERT ... SELECT.
INSERT INTO bench.inbox (user_id, sync_seq, source_event_id, delivery_scope, conversation_id, msg_seq, kind, outbox_id)
SELECT p.user_id,
       1 + pg_catalog.row_number() OVER (PARTITION BY p.user_id ORDER BY e.msg_seq),
       e.message_id, p.membership_period_id, e.conversation_id, e.msg_seq, e.kind, o.outbox_id
  FROM im.outbox o
  JOIN im.event e ON e.message_id = o.source_event_id
  JOIN im.membership_period p ON p.conversation_id = e.conversation_id
       AND p.join_seq <= e.msg_seq AND (p.leave_seq IS NULL OR p.leave_seq >= e.msg_seq)
 WHERE o.state = 'pending' AND o.conversation_id = (SELECT conversation_id FROM bench.g);
