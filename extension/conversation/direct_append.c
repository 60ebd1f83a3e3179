/*
 * direct_append.c — the direct path: a member's message written without a
 * statement under the conversation lock.  Everything a statement would set
 * up (relations and their indexes opened, privileges checked, the rows'
 * column layout read) is done before the lock is taken; under the lock are
 * left the two index probes, the two sequence draws and the two row inserts
 * through the executor's own single-row insert (ExecSimpleRelationInsert,
 * as logical replication applies a row: the tables' CHECK and NOT NULL
 * constraints and every index entry, unique checks included).
 *
 * Invariants protected here (design §2.3, contract §1/§3), the same the
 * append statement of the general path keeps (append.c):
 *   - the period probe runs on a snapshot taken after the conversation row
 *     lock was granted, so a concurrent leave, removal or mute is either
 *     before it (seen, nothing written) or after it (the message is inside
 *     the period, before the mute);
 *   - the idempotency key probe sees every committed event of the key; a
 *     same-key request of this conversation waited for the lock, so only a
 *     racing one of another conversation can get past it, and the key's
 *     unique index meets that one (IS409, is_key_race);
 *   - a written event always gets its outbox item in the same transaction,
 *     and nothing is written when either probe says no.
 * The direct path serves only the table layout it knows (event_columns,
 * outbox_columns): anything else — a column it cannot fill or of another
 * type, an INSERT trigger (a foreign key of the row included), a rule, row
 * security, a partitioned table, a probed index that is not complete and
 * in force (being built or dropped concurrently, open_probe), an owner
 * short of a column privilege the general path's statements need
 * (table_rte) — makes im_direct_append_begin return NULL, and the caller
 * takes the general path, whose statements obey all of them or raise what
 * they raise.  The domain checks of kind, msg_seq and state are not run:
 * the values written are 'message', head + 1 >= 1 and 'pending'.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/shard_map.h"
#include "core/shmem.h"
#include "conversation/conversation.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_opfamily.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

/* The idempotency key's unique index: probed, and named by a raced insert's 23505. */
#define KEY_INDEX_NAME "event_sender_id_client_msg_id_key"

/* What fills a column of a direct insert. */
typedef enum DirectFill
{
	FILL_NULL,					/* a nullable column without default */
	FILL_MESSAGE_ID,
	FILL_OUTBOX_ID,
	FILL_CONVERSATION_ID,
	FILL_MSG_SEQ,
	FILL_KIND,
	FILL_SENDER_ID,
	FILL_CLIENT_MSG_ID,
	FILL_REQUEST_DIGEST,
	FILL_CONTENT_TYPE,
	FILL_BODY,
	FILL_MODE,
	FILL_FALSE,
	FILL_ZERO,
	FILL_NOW,
	FILL_PENDING,
	FILL_TRACE_ID				/* the request's trace id, NULL when it has none */
} DirectFill;

/*
 * What the general path's statements do with a column (DirectColumn.stmt):
 * the privileges the direct path must find are exactly the ones they need.
 */
#define STMT_READ	0x01		/* read: key lookup, ON CONFLICT arbiter, RETURNING */
#define STMT_WRITE	0x02		/* named in the INSERT (the others take defaults) */
#define STMT_TRACED	0x04		/* named in the INSERT of a traced request */
#define STMT_IF_PRESENT 0x08	/* only when the catalog has the column */

/*
 * A known column: its name, what fills it, its type and what the general
 * path's statements do with it.  The datum written is of type `type`
 * exactly (no typmod); `domain`, when set, names the im domain over `type`
 * the column has had since 1.2 (the direct path does not run its check,
 * module comment).
 */
typedef struct DirectColumn
{
	const char *name;
	DirectFill	fill;
	Oid			type;
	const char *domain;
	int			stmt;
} DirectColumn;

#define RW	(STMT_READ | STMT_WRITE)

/*
 * im.event's columns at every catalog version (1.3 added reply and pin
 * targets, 1.10 the trace id; then the takedown flag).  The general path names trace_id only in
 * the statement of a traced request (STMT_TRACED).
 */
