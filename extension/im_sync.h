/*
 * im_sync.h — shared declarations of the im_sync extension.
 *
 * One concept per file (see README "Code map"):
 *   im_sync.c      _PG_init: GUCs, shared memory, hooks; nothing else
 *   common.c       SPI plan cache, argument checks, SRF output, lock helpers
 *   conversation.c create/direct/join/leave/mode, conversation_list
 *   append.c       the single-writer append of a position + its outbox item
 *   send.c         send/recall/edit
 *   fanout.c       outbox -> per-user logs (the only writer of sync_seq)
 *   fanout_shared_log.c  fanout of shared_log groups: dirty markers
 *   shmem.c        shared memory: worker latches, commit-time wake-up, counters
 *   worker.c       fanout background workers: registration and loop
 *   device.c       devices, connection epochs, device tokens, audit
 *   token.c        HMAC-SHA256 signed tokens and the key ring
 *   sync.c         sync_changes, ack_sync, recovery sessions
 *   snapshot.c     begin/fetch/ack_snapshot
 *   history.c      fetch_messages (contract §1 visibility)
 *   read_state.c   report_read, delete_for_me, message_status, clear_dirty
 *   gc.c           gc_inbox and its fence, in chunks
 *   maintenance.c  retention of done/expired rows; what maintenance runs
 *   reconcile.c    im.reconcile
 *   metrics.c      im.metrics
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
extern int	im_maintenance_interval_s;

#endif							/* IM_SYNC_H */
