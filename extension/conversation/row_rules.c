/*
 * row_rules.c — the cross-column rules of the send path's rows, as the
 * immutable C functions their one CHECK constraint per table calls:
 * im.event_fields_valid (CHECK event_kind_fields) and
 * im.conversation_pair_valid, which the trigger conversation_direct_pair
 * (im.conversation_pair_check) applies: a CHECK on im.conversation was
 * planned again at every head UPDATE of every send, under the
 * conversation's row lock, for columns it never writes (upgrades.md,
 * "Catalog history kept in code").
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
 *     is not a system event (create, join, mode): a leave has a sender and
 *     its key only when it is a removal (contract §17), a role change made
 *     by the owner's leave has neither;
 *   - a target_message_id exactly on recall, edit, reaction and takedown;
 *   - a reply target only on a message, a pin target only on a pin;
 *   - a direct conversation names its ordered pair (lo < hi), a group none.
 */
#include "core/im_sync.h"

#include "commands/trigger.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/rel.h"

/* t equals the NUL-terminated word w */
static bool
text_is(const text *t, const char *w)
{
	size_t		len = strlen(w);

	return VARSIZE_ANY_EXHDR(t) == len && memcmp(VARDATA_ANY(t), w, len) == 0;
}

/* text argument argno equals w */
static bool
arg_is(FunctionCallInfo fcinfo, int argno, const char *w)
{
	return text_is(PG_GETARG_TEXT_PP(argno), w);
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
 *   (a leave is not among the system kinds: a removal's leave has the
 *   actor as sender and its key; a plain leave has no sender)
 *   AND (target_message_id IS NOT NULL) = (kind IN ('recall', 'edit', 'reaction', 'takedown'))
 *   AND (reply_to_message_id IS NULL OR kind = 'message')
 *   AND (pin_message_id IS NULL OR kind = 'pin')
 * kind is NOT NULL (checked before any CHECK); a NULL kind answers NULL, as
 * the SQL did.
 */
PG_FUNCTION_INFO_V1(im_event_fields_valid);
Datum
im_event_fields_valid(PG_FUNCTION_ARGS)
{
	static const char *const system_kinds[] = {"create", "join", "mode", NULL};
	static const char *const target_kinds[] = {"recall", "edit", "reaction", "takedown", NULL};

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	PG_RETURN_BOOL(PG_ARGISNULL(2) == (PG_ARGISNULL(1) || arg_is_any(fcinfo, 0, system_kinds)) &&
				   !PG_ARGISNULL(3) == arg_is_any(fcinfo, 0, target_kinds) &&
				   (PG_ARGISNULL(4) || arg_is(fcinfo, 0, "message")) &&
				   (PG_ARGISNULL(5) || arg_is(fcinfo, 0, "pin")));
}

/*
 * The pair rule on one row, three-valued as the CHECK was: 1 true, 0 false,
 * -1 NULL (passes).  kind NULL answers NULL.
 */
static int
pair_rule(const text *kind, bool lo_null, int64 lo, bool hi_null, int64 hi)
{
	bool		pair_set = !lo_null && !hi_null;
	if (kind == NULL)
		return -1;
	if (text_is(kind, "direct") != pair_set)
		return 0;
	if (!pair_set)
		return -1;
	return lo < hi;
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
	int			r = pair_rule(PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0),
							  PG_ARGISNULL(1), PG_ARGISNULL(1) ? 0 : PG_GETARG_INT64(1),
							  PG_ARGISNULL(2), PG_ARGISNULL(2) ? 0 : PG_GETARG_INT64(2));

	if (r < 0)
		PG_RETURN_NULL();
	PG_RETURN_BOOL(r == 1);
}

/* int8 column `name` of the trigger's row; *isnull set */
static int64
row_int8(TriggerData *td, HeapTuple row, const char *name, bool *isnull)
{
	TupleDesc	desc = RelationGetDescr(td->tg_relation);
	Datum		d = heap_getattr(row, SPI_fnumber(desc, name), desc, isnull);

	return *isnull ? 0 : DatumGetInt64(d);
}

/*
 * im.conversation_pair_check() — trigger conversation_direct_pair (1.8):
 * AFTER INSERT OR UPDATE OF kind, direct_user_lo, direct_user_hi, FOR EACH
 * ROW, enabled ALWAYS.  Refuses the row the CHECK refused, with the CHECK's
 * SQLSTATE and message; a head UPDATE names none of the three columns, so
 * it never runs (nor does any row lock or node text with it).
 */
PG_FUNCTION_INFO_V1(im_conversation_pair_check);
Datum
im_conversation_pair_check(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	HeapTuple	row;
	TupleDesc	desc;
	Datum		kind;
	bool		kind_null,
				lo_null,
				hi_null;
	int64		lo,
				hi;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event))
		elog(ERROR, "im_sync: im.conversation_pair_check must run as an AFTER ROW trigger");
	row = TRIGGER_FIRED_BY_UPDATE(td->tg_event) ? td->tg_newtuple : td->tg_trigtuple;
	desc = RelationGetDescr(td->tg_relation);
	kind = heap_getattr(row, SPI_fnumber(desc, "kind"), desc, &kind_null);
	lo = row_int8(td, row, "direct_user_lo", &lo_null);
	hi = row_int8(td, row, "direct_user_hi", &hi_null);
	if (pair_rule(kind_null ? NULL : DatumGetTextPP(kind), lo_null, lo, hi_null, hi) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_CHECK_VIOLATION),
				 errmsg("new row for relation \"%s\" violates check constraint \"%s\"",
						RelationGetRelationName(td->tg_relation), "conversation_direct_pair"),
				 errdetail("A direct conversation names its ordered pair (direct_user_lo < direct_user_hi), a group none."),
				 errtableconstraint(td->tg_relation, "conversation_direct_pair")));
	return PointerGetDatum(NULL);
}
