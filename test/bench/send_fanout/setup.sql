-- Benchmark fixture (database im_test of the bench cluster).
-- bench.conv maps a pgbench index to a conversation and its member range;
-- bench.* tables are copies of the send path's tables with the same
-- indexes and constraints (and the conversation foreign key), for the floor.
CREATE SCHEMA bench;
CREATE TABLE bench.conv (
    set_id          int    NOT NULL,     -- 1: the hot group, 2: the small groups
    i               int    NOT NULL,
    conversation_id bigint NOT NULL,
    first_user      bigint NOT NULL,
    nmem            int    NOT NULL,
    PRIMARY KEY (set_id, i)
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

SELECT im.run_fanout(100000) AS create_events_fanned_out;

CREATE TABLE bench.conversation (LIKE im.conversation INCLUDING ALL);
CREATE TABLE bench.event (LIKE im.event INCLUDING ALL);
ALTER TABLE bench.event ADD FOREIGN KEY (conversation_id) REFERENCES bench.conversation;
CREATE TABLE bench.outbox (LIKE im.outbox INCLUDING ALL);
CREATE TABLE bench.inbox (LIKE im.inbox INCLUDING ALL);
INSERT INTO bench.conversation SELECT * FROM im.conversation;
VACUUM ANALYZE;
