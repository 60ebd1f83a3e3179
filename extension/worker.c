/*
 * worker.c — fanout background workers.  STUB: shared memory and wake-up
 * are placeholders until the worker is written.
 */
#include "im_sync.h"

Size
im_shmem_size(void)
{
	return 0;
}

void
im_shmem_init(void)
{
}

void
im_worker_register(void)
{
}

void
im_wake_fanout_at_commit(void)
{
}

void
im_counter_add(ImCounter which, int64 delta)
{
}

int64
im_counter_get(ImCounter which)
{
	return 0;
}
