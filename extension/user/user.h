/*
 * user.h — the user side's cross-file API (extension/user/): device state
 * (device_state.c; the device row lock is core/locks.h's), signed tokens
 * (token.c), the private events of read state (read_state.c) and sync
 * pages built in C (event_json.c).  Sync, snapshots and history (sync.c, snapshot.c,
 * history.c) export only SQL functions.
 */
#ifndef IM_USER_H
#define IM_USER_H

#include "core/im_sync.h"
#include "core/locks.h"
#include "datatype/timestamp.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/*
 * the one owner of a device's sync state (device_state.c):
 * its generation, its GC leases and its last-seen time
 * (user side).
 */

/*
 * Generation + 1 (kills every older token of the device) and new_state;
 * touches the device.  Caller holds the row lock; dev is updated in place.
 */
extern void im_device_bump_generation(ImDevice *dev, const char *new_state);
/* issued_sync_seq = max(issued, watermark): what was ever given to it. */
extern void im_device_note_issued(ImDevice *dev, int64 watermark);
/*
 * End the device's ACTIVE recovery sessions with `how` (ENDED when replaced
 * or revoked, EXPIRED when the lease ran out): releases their GC leases.
 */
extern void im_device_end_recovery_sessions(int64 user_id, const char *device_id,
											const char *how);
/*
 * End every lease the device holds on the log (contract §8): its active
 * recovery sessions (ENDED) and its unfinished snapshots (ABANDONED), which
 * can never be used once the generation moved or the device is revoked.
 */
extern void im_device_end_leases(int64 user_id, const char *device_id);
/* last_seen_at = now (the inactivity rule of the GC fence reads it). */
extern void im_device_touch(int64 user_id, const char *device_id);
/*
 * The same, unless last_seen_at is already within the last second: then
 * nothing is written, so a read that touches many times a second (sync
 * cursor pages) needs no WAL flush at commit.  The fence's inactivity
 * window is im_sync.device_inactive_after (30 days by default).
 */
extern void im_device_touch_coarse(int64 user_id, const char *device_id);
/*
 * NOTIFY im_sync_device 'user:device:epoch:what' (REVOKED, SUPERSEDED,
 * SUSPENDED), delivered at commit (device.c).
 */
extern void im_device_notify(int64 user_id, const char *device_id, int64 epoch, const char *what);

/*
 * signed tokens and the key ring (token.c).
 */

/*
 * Batch tokens, page cursors, snapshot tokens and device tokens are all
 * "claims + key id + HMAC-SHA256" (PostgreSQL common/hmac.h), base64url.
 * Fields a purpose does not use are 0 / empty.
 */
typedef enum ImTokenPurpose
{
	IM_TOKEN_DEVICE = 'D',		/* issue_device_token / authenticate */
	IM_TOKEN_BATCH = 'B',		/* sync_changes batch_token */
	IM_TOKEN_CURSOR = 'C',		/* sync_changes next_cursor */
	IM_TOKEN_SNAPSHOT = 'S'		/* begin_snapshot snapshot_token */
} ImTokenPurpose;

typedef struct ImTokenClaims
{
	char		purpose;		/* ImTokenPurpose */
	int64		user_id;
	char		device_id[65];
	int32		registration;	/* device registration the token was issued to */
	int32		sync_generation;
	int64		resume_from;
	int64		watermark;		/* batch high watermark / snapshot base */
	int64		recovery_session_id;	/* 0 when none */
	int64		position;		/* cursor: last sync_seq returned */
	int64		snapshot_id;
	TimestampTz issued_at;
	TimestampTz expires_at;
} ImTokenClaims;

/* Sign claims with the newest key (created on first use); palloc'd text. */
extern char *im_token_sign(const ImTokenClaims *claims);
/*
 * Sign n claims (no device tokens) with the newest key, read once: a sync
 * page's batch token and cursor.  out[i] is the token of claims[i].
 */
extern void im_token_sign_several(const ImTokenClaims *claims, int n, char **out);
/*
 * Verify format, key and signature (constant time) and the purpose.
 * Returns false for anything malformed, unknown key or bad signature
 * (INVALID_TOKEN).  Expiry is NOT checked here: callers check the
 * contract's order (user/device, revoked, generation, expiry).
 */
extern bool im_token_verify(const char *token, char purpose, ImTokenClaims *out);
/*
 * Key ring maintenance (contract §8) in the caller's transaction: rotate an
 * over-age newest key, retire superseded keys no live token needs.
 * Returns the number retired; *rotated: a new key was made.
 */
extern int	im_token_keys_maintain(bool *rotated);

/*
 * How a token issued to an earlier registration of the device reads
 * (extension/doc/decisions.md): a sync batch token or cursor of an earlier registration is
 * STALE_GENERATION (the device may sync again at once), a snapshot token
 * DEVICE_REVOKED (it was revoked with its registration, contract §5).
 */
typedef enum ImEarlierRegistration
{
	IM_EARLIER_REGISTRATION_STALE,
	IM_EARLIER_REGISTRATION_REVOKED
} ImEarlierRegistration;

/*
 * The common token checks of contract §5, in its order, for a token of
 * `purpose` presented with (user_id, dev), dev being the locked device the
 * arguments name: format and signature, user and device, revoked device,
 * earlier registration, generation, expiry.  Returns NULL when the token
 * may be used (claims in *c), else the status to answer.
 */
extern const char *im_token_check(const char *token, char purpose, int64 user_id,
								  const ImDevice *dev, ImEarlierRegistration earlier,
								  ImTokenClaims *c);

