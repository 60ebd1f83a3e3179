/*
 * test_push_relay — unit tests of the push relay's secret handling and HTTP
 * limits (make relay-test; run from gateway/, the test keys in
 * ../test/push/):
 *
 *   retry_after        Retry-After: delay-seconds and HTTP-date, capped;
 *                      overflowing, negative and malformed values ignored
 *   wipe_allocator     a block freed through the wiping allocator leaves
 *                      nothing in the heap (and a plain free() does: the
 *                      heap scan sees freed bytes)
 *   request_no_token   building and freeing a request (jansson's pushkey
 *                      string and serialised body) leaves no token copy
 *   unseal_bad_tag     a sealed token whose GCM tag fails leaves no
 *                      decrypted byte in the heap
 *   protocols          only http and https: a file:// or gopher:// URL and a
 *                      redirect to ftp:// are refused by libcurl
 *   job_log            a job's line (text and --log-format json) names its
 *                      trace id; the JSON line is one object with the
 *                      contract §21 fields, written through
 *                      common/log_json.c with the wiping allocator in
 *                      place (its line is released through jansson's
 *                      allocator, not free()); a trace id not of the
 *                      contract's form is refused (im_sync/trace_id.h); a
 *                      line not about a job has its key=value pairs as
 *                      members, and a reason with a newline or a quote
 *                      stays one JSON line, its value whole
 *
 * "Leaves nothing in the heap" is checked by scanning every writable
 * anonymous mapping of the process (the malloc heap and arenas) for the
 * secret after the free: glibc keeps a freed block's bytes apart from its
 * first 16, so an unwiped copy is found.
 */
#define _GNU_SOURCE				/* memmem */
#include "common/log_hash.h"
#include "relay/push_http.h"
#include "relay/push_log.h"
#include "relay/push_unseal.h"
#include "relay/push_wipe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>
#include <openssl/sha.h>
#include <jansson.h>

static int	failures;

#define CHECK(cond, ...) \
	do { \
		if (!(cond)) \
		{ \
			failures++; \
			printf("FAIL %s:%d: ", __func__, __LINE__); \
			printf(__VA_ARGS__); \
			printf("\n"); \
		} \
	} while (0)

/*
 * The secrets live in the binary's read-only data, never in the heap, so
 * the scan finds only copies the code under test made.
 */
static const char TOKEN[] =
	"tok-7Hq2mZ9xLr4Vb1Nc8Ke3Wd6Ys0Pa5Uf-GjTn2Xw8Rv4Lm6Qs1Zb9Kc3Hd7Ye5Np0Ta-"
	"fcm-registration-token-for-the-request-test-QfL8mR2vX6nJ4bW0kT9cY3hD7sG1";
static const char SEALED_TOKEN[] =
	"tok-Xe4Rt7Yu1Io9Pa3Sd6Fg0Hj2Kl5Zx8Cv-BnM4qW7eR1tY9uI3oP6aS0dF2gH5jK8lZ-"
	"apns-device-token-for-the-unseal-test-Lq2Wm8Ns4Vb6Xc0Zk9Jh3Gf7Dd1Sa5Pq";
static const char WIPE_SECRET[] =
	"secret-Mn3Bv6Cx9Zl2Kj5Hg8Fd1Sa4Qw7Er0Ty-Ui3Op6As9Df2Gh5Jk8Lz1Xc4Vb7Nm0-"
	"bytes-for-the-allocator-test-Rt5Yu8Io1Pa4Sd7Fg0Hj3Kl6Zx9Cv2Bn5Mq8We1";
static const char CONTROL[] = "control-bytes-freed-by-plain-free-K4sQ9wE2rT6yU1iO8pA3dF7gH0jL5zX";

/* through a volatile pointer: the compiler may not drop a malloc/free pair */
static void *(*volatile plain_malloc) (size_t) = malloc;
static void (*volatile plain_free) (void *) = free;

