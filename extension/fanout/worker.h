/*
 * worker.h — the fanout background workers (worker.c).
 */
#ifndef IM_WORKER_H
#define IM_WORKER_H

/*
 * Register im_sync.fanout_workers workers; called from _PG_init while the
 * library is being preloaded.
 */
extern void im_worker_register(void);

#endif							/* IM_WORKER_H */
