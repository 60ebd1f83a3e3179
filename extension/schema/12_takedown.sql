-- ---- moderator takedowns (contract §17): the evidence table and the
-- moderation functions (conversation/takedown.c, ops/moderation_log.c)

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
