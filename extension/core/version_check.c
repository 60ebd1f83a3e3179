/*
 * version_check.c — the installed extversion against the library's version
 * (see version_check.h).  Read through the catalog index, not SPI: the
 * worker calls it before it knows the catalog holds the tables it expects.
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "core/version_check.h"

char *
im_catalog_version(void)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	char	   *version = NULL;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber,
				F_NAMEEQ, CStringGetDatum("im_sync"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = text_to_cstring(DatumGetTextPP(d));
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

bool
im_catalog_at_least(int major, int minor)
{
	static LocalTransactionId read_in = InvalidLocalTransactionId;
	static int	catalog_major,
				catalog_minor;

	if (read_in == InvalidLocalTransactionId || read_in != MyProc->lxid)
	{
		char	   *version = im_catalog_version();

		/* not installed (or an unparsable version): the newest layout */
		if (version == NULL || sscanf(version, "%d.%d", &catalog_major, &catalog_minor) != 2)
			catalog_major = INT_MAX, catalog_minor = INT_MAX;
		read_in = MyProc->lxid;
	}
	return catalog_major > major || (catalog_major == major && catalog_minor >= minor);
}

/* this worker is waiting for ALTER EXTENSION (logged once per wait) */
static bool worker_waiting = false;

bool
im_worker_catalog_matches(void)
{
	char	   *version;
	bool		matches;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "im_sync: catalog version check");
	version = im_catalog_version();
	matches = version == NULL || strcmp(version, IM_LIBRARY_VERSION) == 0;
	if (!matches && !worker_waiting)
		ereport(LOG,
				(errmsg("im_sync fanout worker waits: the library is version %s, the catalog is version %s",
						IM_LIBRARY_VERSION, version),
				 errdetail("The worker neither fans out nor maintains until the two agree."),
				 errhint("Run ALTER EXTENSION im_sync UPDATE in database \"%s\".",
						 get_database_name(MyDatabaseId))));
	else if (matches && version != NULL && worker_waiting)
		ereport(LOG,
				(errmsg("im_sync fanout worker resumes: the catalog is at library version %s",
						IM_LIBRARY_VERSION)));
	if (version != NULL)
		worker_waiting = !matches;
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return matches;
}