/*
 * the user's read state (read_state.c).
 */

/*
 * Record a private event of user_id (kind "read_cursor" with read_msg_seq,
 * or "delete_for_me" with message_id; the unused one 0) and its outbox item
 * (msg_seq NULL, private_user_id set) in the caller's transaction, and ask
 * the workers to wake at commit.  Fanout alone assigns its sync_seq.  The
 * caller holds the user's head lock.  trace_id (NULL: none) is kept on
 * the outbox item.  Returns the private_event_id.
 */
extern int64 im_enqueue_private_event(int64 user_id, int64 conversation_id,
									  const char *kind, int64 read_msg_seq,
									  int64 message_id, const char *trace_id);

/*
 * Apply a deletion handed off by the conversation's node: the payload of a
 * transfer with a 'deletion' (transfer_out.c) whose rows im_transfer_check_payload
 * found to be its conversation's, in the applying subtransaction; errors
 * quarantine the transfer (read_state.c).
 */
extern void im_transfer_apply_deletion(Datum payload, int64 conversation_id);

/*
 * A page of contract §11 position objects built as one jsonb in C, with the
 * exact length of its JSON text (event_json.c).  The one builder of these
 * objects: sync pages (sync.c) and fetch_messages pages (history.c) both
 * read their rows with im_event_row_read and add them with
 * im_event_json_make, so the two objects cannot drift apart.
 */

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
	bool		recalled;		/* the column: a recall's or a takedown's tombstone */
	bool		taken_down;		/* contract §17: readers then see recalled false */
	bool		takedown_keys;	/* the catalog has takedowns: the taken_down and erased keys */
	TimestampTz created_at;
	/* contract §14: a message carries reply_to_message_id (NULL
	 * when none) once the catalog has relations (relation_keys) */
	bool		relation_keys;
	bool		has_reply;
	int64		reply_to_message_id;
	/* a sync event's position in the user's log (sync pages only) */
	bool		has_sync_seq;
	int64		sync_seq;
	/*
	 * what the reader sees of a message's reactions (fetch_messages on a
	 * catalog with relations): both set on a message, both NULL otherwise
	 */
	Jsonb	   *reactions;
	Jsonb	   *my_reactions;
} ImEventRow;

/*
 * The number of result columns IM_EVENT_COLUMNS_SQL (core/im_sql.h) selects:
 * IM_EVENT_COLUMN_KEYS and the three of IM_EVENT_RELATION_COLS_SQL.
 */
#define IM_EVENT_COLUMNS 13

/*
 * Reads the IM_EVENT_COLUMNS_SQL columns of SPI result row `row`, the first
 * at column `first_col` (1-based); false when message_id is NULL (no event:
 * a hidden row).  relation_keys is im_relation_catalog(); a pin's
 * target_message_id is its pinned message.  sync_seq and the reaction
 * fields are left unset (no key) for the caller to fill.
 */
extern bool im_event_row_read(uint64 row, int first_col, ImEventRow *ev);

/* The keys of a §11 object, at most (a sync event has no reactions, a
 * fetch_messages object no sync_seq, only a message a reply key). */
#define IM_EVENT_KEYS 16

/* One §11 object, converted and measured, ready to be added to a page. */
typedef struct ImEventJson
{
	JsonbValue	values[IM_EVENT_KEYS];
	uint8		keys[IM_EVENT_KEYS];	/* values[i] is the value of key keys[i] */
	int			nkeys;
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

/* The §11 object of `ev` and its text length. */
extern void im_event_json_make(ImEventPage *page, const ImEventRow *ev,
							   ImEventJson *out);

/* Text length of a jsonb value as jsonb_out prints it. */
extern int64 im_jsonb_text_bytes(ImEventPage *page, Jsonb *value);

extern void im_event_page_add_event(ImEventPage *page, const ImEventJson *ev);
extern void im_event_page_add_jsonb(ImEventPage *page, Jsonb *element,
									int64 element_bytes);

/* The page as a jsonb array, in CurrentMemoryContext. */
extern Jsonb *im_event_page_finish(ImEventPage *page);

/*
 * Receipts (receipt.c, contract §20).  im_receipt_note queues one ACK
 * (conversation_id 0, a sync_seq range) or read report (a msg_seq range)
 * that moved, in the caller's transaction; im_receipts_produce turns
 * queued rows into receipt private events (the fanout workers, and
 * im.run_receipts) and returns how many it wrote.
 */
extern void im_receipt_note(int64 user_id, int64 conversation_id, int64 from_seq, int64 to_seq);
extern int64 im_receipts_produce(int max_rows);
/*
 * a fanout group receipt's counts from message_facts' rows (read_state.c);
 * here_only: only the users this node places (a sharded node's part)
 */
extern void im_message_fact_counts(int64 message_id, int64 sender_id, bool here_only,
								   int64 *delivered, int64 *read, int64 *members);

/*
 * Receipts across nodes (receipt.c, sharding.md "Receipts"): the receipt
 * a transfer carried from a reader's node, applied in the transfer's
 * subtransaction (an ERROR quarantines the transfer); fanout's note that a
 * run of a group's messages was delivered here (a part to send, or parts
 * waiting for their message).
 */
extern void im_receipt_apply_carried(const char *source, Datum payload, int64 conversation_id);
extern void im_receipt_note_delivered(int64 conversation_id, const int64 *event_ids, int n);

#endif							/* IM_USER_H */
