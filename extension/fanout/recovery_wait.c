/*
 * recovery_wait.c — fanout workers wait while the server is in recovery
 * (see fanout.h).  RecoveryInProgress() reads shared memory, so the
 * check needs no transaction and costs nothing per loop.
 */
#include "postgres.h"

#include "access/xlog.h"
#include "miscadmin.h"

#include "fanout/fanout.h"

/* this worker logged that it waits for recovery to end */
static bool waiting_for_recovery = false;

bool
im_worker_in_recovery(void)
{
	if (RecoveryInProgress())
	{
		if (!waiting_for_recovery)
			ereport(LOG,
					(errmsg("im_sync fanout worker waits: the server is in recovery (a standby)"),
					 errdetail("The worker neither fans out nor maintains while the server is read-only; "
							   "it starts by itself when the server is promoted.")));
		waiting_for_recovery = true;
		return true;
	}
	if (waiting_for_recovery)
		ereport(LOG,
				(errmsg("im_sync fanout worker starts working: recovery has ended (the server was promoted)")));
	waiting_for_recovery = false;
	return false;
}
