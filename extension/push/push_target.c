/*
 * push_target.c — push targets (contract §13): one per device, a token
 * moving between devices, removed with the device's revocation.
 *
 * Invariants protected here:
 *   - one target per device (UNIQUE (user_id, device_id)): a new
 *     registration replaces the old one, and its rejection count and
 *     disabled state start afresh;
 *   - one device per token (UNIQUE (provider, app_id, token_digest)): the
 *     same token registered on another device moves there, its old target
 *     and that target's jobs go; registrations of one token are serialized
 *     by an advisory lock on its digest, so two of them never both insert;
 *   - no token in the clear anywhere: it is sealed before it reaches SPI,
 *     the statement is hidden from the server log on error, and the audit
 *     row names the device only.
 */
#include "core/im_sync.h"
#include "core/common.h"
#include "core/locks.h"
#include "core/audit.h"
#include "core/version_check.h"
#include "core/im_sql.h"
#include "core/standing.h"
#include "push/push.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "storage/proc.h"
#include "utils/builtins.h"

/* Advisory lock class of one token's registrations ("IMPT"). */
#define IM_PUSH_TOKEN_LOCK_CLASS 0x494d5054

#define IM_PUSH_MAX_TOKEN_BYTES 4096

bool
im_push_catalog(void)
{
	return im_catalog_at_least(1, 4);
}

/* On an older catalog the push functions do not exist; a stale definition gets 55000. */
void
im_push_require_catalog(void)
{
	if (!im_push_catalog())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("offline push needs the im_sync 1.4 catalog"),
				 errhint("Run ALTER EXTENSION im_sync UPDATE.")));
}

int
im_push_preview_level(const char *preview)
{
	if (strcmp(preview, "none") == 0)
		return 0;
	if (strcmp(preview, "sender") == 0)
		return 1;
	if (strcmp(preview, "full") == 0)
		return 2;
	return -1;
}

static char *
arg_provider(FunctionCallInfo fcinfo, int argno)
{
	char	   *s = im_arg_text(fcinfo, argno, "provider", 32);

	for (const char *p = s; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("provider must be 1 to 32 of a-z, 0-9, _ and -")));
	return s;
}

static char *
arg_preview(FunctionCallInfo fcinfo, int argno)
{
	char	   *s;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("preview must be none, sender or full, got NULL")));
	s = TextDatumGetCString(PG_GETARG_DATUM(argno));
	if (im_push_preview_level(s) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("preview must be none, sender or full, got \"%.32s\"", s)));
	return s;
}

/* The token's bytes, checked; never quoted in a message. */
static text *
arg_token(FunctionCallInfo fcinfo, int argno)
{
	text	   *t;
	size_t		len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("push_token must not be NULL")));
	t = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(t);
	if (len < 1 || len > IM_PUSH_MAX_TOKEN_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("push_token must be 1 to %d bytes long, got %zu", IM_PUSH_MAX_TOKEN_BYTES, len)));
	return t;
}

