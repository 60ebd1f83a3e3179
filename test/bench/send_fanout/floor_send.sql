-- The floor: one data-modifying statement that row-locks and
-- increments the conversation's head, inserts the message row and one
-- outbox row; sender and conversation looked up from bench.conv as
-- send.sql does.  No membership or idempotency check, no C, no SPI.
\set i random(1, :nconv)
\set r random(0, 1000000)
WITH b AS (
    SELECT conversation_id, first_user + (:r % nmem) AS sender
      FROM bench.conv WHERE set_id = :set AND i = :i),
h AS (
    UPDATE bench.conversation c SET head_msg_seq = c.head_msg_seq + 1
      FROM b WHERE c.conversation_id = b.conversation_id
    RETURNING c.conversation_id, c.head_msg_seq, b.sender),
e AS (
    INSERT INTO bench.event (conversation_id, msg_seq, sender_id, client_msg_id, content_type, body)
    SELECT conversation_id, head_msg_seq, sender, pg_catalog.gen_random_uuid()::text,
           'text', '{"text": "hello from the benchmark"}'::jsonb
      FROM h
    RETURNING message_id, msg_seq, conversation_id),
o AS (
    INSERT INTO bench.outbox (conversation_id, msg_seq, source_event_id)
    SELECT conversation_id, msg_seq, message_id FROM e RETURNING 1)
SELECT e.msg_seq FROM e, o;
