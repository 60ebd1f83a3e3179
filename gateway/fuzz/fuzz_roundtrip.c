/*
 * fuzz_roundtrip.c — libFuzzer target over the JSON round trip of message
 * bodies (exact numbers): frame -> statement parameter -> (PostgreSQL's
 * reading of the body) -> reply splice.  For any input that is a JSON
 * value, checks that
 *  - a send frame carrying it as body (when it is an object) decodes with
 *    the frame text itself as the body parameter, and the body read back
 *    from that parameter equals the input;
 *  - the input text (as PostgreSQL would print a jsonb value) and jansson's
 *    own printing of it, spliced into reply objects and row arrays, give
 *    valid JSON whose spliced member equals the input, next to intact
 *    scalar members.
 */
#include "server/frame.h"
#include "server/db/json_splice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOAD_FLAGS (JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY)

static json_t *
must_parse(const char *text)
{
	json_error_t e;
	json_t	   *v = json_loadb(text, strlen(text), LOAD_FLAGS, &e);

	if (!v)
	{
		fprintf(stderr, "spliced reply is not JSON (%s): %.200s\n", e.text, text);
		abort();
	}
	return v;
}

/* Splices text as "events" into {"type":…,"id":…,"status":"OK"} and checks. */
static void
check_splice(const char *text, const json_t *want)
{
	json_t	   *o = json_object();
	im_raw_member raw[2];
	char	   *rows[2];
	char	   *reply,
			   *arr;
	json_t	   *back;

	json_object_set_new(o, "type", json_string("sync_result"));
	json_object_set_new(o, "id", json_integer(7));
	json_object_set_new(o, "status", json_string("OK"));
	raw[0].name = "events";
	raw[0].text = text;
	raw[0].len = strlen(text);
	rows[0] = rows[1] = (char *) text;
	arr = im_json_array_of_texts(rows, 2);
	raw[1].name = "rows";
	raw[1].text = arr;
	raw[1].len = strlen(arr);
	reply = im_json_splice(o, raw, 2);
	back = must_parse(reply);
	if (json_object_size(back) != 5 ||
		!json_equal(json_object_get(back, "events"), (json_t *) want) ||
		json_array_size(json_object_get(back, "rows")) != 2 ||
		!json_equal(json_array_get(json_object_get(back, "rows"), 0), (json_t *) want) ||
		!json_equal(json_array_get(json_object_get(back, "rows"), 1), (json_t *) want) ||
		json_integer_value(json_object_get(back, "id")) != 7 ||
		strcmp(json_string_value(json_object_get(back, "status")), "OK") != 0)
		abort();
	json_decref(back);
	free(reply);
	free(arr);
	/* an empty object as the base: no stray comma */
	json_object_clear(o);
	reply = im_json_splice(o, raw, 1);
	back = must_parse(reply);
	if (json_object_size(back) != 1 || !json_equal(json_object_get(back, "events"), (json_t *) want))
		abort();
	json_decref(back);
	free(reply);
	json_decref(o);
}

static void
check_send_frame(const uint8_t *data, size_t size, const json_t *want)
{
	static const char head[] = "{\"type\":\"send\",\"conversation_id\":1,\"client_msg_id\":\"c\",\"body\":";
	size_t		n = sizeof(head) - 1 + size + 1;
	char	   *frame = malloc(n + 1);
	im_request	req;
	im_decode_status st;

	memcpy(frame, head, sizeof(head) - 1);
	memcpy(frame + sizeof(head) - 1, data, size);
	frame[n - 1] = '}';
	frame[n] = '\0';
	st = im_decode_frame(frame, n, 42, "phone-1", &req);
	if (st == IM_DECODE_OK)
	{
		json_t	   *f;

		/* the body parameter is the frame text, unchanged */
		if (req.op != IM_OP_SEND || req.nparams < 4 || strcmp(req.params[3], frame) != 0)
			abort();
		/* what PostgreSQL's ($4::jsonb)->'body' reads from it */
		f = must_parse(req.params[3]);
		if (!json_equal(json_object_get(f, "body"), (json_t *) want))
			abort();
		json_decref(f);
	}
	else if (st == IM_DECODE_FORBIDDEN)
		abort();				/* the frame names nobody */
	im_request_free(&req);
	free(frame);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_error_t e;
	json_t	   *v;
	char	   *text,
			   *printed;

	if (memchr(data, '\0', size))
		return 0;				/* never a JSON text (nor a frame) */
	v = json_loadb((const char *) data, size, LOAD_FLAGS, &e);
	if (!v)
		return 0;
	text = malloc(size + 1);
	memcpy(text, data, size);
	text[size] = '\0';
	check_splice(text, v);
	printed = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
	if (printed)
	{
		check_splice(printed, v);
		free(printed);
	}
	if (json_is_object(v))
		check_send_frame(data, size, v);
	free(text);
	json_decref(v);
	return 0;
}
