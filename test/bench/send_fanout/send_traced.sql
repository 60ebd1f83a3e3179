-- send.sql with the trailing trace id of contract §21 (32 lower-case hex,
-- the form the gateway makes): what the send path costs when traced.
\set i random(1, :nconv)
\set r random(0, 1000000)
SELECT m.msg_seq
  FROM bench.conv b,
       LATERAL im.send_message(b.first_user + (:r % b.nmem), b.conversation_id,
                               pg_catalog.gen_random_uuid()::text,
                               '{"text": "hello from the benchmark"}'::jsonb, 'text', NULL,
                               '4bf92f3577b34da6a3ce929d0e0e4736') m
 WHERE b.set_id = :set AND b.i = :i;
