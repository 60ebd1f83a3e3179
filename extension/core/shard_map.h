/*
 * shard_map.h — placement: which node owns which of the 64
 * virtual buckets, and the ids that carry their bucket.
 *
 * bucket(user_id) = user_id % 64; conversation, event (message) and push
 * job ids carry their bucket in the low 6 bits on a configured node
 * (id = nextval * 64 + bucket).  An unconfigured node (or a pre-1.5
 * catalog) is the single-node im_sync: factor 1, every id as before.
 */
#ifndef IM_SHARD_MAP_H
#define IM_SHARD_MAP_H

#include "postgres.h"

#define IM_SHARD_BUCKETS 64

/* the node's map does not place this key here (the router's map is wrong) */
#define ERRCODE_IM_WRONG_NODE MAKE_SQLSTATE('I', 'S', '4', '2', '1')

#define im_shard_bucket(id) ((int) ((id) % IM_SHARD_BUCKETS))

/* true on a node with a shard configuration (read once per transaction) */
extern bool im_shard_configured(void);

/* this node's name, NULL when not sharded */
extern const char *im_shard_self_name(void);

/* the id multiplier of new ids: 64 when sharded, 1 otherwise */
extern int64 im_shard_id_factor(void);

/*
 * The id formula, spelled only here: the id of a new row placed with key's
 * bucket is seq_value * im_shard_id_factor() + key % im_shard_id_factor()
 * (seq_value itself when not sharded).  Overflow raises "bigint out of
 * range" (22003) as bigint arithmetic in SQL does.  Statements that insert
 * a row with such an id take it as a parameter made here (message and
 * private event ids, conversation and period ids); only push jobs, one per
 * selected target inside one statement, use IM_PLACED_ID_SQL below.
 */
extern int64 im_shard_placed_id(int64 seq_value, int64 key);

/* nextval of sequence im.<seq_name>, and im_shard_placed_id of it */
extern int64 im_shard_nextval(const char *seq_name);
extern int64 im_shard_next_placed_id(const char *seq_name, int64 key);

/*
 * A group conversation's bucket: this node's owned buckets taken round
 * robin by seq_value (0 when not sharded), the key of its id.
 */
extern int	im_shard_round_robin_bucket(int64 seq_value);

/*
 * The same formula in SQL for a statement that makes one id per row it
 * selects: next and key are SQL expressions, factor the parameter holding
 * im_shard_id_factor().
 */
#define IM_PLACED_ID_SQL(next, key, factor) \
	"((" next ")" OP_TIMES factor ")" PLUS "((" key ")" OP_MOD factor ")"

/* true when the bucket is this node's (always true when not sharded) */
/*
 * The high bits of every transfer id this node writes now (its WAL
 * timeline; the low 40 bits are im.transfer_id_seq): shard/transfer_out.c's
 * transfers and user/receipt.c's carried receipts.
 */
extern int64 im_shard_transfer_id_base(void);

extern bool im_shard_owns_bucket(int bucket);

/* the node owning a bucket, NULL when not sharded */
extern const char *im_shard_node_of_bucket(int bucket);

/* IS421 unless this node owns the conversation's / the user's bucket */
extern void im_shard_require_conversation(int64 conversation_id);
extern void im_shard_require_user(int64 user_id);

/* keeps the users placed on this node, in order; returns the new count */
extern int	im_shard_keep_local_users(int64 *user_ids, int n);

#endif