/* true if any writable anonymous mapping (heap, arenas) holds needle */
static int
heap_holds(const char *needle, size_t n)
{
	FILE	   *maps = fopen("/proc/self/maps", "r");
	char		line[512];
	int			found = 0;

	if (!maps)
	{
		printf("FAIL cannot read /proc/self/maps\n");
		exit(1);
	}
	while (!found && fgets(line, sizeof(line), maps))
	{
		unsigned long lo,
					hi;
		char		perms[8];
		char		path[256] = "";

		if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %255s", &lo, &hi, perms, path) < 3)
			continue;
		if (perms[0] != 'r' || perms[1] != 'w')
			continue;
		if (path[0] != '\0' && strcmp(path, "[heap]") != 0)
			continue;
		if (memmem((const void *) lo, hi - lo, needle, n))
			found = 1;
	}
	fclose(maps);
	return found;
}

/* the middle of a secret: far from any allocator's header or free-list links */
#define PART(secret) ((secret) + 40)
#define PART_LEN 48

static void
test_retry_after(void)
{
	time_t		now = 1700000000;
	char		date[64];
	struct tm	tm;
	struct
	{
		const char *v;
		long		want;
	}			cases[] = {
		{"7", 7000}, {" 7\r\n", 7000}, {"\t120 ", 120000}, {"0", 0}, {"3600", 3600000},
		{"3601", 3600000},		/* capped at an hour */
		{"18446744073709552", 3600000},	/* times 1000 wraps a 64-bit long to 384 */
		{"9223372036854775807", 3600000}, {"99999999999999999999999999999999", 3600000},
		{"-5", -1}, {"+5", -1}, {"12abc", -1}, {"1.5", -1}, {"", -1}, {"  \r\n", -1},
		{"soon", -1}, {"0x10", -1},
		{"Sun, 06 Nov 1994 08:49:37 GMT", 0},	/* a date gone by: at once */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
	{
		long		got = push_retry_after_ms(cases[i].v, strlen(cases[i].v), now);

		CHECK(got == cases[i].want, "Retry-After \"%s\": got %ld, want %ld", cases[i].v, got, cases[i].want);
	}
	CHECK(push_retry_after_ms("7\0" "99", 4, now) == -1, "a NUL inside the value is not ignored");
	{
		time_t		at = now + 30;

		gmtime_r(&at, &tm);
		strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
		CHECK(push_retry_after_ms(date, strlen(date), now) == 30000, "Retry-After \"%s\": got %ld, want 30000",
			  date, push_retry_after_ms(date, strlen(date), now));
		at = now + 10L * 365 * 86400;
		gmtime_r(&at, &tm);
		strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
		CHECK(push_retry_after_ms(date, strlen(date), now) == 3600000, "Retry-After \"%s\": got %ld, want 3600000",
			  date, push_retry_after_ms(date, strlen(date), now));
	}
}

static void
test_wipe_allocator(void)
{
	char	   *plain = plain_malloc(sizeof(CONTROL));
	char	   *wiped;
	char	   *moved;

	/* the scan's own check: bytes freed by plain free() are still found */
	memcpy(plain, CONTROL, sizeof(CONTROL));
	plain_free(plain);
	CHECK(heap_holds(CONTROL + 20, 24), "the heap scan does not see bytes freed by free()");

	wiped = push_wipe_malloc(sizeof(WIPE_SECRET));
	memcpy(wiped, WIPE_SECRET, sizeof(WIPE_SECRET));
	CHECK(heap_holds(PART(WIPE_SECRET), PART_LEN), "the heap scan does not see a live block");
	push_wipe_free(wiped);
	CHECK(!heap_holds(PART(WIPE_SECRET), PART_LEN), "push_wipe_free left the block's bytes");

	/* realloc: the old block is wiped when the contents move */
	wiped = push_wipe_malloc(sizeof(WIPE_SECRET));
	memcpy(wiped, WIPE_SECRET, sizeof(WIPE_SECRET));
	moved = push_wipe_realloc(wiped, 1 << 16);
	CHECK(moved && memcmp(moved, WIPE_SECRET, sizeof(WIPE_SECRET)) == 0, "push_wipe_realloc lost the contents");
	push_wipe_free(moved);
	CHECK(!heap_holds(PART(WIPE_SECRET), PART_LEN), "push_wipe_realloc left a copy behind");
}

/* a malloc'd copy for push_request_new, which takes it over */
static char *
token_copy(const char *token)
{
	char	   *t = malloc(strlen(token) + 1);

	memcpy(t, token, strlen(token) + 1);
	return t;
}

static const char NOTIFICATION[] =
	"{\"notification\":{\"event_id\":\"5\",\"room_id\":\"9\",\"type\":\"im.message\",\"prio\":\"high\","
	"\"counts\":{\"unread\":2},\"devices\":[{\"app_id\":\"app\",\"pushkey\":\"\","
	"\"data\":{\"default_payload\":{\"conversation_id\":9,\"msg_seq\":5}}}]}}";

static void
test_request_no_token(void)
{
	char		err[256];
	PushRequest *r;

	CHECK(!heap_holds(PART(TOKEN), PART_LEN), "the token is in the heap before the test");
	r = push_request_new("http://127.0.0.1:9/_matrix/push/v1/notify", 1, 2, NOTIFICATION, token_copy(TOKEN),
						 sizeof(TOKEN) - 1, 1000, err, sizeof(err));
	CHECK(r != NULL, "push_request_new: %s", err);
	if (!r)
		return;
	CHECK(memmem(r->body, r->body_len, TOKEN, sizeof(TOKEN) - 1) != NULL, "the body holds no pushkey");
	push_request_free(r);
	CHECK(!heap_holds(PART(TOKEN), PART_LEN), "a freed request left a token copy in the heap");
}

/* seals SEALED_TOKEN as im_sync does (contract §13); bad_tag flips a tag bit */
static char *
seal(EVP_PKEY *pkey, int bad_tag)
{
	unsigned char aes_key[32];
	unsigned char *der = NULL;
	unsigned char hash[SHA256_DIGEST_LENGTH];
	size_t		wlen = (size_t) EVP_PKEY_get_size(pkey);
	size_t		tlen = sizeof(SEALED_TOKEN) - 1;
	size_t		len = 1 + 8 + wlen + 12 + tlen + 16;
	unsigned char *buf = malloc(len);
	unsigned char *p = buf;
	char	   *out = malloc(4 * ((len + 2) / 3) + 1);
	EVP_PKEY_CTX *pctx = EVP_PKEY_CTX_new(pkey, NULL);
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int			n;
	int			derlen = i2d_PUBKEY(pkey, &der);

	*p++ = 1;
	SHA256(der, (size_t) derlen, hash);
	OPENSSL_free(der);
	memcpy(p, hash, 8);
	p += 8;
	RAND_bytes(aes_key, sizeof(aes_key));
	if (EVP_PKEY_encrypt_init(pctx) <= 0 || EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_OAEP_PADDING) <= 0 ||
		EVP_PKEY_CTX_set_rsa_oaep_md(pctx, EVP_sha256()) <= 0 ||
		EVP_PKEY_CTX_set_rsa_mgf1_md(pctx, EVP_sha256()) <= 0 ||
		EVP_PKEY_encrypt(pctx, p, &wlen, aes_key, sizeof(aes_key)) <= 0)
	{
		printf("FAIL cannot wrap the test key\n");
		exit(1);
	}
	p += wlen;
	RAND_bytes(p, 12);
	if (EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, aes_key, p) != 1 ||
		EVP_EncryptUpdate(ctx, p + 12, &n, (const unsigned char *) SEALED_TOKEN, (int) tlen) != 1 ||
		EVP_EncryptFinal_ex(ctx, p + 12 + n, &n) != 1 ||
		EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, p + 12 + tlen) != 1)
	{
		printf("FAIL cannot seal the test token\n");
		exit(1);
	}
	if (bad_tag)
		p[12 + tlen] ^= 1;
	EVP_CIPHER_CTX_free(ctx);
	EVP_PKEY_CTX_free(pctx);
	OPENSSL_cleanse(aes_key, sizeof(aes_key));
	EVP_EncodeBlock((unsigned char *) out, buf, (int) len);
	free(buf);
	return out;
}

