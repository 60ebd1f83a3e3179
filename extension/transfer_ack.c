/*
 * transfer_ack.c — the back channel of transfers (issue 15).  PostgreSQL 15
 * has no `origin = none`, so "applied" records travel in a table of their
 * own: the destination inserts one im.transfer_ack row per transfer it
 * applied (or quarantined, which it then holds), publication
 * im_to_<source> carries it (row filter on source_node), and on the source
 * the ENABLE ALWAYS BEFORE INSERT trigger deletes exactly that
 * im.transfer_out row (transfer id and destination: never a range, never
 * "below the highest seen") and drops the ack row (returns NULL), so the
 * apply worker never meets a unique key here either.
 */
#include "im_sync.h"
#include "common.h"
#include "im_sql.h"
#include "shard_map.h"

#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(im_transfer_ack_arrive);
Datum
im_transfer_ack_arrive(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	TriggerData *td = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	const char *self;
	char	   *source;
	char	   *applied_by;
	Datum		args[2];
	bool		isnull;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(td->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(td->tg_event) || !TRIGGER_FIRED_BY_INSERT(td->tg_event))
		elog(ERROR, "im_sync: im.transfer_ack_arrive is a BEFORE INSERT row trigger");
	desc = td->tg_relation->rd_att;
	self = im_shard_self_name();
	source = SPI_getvalue(td->tg_trigtuple, desc, SPI_fnumber(desc, "source_node"));
	applied_by = SPI_getvalue(td->tg_trigtuple, desc, SPI_fnumber(desc, "applied_by"));
	if (self == NULL || source == NULL || strcmp(source, self) != 0)
	{
		/* this node's own "applied" record, for the source to read */
		if (self != NULL && applied_by != NULL && strcmp(applied_by, self) == 0)
			return PointerGetDatum(td->tg_trigtuple);
		return PointerGetDatum(NULL);
	}
	im_spi_connect();
	im_prepare(&plan,
			   "DELETE FROM im.transfer_out WHERE transfer_id" EQ "$1 AND dest_node" EQ "$2",
			   2, INT8OID, TEXTOID);
	args[0] = SPI_getbinval(td->tg_trigtuple, desc, SPI_fnumber(desc, "transfer_id"), &isnull);
	args[1] = CStringGetTextDatum(applied_by);
	im_exec(plan, args, NULL, 0);
	SPI_finish();
	return PointerGetDatum(NULL);
}
