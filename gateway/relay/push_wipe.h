/*
 * push_wipe.h — the push relay's allocator that wipes every block it frees.
 *
 * The relay holds clear push tokens; jansson (the pushkey string, the
 * serialised body, a parsed answer naming the token), libcurl (its request
 * buffers) and OpenSSL (its TLS record buffers) copy them into blocks of
 * their own and free those blocks where the relay cannot wipe them.
 * push_wipe_install hands these libraries an allocator that keeps each
 * block's size in front of it and clears the whole block (OPENSSL_cleanse)
 * before giving it back to malloc, so no freed heap holds a token.
 */
#ifndef IM_PUSH_WIPE_H
#define IM_PUSH_WIPE_H

#include <stddef.h>

/*
 * Installs the wiping allocator in jansson, libcurl (curl_global_init_mem:
 * this is the relay's curl_global_init) and OpenSSL.  Call it first in
 * main, before any of them allocates; 0, or -1 with err (OpenSSL refuses
 * once it has allocated: the relay then must not start).
 */
extern int	push_wipe_install(char *err, size_t errlen);

/* The allocator itself (sizes kept, cleared when freed or moved). */
extern void *push_wipe_malloc(size_t n);
extern void *push_wipe_calloc(size_t count, size_t n);
extern void *push_wipe_realloc(void *ptr, size_t n);
extern char *push_wipe_strdup(const char *s);
extern void push_wipe_free(void *ptr);

#endif
