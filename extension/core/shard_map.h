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

/* true when the bucket is this node's (always true when not sharded) */
extern bool im_shard_owns_bucket(int bucket);

/* the node owning a bucket, NULL when not sharded */
extern const char *im_shard_node_of_bucket(int bucket);

/* IS421 unless this node owns the conversation's / the user's bucket */
extern void im_shard_require_conversation(int64 conversation_id);
extern void im_shard_require_user(int64 user_id);

/* keeps the users placed on this node, in order; returns the new count */
extern int	im_shard_keep_local_users(int64 *user_ids, int n);

/* int4[] of the buckets this node owns ('{}' when not sharded) */
extern Datum im_shard_owned_buckets(void);

#endif
