/*
 * http.h — the HTTP side of the one port: the upgrade check before a
 * WebSocket session exists, and GET /healthz and /metrics.
 */
#ifndef IM_GW_HTTP_H
#define IM_GW_HTTP_H

#include <stddef.h>

struct lws;
struct session;
struct im_job;

/*
 * LWS_CALLBACK_HTTP_CONFIRM_UPGRADE: connection caps and the Origin rule,
 * no database.  0 lets the upgrade proceed; otherwise the refusal (503 or
 * 403) is written and the value is the callback's return.
 */
extern int	im_admit_upgrade(struct lws *wsi);

/* LWS_CALLBACK_HTTP: routes uri for the HTTP session of wsi. */
extern void im_on_http(struct lws *wsi, struct session *s, const char *uri);
/* LWS_CALLBACK_HTTP_WRITEABLE: the answer, once it is there. */
extern int	im_on_http_writeable(struct lws *wsi, struct session *s);
/* The /healthz job's answer. */
extern void im_on_health_job(struct session *s, struct im_job *j);

/* Answers an HTTP session with status and body (malloc'd, consumed). */
extern void im_http_answer(struct session *s, int status, char *body);

#endif
