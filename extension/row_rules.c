/*
 * row_rules.c — the cross-column rules of the send path's rows, as the
 * immutable C functions their one CHECK constraint per table calls
 * (issue 10, 1.6): im.event_fields_valid (CHECK event_kind_fields) and
 * im.conversation_pair_valid (CHECK conversation_direct_pair).
 *
 * Why C: PostgreSQL reads every CHECK of a table from its stored node text,
 * plans and compiles it again at the start of each INSERT or UPDATE
 * statement (ExecRelCheck); the send path's statements paid that for the
 * event's three CHECKs (4.5 kB of node text, array constants) and the
 * conversation's one on every head UPDATE.  A call of one function with
 * its columns as arguments is a small node tree, and the rules below are
 * exactly the SQL they replace, three-valued logic included (a CHECK passes
 * on NULL).
 *
 * Invariants protected here (contract §1, §3, §14):
 *   - a position carries an idempotency key exactly when it has a sender and
 *     is not a system event (create, join, leave, mode);
 *   - a target_message_id exactly on recall, edit and reaction;
 *   - a reply target only on a message, a pin target only on a pin;
 *   - a direct conversation names its ordered pair (lo < hi), a group none.
 */
#include "im_sync.h"

#include "utils/builtins.h"

/* text argument argno equals the NUL-terminated word w */
static bool
arg_is(FunctionCallInfo fcinfo, int argno, const char *w)
{
	text	   *t = PG_GETARG_TEXT_PP(argno);
	size_t		len = strlen(w);

	return VARSIZE_ANY_EXHDR(t) == len && memcmp(VARDATA_ANY(t), w, len) == 0;
}

static bool
arg_is_any(FunctionCallInfo fcinfo, int argno, const char *const *words)
{
	for (; *words != NULL; words++)
		if (arg_is(fcinfo, argno, *words))
			return true;
	return false;
}

/*
 * im.event_fields_valid(kind, sender_id, client_msg_id, target_message_id,
 *                       reply_to_message_id, pin_message_id) -> boolean
 * The 1.5 CHECKs event_kind_fields, event_reply_to_check, event_pin_check:
 *   (client_msg_id IS NULL) = (sender_id IS NULL OR kind IN (system kinds))
 *   AND (target_message_id IS NOT NULL) = (kind IN ('recall', 'edit', 'reaction'))
 *   AND (reply_to_message_id IS NULL OR kind = 'message')
 *   AND (pin_message_id IS NULL OR kind = 'pin')
 * kind is NOT NULL (checked before any CHECK); a NULL kind answers NULL, as
 * the SQL did.
 */
PG_FUNCTION_INFO_V1(im_event_fields_valid);
Datum
im_event_fields_valid(PG_FUNCTION_ARGS)
{
	static const char *const system_kinds[] = {"create", "join", "leave", "mode", NULL};
	static const char *const target_kinds[] = {"recall", "edit", "reaction", NULL};

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	PG_RETURN_BOOL(PG_ARGISNULL(2) == (PG_ARGISNULL(1) || arg_is_any(fcinfo, 0, system_kinds)) &&
				   !PG_ARGISNULL(3) == arg_is_any(fcinfo, 0, target_kinds) &&
				   (PG_ARGISNULL(4) || arg_is(fcinfo, 0, "message")) &&
				   (PG_ARGISNULL(5) || arg_is(fcinfo, 0, "pin")));
}

/*
 * im.conversation_pair_valid(kind, direct_user_lo, direct_user_hi) -> boolean
 * The 1.5 CHECK conversation_direct_pair:
 *   ((kind = 'direct') = (lo IS NOT NULL AND hi IS NOT NULL)) AND lo < hi
 * false AND NULL is false; true AND NULL is NULL (passes): a group with one
 * of the two set passed the SQL rule and passes here.
 */
PG_FUNCTION_INFO_V1(im_conversation_pair_valid);
Datum
im_conversation_pair_valid(PG_FUNCTION_ARGS)
{
	bool		pair_set = !PG_ARGISNULL(1) && !PG_ARGISNULL(2);

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	if (arg_is(fcinfo, 0, "direct") != pair_set)
		PG_RETURN_BOOL(false);
	if (!pair_set)
		PG_RETURN_NULL();
	PG_RETURN_BOOL(PG_GETARG_INT64(1) < PG_GETARG_INT64(2));
}
