\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.12'" to load this file. \quit

-- ---- moderator takedowns (contract §17): the `takedown` kind, the
-- target's taken_down flag, the evidence table and the moderation functions
--   * im.event_kind accepts 'takedown'; im.event gains taken_down at the
--     end of the row (false: no existing row is taken down);
--   * im.takedown_evidence is new;
--   * im.takedown_message, im.moderation_evidence, im.moderation_log are new
--     (no PUBLIC execute).
ALTER DOMAIN im.event_kind DROP CONSTRAINT event_kind_check;
ALTER DOMAIN im.event_kind ADD CONSTRAINT event_kind_check
    CHECK (VALUE IN ('message', 'create', 'join', 'leave', 'recall', 'edit', 'mode', 'reaction', 'pin', 'takedown'));
ALTER TABLE im.event ADD COLUMN taken_down boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN im.event.recalled IS 'A tombstone: recalled by its sender, or taken down (then taken_down is true too and readers show recalled false) (contract §3, §17)';
COMMENT ON COLUMN im.event.taken_down IS 'Taken down by a moderator: a tombstone for every reader, its body kept apart in im.takedown_evidence (contract §17)';

-- The body of a taken-down message, kept apart from im.event: only the
-- extension owner reads this table (no grant to anyone), the moderation
-- role through im.moderation_evidence.  One row per target; the row is also
-- the takedown's idempotency key (moderator, client_msg_id): a moderator has
-- no user id, so the key lives in the moderator's own namespace
-- (extension/doc/decisions.md).  Maintenance erases the body (body NULL,
-- erased_at set) once taken_down_at is older than im_sync.evidence_retention,
-- unless a legal hold covers it; the row stays, so a retry is still answered.
CREATE TABLE im.takedown_evidence (
    target_message_id   bigint PRIMARY KEY,
    takedown_message_id bigint NOT NULL UNIQUE,
    conversation_id     bigint NOT NULL,
    sender_id           bigint,
    moderator           text NOT NULL,
    client_msg_id       text NOT NULL,
    request_digest      bytea NOT NULL,
    body                jsonb,
    taken_down_at       timestamptz NOT NULL DEFAULT now(),
    erased_at           timestamptz,
    UNIQUE (moderator, client_msg_id),
    CHECK (body IS NULL OR erased_at IS NULL)
);
-- Evidence expiry (maintenance.c) takes the oldest unerased bodies first.
CREATE INDEX takedown_evidence_erase_idx ON im.takedown_evidence (taken_down_at)
    WHERE erased_at IS NULL;
SELECT pg_catalog.pg_extension_config_dump('im.takedown_evidence', '');
COMMENT ON TABLE im.takedown_evidence IS 'Bodies of taken-down messages, readable by the moderation role only through moderation_evidence, erased after im_sync.evidence_retention; the takedown''s idempotency key (contract §17)';

CREATE FUNCTION im.takedown_message(moderator text, conversation_id bigint, target_message_id bigint,
                                    reason text, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_takedown_message' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.moderation_evidence(target_message_id bigint)
RETURNS TABLE(conversation_id bigint, sender_id bigint, body jsonb,
              taken_down_at timestamptz, erase_after timestamptz)
AS 'MODULE_PATHNAME', 'im_moderation_evidence' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.moderation_log(after_id bigint DEFAULT 0, page_limit int DEFAULT 100)
RETURNS TABLE(id bigint, at timestamptz, moderator text, action text,
              user_id bigint, conversation_id bigint, message_id bigint,
              reason text)
AS 'MODULE_PATHNAME', 'im_moderation_log' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
COMMENT ON FUNCTION im.takedown_message(text, bigint, bigint, text, text) IS 'A moderator''s takedown: a takedown position, the target a tombstone for every reader, its body kept as evidence (contract §17)';
COMMENT ON FUNCTION im.moderation_evidence(bigint) IS 'The kept body of a taken-down message, NULL once erased (contract §17); for the moderation role only';
COMMENT ON FUNCTION im.moderation_log(bigint, integer) IS 'Pages of the moderation actions of im.audit, oldest first (contract §17)';
REVOKE ALL ON FUNCTION im.takedown_message(text, bigint, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.moderation_evidence(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.moderation_log(bigint, integer) FROM PUBLIC;
-- ---- receipts across nodes (contract §20)
-- A receipt is produced on the reader's node and carried to the sender's
-- node by a transfer (user/receipt.c, sharding.md "Receipts"): a direct
-- conversation's cumulative seqs, a fanout group's per-node parts.
ALTER TABLE im.receipt_pending ADD COLUMN read_hidden boolean NOT NULL DEFAULT false;
CREATE TABLE im.receipt_part (
    message_id      bigint NOT NULL,
    node_name       text   NOT NULL,
    sender_id       bigint NOT NULL,
    conversation_id bigint NOT NULL,
    delivered_count bigint NOT NULL CHECK (delivered_count BETWEEN 0 AND member_count),
    read_count      bigint NOT NULL CHECK (read_count BETWEEN 0 AND member_count),
    member_count    bigint NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, node_name)
);
SELECT pg_catalog.pg_extension_config_dump('im.receipt_part', '');
COMMENT ON TABLE im.receipt_part IS 'Per message of a fanout group, the receipt counts another node carried for its own members (contract §15, §20)';
COMMENT ON COLUMN im.receipt_pending.read_hidden IS 'A carried direct receipt''s reader turned read receipts off: no read state is emitted (contract §20)';
