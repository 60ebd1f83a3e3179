\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.1'" to load this file. \quit

/*
 * im_sync 1.0 -> 1.1: exactly what changed in the catalog (issue 9).
 * im_sync--1.1.sql is the full script of the same catalog; the upgrade
 * suite (test/suites/70-upgrade.sh) fails when the two disagree.
 *   - im.counter goes: nothing ever read or wrote it (durable counts live in
 *     the tables they count, shared counters in shared memory, README);
 *   - every table and function gets a comment (\dt+ im.*, \df+ im.*);
 *   - the SECURITY DEFINER / search_path / REVOKE loop, in the form every
 *     script that adds functions ends with.
 */

-- Out of the extension first: only ALTER EXTENSION ... DROP takes a table
-- out of extconfig, a plain DROP TABLE would leave its oid there (pg_dump).
ALTER EXTENSION im_sync DROP TABLE im.counter;
DROP TABLE im.counter;

-- Pin search_path and make every API function SECURITY DEFINER, then revoke
-- EXECUTE from PUBLIC (contract §12).  One loop over the extension's member
-- functions, so a function added above cannot be forgotten.  The same block
-- ends every script that adds or replaces functions (full and upgrade
-- scripts alike; CREATE OR REPLACE resets both attributes).  It skips
-- im.set_extension_owner, which runs as its superuser caller on purpose.
DO $do$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             JOIN pg_catalog.pg_depend d
               ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::regclass
              AND d.objid OPERATOR(pg_catalog.=) p.oid
              AND d.deptype OPERATOR(pg_catalog.=) 'e'
             JOIN pg_catalog.pg_extension e
               ON d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::regclass
              AND d.refobjid OPERATOR(pg_catalog.=) e.oid
             WHERE e.extname OPERATOR(pg_catalog.=) 'im_sync'
               AND p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.<>) 'set_extension_owner'
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;

-- psql's \dt+ im.* and \df+ im.* explain each object (contract section in
-- brackets: extension/doc/contract.md).  sql/99_catalog_comments fails when
-- an object has none.
COMMENT ON TABLE im.conversation IS 'One row per conversation; head_msg_seq is the single writer''s position counter, assigned under this row''s lock (contract §1, §2)';
COMMENT ON TABLE im.event IS 'Every conversation position: messages and control events, gap-free msg_seq per conversation; a recall tombstones its target (contract §1, §3)';
COMMENT ON TABLE im.membership_period IS 'Membership periods [join_seq, leave_seq] of a user in a conversation, never overlapping, at most one open (contract §2)';
COMMENT ON TABLE im.private_event IS 'Read cursors and delete-for-me of one user, recorded by the caller and written into the user''s log by fanout (contract §4, §7)';
COMMENT ON TABLE im.outbox IS 'Transactional outbox: one item per conversation position or private event; done items stay as fanout evidence until retention (contract §4)';
COMMENT ON TABLE im.fanout_quarantine IS 'Outbox items covered by two membership periods of one user: kept and reported, never delivered (contract §4, §8)';
COMMENT ON TABLE im.user_head IS 'Per-user log head: committed high watermark and GC floor of the user''s sync log (contract §5, §8)';
COMMENT ON TABLE im.inbox IS 'Per-user sync log: gap-free sync_seq, one entry per (source event, delivery scope) (contract §4, §5)';
COMMENT ON TABLE im.user_conversation IS 'Per-user conversation state: last and read positions, unread count, large-group dirty marker (contract §7)';
COMMENT ON TABLE im.deleted_for_me IS 'Messages a user deleted for themselves only (contract §7)';
COMMENT ON TABLE im.device IS 'Devices of a user: state, sync generation, ACKed and issued sync positions, registration counter bound into tokens (contract §5)';
COMMENT ON TABLE im.recovery_session IS 'Recovery sessions of a device: an active one holds the GC fence at resume_from (contract §5, §8)';
COMMENT ON TABLE im.snapshot IS 'Snapshots for a new or too-far-behind device, immutable once written (contract §6)';
COMMENT ON TABLE im.snapshot_page IS 'Pages of a snapshot with their digests; the manifest digest covers them all (contract §6)';
COMMENT ON TABLE im.token_key IS 'Signing keys of device, batch and snapshot tokens; the newest signs, retired keys keep their id without a secret (contract §8, §12)';
COMMENT ON TABLE im.audit IS 'Audit trail of registrations, token issues and revocations, never a token (contract §8, §12)';
COMMENT ON TABLE im.maintenance_state IS 'Resumable positions of the maintenance rounds: GC cursor, outbox retention horizon (contract §8)';

