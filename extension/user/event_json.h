/*
 * event_json.h — a page of contract §11 events built as one jsonb in C,
 * with the exact length of its JSON text (event_json.c; sync.c reads pages
 * with it).
 */
#ifndef IM_EVENT_JSON_H
#define IM_EVENT_JSON_H

#include "lib/stringinfo.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/* The columns of an im.event row that make its §11 object. */
typedef struct ImEventRow
{
	char	   *kind;
	int64		conversation_id;
	int64		msg_seq;
	int64		message_id;
	bool		has_sender;
	int64		sender_id;
	char	   *content_type;	/* NULL → JSON null */
	Jsonb	   *body;			/* NULL → JSON null */
	bool		has_target;
	int64		target_message_id;
	bool		recalled;
	TimestampTz created_at;
	/* issue 11 (contract §14): a message carries reply_to_message_id (NULL
	 * when none) once the catalog has relations (relation_keys) */
	bool		relation_keys;
	bool		has_reply;
	int64		reply_to_message_id;
} ImEventRow;

/* The keys of a §11 object in `events` (IM_EVENT_JSON_SQL + sync_seq), at
 * most: reply_to_message_id only on messages. */
#define IM_EVENT_KEYS 12

/* One §11 object, converted and measured, ready to be added to a page. */
typedef struct ImEventJson
{
	JsonbValue	values[IM_EVENT_KEYS];
	int			nkeys;			/* the first nkeys of the key list */
	int64		text_bytes;		/* its JSON text, as jsonb_out prints it */
} ImEventJson;

typedef struct ImEventPage
{
	JsonbParseState *state;
	StringInfoData scratch;		/* the text of one value, to measure it */
	int64		text_bytes;		/* JSON text of the elements so far */
	int			n;
} ImEventPage;

extern void im_event_page_begin(ImEventPage *page);

/*
 * Length of the page's JSON text with one more element of `element_bytes`:
 * "[" e1 ", " e2 … "]", every element brings its text and 2 bytes (the same
 * measure as IM_PAGE_BYTES_SQL).  Compared with im_sync.max_page_bytes.
 */
static inline int64
im_event_page_bytes_with(const ImEventPage *page, int64 element_bytes)
{
	return page->text_bytes + element_bytes + 2;
}

/* The §11 object of `ev` with `sync_seq` added, and its text length. */
extern void im_event_json_make(ImEventPage *page, const ImEventRow *ev,
							   int64 sync_seq, ImEventJson *out);

/* Text length of a jsonb value as jsonb_out prints it. */
extern int64 im_jsonb_text_bytes(ImEventPage *page, Jsonb *value);

extern void im_event_page_add_event(ImEventPage *page, const ImEventJson *ev);
extern void im_event_page_add_jsonb(ImEventPage *page, Jsonb *element,
									int64 element_bytes);

/* The page as a jsonb array, in CurrentMemoryContext. */
extern Jsonb *im_event_page_finish(ImEventPage *page);

#endif							/* IM_EVENT_JSON_H */