static const DirectColumn event_columns[] = {
	{"message_id", FILL_MESSAGE_ID, INT8OID, NULL, RW},
	{"conversation_id", FILL_CONVERSATION_ID, INT8OID, NULL, RW},
	{"msg_seq", FILL_MSG_SEQ, INT8OID, "event_seq", RW},
	{"kind", FILL_KIND, TEXTOID, "event_kind", RW},
	{"sender_id", FILL_SENDER_ID, INT8OID, NULL, RW},
	{"client_msg_id", FILL_CLIENT_MSG_ID, TEXTOID, NULL, RW},
	{"request_digest", FILL_REQUEST_DIGEST, BYTEAOID, NULL, RW},
	{"content_type", FILL_CONTENT_TYPE, TEXTOID, NULL, STMT_WRITE},
	{"body", FILL_BODY, JSONBOID, NULL, STMT_WRITE},
	{"target_message_id", FILL_NULL, INT8OID, NULL, STMT_WRITE},
	{"subject_user_id", FILL_NULL, INT8OID, NULL, STMT_WRITE},
	{"mode", FILL_MODE, TEXTOID, NULL, STMT_WRITE},
	{"recalled", FILL_FALSE, BOOLOID, NULL, 0},
	{"created_at", FILL_NOW, TIMESTAMPTZOID, NULL, 0},
	{"reply_to_message_id", FILL_NULL, INT8OID, NULL, 0},
	{"pin_message_id", FILL_NULL, INT8OID, NULL, 0},
	{"trace_id", FILL_TRACE_ID, TEXTOID, NULL, STMT_TRACED},
	{"taken_down", FILL_FALSE, BOOLOID, NULL, 0},
	{NULL}
};

/* im.outbox's columns: a conversation position's item. */
static const DirectColumn outbox_columns[] = {
	{"outbox_id", FILL_OUTBOX_ID, INT8OID, NULL, 0},
	{"conversation_id", FILL_CONVERSATION_ID, INT8OID, NULL, STMT_WRITE},
	{"msg_seq", FILL_MSG_SEQ, INT8OID, NULL, STMT_WRITE},
	{"source_event_id", FILL_MESSAGE_ID, INT8OID, NULL, STMT_WRITE},
	{"private_user_id", FILL_NULL, INT8OID, NULL, 0},
	{"state", FILL_PENDING, TEXTOID, "outbox_state", 0},
	{"attempts", FILL_ZERO, INT4OID, NULL, 0},
	{"transient_failures", FILL_ZERO, INT4OID, NULL, 0},
	{"last_error", FILL_NULL, TEXTOID, NULL, 0},
	{"next_attempt_at", FILL_NOW, TIMESTAMPTZOID, NULL, 0},
	{"created_at", FILL_NOW, TIMESTAMPTZOID, NULL, 0},
	{"processed_at", FILL_NULL, TIMESTAMPTZOID, NULL, 0},
	{"trace_id", FILL_TRACE_ID, TEXTOID, NULL, STMT_TRACED},
	{NULL}
};

/*
 * im.membership_period's columns the general path's membership check reads
 * (the period probe reads the same; fill and type unused: not written);
 * muted_until only on a catalog that has it.
 */
static const DirectColumn period_columns[] = {
	{"conversation_id", FILL_NULL, INT8OID, NULL, STMT_READ},
	{"user_id", FILL_NULL, INT8OID, NULL, STMT_READ},
	{"leave_seq", FILL_NULL, INT8OID, NULL, STMT_READ},
	{"muted_until", FILL_NULL, TIMESTAMPTZOID, NULL, STMT_READ | STMT_IF_PRESENT},
	{NULL}
};

/* One table written directly: opened, its indexes open, its layout read. */
typedef struct DirectTable
{
	ResultRelInfo *rri;
	TupleTableSlot *slot;
	int			natts;
	DirectFill *fill;			/* per attribute (dropped: FILL_NULL) */
} DirectTable;

/* An index probed under the lock, opened before it. */
typedef struct DirectProbe
{
	Relation	heap;
	Relation	index;
	TupleTableSlot *slot;
	AttrNumber	null_attno;		/* the heap column that must be NULL (leave_seq) or */
	AttrNumber	notnull_attno;	/* NOT NULL (request_digest) in a matching row */
	AttrNumber	read_attno;		/* read from the row found (muted_until); 0: none */
} DirectProbe;

struct ImDirectAppend
{
	EState	   *estate;
	DirectTable event;
	DirectTable outbox;
	DirectProbe period;			/* membership_period_one_open (conversation_id, user_id) */
	DirectProbe key;			/* event_sender_id_client_msg_id_key (sender_id, client_msg_id) */
	Oid			event_seq;
	Oid			outbox_seq;
};

