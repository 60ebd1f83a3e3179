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
#include "core/im_sync.h"
#include "core/im_sql.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/numeric.h"

/*
 * Keys in the order of ImEventJson.values: the im.event columns of
 * IM_EVENT_COLUMN_KEYS (the same list fetch_messages' SQL uses), then
 * sync_seq, then reply_to_message_id (last: only messages have it).
 */
#define KEY_INDEX(column) K_##column
#define KEY_NAME(column) [K_##column] = #column
#define COMMA ,

enum
{
	IM_EVENT_COLUMN_KEYS(KEY_INDEX, COMMA),
	K_sync_seq,
	K_reply_to_message_id,
	K_count
};

StaticAssertDecl(K_count == IM_EVENT_KEYS, "IM_EVENT_KEYS counts the keys of a sync event");

static const char *const event_keys[IM_EVENT_KEYS] = {
	IM_EVENT_COLUMN_KEYS(KEY_NAME, COMMA),
	[K_sync_seq] = "sync_seq",
	[K_reply_to_message_id] = "reply_to_message_id",
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

	bytes += set_string(page, &v[K_kind], ev->kind);
	bytes += set_int(&v[K_conversation_id], ev->conversation_id);
	bytes += set_int(&v[K_msg_seq], ev->msg_seq);
	bytes += set_int(&v[K_message_id], ev->message_id);
	bytes += ev->has_sender ? set_int(&v[K_sender_id], ev->sender_id) : set_null(&v[K_sender_id]);
	bytes += ev->content_type ? set_string(page, &v[K_content_type], ev->content_type) :
		set_null(&v[K_content_type]);
	if (ev->body)
	{
		/* pushJsonbValue unpacks a binary value into the page */
		v[K_body].type = jbvBinary;
		v[K_body].val.binary.data = &ev->body->root;
		v[K_body].val.binary.len = VARSIZE(ev->body) - VARHDRSZ;
		bytes += im_jsonb_text_bytes(page, ev->body);
	}
	else
		bytes += set_null(&v[K_body]);
	bytes += ev->has_target ? set_int(&v[K_target_message_id], ev->target_message_id) :
		set_null(&v[K_target_message_id]);
	v[K_recalled].type = jbvBool;
	v[K_recalled].val.boolean = ev->recalled;
	bytes += ev->recalled ? 4 : 5;	/* true / false */
	/* as jsonb_build_object converts a timestamptz */
	bytes += set_string(page, &v[K_created_at],
						JsonEncodeDateTime(NULL, TimestampTzGetDatum(ev->created_at),
										   TIMESTAMPTZOID, NULL));
	bytes += set_int(&v[K_sync_seq], sync_seq);
	if (nkeys > K_reply_to_message_id)
		bytes += ev->has_reply ? set_int(&v[K_reply_to_message_id], ev->reply_to_message_id) :
			set_null(&v[K_reply_to_message_id]);

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
