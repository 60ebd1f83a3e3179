\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.11'" to load this file. \quit


-- ---- receipts (contract §20): delivered/read receipts to the sender's
-- devices as `receipt` private events
--   * im.private_event accepts the kind 'receipt' and gains a nullable
--     payload column at the end of the row (the receipt's keys);
--   * im.receipt_source (ACKs and read reports not yet turned into
--     receipts), im.receipt_pending (per sender and conversation: what was
--     last emitted, what is due) and im.receipt_setting (users with read
--     receipts off) are new;
--   * im.set_read_receipts and im.run_receipts are new.
ALTER TABLE im.private_event DROP CONSTRAINT private_event_kind_check;
ALTER TABLE im.private_event ADD CONSTRAINT private_event_kind_check
    CHECK (kind IN ('read_cursor', 'delete_for_me', 'receipt'));
ALTER TABLE im.private_event ADD COLUMN payload jsonb;
COMMENT ON COLUMN im.private_event.payload IS 'A receipt''s keys besides conversation_id (contract §20), NULL for other kinds';

CREATE TABLE im.receipt_source (
    user_id         bigint NOT NULL,
    conversation_id bigint,
    from_seq        bigint NOT NULL,
    to_seq          bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
SELECT pg_catalog.pg_extension_config_dump('im.receipt_source', '');
CREATE TABLE im.receipt_pending (
    user_id               bigint NOT NULL,
    conversation_id       bigint NOT NULL,
    delivered_through_seq bigint NOT NULL DEFAULT 0,
    read_through_seq      bigint NOT NULL DEFAULT 0,
    dirty_from_msg_seq    bigint,
    dirty_to_msg_seq      bigint,
    dirty                 boolean NOT NULL DEFAULT false,
    emitted_at            timestamptz,
    PRIMARY KEY (user_id, conversation_id)
);
-- The producer's due rows.
CREATE INDEX receipt_pending_dirty_idx ON im.receipt_pending (user_id, conversation_id) WHERE dirty;
SELECT pg_catalog.pg_extension_config_dump('im.receipt_pending', '');
CREATE TABLE im.receipt_setting (
    user_id        bigint PRIMARY KEY,
    read_receipts  boolean NOT NULL
);
SELECT pg_catalog.pg_extension_config_dump('im.receipt_setting', '');
COMMENT ON TABLE im.receipt_source IS 'ACKs and read reports not yet turned into receipts, one row per call that moved (contract §20)';
COMMENT ON TABLE im.receipt_pending IS 'Per sender and conversation: the receipt state last emitted and what is due (contract §20)';
COMMENT ON TABLE im.receipt_setting IS 'Users who turned read receipts off (contract §20)';

CREATE FUNCTION im.set_read_receipts(user_id bigint, enabled boolean, trace_id text DEFAULT NULL)
RETURNS TABLE(read_receipts boolean)
AS 'MODULE_PATHNAME', 'im_set_read_receipts' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.run_receipts(max_rows int DEFAULT 10000)
RETURNS bigint AS 'MODULE_PATHNAME', 'im_run_receipts' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
REVOKE ALL ON FUNCTION im.set_read_receipts(bigint, boolean, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.run_receipts(integer) FROM PUBLIC;
COMMENT ON FUNCTION im.set_read_receipts(bigint, boolean, text) IS 'Turns the user''s read receipts on or off; off, others learn no read state of the user (contract §20)';
COMMENT ON FUNCTION im.run_receipts(integer) IS 'Turns queued ACKs and read reports into receipt private events now, as the fanout workers do (contract §20)';

-- ---- conversation recency and conversation pins (contract §20)
--   * im.user_conversation gains last_activity_at (created_at of the last
--     `message` the user may see, '-infinity' for none; fanout moves it with
--     last_msg_seq) and conversation_pinned_at ('-infinity': not pinned),
--     filled here for existing rows, and the index recent_conversations
--     reads pages from;
--   * im.private_event gains the kind conversation_pin and the column
--     conversation_pinned it reports;
--   * new functions im.recent_conversations and im.pin_conversation.
ALTER TABLE im.user_conversation ADD COLUMN last_activity_at timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE im.user_conversation ADD COLUMN conversation_pinned_at timestamptz NOT NULL DEFAULT '-infinity';
-- the last message inside one of the user's periods at or below the
-- highest position fanout placed for the user (last_msg_seq; in shared_log
-- mode it follows the dirty target)
UPDATE im.user_conversation uc
   SET last_activity_at = a.at
  FROM (SELECT u.user_id, u.conversation_id, pg_catalog.max(e.created_at) AS at
          FROM im.user_conversation u
          JOIN im.membership_period p ON p.user_id OPERATOR(pg_catalog.=) u.user_id
                                     AND p.conversation_id OPERATOR(pg_catalog.=) u.conversation_id
          JOIN im.event e ON e.conversation_id OPERATOR(pg_catalog.=) u.conversation_id
                         AND e.kind OPERATOR(pg_catalog.=) 'message'
                         AND e.msg_seq OPERATOR(pg_catalog.<=) u.last_msg_seq
                         AND p.join_seq OPERATOR(pg_catalog.<=) e.msg_seq
                         AND (p.leave_seq IS NULL OR p.leave_seq OPERATOR(pg_catalog.>=) e.msg_seq)
         GROUP BY u.user_id, u.conversation_id) a
 WHERE uc.user_id OPERATOR(pg_catalog.=) a.user_id
   AND uc.conversation_id OPERATOR(pg_catalog.=) a.conversation_id;
CREATE INDEX user_conversation_recent_idx ON im.user_conversation
    (user_id, conversation_pinned_at, last_activity_at, (- conversation_id));

-- (the kind list names both kinds this version adds; receipt's section above
-- added 'receipt')
ALTER TABLE im.private_event DROP CONSTRAINT private_event_kind_check;
ALTER TABLE im.private_event ADD CONSTRAINT private_event_kind_check
    CHECK (kind IN ('read_cursor', 'delete_for_me', 'receipt', 'conversation_pin'));
ALTER TABLE im.private_event ADD COLUMN conversation_pinned boolean;

COMMENT ON TABLE im.user_conversation IS 'Per-user conversation state: last and read positions, unread count, large-group dirty marker, last activity and conversation pin (contract §7, §20)';

CREATE FUNCTION im.recent_conversations(user_id bigint, page_limit int DEFAULT 50,
                                        after_cursor text DEFAULT NULL)
RETURNS TABLE(conversation_id bigint, kind text, mode text, last_msg_seq bigint,
              read_msg_seq bigint, unread_count bigint, dirty_target_msg_seq bigint,
              dirty_version bigint, head_msg_seq bigint, last_activity_at timestamptz,
              conversation_pinned boolean, left_conversation boolean, my_role text,
              muted_until timestamptz, next_cursor text)
AS 'MODULE_PATHNAME', 'im_recent_conversations' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.pin_conversation(user_id bigint, conversation_id bigint, pin boolean,
                                    trace_id text DEFAULT NULL)
RETURNS TABLE(conversation_pinned boolean)
AS 'MODULE_PATHNAME', 'im_pin_conversation' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
REVOKE ALL ON FUNCTION im.recent_conversations(bigint, integer, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.pin_conversation(bigint, bigint, boolean, text) FROM PUBLIC;
COMMENT ON FUNCTION im.recent_conversations(bigint, integer, text) IS 'The user''s conversations pinned first, then by latest activity, paged by a keyset cursor (contract §20)';
COMMENT ON FUNCTION im.pin_conversation(bigint, bigint, boolean, text) IS 'Pins or unpins a conversation for the user; synced to the user''s devices as a conversation_pin event (contract §20)';
