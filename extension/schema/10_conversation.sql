-- ---- conversations, membership, events: what send, recall, edit, react
-- and pin append (conversation/: append.c, send.c, relation.c, row_rules.c)

-- Global id source for messages, control events and private events, so a
-- source_event_id never names two things.
CREATE SEQUENCE im.event_id_seq;
CREATE SEQUENCE im.conversation_id_seq;
CREATE SEQUENCE im.membership_period_id_seq;
SELECT pg_catalog.pg_extension_config_dump('im.event_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.conversation_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('im.membership_period_id_seq', '');

-- Row rules (row_rules.c).  PostgreSQL reads each table CHECK from its
-- stored node text and plans it again at every INSERT or UPDATE statement
-- (ExecRelCheck), so im.event has one CHECK calling an immutable C function
-- with the columns as arguments (NULL passes), and im.conversation's pair
-- rule is an AFTER trigger on the columns it reads (a head UPDATE, under
-- the conversation lock, never runs it).  The functions run no SQL, so they
-- are not SECURITY DEFINER (a pinned search_path would cost a GUC save and
-- restore per row); PUBLIC cannot execute them (90_privileges.sql).
CREATE FUNCTION im.event_fields_valid(kind text, sender bigint, idempotency_key text,
                                      target bigint, reply_to bigint, pin bigint) RETURNS boolean
AS 'MODULE_PATHNAME', 'im_event_fields_valid' LANGUAGE C IMMUTABLE PARALLEL SAFE;
-- the pair rule as an immutable function (the trigger below is what runs it)
CREATE FUNCTION im.conversation_pair_valid(kind text, lo bigint, hi bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'im_conversation_pair_valid' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION im.conversation_pair_check() RETURNS trigger
AS 'MODULE_PATHNAME', 'im_conversation_pair_check' LANGUAGE C;
COMMENT ON FUNCTION im.event_fields_valid(text, bigint, text, bigint, bigint, bigint) IS 'CHECK event_kind_fields: which kinds carry an idempotency key, a target, a reply or pin target (contract §3, §14)';
COMMENT ON FUNCTION im.conversation_pair_valid(text, bigint, bigint) IS 'CHECK conversation_direct_pair: a direct conversation names its ordered pair, a group none (contract §1)';
COMMENT ON FUNCTION im.conversation_pair_check() IS 'Trigger conversation_direct_pair: a direct conversation names its ordered pair, a group none (contract §1)';

-- One row per conversation.  head_msg_seq is the single writer's counter:
-- every position is assigned while holding this row's lock.
CREATE TABLE im.conversation (
    conversation_id bigint PRIMARY KEY DEFAULT nextval('im.conversation_id_seq'),
    kind            im.conversation_kind NOT NULL,
    mode            im.conversation_mode NOT NULL DEFAULT 'fanout',
    head_msg_seq    im.head_seq NOT NULL DEFAULT 0,
    direct_user_lo  bigint,
    direct_user_hi  bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (direct_user_lo, direct_user_hi)
);
-- A direct conversation names its ordered pair, a group none: every insert
-- and every UPDATE naming kind, direct_user_lo or direct_user_hi runs it, a
-- head UPDATE never does (AFTER, because a BEFORE UPDATE row trigger locks
-- the row first).  It answers with a CHECK's SQLSTATE (23514) and is enabled
-- ALWAYS, so a replica session role cannot skip it.
CREATE TRIGGER conversation_direct_pair
    AFTER INSERT OR UPDATE OF kind, direct_user_lo, direct_user_hi ON im.conversation
    FOR EACH ROW EXECUTE FUNCTION im.conversation_pair_check();
ALTER TABLE im.conversation ENABLE ALWAYS TRIGGER conversation_direct_pair;
SELECT pg_catalog.pg_extension_config_dump('im.conversation', '');

-- Every conversation position: messages and control events.  A recall sets
-- the target's body to NULL (tombstone, §12.4) and marks edits of it recalled.
-- No foreign keys: an event is only written by append.c under the
-- conversation row's lock (the row it just updated), and conversation rows
-- are never deleted (membership_period's key forbids it); the target, reply
-- and pin targets are checked under that lock by the function that writes
-- the event (contract §14) and events are never deleted, while a foreign
-- key would queue an AFTER trigger per insert and lock the target row (FOR
-- KEY SHARE: a WAL record and a dirtied page).  im.reconcile() reports a
-- missing conversation (event_without_conversation) or target
-- (relation_target_mismatch).
-- A reaction's target is in target_message_id (its visibility needs the
-- target's coverage, like a recall or edit); a pin's target is in
-- pin_message_id, because a pin follows its own position and must never be
-- hidden by its target's coverage or a delete-for-me of it.
CREATE TABLE im.event (
    message_id        bigint PRIMARY KEY DEFAULT nextval('im.event_id_seq'),
    conversation_id   bigint NOT NULL,
    msg_seq           im.event_seq NOT NULL,
    kind              im.event_kind NOT NULL,
    sender_id         bigint,
    client_msg_id     text,
    request_digest    bytea,          -- SHA-256 of the original request, for IS409
    content_type      text,
    body              jsonb,
    target_message_id bigint,
    subject_user_id   bigint,         -- join/leave: who
    mode              text,           -- the conversation mode in force at this position
    recalled          boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    reply_to_message_id bigint,       -- a message's reply target
    pin_message_id    bigint,         -- a pin's target; NULL for the list change a recall makes
    trace_id          text,           -- the request's trace id (contract §21); NULL: none
    taken_down        boolean NOT NULL DEFAULT false,  -- a moderator's takedown tombstone (contract §17)
    UNIQUE (conversation_id, msg_seq),
    -- which kinds carry an idempotency key, a target, a reply or pin target
    -- (one CHECK, its rule in C: row_rules.c)
    CONSTRAINT event_kind_fields CHECK (im.event_fields_valid(kind, sender_id, client_msg_id,
        target_message_id, reply_to_message_id, pin_message_id))
);
-- The idempotency key (sender_id, client_msg_id) covers exactly the events
-- that can answer a retry: those carrying their request's digest, i.e. the
-- events this node accepted itself.  A copy of a remote conversation's
-- event carries none (transfer_in.c drops it; retries and IS409 are answered
-- by the conversation's own node), so a sender may reuse a client_msg_id in
-- conversations on two nodes (contract §15).
CREATE UNIQUE INDEX event_sender_id_client_msg_id_key ON im.event (sender_id, client_msg_id)
    WHERE request_digest IS NOT NULL;
CREATE INDEX event_target_idx ON im.event (target_message_id) WHERE target_message_id IS NOT NULL;
-- A caller's current set for a target: its latest reaction position
-- (react reads it under the conversation lock; fetch_messages counts from it).
CREATE INDEX event_reaction_idx ON im.event (target_message_id, sender_id, msg_seq)
    WHERE kind = 'reaction';
-- The conversation's current pin list: the body of its latest pin position.
CREATE INDEX event_pin_idx ON im.event (conversation_id, msg_seq) WHERE kind = 'pin';
SELECT pg_catalog.pg_extension_config_dump('im.event', '');

-- Membership periods [join_seq, leave_seq] (closed).  Re-joining makes a new row.
CREATE TABLE im.membership_period (
    membership_period_id bigint PRIMARY KEY DEFAULT nextval('im.membership_period_id_seq'),
    conversation_id      bigint NOT NULL REFERENCES im.conversation,
    user_id              bigint NOT NULL,
    join_seq             bigint NOT NULL,
    leave_seq            bigint,
    join_event_id        bigint NOT NULL REFERENCES im.event,
    leave_event_id       bigint REFERENCES im.event,
    -- contract §17: the member's role in a group (NULL reads as member) and
    -- the end of a mute in force; a new period starts as a plain member
    role                 text DEFAULT 'member'
                         CONSTRAINT membership_period_role_check CHECK (role IN ('owner', 'admin', 'member')),
    muted_until          timestamptz,
    CHECK (leave_seq IS NULL OR leave_seq >= join_seq),
    CHECK ((leave_seq IS NULL) = (leave_event_id IS NULL)),
    UNIQUE (conversation_id, user_id, join_seq),
    CONSTRAINT membership_period_no_overlap EXCLUDE USING gist (
        conversation_id WITH =, user_id WITH =,
        int8range(join_seq, leave_seq, '[]') WITH &&)
);
CREATE UNIQUE INDEX membership_period_one_open
    ON im.membership_period (conversation_id, user_id) WHERE leave_seq IS NULL;
CREATE INDEX membership_period_user_idx ON im.membership_period (user_id, conversation_id);
CREATE INDEX membership_period_leave_event_idx ON im.membership_period (leave_event_id) WHERE leave_event_id IS NOT NULL;
SELECT pg_catalog.pg_extension_config_dump('im.membership_period', '');

-- Bans (contract §17): a user removed with ban = true cannot join again
-- until unban_member deletes the row.  Outlives the period it ended.  No
-- foreign keys: each would add a trigger to every head UPDATE of
-- im.conversation (the send path); rows are written only by remove_member
-- under the conversation lock, for the removal position it just appended.
CREATE TABLE im.conversation_ban (
    conversation_id  bigint NOT NULL,
    user_id          bigint NOT NULL,
    banned_by        bigint NOT NULL,
    removal_event_id bigint NOT NULL,
    banned_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, user_id)
);
SELECT pg_catalog.pg_extension_config_dump('im.conversation_ban', '');

COMMENT ON TABLE im.conversation IS 'One row per conversation; head_msg_seq is the single writer''s position counter, assigned under this row''s lock (contract §1, §2)';
COMMENT ON TABLE im.event IS 'Every conversation position: messages and control events, gap-free msg_seq per conversation; a recall tombstones its target (contract §1, §3)';
COMMENT ON COLUMN im.event.reply_to_message_id IS 'A message''s reply target, a message of the same conversation (contract §14)';
COMMENT ON COLUMN im.event.pin_message_id IS 'A pin position''s target; NULL for the list change a recall makes (contract §14)';
COMMENT ON COLUMN im.event.recalled IS 'A tombstone: recalled by its sender, or taken down (then taken_down is true too and readers show recalled false) (contract §3, §17)';
COMMENT ON COLUMN im.event.taken_down IS 'Taken down by a moderator: a tombstone for every reader, its body kept apart in im.takedown_evidence (contract §17)';
COMMENT ON COLUMN im.event.trace_id IS 'The trace id of the request that wrote this position, NULL for none (contract §21)';
COMMENT ON INDEX im.event_sender_id_client_msg_id_key IS 'The idempotency key (sender, client_msg_id) of the events this node accepted; copies carry no digest (contract §3, §15)';
COMMENT ON TABLE im.membership_period IS 'Membership periods [join_seq, leave_seq] of a user in a conversation, never overlapping, at most one open (contract §2)';
COMMENT ON COLUMN im.membership_period.role IS 'The member''s role in a group during this period: owner, admin or member (contract §17)';
COMMENT ON COLUMN im.membership_period.muted_until IS 'The end of the member''s mute; a write before it is IS403 (contract §17)';
COMMENT ON TABLE im.conversation_ban IS 'Users removed with a ban: join_conversation refuses them until unban_member (contract §17)';

-- §2 conversations and membership
CREATE FUNCTION im.create_conversation(kind text, members bigint[], creator bigint DEFAULT NULL)
RETURNS bigint AS 'MODULE_PATHNAME', 'im_create_conversation' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.direct_conversation(user_a bigint, user_b bigint)
RETURNS bigint AS 'MODULE_PATHNAME', 'im_direct_conversation' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.join_conversation(conversation_id bigint, user_id bigint)
RETURNS TABLE(membership_period_id bigint, join_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_join_conversation' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.leave_conversation(conversation_id bigint, user_id bigint)
RETURNS TABLE(membership_period_id bigint, leave_seq bigint)
AS 'MODULE_PATHNAME', 'im_leave_conversation' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.conversation_members(conversation_id bigint)
RETURNS TABLE(user_id bigint, membership_period_id bigint, join_seq bigint)
AS 'MODULE_PATHNAME', 'im_conversation_members' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.set_conversation_mode(conversation_id bigint, mode text)
RETURNS text AS 'MODULE_PATHNAME', 'im_set_conversation_mode' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
-- For the gateway's shared_log hints: which of the given users (its
-- connected users) are active members.  Unlike conversation_members it names
-- nobody the caller did not name, so the gateway role needs no function that
-- lists a conversation's members.
CREATE FUNCTION im.members_among(conversation_id bigint, candidate_user_ids bigint[])
RETURNS SETOF bigint LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp AS $$
  SELECT p.user_id FROM im.membership_period p
  WHERE p.conversation_id OPERATOR(pg_catalog.=) $1
    AND p.leave_seq IS NULL
    AND p.user_id OPERATOR(pg_catalog.=) ANY ($2)
  ORDER BY p.user_id
$$;

-- §3 sending
CREATE FUNCTION im.send_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                body jsonb, content_type text DEFAULT 'text',
                                reply_to_message_id bigint DEFAULT NULL,
                                trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_send_message' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.recall_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                  target_message_id bigint, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_recall_message' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.edit_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                target_message_id bigint, body jsonb, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_edit_message' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

-- §14 reactions and pins
CREATE FUNCTION im.react(user_id bigint, conversation_id bigint, target_message_id bigint,
                         reaction text, present boolean, client_msg_id text,
                         trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_react' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.pin_message(user_id bigint, conversation_id bigint, target_message_id bigint,
                               pinned boolean, client_msg_id text, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_pin_message' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

-- §17 roles, mutes, removals and bans in groups (roles.c)
CREATE FUNCTION im.set_member_role(actor_id bigint, conversation_id bigint, user_id bigint,
                                   role text, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_set_member_role' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.mute_member(actor_id bigint, conversation_id bigint, user_id bigint,
                               muted_until timestamptz, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_mute_member' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.remove_member(actor_id bigint, conversation_id bigint, user_id bigint,
                                 ban boolean, client_msg_id text)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_remove_member' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
CREATE FUNCTION im.unban_member(actor_id bigint, conversation_id bigint, user_id bigint)
RETURNS TABLE(unbanned boolean)
AS 'MODULE_PATHNAME', 'im_unban_member' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;

COMMENT ON FUNCTION im.create_conversation(text, bigint[], bigint) IS 'Creates a direct or group conversation with its first members (contract §2)';
COMMENT ON FUNCTION im.direct_conversation(bigint, bigint) IS 'Returns the direct conversation of two users, creating it once (contract §2)';
COMMENT ON FUNCTION im.join_conversation(bigint, bigint) IS 'Opens a membership period for a user, idempotent while one is open (contract §2)';
COMMENT ON FUNCTION im.leave_conversation(bigint, bigint) IS 'Closes the user''s open membership period at a leave position (contract §2)';
COMMENT ON FUNCTION im.conversation_members(bigint) IS 'Lists the active members of a conversation with their open periods (contract §2)';
COMMENT ON FUNCTION im.set_conversation_mode(bigint, text) IS 'Switches a conversation between fanout and shared_log delivery at a mode position (contract §2, §7)';
COMMENT ON FUNCTION im.members_among(bigint, bigint[]) IS 'Which of the given users are active members: the gateway''s shared_log hints without listing members (contract §2, §12)';
COMMENT ON FUNCTION im.send_message(bigint, bigint, text, jsonb, text, bigint, text) IS 'Appends a message (optionally a reply) at the next msg_seq, idempotent per (sender, client_msg_id): SEND_ACK (contract §3, §14)';
COMMENT ON FUNCTION im.recall_message(bigint, bigint, text, bigint, text) IS 'Recalls the sender''s message: a recall position and a tombstone (contract §3)';
COMMENT ON FUNCTION im.edit_message(bigint, bigint, text, bigint, jsonb, text) IS 'Appends an edit of the sender''s message (contract §3)';
COMMENT ON FUNCTION im.react(bigint, bigint, bigint, text, boolean, text, text) IS 'Sets or clears one reaction key of the caller on a message: a reaction position carrying the caller''s whole set (contract §14)';
COMMENT ON FUNCTION im.pin_message(bigint, bigint, bigint, boolean, text, text) IS 'Pins or unpins a message for the conversation: a pin position carrying the whole list (contract §14)';
COMMENT ON FUNCTION im.set_member_role(bigint, bigint, bigint, text, text) IS 'The owner sets a member''s role or hands over ownership: a role position (contract §17)';
COMMENT ON FUNCTION im.mute_member(bigint, bigint, bigint, timestamptz, text) IS 'Mutes a member until a time, NULL or a past time unmutes: a mute position (contract §17)';
COMMENT ON FUNCTION im.remove_member(bigint, bigint, bigint, boolean, text) IS 'Removes a member, optionally banned: a leave position naming who removed them (contract §17)';
COMMENT ON FUNCTION im.unban_member(bigint, bigint, bigint) IS 'Lifts a ban so the user may join again (contract §17)';
