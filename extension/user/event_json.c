/*
 * event_json.c — the position objects of contract §11 as one jsonb page,
 * built in C, and the exact length of its JSON text: the one builder of
 * the events of a sync page (sync.c) and of a fetch_messages page
 * (history.c), which differ only in their optional keys (sync_seq; a
 * message's reactions and my_reactions).
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
#include "core/common.h"
#include "core/im_sql.h"
#include "core/version_check.h"
#include "conversation/conversation.h"
#include "user/user.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/numeric.h"

/*
 * The keys: the im.event columns of IM_EVENT_COLUMN_KEYS (in the order
 * IM_EVENT_COLUMNS_SQL selects them), then the optional ones.  jsonb sorts
 * an object's keys, so the order here changes nothing in the output.
 */
#define KEY_INDEX(column) K_##column
#define KEY_NAME(column) [K_##column] = #column
#define COMMA ,

enum
{
	IM_EVENT_COLUMN_KEYS(KEY_INDEX, COMMA),
	K_taken_down,
	K_erased,
	K_sync_seq,
	K_reply_to_message_id,
	K_reactions,
	K_my_reactions,
	K_count
};

StaticAssertDecl(K_count == IM_EVENT_KEYS, "IM_EVENT_KEYS counts the keys of a position object");
StaticAssertDecl(K_taken_down + 3 == IM_EVENT_COLUMNS,
				 "IM_EVENT_COLUMNS counts IM_EVENT_COLUMN_KEYS and the three relation columns");

static const char *const event_keys[IM_EVENT_KEYS] = {
	IM_EVENT_COLUMN_KEYS(KEY_NAME, COMMA),
	[K_taken_down] = "taken_down",
	[K_erased] = "erased",
	[K_sync_seq] = "sync_seq",
	[K_reply_to_message_id] = "reply_to_message_id",
	[K_reactions] = "reactions",
	[K_my_reactions] = "my_reactions",
};

/* Offsets of the columns of IM_EVENT_COLUMNS_SQL after its first. */
enum
{
	C_kind = 0,
	C_conversation_id,
	C_msg_seq,
	C_message_id,
	C_sender_id,
	C_content_type,
	C_body,
	C_target_message_id,
	C_recalled,
	C_created_at,
	C_reply_to_message_id,
	C_pin_message_id,
	C_taken_down,
	C_count
};

StaticAssertDecl(C_count == IM_EVENT_COLUMNS, "C_* name every column of IM_EVENT_COLUMNS_SQL");

static Datum
column(uint64 row, int col, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, isnull);
}

