/*
 * device.c — devices and device tokens.
 * STUB: not implemented yet.
 */
#include "im_sync.h"

PG_FUNCTION_INFO_V1(im_register_device);
Datum
im_register_device(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("register_device is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_revoke_device);
Datum
im_revoke_device(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("revoke_device is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_device_session);
Datum
im_device_session(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("device_session is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_issue_device_token);
Datum
im_issue_device_token(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("issue_device_token is not implemented yet")));
	PG_RETURN_NULL();
}

PG_FUNCTION_INFO_V1(im_authenticate);
Datum
im_authenticate(PG_FUNCTION_ARGS)
{
	ereport(ERROR, (errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					errmsg("authenticate is not implemented yet")));
	PG_RETURN_NULL();
}
