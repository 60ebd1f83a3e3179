-- A send with reply_to_message_id: a random one of the conversation's 20 messages.
\set i random(1, :nconv)
\set k random(1, 20)
\set r random(0, 1000000)
SELECT m.msg_seq
  FROM bench.conv b JOIN bench.msg t ON t.set_id = b.set_id AND t.i = b.i AND t.k = :k,
       LATERAL im.send_message(b.first_user + (:r % b.nmem), b.conversation_id,
                               pg_catalog.gen_random_uuid()::text,
                               '{"text": "hello from the benchmark"}'::jsonb, 'text', t.message_id) m
 WHERE b.set_id = :set AND b.i = :i;
