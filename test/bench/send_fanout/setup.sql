-- Benchmark fixture (database im_test of the bench cluster).
-- bench.conv maps a pgbench index to a conversation and its member range;
-- both sides look the sender and conversation up from it the same way.
-- bench.* tables are the floor's: a message table with primary
-- key (conversation_id, msg_seq), unique message_id and unique
-- (sender_id, client_msg_id); an outbox with its primary key only; a
-- conversation table whose head the floor row-locks and increments.
CREATE SCHEMA bench;
CREATE TABLE bench.conv (
    set_id          int    NOT NULL,     -- 1: the hot conversation, 2: the two-member conversations
    i               int    NOT NULL,
    conversation_id bigint NOT NULL,
    first_user      bigint NOT NULL,
    nmem            int    NOT NULL,
    PRIMARY KEY (set_id, i)
);

-- One hot conversation (a group of 50 members).
INSERT INTO bench.conv
SELECT 1, 1, im.create_conversation('group', ARRAY(SELECT pg_catalog.generate_series(1, 50))::bigint[], 1), 1, 50;

-- 1,000 two-member (direct) conversations.
INSERT INTO bench.conv
SELECT 2, g, im.create_conversation('direct', ARRAY[1000 + g * 10, 1000 + g * 10 + 1]::bigint[]),
       1000 + g * 10, 2
  FROM pg_catalog.generate_series(1, 1000) g;

SELECT im.run_fanout(100000) AS create_events_fanned_out;

CREATE TABLE bench.conversation (
    conversation_id bigint PRIMARY KEY,
    head_msg_seq    bigint NOT NULL
);
CREATE TABLE bench.event (
    conversation_id bigint NOT NULL,
    msg_seq         bigint NOT NULL,
    message_id      bigint NOT NULL DEFAULT nextval('im.event_id_seq'),
    sender_id       bigint NOT NULL,
    client_msg_id   text   NOT NULL,
    content_type    text   NOT NULL,
    body            jsonb  NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, msg_seq),
    UNIQUE (message_id),
    UNIQUE (sender_id, client_msg_id)
);
CREATE TABLE bench.outbox (
    outbox_id       bigint PRIMARY KEY DEFAULT nextval('im.outbox_id_seq'),
    conversation_id bigint NOT NULL,
    msg_seq         bigint NOT NULL,
    source_event_id bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE bench.inbox (LIKE im.inbox INCLUDING ALL);
INSERT INTO bench.conversation SELECT conversation_id, head_msg_seq FROM im.conversation;
VACUUM ANALYZE;
