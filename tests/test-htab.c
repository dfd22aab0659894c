/*
 * test-htab.c: the growing hash table behind larderd's tables of units and
 * row-group buffers (daemon/htab.c), tested in-process.
 *
 * Conventions
 * -----------
 * - Timings compare the same operation at N and 10N entries, best of a few
 *   rounds, with a generous bound, so a loaded machine does not fail them;
 *   the chain lengths, which are what the timings reflect, are asserted
 *   exactly.
 */
#include <stdlib.h>
#include <time.h>

#include "htab.h"
#include "util.h"
#include "task.h"

typedef struct item {
  uint64_t key;
  htab_node_t node;
} item_t;

static uint64_t hash_of(uint64_t key) { return util_hash64(&key, sizeof(key), 7); }

static item_t *find(const htab_t *t, uint64_t key) {
  uint64_t h = hash_of(key);
  for (htab_node_t *n = htab_chain(t, h); n; n = n->next) {
    item_t *it = HTAB_ENTRY(n, item_t, node);
    if (n->hash == h && it->key == key) return it;
  }
  return NULL;
}

typedef struct cost {
  double insert, lookup, remove; /* seconds per operation */
  double touch;                  /* one item and one bucket read, in the lookups' order */
  size_t longest;
} cost_t;

/* Fills a table with n items, looks up `lookups` of them in a scattered
 * order (and one absent key each time), then removes them all. */
static cost_t measure(size_t n, size_t lookups) {
  item_t *items = calloc(n, sizeof(*items));
  ASSERT_NOT_NULL(items);
  htab_t t = {0};
  cost_t c;
  double t0 = test_now_s();
  for (size_t i = 0; i < n; i++) {
    items[i].key = i * 2; /* odd keys are absent */
    ASSERT_OK(htab_insert(&t, &items[i].node, hash_of(items[i].key)));
  }
  c.insert = (test_now_s() - t0) / (double)n;
  ASSERT_EQ(t.count, n);
  c.longest = htab_longest_chain(&t);
  ASSERT(t.count <= t.mask + 1); /* on average at most one per bucket */
  size_t found = 0;
  t0 = test_now_s();
  for (size_t i = 0, k = 0; i < lookups; i++) {
    k = (k + 7919) % n; /* 7919 is prime: visits every item in turn */
    found += find(&t, items[k].key) == &items[k];
    found += find(&t, items[k].key + 1) != NULL;
  }
  c.lookup = (test_now_s() - t0) / (double)lookups;
  ASSERT_EQ(found, lookups);
  /* What the memory alone costs at this size: the item and its bucket,
   * which a lookup of a chain of one reads as well. */
  uintptr_t sink = 0;
  t0 = test_now_s();
  for (size_t i = 0, k = 0; i < lookups; i++) {
    k = (k + 7919) % n;
    sink += (uintptr_t)t.buckets[hash_of(items[k].key) & t.mask] + items[k].key;
  }
  c.touch = (test_now_s() - t0) / (double)lookups;
  ASSERT(sink != 1);
  t0 = test_now_s();
  for (size_t i = 0, k = 0; i < n; i++) {
    k = (k + 7919) % n;
    htab_remove(&t, &items[k].node);
  }
  c.remove = (test_now_s() - t0) / (double)n;
  ASSERT_EQ(t.count, 0);
  htab_free(&t);
  free(items);
  return c;
}

/*
 * Time per insert, lookup and remove stays flat as the entries grow 10x
 * (100k to 1M, the size of a dataset of a million one-row row groups): the
 * buckets grow with the entries, so chains stay short.  Best of three
 * rounds at each size; the bound of 3x leaves room for cache misses (the
 * larger table does not fit in a cache) and a loaded machine.  A table of
 * fixed buckets fails it by the ratio of the counts.
 */
TEST_IMPL(htab_flat_ops) {
  enum { N = 100000, LOOKUPS = 1000000 };
  cost_t best[2];
  for (int k = 0; k < 2; k++) {
    size_t n = k ? 10 * (size_t)N : N;
    for (int round = 0; round < 3; round++) {
      cost_t c = measure(n, LOOKUPS);
      if (round == 0 || c.insert < best[k].insert) best[k].insert = c.insert;
      if (round == 0 || c.lookup < best[k].lookup) best[k].lookup = c.lookup;
      if (round == 0 || c.remove < best[k].remove) best[k].remove = c.remove;
      if (round == 0 || c.touch < best[k].touch) best[k].touch = c.touch;
      best[k].longest = c.longest;
    }
  }
  printf(
      "  ns per op at 100k / 1M entries: insert %.0f / %.0f, lookup %.0f / %.0f, "
      "remove %.0f / %.0f, memory touch %.0f / %.0f; longest chain %zu / %zu\n",
      best[0].insert * 1e9, best[1].insert * 1e9, best[0].lookup * 1e9, best[1].lookup * 1e9,
      best[0].remove * 1e9, best[1].remove * 1e9, best[0].touch * 1e9, best[1].touch * 1e9,
      best[0].longest, best[1].longest);
  /* With hashes this well mixed and at most one entry per bucket, a chain
   * of 16 has odds far below one in a billion. */
  ASSERT_LE(best[1].longest, 16);
  /* Per operation, in units of the memory's own cost at each size (1M
   * entries miss the caches that 100k fit, which alone makes a lookup 2-3x
   * dearer): flat within 3x.  Raw times within 8x, which fixed buckets
   * (10x longer chains) would still fail. */
  double scale = best[1].touch / best[0].touch;
  if (scale < 1) scale = 1;
  ASSERT_DOUBLE_LE(best[1].insert, 3 * scale * best[0].insert + 20e-9);
  ASSERT_DOUBLE_LE(best[1].lookup, 3 * scale * best[0].lookup + 20e-9);
  ASSERT_DOUBLE_LE(best[1].remove, 3 * scale * best[0].remove + 20e-9);
  ASSERT_DOUBLE_LE(best[1].lookup, 8 * best[0].lookup + 20e-9);
  return 0;
}

/* A zeroed table works without buckets, and removal of a node that is not
 * in it does no damage. */
TEST_IMPL(htab_empty_and_misuse) {
  htab_t t = {0};
  ASSERT_NULL(htab_chain(&t, 42));
  item_t a = {1, {NULL, 0}}, b = {2, {NULL, 0}};
  htab_remove(&t, &a.node);
  ASSERT_OK(htab_insert(&t, &a.node, hash_of(1)));
  ASSERT_PTR_EQ(find(&t, 1), &a);
  b.node.hash = hash_of(2);
  htab_remove(&t, &b.node);
  ASSERT_EQ(t.count, 1);
  htab_remove(&t, &a.node);
  ASSERT_NULL(find(&t, 1));
  ASSERT_EQ(t.count, 0);
  htab_free(&t);
  ASSERT_NULL(htab_chain(&t, 42));
  return 0;
}
