/*
 * push_queue.c — the push queue (contract §13; design §9.3, §9.4, §16.1):
 * filled by fanout in its own transaction, drained by relays under leases.
 *
 * Invariants protected here:
 *   - a job exists iff a fanout that wrote a `message` position of another
 *     user to that user's log committed (queued in the fanout transaction:
 *     a worker dying or a batch rolling back leaves none, a committed one
 *     always has its jobs); no job for the sender's own devices, muted
 *     conversations, online devices or devices whose ACK covers the event;
 *   - at most one pending (or retrying) job per (target, conversation)
 *     (unique index push_job_coalesce): later messages coalesce into it
 *     (no new row version and no row lock: a hot group costs an index
 *     probe per member; a claim locks the users' heads, which fanout holds
 *     until it commits, so it never sends a job a fanout is still
 *     coalescing into), keeping its claim time; the claim sends the latest
 *     message of the conversation in the user's log since the job's first
 *     one, and checks the ACK against that;
 *   - at most one claim per (target, conversation) per
 *     im_sync.push_min_interval (im.push_pace, written at claim);
 *   - a job is handed to one relay at a time (FOR UPDATE SKIP LOCKED and a
 *     lease); a relay whose lease lapsed changes nothing (`stale`);
 *   - what reached a connected device or was read there, or was recalled,
 *     or is now muted, is not pushed: claim completes it as `suppressed`;
 *   - a job's trace_id is the trace id of the message it names (the one
 *     the claim sends), so the relay's log lines about it join the
 *     request's (contract §21); on a catalog before 1.10 (no trace ids)
 *     the statements are the old ones.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "core/im_sql.h"
#include "core/standing.h"
#include "push/push.h"

#include "catalog/pg_type.h"
#include "commands/async.h"
#include "utils/builtins.h"

#include <math.h>

/* Finished jobs collected per claim (the rest wait for the next one). */
#define IM_PUSH_COLLECT_BATCH 1000

/* The effective mute and preview level of a (user, conversation) from settings so (override) and sa (account). */
#define IM_PUSH_MUTED_SQL(so, sa) \
	"(COALESCE(" so ".mute_until, " sa ".mute_until, '-infinity')" GT "pg_catalog.now())"
#define IM_PUSH_PREVIEW_LEVEL_SQL(p) \
	"(pg_catalog.array_position('{none,sender,full}'::pg_catalog.text[], " p ")" MINUS "1)"
#define IM_PUSH_ONLINE_SQL(d) \
	"EXISTS (SELECT 1 FROM im.presence pr WHERE pr.user_id" EQ d ".user_id AND pr.device_id" EQ d ".device_id" \
	" AND pr.connection_epoch" EQ d ".connection_epoch AND pr.expires_at" GT "pg_catalog.statement_timestamp())"

/*
 * The queue statement; TRACE_SEL, TRACE_COL and TRACE_VAL carry the event's
 * trace id into the job (all empty on a catalog without trace ids).
 */
