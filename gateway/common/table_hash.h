/*
 * table_hash.h — the non-cryptographic hashes that place keys in the
 * gateway's fixed-size tables (sessions, users, rate slots, peer addresses,
 * member lists).  A collision only costs a longer chain or, for the rate
 * slots, an approximate limit; ids in logs use log_hash.h instead.
 */
#ifndef IM_GW_TABLE_HASH_H
#define IM_GW_TABLE_HASH_H

#include <stdint.h>

#include <stddef.h>

#define IM_FNV_OFFSET 1469598103934665603ULL
#define IM_FNV_PRIME 1099511628211ULL

/* FNV-1a of a string, continuing from h (IM_FNV_OFFSET to start). */
static inline uint64_t
im_fnv1a(const char *s, uint64_t h)
{
	for (; *s; s++)
		h = (h ^ (unsigned char) *s) * IM_FNV_PRIME;
	return h;
}

/* FNV-1a of n bytes, continuing from h (IM_FNV_OFFSET to start). */
static inline uint64_t
im_fnv1a_bytes(const void *p, size_t n, uint64_t h)
{
	const unsigned char *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * IM_FNV_PRIME;
	return h;
}

/* Mixes an integer key (ids are dense); callers mask to their table size. */
static inline uint64_t
im_mix64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	return k;
}

#endif
