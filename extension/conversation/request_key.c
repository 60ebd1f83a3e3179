/*
 * request_key.c — the idempotency key of every request that appends a
 * position (send, recall, edit, react, pin; a takedown's key is the
 * moderator's, takedown.c): its digest and the lookup of
 * an earlier request under the same (sender_id, client_msg_id).
 *
 * One file below send.c and message_relations.c, so every kind shares one
 * client_msg_id namespace and one digest rule (contract §1/§3, §14), and
 * neither of them calls the other for it.
 *
 * Invariants protected here:
 *   - one (sender_id, client_msg_id) answers one request only: a retry of
 *     the same request gets the original's ids, any other request IS409.
 *     The key covers the events carrying a request digest — every event
 *     this node accepted; a sharded node's copies of remote conversations
 *     carry none (transfer_in.c), so they never answer or block a request;
 *   - a retry is confirmed only once the original is as durable as a new
 *     request would be (an xid, so its commit waits for the standby).
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "conversation/conversation.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "utils/builtins.h"

static void
append_field(pg_cryptohash_ctx *ctx, const char *s)
{
	char		lenbuf[32];

	/* Length-prefixed, so no two different requests hash the same input. */
	if (s == NULL)
		snprintf(lenbuf, sizeof(lenbuf), "-1:");
	else
		snprintf(lenbuf, sizeof(lenbuf), "%zu:", strlen(s));
	if (pg_cryptohash_update(ctx, (const uint8 *) lenbuf, strlen(lenbuf)) < 0 ||
		(s != NULL && pg_cryptohash_update(ctx, (const uint8 *) s, strlen(s)) < 0))
		elog(ERROR, "im_sync: sha256 update failed");
}

bytea *
im_request_digest(const char *kind, int64 conversation_id, int64 target_message_id,
				  const char *content_type, const char *body_text,
				  int64 reply_to_message_id)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);
	char		num[64];
	bytea	   *d = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);

	if (ctx == NULL || pg_cryptohash_init(ctx) < 0)
		elog(ERROR, "im_sync: sha256 init failed");
	append_field(ctx, kind);
	snprintf(num, sizeof(num), INT64_FORMAT, conversation_id);
	append_field(ctx, num);
	snprintf(num, sizeof(num), INT64_FORMAT, target_message_id);
	append_field(ctx, num);
	append_field(ctx, content_type);
	append_field(ctx, body_text);
	/* only a reply hashes its target, so digests of earlier sends stay valid */
	if (reply_to_message_id != 0)
	{
		snprintf(num, sizeof(num), "reply:" INT64_FORMAT, reply_to_message_id);
		append_field(ctx, num);
	}
	if (pg_cryptohash_final(ctx, (uint8 *) VARDATA(d), PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "im_sync: sha256 final failed");
	pg_cryptohash_free(ctx);
	SET_VARSIZE(d, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	return d;
}

/*
 * A retry is confirmed only once the original is as durable as a new
 * request would be.  The original's commit may have been cut short in its
 * wait for a synchronous standby (then the gateway answered UNAVAILABLE); a
 * retry that wrote nothing would commit without a commit record and so
 * without waiting, and could confirm a message a failover then loses.  An
 * xid gives this transaction a commit record after the original's, and its
 * wait covers both (extension/doc/operations.md, "Running with a standby";
 * isolation spec retry_waits_for_standby).
 */
void
im_request_retry_durable(void)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot confirm a retried request on a standby"),
				 errhint("Connect to the primary (target_session_attrs=read-write).")));
	(void) GetTopTransactionId();
}

bool
im_request_digest_matches(uint64 row, int col, const bytea *digest)
{
	bool		isnull;
	Datum		stored = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, &isnull);

	return !isnull && VARSIZE_ANY_EXHDR(DatumGetByteaPP(stored)) == PG_SHA256_DIGEST_LENGTH &&
		memcmp(VARDATA_ANY(DatumGetByteaPP(stored)), VARDATA(digest), PG_SHA256_DIGEST_LENGTH) == 0;
}

/* Result columns of the idempotency lookup. */
enum
{
	Anum_existing_message_id = 1,
	Anum_existing_msg_seq,
	Anum_existing_request_digest,
	Anum_existing_kind,
	Anum_existing_conversation_id
};

bool
im_request_existing(int64 sender_id, const char *client_msg_id, const bytea *digest,
					int64 *message_id, int64 *msg_seq)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "SELECT message_id, msg_seq, request_digest, kind, conversation_id FROM im.event "
			   "WHERE sender_id" EQ "$1 AND client_msg_id" EQ "$2 AND request_digest IS NOT NULL",
			   2, INT8OID, TEXTOID);
	args[0] = Int64GetDatum(sender_id);
	args[1] = CStringGetTextDatum(client_msg_id);
	if (im_exec(plan, args, NULL, 0) == 0)
		return false;
	*message_id = im_get_int64(0, Anum_existing_message_id, NULL);
	*msg_seq = im_get_int64(0, Anum_existing_msg_seq, NULL);
	if (!im_request_digest_matches(0, Anum_existing_request_digest, digest))
		ereport(ERROR,
				(errcode(ERRCODE_IM_CONFLICT),
				 errmsg(IM_KEY_REUSED_ERRMSG,
						client_msg_id, sender_id),
				 errdetail("The key was first used for message " INT64_FORMAT " (kind %s) in conversation " INT64_FORMAT ".",
						   *message_id, im_get_text(0, Anum_existing_kind),
						   im_get_int64(0, Anum_existing_conversation_id, NULL)),
				 errhint(IM_KEY_REUSED_ERRHINT)));

	im_request_retry_durable();
	return true;
}

bool
im_request_lookup(const char *kind, int64 sender_id, int64 conversation_id,
				  const char *client_msg_id, int64 target_message_id,
				  const char *detail, const char *body_text,
				  bytea **digest, int64 *message_id, int64 *msg_seq)
{
	*digest = im_request_digest(kind, conversation_id, target_message_id, detail, body_text, 0);
	return im_request_existing(sender_id, client_msg_id, *digest, message_id, msg_seq);
}