IM_SENSITIVE_FUNCTION(im_register_push_target)
{
	static SPIPlanPtr lock_plan;
	static SPIPlanPtr move_plan;
	static SPIPlanPtr upsert_plan;
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	char	   *provider = arg_provider(fcinfo, 2);
	char	   *app_id = im_arg_text(fcinfo, 3, "app_id", 64);
	text	   *token = arg_token(fcinfo, 4);
	char	   *preview = arg_preview(fcinfo, 5);
	ImDevice	dev;
	uint8		digest[32];
	bytea	   *digest_b;
	char	   *sealed;
	Datum		args[7];
	int64		target_id;
	uint64		moved;

	im_push_require_catalog();
	sealed = im_push_seal_token(VARDATA_ANY(token), VARSIZE_ANY_EXHDR(token));

	im_spi_connect();
	im_user_check_standing(user_id);	/* IS403 for a suspended account (contract §17) */
	im_lock_device(user_id, device_id, &dev);
	if (strcmp(dev.state, "REVOKED") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("device \"%s\" of user " INT64_FORMAT " is revoked", device_id, user_id)));
	im_push_token_digest(provider, app_id, VARDATA_ANY(token), VARSIZE_ANY_EXHDR(token), digest);
	digest_b = palloc(VARHDRSZ + 32);
	SET_VARSIZE(digest_b, VARHDRSZ + 32);
	memcpy(VARDATA(digest_b), digest, 32);

	/* one registration of this token at a time */
	im_prepare(&lock_plan, "SELECT pg_catalog.pg_advisory_xact_lock($1, $2)", 2, INT4OID, INT4OID);
	args[0] = Int32GetDatum(IM_PUSH_TOKEN_LOCK_CLASS);
	args[1] = Int32GetDatum((int32) ((uint32) digest[0] << 24 | (uint32) digest[1] << 16 |
									 (uint32) digest[2] << 8 | digest[3]));
	im_exec(lock_plan, args, NULL, 0);

	/* the token moves: its target on another device goes, with that target's jobs */
	im_prepare(&move_plan,
			   "DELETE FROM im.push_target WHERE provider" EQ "$1 AND app_id" EQ "$2 AND token_digest" EQ "$3"
			   " AND NOT (user_id" EQ "$4 AND device_id" EQ "$5)",
			   5, TEXTOID, TEXTOID, BYTEAOID, INT8OID, TEXTOID);
	args[0] = CStringGetTextDatum(provider);
	args[1] = CStringGetTextDatum(app_id);
	args[2] = PointerGetDatum(digest_b);
	args[3] = Int64GetDatum(user_id);
	args[4] = CStringGetTextDatum(device_id);
	moved = im_exec(move_plan, args, NULL, 0);

	im_prepare(&upsert_plan,
			   "INSERT INTO im.push_target (user_id, device_id, provider, app_id, token_digest, sealed_token, preview)"
			   " VALUES ($4, $5, $1, $2, $3, $6, $7)"
			   " ON CONFLICT (user_id, device_id) DO UPDATE SET provider = EXCLUDED.provider,"
			   "  app_id = EXCLUDED.app_id, token_digest = EXCLUDED.token_digest,"
			   "  sealed_token = EXCLUDED.sealed_token, preview = EXCLUDED.preview,"
			   "  rejections = 0, disabled_at = NULL, registered_at = pg_catalog.now()"
			   " RETURNING push_target_id",
			   7, TEXTOID, TEXTOID, BYTEAOID, INT8OID, TEXTOID, TEXTOID, TEXTOID);
	args[5] = CStringGetTextDatum(sealed);
	args[6] = CStringGetTextDatum(preview);
	if (im_exec(upsert_plan, args, NULL, 0) != 1)
		elog(ERROR, "im_sync: push target upsert returned no row");
	target_id = im_get_int64(0, 1, NULL);
	im_audit_device("register_push_target", user_id, device_id,
					psprintf("{\"push_target_id\": " INT64_FORMAT ", \"provider\": \"%s\", \"moved\": %s}",
						  target_id, provider, moved > 0 ? "true" : "false"));
	SPI_finish();
	PG_RETURN_INT64(target_id);
}

/* Delete the device's target (and, by cascade, its jobs); true if there was one. */
static bool
remove_target(int64 user_id, const char *device_id)
{
	static SPIPlanPtr plan;
	Datum		args[2];

	im_prepare(&plan,
			   "DELETE FROM im.push_target WHERE user_id" EQ "$1 AND device_id" EQ "$2",
			   2, INT8OID, TEXTOID);
	args[0] = Int64GetDatum(user_id);
	args[1] = CStringGetTextDatum(device_id);
	return im_exec(plan, args, NULL, 0) > 0;
}

PG_FUNCTION_INFO_V1(im_remove_push_target);
Datum
im_remove_push_target(PG_FUNCTION_ARGS)
{
	int64		user_id = im_arg_user_id(fcinfo, 0, "user_id");
	char	   *device_id = im_arg_device_id(fcinfo, 1);
	bool		removed;

	im_push_require_catalog();
	im_spi_connect();
	removed = remove_target(user_id, device_id);
	if (removed)
		im_audit_device("remove_push_target", user_id, device_id, "{}");
	SPI_finish();
	PG_RETURN_BOOL(removed);
}

void
im_push_remove_device_target(int64 user_id, const char *device_id)
{
	if (im_push_catalog())
		(void) remove_target(user_id, device_id);
}
