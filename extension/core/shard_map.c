/*
 * shard_map.c — the node's shard map: im.shard_configure,
 * im.shard_self, and the placement questions the rest of the code asks.
 *
 * Invariants protected here:
 *   - a node holds the user side only of its own users: user heads (and so
 *     logs, states, devices, …) are created only for users whose bucket it
 *     owns (im_lock_user_heads filters through im_shard_keep_local_users),
 *     so local fanout, which joins im.user_head, delivers to local users
 *     only and the remote ones go through transfers;
 *   - a write reaching a node that does not own its routing key fails with
 *     IS421 and changes nothing (the map is wrong; data is never accepted
 *     silently on the wrong node), and a copy of a remote conversation is
 *     never written to as if it were authoritative;
 *   - no configuration (or a pre-1.5 catalog) = the single-node im_sync:
 *     id factor 1, every check passes.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/shard_map.h"
#include "core/version_check.h"
#include "core/im_sql.h"

#include "access/heapam.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "common/int.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

typedef struct ShardCache
{
	LocalTransactionId read_in;
	bool		configured;
	char		self[64];
	char		nodes[IM_SHARD_BUCKETS][64];
	/* the im.shard_config row version the map was parsed from */
	Oid			relid;
	ItemPointerData tid;
	TransactionId xmin;
} ShardCache;

static ShardCache cache = {InvalidLocalTransactionId};

/* The map from im.shard_config's one row (its CHECKs: 64 entries, none NULL). */
static void
parse_shard_config(Relation rel, HeapTuple tuple)
{
	TupleDesc	desc = RelationGetDescr(rel);
	bool		isnull;
	Datum		self = heap_getattr(tuple, SPI_fnumber(desc, "self_name"), desc, &isnull);
	Datum		nodes = isnull ? (Datum) 0 :
		heap_getattr(tuple, SPI_fnumber(desc, "bucket_nodes"), desc, &isnull);
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	if (isnull)
		return;
	deconstruct_array(DatumGetArrayTypeP(nodes), TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &n);
	if (n != IM_SHARD_BUCKETS)
		return;
	for (int b = 0; b < IM_SHARD_BUCKETS; b++)
	{
		if (nulls[b])
			return;
		text_to_cstring_buffer(DatumGetTextPP(elems[b]), cache.nodes[b], sizeof(cache.nodes[b]));
	}
	text_to_cstring_buffer(DatumGetTextPP(self), cache.self, sizeof(cache.self));
	cache.configured = true;
}

/*
 * Read im.shard_config once per transaction (a direct scan of its
 * one row, not an SPI query, which cost every send about 5 % of its backend
 * time; the map is parsed again only when the row version changed).  The
 * snapshot is the one an SPI query would take: a new one in READ COMMITTED,
 * after this command's own writes (im.shard_configure).  A version is its
 * (ctid, xmin): a row updated or replaced is a new version.
 */
static const ShardCache *
shard_cache(void)
{
	Oid			nsp;
	Oid			relid;
	Relation	rel;
	Snapshot	snapshot;
	TableScanDesc scan;
	HeapTuple	tuple;

	if (cache.read_in != InvalidLocalTransactionId && cache.read_in == MyProc->lxid)
		return &cache;
	nsp = im_catalog_at_least(1, 5) ? get_namespace_oid("im", true) : InvalidOid;
	relid = OidIsValid(nsp) ? get_relname_relid("shard_config", nsp) : InvalidOid;
	if (!OidIsValid(relid))
	{
		cache.configured = false;
		cache.relid = InvalidOid;
		cache.read_in = MyProc->lxid;
		return &cache;
	}
	rel = table_open(relid, AccessShareLock);
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	scan = table_beginscan(rel, snapshot, 0, NULL);
	tuple = heap_getnext(scan, ForwardScanDirection);
	if (tuple == NULL)
	{
		cache.configured = false;
		cache.relid = InvalidOid;
	}
	else if (cache.relid != relid || !ItemPointerEquals(&cache.tid, &tuple->t_self) ||
			 cache.xmin != HeapTupleHeaderGetRawXmin(tuple->t_data))
	{
		cache.configured = false;
		cache.relid = InvalidOid;	/* until parsed whole */
		parse_shard_config(rel, tuple);
		cache.relid = relid;
		cache.tid = tuple->t_self;
		cache.xmin = HeapTupleHeaderGetRawXmin(tuple->t_data);
	}
	table_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, NoLock);	/* held to the end of the transaction, as by a query */
	cache.read_in = MyProc->lxid;
	return &cache;
}

bool
im_shard_configured(void)
{
	return shard_cache()->configured;
}

const char *
im_shard_self_name(void)
{
	const ShardCache *c = shard_cache();

	return c->configured ? c->self : NULL;
}

int64
im_shard_id_factor(void)
{
	return im_shard_configured() ? IM_SHARD_BUCKETS : 1;
}

int64
im_shard_placed_id(int64 seq_value, int64 key)
{
	int64		factor = im_shard_id_factor();
	int64		id;

	if (pg_mul_s64_overflow(seq_value, factor, &id) ||
		pg_add_s64_overflow(id, key % factor, &id))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("bigint out of range")));
	return id;
}

int64
im_shard_nextval(const char *seq_name)
{
	Oid			seq = get_relname_relid(seq_name, get_namespace_oid("im", false));

	if (!OidIsValid(seq))
		elog(ERROR, "im_sync: sequence im.%s is missing", seq_name);
	/* nextval's own checks: USAGE or UPDATE on the sequence */
	return nextval_internal(seq, true);
}

