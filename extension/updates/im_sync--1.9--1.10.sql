\echo Use "ALTER EXTENSION im_sync UPDATE TO '1.10'" to load this file. \quit


-- ---- trace ids (contract §21): a trailing trace_id argument on every
-- write, kept with the event and its outbox item
--   * im.event and im.outbox gain a nullable trace_id column at the end of
--     the row (a private event's trace id is kept on its outbox item only);
--   * im.send_message, im.recall_message, im.edit_message, im.react,
--     im.pin_message, im.report_read, im.clear_dirty and im.delete_for_me
--     are each replaced by the same function with a trailing
--     `trace_id text DEFAULT NULL`: same result and attributes, comment,
--     owner and ACL carried over, so calls with the older argument lists
--     resolve to the one function (never 42725).
ALTER TABLE im.event ADD COLUMN trace_id text;
ALTER TABLE im.outbox ADD COLUMN trace_id text;
COMMENT ON COLUMN im.event.trace_id IS 'The trace id of the request that wrote this position, NULL for none (contract §21)';
COMMENT ON COLUMN im.outbox.trace_id IS 'The trace id of the request that queued this item, NULL for none; the workers log it (contract §21)';

-- Each replaced function's owner and ACL, kept for the block after the
-- CREATEs.  The ACL is copied into pg_proc directly, not by GRANT: a GRANT
-- inside an extension script would record the DBA's grants as the
-- extension's initial privileges.
SELECT pg_catalog.set_config('im_sync_upgrade.trace_' || p.proname || '_owner', p.proowner::pg_catalog.text, true),
       pg_catalog.set_config('im_sync_upgrade.trace_' || p.proname || '_acl', COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p
WHERE p.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
    'im.send_message(bigint, bigint, text, jsonb, text, bigint)'::pg_catalog.regprocedure,
    'im.recall_message(bigint, bigint, text, bigint)'::pg_catalog.regprocedure,
    'im.edit_message(bigint, bigint, text, bigint, jsonb)'::pg_catalog.regprocedure,
    'im.react(bigint, bigint, bigint, text, boolean, text)'::pg_catalog.regprocedure,
    'im.pin_message(bigint, bigint, bigint, boolean, text)'::pg_catalog.regprocedure,
    'im.report_read(bigint, bigint, bigint)'::pg_catalog.regprocedure,
    'im.clear_dirty(bigint, bigint, bigint, bigint)'::pg_catalog.regprocedure,
    'im.delete_for_me(bigint, bigint, bigint)'::pg_catalog.regprocedure]);

DROP FUNCTION im.send_message(bigint, bigint, text, jsonb, text, bigint);
DROP FUNCTION im.recall_message(bigint, bigint, text, bigint);
DROP FUNCTION im.edit_message(bigint, bigint, text, bigint, jsonb);
DROP FUNCTION im.react(bigint, bigint, bigint, text, boolean, text);
DROP FUNCTION im.pin_message(bigint, bigint, bigint, boolean, text);
DROP FUNCTION im.report_read(bigint, bigint, bigint);
DROP FUNCTION im.clear_dirty(bigint, bigint, bigint, bigint);
DROP FUNCTION im.delete_for_me(bigint, bigint, bigint);

CREATE FUNCTION im.send_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                body jsonb, content_type text DEFAULT 'text',
                                reply_to_message_id bigint DEFAULT NULL,
                                trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_send_message' LANGUAGE C;
