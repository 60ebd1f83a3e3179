/*
 * moderation_log.c — im.moderation_log (contract §17): pages of the
 * moderation actions of im.audit (one row per action, written in the
 * action's transaction by whoever acts: takedown.c and the role, mute,
 * removal and suspension paths), oldest first by audit id.
 *
 * Invariant protected here: the log shows who acted, on whom, where and
 * why, never a body (the audit rows carry none; evidence is read only
 * through moderation_evidence).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/im_sql.h"
#include "ops/ops.h"

#include "catalog/pg_type.h"

/* The actions moderation_log lists (the moderation paths write them). */
#define MODERATION_ACTIONS_SQL \
	"'{set_role,mute,remove,unban,takedown,suspend,reinstate}'::pg_catalog.text[]"


PG_FUNCTION_INFO_V1(im_moderation_log);
/*
 * im.moderation_log(after_id DEFAULT 0, page_limit DEFAULT 100) -> (id, at,
 * moderator, action, user_id, conversation_id, message_id, reason): the
 * moderation rows with audit id > after_id, at most page_limit (1..1000);
 * the next page starts after the last id.  Audit rows follow
 * im_sync.audit_retention.
 */
Datum
im_moderation_log(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	int64		after_id;
	int32		page_limit = im_arg_int32(fcinfo, 1, "page_limit", 1, 1000);
	Datum		args[2];

	if (PG_ARGISNULL(0) || PG_GETARG_INT64(0) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("after_id must be a non-negative audit id"),
				 errhint("Use 0 to read from the beginning, then the last id of each page.")));
	after_id = PG_GETARG_INT64(0);

	im_srf_begin(fcinfo);
	im_spi_connect();
	im_prepare(&plan,
			   "SELECT a.audit_id, a.at, a.detail" OP_GET_TEXT "'moderator', a.action, a.user_id, "
			   "       (a.detail" OP_GET_TEXT "'conversation_id')::pg_catalog.int8, "
			   "       (a.detail" OP_GET_TEXT "'message_id')::pg_catalog.int8, "
			   "       a.detail" OP_GET_TEXT "'reason' "
			   "FROM im.audit a "
			   "WHERE a.audit_id" GT "$1 AND a.action" EQ "ANY (" MODERATION_ACTIONS_SQL ") "
			   "ORDER BY a.audit_id LIMIT $2",
			   2, INT8OID, INT4OID);
	args[0] = Int64GetDatum(after_id);
	args[1] = Int32GetDatum(page_limit);
	im_exec(plan, args, NULL, 0);
	im_srf_rows_from_spi(fcinfo, 8);
	SPI_finish();
	return (Datum) 0;
}
