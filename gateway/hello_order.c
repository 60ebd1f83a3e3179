/*
 * hello_order.c — one hello of a device at a time (see hello_order.h).
 *
 * A hello holds its device from the moment the database thread takes it
 * off the queue until its transaction is over: the statement failed, the
 * COMMIT answered, the ROLLBACK was sent after a refusal or a closed
 * socket, or its connection was lost.  A batch rolled back for another
 * hello's refusal keeps the holds of the hellos it runs again, so nothing
 * of their device overtakes them.  Holds are counted in a table indexed by
 * the key's low bits: two devices sharing a slot only wait for each other
 * (order, never correctness; at most 64 x 32 hellos run at once against
 * 65,536 slots).
 */
#include "hello_order.h"
#include "db.h"

#include <libwebsockets.h>
#include <string.h>

/* the token's claims as extension/token.c writes them (one definition) */
#include "../extension/token_layout.h"

#define SLOTS (1 << 16)

static uint16_t held[SLOTS];	/* running hellos per slot */

uint64_t
im_hello_device_key(const char *token)
{
	char		raw[IM_TOKEN_MAX_BYTES + 4];
	size_t		len = token ? strlen(token) : 0;
	uint64_t	h = 1469598103934665603ULL;	/* FNV-1a */
	int			n,
				devlen,
				i;

	if (len == 0 || len > (IM_TOKEN_MAX_BYTES + 2) / 3 * 4)
		return 0;
	n = lws_b64_decode_string_len(token, (int) len, raw, sizeof(raw));
	if (n <= IM_TOKEN_DEVLEN_AT)
		return 0;
	devlen = (unsigned char) raw[IM_TOKEN_DEVLEN_AT];
	if (devlen < 1 || devlen > IM_TOKEN_DEVICE_MAX || n < IM_TOKEN_DEVLEN_AT + 1 + devlen)
		return 0;
	for (i = IM_TOKEN_USER_ID_AT; i < IM_TOKEN_USER_ID_AT + 8; i++)
		h = (h ^ (unsigned char) raw[i]) * 1099511628211ULL;
	for (i = IM_TOKEN_DEVLEN_AT; i <= IM_TOKEN_DEVLEN_AT + devlen; i++)
		h = (h ^ (unsigned char) raw[i]) * 1099511628211ULL;
	return h ? h : 1;
}

int
im_hello_order_blocked(im_job *j)
{
	return j->kind == IM_JOB_AUTH && j->device_key && !j->device_held &&
		held[j->device_key % SLOTS] > 0;
}

void
im_hello_order_hold(im_job *j)
{
	if (j->kind != IM_JOB_AUTH || !j->device_key || j->device_held)
		return;
	j->device_held = 1;
	held[j->device_key % SLOTS]++;
}

void
im_hello_order_release(im_job *j)
{
	if (!j->device_held)
		return;
	j->device_held = 0;
	held[j->device_key % SLOTS]--;
}
