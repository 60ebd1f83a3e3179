/*
 * frame.h — wire-frame decoding for im_gateway, free of libwebsockets and
 * libpq so the libFuzzer target links it alone.
 *
 * Protects contract §10: a frame is checked completely (JSON, object, known
 * type, field types, nesting <= 32, no other user's id) before anything is
 * sent to the database, and its values leave this file only as text
 * parameters of a fixed statement — never as SQL text.
 */
#ifndef IM_GW_FRAME_H
#define IM_GW_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "im_sync/trace_id.h"

#define IM_MAX_NESTING 32
#define IM_MAX_PARAMS  8
/* longest trace_id a frame may carry: the one form (im_sync/trace_id.h) */

typedef enum im_op
{
	IM_OP_HELLO = 0,
	IM_OP_PING,
	IM_OP_SYNC,
	IM_OP_ACK,
	IM_OP_SEND,
	IM_OP_RECALL,
	IM_OP_EDIT,
	IM_OP_READ,
	IM_OP_FETCH_MESSAGES,
	IM_OP_CONVERSATIONS,
	IM_OP_CLEAR_DIRTY,
	IM_OP_DELETE_FOR_ME,
	IM_OP_SNAPSHOT_BEGIN,
	IM_OP_SNAPSHOT_FETCH,
	IM_OP_SNAPSHOT_ACK,
	IM_OP_REACT,				/* contract §14 */
	IM_OP_PIN,
	IM_OP_MESSAGE_STATUS,		/* contract §16 */
	IM_OP_RECENT_CONVERSATIONS,	/* contract §20 */
	IM_OP_PIN_CONVERSATION,
	IM_OP_SET_READ_RECEIPTS,	/* contract §20: the session user's own setting */
	IM_OP_SET_ROLE,				/* contract §17 */
	IM_OP_MUTE_MEMBER,
	IM_OP_REMOVE_MEMBER,
	IM_OP_COUNT
} im_op;

/* How the reply is shaped from the result set. */
typedef enum im_reply_shape
{
	IM_REPLY_ROW,				/* one row: columns merged into the reply */
	IM_REPLY_ROWS,				/* any number of rows: "rows": [...] */
	IM_REPLY_NONE				/* no SQL (ping, hello handled apart) */
} im_reply_shape;

typedef struct im_op_info
{
	const char *type;			/* frame "type" */
	const char *reply_type;		/* reply "type" */
	im_reply_shape shape;
} im_op_info;

extern const im_op_info im_ops[IM_OP_COUNT];

/* Outcome of decoding one frame. */
typedef enum im_decode_status
{
	IM_DECODE_OK = 0,
	IM_DECODE_BAD_FRAME,		/* contract: BAD_FRAME */
	IM_DECODE_INVALID,			/* contract: INVALID_ARGUMENT (\u0000 in a
								 * text field) */
	IM_DECODE_FORBIDDEN			/* frame names another user or device */
} im_decode_status;

/*
 * A decoded request: the statement to run and its text parameters.  $1 is
 * always the session's user (bigint); the statement text is one of the
 * static strings of the op table, chosen by which optional fields with a
 * non-NULL SQL default are present.
 */
typedef struct im_request
{
	im_op		op;
	json_t	   *id;				/* owned reference or NULL */
	const char *sql;			/* static text */
	int			nparams;
	char	   *params[IM_MAX_PARAMS];	/* malloc'd, NULL = SQL NULL */
	char		err[160];		/* reason for BAD_FRAME/FORBIDDEN (no data) */
	/*
	 * The frame's trace_id (contract §21: 1-64 of [A-Za-z0-9_-], else the
	 * frame is INVALID_ARGUMENT), "" when it has none; trace_param: the
	 * index of the write's trailing trace_id parameter, -1 for reads.
	 */
	char		trace_id[IM_TRACE_ID_MAX + 1];
	int			trace_param;
	int64_t		conversation_id;	/* the frame's, 0 when none (logs only) */
} im_request;

/*
 * Decodes buf[0..len) for a session of user_id/device_id (user_id 0 and
 * device_id NULL before hello).  Always fills req->id when the frame was an
 * object with an "id", so errors can echo it.  The caller releases with
 * im_request_free.
 */
extern im_decode_status im_decode_frame(const char *buf, size_t len,
										int64_t user_id, const char *device_id,
										im_request *req);
extern void im_request_free(im_request *req);

/*
 * A frame without a trace_id gets generated (the gateway's, W3C form): it
 * becomes req->trace_id and, for a write, its trace_id parameter.
 */
extern void im_request_set_trace(im_request *req, const char *generated);

/* A bigint as the text of a statement parameter (malloc'd). */
extern char *im_int64_text(int64_t v);

/* JSON nesting depth of a value (scalars are 0, [] is 1), capped at cap+1. */
extern int	im_json_depth(const json_t *v, int cap);

/*
 * Hint payload (contract §4): comma-separated "user:hw" and "c<conv>:<head>".
 * Calls the callbacks for each well-formed entry; malformed entries are
 * skipped.  Returns the number of malformed entries.
 */
typedef void (*im_user_hint_cb) (void *arg, int64_t user_id, int64_t hw);
typedef void (*im_conv_hint_cb) (void *arg, int64_t conv_id, int64_t head);
extern int	im_parse_hint_payload(const char *payload, im_user_hint_cb ucb,
								  im_conv_hint_cb ccb, void *arg);

/* Device event "user:device:epoch:REVOKED|SUPERSEDED".  0 on success. */
typedef struct im_device_event
{
	int64_t		user_id;
	char		device_id[65];
	int64_t		epoch;
	int			revoked;		/* 1 REVOKED, 0 SUPERSEDED, 2 SUSPENDED (re-checked alike) */
} im_device_event;
extern int	im_parse_device_event(const char *payload, im_device_event *ev);

/* Builds {"type":"error","id":…,"trace_id":…,"code":…,"message":…[,"retry_after_ms":…]}
 * (trace_id left out when NULL or ""). */
extern char *im_error_frame(json_t *id, const char *trace_id, const char *code, const char *message,
							long retry_after_ms);
/* The same with a "reason" (FORBIDDEN of contract §17), left out when NULL. */
extern char *im_error_frame_reason(json_t *id, const char *trace_id, const char *code,
								   const char *message, long retry_after_ms, const char *reason);

/*
 * The error an API SQLSTATE answers with (contract §10): its code, and for
 * IS403 (contract §17) the reason named by the server's message ("member
 * muted" → "muted"), *reason NULL otherwise.  One table for every IS403
 * cause (frame.c).
 */
extern const char *im_api_error_code(const char *sqlstate, const char *errmsg, const char **reason);

/* The ttl of a presence: set by the hello statement, renewed by
 * presence_report.c a third of it apart. */
#define IM_PRESENCE_TTL_TEXT "90 seconds"

#endif