int64
im_shard_next_placed_id(const char *seq_name, int64 key)
{
	return im_shard_placed_id(im_shard_nextval(seq_name), key);
}

int
im_shard_round_robin_bucket(int64 seq_value)
{
	const ShardCache *c = shard_cache();
	int			owned[IM_SHARD_BUCKETS];
	int			n = 0;

	if (!c->configured)
		return 0;
	for (int b = 0; b < IM_SHARD_BUCKETS; b++)
		if (strcmp(c->nodes[b], c->self) == 0)
			owned[n++] = b;
	/* configured: self owns a bucket (im.shard_configure) */
	return n == 0 ? 0 : owned[seq_value % n];
}

bool
im_shard_owns_bucket(int bucket)
{
	const ShardCache *c = shard_cache();

	return !c->configured || strcmp(c->nodes[bucket], c->self) == 0;
}

const char *
im_shard_node_of_bucket(int bucket)
{
	const ShardCache *c = shard_cache();

	return c->configured ? c->nodes[bucket] : NULL;
}

static void
wrong_node(const char *what, int64 id)
{
	int			b = im_shard_bucket(id);

	ereport(ERROR,
			(errcode(ERRCODE_IM_WRONG_NODE),
			 errmsg("%s " INT64_FORMAT " (bucket %d) is placed on node \"%s\", not on this node \"%s\"",
					what, id, b, im_shard_node_of_bucket(b), im_shard_self_name()),
			 errhint("The router's node map differs from this node's im.shard_configure map.")));
}

void
im_shard_require_conversation(int64 conversation_id)
{
	if (!im_shard_owns_bucket(im_shard_bucket(conversation_id)))
		wrong_node("conversation", conversation_id);
}

void
im_shard_require_user(int64 user_id)
{
	if (!im_shard_owns_bucket(im_shard_bucket(user_id)))
		wrong_node("user", user_id);
}

int
im_shard_keep_local_users(int64 *user_ids, int n)
{
	int			k = 0;

	if (!im_shard_configured())
		return n;
	for (int i = 0; i < n; i++)
		if (im_shard_owns_bucket(im_shard_bucket(user_ids[i])))
			user_ids[k++] = user_ids[i];
	return k;
}

/*
 * im.shard_configure(self_name, bucket_nodes) -> void.  Stores the map
 * (idempotent: the same map again changes nothing).  Every node of the
 * installation gets the same map; self_name must own at least one bucket.
 */
PG_FUNCTION_INFO_V1(im_shard_configure);
Datum
im_shard_configure(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	char	   *self = im_arg_text(fcinfo, 0, "self_name", 41);
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	bool		owns = false;
	Datum		args[2];

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("bucket_nodes must not be NULL")));
	arr = PG_GETARG_ARRAYTYPE_P(1);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("bucket_nodes must be a one-dimensional array")));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	if (n != IM_SHARD_BUCKETS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("bucket_nodes must have %d entries, got %d", IM_SHARD_BUCKETS, n)));
	for (int i = 0; i < n; i++)
	{
		char	   *node;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("bucket_nodes[%d] (bucket %d) is NULL", i + 1, i)));
		node = TextDatumGetCString(elems[i]);
		if (strcmp(node, self) == 0)
			owns = true;
	}
	if (!owns)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("node \"%s\" owns no bucket of bucket_nodes", self)));

	im_spi_connect();
	/* the CHECKs of im.shard_config answer bad names with 23514 */
	im_prepare(&plan,
			   "INSERT INTO im.shard_config (self_name, bucket_nodes) VALUES ($1, $2) "
			   "ON CONFLICT (singleton) DO UPDATE SET self_name = EXCLUDED.self_name,"
			   "  bucket_nodes = EXCLUDED.bucket_nodes, configured_at = pg_catalog.now() "
			   "WHERE (im.shard_config.self_name, im.shard_config.bucket_nodes)"
			   "  IS DISTINCT FROM (EXCLUDED.self_name, EXCLUDED.bucket_nodes)",
			   2, TEXTOID, TEXTARRAYOID);
	args[0] = CStringGetTextDatum(self);
	args[1] = PointerGetDatum(arr);
	im_exec(plan, args, NULL, 0);
	SPI_finish();
	cache.read_in = InvalidLocalTransactionId;
	PG_RETURN_VOID();
}

/* im.shard_self() -> text, NULL when not sharded */
PG_FUNCTION_INFO_V1(im_shard_self);
Datum
im_shard_self(PG_FUNCTION_ARGS)
{
	const char *self = im_shard_self_name();

	if (self == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(self));
}

/*
 * A transfer id is its node's WAL timeline in the bits from 40 up, then
 * im.transfer_id_seq.  Destinations drop a transfer whose (source, id) they
 * already recorded, so an id must never name two items.  A promoted
 * standby's sequence can stand behind ids the old primary used in fanout
 * transactions the standby never received but a destination had already
 * decoded (PostgreSQL 15 logical senders do not wait for the synchronous
 * standby); after promotion the node writes on a new timeline, so its ids
 * can never equal one the old primary sent (drill standby_check: the
 * failed-over node's transfers carry two timelines).  2^40 transfers per
 * timeline.
 */
int64
im_shard_transfer_id_base(void)
{
	TimeLineID	tli = GetWALInsertionTimeLine();

	if (tli >= (1U << 22))
		elog(ERROR, "im_sync: WAL timeline %u does not fit a transfer id", tli);
	return (int64) tli << 40;
}
