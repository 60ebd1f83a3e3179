/*
 * worker_owner.h — the role the fanout workers act as (worker_owner.c).
 *
 * The workers connect as the bootstrap superuser, but every transaction of
 * theirs that touches the extension's tables runs as the role that owns
 * them (im.set_extension_owner's role, or the installing superuser), under
 * SECURITY_RESTRICTED_OPERATION, as autovacuum and REFRESH MATERIALIZED
 * VIEW run a table owner's code: a trigger, CHECK or function the owner
 * controls runs with the owner's rights, never the superuser's.  While the
 * owner is unfit to hold the API (a non-superuser that can log in, has
 * CREATEROLE, or has members) the workers do no work at all.
 */
#ifndef IM_WORKER_OWNER_H
#define IM_WORKER_OWNER_H

typedef struct ImOwnerScope
{
	Oid			saved_userid;	/* who the worker was before */
	int			saved_sec_context;
	bool		active;			/* switched, to be restored */
} ImOwnerScope;

/*
 * Inside a transaction: look up the owner of the extension's tables, check
 * it, and act as it.  False when it is unfit (logged once per change of
 * state): the caller then does no work in this transaction.  True with
 * nothing switched when im_sync is not installed here.
 */
extern bool im_worker_become_owner(ImOwnerScope *scope);

/* Back to the worker's own identity (also after an error, before abort). */
extern void im_worker_restore_user(ImOwnerScope *scope);

/*
 * Why `role` may not own the extension, or NULL when it may: superusers
 * always may; any other role must not be able to log in, must not have
 * CREATEROLE (it could make itself loginable or grant itself to another
 * role) and must have no members (a member acts as it).  The same rule as
 * im.set_extension_owner's, read from the syscache.
 */
extern const char *im_owner_unfit_reason(Oid role);

/*
 * 42501 when the current user is a superuser but the extension's tables
 * belong to a role that is not: the extension's C code then runs for a
 * superuser over objects that role controls (its triggers, CHECK and
 * DEFAULT expressions would run with superuser rights).  Inside the
 * SECURITY DEFINER API the current user is the owner, so this only fires
 * when the owner turned a function SECURITY INVOKER and a superuser called
 * it.  im_spi_connect calls it before any statement.
 */
extern void im_refuse_superuser_over_owner(void);

#endif							/* IM_WORKER_OWNER_H */