CREATE FUNCTION im.recall_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                  target_message_id bigint, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_recall_message' LANGUAGE C;
CREATE FUNCTION im.edit_message(sender_id bigint, conversation_id bigint, client_msg_id text,
                                target_message_id bigint, body jsonb, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_edit_message' LANGUAGE C;
CREATE FUNCTION im.react(user_id bigint, conversation_id bigint, target_message_id bigint,
                         reaction text, present boolean, client_msg_id text,
                         trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_react' LANGUAGE C;
CREATE FUNCTION im.pin_message(user_id bigint, conversation_id bigint, target_message_id bigint,
                               pinned boolean, client_msg_id text, trace_id text DEFAULT NULL)
RETURNS TABLE(message_id bigint, msg_seq bigint, created boolean)
AS 'MODULE_PATHNAME', 'im_pin_message' LANGUAGE C;
CREATE FUNCTION im.report_read(user_id bigint, conversation_id bigint, read_to_seq bigint,
                               trace_id text DEFAULT NULL)
RETURNS TABLE(read_msg_seq bigint, unread_count bigint)
AS 'MODULE_PATHNAME', 'im_report_read' LANGUAGE C;
CREATE FUNCTION im.clear_dirty(user_id bigint, conversation_id bigint, observed_version bigint,
                               saved_last_msg_seq bigint, trace_id text DEFAULT NULL)
RETURNS TABLE(cleared boolean, dirty_target_msg_seq bigint, dirty_version bigint)
AS 'MODULE_PATHNAME', 'im_clear_dirty' LANGUAGE C;
CREATE FUNCTION im.delete_for_me(user_id bigint, conversation_id bigint, message_id bigint,
                                 trace_id text DEFAULT NULL)
RETURNS boolean AS 'MODULE_PATHNAME', 'im_delete_for_me' LANGUAGE C;

-- attributes of the API, then the old owner and ACL (after the REVOKE,
-- which also recorded the extension's initial privileges of the new
-- function)
DO $do$
DECLARE
    f regprocedure;
    old_owner oid;
    old_acl aclitem[];
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
             WHERE p.pronamespace OPERATOR(pg_catalog.=) 'im'::regnamespace
               AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['send_message', 'recall_message',
                   'edit_message', 'react', 'pin_message', 'report_read', 'clear_dirty', 'delete_for_me'])
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp', f);
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
        old_owner := NULLIF(pg_catalog.current_setting('im_sync_upgrade.trace_' ||
                        (SELECT p.proname FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) f) || '_owner'), '')::pg_catalog.oid;
        old_acl := NULLIF(pg_catalog.current_setting('im_sync_upgrade.trace_' ||
                        (SELECT p.proname FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) f) || '_acl'), '')::pg_catalog.aclitem[];
        IF old_owner OPERATOR(pg_catalog.<>) (SELECT p.proowner FROM pg_catalog.pg_proc p
                                              WHERE p.oid OPERATOR(pg_catalog.=) f) THEN
            EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', f, old_owner::pg_catalog.regrole);
        END IF;
        UPDATE pg_catalog.pg_proc SET proacl = old_acl WHERE oid OPERATOR(pg_catalog.=) f;
    END LOOP;
END
$do$;

COMMENT ON FUNCTION im.send_message(bigint, bigint, text, jsonb, text, bigint, text) IS 'Appends a message (optionally a reply) at the next msg_seq, idempotent per (sender, client_msg_id): SEND_ACK (contract §3, §14)';
COMMENT ON FUNCTION im.recall_message(bigint, bigint, text, bigint, text) IS 'Recalls the sender''s message: a recall position and a tombstone (contract §3)';
COMMENT ON FUNCTION im.edit_message(bigint, bigint, text, bigint, jsonb, text) IS 'Appends an edit of the sender''s message (contract §3)';
COMMENT ON FUNCTION im.react(bigint, bigint, bigint, text, boolean, text, text) IS 'Sets or clears one reaction key of the caller on a message: a reaction position carrying the caller''s whole set (contract §14)';
COMMENT ON FUNCTION im.pin_message(bigint, bigint, bigint, boolean, text, text) IS 'Pins or unpins a message for the conversation: a pin position carrying the whole list (contract §14)';
COMMENT ON FUNCTION im.report_read(bigint, bigint, bigint, text) IS 'Moves the user''s read cursor forward and recounts unread (contract §7)';
COMMENT ON FUNCTION im.clear_dirty(bigint, bigint, bigint, bigint, text) IS 'Clears a large-group dirty marker the client has caught up with (contract §7)';
COMMENT ON FUNCTION im.delete_for_me(bigint, bigint, bigint, text) IS 'Deletes a message for the calling user only (contract §7)';

