/*
 * shard_metrics.c — the transfer rows of im.metrics() on a sharded node:
 * transfers sent and not yet acknowledged (records, age),
 * received / applied / pending / quarantined / duplicates, apply lag, and
 * per replication slot the WAL it retains and whether it lost WAL.  The
 * router labels every row with its node.  Nothing on an unsharded node.
 * This file only says what to ask; ops/metrics.c runs the queries and
 * turns their rows into im.metrics() rows (ops sits above shard).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/im_sql.h"
#include "shard/shard.h"

/* gauges (name, value, help) */
static const char *shard_gauges_sql =
"SELECT 'im_shard_transfers_unacked', (SELECT pg_catalog.count(*) FROM im.transfer_out)::float8, "
"  'Transfers this node sent whose applied record has not come back (lag in records).' "
"UNION ALL SELECT 'im_shard_transfers_unacked_oldest_age_seconds', "
"  COALESCE((SELECT EXTRACT(epoch FROM pg_catalog.now()" MINUS "pg_catalog.min(t.created_at)) "
"     FROM im.transfer_out t), 0)::float8, "
"  'Age of the oldest unacknowledged transfer sent by this node (lag in seconds; 0 when none).' "
"UNION ALL SELECT 'im_shard_transfers_received', (SELECT pg_catalog.count(*) FROM im.transfer_in)::float8, "
"  'Transfers received from other nodes (kept as the duplicate filter).' "
"UNION ALL SELECT 'im_shard_transfers_applied', (SELECT pg_catalog.count(*) FROM im.transfer_in "
"   WHERE state" EQ "'applied')::float8, 'Received transfers applied into local copies and the outbox.' "
"UNION ALL SELECT 'im_shard_transfers_pending', (SELECT pg_catalog.count(*) FROM im.transfer_in "
"   WHERE state" EQ "'pending')::float8, 'Received transfers not yet applied.' "
"UNION ALL SELECT 'im_shard_transfers_quarantined', (SELECT pg_catalog.count(*) FROM im.transfer_in "
"   WHERE state" EQ "'quarantined')::float8, 'Received transfers that failed to apply and are retried (see im.reconcile).' "
"UNION ALL SELECT 'im_shard_transfers_dead', (SELECT pg_catalog.count(*) FROM im.transfer_in "
"   WHERE state" EQ "'dead')::float8, 'Received transfers that failed im_sync.fanout_max_attempts times (see im.reconcile).' "
"UNION ALL SELECT 'im_shard_transfer_duplicates', (SELECT COALESCE(pg_catalog.sum(duplicates), 0) "
"   FROM im.transfer_in)::float8, 'Transfers that arrived again and were dropped by the exact-key filter.' "
"UNION ALL SELECT 'im_shard_apply_lag_seconds', "
"  COALESCE((SELECT EXTRACT(epoch FROM pg_catalog.now()" MINUS "pg_catalog.min(t.sent_at)) "
"     FROM im.transfer_in t WHERE t.state" EQ "'pending'), 0)::float8, "
"  'Now minus the sending time of the oldest received transfer not yet applied (0 when none).'";

/* per slot of this node's subscribers (name, value, help, type, label slot) */
static const char *shard_slots_sql =
"SELECT 'im_shard_slot_retained_wal_bytes', "
"  COALESCE(pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), s.restart_lsn), 0)::float8, "
"  'WAL this replication slot holds back (max_slot_wal_keep_size bounds it).', "
"  'gauge', 'slot', s.slot_name::text "
"FROM pg_catalog.pg_replication_slots s WHERE s.slot_name LIKE 'im\\_%' "
"UNION ALL SELECT 'im_shard_slot_lost', "
"  (s.wal_status" EQ "'lost')::int::float8, "
"  '1 when the slot lost WAL it still needed (repair: extension/doc/sharding.md).', "
"  'gauge', 'slot', s.slot_name::text "
"FROM pg_catalog.pg_replication_slots s WHERE s.slot_name LIKE 'im\\_%' "
"ORDER BY 1, 6";

int
im_shard_metric_queries(const char *queries[IM_SHARD_METRIC_QUERIES])
{
	if (!im_shard_configured())
		return 0;
	queries[0] = shard_gauges_sql;
	queries[1] = shard_slots_sql;
	return IM_SHARD_METRIC_QUERIES;
}
