/*
 * protocol.h — the "im-sync.v1" protocol table handed to lws_create_context.
 */
#ifndef IM_GW_PROTOCOL_H
#define IM_GW_PROTOCOL_H

#include <libwebsockets.h>

/* Bytes of a frame lws hands over per RECEIVE callback; lws keeps a buffer
 * of this size (+ LWS_PRE) per connection for the connection's life. */
#define IM_RX_BUFFER_SIZE 1024

/* protocols[0] also takes HTTP and ws clients that name no subprotocol. */
extern const struct lws_protocols im_protocols[];

#endif
