/*
 * xact_horizon.c — the oldest running transaction's start (xact_horizon.h).
 *
 * Read from the backend status array (what pg_stat_activity shows as
 * xact_start), in C: pg_stat_activity hides the xact_start of other roles'
 * backends unless the reader has pg_read_all_stats, and the SECURITY
 * DEFINER paths and the workers read as the extension's owner.  A horizon
 * that missed a running transaction let the settling pass drop acks whose
 * transfers were still invisible (they then stayed unacknowledged for
 * ever), so the read must not depend on who reads.  Only this database's
 * backends count: transfers live in one database.
 */
#include "core/im_sync.h"
#include "core/xact_horizon.h"

#include "miscadmin.h"
#include "utils/backend_status.h"

TimestampTz
im_oldest_other_xact_start(void)
{
	TimestampTz oldest = 0;
	int			n;

	/* a fresh copy, not the one this transaction may have read before */
	pgstat_clear_backend_activity_snapshot();
	n = pgstat_fetch_stat_numbackends();
	for (int i = 1; i <= n; i++)
	{
		LocalPgBackendStatus *local = pgstat_fetch_stat_local_beentry(i);
		TimestampTz start;

		if (local == NULL || local->backendStatus.st_procpid == MyProcPid)
			continue;
		/*
		 * only this database's transactions write its transfers: a
		 * transaction of another database (another test database, another
		 * database's workers on one server) holds nothing back here
		 */
		if (local->backendStatus.st_databaseid != MyDatabaseId)
			continue;
		start = local->backendStatus.st_xact_start_timestamp;
		if (start != 0 && (oldest == 0 || start < oldest))
			oldest = start;
	}
	/* leave no copy behind for a later read of this transaction */
	pgstat_clear_backend_activity_snapshot();
	return oldest;
}
