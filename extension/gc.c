/*
 * gc.c — gc_inbox and its retention fence (contract §8, design §5.4, §14.3).
 *
 * Invariant protected: nothing a device may still need is collected.  Per
 * user the fence is the lowest of
 *   - the ACK of every ACTIVE or RECOVERING device seen within
 *     im_sync.device_inactive_after (NEW/RESETTING devices will snapshot),
 *   - the resume_from of every ACTIVE, unexpired recovery session (lease),
 *   - the base of every unexpired READY/BUILDING snapshot,
 *   - the retention window: no event younger than im_sync.inbox_retention;
 * rows <= fence are deleted and user_head.gc_floor moves to the fence.  A
 * device left behind finds ACK < gc_floor and gets RESET_REQUIRED (sync.c
 * rule 6), never a gap.
 *
 * Concurrency: the fence is computed after taking the user's head FOR
 * UPDATE, in a statement with a fresh snapshot.  sync_changes holds the same
 * row FOR SHARE while it tests gc_floor and creates a recovery lease, so a
 * lease is either seen here or the recovery sees the new gc_floor.
 */
#include "im_sync.h"

#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(im_gc_inbox);
Datum
im_gc_inbox(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr users;
	static SPIPlanPtr lock;
	static SPIPlanPtr fence_plan;
	static SPIPlanPtr collect;
	int64	   *ids;
	uint64		nusers;
	int64		total = 0;

	im_srf_begin(fcinfo);
	im_spi_connect();

	/* Candidates: users whose log holds anything; ordered like every head lock. */
	im_prepare(&users,
			   "SELECT user_id FROM im.user_head "
			   "WHERE high_watermark OPERATOR(pg_catalog.>) gc_floor ORDER BY user_id",
			   0);
	nusers = im_exec(users, NULL, NULL, 0);
	ids = SPI_palloc(sizeof(int64) * (nusers + 1));
	for (uint64 i = 0; i < nusers; i++)
		ids[i] = im_get_int64(i, 1, NULL);

	im_prepare(&lock,
			   "SELECT gc_floor, high_watermark FROM im.user_head "
			   "WHERE user_id OPERATOR(pg_catalog.=) $1 FOR UPDATE",
			   1, INT8OID);
	im_prepare(&fence_plan,
			   "SELECT LEAST($2::pg_catalog.int8, "
			   " (SELECT pg_catalog.min(d.acked_sync_seq) FROM im.device d "
			   "   WHERE d.user_id OPERATOR(pg_catalog.=) $1 "
			   "   AND d.state OPERATOR(pg_catalog.=) ANY ('{ACTIVE,RECOVERING}'::pg_catalog.text[]) "
			   "   AND d.last_seen_at OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.-) "
			   "       pg_catalog.make_interval(secs => $3))), "
			   " (SELECT pg_catalog.min(s.resume_from) FROM im.recovery_session s "
			   "   WHERE s.user_id OPERATOR(pg_catalog.=) $1 AND s.state OPERATOR(pg_catalog.=) 'ACTIVE' "
			   "   AND s.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()), "
			   " (SELECT pg_catalog.min(p.base_sync_seq) FROM im.snapshot p "
			   "   WHERE p.user_id OPERATOR(pg_catalog.=) $1 "
			   "   AND p.state OPERATOR(pg_catalog.=) ANY ('{READY,BUILDING}'::pg_catalog.text[]) "
			   "   AND p.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()), "
			   " (SELECT pg_catalog.min(i.sync_seq) OPERATOR(pg_catalog.-) 1 FROM im.inbox i "
			   "   WHERE i.user_id OPERATOR(pg_catalog.=) $1 "
			   "   AND i.created_at OPERATOR(pg_catalog.>=) (pg_catalog.now() OPERATOR(pg_catalog.-) "
			   "       pg_catalog.make_interval(secs => $4))))",
			   4, INT8OID, INT8OID, FLOAT8OID, FLOAT8OID);
	im_prepare(&collect,
			   "WITH d AS (DELETE FROM im.inbox WHERE user_id OPERATOR(pg_catalog.=) $1 "
			   "           AND sync_seq OPERATOR(pg_catalog.<=) $2 RETURNING 1), "
			   "u AS (UPDATE im.user_head SET gc_floor = $2 WHERE user_id OPERATOR(pg_catalog.=) $1 "
			   "      AND gc_floor OPERATOR(pg_catalog.<) $2 RETURNING 1) "
			   "SELECT pg_catalog.count(*) FROM d",
			   2, INT8OID, INT8OID);

	for (uint64 i = 0; i < nusers; i++)
	{
		Datum		args[4];
		int64		floor;
		int64		hw;
		int64		fence;
		int64		deleted;
		Datum		v[3];
		bool		n[3] = {false, false, false};

		CHECK_FOR_INTERRUPTS();
		args[0] = Int64GetDatum(ids[i]);
		if (im_exec(lock, args, NULL, 1) != 1)
			continue;
		floor = im_get_int64(0, 1, NULL);
		hw = im_get_int64(0, 2, NULL);

		/* after the lock: a fresh snapshot sees every committed lease */
		args[1] = Int64GetDatum(hw);
		args[2] = Float8GetDatum((double) im_device_inactive_after_s);
		args[3] = Float8GetDatum((double) im_inbox_retention_s);
		im_exec(fence_plan, args, NULL, 1);
		fence = im_get_int64(0, 1, NULL);
		if (fence <= floor)
			continue;

		args[1] = Int64GetDatum(fence);
		im_exec(collect, args, NULL, 1);
		deleted = im_get_int64(0, 1, NULL);
		total += deleted;

		v[0] = Int64GetDatum(ids[i]);
		v[1] = Int64GetDatum(fence + 1);
		v[2] = Int64GetDatum(deleted);
		im_srf_row(fcinfo, v, n);
	}
	SPI_finish();
	if (total > 0)
		im_counter_add(IM_COUNTER_GC_DELETED, total);
	return (Datum) 0;
}
