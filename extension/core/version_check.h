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
 * Catalog shapes.  A statement whose text depends on which columns the
 * catalog has is written once, as a macro STMT(S) of a shape S, so each
 * shape's text is fixed at compile time (never rewritten at run time), and
 * prepared with IM_PREPARE_SHAPED into one plan slot per shape; the shape
 * of this database's catalog is picked when the plan is prepared.  A
 * fragment that differs between shapes picks its text with
 * IM_SHAPE_CHOOSE(S, with, without):
 *   WITH_RELATIONS  im.event has the reply and pin columns
 *                   (reply_to_message_id, pin_message_id; contract §14);
 *   WITH_TAKEDOWN   the same and im.event.taken_down (contract §17);
 *   NO_RELATIONS    an older catalog, answered as its release did
 *                   (extension/doc/upgrades.md).
 */
#define IM_CATALOG_HAS_RELATIONS() im_catalog_at_least(1, 3)
/*
 * user_conversation has last_activity_at and conversation_pinned_at and
 * private events the conversation_pin kind (contract §20): fanout keeps the
 * recency column and writes pin payloads, snapshot items carry
 * conversation_pinned.
 */
#define IM_CATALOG_HAS_RECENCY() im_catalog_at_least(1, 11)
/*
 * membership_period has role and muted_until, im.conversation_ban exists and
 * the event kinds role and mute (contract §17).
 */
#define IM_CATALOG_HAS_ROLES() im_catalog_at_least(1, 12)

/*
 * im.event has taken_down and the takedown kind, im.takedown_evidence
 * exists (contract §17).
 */
#define IM_CATALOG_HAS_TAKEDOWN() im_catalog_at_least(1, 12)

/*
 * WITH_TAKEDOWN is WITH_RELATIONS on a catalog whose im.event also has
 * taken_down: IM_TAKEDOWN_CHOOSE(S, with, without) picks its fragment.
 */
#define IM_SHAPE_CHOOSE(S, with, without) IM_SHAPE_CHOOSE_##S(with, without)
#define IM_SHAPE_CHOOSE_WITH_TAKEDOWN(with, without) with
#define IM_SHAPE_CHOOSE_WITH_RELATIONS(with, without) with
#define IM_SHAPE_CHOOSE_NO_RELATIONS(with, without) without
#define IM_TAKEDOWN_CHOOSE(S, with, without) IM_TAKEDOWN_CHOOSE_##S(with, without)
#define IM_TAKEDOWN_CHOOSE_WITH_TAKEDOWN(with, without) with
#define IM_TAKEDOWN_CHOOSE_WITH_RELATIONS(with, without) without
#define IM_TAKEDOWN_CHOOSE_NO_RELATIONS(with, without) without

/* the plan slots of a shaped statement: static SPIPlanPtr slots[IM_SHAPES] */
#define IM_SHAPES 3
#define IM_PREPARE_SHAPED(slots, STMT, ...) \
	(IM_CATALOG_HAS_TAKEDOWN() \
	 ? im_prepare(&(slots)[2], STMT(WITH_TAKEDOWN), __VA_ARGS__) \
	 : IM_CATALOG_HAS_RELATIONS() \
	 ? im_prepare(&(slots)[1], STMT(WITH_RELATIONS), __VA_ARGS__) \
	 : im_prepare(&(slots)[0], STMT(NO_RELATIONS), __VA_ARGS__))

/*
 * For a background worker between transactions: true when the catalog is
 * at IM_LIBRARY_VERSION or im_sync is not installed (the caller handles
 * that).  Logs one line when it starts to disagree and one when it agrees
 * again.  Runs its own transaction.
 */
extern bool im_worker_catalog_matches(void);

#endif
