/*
 * worker_owner.c — the role the fanout workers act as (see worker_owner.h).
 *
 * Invariant protected: no SQL a worker runs over the extension's tables
 * (fanout, transfers, maintenance) executes with more rights than the role
 * that owns those tables.  That role can add triggers to its tables and
 * change the functions it owns; run as the bootstrap superuser, each of
 * those ran as superuser.  SECURITY_RESTRICTED_OPERATION also refuses the
 * SET ROLE / SET SESSION AUTHORIZATION that would take the session user's
 * (the superuser's) identity back, and temporary objects of the session.
 * The owner is read and checked in every transaction, so a member granted
 * after the switch stops the workers at their next transaction.  The same
 * invariant for a superuser's own calls: the extension's SQL never runs as
 * a superuser over tables a non-superuser owns (im_refuse_superuser_over_owner).
 */
#include "core/im_sync.h"
#include "core/worker_owner.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_auth_members.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/catcache.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

/* this worker is refusing to run for an unfit owner (logged once per refusal) */
static bool refusing = false;

const char *
im_owner_unfit_reason(Oid role)
{
	HeapTuple	tup;
	Form_pg_authid form;
	CatCList   *members;
	const char *why = NULL;

	tup = SearchSysCache1(AUTHOID, ObjectIdGetDatum(role));
	if (!HeapTupleIsValid(tup))
		return "does not exist";
	form = (Form_pg_authid) GETSTRUCT(tup);
	if (form->rolsuper)
	{
		ReleaseSysCache(tup);
		return NULL;
	}
	if (form->rolcanlogin)
		why = "can log in";
	else if (form->rolcreaterole)
		why = "has CREATEROLE";
	ReleaseSysCache(tup);
	if (why != NULL)
		return why;
	members = SearchSysCacheList1(AUTHMEMROLEMEM, ObjectIdGetDatum(role));
	if (members->n_members > 0)
		why = "has members";
	ReleaseSysCacheList(members);
	return why;
}

/* The owner of im.outbox (every table's, after set_extension_owner). */
static Oid
extension_tables_owner(void)
{
	Oid			nsp = get_namespace_oid("im", true);
	Oid			rel;
	HeapTuple	tup;
	Oid			owner;

	if (!OidIsValid(nsp))
		return InvalidOid;
	rel = get_relname_relid("outbox", nsp);
	if (!OidIsValid(rel))
		return InvalidOid;
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(rel));
	if (!HeapTupleIsValid(tup))
		return InvalidOid;
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return owner;
}

bool
im_worker_become_owner(ImOwnerScope *scope)
{
	Oid			owner;
	const char *why;

	scope->active = false;
	if (!OidIsValid(get_extension_oid("im_sync", true)))
		return true;
	owner = extension_tables_owner();
	if (!OidIsValid(owner))
		return true;
	why = im_owner_unfit_reason(owner);
	if (why != NULL)
	{
		if (!refusing)
		{
			const char *name = GetUserNameFromId(owner, true);

			ereport(LOG,
					(errmsg("im_sync fanout worker refuses to run: the extension's owner role \"%s\" %s",
							name ? name : "?", why),
					 errdetail("The workers act as the owner of the extension's tables; they neither fan out, apply transfers nor maintain while that role could be used by anyone but the extension."),
					 errhint("Make the role NOLOGIN NOCREATEROLE and revoke its members, or hand the extension to another role with im.set_extension_owner.")));
			refusing = true;
		}
		return false;
	}
	if (refusing)
	{
		const char *name = GetUserNameFromId(owner, true);

		ereport(LOG,
				(errmsg("im_sync fanout worker resumes: the extension's owner role \"%s\" is fit",
						name ? name : "?")));
		refusing = false;
	}
	GetUserIdAndSecContext(&scope->saved_userid, &scope->saved_sec_context);
	SetUserIdAndSecContext(owner, scope->saved_sec_context | SECURITY_RESTRICTED_OPERATION);
	scope->active = true;
	return true;
}

void
im_worker_restore_user(ImOwnerScope *scope)
{
	if (scope->active)
	{
		SetUserIdAndSecContext(scope->saved_userid, scope->saved_sec_context);
		scope->active = false;
	}
}

void
im_refuse_superuser_over_owner(void)
{
	Oid			owner;

	if (!superuser())
		return;
	owner = extension_tables_owner();
	if (OidIsValid(owner) && !superuser_arg(owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("im_sync refuses to run as a superuser over tables the role \"%s\" owns",
						GetUserNameFromId(owner, false)),
				 errdetail("The API runs as the extension's owner (SECURITY DEFINER); a function that runs as its superuser caller would run that role's triggers and expressions with superuser rights."),
				 errhint("Call the API as a role that is no superuser, and make the function SECURITY DEFINER again.")));
}
