/*
 * push_settings.c — notification settings (contract §13): the account
 * default (conversation_id 0 in im.notify_setting) and per-conversation
 * overrides, each with a mute and a preview.
 *
 * Semantics pinned by sql/28_push_settings.sql: NULL keeps a field, a past
 * mute_until unmutes (it is stored: an override's past time unmutes even
 * an account that is muted), `clear` drops the conversation's override
 * (then applies any field given with it).  Each field resolves on its own:
 * the override's if set, else the account's, else unmuted / 'full'; the
 * effective preview is the least revealing of that and the target's
 * (push_queue.c resolves them).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/im_sql.h"
#include "core/standing.h"
#include "push/push.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(im_set_notify);
Datum
im_set_notify(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr clear_plan;
	static SPIPlanPtr set_plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	int64		conversation_id = PG_ARGISNULL(1) ? 0 : im_arg_id(fcinfo, 1, "conversation_id");
	bool		has_mute = !PG_ARGISNULL(2);
	char	   *preview = PG_ARGISNULL(3) ? NULL : TextDatumGetCString(PG_GETARG_DATUM(3));
	bool		clear = PG_ARGISNULL(4) ? false : PG_GETARG_BOOL(4);
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	if (preview != NULL && im_push_preview_level(preview) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("preview must be none, sender or full, got \"%.32s\"", preview)));
	if (clear && conversation_id == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("clear drops a conversation's override and needs a conversation_id")));
	im_push_require_catalog();

	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */
	if (conversation_id != 0)
		im_require_ever_member(user_id, conversation_id, "Notification settings are for a conversation's members.");
	args[0] = Int64GetDatum(user_id);
	args[1] = Int64GetDatum(conversation_id);
	if (clear)
	{
		im_prepare(&clear_plan,
				   "DELETE FROM im.notify_setting WHERE user_id" EQ "$1 AND conversation_id" EQ "$2",
				   2, INT8OID, INT8OID);
		im_exec(clear_plan, args, NULL, 0);
	}
	if (has_mute || preview != NULL)
	{
		im_prepare(&set_plan,
				   "INSERT INTO im.notify_setting (user_id, conversation_id, mute_until, preview)"
				   " VALUES ($1, $2, $3, $4)"
				   " ON CONFLICT (user_id, conversation_id) DO UPDATE SET"
				   "  mute_until = COALESCE(EXCLUDED.mute_until, im.notify_setting.mute_until),"
				   "  preview = COALESCE(EXCLUDED.preview, im.notify_setting.preview),"
				   "  updated_at = pg_catalog.now()",
				   4, INT8OID, INT8OID, TIMESTAMPTZOID, TEXTOID);
		args[2] = has_mute ? PG_GETARG_DATUM(2) : (Datum) 0;
		nulls[2] = has_mute ? ' ' : 'n';
		args[3] = preview ? CStringGetTextDatum(preview) : (Datum) 0;
		nulls[3] = preview ? ' ' : 'n';
		im_exec(set_plan, args, nulls, 0);
	}
	SPI_finish();
	PG_RETURN_VOID();
}
