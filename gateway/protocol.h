/*
 * protocol.h — the "im-sync.v1" protocol table handed to lws_create_context.
 */
#ifndef IM_GW_PROTOCOL_H
#define IM_GW_PROTOCOL_H

#include <libwebsockets.h>

/* protocols[0] also takes HTTP and ws clients that name no subprotocol. */
extern const struct lws_protocols im_protocols[];

#endif