/*
 * A relation the direct path may read or write: a plain table without
 * rules or row security, and, if written, without an INSERT trigger of any
 * kind (im.event and im.outbox have triggers only as the referenced side of
 * foreign keys, which an insert does not fire).
 */
static bool
plain_table(Relation rel, bool written)
{
	TriggerDesc *trig = rel->trigdesc;

	if (rel->rd_rel->relkind != RELKIND_RELATION || rel->rd_rules != NULL ||
		rel->rd_rel->relrowsecurity)
		return false;
	return !written || trig == NULL ||
		!(trig->trig_insert_before_row || trig->trig_insert_after_row ||
		  trig->trig_insert_instead_row || trig->trig_insert_before_statement ||
		  trig->trig_insert_after_statement || trig->trig_insert_new_table);
}

/*
 * Whether att holds c's datum as written: c's type itself, or the im domain
 * c names when that is a domain over c's type, without a typmod either way.
 * A column of another type with the same length and by-value flag (json for
 * jsonb, varchar for text, timestamp for timestamptz) would be given bytes
 * of the wrong type; the general path's INSERT coerces instead.
 */
static bool
column_type_ok(Form_pg_attribute att, const DirectColumn *c, Oid nsp)
{
	int32		base_typmod = -1;

	if (att->atttypmod != -1)
		return false;
	if (att->atttypid == c->type)
		return true;
	return c->domain != NULL &&
		att->atttypid == GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
										 CStringGetDatum(c->domain), ObjectIdGetDatum(nsp)) &&
		getBaseTypeAndTypmod(att->atttypid, &base_typmod) == c->type && base_typmod == -1;
}

/*
 * Reads rel's layout against cols: every live column must be a known one of
 * its type, and a column filled with NULL must have no default.  False: the
 * direct path does not serve this table.
 */
static bool
read_layout(Relation rel, const DirectColumn *cols, Oid nsp, DirectTable *t)
{
	TupleDesc	desc = RelationGetDescr(rel);

	t->natts = desc->natts;
	t->fill = palloc(sizeof(DirectFill) * desc->natts);
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		const DirectColumn *c;

		t->fill[i] = FILL_NULL;
		if (att->attisdropped)
			continue;
		for (c = cols; c->name != NULL; c++)
			if (strcmp(NameStr(att->attname), c->name) == 0)
				break;
		if (c->name == NULL || !column_type_ok(att, c, nsp) ||
			((c->fill == FILL_NULL || c->fill == FILL_TRACE_ID) && att->atthasdef) || att->attgenerated)
			return false;
		t->fill[i] = c->fill;
	}
	return true;
}

/*
 * The columns of rel that cols marks with the stmt bit, as a range table
 * entry's column set; a missing one sets *ok false (the general path's
 * statement would name it and fail).
 */
static Bitmapset *
stmt_columns(Relation rel, const DirectColumn *cols, int bits, bool *ok)
{
	Bitmapset  *set = NULL;

	for (const DirectColumn *c = cols; c->name != NULL; c++)
	{
		AttrNumber	attno;

		if (!(c->stmt & bits))
			continue;
		attno = get_attnum(RelationGetRelid(rel), c->name);
		if (attno == InvalidAttrNumber && (c->stmt & STMT_IF_PRESENT))
			continue;
		if (attno == InvalidAttrNumber)
			*ok = false;
		else
			set = bms_add_member(set, attno - FirstLowInvalidHeapAttributeNumber);
	}
	return set;
}

/*
 * rel's range table entry as the general path's statements would plan it:
 * perms on the columns they read and name in their INSERT (a traced
 * request's INSERT names trace_id too), so a grant on some other column
 * does not stand in for them (with empty column sets the executor would
 * accept any column's grant).
 */
static RangeTblEntry *
table_rte(Relation rel, AclMode perms, const DirectColumn *cols, bool traced, bool *ok)
{
	RangeTblEntry *rte = makeNode(RangeTblEntry);

	rte->rtekind = RTE_RELATION;
	rte->relid = RelationGetRelid(rel);
	rte->relkind = rel->rd_rel->relkind;
	rte->rellockmode = perms == ACL_SELECT ? AccessShareLock : RowExclusiveLock;
	rte->requiredPerms = perms;
	if (perms & ACL_SELECT)
		rte->selectedCols = stmt_columns(rel, cols, STMT_READ, ok);
	if (perms & ACL_INSERT)
		rte->insertedCols = stmt_columns(rel, cols, traced ? STMT_WRITE | STMT_TRACED : STMT_WRITE, ok);
	return rte;
}

