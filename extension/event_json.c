/*
 * event_json.c — the events of a sync page (contract §11) as one jsonb,
 * built in C, and the exact length of its JSON text.
 *
 * Why in C: a page built in SQL pays jsonb_build_object per event (every
 * bigint printed and parsed back into a numeric), a deep copy of every
 * object into jsonb_agg, and — for the im_sync.max_page_bytes cut — a full
 * jsonb → text conversion of every event on top of the one the client's
 * output does.  Here every value is converted once, the objects go straight
 * into the page's one parse state, and the text length is summed from the
 * parts.
 *
 * Invariant protected: im_event_json_make's text_bytes equals the length of
 * the object's text as jsonb_out prints it, so a page ends exactly before
 * the event that would push its text over im_sync.max_page_bytes (contract
 * §5; sql/56_page_bytes checks that every cut page is full).  Strings,
 * timestamps and nested jsonb are measured by printing them with
 * PostgreSQL's own escape_json / JsonbToCString; only the object layout is
 * counted here: "{" "\"key\": value" joined by ", " "}" — jsonb's
 * non-indented output (JsonbToCStringWorker) — and integers, which a numeric
 * without a scale prints as its decimal digits.  Assert builds compare the
 * sum with the printed page.
 */
#include "im_sync.h"
#include "event_json.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/numeric.h"

/* Key names, in the order of ImEventJson.values (§11 plus sync_seq). */
enum
{
	K_KIND,
	K_CONVERSATION_ID,
	K_MSG_SEQ,
	K_MESSAGE_ID,
	K_SENDER_ID,
	K_CONTENT_TYPE,
	K_BODY,
	K_TARGET_MESSAGE_ID,
	K_RECALLED,
	K_CREATED_AT,
	K_SYNC_SEQ,
	K_REPLY_TO_MESSAGE_ID		/* last: only messages have it */
};

static const char *const event_keys[IM_EVENT_KEYS] = {
	[K_KIND] = "kind",
	[K_CONVERSATION_ID] = "conversation_id",
	[K_MSG_SEQ] = "msg_seq",
	[K_MESSAGE_ID] = "message_id",
	[K_SENDER_ID] = "sender_id",
	[K_CONTENT_TYPE] = "content_type",
	[K_BODY] = "body",
	[K_TARGET_MESSAGE_ID] = "target_message_id",
	[K_RECALLED] = "recalled",
	[K_CREATED_AT] = "created_at",
	[K_SYNC_SEQ] = "sync_seq",
	[K_REPLY_TO_MESSAGE_ID] = "reply_to_message_id",
};

void
im_event_page_begin(ImEventPage *page)
{
	page->state = NULL;
	initStringInfo(&page->scratch);
	page->text_bytes = 0;
	page->n = 0;
	pushJsonbValue(&page->state, WJB_BEGIN_ARRAY, NULL);
}

static int64
set_null(JsonbValue *v)
{
	v->type = jbvNull;
	return 4;					/* null */
}

static int64
set_int(JsonbValue *v, int64 x)
{
	char		digits[MAXINT8LEN + 1];

	v->type = jbvNumeric;
	v->val.numeric = int64_to_numeric(x);
	return pg_lltoa(x, digits);
}

/* A string value; its length is measured by printing it as jsonb_out does. */
static int64
set_string(ImEventPage *page, JsonbValue *v, char *s)
{
	size_t		len = strlen(s);

	if (len > JENTRY_OFFLENMASK)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("string too long to represent as jsonb string")));
	v->type = jbvString;
	v->val.string.val = s;
	v->val.string.len = (int) len;
	resetStringInfo(&page->scratch);
	escape_json(&page->scratch, s);
	return page->scratch.len;
}

int64
im_jsonb_text_bytes(ImEventPage *page, Jsonb *value)
{
	resetStringInfo(&page->scratch);
	JsonbToCString(&page->scratch, &value->root, VARSIZE(value));
	return page->scratch.len;
}