bool
im_event_row_read(uint64 row, int first_col, ImEventRow *ev)
{
	bool		isnull;
	Datum		d;

	ev->message_id = im_get_int64(row, first_col + C_message_id, &isnull);
	if (isnull)
		return false;
	ev->kind = TextDatumGetCString(column(row, first_col + C_kind, &isnull));
	ev->conversation_id = im_get_int64(row, first_col + C_conversation_id, NULL);
	ev->msg_seq = im_get_int64(row, first_col + C_msg_seq, NULL);
	ev->sender_id = im_get_int64(row, first_col + C_sender_id, &isnull);
	ev->has_sender = !isnull;
	d = column(row, first_col + C_content_type, &isnull);
	ev->content_type = isnull ? NULL : TextDatumGetCString(d);
	d = column(row, first_col + C_body, &isnull);
	ev->body = isnull ? NULL : DatumGetJsonbP(d);
	ev->target_message_id = im_get_int64(row, first_col + C_target_message_id, &isnull);
	ev->has_target = !isnull;
	ev->recalled = im_get_bool(row, first_col + C_recalled, NULL);
	ev->taken_down = im_get_bool(row, first_col + C_taken_down, NULL);
	ev->takedown_keys = IM_CATALOG_HAS_TAKEDOWN();
	ev->created_at = DatumGetTimestampTz(column(row, first_col + C_created_at, &isnull));
	/* a message's reply key; a pin's target is its pinned message */
	ev->relation_keys = im_relation_catalog();
	ev->reply_to_message_id = im_get_int64(row, first_col + C_reply_to_message_id, &isnull);
	ev->has_reply = !isnull;
	if (strcmp(ev->kind, "pin") == 0)
	{
		ev->target_message_id = im_get_int64(row, first_col + C_pin_message_id, &isnull);
		ev->has_target = !isnull;
	}
	ev->has_sync_seq = false;
	ev->reactions = NULL;
	ev->my_reactions = NULL;
	return true;
}

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
set_bool(JsonbValue *v, bool b)
{
	v->type = jbvBool;
	v->val.boolean = b;
	return b ? 4 : 5;			/* true / false */
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

/* A nested jsonb value, measured by printing it as jsonb_out does. */
static int64
set_jsonb(ImEventPage *page, JsonbValue *v, Jsonb *value)
{
	/* pushJsonbValue unpacks a binary value into the page */
	v->type = jbvBinary;
	v->val.binary.data = &value->root;
	v->val.binary.len = VARSIZE(value) - VARHDRSZ;
	return im_jsonb_text_bytes(page, value);
}

void
im_event_json_make(ImEventPage *page, const ImEventRow *ev, ImEventJson *out)
{
	JsonbValue *v = out->values;
	bool		message = strcmp(ev->kind, "message") == 0;
	int			n = 0;
	int64		bytes;

/* the next key's value goes into v[n]; its name is event_keys[key] */
#define NEXT(key) (out->keys[n] = (key), &v[n++])

	bytes = set_string(page, NEXT(K_kind), ev->kind);
	bytes += set_int(NEXT(K_conversation_id), ev->conversation_id);
	bytes += set_int(NEXT(K_msg_seq), ev->msg_seq);
	bytes += set_int(NEXT(K_message_id), ev->message_id);
	bytes += ev->has_sender ? set_int(NEXT(K_sender_id), ev->sender_id) : set_null(NEXT(K_sender_id));
	bytes += ev->content_type ? set_string(page, NEXT(K_content_type), ev->content_type) :
		set_null(NEXT(K_content_type));
	bytes += ev->body ? set_jsonb(page, NEXT(K_body), ev->body) : set_null(NEXT(K_body));
	bytes += ev->has_target ? set_int(NEXT(K_target_message_id), ev->target_message_id) :
		set_null(NEXT(K_target_message_id));
	/*
	 * contract §17: a takedown's tombstone is recalled in the column (every
	 * tombstone rule applies) but shown as taken_down, not recalled; erased
	 * (contract §18) is false until erasure sets it; an older catalog's
	 * objects have neither key, as its release answered
	 */
	bytes += set_bool(NEXT(K_recalled), ev->recalled && !ev->taken_down);
	if (ev->takedown_keys)
	{
		bytes += set_bool(NEXT(K_taken_down), ev->taken_down);
		bytes += set_bool(NEXT(K_erased), false);
	}
	/* as jsonb_build_object converts a timestamptz */
	bytes += set_string(page, NEXT(K_created_at),
						JsonEncodeDateTime(NULL, TimestampTzGetDatum(ev->created_at),
										   TIMESTAMPTZOID, NULL));
	if (ev->has_sync_seq)
		bytes += set_int(NEXT(K_sync_seq), ev->sync_seq);
	if (ev->relation_keys && message)
		bytes += ev->has_reply ? set_int(NEXT(K_reply_to_message_id), ev->reply_to_message_id) :
			set_null(NEXT(K_reply_to_message_id));
	if (ev->reactions && ev->my_reactions && message)
	{
		bytes += set_jsonb(page, NEXT(K_reactions), ev->reactions);
		bytes += set_jsonb(page, NEXT(K_my_reactions), ev->my_reactions);
	}
#undef NEXT

	/* "{" + "}" and ", " between the pairs */
	bytes += 2 + 2 * (n - 1);
	/* every key is plain ASCII: its text is the name in quotes, then ": " */
	for (int k = 0; k < n; k++)
		bytes += strlen(event_keys[out->keys[k]]) + 2 + 2;
	out->nkeys = n;
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
		key.val.string.val = unconstify(char *, event_keys[ev->keys[k]]);
		key.val.string.len = strlen(event_keys[ev->keys[k]]);
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
