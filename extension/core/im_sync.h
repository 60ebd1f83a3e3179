/*
 * im_sync.h — the extension's settings (im_sync.c) and error codes.  Each
 * subsystem folder has one header named after it that declares what its
 * files offer each other (conversation/conversation.h, user/user.h,
 * push/push.h, fanout/fanout.h, shard/shard.h, ops/ops.h); core/ keeps one
 * header per job (common.h, shmem.h, shard_map.h, log_privacy.h,
 * version_check.h, im_sql.h), and include/im_sync/token_layout.h and trace_id.h are shared
 * with the gateway.  Which folder may include which:
 * extension/doc/architecture.md, "Layers".
 */
#ifndef IM_SYNC_H
#define IM_SYNC_H

#include "postgres.h"
#include "fmgr.h"

/* SQLSTATE for idempotency-key conflicts (contract §3). */
#define ERRCODE_IM_CONFLICT MAKE_SQLSTATE('I', 'S', '4', '0', '9')
/* contract §17: a muted member's write, a suspended account's call */
#define ERRCODE_IM_FORBIDDEN MAKE_SQLSTATE('I', 'S', '4', '0', '3')

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
extern int	im_evidence_retention_s;
extern int	im_transfer_retention_s;
extern int	im_maintenance_interval_s;
/* offline push (contract §9, §13) */
extern char *im_push_public_key_file;
extern int	im_push_delay_ms;
extern int	im_push_min_interval_ms;
extern int	im_receipt_interval_ms;
extern int	im_push_max_age_s;
extern int	im_max_devices_per_user;

#endif							/* IM_SYNC_H */
