/*
 * htab.c: the growing chained hash table (see htab.h).
 */
#include "htab.h"

#include <stdlib.h>

#include "larder.h"

#define HTAB_MIN_BUCKETS 1024

void htab_free(htab_t *t) {
  free(t->buckets);
  t->buckets = NULL;
  t->mask = 0;
  t->count = 0;
}

/* Doubles the buckets; keeps the old ones when memory is short. */
static void grow(htab_t *t) {
  size_t n = (t->mask + 1) * 2;
  htab_node_t **nb = calloc(n, sizeof(htab_node_t *));
  if (nb == NULL) return;
  for (size_t i = 0; i <= t->mask; i++) {
    htab_node_t *e = t->buckets[i];
    while (e) {
      htab_node_t *next = e->next;
      e->next = nb[e->hash & (n - 1)];
      nb[e->hash & (n - 1)] = e;
      e = next;
    }
  }
  free(t->buckets);
  t->buckets = nb;
  t->mask = n - 1;
}

int htab_insert(htab_t *t, htab_node_t *n, uint64_t h) {
  if (t->buckets == NULL) {
    t->buckets = calloc(HTAB_MIN_BUCKETS, sizeof(htab_node_t *));
    if (t->buckets == NULL) return LARDER_ENOMEM;
    t->mask = HTAB_MIN_BUCKETS - 1;
    t->count = 0;
  } else if (t->count >= t->mask + 1) {
    grow(t);
  }
  n->hash = h;
  n->next = t->buckets[h & t->mask];
  t->buckets[h & t->mask] = n;
  t->count++;
  return 0;
}

void htab_remove(htab_t *t, htab_node_t *n) {
  if (t->buckets == NULL) return;
  htab_node_t **pp = &t->buckets[n->hash & t->mask];
  while (*pp && *pp != n) pp = &(*pp)->next;
  if (*pp == NULL) return; /* not here: a caller's bug, but no damage */
  *pp = n->next;
  n->next = NULL;
  t->count--;
}

size_t htab_longest_chain(const htab_t *t) {
  size_t longest = 0;
  for (size_t i = 0; t->buckets && i <= t->mask; i++) {
    size_t len = 0;
    for (const htab_node_t *e = t->buckets[i]; e; e = e->next) len++;
    if (len > longest) longest = len;
  }
  return longest;
}
