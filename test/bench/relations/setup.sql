-- Relations benchmark fixture (database im_test of the bench cluster):
-- bench.conv maps a pgbench index to a conversation and its member range
-- (as send_fanout/setup.sql); bench.msg holds 20 messages per conversation,
-- the targets of replies and reactions.
CREATE SCHEMA bench;
CREATE TABLE bench.conv (
    set_id          int    NOT NULL,     -- 1: the hot group, 2: the small groups
    i               int    NOT NULL,
    conversation_id bigint NOT NULL,
    first_user      bigint NOT NULL,
    nmem            int    NOT NULL,
    PRIMARY KEY (set_id, i)
);
CREATE TABLE bench.msg (
    set_id      int    NOT NULL,
    i           int    NOT NULL,
    k           int    NOT NULL,
    message_id  bigint NOT NULL,
    PRIMARY KEY (set_id, i, k)
);

-- One hot group of 50 members.
INSERT INTO bench.conv
SELECT 1, 1, im.create_conversation('group', ARRAY(SELECT pg_catalog.generate_series(1, 50))::bigint[], 1), 1, 50;
-- 2000 small groups of 5 members each.
INSERT INTO bench.conv
SELECT 2, g, im.create_conversation('group',
         ARRAY(SELECT pg_catalog.generate_series(1000 + g * 10, 1000 + g * 10 + 4))::bigint[], 1000 + g * 10),
       1000 + g * 10, 5
  FROM pg_catalog.generate_series(1, 2000) g;

INSERT INTO bench.msg
SELECT b.set_id, b.i, k, m.message_id
  FROM bench.conv b, pg_catalog.generate_series(1, 20) k,
       LATERAL im.send_message(b.first_user + (k % b.nmem), b.conversation_id, 'seed-' || b.conversation_id || '-' || k,
                               '{"text": "a message to reply and react to"}'::jsonb) m;

SELECT im.run_fanout(1000000) AS fanned_out;
VACUUM ANALYZE;
