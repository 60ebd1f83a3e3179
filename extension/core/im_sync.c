/*
 * im_sync.c — module entry point.  _PG_init only registers things: the
 * settings of contract §9, the shared-memory request and the fanout workers.
 * Each part's behaviour lives in its own file (see im_sync.h).
 */
#include "core/im_sync.h"
#include "core/shmem.h"
#include "core/log_privacy.h"
#include "fanout/fanout.h"

#include <limits.h>

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/guc.h"

PG_MODULE_MAGIC;

char	   *im_database = NULL;
int			im_fanout_workers = 1;
bool		im_fanout_paused = false;
int			im_fanout_max_attempts = 5;
int			im_fanout_lock_timeout_ms = 2000;
int			im_inbox_retention_s = 7 * 86400;
int			im_device_inactive_after_s = 30 * 86400;
int			im_recovery_max_replay = 1000;
int			im_recovery_ttl_s = 15 * 60;
int			im_token_ttl_s = 15 * 60;
int			im_snapshot_ttl_s = 3600;
int			im_max_batch_events = 10000;
int			im_max_body_bytes = 65536;
int			im_shared_log_min_members = 0;
int			im_reconcile_outbox_age_s = 60;
int			im_max_page_bytes = 1024 * 1024;
int			im_token_key_max_age_s = 30 * 86400;
int			im_audit_retention_s = 90 * 86400;
int			im_evidence_retention_s = 90 * 86400;
int			im_transfer_retention_s = 86400;
int			im_maintenance_interval_s = 300;
char	   *im_push_public_key_file = NULL;
int			im_push_delay_ms = 3000;
int			im_push_min_interval_ms = 10000;
int			im_receipt_interval_ms = 2000;
int			im_push_max_age_s = 3600;
int			im_max_devices_per_user = 20;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

void		_PG_init(void);

static void
im_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(im_shmem_size());
}

static void
im_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	im_shmem_init();
}

static void
define_settings(void)
{
	/*
	 * PostgreSQL refuses (FATAL) to create a PGC_POSTMASTER setting outside
	 * shared_preload_libraries.  Without preloading there are no workers,
	 * so the two worker settings are merely informational there.
	 */
	GucContext	worker_ctx = process_shared_preload_libraries_in_progress ?
		PGC_POSTMASTER : PGC_SIGHUP;

	DefineCustomStringVariable("im_sync.database",
							   "Database the fanout workers connect to.",
							   NULL, &im_database, "postgres",
							   worker_ctx, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.fanout_workers",
							"Number of background fanout workers (0: none).",
							NULL, &im_fanout_workers, 1, 0, IM_MAX_FANOUT_WORKERS,
							worker_ctx, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("im_sync.fanout_paused",
							 "Makes the fanout workers idle; im.run_fanout still works.",
							 NULL, &im_fanout_paused, false,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.fanout_max_attempts",
							"Failures before an outbox item becomes a dead letter.",
							NULL, &im_fanout_max_attempts, 5, 1, 1000,
							PGC_SUSET, 0, NULL, NULL, NULL);
	/*
	 * Fanout waits on user heads and states that sessions lock too; a stuck
	 * holder must become a transient failure (55P03, backed off) rather
	 * than a worker hung with its whole batch.  No 0: never wait for ever.
	 */
	DefineCustomIntVariable("im_sync.fanout_lock_timeout",
							"Longest lock wait of a fanout batch before it backs off (transient failure).",
							NULL, &im_fanout_lock_timeout_ms, 2000, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.inbox_retention",
							"Inbox events younger than this are never collected.",
							NULL, &im_inbox_retention_s, 7 * 86400, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.device_inactive_after",
							"A device silent this long no longer holds the GC fence.",
							NULL, &im_device_inactive_after_s, 30 * 86400, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.recovery_max_replay",
							"Largest rollback gap replayed instead of a snapshot.",
							NULL, &im_recovery_max_replay, 1000, 0, INT_MAX,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.recovery_ttl",
							"Lifetime of a recovery session and its retention lease.",
							/* 0: sessions expire at once (tests; superuser only) */
							NULL, &im_recovery_ttl_s, 15 * 60, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.token_ttl",
							"Lifetime of batch tokens and page cursors.",
							/* 0: tokens expire at once (tests; superuser only) */
							NULL, &im_token_ttl_s, 15 * 60, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.snapshot_ttl",
							"Lifetime of a snapshot and its retention lease.",
							NULL, &im_snapshot_ttl_s, 3600, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.max_batch_events",
							"Cap on the range of one sync batch.",
							NULL, &im_max_batch_events, 10000, 1, INT_MAX,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.max_body_bytes",
							"Largest message body (octet_length of its JSON text).",
							NULL, &im_max_body_bytes, 65536, 2, 64 * 1024 * 1024,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.shared_log_min_members",
							"Active members at which a join switches a group to shared_log (0: never).",
							NULL, &im_shared_log_min_members, 0, 0, INT_MAX,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.reconcile_outbox_age",
							"Outbox items older than this are reported by im.reconcile.",
							NULL, &im_reconcile_outbox_age_s, 60, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.max_page_bytes",
							"Largest JSON text of one page of sync_changes events, fetch_messages messages or snapshot items.",
							"A page ends early (has_more true) before the event that would push its JSON text "
							"over this size; every page still holds at least one event.",
							&im_max_page_bytes, 1024 * 1024, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_BYTE, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.max_devices_per_user",
							"Most devices a user may have registered (revoked ones do not count).",
							"Registering a new device beyond it fails with 54000; re-registering a known one does not.",
							&im_max_devices_per_user, 20, 1, 100000,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.token_key_max_age",
							"Signing key age at which maintenance rotates to a new key.",
							NULL, &im_token_key_max_age_s, 30 * 86400, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.audit_retention",
							"Audit rows older than this are collected by maintenance.",
							NULL, &im_audit_retention_s, 90 * 86400, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.evidence_retention",
							"Bodies of taken-down messages are kept as moderation evidence this long, then erased by maintenance (unless a legal hold covers them).",
							NULL, &im_evidence_retention_s, 90 * 86400, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.transfer_retention",
							"Applied inbound transfers whose acknowledgement every subscriber confirmed are kept this long before maintenance prunes them.",
							NULL, &im_transfer_retention_s, 86400, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.maintenance_interval",
							"Pause between the first fanout worker's maintenance rounds (0: none).",
							NULL, &im_maintenance_interval_s, 300, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	/* offline push (contract §9, §13) */
	DefineCustomStringVariable("im_sync.push_public_key_file",
							   "File holding the push relay's RSA public key (SPKI PEM); relative to the data directory.",
							   NULL, &im_push_public_key_file, "",
							   PGC_SUSET, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.push_delay",
							"A push job is claimable this long after it was queued.",
							NULL, &im_push_delay_ms, 3000, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.push_min_interval",
							"At most one push per (target, conversation) per this interval.",
							NULL, &im_push_min_interval_ms, 10000, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("im_sync.push_max_age",
							"A push job still failing after this is dropped as expired.",
							NULL, &im_push_max_age_s, 3600, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S, NULL, NULL, NULL);
	/* receipts (contract §20) */
	DefineCustomIntVariable("im_sync.receipt_interval",
							"At most one receipt per message of a fanout group per this interval (0: each producer round).",
							NULL, &im_receipt_interval_ms, 2000, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	MarkGUCPrefixReserved("im_sync");
}

void
_PG_init(void)
{
	define_settings();
	im_log_privacy_install();

	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = im_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = im_shmem_startup;
	im_worker_register();
}
