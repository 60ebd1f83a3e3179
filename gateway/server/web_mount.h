/*
 * web_mount.h — the web client of contract §16: the folder web/ served
 * through a libwebsockets file mount at /web/, GET / redirected to it, and a
 * Content-Security-Policy on every HTTP answer.
 */
#ifndef IM_GW_WEB_MOUNT_H
#define IM_GW_WEB_MOUNT_H

#include <libwebsockets.h>

/* Resolves the folder and fills info's mounts and headers; 0 or -1. */
extern int	im_web_mount_setup(struct lws_context_creation_info *info, const char *argv0);

/* Confines lws' file opens to the folder (after lws_create_context). */
extern void im_web_mount_confine(struct lws_context *ctx);

/* GET /: a redirect to /web/; returns lws' verdict for the connection. */
extern int	im_web_redirect_root(struct lws *wsi);

#endif