#define IM_PUSH_QUEUE_SQL(TRACE_SEL, TRACE_COL, TRACE_VAL) \
			   "WITH tg AS (" \
			   "  SELECT DISTINCT ON (t.push_target_id) t.push_target_id, t.user_id, t.device_id," \
			   "         e.message_id, e.msg_seq, i.sync_seq" TRACE_SEL \
			   "  FROM im.push_target t" \
			   "  JOIN im.inbox i ON i.user_id" EQ "t.user_id AND i.source_event_id" EQ "ANY ($2::pg_catalog.int8[])" \
			   "   AND i.kind" EQ "ANY ('{message,conversation_dirty}'::pg_catalog.text[])" \
			   "  JOIN im.event e ON e.message_id" EQ "i.source_event_id AND e.kind" EQ "'message'" \
			   "   AND e.conversation_id" EQ "$1 AND e.sender_id" NE "t.user_id" \
			   "  JOIN im.device d ON d.user_id" EQ "t.user_id AND d.device_id" EQ "t.device_id" \
			   "  LEFT JOIN im.notify_setting so ON so.user_id" EQ "t.user_id AND so.conversation_id" EQ "$1" \
			   "  LEFT JOIN im.notify_setting sa ON sa.user_id" EQ "t.user_id AND sa.conversation_id" EQ "0" \
			   "  WHERE t.disabled_at IS NULL AND d.state" NE "'REVOKED' AND d.acked_sync_seq" LT "i.sync_seq" \
			   /* a pending job coalesces these: skip the rest of the checks early */ \
			   "    AND NOT EXISTS (SELECT 1 FROM im.push_job pj WHERE pj.push_target_id" EQ "t.push_target_id" \
			   "      AND pj.conversation_id" EQ "$1 AND pj.state" EQ "ANY ('{pending,retry}'::pg_catalog.text[]))" \
			   "    AND NOT " IM_PUSH_MUTED_SQL("so", "sa") \
			   "    AND NOT " IM_PUSH_ONLINE_SQL("d") \
			   "  ORDER BY t.push_target_id, e.msg_seq)" \
			   /* \
			    * a pair with a pending job coalesces into it (the conflict): this \
			    * fanout holds the users' heads, which a claim must lock too \
			    * (the claim's first statement), so no claim sends that job before this \
			    * fanout's messages are visible to it, and one that claimed it \
			    * first made this fanout wait for its commit (then the job is no \
			    * longer pending and a new one is queued) \
			    */ \
			   /* a job id carries its user's bucket ($5: the id factor, shard_map.h) */ \
			   "INSERT INTO im.push_job (job_id, push_target_id, user_id, device_id, conversation_id, message_id," \
			   "                         msg_seq, sync_seq, not_before" TRACE_COL ")" \
			   " SELECT " IM_PLACED_ID_SQL("pg_catalog.nextval('im.push_job_id_seq')", "tg.user_id", "$5") "," \
			   "   tg.push_target_id, tg.user_id, tg.device_id, $1, tg.message_id, tg.msg_seq, tg.sync_seq," \
			   "   pg_catalog.timestamptz_larger(pg_catalog.now()" PLUS "pg_catalog.make_interval(secs => $3)," \
			   "     COALESCE(pc.last_claimed_at" PLUS "pg_catalog.make_interval(secs => $4), '-infinity'))" TRACE_VAL \
			   " FROM tg LEFT JOIN im.push_pace pc ON pc.push_target_id" EQ "tg.push_target_id" \
			   "  AND pc.conversation_id" EQ "$1" \
			   " ON CONFLICT (push_target_id, conversation_id) WHERE state" EQ "ANY ('{pending,retry}'::pg_catalog.text[])" \
			   " DO NOTHING"

/*
 * The conversation's pending jobs of suspended users go.  Run only while
 * this node has a suspension (core/standing.c), so the common fanout pays
 * nothing; a statement apart from the queue's, so that one keeps its plan.
 */
