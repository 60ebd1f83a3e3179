-- One send through the API: a random member of a random conversation of
-- the set (variable set: 1 = the hot group, 2 = the 2000 small groups).
\set i random(1, :nconv)
\set r random(0, 1000000)
SELECT m.msg_seq
  FROM bench.conv b,
       LATERAL im.send_message(b.first_user + (:r % b.nmem), b.conversation_id,
                               pg_catalog.gen_random_uuid()::text,
                               '{"text": "hello from the benchmark"}'::jsonb) m
 WHERE b.set_id = :set AND b.i = :i;
