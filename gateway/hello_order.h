/*
 * hello_order.h — one hello of a device at a time (issue 15, known gap 6).
 *
 * A device's newest hello must win.  On one database a hello's epoch bump
 * commits only when the gateway welcomes it, and the device row's lock
 * orders the rest; through the router each call commits on its node when
 * it returns, so two hellos of one device on two pool connections reach
 * the node in either order and the one that ends last wins — possibly the
 * older one, whose socket has already closed.  The database thread
 * therefore starts a device's hello only when no earlier hello of that
 * device is still running in this gateway: hellos of one device reach the
 * node in the order the gateway received them.
 */
#ifndef IM_GW_HELLO_ORDER_H
#define IM_GW_HELLO_ORDER_H

#include <stdint.h>

typedef struct im_job im_job;

/*
 * The device a hello's token names, as a nonzero 64-bit key, read from the
 * token's claims without verifying them (extension/token_layout.h); 0 when
 * the token is not readable (the node refuses it anyway).  Only the order
 * of hellos depends on it: a forged token naming another device delays that
 * device's hello by one refused call at most.  Any thread.
 */
extern uint64_t im_hello_device_key(const char *token);

/* Database thread only: */
/* 1 when an earlier hello of j's device is running (j must wait). */
extern int	im_hello_order_blocked(im_job *j);
/* j starts running: its device is busy until im_hello_order_release. */
extern void im_hello_order_hold(im_job *j);
/* j's transaction is over (posted for the last time or freed after its
 * ROLLBACK): the next hello of its device may start.  Idempotent. */
extern void im_hello_order_release(im_job *j);

#endif
