/*
 * web_mount.c — static files of the web client (contract §16).
 *
 * Invariant: nothing outside the web folder is ever served.  lws collapses
 * "..", "%2e%2e" and "//" in the URI before it matches the mount (tested by
 * test/client/web_mount.test.mjs), and every file lws opens for the mount
 * goes through confined_open below, which resolves the path (symlinks
 * included) and refuses anything whose real path is not inside the folder's
 * real path.  Only the folder is mounted, so gateway/node_modules and the
 * sources beside it are not reachable.
 */
#include "server/web_mount.h"
#include "server/config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char web_root[PATH_MAX];
static size_t web_root_len;

/*
 * Scripts, styles and the socket from this origin only; no inline script
 * (bodies are rendered as text, and even an injected element could not run
 * code), no plugins, no framing.
 */
static const struct lws_protocol_vhost_options hdr_nosniff = {
	NULL, NULL, "x-content-type-options:", "nosniff"
};
static const struct lws_protocol_vhost_options hdr_csp = {
	&hdr_nosniff, NULL, "content-security-policy:",
	"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
};

static const struct lws_protocol_vhost_options mime_mjs = {
	NULL, NULL, ".mjs", "text/javascript"
};

static struct lws_http_mount web_mount = {
	.mountpoint = "/web",
	.mountpoint_len = 4,
	.def = "index.html",
	.origin_protocol = LWSMPRO_FILE,
	.extra_mimetypes = &mime_mjs,
	.cache_max_age = 0,
	.cache_revalidate = 1,
};

int
im_web_mount_setup(struct lws_context_creation_info *info, const char *argv0)
{
	char		want[PATH_MAX + 8];

	if (im_cfg.web_root)
		snprintf(want, sizeof(want), "%s", im_cfg.web_root);
	else
	{
		/* web/ beside the binary: gateway/im_gateway serves gateway/web */
		char		exe[PATH_MAX];
		ssize_t		n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		char	   *slash;

		if (n <= 0)
			snprintf(exe, sizeof(exe), "%s", argv0);
		else
			exe[n] = '\0';
		slash = strrchr(exe, '/');
		if (slash)
			*slash = '\0';
		else
			snprintf(exe, sizeof(exe), ".");
		snprintf(want, sizeof(want), "%s/web", exe);
	}
	info->headers = &hdr_csp;
	if (!realpath(want, web_root))
	{
		if (im_cfg.web_root)
		{
			fprintf(stderr, "im_gateway: --web-root %s is not a readable folder\n", im_cfg.web_root);
			return -1;
		}
		web_root[0] = '\0';		/* no web client beside the binary: /web/ is 404 */
		return 0;
	}
	web_root_len = strlen(web_root);
	web_mount.origin = web_root;
	info->mounts = &web_mount;
	return 0;
}

static lws_fop_fd_t (*platform_open) (const struct lws_plat_file_ops *fops,
									  const char *filename, const char *vpath,
									  lws_fop_flags_t *flags);
static struct lws_plat_file_ops confined_fops;

static lws_fop_fd_t
confined_open(const struct lws_plat_file_ops *fops, const char *filename,
			  const char *vpath, lws_fop_flags_t *flags)
{
	char		real[PATH_MAX];

	if (web_root_len == 0 || !realpath(filename, real) ||
		strncmp(real, web_root, web_root_len) != 0 || real[web_root_len] != '/')
		return NULL;			/* lws answers 404 */
	return platform_open(fops, real, vpath, flags);
}

void
im_web_mount_confine(struct lws_context *ctx)
{
	struct lws_plat_file_ops *fops = lws_get_fops(ctx);

	confined_fops = *fops;
	platform_open = fops->LWS_FOP_OPEN;
	confined_fops.LWS_FOP_OPEN = confined_open;
	lws_set_fops(ctx, &confined_fops);
}

int
im_web_redirect_root(struct lws *wsi)
{
	unsigned char buf[LWS_PRE + 512];
	unsigned char *p = buf + LWS_PRE,
			   *end = buf + sizeof(buf) - 1;
	static const char location[] = "/web/";

	if (lws_http_redirect(wsi, HTTP_STATUS_FOUND, (const unsigned char *) location,
						  (int) strlen(location), &p, end) < 0)
		return -1;
	return lws_http_transaction_completed(wsi) ? -1 : 0;
}
