/*
 * htab.h: an intrusive chained hash table that grows with its entries
 * (prefix htab_).
 *
 * For tables keyed by what clients control (the files and row groups they
 * open): the buckets double whenever the entries outnumber them, so a
 * chain holds about one entry on average at any count, and a lookup on the
 * loop thread costs the same at a thousand entries as at a million.  A
 * rehash is O(entries) once per doubling: O(1) amortized per insert.
 *
 * Conventions
 * -----------
 * - Intrusive: an entry embeds an htab_node_t, and the table never
 *   allocates or frees entries; htab_free frees the buckets only.
 * - Hashes: the caller's, well mixed in their low bits (the bucket is
 *   hash & mask); util_hash64's are.
 * - Threading: none of its own; one thread, or the caller's lock.
 * - Failure: a doubling that cannot allocate keeps the old buckets: lookups
 *   stay correct, chains get longer, and the next insert tries again.
 * - Shrinking: never; the buckets stay at the peak (8 bytes per entry).
 */
#ifndef LARDER_HTAB_H
#define LARDER_HTAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct htab_node {
  struct htab_node *next; /* in its bucket */
  uint64_t hash;
} htab_node_t;

typedef struct htab {
  htab_node_t **buckets;
  size_t mask; /* buckets - 1: a power of two */
  size_t count;
} htab_t;

/* The entry of type `type` whose member `member` is node. */
#define HTAB_ENTRY(node, type, member) ((type *)(void *)((char *)(node)-offsetof(type, member)))

/* A zeroed htab_t is an empty table; its buckets come with the first
 * insert.  htab_free frees them (not the entries) and leaves t empty. */
void htab_free(htab_t *t);

/* Adds n with hash h, doubling the buckets first when entries outnumber
 * them.  Returns 0, or LARDER_ENOMEM only when t has no buckets yet and
 * none can be allocated (n is then not added).  n must not be in a table. */
int htab_insert(htab_t *t, htab_node_t *n, uint64_t h);

/* Removes n, which must be in t.  O(its chain). */
void htab_remove(htab_t *t, htab_node_t *n);

/* The first node of the chain where entries of hash h live, or NULL.
 * Walk it with ->next, comparing ->hash with h before the entries' keys. */
static inline htab_node_t *htab_chain(const htab_t *t, uint64_t h) {
  return t->buckets ? t->buckets[h & t->mask] : NULL;
}

/* The longest chain, for tests: O(buckets). */
size_t htab_longest_chain(const htab_t *t);

#endif /* LARDER_HTAB_H */
