/*
 * json_splice.h — reply frames that carry JSON text from PostgreSQL
 * verbatim.  Scalar columns are built with jansson; json/jsonb columns are
 * spliced in as the text PostgreSQL printed, never parsed and printed again
 * (jansson cannot hold integers past int64 and would change how numbers
 * read).  No libpq, so the fuzzer links it alone.
 */
#ifndef IM_GW_JSON_SPLICE_H
#define IM_GW_JSON_SPLICE_H

#include <stddef.h>
#include <jansson.h>

typedef struct im_raw_member
{
	const char *name;			/* key, encoded here as a JSON string */
	const char *text;			/* a complete JSON text, inserted as is */
	size_t		len;
} im_raw_member;

/*
 * The compact dump of object obj with ,"name":text appended for each raw
 * member before the closing brace.  obj must not hold those keys.  Returns
 * malloc'd text, or NULL when out of memory.
 */
extern char *im_json_splice(const json_t *obj, const im_raw_member *raw, int nraw);

/* "[t0,t1,…]" from complete JSON texts (malloc'd). */
extern char *im_json_array_of_texts(char *const *texts, int n);

/*
 * The elements of the JSON array text[0..len) PostgreSQL printed (its top
 * level only: strings and nested values skipped without being parsed);
 * -1 when the text is not an array.
 */
extern long im_json_array_count(const char *text, size_t len);

#endif
