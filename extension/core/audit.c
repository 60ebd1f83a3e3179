/*
 * audit.c — rows of im.audit (node-local, neither side): what happened to a
 * device or its push target, or a moderation action; never a token or a
 * body.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/audit.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

void
im_audit_device(const char *action, int64 user_id, const char *device_id, const char *detail_json)
{
	static SPIPlanPtr plan;
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	im_prepare(&plan,
			   "INSERT INTO im.audit (action, user_id, device_id, detail) "
			   "VALUES ($1, $2, $3, $4::pg_catalog.jsonb)",
			   4, TEXTOID, INT8OID, TEXTOID, TEXTOID);
	args[0] = CStringGetTextDatum(action);
	args[1] = Int64GetDatum(user_id);
	if (device_id)
		args[2] = CStringGetTextDatum(device_id);
	else
		nulls[2] = 'n';
	if (detail_json)
		args[3] = CStringGetTextDatum(detail_json);
	else
		nulls[3] = 'n';
	im_exec(plan, args, nulls, 0);
}

void
im_audit_moderation(const char *action, int64 user_id, const char *detail_json)
{
	static SPIPlanPtr plan;
	Datum		args[3];

	im_prepare(&plan,
			   "INSERT INTO im.audit (action, user_id, detail) VALUES ($1, $2, $3::pg_catalog.jsonb)",
			   3, TEXTOID, INT8OID, TEXTOID);
	args[0] = CStringGetTextDatum(action);
	args[1] = Int64GetDatum(user_id);
	args[2] = CStringGetTextDatum(detail_json);
	im_exec(plan, args, NULL, 0);
}
