/*
 * im_sync — the current catalog of a node, in its final form.  `make`
 * concatenates the files of extension/schema/ in name order into the install
 * script im_sync--<default_version>.sql (generated, not committed).  An
 * older install reaches the same catalog through the upgrade scripts in
 * extension/updates/; test/suites/70-upgrade.sh and 71-upgrade-oldest.sh
 * prove the two equal, and test/suites/73-schema-policy.sh that these files
 * only create (no DROP, no ALTER that changes a definition).  How to make a
 * change: extension/doc/upgrades.md.
 *
 * Tables are the extension's internals; the outward surface is the API
 * functions (contract: extension/doc/contract.md).  Every API function is
 * SECURITY DEFINER with a pinned search_path, and 90_privileges.sql
 * revokes EXECUTE from PUBLIC on every function of the extension.
 *
 * Invariants enforced here by the database, not by comments:
 *   - msg_seq unique per conversation, (sender, client_msg_id) unique among
 *     the events this node accepted;
 *   - membership periods of one (conversation, user) never overlap
 *     (EXCLUDE over int8range) and at most one is open;
 *   - sync_seq unique per user; fanout idempotency key
 *     (user_id, source_event_id, delivery_scope) with a non-NULL scope.
 * The install script inserts no rows.
 *
 * Files: 00_types (domains), 10_conversation (conversations, membership,
 * events, sending, reactions and pins), 20_fanout (outbox), 30_user (logs,
 * read state, devices, recovery, snapshots, tokens, audit), 40_push,
 * 50_shard (placement, transfers, node functions), 60_ops (maintenance,
 * reconcile, metrics), 90_privileges (PUBLIC's privileges, the owner hand-off).
 */

-- Single-column value rules as domains: PostgreSQL compiles a domain's
-- check once into its type cache and applies it only to the columns a
-- statement assigns, while a table CHECK constraint is read from its stored
-- text and planned again at every INSERT or UPDATE of the table, all of the
-- table's checks each time (the send path's head UPDATE, event and outbox
-- INSERT would pay for every one).
CREATE DOMAIN im.conversation_kind AS text CONSTRAINT conversation_kind_check CHECK (VALUE IN ('direct', 'group'));
CREATE DOMAIN im.conversation_mode AS text CONSTRAINT conversation_mode_check CHECK (VALUE IN ('fanout', 'shared_log'));
CREATE DOMAIN im.head_seq AS bigint CONSTRAINT head_seq_check CHECK (VALUE >= 0);
-- a reaction's target is in target_message_id, a pin's in pin_message_id
-- (im.event, contract §14); role and mute: contract §17
CREATE DOMAIN im.event_kind AS text
    CONSTRAINT event_kind_check
    CHECK (VALUE IN ('message', 'create', 'join', 'leave', 'recall', 'edit', 'mode', 'reaction', 'pin',
                     'role', 'mute', 'takedown'));
CREATE DOMAIN im.event_seq AS bigint CONSTRAINT event_seq_check CHECK (VALUE >= 1);
CREATE DOMAIN im.outbox_state AS text CONSTRAINT outbox_state_check CHECK (VALUE IN ('pending', 'done', 'dead'));

COMMENT ON DOMAIN im.conversation_kind IS 'Kind of a conversation: direct (two members, ordered pair) or group (contract §1)';
COMMENT ON DOMAIN im.conversation_mode IS 'Delivery mode of a conversation: fanout to inboxes or shared_log (contract §4)';
COMMENT ON DOMAIN im.head_seq IS 'A conversation''s head position, 0 before its first event (contract §1)';
COMMENT ON DOMAIN im.event_kind IS 'Kind of a conversation position: message or control event (contract §1, §3)';
COMMENT ON DOMAIN im.event_seq IS 'A conversation position, from 1, gap-free (contract §1)';
COMMENT ON DOMAIN im.outbox_state IS 'State of an outbox item: pending, done or dead (contract §4)';