/*
 * Whether index's predicate is none or exactly the probe's own row filter
 * (attno IS [NOT] NULL, checked on every row found): either way the index
 * holds every row the probe must find.
 */
static bool
predicate_is_filter(Relation index, AttrNumber attno, NullTestType filter)
{
	List	   *pred = RelationGetIndexPredicate(index);
	NullTest   *nt;

	if (pred == NIL)
		return true;
	if (list_length(pred) != 1 || !IsA(linitial(pred), NullTest))
		return false;
	nt = linitial_node(NullTest, pred);
	return nt->nulltesttype == filter && !nt->argisrow && IsA(nt->arg, Var) &&
		((Var *) nt->arg)->varattno == attno;
}

/*
 * Whether the heap's column attno is of type and is the index's key column
 * i in the type's default btree family and the column's collation, so the
 * probe's equality scan keys mean what the general path's `=` means.
 */
/*
 * The default btree operator family of a probe column's type: the
 * built-in, pinned families of bigint and text (GetDefaultOpClass would
 * scan pg_opclass on every send).  Any other type: none, so the general
 * path decides.
 */
static Oid
probe_family(Oid type)
{
	switch (type)
	{
		case INT8OID:
			return INTEGER_BTREE_FAM_OID;
		case TEXTOID:
			return TEXT_BTREE_FAM_OID;
		default:
			return InvalidOid;
	}
}

static bool
probe_column(Relation heap, Relation index, int i, AttrNumber attno, Oid type)
{
	Form_pg_attribute att;

	if (attno == InvalidAttrNumber || index->rd_index->indkey.values[i] != attno)
		return false;
	att = TupleDescAttr(RelationGetDescr(heap), attno - 1);
	return att->atttypid == type &&
		OidIsValid(probe_family(type)) && index->rd_opfamily[i] == probe_family(type) &&
		index->rd_indcollation[i] == att->attcollation;
}

/*
 * A probe's index: the one named, on heap, a btree whose key columns are
 * the heap's a (bigint) and b (b_type), that holds every row the probe must
 * find.  It must be valid, ready and live — not one a concurrent CREATE
 * INDEX or DROP INDEX is still building or already dropping, which lacks
 * rows (a dead index takes no new entries) — without expressions, with no
 * predicate but the probe's filter (filter_attno IS [NOT] NULL, remembered
 * in p), and usable by this transaction's snapshots (indcheckxmin, as the
 * planner checks).  unique: it must also be the arbiter the general path's
 * ON CONFLICT infers and the check a raced insert meets (is_key_race):
 * unique and checked at once, not deferred.  False: the general path
 * serves the send, and its statements decide (no arbiter: 42P10).
 */
static bool
open_probe(Oid nsp, const char *index_name, Relation heap, AttrNumber a, AttrNumber b, Oid b_type,
		   AttrNumber filter_attno, NullTestType filter, bool unique, DirectProbe *p)
{
	Oid			indexid = get_relname_relid(index_name, nsp);
	Form_pg_index ix;

	if (!OidIsValid(indexid) || filter_attno == InvalidAttrNumber)
		return false;
	p->heap = heap;
	p->index = index_open(indexid, AccessShareLock);
	ix = p->index->rd_index;
	if (ix->indrelid != RelationGetRelid(heap) ||
		p->index->rd_rel->relam != BTREE_AM_OID ||
		!ix->indisvalid || !ix->indisready || !ix->indislive ||
		(unique && (!ix->indisunique || !ix->indimmediate)) ||
		(ix->indcheckxmin &&
		 !TransactionIdPrecedes(HeapTupleHeaderGetXmin(p->index->rd_indextuple->t_data),
								TransactionXmin)) ||
		IndexRelationGetNumberOfKeyAttributes(p->index) != 2 ||
		!probe_column(heap, p->index, 0, a, INT8OID) ||
		!probe_column(heap, p->index, 1, b, b_type) ||
		RelationGetIndexExpressions(p->index) != NIL ||
		!predicate_is_filter(p->index, filter_attno, filter))
		return false;
	if (filter == IS_NULL)
		p->null_attno = filter_attno;
	else
		p->notnull_attno = filter_attno;
	p->slot = table_slot_create(heap, NULL);
	return true;
}

