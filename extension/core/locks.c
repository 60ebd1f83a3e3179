/*
 * locks.c — the row locks of the lock order (contract §4; the order is in
 * core/locks.h and extension/doc/architecture.md, "Lock order"): the
 * conversation row, device rows, user heads.  Every writer takes them
 * through these functions, so placement is checked here, before anything is
 * locked: a node locks only rows it owns (core/shard_map.c).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/shard_map.h"
#include "core/im_sql.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

/* ---- the conversation row -------------------------------------------- */

static void
conversation_not_found(int64 conversation_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_NO_DATA_FOUND),
			 errmsg("conversation " INT64_FORMAT " does not exist", conversation_id)));
}

/* conv from row 0 of the last SPI result: kind, mode, head_msg_seq. */
static void
conversation_from_row(int64 conversation_id, ImConversation *conv)
{
	conv->conversation_id = conversation_id;
	strlcpy(conv->kind, im_get_text(0, 1), sizeof(conv->kind));
	strlcpy(conv->mode, im_get_text(0, 2), sizeof(conv->mode));
	conv->head_msg_seq = im_get_int64(0, 3, NULL);
}

void
im_require_conversation(int64 conversation_id, ImConversation *conv)
{
	static SPIPlanPtr plan;
	Datum		args[1];

	im_prepare(&plan,
			   "SELECT kind, mode, head_msg_seq FROM im.conversation "
			   "WHERE conversation_id" EQ "$1",
			   1, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	if (im_exec(plan, args, NULL, 1) != 1)
		conversation_not_found(conversation_id);
	if (conv != NULL)
		conversation_from_row(conversation_id, conv);
}

void
im_lock_conversation(int64 conversation_id, ImConversation *conv)
{
	if (!im_try_lock_conversation(conversation_id, conv))
		conversation_not_found(conversation_id);
}

bool
im_lock_conversation_with(SPIPlanPtr *plan, const char *sql, int64 conversation_id,
						  ImConversation *conv)
{
	Datum		args[1];

	/* a copy of a remote conversation is never written to */
	im_shard_require_conversation(conversation_id);
	im_prepare(plan, sql, 1, INT8OID);
	args[0] = Int64GetDatum(conversation_id);
	if (im_exec(*plan, args, NULL, 0) != 1)
		return false;
	conversation_from_row(conversation_id, conv);
	return true;
}

bool
im_try_lock_conversation(int64 conversation_id, ImConversation *conv)
{
	static SPIPlanPtr plan;

	return im_lock_conversation_with(&plan,
									 "SELECT kind, mode, head_msg_seq FROM im.conversation "
									 "WHERE conversation_id" EQ "$1 FOR NO KEY UPDATE",
									 conversation_id, conv);
}

/* ---- device rows ------------------------------------------------------ */

/* Result columns of the device lock. */
enum
{
	Anum_device_lock_state = 1,
	Anum_device_lock_sync_generation,
	Anum_device_lock_acked_sync_seq,
	Anum_device_lock_issued_sync_seq,
	Anum_device_lock_connection_epoch,
	Anum_device_lock_registration
};

static void
device_args(Datum *args, int64 user_id, const char *device_id)
{
	args[0] = Int64GetDatum(user_id);
	args[1] = CStringGetTextDatum(device_id);
}

/* Row 0 of the last SPI result is the device's columns (Anum_device_lock_*). */
static void
device_from_spi(int64 user_id, const char *device_id, ImDevice *dev)
{
	if (SPI_processed != 1)
	{
		im_shard_require_user(user_id);	/* IS421 when the user lives elsewhere */
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("device \"%s\" of user " INT64_FORMAT " is not registered",
						device_id, user_id)));
	}
	dev->user_id = user_id;
	strlcpy(dev->device_id, device_id, sizeof(dev->device_id));
	strlcpy(dev->state, im_get_text(0, Anum_device_lock_state), sizeof(dev->state));
	dev->sync_generation = im_get_int32(0, Anum_device_lock_sync_generation, NULL);
	dev->acked_sync_seq = im_get_int64(0, Anum_device_lock_acked_sync_seq, NULL);
	dev->issued_sync_seq = im_get_int64(0, Anum_device_lock_issued_sync_seq, NULL);
	dev->connection_epoch = im_get_int64(0, Anum_device_lock_connection_epoch, NULL);
	dev->registration = im_get_int32(0, Anum_device_lock_registration, NULL);
}

#define DEVICE_COLUMNS_SQL \
	"SELECT state, sync_generation, acked_sync_seq, issued_sync_seq, " \
	"       connection_epoch, registration " \
	"FROM im.device WHERE user_id" EQ "$1 AND device_id" EQ "$2"

void
im_lock_device(int64 user_id, const char *device_id, ImDevice *dev)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan, DEVICE_COLUMNS_SQL " FOR UPDATE", 2, INT8OID, TEXTOID);
	device_args(args, user_id, device_id);
	im_exec(plan, args, NULL, 0);
	device_from_spi(user_id, device_id, dev);
}

void
im_read_device(int64 user_id, const char *device_id, ImDevice *dev)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan, DEVICE_COLUMNS_SQL, 2, INT8OID, TEXTOID);
	device_args(args, user_id, device_id);
	im_exec(plan, args, NULL, 0);
	device_from_spi(user_id, device_id, dev);
}

/* ---- user heads ------------------------------------------------------- */

void
im_lock_user_heads(int64 *user_ids, int n)
{
	static SPIPlanPtr ins;
	static SPIPlanPtr lock;
	Datum		args[1];

	/* a node holds heads of its own users only (shard_map.c) */
	n = im_shard_keep_local_users(user_ids, n);
	if (n <= 0)
		return;
	n = im_sort_unique_int64(user_ids, n);
	args[0] = im_int8_array(user_ids, n);
	im_prepare(&lock,
			   "SELECT user_id FROM im.user_head "
			   "WHERE user_id" EQ "ANY ($1::pg_catalog.int8[]) "
			   "ORDER BY user_id FOR UPDATE",
			   1, INT8ARRAYOID);
	/* Heads normally exist (create, join and register make them). */
	if (im_exec(lock, args, NULL, 0) == (uint64) n)
		return;

	/* Sorted inserts, so two creators of the same heads cannot deadlock. */
	im_prepare(&ins,
			   "INSERT INTO im.user_head (user_id) "
			   "SELECT u FROM pg_catalog.unnest($1::pg_catalog.int8[]) u ORDER BY u "
			   "ON CONFLICT (user_id) DO NOTHING",
			   1, INT8ARRAYOID);
	im_exec(ins, args, NULL, 0);
	im_exec(lock, args, NULL, 0);
}