-- ---- push jobs carry the trace id of their message (contract §21)
-- im.push_job gains trace_id; im.claim_push_jobs returns it as a trailing
-- result column, so relays that name their columns keep working.  The
-- result type changes, so the function is dropped and created again with
-- the same attributes, comment, owner and ACL (a role the DBA granted
-- EXECUTE keeps it; the ACL is copied into pg_proc, not GRANTed, so the
-- DBA's grants are not recorded as the extension's initial privileges).
ALTER TABLE im.push_job ADD COLUMN trace_id text;
SELECT pg_catalog.set_config('im_sync_upgrade.claim_push_jobs_owner', p.proowner::pg_catalog.text, true),
       pg_catalog.set_config('im_sync_upgrade.claim_push_jobs_acl', COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p
WHERE p.oid OPERATOR(pg_catalog.=) 'im.claim_push_jobs(text, integer, interval)'::pg_catalog.regprocedure;
DROP FUNCTION im.claim_push_jobs(text, integer, interval);
CREATE FUNCTION im.claim_push_jobs(relay_id text, max_jobs int DEFAULT 100,
                                   lease interval DEFAULT '30 seconds')
RETURNS TABLE(job_id bigint, push_target_id bigint, provider text,
              app_id text, sealed_token text, notification jsonb, trace_id text)
AS 'MODULE_PATHNAME', 'im_claim_push_jobs' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
-- a fresh install's initial privileges (90_privileges.sql), then the old ACL
REVOKE ALL ON FUNCTION im.claim_push_jobs(text, integer, interval) FROM PUBLIC;
DO $do$
DECLARE
    old_owner oid;
    old_acl aclitem[];
BEGIN
    old_owner := pg_catalog.current_setting('im_sync_upgrade.claim_push_jobs_owner')::pg_catalog.oid;
    old_acl := NULLIF(pg_catalog.current_setting('im_sync_upgrade.claim_push_jobs_acl'), '')::pg_catalog.aclitem[];
    IF old_owner OPERATOR(pg_catalog.<>) (SELECT p.proowner FROM pg_catalog.pg_proc p
            WHERE p.oid OPERATOR(pg_catalog.=) 'im.claim_push_jobs(text, integer, interval)'::pg_catalog.regprocedure) THEN
        EXECUTE pg_catalog.format('ALTER FUNCTION im.claim_push_jobs(text, integer, interval) OWNER TO %I',
                                  old_owner::pg_catalog.regrole);
    END IF;
    UPDATE pg_catalog.pg_proc SET proacl = old_acl
    WHERE oid OPERATOR(pg_catalog.=) 'im.claim_push_jobs(text, integer, interval)'::pg_catalog.regprocedure;
END
$do$;
COMMENT ON FUNCTION im.claim_push_jobs(text, integer, interval) IS 'Hands claimable push jobs to a relay under a lease, each with the trace id of its message (contract §13, §21)';

-- ---- im.metrics() gains type and labels (contract §21)
-- The result changes, so DROP + CREATE: the new function keeps the old
-- one's owner and ACL (copied into pg_proc after the REVOKE below records
-- the extension's initial privileges, so a DBA's grants survive and are
-- not recorded as the extension's).  Series names lose their embedded
-- labels (name{k="v"} becomes name with labels {"k": "v"}).
SELECT pg_catalog.set_config('im_sync_upgrade.metrics_owner', p.proowner::pg_catalog.text, true),
       pg_catalog.set_config('im_sync_upgrade.metrics_acl', COALESCE(p.proacl::pg_catalog.text, ''), true)
FROM pg_catalog.pg_proc p
WHERE p.oid OPERATOR(pg_catalog.=) 'im.metrics()'::pg_catalog.regprocedure;
DROP FUNCTION im.metrics();
-- type: counter, gauge or histogram; labels: a jsonb object, NULL for none
-- (contract §21; the list: extension/doc/operations.md "Metrics")
CREATE FUNCTION im.metrics()
RETURNS TABLE(name text, value double precision, help text, type text, labels jsonb)
AS 'MODULE_PATHNAME', 'im_metrics' LANGUAGE C
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp;
REVOKE ALL ON FUNCTION im.metrics() FROM PUBLIC;
DO $do$
DECLARE
    old_owner oid;
    old_acl aclitem[];
BEGIN
    old_owner := pg_catalog.current_setting('im_sync_upgrade.metrics_owner')::pg_catalog.oid;
    old_acl := NULLIF(pg_catalog.current_setting('im_sync_upgrade.metrics_acl'), '')::pg_catalog.aclitem[];
    IF old_owner OPERATOR(pg_catalog.<>) (SELECT p.proowner FROM pg_catalog.pg_proc p
            WHERE p.oid OPERATOR(pg_catalog.=) 'im.metrics()'::pg_catalog.regprocedure) THEN
        EXECUTE pg_catalog.format('ALTER FUNCTION im.metrics() OWNER TO %I', old_owner::pg_catalog.regrole);
    END IF;
    UPDATE pg_catalog.pg_proc SET proacl = old_acl
    WHERE oid OPERATOR(pg_catalog.=) 'im.metrics()'::pg_catalog.regprocedure;
END
$do$;
COMMENT ON FUNCTION im.metrics() IS 'Counters, gauges and latency histograms for monitoring, with their type and labels (contract §8, §21)';

-- ---- im.trace_message (contract §21): one message's stages for operators
-- Operators: one message's path, stage by stage (contract §21; the stages
-- and what is recorded for each: extension/doc/operations.md "Following
-- one message").  shard_trace_message is the per-recipient part, for the
-- users placed on this node (the router asks each user's node for its
-- users); trace_message adds the conversation's part (accepted, a
-- collected outbox item) and asks shard_trace_message for the audience
-- placed here.  Rows of a stage whose record maintenance collected say so
-- with detail.gone = true and a reason.  Nothing records when a hint (the
-- NOTIFY fanout commits with the inbox row) went out: no `hinted` row.
CREATE FUNCTION im.shard_trace_message(message_id bigint, user_ids bigint[])
RETURNS TABLE(stage text, at timestamptz, user_id bigint, detail jsonb)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    m bigint := shard_trace_message.message_id;
BEGIN
    -- the users' checks of the router's per-node functions: 22023, IS421
    PERFORM pg_catalog.count(*) FROM im.shard_message_facts(m, user_ids);
    RETURN QUERY
    WITH e AS (SELECT e.* FROM im.event e WHERE e.message_id OPERATOR(pg_catalog.=) m),
    o AS (SELECT o.* FROM im.outbox o WHERE o.source_event_id OPERATOR(pg_catalog.=) m),
    ev AS (
      SELECT (SELECT e.conversation_id FROM e) AS conversation_id,
             (SELECT e.msg_seq FROM e)::bigint AS msg_seq,
             (SELECT e.created_at FROM e) AS created_at,
             EXISTS (SELECT 1 FROM e) AS here,
             COALESCE((SELECT e.kind IN ('message', 'reaction', 'pin')
                              AND e.mode OPERATOR(pg_catalog.=) 'shared_log' FROM e), false) AS shared,
             COALESCE((SELECT e.trace_id FROM e), (SELECT o.trace_id FROM o)) AS trace_id),
    u AS (SELECT DISTINCT w.u AS user_id FROM pg_catalog.unnest(user_ids) w(u)),
    i AS (
      SELECT b.user_id, b.sync_seq, b.delivery_scope, b.outbox_id, b.created_at, b.kind
        FROM im.inbox b JOIN u ON u.user_id OPERATOR(pg_catalog.=) b.user_id
       WHERE b.source_event_id OPERATOR(pg_catalog.=) m),
    -- per user without an inbox row: why (first match wins)
    w AS (
      SELECT u.user_id,
             CASE WHEN NOT ev.here THEN 'not_here'
                  WHEN q.user_id IS NOT NULL THEN 'quarantined'
                  WHEN (SELECT o.state FROM o) OPERATOR(pg_catalog.<>) 'done' THEN 'waiting'
                  WHEN ev.shared THEN 'shared_log'
                  WHEN COALESCE(h.gc_floor, 0) OPERATOR(pg_catalog.>) 0
                       AND NOT COALESCE((SELECT pg_catalog.min(b.created_at) FROM im.inbox b
                                          WHERE b.user_id OPERATOR(pg_catalog.=) u.user_id)
                                        OPERATOR(pg_catalog.<) ev.created_at, false) THEN 'gone'
                  ELSE 'missing' END AS why,
             q.periods, h.gc_floor
        FROM u CROSS JOIN ev
        LEFT JOIN im.fanout_quarantine q ON q.user_id OPERATOR(pg_catalog.=) u.user_id
              AND q.outbox_id OPERATOR(pg_catalog.=) (SELECT o.outbox_id FROM o)
        LEFT JOIN im.user_head h ON h.user_id OPERATOR(pg_catalog.=) u.user_id
       WHERE NOT EXISTS (SELECT 1 FROM i WHERE i.user_id OPERATOR(pg_catalog.=) u.user_id)),
    -- the user's first inbox row of the event, the devices whose ACK covers it
    f AS (SELECT i.user_id, pg_catalog.min(i.sync_seq) AS sync_seq FROM i GROUP BY i.user_id),
    dv AS (
      SELECT f.user_id, f.sync_seq, d.device_id, d.acked_sync_seq, d.acked_at,
             pg_catalog.count(*) OVER (PARTITION BY f.user_id) AS devices_acked,
             pg_catalog.row_number() OVER (PARTITION BY f.user_id
                 ORDER BY (d.acked_sync_seq OPERATOR(pg_catalog.=) f.sync_seq AND d.acked_at IS NOT NULL) DESC,
                          d.acked_sync_seq, d.acked_at, d.device_id) AS rn
        FROM f JOIN im.device d ON d.user_id OPERATOR(pg_catalog.=) f.user_id
       WHERE d.state OPERATOR(pg_catalog.<>) 'REVOKED'
         AND d.acked_sync_seq OPERATOR(pg_catalog.>=) f.sync_seq
         AND NOT (SELECT ev.shared FROM ev)),
    rows AS (
      -- fanout: one row per inbox row of the event (in shared_log mode the
      -- one a marker going dirty writes)
      SELECT 'fanout'::text AS stage, i.created_at AS at, i.user_id,
             pg_catalog.jsonb_build_object('sync_seq', i.sync_seq, 'membership_period_id', i.delivery_scope,
                                           'outbox_id', i.outbox_id, 'trace_id', ev.trace_id)
             OPERATOR(pg_catalog.||)
             CASE WHEN ev.shared THEN pg_catalog.jsonb_build_object('shared_log', true, 'inbox_kind', i.kind,
                 'reason', 'shared_log conversation: no per-user event for a message; this row is the dirty marker that sends the devices to fetch_messages, so no synced row')
                  ELSE '{}'::jsonb END AS detail
        FROM i CROSS JOIN ev
      UNION ALL
      -- fanout of a user without a row: why
      SELECT 'fanout', CASE WHEN w.why OPERATOR(pg_catalog.=) 'shared_log' THEN (SELECT o.processed_at FROM o) END,
             w.user_id,
             pg_catalog.jsonb_build_object('trace_id', ev.trace_id) OPERATOR(pg_catalog.||)
             CASE w.why
               WHEN 'not_here' THEN pg_catalog.jsonb_build_object('waiting', true,
                   'reason', 'the event has not reached this user''s node yet (its transfer is in flight: im.shard_pending())')
               WHEN 'quarantined' THEN pg_catalog.jsonb_build_object('quarantined', true,
                   'periods', pg_catalog.to_jsonb(w.periods),
                   'reason', 'two membership periods cover it: kept, not delivered, reported by im.repair_fanout for review')
               WHEN 'waiting' THEN pg_catalog.jsonb_build_object('waiting', true,
                   'outbox_state', (SELECT o.state FROM o)::text, 'attempts', (SELECT o.attempts FROM o),
                   'last_error', (SELECT o.last_error FROM o),
                   'reason', CASE WHEN (SELECT o.state FROM o)::text OPERATOR(pg_catalog.=) 'dead'
                                  THEN 'dead letter: fanout gave up (im.repair_fanout(retry_dead => true) after the cause is fixed)'
                                  ELSE 'not fanned out yet' END)
               WHEN 'shared_log' THEN pg_catalog.jsonb_build_object('shared_log', true,
                   'reason', 'shared_log conversation: the position is read from the conversation''s log (fetch_messages); the user''s marker was already dirty, so the log has no row for it and there is no synced row')
               WHEN 'gone' THEN pg_catalog.jsonb_build_object('gone', true, 'gc_floor', w.gc_floor,
                   'reason', 'the user''s log was collected past it (gc_inbox): its sync_seq and delivery time are gone')
               ELSE pg_catalog.jsonb_build_object('missing', true,
                   'reason', 'processed, but not in the user''s log, which still holds older entries: a gap (im.reconcile, im.repair_fanout)')
             END
        FROM w CROSS JOIN ev
      UNION ALL
      -- synced: the first device whose ACK covers the user's row; its
      -- time is known only when that ACK is the device's latest and ends
      -- exactly there (a device records the time of its latest ACK only)
      SELECT 'synced', CASE WHEN dv.acked_sync_seq OPERATOR(pg_catalog.=) dv.sync_seq THEN dv.acked_at END,
             dv.user_id,
             pg_catalog.jsonb_build_object('device_id', dv.device_id, 'sync_seq', dv.sync_seq,
                                           'acked_sync_seq', dv.acked_sync_seq, 'devices_acked', dv.devices_acked,
                                           'trace_id', ev.trace_id)
             OPERATOR(pg_catalog.||)
             CASE WHEN dv.acked_sync_seq OPERATOR(pg_catalog.=) dv.sync_seq AND dv.acked_at IS NOT NULL
                  THEN '{}'::jsonb
                  ELSE pg_catalog.jsonb_build_object('latest_ack_at', dv.acked_at,
                      'reason', 'the device''s ACK went past it: only the time of its latest ACK is recorded') END
        FROM dv CROSS JOIN ev WHERE dv.rn OPERATOR(pg_catalog.=) 1
      UNION ALL
      -- synced of a collected row: gc_inbox collects only what devices ACKed
      SELECT 'synced', NULL::timestamptz, w.user_id,
             pg_catalog.jsonb_build_object('gone', true, 'gc_floor', w.gc_floor,
                 'devices_acked', (SELECT pg_catalog.count(*) FROM im.device d
                                    WHERE d.user_id OPERATOR(pg_catalog.=) w.user_id
                                      AND d.state OPERATOR(pg_catalog.<>) 'REVOKED'
                                      AND d.acked_sync_seq OPERATOR(pg_catalog.>=) w.gc_floor),
                 'reason', 'the log entry was collected by gc_inbox, which collects only entries the devices holding the log have ACKed: which device and when are gone',
                 'trace_id', ev.trace_id)
        FROM w CROSS JOIN ev WHERE w.why OPERATOR(pg_catalog.=) 'gone'
      UNION ALL
      -- read: the user's read cursor covers the position; the time is that
      -- of the first read_cursor private event reaching it, while kept
      SELECT 'read', r.read_at, uc.user_id,
             pg_catalog.jsonb_build_object('read_msg_seq', uc.read_msg_seq, 'trace_id', ev.trace_id)
             OPERATOR(pg_catalog.||)
             CASE WHEN r.read_at IS NULL THEN pg_catalog.jsonb_build_object('gone', true,
                 'reason', 'the time of the read report is gone (read_cursor private events are collected after im_sync.inbox_retention)')
                  ELSE '{}'::jsonb END
        FROM im.user_conversation uc JOIN u ON u.user_id OPERATOR(pg_catalog.=) uc.user_id
        CROSS JOIN ev
        CROSS JOIN LATERAL (
          SELECT pg_catalog.min(pe.created_at) AS read_at FROM im.private_event pe
           WHERE pe.user_id OPERATOR(pg_catalog.=) uc.user_id
             AND pe.conversation_id OPERATOR(pg_catalog.=) uc.conversation_id
             AND pe.kind OPERATOR(pg_catalog.=) 'read_cursor'
             AND pe.read_msg_seq OPERATOR(pg_catalog.>=) ev.msg_seq) r
       WHERE uc.conversation_id OPERATOR(pg_catalog.=) ev.conversation_id
         AND uc.read_msg_seq OPERATOR(pg_catalog.>=) ev.msg_seq
      UNION ALL
      -- pushed: each push job of the message for the user, its state's time
      SELECT 'pushed', COALESCE(j.finished_at, j.claimed_at, j.queued_at), j.user_id,
             pg_catalog.jsonb_build_object('job_id', j.job_id, 'state', j.state, 'device_id', j.device_id,
                                           'attempts', j.attempts, 'last_result', j.last_result,
                                           'http_status', j.http_status, 'coalesced', j.coalesced,
                                           'queued_at', j.queued_at, 'trace_id', ev.trace_id)
        FROM im.push_job j JOIN u ON u.user_id OPERATOR(pg_catalog.=) j.user_id
        CROSS JOIN ev
       WHERE j.message_id OPERATOR(pg_catalog.=) m)
    SELECT r.stage, r.at, r.user_id, r.detail FROM rows r
     ORDER BY r.at NULLS LAST,
              pg_catalog.array_position(ARRAY['accepted', 'fanout', 'hinted', 'synced', 'read', 'pushed'], r.stage),
              r.user_id, (r.detail OPERATOR(pg_catalog.->>) 'sync_seq')::bigint, r.detail::text;