COMMENT ON FUNCTION im.create_conversation(text, bigint[], bigint) IS 'Creates a direct or group conversation with its first members (contract §2)';
COMMENT ON FUNCTION im.direct_conversation(bigint, bigint) IS 'Returns the direct conversation of two users, creating it once (contract §2)';
COMMENT ON FUNCTION im.join_conversation(bigint, bigint) IS 'Opens a membership period for a user, idempotent while one is open (contract §2)';
COMMENT ON FUNCTION im.leave_conversation(bigint, bigint) IS 'Closes the user''s open membership period at a leave position (contract §2)';
COMMENT ON FUNCTION im.conversation_members(bigint) IS 'Lists the active members of a conversation with their open periods (contract §2)';
COMMENT ON FUNCTION im.set_conversation_mode(bigint, text) IS 'Switches a conversation between fanout and shared_log delivery at a mode position (contract §2, §7)';
COMMENT ON FUNCTION im.members_among(bigint, bigint[]) IS 'Which of the given users are active members: the gateway''s shared_log hints without listing members (contract §2, §12)';
COMMENT ON FUNCTION im.send_message(bigint, bigint, text, jsonb, text) IS 'Appends a message at the next msg_seq, idempotent per (sender, client_msg_id): SEND_ACK (contract §3)';
COMMENT ON FUNCTION im.recall_message(bigint, bigint, text, bigint) IS 'Recalls the sender''s message: a recall position and a tombstone (contract §3)';
COMMENT ON FUNCTION im.edit_message(bigint, bigint, text, bigint, jsonb) IS 'Appends an edit of the sender''s message (contract §3)';
COMMENT ON FUNCTION im.run_fanout(integer) IS 'Runs fanout of pending outbox items into the members'' logs now, as the workers do (contract §4)';
COMMENT ON FUNCTION im.register_device(bigint, text) IS 'Registers or re-registers a device of a user (contract §5)';
COMMENT ON FUNCTION im.revoke_device(bigint, text) IS 'Revokes a device: its tokens and leases end (contract §5, §12)';
COMMENT ON FUNCTION im.device_session(bigint, text, bigint) IS 'A device''s sync state at connect, fencing older connection epochs (contract §5)';
COMMENT ON FUNCTION im.sync_changes(bigint, text, integer, bigint, integer, text) IS 'Returns the next page of a device''s sync batch with its batch token (contract §5)';
COMMENT ON FUNCTION im.ack_sync(bigint, text, text, bigint) IS 'ACKs a device''s sync batch up to ack_seq: SYNC_ACK (contract §5)';
COMMENT ON FUNCTION im.begin_snapshot(bigint, text) IS 'Builds a snapshot for a device and returns its token and manifest (contract §6)';
COMMENT ON FUNCTION im.fetch_snapshot(bigint, text, text, integer) IS 'Returns one page of a device''s snapshot (contract §6)';
COMMENT ON FUNCTION im.ack_snapshot(bigint, text, text, text) IS 'Installs a snapshot on its device once the manifest digest matches (contract §6)';
COMMENT ON FUNCTION im.fetch_messages(bigint, bigint, bigint, integer, bigint) IS 'Conversation history a member may see, after a position, page by page (contract §6)';
COMMENT ON FUNCTION im.report_read(bigint, bigint, bigint) IS 'Moves the user''s read cursor forward and recounts unread (contract §7)';
COMMENT ON FUNCTION im.clear_dirty(bigint, bigint, bigint, bigint) IS 'Clears a large-group dirty marker the client has caught up with (contract §7)';
COMMENT ON FUNCTION im.conversation_list(bigint, integer, bigint) IS 'The user''s conversations with positions, unread counts and dirty markers (contract §7)';
COMMENT ON FUNCTION im.delete_for_me(bigint, bigint, bigint) IS 'Deletes a message for the calling user only (contract §7)';
COMMENT ON FUNCTION im.message_status(bigint) IS 'Per user and device: accepted, in sync scope, synced, read for one message (contract §7)';
COMMENT ON FUNCTION im.gc_inbox(integer) IS 'Collects log entries every device has ACKed, behind the retention fence (contract §8)';
COMMENT ON FUNCTION im.reconcile() IS 'Checks positions, periods, fanout and logs against each other and reports findings (contract §8)';
COMMENT ON FUNCTION im.repair_fanout(boolean, boolean) IS 'Requeues missing fanout, reports quarantine, optionally retries dead letters (contract §8)';
COMMENT ON FUNCTION im.metrics() IS 'Counters, gauges and latency histograms for monitoring (contract §8)';
COMMENT ON FUNCTION im.issue_device_token(bigint, text, interval) IS 'Issues a signed device token bound to the device''s registration (contract §8, §12)';
COMMENT ON FUNCTION im.authenticate(text) IS 'Verifies a device token and returns its user, device and connection epoch (contract §8, §12)';
COMMENT ON FUNCTION im.rotate_token_key() IS 'Adds a new signing key; older keys still verify (contract §8)';
COMMENT ON FUNCTION im.retire_token_key(integer) IS 'Wipes the secret of a superseded key whose tokens have expired (contract §8)';
COMMENT ON FUNCTION im.set_extension_owner(regrole) IS 'Hands every object of the extension to a NOLOGIN role; run after every update and restore (contract §12)';