static void
test_unseal_bad_tag(const char *key_path)
{
	char		err[256];
	FILE	   *f = fopen(key_path, "r");
	EVP_PKEY   *pkey = f ? PEM_read_PrivateKey(f, NULL, NULL, NULL) : NULL;
	char	   *good;
	char	   *bad;
	char	   *token = NULL;
	size_t		token_len = 0;

	if (f)
		fclose(f);
	if (!pkey || push_key_load(key_path, err, sizeof(err)) != 0)
	{
		printf("FAIL cannot load %s\n", key_path);
		exit(1);
	}
	good = seal(pkey, 0);
	bad = seal(pkey, 1);
	CHECK(!heap_holds(PART(SEALED_TOKEN), PART_LEN), "sealing left the clear token in the heap");

	CHECK(push_unseal(bad, &token, &token_len, err, sizeof(err)) == -1, "a bad tag opened");
	CHECK(strstr(err, "GCM") != NULL, "unexpected reason: %s", err);
	CHECK(!heap_holds(PART(SEALED_TOKEN), PART_LEN), "a failed tag check left decrypted bytes in the heap");

	CHECK(push_unseal(good, &token, &token_len, err, sizeof(err)) == 0, "a good token did not open: %s", err);
	CHECK(token && token_len == sizeof(SEALED_TOKEN) - 1 && memcmp(token, SEALED_TOKEN, token_len) == 0, "wrong token");
	push_token_free(token, token_len);
	CHECK(!heap_holds(PART(SEALED_TOKEN), PART_LEN), "push_token_free left the token in the heap");
	free(good);
	free(bad);
	EVP_PKEY_free(pkey);
}

