/*
 * json_splice.c — see json_splice.h.  The invariant it protects: a value
 * the gateway only forwards reaches the client byte for byte as PostgreSQL
 * produced it, so every member of a conversation reads the same JSON.
 */
#include "server/db/json_splice.h"

#include <stdlib.h>
#include <string.h>

char *
im_json_splice(const json_t *obj, const im_raw_member *raw, int nraw)
{
	char	   *head = json_dumps(obj, JSON_COMPACT);
	char	  **keys;
	size_t		hlen,
				total;
	char	   *out,
			   *p;
	int			i;
	int			empty;

	if (!head)
		return NULL;
	hlen = strlen(head);		/* ends with '}' */
	empty = hlen == 2;
	keys = calloc((size_t) nraw + 1, sizeof(char *));
	if (!keys)
	{
		free(head);
		return NULL;
	}
	total = hlen + 1;
	for (i = 0; i < nraw; i++)
	{
		json_t	   *k = json_string(raw[i].name);

		keys[i] = k ? json_dumps(k, JSON_ENCODE_ANY) : NULL;
		json_decref(k);
		if (!keys[i])
			goto fail;
		total += 2 + strlen(keys[i]) + raw[i].len;
	}
	out = malloc(total);
	if (!out)
		goto fail;
	p = out;
	memcpy(p, head, hlen - 1);
	p += hlen - 1;
	for (i = 0; i < nraw; i++)
	{
		size_t		kl = strlen(keys[i]);

		if (i > 0 || !empty)
			*p++ = ',';
		memcpy(p, keys[i], kl);
		p += kl;
		*p++ = ':';
		memcpy(p, raw[i].text, raw[i].len);
		p += raw[i].len;
		free(keys[i]);
	}
	*p++ = '}';
	*p = '\0';
	free(keys);
	free(head);
	return out;
fail:
	for (i = 0; i < nraw; i++)
		free(keys[i]);
	free(keys);
	free(head);
	return NULL;
}

char *
im_json_array_of_texts(char *const *texts, int n)
{
	size_t		total = 3;
	char	   *out,
			   *p;
	int			i;

	for (i = 0; i < n; i++)
		total += strlen(texts[i]) + 1;
	out = malloc(total);
	if (!out)
		return NULL;
	p = out;
	*p++ = '[';
	for (i = 0; i < n; i++)
	{
		size_t		l = strlen(texts[i]);

		if (i > 0)
			*p++ = ',';
		memcpy(p, texts[i], l);
		p += l;
	}
	*p++ = ']';
	*p = '\0';
	return out;
}

long
im_json_array_count(const char *text, size_t len)
{
	size_t		i = 0;
	long		n = 0;
	int			depth = 0,
				in_string = 0,
				seen = 0;

	while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r'))
		i++;
	if (i >= len || text[i] != '[')
		return -1;
	for (; i < len; i++)
	{
		char		c = text[i];

		if (in_string)
		{
			if (c == '\\')
				i++;			/* the escaped character */
			else if (c == '"')
				in_string = 0;
			continue;
		}
		if (c == '"')
			in_string = 1;
		else if (c == '[' || c == '{')
			depth++;
		else if (c == ']' || c == '}')
		{
			if (--depth == 0)
				return seen ? n + 1 : 0;
			continue;
		}
		else if (c == ',' && depth == 1)
		{
			n++;
			continue;
		}
		else if (c == ' ' || c == '\n' || c == '\t' || c == '\r')
			continue;
		/* something other than the opening bracket at the top level */
		if (depth >= 1 && !(depth == 1 && c == '['))
			seen = 1;
	}
	return -1;					/* not closed */
}