void
im_event_json_make(ImEventPage *page, const ImEventRow *ev, int64 sync_seq,
				   ImEventJson *out)
{
	JsonbValue *v = out->values;
	int			nkeys = (ev->relation_keys && strcmp(ev->kind, "message") == 0) ?
		IM_EVENT_KEYS : IM_EVENT_KEYS - 1;
	/* "{" + "}" and ", " between the pairs */
	int64		bytes = 2 + 2 * (nkeys - 1);

	bytes += set_string(page, &v[K_KIND], ev->kind);
	bytes += set_int(&v[K_CONVERSATION_ID], ev->conversation_id);
	bytes += set_int(&v[K_MSG_SEQ], ev->msg_seq);
	bytes += set_int(&v[K_MESSAGE_ID], ev->message_id);
	bytes += ev->has_sender ? set_int(&v[K_SENDER_ID], ev->sender_id) : set_null(&v[K_SENDER_ID]);
	bytes += ev->content_type ? set_string(page, &v[K_CONTENT_TYPE], ev->content_type) :
		set_null(&v[K_CONTENT_TYPE]);
	if (ev->body)
	{
		/* pushJsonbValue unpacks a binary value into the page */
		v[K_BODY].type = jbvBinary;
		v[K_BODY].val.binary.data = &ev->body->root;
		v[K_BODY].val.binary.len = VARSIZE(ev->body) - VARHDRSZ;
		bytes += im_jsonb_text_bytes(page, ev->body);
	}
	else
		bytes += set_null(&v[K_BODY]);
	bytes += ev->has_target ? set_int(&v[K_TARGET_MESSAGE_ID], ev->target_message_id) :
		set_null(&v[K_TARGET_MESSAGE_ID]);
	v[K_RECALLED].type = jbvBool;
	v[K_RECALLED].val.boolean = ev->recalled;
	bytes += ev->recalled ? 4 : 5;	/* true / false */
	/* as jsonb_build_object converts a timestamptz */
	bytes += set_string(page, &v[K_CREATED_AT],
						JsonEncodeDateTime(NULL, TimestampTzGetDatum(ev->created_at),
										   TIMESTAMPTZOID, NULL));
	bytes += set_int(&v[K_SYNC_SEQ], sync_seq);
	if (nkeys > K_REPLY_TO_MESSAGE_ID)
		bytes += ev->has_reply ? set_int(&v[K_REPLY_TO_MESSAGE_ID], ev->reply_to_message_id) :
			set_null(&v[K_REPLY_TO_MESSAGE_ID]);

	/* every key is plain ASCII: its text is the name in quotes, then ": " */
	for (int k = 0; k < nkeys; k++)
		bytes += strlen(event_keys[k]) + 2 + 2;
	out->nkeys = nkeys;
	out->text_bytes = bytes;
}

void
im_event_page_add_event(ImEventPage *page, const ImEventJson *ev)
{
	pushJsonbValue(&page->state, WJB_BEGIN_OBJECT, NULL);
	for (int k = 0; k < ev->nkeys; k++)
	{
		JsonbValue	key;

		key.type = jbvString;
		key.val.string.val = unconstify(char *, event_keys[k]);
		key.val.string.len = strlen(event_keys[k]);
		pushJsonbValue(&page->state, WJB_KEY, &key);
		pushJsonbValue(&page->state, WJB_VALUE, unconstify(JsonbValue *, &ev->values[k]));
	}
	pushJsonbValue(&page->state, WJB_END_OBJECT, NULL);
	page->text_bytes += ev->text_bytes + 2;
	page->n++;
}

void
im_event_page_add_jsonb(ImEventPage *page, Jsonb *element, int64 element_bytes)
{
	JsonbValue	v;

	v.type = jbvBinary;
	v.val.binary.data = &element->root;
	v.val.binary.len = VARSIZE(element) - VARHDRSZ;
	pushJsonbValue(&page->state, WJB_ELEM, &v);
	page->text_bytes += element_bytes + 2;
	page->n++;
}

Jsonb *
im_event_page_finish(ImEventPage *page)
{
	Jsonb	   *res = JsonbValueToJsonb(pushJsonbValue(&page->state, WJB_END_ARRAY, NULL));

	/* the measure the byte cut relies on is the printed length */
	Assert(page->n == 0 ||
		   (int64) strlen(JsonbToCString(NULL, &res->root, VARSIZE(res))) == page->text_bytes);
	pfree(page->scratch.data);
	return res;
}