/*
 * The period probe also reads the sender's muted_until (contract §17) from
 * the row it fetches anyway: the mute check costs no read of its own.  An
 * older catalog has no such column (no mutes); one of another type: the
 * general path decides.
 */
static bool
muted_column(Oid period_id, DirectProbe *p)
{
	AttrNumber	attno = get_attnum(period_id, "muted_until");

	p->read_attno = attno;
	return attno == InvalidAttrNumber ||
		TupleDescAttr(RelationGetDescr(p->heap), attno - 1)->atttypid == TIMESTAMPTZOID;
}

static void
close_probe(DirectProbe *p)
{
	if (p->slot)
		ExecDropSingleTupleTableSlot(p->slot);
	if (p->index)
		index_close(p->index, NoLock);
}

void
im_direct_append_end(ImDirectAppend *da)
{
	if (da == NULL)
		return;
	close_probe(&da->period);
	close_probe(&da->key);
	if (da->period.heap)
		table_close(da->period.heap, NoLock);
	if (da->event.rri)
	{
		ExecCloseIndices(da->event.rri);
		table_close(da->event.rri->ri_RelationDesc, NoLock);
	}
	if (da->outbox.rri)
	{
		ExecCloseIndices(da->outbox.rri);
		table_close(da->outbox.rri->ri_RelationDesc, NoLock);
	}
	if (da->estate)
	{
		ExecResetTupleTable(da->estate->es_tupleTable, false);
		FreeExecutorState(da->estate);
	}
	pfree(da);
}

/*
 * rel as result relation rti of estate with its indexes open and their
 * predicates prepared (ExecInsertIndexTuples would prepare them at the
 * first insert, under the lock).
 */
static void
open_table(EState *estate, Relation rel, Index rti, const DirectColumn *cols, Oid nsp,
		   DirectTable *t, bool *ok)
{
	t->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(t->rri, rel, rti, NULL, 0);
	ExecOpenIndices(t->rri, false);
	for (int i = 0; i < t->rri->ri_NumIndices; i++)
	{
		IndexInfo  *info = t->rri->ri_IndexRelationInfo[i];

		if (info->ii_Predicate != NIL && info->ii_PredicateState == NULL)
			info->ii_PredicateState = ExecPrepareQual(info->ii_Predicate, estate);
	}
	t->slot = table_slot_create(rel, &estate->es_tupleTable);
	if (!plain_table(rel, true) || !read_layout(rel, cols, nsp, t))
		*ok = false;
}

ImDirectAppend *
im_direct_append_begin(bool traced)
{
	ImDirectAppend *da = palloc0(sizeof(ImDirectAppend));
	Oid			nsp = get_namespace_oid("im", false);
	Oid			event_id = get_relname_relid("event", nsp);
	Oid			outbox_id = get_relname_relid("outbox", nsp);
	Oid			period_id = get_relname_relid("membership_period", nsp);
	Oid			conversation_id = get_relname_relid("conversation", nsp);
	Relation	event;
	Relation	outbox;
	bool		ok = OidIsValid(event_id) && OidIsValid(outbox_id) && OidIsValid(period_id) &&
		OidIsValid(conversation_id);

	da->event_seq = get_relname_relid("event_id_seq", nsp);
	da->outbox_seq = get_relname_relid("outbox_id_seq", nsp);
	if (!ok || !OidIsValid(da->event_seq) || !OidIsValid(da->outbox_seq))
	{
		pfree(da);
		return NULL;
	}

	/*
	 * The relation locks in the order a statement under the conversation
	 * lock took them (conversation first), so DDL that locks the tables in
	 * that order meets no new deadlock.
	 */
	LockRelationOid(conversation_id, RowExclusiveLock);
	event = table_open(event_id, RowExclusiveLock);
	outbox = table_open(outbox_id, RowExclusiveLock);
	da->period.heap = table_open(period_id, AccessShareLock);

	/*
	 * The privileges the general path's statements would need, checked as
	 * the executor checks theirs (the API runs as the extension's owner,
	 * SECURITY DEFINER).  Short of them the general path runs, and its
	 * statements raise the error they raise.
	 */
	da->estate = CreateExecutorState();
	ExecInitRangeTable(da->estate,
					   list_make3(table_rte(event, ACL_INSERT | ACL_SELECT, event_columns, traced, &ok),
								  table_rte(outbox, ACL_INSERT, outbox_columns, traced, &ok),
								  table_rte(da->period.heap, ACL_SELECT, period_columns, false, &ok)));
	ok = ok && ExecCheckRTPerms(da->estate->es_range_table, false);

	open_table(da->estate, event, 1, event_columns, nsp, &da->event, &ok);
	open_table(da->estate, outbox, 2, outbox_columns, nsp, &da->outbox, &ok);
	ok = ok && plain_table(da->period.heap, false) &&
		open_probe(nsp, "membership_period_one_open", da->period.heap,
				   get_attnum(period_id, "conversation_id"),
				   get_attnum(period_id, "user_id"), INT8OID,
				   get_attnum(period_id, "leave_seq"), IS_NULL, false, &da->period) &&
		muted_column(period_id, &da->period) &&
		open_probe(nsp, KEY_INDEX_NAME, event,
				   get_attnum(event_id, "sender_id"),
				   get_attnum(event_id, "client_msg_id"), TEXTOID,
				   get_attnum(event_id, "request_digest"), IS_NOT_NULL, true, &da->key);
	if (!ok)
	{
		im_direct_append_end(da);
		return NULL;
	}
	return da;
}

