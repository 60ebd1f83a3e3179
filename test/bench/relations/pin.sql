-- A pin change: a random member pins (2 in 3) or unpins a random one of the
-- conversation's 20 messages (the list never passes 20 of the 50 allowed).
\set i random(1, :nconv)
\set k random(1, 20)
\set r random(0, 1000000)
SELECT m.msg_seq
  FROM bench.conv b JOIN bench.msg t ON t.set_id = b.set_id AND t.i = b.i AND t.k = :k,
       LATERAL im.pin_message(b.first_user + (:r % b.nmem), b.conversation_id, t.message_id,
                              :r % 3 <> 0, pg_catalog.gen_random_uuid()::text) m
 WHERE b.set_id = :set AND b.i = :i;