static void
drop_suspended_jobs(int64 conversation_id)
{
	static SPIPlanPtr plan;
	Datum		args[1];

	im_prepare(&plan,
			   "DELETE FROM im.push_job j USING im.user_suspension s "
			   "WHERE j.conversation_id" EQ "$1 AND j.state" EQ "ANY ('{pending,retry}'::pg_catalog.text[]) "
			   "  AND s.user_id" EQ "j.user_id "
			   "  AND (s.suspended_until IS NULL OR s.suspended_until" GT "pg_catalog.now())",
			   1, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	im_exec(plan, args, NULL, 0);
}

/*
 * Of the picked jobs, those of suspended users are completed as suppressed
 * (contract §17); returns the rest (NULL when none is left).
 */
static Datum
skip_suspended_jobs(Datum picked, bool *none_left, int64 *suppressed)
{
	static SPIPlanPtr plan;
	Datum		args[1];
	Datum		rest;

	im_prepare(&plan,
			   "WITH s AS (UPDATE im.push_job j SET state = 'suppressed', lease_until = NULL,"
			   "    finished_at = pg_catalog.now()"
			   "  FROM im.user_suspension us"
			   "  WHERE j.job_id" EQ "ANY ($1::pg_catalog.int8[]) AND us.user_id" EQ "j.user_id"
			   "    AND (us.suspended_until IS NULL OR us.suspended_until" GT "pg_catalog.now())"
			   "  RETURNING j.job_id)"
			   "SELECT (SELECT pg_catalog.array_agg(x) FROM pg_catalog.unnest($1::pg_catalog.int8[]) x"
			   "        WHERE x NOT IN (SELECT job_id FROM s)),"
			   "       (SELECT pg_catalog.count(*) FROM s)",
			   1, INT8ARRAYOID);
	args[0] = picked;
	im_exec(plan, args, NULL, 1);
	rest = im_get_datum_copy(0, 1, none_left);
	*suppressed += im_get_int64(0, 2, NULL);
	return rest;
}

void
im_push_queue_delivered(int64 conversation_id, const int64 *message_ids, int n)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr plan19;	/* a catalog without trace ids */
	Datum		args[5];
	bool		traced;

	if (n == 0 || !im_push_catalog())
		return;
	traced = im_catalog_at_least(1, 10);
	/*
	 * From the targets of the users whose log just received one of the
	 * messages (a `message` event, or the clean -> dirty `conversation_dirty`
	 * marker event of shared_log): the first of them per target; a pending
	 * job of the pair already covers them all (the claim looks for the
	 * latest).  The job takes that message's trace id.
	 */
	if (traced)
		im_prepare(&plan, IM_PUSH_QUEUE_SQL(", e.trace_id", ", trace_id", ", tg.trace_id"),
				   5, INT8OID, INT8ARRAYOID, FLOAT8OID, FLOAT8OID, INT8OID);
	else
		im_prepare(&plan19, IM_PUSH_QUEUE_SQL("", "", ""),
				   5, INT8OID, INT8ARRAYOID, FLOAT8OID, FLOAT8OID, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	args[1] = im_int8_array(message_ids, n);
	args[2] = Float8GetDatum(im_push_delay_ms / 1000.0);
	args[3] = Float8GetDatum(im_push_min_interval_ms / 1000.0);
	args[4] = Int64GetDatum(im_shard_id_factor());
	if (im_exec(traced ? plan : plan19, args, NULL, 0) > 0)
	{
		/* a suspended user gets no push: their new jobs go (contract §17) */
		if (im_standing_any())
			drop_suspended_jobs(conversation_id);
		Async_Notify("im_sync_push", "");	/* one per transaction: identical ones fold */
	}
}

/*
 * Finished jobs older than im_sync.push_max_age go, and pace rows older
 * than im_sync.push_min_interval (they no longer hold anything back), a
 * bounded number per call: the tables stay bounded without maintenance.
 */
static void
collect_finished(void)
{
	static SPIPlanPtr plan;
	static SPIPlanPtr pace_plan;
	Datum		args[2];

	im_prepare(&plan,
			   "DELETE FROM im.push_job WHERE job_id" EQ "ANY (ARRAY("
			   "  SELECT job_id FROM im.push_job"
			   "  WHERE finished_at" LT "(pg_catalog.now()" MINUS "pg_catalog.make_interval(secs => $1))"
			   "  ORDER BY finished_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
			   2, FLOAT8OID, INT4OID);
	args[0] = Float8GetDatum((double) im_push_max_age_s);
	args[1] = Int32GetDatum(IM_PUSH_COLLECT_BATCH);
	im_exec(plan, args, NULL, 0);
	im_prepare(&pace_plan,
			   "DELETE FROM im.push_pace WHERE ctid" EQ "ANY (ARRAY("
			   "  SELECT ctid FROM im.push_pace"
			   "  WHERE last_claimed_at" LT "(pg_catalog.now()" MINUS "pg_catalog.make_interval(secs => $1))"
			   "  LIMIT $2 FOR UPDATE SKIP LOCKED))",
			   2, FLOAT8OID, INT4OID);
	args[0] = Float8GetDatum(im_push_min_interval_ms / 1000.0);
	im_exec(pace_plan, args, NULL, 0);
}

/*
 * The claim statement; TRACE_INFO, TRACE_SET and TRACE_OUT carry the trace
 * id of the message sent into the job and the result (the first two empty,
 * the last a NULL, on a catalog without trace ids).
 */
#define IM_PUSH_CLAIM_SQL(TRACE_INFO, TRACE_SET, TRACE_OUT) \
			   "WITH pick AS (SELECT pg_catalog.unnest($2::pg_catalog.int8[]) AS job_id)," \
			   /* \
			    * the latest message of the conversation in the user's log since \
			    * the job's first one (coalesced messages), not recalled, not the \
			    * user's own; the job's own message if the log lost them (GC) \
			    */ \
			   " latest AS (" \
			   "  SELECT pick.job_id, lt.sync_seq, lt.message_id, lt.msg_seq, lt.n" \
			   "  FROM pick JOIN im.push_job j ON j.job_id" EQ "pick.job_id" \
			   "  JOIN LATERAL (" \
			   "    SELECT i.sync_seq, e.message_id, e.msg_seq, pg_catalog.count(*) OVER () AS n" \
			   "    FROM im.inbox i JOIN im.event e ON e.message_id" EQ "i.source_event_id" \
			   "    WHERE i.user_id" EQ "j.user_id AND i.sync_seq" GE "j.sync_seq" \
			   "      AND i.conversation_id" EQ "j.conversation_id" \
			   "      AND i.kind" EQ "ANY ('{message,conversation_dirty}'::pg_catalog.text[])" \
			   "      AND e.kind" EQ "'message' AND e.sender_id" NE "j.user_id AND NOT e.recalled" \
			   "    ORDER BY i.sync_seq DESC LIMIT 1) lt ON true)," \
			   " info AS (" \
			   "  SELECT j.job_id, j.push_target_id, t.provider, t.app_id, t.sealed_token, j.user_id," \
			   "         j.conversation_id, e.message_id, e.msg_seq, e.sender_id, e.body," \
			   "         COALESCE(l.sync_seq, j.sync_seq) AS sync_seq, COALESCE(l.n" MINUS "1, 0) AS coalesced," \
			   "         pg_catalog.int4smaller(" IM_PUSH_PREVIEW_LEVEL_SQL("t.preview") "," \
			   "           " IM_PUSH_PREVIEW_LEVEL_SQL("COALESCE(so.preview, sa.preview, 'full')") ") AS level," \
			   "         CASE WHEN j.queued_at" LT "(pg_catalog.now()" MINUS "pg_catalog.make_interval(secs => $4))" \
			   "              THEN 'expired'" \
			   /* \
			    * one push per (target, conversation) per claim: a lapsed lease \
			    * claimed beside the pair's newer job is superseded by it (the \
			    * newer one carries the latest message; pacing keeps one row) \
			    */ \
			   "              WHEN pg_catalog.row_number() OVER (PARTITION BY j.push_target_id, j.conversation_id" \
			   "                                                 ORDER BY j.job_id DESC)" GT "1" \
			   "              THEN 'suppressed'" \
			   "              WHEN t.disabled_at IS NOT NULL OR e.message_id IS NULL OR e.recalled" \
			   "                OR d.acked_sync_seq" GE "COALESCE(l.sync_seq, j.sync_seq) OR d.state" EQ "'REVOKED'" \
			   "                OR " IM_PUSH_MUTED_SQL("so", "sa") " OR " IM_PUSH_ONLINE_SQL("d") \
			   "              THEN 'suppressed' ELSE 'claimed' END AS next" TRACE_INFO \
			   "  FROM pick JOIN im.push_job j ON j.job_id" EQ "pick.job_id" \
			   "  JOIN im.push_target t ON t.push_target_id" EQ "j.push_target_id" \
			   "  JOIN im.device d ON d.user_id" EQ "t.user_id AND d.device_id" EQ "t.device_id" \
			   "  LEFT JOIN latest l ON l.job_id" EQ "j.job_id" \
			   "  LEFT JOIN im.event e ON e.message_id" EQ "COALESCE(l.message_id, j.message_id)" \
			   "  LEFT JOIN im.notify_setting so ON so.user_id" EQ "j.user_id AND so.conversation_id" EQ "j.conversation_id" \
			   "  LEFT JOIN im.notify_setting sa ON sa.user_id" EQ "j.user_id AND sa.conversation_id" EQ "0)," \
			   " upd AS (" \
			   "  UPDATE im.push_job j SET state = info.next," \
			   /* the job records what was sent */ \
			   "    message_id = COALESCE(info.message_id, j.message_id), msg_seq = COALESCE(info.msg_seq, j.msg_seq)," \
			   "    sync_seq = info.sync_seq, coalesced = info.coalesced," TRACE_SET \
			   "    relay_id = CASE WHEN info.next" EQ "'claimed' THEN $1 ELSE j.relay_id END," \
			   "    lease_until = CASE WHEN info.next" EQ "'claimed' THEN pg_catalog.now()" PLUS "$3 END," \
			   "    claimed_at = CASE WHEN info.next" EQ "'claimed' THEN pg_catalog.now() ELSE j.claimed_at END," \
			   "    attempts = j.attempts" PLUS "CASE WHEN info.next" EQ "'claimed' THEN 1 ELSE 0 END," \
			   "    finished_at = CASE WHEN info.next" NE "'claimed' THEN pg_catalog.now() END" \
			   "  FROM info WHERE j.job_id" EQ "info.job_id RETURNING 1)," \
			   " pace AS (" \
			   "  INSERT INTO im.push_pace (push_target_id, conversation_id, last_claimed_at)" \
			   "  SELECT info.push_target_id, info.conversation_id, pg_catalog.now() FROM info" \
			   "  WHERE info.next" EQ "'claimed'" \
			   "  ON CONFLICT (push_target_id, conversation_id) DO UPDATE SET last_claimed_at = EXCLUDED.last_claimed_at" \
			   "  RETURNING 1)" \
			   "SELECT info.job_id, info.push_target_id, info.provider, info.app_id, info.sealed_token," \
			   "  pg_catalog.jsonb_build_object('notification'," \
			   "    pg_catalog.jsonb_build_object('event_id', info.message_id::pg_catalog.text," \
			   "      'room_id', info.conversation_id::pg_catalog.text, 'type', 'im.message', 'prio', 'high'," \
			   "      'counts', pg_catalog.jsonb_build_object('unread'," \
			   "        (SELECT COALESCE(pg_catalog.sum(uc.unread_count), 0) FROM im.user_conversation uc" \
			   "          WHERE uc.user_id" EQ "info.user_id))," \
			   "      'devices', pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(" \
			   "        'app_id', info.app_id, 'pushkey', ''," \
			   "        'data', pg_catalog.jsonb_build_object('default_payload', pg_catalog.jsonb_build_object(" \
			   "          'conversation_id', info.conversation_id, 'msg_seq', info.msg_seq)))))" \
			   "    OPERATOR(pg_catalog.||) CASE WHEN info.level" GE "1" \
			   "      THEN pg_catalog.jsonb_build_object('sender', info.sender_id::pg_catalog.text)" \
			   "      ELSE '{}'::pg_catalog.jsonb END" \
			   "    OPERATOR(pg_catalog.||) CASE WHEN info.level" GE "2" \
			   "      THEN pg_catalog.jsonb_build_object('content'," \
			   /* the body whole or not at all: never a cut JSON text or UTF-8 sequence */ \
			   "        CASE WHEN pg_catalog.octet_length(info.body::pg_catalog.text)" LE "1024 THEN info.body" \
			   "             ELSE '{\"truncated\": true}'::pg_catalog.jsonb END)" \
			   "      ELSE '{}'::pg_catalog.jsonb END)," \
			   "  info.next," \
			   "  (SELECT pg_catalog.count(*) FROM upd)" PLUS "(SELECT pg_catalog.count(*) FROM pace)" TRACE_OUT \
			   " FROM info ORDER BY info.job_id"

/* Result columns of the claim statement. */
enum
{
	Anum_claim_job_id = 1,
	Anum_claim_push_target_id,
	Anum_claim_provider,
	Anum_claim_app_id,
	Anum_claim_sealed_token,
	Anum_claim_notification,
	Anum_claim_next,
	Anum_claim_changed,
	Anum_claim_trace_id
};

PG_FUNCTION_INFO_V1(im_claim_push_jobs);
Datum
im_claim_push_jobs(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr lock_plan;
	static SPIPlanPtr plan;
	static SPIPlanPtr plan19;	/* a catalog without trace ids */
	Datum		picked;
	bool		picked_null;
	char	   *relay_id = im_arg_text(fcinfo, 0, "relay_id", 128);
	int32		max_jobs = im_arg_int32(fcinfo, 1, "max_jobs", 1, 10000);
	Interval   *lease;
	Datum		args[4];
	uint64		n;
	int64		suppressed = 0;
	/* a catalog without trace ids declares six result columns: the seventh value is not stored */
	bool		traced = im_catalog_at_least(1, 10);

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must not be NULL")));
	lease = PG_GETARG_INTERVAL_P(2);
	if (lease->month != 0 || lease->day != 0 || lease->time < USECS_PER_SEC || lease->time > USECS_PER_HOUR)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be 1 second to 1 hour")));
	im_push_require_catalog();

	im_srf_begin(fcinfo);
	im_spi_connect();
	collect_finished();
	/*
	 * First lock the jobs and their users' heads, skipping both when locked:
	 * a fanout into the user holds the head until it commits, so a job is
	 * claimed only when no fanout is coalescing into it.  The statement
	 * below then runs with a snapshot taken after these locks, so it sees
	 * every message such a fanout coalesced into the job (a fanout that
	 * starts now waits for this claim's commit and queues a new job).
	 */
	im_prepare(&lock_plan,
			   "SELECT pg_catalog.array_agg(job_id) FROM ("
			   "  SELECT j.job_id FROM im.push_job j JOIN im.user_head h ON h.user_id" EQ "j.user_id"
			   "  WHERE (j.state" EQ "ANY ('{pending,retry}'::pg_catalog.text[]) AND j.not_before" LE "pg_catalog.now())"
			   "     OR (j.state" EQ "'claimed' AND j.lease_until" LE "pg_catalog.now())"
			   "  ORDER BY j.not_before, j.job_id LIMIT $1"
			   "  FOR UPDATE OF j SKIP LOCKED FOR SHARE OF h SKIP LOCKED) picked",
			   1, INT4OID);
	args[0] = Int32GetDatum(max_jobs);
	im_exec(lock_plan, args, NULL, 0);
	picked = im_get_datum_copy(0, 1, &picked_null);
	if (!picked_null && im_standing_any())
		picked = skip_suspended_jobs(picked, &picked_null, &suppressed);
	if (picked_null)
	{
		im_counter_add_at_commit(IM_COUNTER_PUSH_SUPPRESSED, suppressed);
		SPI_finish();
		PG_RETURN_NULL();
	}
	if (traced)
		im_prepare(&plan,
				   IM_PUSH_CLAIM_SQL(
				   /* the trace id of the message sent: the job's own keeps the job's */
									 ", CASE WHEN COALESCE(e.message_id, j.message_id)" EQ "j.message_id"
									 "   THEN COALESCE(e.trace_id, j.trace_id) ELSE e.trace_id END AS trace_id",
									 " trace_id = info.trace_id,", ", info.trace_id"),
				   4, TEXTOID, INT8ARRAYOID, INTERVALOID, FLOAT8OID);
	else
		im_prepare(&plan19, IM_PUSH_CLAIM_SQL("", "", ", NULL::pg_catalog.text"),
				   4, TEXTOID, INT8ARRAYOID, INTERVALOID, FLOAT8OID);
	args[0] = CStringGetTextDatum(relay_id);
	args[1] = picked;
	args[2] = IntervalPGetDatum(lease);
	args[3] = Float8GetDatum((double) im_push_max_age_s);
	n = im_exec(traced ? plan : plan19, args, NULL, 0);
	for (uint64 i = 0; i < n; i++)
	{
		char	   *next = im_get_text(i, Anum_claim_next);
		Datum		values[7];
		bool		nulls[7] = {false, false, false, false, false, false, false};

		if (strcmp(next, "claimed") != 0)
		{
			if (strcmp(next, "suppressed") == 0)
				suppressed++;
			continue;
		}
		values[0] = Int64GetDatum(im_get_int64(i, Anum_claim_job_id, NULL));
		values[1] = Int64GetDatum(im_get_int64(i, Anum_claim_push_target_id, NULL));
		values[2] = CStringGetTextDatum(im_get_text(i, Anum_claim_provider));
		values[3] = CStringGetTextDatum(im_get_text(i, Anum_claim_app_id));
		values[4] = CStringGetTextDatum(im_get_text(i, Anum_claim_sealed_token));
		values[5] = im_get_datum_copy(i, Anum_claim_notification, &nulls[5]);
		values[6] = im_get_datum_copy(i, Anum_claim_trace_id, &nulls[6]);
		im_srf_row(fcinfo, values, nulls);
	}
	im_counter_add_at_commit(IM_COUNTER_PUSH_SUPPRESSED, suppressed);
	SPI_finish();
	PG_RETURN_NULL();
}

static const char *const push_results[] = {"delivered", "rejected", "rate_limited", "transient", "permanent"};

static int
result_index(const char *result)
{
	for (int i = 0; i < (int) lengthof(push_results); i++)
		if (strcmp(result, push_results[i]) == 0)
			return i;
	return -1;
}

const char *
im_push_result_name(int i)
{
	return push_results[i];
}

/* Set the job's final state with the relay's answer. */
static void
finish_job(int64 job_id, const char *state, const char *result, Datum *answer, const char *answer_nulls)
{
	static SPIPlanPtr plan;
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	im_prepare(&plan,
			   "UPDATE im.push_job SET state = $2, last_result = $3, http_status = $4, provider_ref = $5,"
			   "  lease_until = NULL, finished_at = pg_catalog.now() "
			   "WHERE job_id" EQ "$1",
			   5, INT8OID, TEXTOID, TEXTOID, INT4OID, TEXTOID);
	args[0] = Int64GetDatum(job_id);
	args[1] = CStringGetTextDatum(state);
	args[2] = CStringGetTextDatum(result);
	args[3] = answer[0];
	nulls[3] = answer_nulls[0];
	args[4] = answer[1];
	nulls[4] = answer_nulls[1];
	im_exec(plan, args, nulls, 0);
}

/* the merged job takes the newer one's message, and with it its trace id */
#define IM_PUSH_TAKE_NEWER_SQL(TRACE_OUT) \
	"DELETE FROM im.push_job WHERE push_target_id" EQ "$1 AND conversation_id" EQ "$2" \
	" AND state" EQ "ANY ('{pending,retry}'::pg_catalog.text[])" \
	" RETURNING message_id, msg_seq, sync_seq, coalesced" TRACE_OUT
#define IM_PUSH_REQUEUE_SQL(TRACE_SET) \
	"UPDATE im.push_job SET state = 'retry', lease_until = NULL, last_result = $3," \
	"  http_status = $4, provider_ref = $5," \
	"  not_before = pg_catalog.now()" PLUS "pg_catalog.make_interval(secs => $2)," \
	"  message_id = COALESCE($6, message_id), msg_seq = COALESCE($7, msg_seq)," TRACE_SET \
	"  sync_seq = COALESCE($8, sync_seq), coalesced = coalesced" PLUS "CASE WHEN $6 IS NULL THEN 0 ELSE 1 END " \
	"WHERE job_id" EQ "$1"

/*
 * A failed job goes back to the queue.  A message queued for the same
 * (target, conversation) while it was out is merged into it (there is one
 * pending job per pair), so it carries the latest message and waits out
 * the backoff.  The newer job goes first: the unique index allows one.
 */
static void
retry_job(int64 job_id, int64 target_id, int64 conversation_id, double delay_s,
		  const char *result, Datum *answer, const char *answer_nulls)
{
	static SPIPlanPtr take_newer;
	static SPIPlanPtr requeue;
	static SPIPlanPtr take_newer19;	/* a catalog without trace ids */
	static SPIPlanPtr requeue19;
	Datum		args[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool		newer;
	bool		traced = im_catalog_at_least(1, 10);

	if (traced)
	{
		im_prepare(&take_newer, IM_PUSH_TAKE_NEWER_SQL(", trace_id"), 2, INT8OID, INT8OID);
		im_prepare(&requeue,
				   IM_PUSH_REQUEUE_SQL("  trace_id = CASE WHEN $6 IS NULL THEN trace_id ELSE $9 END,"),
				   9, INT8OID, FLOAT8OID, TEXTOID, INT4OID, TEXTOID, INT8OID, INT8OID, INT8OID, TEXTOID);
	}
	else
	{
		im_prepare(&take_newer19, IM_PUSH_TAKE_NEWER_SQL(""), 2, INT8OID, INT8OID);
		im_prepare(&requeue19, IM_PUSH_REQUEUE_SQL(""),
				   8, INT8OID, FLOAT8OID, TEXTOID, INT4OID, TEXTOID, INT8OID, INT8OID, INT8OID);
	}
	args[0] = Int64GetDatum(target_id);
	args[1] = Int64GetDatum(conversation_id);
	newer = im_exec(traced ? take_newer : take_newer19, args, NULL, 0) == 1;
	args[0] = Int64GetDatum(job_id);
	args[1] = Float8GetDatum(delay_s);
	args[2] = CStringGetTextDatum(result);
	args[3] = answer[0];
	nulls[3] = answer_nulls[0];
	args[4] = answer[1];
	nulls[4] = answer_nulls[1];
	for (int c = 0; c < 3; c++)
	{
		bool		isnull = true;

		args[5 + c] = newer ? Int64GetDatum(im_get_int64(0, c + 1, &isnull)) : (Datum) 0;
		nulls[5 + c] = newer ? ' ' : 'n';
	}
	if (traced)
	{
		bool		isnull = true;

		args[8] = newer ? im_get_datum_copy(0, 5, &isnull) : (Datum) 0;
		nulls[8] = isnull ? 'n' : ' ';
	}
	im_exec(traced ? requeue : requeue19, args, nulls, 0);
}

/* Columns of the job statement of complete_push_job. */
enum
{
	Anum_job_current = 1,
	Anum_job_too_old,
	Anum_job_attempts,
	Anum_job_target,
	Anum_job_conversation
};

PG_FUNCTION_INFO_V1(im_complete_push_job);
Datum
im_complete_push_job(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr job_plan;
	static SPIPlanPtr reset_plan;
	static SPIPlanPtr reject_plan;
	int64		job_id = im_arg_id(fcinfo, 0, "job_id");
	char	   *relay_id = im_arg_text(fcinfo, 1, "relay_id", 128);
	char	   *result;
	int			which;
	Datum		args[2];
	Datum		answer[2];
	char		answer_nulls[2] = {' ', ' '};
	const char *state;
	int64		target_id;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("result must be delivered, rejected, rate_limited, transient or permanent, got NULL")));
	result = TextDatumGetCString(PG_GETARG_DATUM(2));
	which = result_index(result);
	if (which < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("result must be delivered, rejected, rate_limited, transient or permanent, got \"%.32s\"",
						result)));
	if (!PG_ARGISNULL(3) && (PG_GETARG_INT32(3) < 100 || PG_GETARG_INT32(3) > 599))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("http_status must be 100 to 599, got %d", PG_GETARG_INT32(3))));
	if (!PG_ARGISNULL(4) && PG_GETARG_INT32(4) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("retry_after_ms must not be negative, got %d", PG_GETARG_INT32(4))));
	if (!PG_ARGISNULL(5) && VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(5)) > 256)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("provider_ref must be at most 256 bytes")));
	im_push_require_catalog();
	answer[0] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	answer_nulls[0] = PG_ARGISNULL(3) ? 'n' : ' ';
	answer[1] = PG_ARGISNULL(5) ? (Datum) 0 : PG_GETARG_DATUM(5);
	answer_nulls[1] = PG_ARGISNULL(5) ? 'n' : ' ';

	im_spi_connect();
	im_prepare(&job_plan,
			   "SELECT state" EQ "'claimed' AND relay_id" EQ "$2 AND lease_until" GT "pg_catalog.now(),"
			   "  queued_at" LT "(pg_catalog.now()" MINUS "pg_catalog.make_interval(secs => $3)),"
			   "  attempts, push_target_id, conversation_id "
			   "FROM im.push_job WHERE job_id" EQ "$1 FOR UPDATE",
			   3, INT8OID, TEXTOID, FLOAT8OID);
	args[0] = Int64GetDatum(job_id);
	args[1] = CStringGetTextDatum(relay_id);
	{
		Datum		jargs[3] = {args[0], args[1], Float8GetDatum((double) im_push_max_age_s)};

		/* a job gone (its target removed) or re-claimed after the lease: nothing changes */
		if (im_exec(job_plan, jargs, NULL, 0) != 1 || !im_get_bool(0, Anum_job_current, NULL))
		{
			SPI_finish();
			PG_RETURN_TEXT_P(cstring_to_text("stale"));
		}
	}
	target_id = im_get_int64(0, Anum_job_target, NULL);
	im_counter_add_at_commit(IM_COUNTER_PUSH_DELIVERED + which, 1);

	args[0] = Int64GetDatum(target_id);
	if (strcmp(result, "delivered") == 0)
	{
		im_prepare(&reset_plan, "UPDATE im.push_target SET rejections = 0 WHERE push_target_id" EQ "$1",
				   1, INT8OID);
		im_exec(reset_plan, args, NULL, 0);
		state = "delivered";
	}
	else if (strcmp(result, "rejected") == 0)
	{
		/*
		 * Three in a row disable the target (a gateway rejecting every key is
		 * misconfigured; one rejection is a dead token).  Only against the
		 * token that was sent: a target registered again since the claim
		 * holds a new token, which this answer says nothing about.
		 */
		im_prepare(&reject_plan,
				   "UPDATE im.push_target t SET rejections = t.rejections" PLUS "1,"
				   "  disabled_at = CASE WHEN t.rejections" PLUS "1" GE "3 AND t.disabled_at IS NULL"
				   "                THEN pg_catalog.now() ELSE t.disabled_at END "
				   "FROM im.push_job j WHERE t.push_target_id" EQ "$1 AND j.job_id" EQ "$2"
				   " AND t.registered_at" LE "j.claimed_at "
				   "RETURNING t.rejections" GE "3",
				   2, INT8OID, INT8OID);
		args[1] = Int64GetDatum(job_id);
		if (im_exec(reject_plan, args, NULL, 0) == 1 && im_get_bool(0, 1, NULL))
		{
			state = "target_disabled";
			im_counter_add_at_commit(IM_COUNTER_PUSH_TARGETS_DISABLED, 1);
		}
		else
			state = "dead";
	}
	else if (strcmp(result, "permanent") == 0)
		state = "dead";
	else if (im_get_bool(0, Anum_job_too_old, NULL))
		state = "expired";
	else
	{
		int32		attempts = im_get_int32(0, Anum_job_attempts, NULL);
		int64		conversation_id = im_get_int64(0, Anum_job_conversation, NULL);
		/* 10 s doubling per attempt, capped at 1 h */
		double		delay = Min(3600.0, 10.0 * pow(2.0, Max(attempts - 1, 0)));

		if (strcmp(result, "rate_limited") == 0 && !PG_ARGISNULL(4))
			delay = Max(delay, PG_GETARG_INT32(4) / 1000.0);
		retry_job(job_id, target_id, conversation_id, delay, result, answer, answer_nulls);
		SPI_finish();
		PG_RETURN_TEXT_P(cstring_to_text("retry"));
	}
	finish_job(job_id, state, result, answer, answer_nulls);
	SPI_finish();
	PG_RETURN_TEXT_P(cstring_to_text(state));
}
