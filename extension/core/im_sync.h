/*
 * im_sync.h — the extension's settings and error codes.  Every subsystem has
 * its own header (extension/doc/architecture.md: which side each file is on):
 *   shmem.h        shared memory: worker latches, commit-time wake-up, counters
 *   common.h       SPI plans and getters, argument checks, SRF, lock helpers
 *   im_sql.h       SQL fragments: operator macros, period covers, recount, …
 *   append.h       the single-writer append of a position + its outbox item
 *                  (append.c; used by send.c and conversation.c)
 *   fanout.h       outbox -> per-user logs (fanout.c, fanout_shared_log.c)
 *   worker.h       fanout background workers: registration and loop
 *   device.h       devices, connection epochs, device tokens, audit
 *   device_state.h lock, generation, leases, touch of one device
 *   token.h        signed tokens, the key ring, im_token_check
 *   read_state.h   private events of report_read / delete_for_me
 *   maintenance.h  gc_inbox chunks (gc.c), key ring and retention
 * API files without a header of their own: conversation.c, send.c, sync.c,
 * snapshot.c, history.c, reconcile.c, metrics.c.
 */
#ifndef IM_SYNC_H
#define IM_SYNC_H

#include "postgres.h"
#include "fmgr.h"

/* SQLSTATE for idempotency-key conflicts (contract §3). */
#define ERRCODE_IM_CONFLICT MAKE_SQLSTATE('I', 'S', '4', '0', '9')

/* ---- settings (im_sync.c) ------------------------------------------- */
extern char *im_database;
extern int	im_fanout_workers;
extern bool im_fanout_paused;
extern int	im_fanout_max_attempts;
extern int	im_fanout_lock_timeout_ms;
extern int	im_inbox_retention_s;
extern int	im_device_inactive_after_s;
extern int	im_recovery_max_replay;
extern int	im_recovery_ttl_s;
extern int	im_token_ttl_s;
extern int	im_snapshot_ttl_s;
extern int	im_max_batch_events;
extern int	im_max_body_bytes;
extern int	im_shared_log_min_members;
extern int	im_reconcile_outbox_age_s;
extern int	im_max_page_bytes;
extern int	im_token_key_max_age_s;
extern int	im_audit_retention_s;
extern int	im_transfer_retention_s;
extern int	im_maintenance_interval_s;
/* issue 12: offline push (contract §9, §13) */
extern char *im_push_public_key_file;
extern int	im_push_delay_ms;
extern int	im_push_min_interval_ms;
extern int	im_push_max_age_s;

#endif							/* IM_SYNC_H */