/*
 * Whether the probe's index holds a row visible to snap with keys (a, b)
 * whose null_attno is NULL and notnull_attno is not (the index predicates,
 * checked on the row too: an older catalog's key index has none).  read:
 * the found row's read_attno (a by-value column), NULL when the probe has
 * none.
 */
static bool
probe_finds(DirectProbe *p, Snapshot snap, Datum a, Datum b, RegProcedure b_eq,
			Datum *read, bool *read_null)
{
	ScanKeyData keys[2];
	IndexScanDesc scan;
	bool		found = false;

	ScanKeyEntryInitialize(&keys[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   p->index->rd_indcollation[0], F_INT8EQ, a);
	ScanKeyEntryInitialize(&keys[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   p->index->rd_indcollation[1], b_eq, b);
	scan = index_beginscan(p->heap, p->index, snap, 2, 0);
	index_rescan(scan, keys, 2, NULL, 0);
	while (!found && index_getnext_slot(scan, ForwardScanDirection, p->slot))
	{
		bool		isnull;

		if (p->null_attno != InvalidAttrNumber)
		{
			(void) slot_getattr(p->slot, p->null_attno, &isnull);
			if (!isnull)
				continue;
		}
		if (p->notnull_attno != InvalidAttrNumber)
		{
			(void) slot_getattr(p->slot, p->notnull_attno, &isnull);
			if (isnull)
				continue;
		}
		found = true;
		if (read != NULL)
		{
			*read_null = true;
			if (p->read_attno != InvalidAttrNumber)
				*read = slot_getattr(p->slot, p->read_attno, read_null);
		}
	}
	index_endscan(scan);
	ExecClearTuple(p->slot);
	return found;
}

/* The row of t for ev at conv's next position. */
static void
fill_row(DirectTable *t, const ImConversation *conv, const ImNewEvent *ev,
		 int64 message_id, int64 outbox_id)
{
	TupleTableSlot *slot = t->slot;

	ExecClearTuple(slot);
	for (int i = 0; i < t->natts; i++)
	{
		Datum		v = (Datum) 0;
		bool		isnull = false;

		switch (t->fill[i])
		{
			case FILL_NULL:
				isnull = true;
				break;
			case FILL_MESSAGE_ID:
				v = Int64GetDatum(message_id);
				break;
			case FILL_OUTBOX_ID:
				v = Int64GetDatum(outbox_id);
				break;
			case FILL_CONVERSATION_ID:
				v = Int64GetDatum(conv->conversation_id);
				break;
			case FILL_MSG_SEQ:
				v = Int64GetDatum(conv->head_msg_seq + 1);
				break;
			case FILL_KIND:
				v = CStringGetTextDatum(ev->kind);
				break;
			case FILL_SENDER_ID:
				v = Int64GetDatum(ev->sender_id);
				break;
			case FILL_CLIENT_MSG_ID:
				v = CStringGetTextDatum(ev->client_msg_id);
				break;
			case FILL_REQUEST_DIGEST:
				v = PointerGetDatum(ev->request_digest);
				break;
			case FILL_CONTENT_TYPE:
				v = CStringGetTextDatum(ev->content_type);
				break;
			case FILL_BODY:
				v = ev->body;
				break;
			case FILL_MODE:
				v = CStringGetTextDatum(conv->mode);
				break;
			case FILL_FALSE:
				v = BoolGetDatum(false);
				break;
			case FILL_ZERO:
				v = Int32GetDatum(0);
				break;
			case FILL_NOW:
				v = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
				break;
			case FILL_PENDING:
				v = CStringGetTextDatum("pending");
				break;
			case FILL_TRACE_ID:
				if (ev->trace_id != NULL)
					v = CStringGetTextDatum(ev->trace_id);
				else
					isnull = true;
				break;
		}
		slot->tts_values[i] = v;
		slot->tts_isnull[i] = isnull;
	}
	ExecStoreVirtualTuple(slot);
}

/*
 * The raced key (module comment): the unique index raised 23505 after the
 * other request committed; the contract's answer is IS409.
 */
static bool
is_key_race(const ErrorData *edata)
{
	return edata->sqlerrcode == ERRCODE_UNIQUE_VIOLATION && edata->constraint_name != NULL &&
		strcmp(edata->constraint_name, KEY_INDEX_NAME) == 0;
}

static void
insert_event(ImDirectAppend *da, const ImNewEvent *ev)
{
	MemoryContext caller = CurrentMemoryContext;

	PG_TRY();
	{
		ExecSimpleRelationInsert(da->event.rri, da->estate, da->event.slot);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(caller);
		if (!is_key_race(CopyErrorData()))
			PG_RE_THROW();
		/* replaced by another ERROR: the transaction aborts as it would have */
		FlushErrorState();
		ereport(ERROR,
				(errcode(ERRCODE_IM_CONFLICT),
				 errmsg(IM_KEY_REUSED_ERRMSG,
						ev->client_msg_id, ev->sender_id),
				 errdetail("A concurrent request with the same key in another conversation committed first."),
				 errhint(IM_KEY_REUSED_ERRHINT)));
	}
	PG_END_TRY();
}

bool
im_append_member_message(ImDirectAppend *da, ImConversation *conv, const ImNewEvent *ev,
						 int64 *message_id, int64 *msg_seq)
{
	Snapshot	snap;
	bool		member;
	bool		key_taken;
	Datum		muted_until = (Datum) 0;
	bool		unmuted = true;
	int64		id;

	Assert(strcmp(ev->kind, "message") == 0 && ev->target_message_id == 0 &&
		   ev->sender_id != 0 && ev->client_msg_id != NULL);

	/* a statement's start: earlier writes visible, a snapshot after the lock */
	CommandCounterIncrement();
	da->estate->es_output_cid = GetCurrentCommandId(true);
	snap = RegisterSnapshot(GetTransactionSnapshot());
	PushActiveSnapshot(snap);
	member = probe_finds(&da->period, snap, Int64GetDatum(conv->conversation_id),
						 Int64GetDatum(ev->sender_id), F_INT8EQ, &muted_until, &unmuted);
	/* a muted sender: the general path raises IS403 (contract §17) */
	member = member && (unmuted || DatumGetTimestampTz(muted_until) <= GetCurrentTransactionStartTimestamp());
	key_taken = member &&
		probe_finds(&da->key, snap, Int64GetDatum(ev->sender_id),
					CStringGetTextDatum(ev->client_msg_id), F_TEXTEQ, NULL, NULL);
	if (!member || key_taken)
	{
		PopActiveSnapshot();
		UnregisterSnapshot(snap);
		im_give_back_position(conv);
		return false;
	}

	/* the id carries the conversation's bucket (shard_map.h) */
	id = im_shard_placed_id(nextval_internal(da->event_seq, true), conv->conversation_id);
	fill_row(&da->event, conv, ev, id, 0);
	insert_event(da, ev);
	fill_row(&da->outbox, conv, ev, id, nextval_internal(da->outbox_seq, true));
	ExecSimpleRelationInsert(da->outbox.rri, da->estate, da->outbox.slot);
	PopActiveSnapshot();
	UnregisterSnapshot(snap);

	*message_id = id;
	conv->head_msg_seq++;
	im_wake_fanout_at_commit();
	*msg_seq = conv->head_msg_seq;
	return true;
}
