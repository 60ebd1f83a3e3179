-- A reaction: a random member sets (2 in 3) or clears one of 10 keys on a
-- random one of the conversation's 20 messages.
\set i random(1, :nconv)
\set k random(1, 20)
\set r random(0, 1000000)
SELECT m.msg_seq
  FROM bench.conv b JOIN bench.msg t ON t.set_id = b.set_id AND t.i = b.i AND t.k = :k,
       LATERAL im.react(b.first_user + (:r % b.nmem), b.conversation_id, t.message_id,
                        (ARRAY['👍', '❤', '🎉', '😂', '😮', '😢', '🙏', '🔥', 'ok', '+1'])[1 + :r % 10],
                        :r % 3 <> 0, pg_catalog.gen_random_uuid()::text) m
 WHERE b.set_id = :set AND b.i = :i;