/* answers every connection with a redirect to ftp:// */
static void *
redirect_server(void *arg)
{
	int			ls = *(int *) arg;

	for (;;)
	{
		int			c = accept(ls, NULL, NULL);
		char		buf[4096];
		const char *answer = "HTTP/1.1 302 Found\r\nLocation: ftp://127.0.0.1:1/x\r\n"
			"Content-Length: 0\r\nConnection: close\r\n\r\n";

		if (c < 0)
			return NULL;
		if (read(c, buf, sizeof(buf)) > 0 && write(c, answer, strlen(answer)) < 0)
		{
			/* the client went away: nothing to do */
		}
		close(c);
	}
}

static CURLcode
perform(const char *url, int follow, long *status)
{
	char		err[256];
	PushRequest *r = push_request_new(url, 1, 2, NOTIFICATION, token_copy(TOKEN), sizeof(TOKEN) - 1, 2000,
									  err, sizeof(err));
	CURLcode	code;

	if (!r)
	{
		CHECK(0, "push_request_new(%s): %s", url, err);
		return CURLE_FAILED_INIT;
	}
	if (follow)
		curl_easy_setopt(r->easy, CURLOPT_FOLLOWLOCATION, 1L);
	code = curl_easy_perform(r->easy);
	*status = 0;
	curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, status);
	push_request_free(r);
	return code;
}

static void
test_protocols(void)
{
	int			ls = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t	alen = sizeof(a);
	pthread_t	th;
	char		url[64];
	CURLcode	code;
	long		status;

	code = perform("file:///etc/hostname", 0, &status);
	CHECK(code == CURLE_UNSUPPORTED_PROTOCOL, "a file:// URL: %s", curl_easy_strerror(code));
	code = perform("gopher://127.0.0.1:1/", 0, &status);
	CHECK(code == CURLE_UNSUPPORTED_PROTOCOL, "a gopher:// URL: %s", curl_easy_strerror(code));

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(ls, (struct sockaddr *) &a, sizeof(a)) != 0 || listen(ls, 8) != 0 ||
		getsockname(ls, (struct sockaddr *) &a, &alen) != 0 || pthread_create(&th, NULL, redirect_server, &ls) != 0)
	{
		printf("FAIL cannot start the redirect server\n");
		exit(1);
	}
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/_matrix/push/v1/notify", ntohs(a.sin_port));
	/* the relay follows no redirect: the 302 is the answer */
	code = perform(url, 0, &status);
	CHECK(code == CURLE_OK && status == 302, "a redirect: %s, status %ld", curl_easy_strerror(code), status);
	/* and were one followed, never to another scheme */
	code = perform(url, 1, &status);
	CHECK(code == CURLE_UNSUPPORTED_PROTOCOL, "a followed redirect to ftp://: %s", curl_easy_strerror(code));
}

