/*
 * version_check.h — which catalog version this library serves.
 *
 * PostgreSQL keeps a preloaded library by name, so after a DBA installs a
 * new im_sync.so and restarts, the new code runs on the old catalog until
 * ALTER EXTENSION im_sync UPDATE.  The workers wait for the catalog
 * (version_check.c); API functions whose signature or tables changed
 * between releases check PG_NARGS() or im_catalog_version() and fail with
 * 55000, every other call behaves as in the older release
 * (extension/doc/upgrades.md).
 */
#ifndef IM_VERSION_CHECK_H
#define IM_VERSION_CHECK_H

/* default_version of im_sync.control, passed in by the Makefile */
#ifndef IM_LIBRARY_VERSION
#error "IM_LIBRARY_VERSION must be defined (the Makefile reads it from im_sync.control)"
#endif

/* extversion of im_sync in this database, palloc'd; NULL when not installed */
extern char *im_catalog_version(void);

/*
 * True when the installed catalog is at least major.minor (or im_sync is not
 * installed: the caller's own checks answer that).  Code that reads objects
 * a later release added asks this, so a new library on an older catalog
 * answers as the older release did.  Read once per transaction.
 */
extern bool im_catalog_at_least(int major, int minor);

/*
 * For a background worker between transactions: true when the catalog is
 * at IM_LIBRARY_VERSION or im_sync is not installed (the caller handles
 * that).  Logs one line when it starts to disagree and one when it agrees
 * again.  Runs its own transaction.
 */
extern bool im_worker_catalog_matches(void);

#endif