END
$fn$;

CREATE FUNCTION im.trace_message(message_id bigint)
RETURNS TABLE(stage text, at timestamptz, user_id bigint, detail jsonb)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, im, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    m bigint := trace_message.message_id;
    users bigint[];
BEGIN
    -- P0002 for an unknown message; IS421 on a sharded node that is not
    -- the conversation's (ask the router)
    users := ARRAY(SELECT a.user_id FROM im.message_audience(m) a
                    WHERE NOT EXISTS (SELECT 1 FROM im.shard_config c)
                       OR (SELECT c.bucket_nodes[a.user_id OPERATOR(pg_catalog.%) 64 OPERATOR(pg_catalog.+) 1]
                                  OPERATOR(pg_catalog.=) c.self_name FROM im.shard_config c));
    RETURN QUERY
    WITH e AS (SELECT e.* FROM im.event e WHERE e.message_id OPERATOR(pg_catalog.=) m),
    o AS (SELECT o.* FROM im.outbox o WHERE o.source_event_id OPERATOR(pg_catalog.=) m),
    rows AS (
      SELECT 'accepted'::text AS stage, e.created_at AS at, NULL::bigint AS user_id,
             pg_catalog.jsonb_build_object('conversation_id', e.conversation_id, 'msg_seq', e.msg_seq,
                 'kind', e.kind, 'sender_id', e.sender_id, 'mode', e.mode,
                 'trace_id', COALESCE(e.trace_id, (SELECT o.trace_id FROM o)),
                 'outbox_id', (SELECT o.outbox_id FROM o), 'outbox_state', (SELECT o.state FROM o),
                 'processed_at', (SELECT o.processed_at FROM o)) AS detail
        FROM e
      UNION ALL
      -- maintenance collected the processed outbox item
      SELECT 'fanout', NULL::timestamptz, NULL::bigint,
             pg_catalog.jsonb_build_object('gone', true, 'trace_id', e.trace_id,
                 'reason', 'the outbox item was collected by maintenance (done items are kept im_sync.inbox_retention): when it was processed and after how many attempts is gone')
        FROM e WHERE NOT EXISTS (SELECT 1 FROM o)
      UNION ALL
      SELECT s.stage, s.at, s.user_id, s.detail FROM im.shard_trace_message(m, users) s)
    SELECT r.stage, r.at, r.user_id, r.detail FROM rows r
     ORDER BY r.at NULLS LAST,
              pg_catalog.array_position(ARRAY['accepted', 'fanout', 'hinted', 'synced', 'read', 'pushed'], r.stage),
              r.user_id NULLS FIRST, (r.detail OPERATOR(pg_catalog.->>) 'sync_seq')::bigint, r.detail::text;
END
$fn$;

REVOKE ALL ON FUNCTION im.shard_trace_message(bigint, bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION im.trace_message(bigint) FROM PUBLIC;
COMMENT ON FUNCTION im.shard_trace_message(bigint, bigint[]) IS 'trace_message''s rows of the given users placed on this node: fanout, synced, read, pushed (contract §21; the router''s per-node part)';
COMMENT ON FUNCTION im.trace_message(bigint) IS 'Operators: one message''s stages in time order (accepted, fanout, synced, read, pushed) with their times and trace id, and which were collected (contract §21)';