/* what one log call wrote, parsed as one JSON object (NULL if it is not exactly one line of one) */
static json_t *
one_json_line(const char *text)
{
	const char *nl = strchr(text, '\n');

	if (!nl || nl[1] != '\0')
		return NULL;
	return json_loadb(text, (size_t) (nl - text), 0, NULL);
}

/* the relay's check of a claimed job's trace id (start_job): NULL is none */
static int
trace_ok(const char *s)
{
	return s && im_trace_id_ok(s, strlen(s));
}

static void
test_job_log(void)
{
	char	   *buf = NULL;
	size_t		len = 0;
	FILE	   *f;
	json_t	   *o;
	PushJobLog	line = {.event = "sent", .job_id = 9007199254740991LL, .trace_id = "4bf92f3577b34da6a3ce929d0e0e4736",
		.push_target_id = 42, .provider = "fcm", .result = "rate_limited", .http_status = 429,
	.latency_ms = 12.34, .state = "retry", .why = "rate limited"};
	char		h[IM_LOG_HASH_BUF];

	CHECK(im_log_key_random() == 0, "no log key");
	im_hash_push_target(42, h);

	f = open_memstream(&buf, &len);
	im_log_format_set("json");
	im_log_stream_set(f);
	push_log_setup("relay-t");
	push_log_job("info", &line);
	fflush(f);
	o = one_json_line(buf);
	CHECK(o != NULL, "not one JSON line: %s", buf);
	if (o)
	{
		CHECK(json_is_string(json_object_get(o, "ts")), "ts: %s", buf);
		CHECK(strcmp(json_string_value(json_object_get(o, "trace_id")), line.trace_id) == 0, "trace_id: %s", buf);
		CHECK(strcmp(json_string_value(json_object_get(o, "type")), "push") == 0, "type: %s", buf);
		CHECK(json_integer_value(json_object_get(o, "job_id")) == line.job_id, "job_id: %s", buf);
		CHECK(strcmp(json_string_value(json_object_get(o, "provider")), "fcm") == 0, "provider: %s", buf);
		CHECK(strcmp(json_string_value(json_object_get(o, "result")), "rate_limited") == 0, "result: %s", buf);
		CHECK(json_integer_value(json_object_get(o, "http_status")) == 429, "http_status: %s", buf);
		CHECK(json_is_number(json_object_get(o, "latency_ms")), "latency_ms: %s", buf);
		CHECK(strcmp(json_string_value(json_object_get(o, "target")), h) == 0, "target: %s", buf);
		CHECK(strcmp(json_string_value(json_object_get(o, "relay")), "relay-t") == 0, "relay: %s", buf);
		json_decref(o);
	}
	fclose(f);
	free(buf);

	/* no trace id: null; no HTTP answer: no http_status */
	buf = NULL;
	f = open_memstream(&buf, &len);
	im_log_stream_set(f);
	line.trace_id = NULL;
	line.http_status = 0;
	push_log_job("info", &line);
	fflush(f);
	o = one_json_line(buf);
	CHECK(o && json_is_null(json_object_get(o, "trace_id")) && !json_object_get(o, "http_status"), "%s", buf);
	json_decref(o);
	fclose(f);
	free(buf);

	/*
	 * a line not about a job: its key=value pairs are members (numbers as
	 * numbers); a database error with a newline and quotes: still one JSON
	 * line, the reason whole
	 */
	buf = NULL;
	f = open_memstream(&buf, &len);
	im_log_stream_set(f);
	relay_log("warning", "event=claim_failed reason=\"%s\"", "ERROR:  \"x\"\nDETAIL:  y");
	fflush(f);
	o = one_json_line(buf);
	CHECK(o && strcmp(json_string_value(json_object_get(o, "event")), "claim_failed") == 0, "%s", buf);
	CHECK(o && json_is_string(json_object_get(o, "reason")) &&
		  strcmp(json_string_value(json_object_get(o, "reason")), "ERROR:  \"x\"\nDETAIL:  y") == 0, "reason: %s", buf);
	CHECK(o && strcmp(json_string_value(json_object_get(o, "relay")), "relay-t") == 0 &&
		  !json_object_get(o, "detail"), "relay, no detail: %s", buf);
	json_decref(o);
	fclose(f);
	free(buf);

	buf = NULL;
	f = open_memstream(&buf, &len);
	im_log_stream_set(f);
	relay_log("info", "event=start url_keys=%d concurrency=%d lease_s=%d", 2, 8, 30);
	relay_log("info", "event=node_added node=%s", "n\xff" "1");
	fflush(f);
	{
		char	   *second = buf ? strchr(buf, '\n') : NULL;

		if (second)
			*second++ = '\0';
		o = second ? json_loads(buf, 0, NULL) : NULL;
		CHECK(o && json_integer_value(json_object_get(o, "url_keys")) == 2 &&
			  json_integer_value(json_object_get(o, "concurrency")) == 8 &&
			  json_integer_value(json_object_get(o, "lease_s")) == 30 &&
			  strcmp(json_string_value(json_object_get(o, "event")), "start") == 0 &&
			  strcmp(json_string_value(json_object_get(o, "level")), "info") == 0, "start: %s", buf);
		json_decref(o);
		/* not UTF-8: the member is kept, the byte shown as '?' */
		o = second ? one_json_line(second) : NULL;
		CHECK(o && json_is_string(json_object_get(o, "node")) &&
			  strcmp(json_string_value(json_object_get(o, "node")), "n?1") == 0, "node: %s", second ? second : "");
		json_decref(o);
	}
	fclose(f);
	free(buf);

	/* text: the trace id on the line, trace_id=- without one */
	buf = NULL;
	f = open_memstream(&buf, &len);
	im_log_format_set("text");
	im_log_stream_set(f);
	line.trace_id = "client-trace_1";
	push_log_job("info", &line);
	line.trace_id = NULL;
	push_log_job("info", &line);
	fflush(f);
	CHECK(strstr(buf, " event=sent job=9007199254740991 trace_id=client-trace_1 target=") != NULL, "%s", buf);
	CHECK(strstr(buf, " trace_id=- ") != NULL, "%s", buf);
	CHECK(strncmp(buf, "ts=", 3) == 0 && strstr(buf, "Z level=info relay=relay-t event=sent ") != NULL, "%s", buf);
	fclose(f);
	free(buf);
	im_log_stream_set(NULL);
	push_log_setup("");

	/* im_sync/trace_id.h, as the relay calls it on a claimed job's trace id */
	CHECK(trace_ok("4bf92f3577b34da6a3ce929d0e0e4736"), "a W3C trace id");
	CHECK(trace_ok("a-b_C9"), "a client trace id");
	CHECK(!trace_ok(""), "empty");
	CHECK(!trace_ok(NULL), "NULL");
	CHECK(!trace_ok("a b"), "a space");
	CHECK(!trace_ok("x\" y=z"), "a quote");
	CHECK(!trace_ok("\xc3\xa9"), "non-ASCII");
	CHECK(trace_ok("0123456789012345678901234567890123456789012345678901234567890123"), "64 characters");
	CHECK(!trace_ok("01234567890123456789012345678901234567890123456789012345678901234"), "65 characters");
	CHECK(!im_trace_id_ok(NULL, 0), "NULL, length 0");
	CHECK(!im_trace_id_ok("ab\0cd", 5), "a NUL inside");
	CHECK(im_trace_id_ok("abcdef", 3), "a prefix of a longer string");
}

int
main(int argc, char **argv)
{
	char		err[256];
	const char *key_path = argc > 1 ? argv[1] : "../test/push/relay_key.pem";

	if (push_wipe_install(err, sizeof(err)) != 0)
	{
		printf("FAIL push_wipe_install: %s\n", err);
		return 1;
	}
	test_retry_after();
	test_wipe_allocator();
	test_request_no_token();
	test_unseal_bad_tag(key_path);
	test_job_log();
	/* last: its thread gets a malloc arena of its own */
	test_protocols();
	if (failures)
	{
		printf("test_push_relay: %d failures\n", failures);
		return 1;
	}
	printf("test_push_relay: retry_after wipe_allocator request_no_token unseal_bad_tag job_log protocols: ok\n");
	return 0;
}
