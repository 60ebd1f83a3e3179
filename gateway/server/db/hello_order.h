/*
 * hello_order.h — one hello of a device at a time (through the router).
 *
 * A device's newest hello must win.  On one database a hello's epoch bump
 * commits only when the gateway welcomes it, and the device row's lock
 * orders the rest; through the router each call commits on its node when
 * it returns, so two hellos of one device on two pool connections reach
 * the node in either order and the one that ends last wins — possibly the
 * older one, whose socket has already closed.  The database thread
 * therefore starts a device's hello only when no earlier hello of that
 * device is still running in this gateway: hellos of one device reach the
 * node in the order the gateway received them — for tokens the database
 * has accepted before (see below).
 */
#ifndef IM_GW_HELLO_ORDER_H
#define IM_GW_HELLO_ORDER_H

#include <stdint.h>

typedef struct im_job im_job;

/*
 * The device a hello's token names, as a nonzero 64-bit key, read from the
 * token's claims without verifying them (by the names of
 * extension/include/im_sync/token_layout.h); 0 when the token is not
 * readable (the node refuses it anyway).  Any thread.
 */
extern uint64_t im_hello_device_key(const char *token);

/*
 * The token itself as a nonzero 64-bit key: a keyed hash (HMAC-SHA256 under
 * a random per-process key) of its whole text, so no one can make another
 * token with the same key without the token.  lws thread only.
 */
extern uint64_t im_hello_token_key(const char *token);

/*
 * Which key orders a hello.  Tokens are verified only in the database
 * (im.authenticate: HMAC-SHA256 under the key ring in im.token_key, which
 * the gateway never sees), so claims read here may be forged: a hello is
 * ordered by its device (device_key) only when its token has already been
 * accepted by the database in this gateway (im_hello_order_verified), else
 * by its token (token_key) — hellos carrying the same token are still
 * ordered, and forged hellos naming a device never wait for, nor hold back,
 * that device's real ones.  The limit: a device's hello with a token this
 * gateway has not seen accepted yet is not ordered against its hellos with
 * another token (a re-issued token's first use racing a stale hello of the
 * old one).
 */

/* Database thread only: */
/* 1 when an earlier hello with j's order key is running (j must wait). */
extern int	im_hello_order_blocked(im_job *j);
/* j starts running: its order key is busy until im_hello_order_release. */
extern void im_hello_order_hold(im_job *j);
/* j's transaction is over (posted for the last time or freed after its
 * ROLLBACK): the next hello of its key may start.  Idempotent. */
extern void im_hello_order_release(im_job *j);
/* The database accepted j's token (its authenticate returned its row):
 * later hellos with that token are ordered by their device. */
extern void im_hello_order_verified(im_job *j);

#endif
