-- The cross-column CHECKs of im.event and im.conversation
-- call C functions (row_rules.c).  They must answer exactly as the 1.5 SQL
-- rules they replace, for every kind and every NULL pattern (a CHECK passes
-- on true and on NULL), and the constraints must reject real bad rows.
-- 1.8: the conversation's rule is the AFTER trigger conversation_direct_pair
-- on the columns it reads (a head UPDATE never runs it), and the outbox's
-- shape rule is a reconcile check instead of a CHECK.
WITH k(kind) AS (
    VALUES ('message'), ('create'), ('join'), ('leave'), ('recall'), ('edit'), ('mode'), ('role'), ('mute'),
           ('reaction'), ('pin'), ('other')),
b(v) AS (VALUES (false), (true)),
c AS (
    SELECT k.kind,
           CASE WHEN s.v THEN 7::bigint END AS sender_id,
           CASE WHEN m.v THEN 'key' END AS client_msg_id,
           CASE WHEN t.v THEN 11::bigint END AS target_message_id,
           CASE WHEN r.v THEN 12::bigint END AS reply_to_message_id,
           CASE WHEN p.v THEN 13::bigint END AS pin_message_id
    FROM k, b s, b m, b t, b r, b p),
judged AS (
    SELECT c.*,
           COALESCE(im.event_fields_valid(kind, sender_id, client_msg_id, target_message_id,
                                          reply_to_message_id, pin_message_id), true) AS c_passes,
           COALESCE(((client_msg_id IS NULL) = (sender_id IS NULL OR kind IN ('create', 'join', 'mode')))
                    AND ((target_message_id IS NOT NULL) = (kind IN ('recall', 'edit', 'reaction'))), true)
           AND COALESCE(reply_to_message_id IS NULL OR kind = 'message', true)
           AND COALESCE(pin_message_id IS NULL OR kind = 'pin', true) AS sql_passes
    FROM c)
SELECT count(*) AS combinations, count(*) FILTER (WHERE c_passes) AS passing,
       count(*) FILTER (WHERE c_passes IS DISTINCT FROM sql_passes) AS differing
FROM judged;

WITH k(kind) AS (VALUES ('direct'), ('group')),
v(x) AS (VALUES (NULL::bigint), (1), (2)),
judged AS (
    SELECT k.kind, lo.x AS lo, hi.x AS hi,
           COALESCE(im.conversation_pair_valid(k.kind, lo.x, hi.x), true) AS c_passes,
           COALESCE(((k.kind = 'direct') = (lo.x IS NOT NULL AND hi.x IS NOT NULL)) AND lo.x < hi.x, true) AS sql_passes
    FROM k, v lo, v hi)
SELECT count(*) AS combinations, count(*) FILTER (WHERE c_passes) AS passing,
       count(*) FILTER (WHERE c_passes IS DISTINCT FROM sql_passes) AS differing
FROM judged;

-- the event keeps one CHECK on its cross-column rules; the conversation and
-- the outbox have none (1.8), the conversation has its column trigger
SELECT conrelid::regclass AS tbl, conname, pg_get_constraintdef(oid) AS def
FROM pg_constraint
WHERE conrelid IN ('im.event'::regclass, 'im.conversation'::regclass, 'im.outbox'::regclass)
  AND contype = 'c'
ORDER BY 1, 2;
SELECT tgname, tgenabled, pg_get_triggerdef(oid) AS def
FROM pg_trigger WHERE tgrelid = 'im.conversation'::regclass AND NOT tgisinternal;

-- real bad rows are refused by the constraints
\set VERBOSITY terse
SELECT im.create_conversation('group', ARRAY[1, 2]::bigint[], 1) AS g \gset
BEGIN;
INSERT INTO im.event (conversation_id, msg_seq, kind, sender_id, client_msg_id)
VALUES (:g, 1000, 'message', 1, NULL);   -- a message without its idempotency key
ROLLBACK;
BEGIN;
INSERT INTO im.event (conversation_id, msg_seq, kind, sender_id, client_msg_id, pin_message_id)
VALUES (:g, 1000, 'message', 1, 'k-pin', 5);   -- a pin target on a message
ROLLBACK;
BEGIN;
INSERT INTO im.event (conversation_id, msg_seq, kind, sender_id, client_msg_id, reply_to_message_id)
VALUES (:g, 1000, 'join', NULL, NULL, 5);   -- a reply target on a join
ROLLBACK;
BEGIN;
INSERT INTO im.conversation (kind, direct_user_lo, direct_user_hi) VALUES ('direct', 5, 4);
ROLLBACK;
BEGIN;
INSERT INTO im.conversation (kind) VALUES ('direct');
ROLLBACK;
BEGIN;
INSERT INTO im.conversation (kind, direct_user_lo, direct_user_hi) VALUES ('group', 4, 5);
ROLLBACK;
BEGIN;
UPDATE im.conversation SET kind = 'direct' WHERE conversation_id = :g;   -- a group made direct
ROLLBACK;
-- the trigger runs for the columns it reads, never for a head update: a bad
-- row written past it (trigger disabled) takes head updates, not pair updates
BEGIN;
ALTER TABLE im.conversation DISABLE TRIGGER conversation_direct_pair;
INSERT INTO im.conversation (kind, direct_user_lo, direct_user_hi) VALUES ('direct', 9, 6)
RETURNING conversation_id AS bad \gset
ALTER TABLE im.conversation ENABLE ALWAYS TRIGGER conversation_direct_pair;
UPDATE im.conversation SET head_msg_seq = head_msg_seq + 1 WHERE conversation_id = :bad
RETURNING head_msg_seq;
SAVEPOINT pair;
UPDATE im.conversation SET direct_user_hi = 7 WHERE conversation_id = :bad;
ROLLBACK TO pair;
ROLLBACK;
-- an outbox item of neither shape is reported by reconcile
BEGIN;
INSERT INTO im.outbox (conversation_id, msg_seq, source_event_id, private_user_id)
VALUES (:g, 1, -1, 5);   -- a position that also names a private user
SELECT check_name, severity, detail->>'source_event_id' AS source_event_id
FROM im.reconcile() WHERE check_name = 'outbox_item_malformed';
ROLLBACK;
SELECT count(*) AS malformed_after_rollback FROM im.reconcile() WHERE check_name = 'outbox_item_malformed';
-- and good ones pass
SELECT created FROM im.send_message(1, :g, 'row-rules-1', '{"text": "hi"}');
SELECT im.create_conversation('direct', ARRAY[8, 3]::bigint[]) IS NOT NULL AS direct_created;
