/*
 * shuffle.c: the epoch order of samples and its slicing into batches (see
 * shuffle.h for the algorithm).
 *
 * The exact definition of the order
 * ---------------------------------
 * The order is part of larder's contract (a job resumed after a restart or an
 * upgrade must see the same batches), so every detail is fixed here:
 *
 * - mix64(z) is SplitMix64's output function (Stafford's "Mix13"):
 *     z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
 *     z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
 *     return z ^ (z >> 31);
 *   next(s) is SplitMix64: s += 0x9e3779b97f4a7c15; return mix64(s).
 * - The stream keyed by (seed, epoch, purpose, index) starts from the state
 *     h = mix64(seed    + GAMMA);
 *     h = mix64(h ^ (epoch   + GAMMA));
 *     h = mix64(h ^ (purpose + GAMMA));
 *     h = mix64(h ^ (index   + GAMMA));
 *   with GAMMA = 0x9e3779b97f4a7c15 and all arithmetic mod 2^64.  mix64 is a
 *   bijection, so each step keeps every bit of what came before, and the
 *   GAMMA offsets keep a key of zeros away from the fixed point mix64(0) = 0.
 *   Purposes: UNITS = 1 (index 0), WINDOW = 2 (index = window number),
 *   BLOCK = 3 (index = block number in dataset order), PARTITION = 4 (epoch
 *   0, index 0: the groups' order for the partitions; epoch 0, index
 *   p + 1: partition p's seed, the first output of that stream).
 * - bounded(s, n) for 1 <= n < 2^64 is Lemire's "nearly divisionless"
 *   method: x = next(s); m = x * n as a 128-bit product; while the low 64
 *   bits of m are below (2^64 - n) mod n, draw again; the result is the high
 *   64 bits of m, uniform on [0, n).  Every draw consumes one 64-bit output.
 * - Fisher-Yates (Durstenfeld): a[i] = i for i < n; then for i = n-1 down to
 *   1: j = bounded(s, i + 1); swap a[i] and a[j].
 * - Unit order of epoch e: Fisher-Yates over the num_units unit indices with
 *   stream (seed, e, UNITS, 0).  Zero-row units take part like any other.
 * - Blocked plans (shuffle_plan_create_blocked): Fisher-Yates over the
 *   num_blocks block indices with stream (seed, e, UNITS, 0); the unit order
 *   is the blocks' units in that block order, the units of block b (its
 *   unit indices, ascending) permuted by Fisher-Yates with stream
 *   (seed, e, BLOCK, b).  Blocks of one unit each give exactly the unblocked
 *   order, since a one-element shuffle draws nothing.
 * - Window w holds permuted units [w*W, min((w+1)*W, num_units)).  Its rows
 *   are numbered 0 .. R-1 in the order: its units in permuted order, the rows
 *   of each unit in ascending order.  Its row order is Fisher-Yates over
 *   0 .. R-1 with stream (seed, e, WINDOW, w); position q of the window holds
 *   the window row perm[q].  (A window of no rows draws nothing.)
 * - Epoch position p (0 <= p < N) is position p - start(w) of the window w
 *   that contains it; positions past N (padding) are taken mod N.
 * - Partitions (P > 1): the groups are permuted by Fisher-Yates with stream
 *   (seed, 0, PARTITION, 0); walking them in that order with A rows before
 *   a group of R rows, the group goes to partition
 *   min(P - 1, floor((2A + R) * P / 2N)) (its middle row's share of N).
 *   Partition p's units keep dataset order and make a plan of their own
 *   with seed next64 of the state stream_state(seed, 0, PARTITION, p + 1),
 *   window_units max(1, W / P), batch_size G / P, world_size 1, rank 0; its
 *   blocks are the groups when block_order is set.
 *
 * Costs
 * -----
 * A plan keeps the prefix sums of the unit row counts in dataset order.  A
 * cursor keeps the epoch's unit order and the prefix sums of the permuted unit
 * rows (O(num_units)), plus the row permutation (4 bytes a row) of at most two
 * windows: the last two used, so that a batch that straddles a window
 * boundary, or a prefetch query (shuffle_epoch_units) that runs ahead of the
 * batches, does not make the cursor generate the same window again and again.
 * The second window's buffer is only allocated once a second window is
 * needed.  When (unit within the window, row) fits in 32 bits (it does unless
 * units are huge or windows hold ~a million units), the permuted entries
 * carry it directly and a sample costs O(1); otherwise they are window row
 * numbers and a sample costs a binary search over the window's units.  A
 * batch also costs O(log num_units) per window it touches, plus the window's
 * Fisher-Yates (O(rows of the window), ~2-3 ns a row) the first time the
 * window is used.  bench/label-mix.c measures all of it.
 *
 * Limits beyond those in shuffle.h
 * --------------------------------
 * - batch_size must fit in an int (shuffle_epoch_batch returns it).
 * - With shuffle, the window_units largest units together must hold at most
 *   UINT32_MAX rows (window row indices are 32-bit); plan creation fails with
 *   LARDER_EINVAL otherwise.  (Such a window would need 16 GiB for its row
 *   permutation alone.)
 * - Without drop_last, N + G - 1 must fit in 64 bits (it always does for
 *   real datasets).
 * - shuffle_epoch_units clamps `last` to the batches per epoch (a prefetch
 *   horizon may run past the end of the epoch) and fails with LARDER_EINVAL
 *   when first > last; it writes at most INT_MAX units.
 */
#include "plan/shuffle.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "larder.h"

#define GAMMA UINT64_C(0x9e3779b97f4a7c15)
#define PURPOSE_UNITS 1
#define PURPOSE_WINDOW 2
#define PURPOSE_BLOCK 3
#define PURPOSE_PARTITION 4
#define NO_WINDOW UINT64_MAX

/* A window's row order, shared by the cursors of one plan (see get_window):
 * a stream's planner and its prefetch pins walk the same epochs, and a
 * large window's permutation takes milliseconds of a worker to make. */
typedef struct shared_perm {
  struct shared_perm *next;
  uint64_t epoch, window;
  uint32_t rows;
  int refs; /* cursors holding it; freed at 0 */
  uint32_t *perm;
} shared_perm_t;

/* The one mutable part of a plan, reached through a pointer so that
 * cursors, which see the plan as const, can share into it. */
typedef struct perm_cache {
  pthread_mutex_t lock;
  shared_perm_t *perms;
} perm_cache_t;

struct shuffle_plan {
  perm_cache_t *cache;
  shuffle_params_t params;
  uint32_t num_units;
  uint64_t num_samples;  /* N */
  uint64_t global_batch; /* G = world_size * batch_size */
  uint64_t batches;      /* per epoch, for every rank */
  uint64_t *start;       /* num_units + 1 prefix sums, dataset order */
  uint32_t num_blocks;   /* 0: unblocked */
  uint32_t *block_first; /* num_blocks + 1: first unit of each block */
  int packed;            /* windows hold (unit in window, row) pairs */
  unsigned row_bits;     /* bits of the row in a packed entry */
  /* Partitioned plans (nparts > 1) keep a plan per partition instead of
   * an order of their own. */
  uint32_t nparts;
  shuffle_plan_t **part;
  uint32_t **part_unit; /* per partition: its unit index -> dataset unit */
  uint64_t slice;       /* S = G / P */
};

/* The row order of one window; a slot is free while index is NO_WINDOW.
 * Windows of no rows are never materialized. */
typedef struct window {
  uint64_t index;        /* window number, or NO_WINDOW */
  uint64_t begin;        /* epoch position of its first row */
  uint64_t last_use;     /* for least-recently-used eviction */
  uint32_t first;        /* index in the unit order of its first unit */
  uint32_t nunits;       /* units in it */
  uint32_t rows;         /* rows in it */
  uint32_t *perm;        /* rows entries: position -> window row (packed:
                       * index of its unit in the window << row_bits | row) */
  shared_perm_t *shared; /* the holder of perm */
} window_t;

struct shuffle_epoch {
  const shuffle_plan_t *plan;
  uint64_t epoch;
  uint32_t *order; /* unit order (shuffle only): position -> unit */
  uint64_t *start; /* num_units + 1 prefix sums of rows in that order */
  window_t win[2];
  uint64_t clock; /* use counter for the windows */
  uint64_t *seen; /* shuffle_epoch_units' bitmap over units (lazy) */
  /* A window row order being made a slice at a time (shuffle_epoch_prepare),
   * not yet shared: its window, entries still to shuffle, stream state. */
  shared_perm_t *pending;
  uint32_t pending_left;
  uint64_t pending_state;
  /* Its entries are written a slice at a time too (the first touch of a
   * window's order faults in megabytes): entries written, the window's
   * first unit, and the unit (within the window) of the next entry. */
  uint32_t pending_filled;
  uint32_t pending_first;
  uint32_t pending_unit;
  /* Partitioned plans: a cursor per partition, opened when first used. */
  struct shuffle_epoch **sub;
};

/* ------------------------------------------------------------------------ */
/* Random numbers                                                            */

static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static inline uint64_t next64(uint64_t *s) {
  *s += GAMMA;
  return mix64(*s);
}

static uint64_t stream_state(uint64_t seed, uint64_t epoch, uint64_t purpose, uint64_t index) {
  uint64_t h = mix64(seed + GAMMA);
  h = mix64(h ^ (epoch + GAMMA));
  h = mix64(h ^ (purpose + GAMMA));
  return mix64(h ^ (index + GAMMA));
}

/* The 128-bit product of a and b: high half returned, low half in *lo. */
static inline uint64_t mul128(uint64_t a, uint64_t b, uint64_t *lo) {
#ifdef __SIZEOF_INT128__
  unsigned __int128 m = (unsigned __int128)a * b;
  *lo = (uint64_t)m;
  return (uint64_t)(m >> 64);
#else
  uint64_t a0 = a & 0xffffffffu, a1 = a >> 32;
  uint64_t b0 = b & 0xffffffffu, b1 = b >> 32;
  uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  *lo = (mid << 32) | (p00 & 0xffffffffu);
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

/* Uniform on [0, n), n >= 1 (Lemire, "Fast random integer generation in an
 * interval", 2019). */
static inline uint64_t bounded(uint64_t *s, uint64_t n) {
  uint64_t lo;
  uint64_t hi = mul128(next64(s), n, &lo);
  if (lo < n) {
    uint64_t t = (0 - n) % n;
    while (lo < t) hi = mul128(next64(s), n, &lo);
  }
  return hi;
}

/* Fisher-Yates over a[0 .. n), whatever it holds: a[q] ends up holding the
 * initial a[perm[q]] for the permutation perm that the stream defines.  The
 * draws are made AHEAD at a time so that the cache lines they will swap can be
 * prefetched (twice as fast once the array outgrows the L2 cache); the draws
 * and swaps are the same, in the same order, as the plain loop's.
 *
 * fisher_yates_steps does it a slice at a time: *i (n at the start) counts
 * the entries still to shuffle and *state is the stream's state; it stops
 * after the first block that brings its swaps to `budget` or more.  Slices
 * end on the same blocks as the whole run, so any sequence of slices makes
 * the same permutation. */
static void fisher_yates_steps(uint32_t *a, uint32_t *i, uint64_t *state, uint64_t budget) {
  enum { AHEAD = 64 };
  uint32_t js[AHEAD];
  uint64_t done = 0;
  while (*i > 1 && done < budget) {
    uint32_t m = *i - 1 < AHEAD ? *i - 1 : AHEAD;
    for (uint32_t k = 0; k < m; k++) {
      js[k] = (uint32_t)bounded(state, *i - k);
#ifdef __GNUC__
      __builtin_prefetch(a + js[k], 1);
#endif
    }
    for (uint32_t k = 0; k < m; k++) {
      uint32_t last = *i - 1 - k, j = js[k];
      uint32_t t = a[last];
      a[last] = a[j];
      a[j] = t;
    }
    *i -= m;
    done += m;
  }
}

static void fisher_yates(uint32_t *a, uint32_t n, uint64_t state) {
  fisher_yates_steps(a, &n, &state, UINT64_MAX);
}

/* The number of bits needed for values 0 .. v. */
static unsigned bits_for(uint64_t v) {
  unsigned b = 0;
  while (v >> b) b++;
  return b;
}

/* ------------------------------------------------------------------------ */
/* Plans                                                                     */

static int cmp_desc_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x < y) - (x > y);
}

/* Whether some window_units units could together hold more than UINT32_MAX
 * rows: 1 yes, 0 no, or LARDER_ENOMEM. */
static int window_too_big(const uint64_t *unit_rows, uint32_t n, uint32_t w, uint64_t max_rows) {
  if (w > n) w = n;
  if ((uint64_t)w * max_rows <= UINT32_MAX) return 0; /* < 2^64: no wrap */
  uint64_t *sorted = malloc((size_t)n * sizeof(*sorted));
  if (sorted == NULL) return LARDER_ENOMEM;
  memcpy(sorted, unit_rows, (size_t)n * sizeof(*sorted));
  qsort(sorted, n, sizeof(*sorted), cmp_desc_u64);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < w && sum <= UINT32_MAX; i++) sum += sorted[i];
  free(sorted);
  return sum > UINT32_MAX;
}

int shuffle_plan_create(const uint64_t *unit_rows, uint32_t num_units,
                        const shuffle_params_t *params, shuffle_plan_t **out) {
  return shuffle_plan_create_blocked(unit_rows, num_units, NULL, 0, params, out);
}

int shuffle_plan_create_blocked(const uint64_t *unit_rows, uint32_t num_units,
                                const uint32_t *block_units, uint32_t num_blocks,
                                const shuffle_params_t *params, shuffle_plan_t **out) {
  if (out == NULL) return LARDER_EINVAL;
  *out = NULL;
  if (params && params->partitions > 1)
    return shuffle_plan_create_partitioned(unit_rows, num_units, block_units, num_blocks,
                                           block_units != NULL, params, out);
  if (block_units != NULL) {
    uint64_t sum = 0;
    for (uint32_t b = 0; b < num_blocks; b++) {
      if (block_units[b] == 0) return LARDER_EINVAL;
      sum += block_units[b];
    }
    if (sum != num_units) return LARDER_EINVAL;
  }
  if (unit_rows == NULL || params == NULL || num_units == 0 || params->batch_size == 0 ||
      params->batch_size > INT_MAX || params->world_size == 0 ||
      params->rank >= params->world_size || params->window_units == 0)
    return LARDER_EINVAL;
  uint64_t n = 0, max_rows = 0;
  for (uint32_t i = 0; i < num_units; i++) {
    if (unit_rows[i] > UINT32_MAX) return LARDER_EINVAL;
    n += unit_rows[i]; /* < 2^32 * 2^32: cannot wrap */
    if (unit_rows[i] > max_rows) max_rows = unit_rows[i];
  }
  if (n == 0) return LARDER_EINVAL;
  uint64_t g = (uint64_t)params->world_size * params->batch_size;
  if (!params->drop_last && n > UINT64_MAX - (g - 1)) return LARDER_EINVAL;
  if (params->shuffle) {
    int big = window_too_big(unit_rows, num_units, params->window_units, max_rows);
    if (big != 0) return big < 0 ? big : LARDER_EINVAL;
  }

  shuffle_plan_t *plan = calloc(1, sizeof(*plan));
  if (plan == NULL) return LARDER_ENOMEM;
  plan->start = malloc(((size_t)num_units + 1) * sizeof(*plan->start));
  if (plan->start == NULL) {
    free(plan);
    return LARDER_ENOMEM;
  }
  if (block_units != NULL && params->shuffle) {
    plan->block_first = malloc(((size_t)num_blocks + 1) * sizeof(*plan->block_first));
    if (plan->block_first == NULL) {
      free(plan->start);
      free(plan);
      return LARDER_ENOMEM;
    }
    uint32_t first = 0;
    for (uint32_t b = 0; b < num_blocks; b++) {
      plan->block_first[b] = first;
      first += block_units[b];
    }
    plan->block_first[num_blocks] = first;
    plan->num_blocks = num_blocks;
  }
  plan->params = *params;
  plan->params.shuffle = params->shuffle != 0;
  plan->params.drop_last = params->drop_last != 0;
  plan->num_units = num_units;
  plan->num_samples = n;
  plan->global_batch = g;
  plan->batches = params->drop_last ? n / g : n / g + (n % g != 0);
  uint64_t acc = 0;
  for (uint32_t i = 0; i < num_units; i++) {
    plan->start[i] = acc;
    acc += unit_rows[i];
  }
  plan->start[num_units] = acc;
  /* Window entries name (unit within the window, row) directly when both fit
   * in 32 bits, which saves a search per sample; else they are window row
   * numbers and the unit is found by binary search.  Either way the entry
   * at position q stands for window row perm[q]. */
  uint32_t per_window = params->window_units < num_units ? params->window_units : num_units;
  plan->row_bits = bits_for(max_rows - 1); /* max_rows >= 1 */
  plan->packed = plan->row_bits + bits_for(per_window - 1) <= 32;
  plan->cache = calloc(1, sizeof(*plan->cache));
  if (plan->cache == NULL) {
    shuffle_plan_free(plan);
    return LARDER_ENOMEM;
  }
  pthread_mutex_init(&plan->cache->lock, NULL);
  *out = plan;
  return 0;
}

void shuffle_plan_free(shuffle_plan_t *plan) {
  if (plan == NULL) return;
  for (uint32_t p = 0; p < plan->nparts; p++) {
    if (plan->part) shuffle_plan_free(plan->part[p]);
    if (plan->part_unit) free(plan->part_unit[p]);
  }
  free(plan->part);
  free(plan->part_unit);
  /* Every cursor is closed by now, so no permutation is left. */
  if (plan->cache) {
    pthread_mutex_destroy(&plan->cache->lock);
    free(plan->cache);
  }
  free(plan->start);
  free(plan->block_first);
  free(plan);
}

int shuffle_partition_assign(const uint64_t *unit_rows, uint32_t num_units,
                             const uint32_t *group_units, uint32_t num_groups, uint32_t partitions,
                             uint64_t seed, uint32_t *unit_part) {
  if (unit_rows == NULL || unit_part == NULL || partitions == 0 || num_units == 0)
    return LARDER_EINVAL;
  if (group_units == NULL) num_groups = num_units;
  uint32_t *first = malloc(((size_t)num_groups + 1) * sizeof(*first));
  uint32_t *order = malloc((size_t)num_groups * sizeof(*order));
  uint64_t *rows = malloc((size_t)num_groups * sizeof(*rows));
  uint8_t *filled = calloc(partitions, 1);
  int rc = first && order && rows && filled ? 0 : LARDER_ENOMEM;
  uint64_t n = 0;
  for (uint32_t g = 0, u = 0; rc == 0 && g < num_groups; g++) {
    uint32_t len = group_units ? group_units[g] : 1;
    if (len == 0 || len > num_units - u) {
      rc = LARDER_EINVAL;
      break;
    }
    first[g] = u;
    rows[g] = 0;
    for (uint32_t i = 0; i < len; i++) rows[g] += unit_rows[u + i];
    n += rows[g];
    u += len;
    first[g + 1] = u;
    order[g] = g;
  }
  if (rc == 0 && (n == 0 || first[num_groups] != num_units)) rc = LARDER_EINVAL;
  if (rc == 0) {
    fisher_yates(order, num_groups, stream_state(seed, 0, PURPOSE_PARTITION, 0));
    uint64_t acc = 0;
    for (uint32_t k = 0; k < num_groups; k++) {
      uint32_t g = order[k];
      /* (2A + R) * P / 2N, in 128 bits: N and P are below 2^64 and 2^32. */
      unsigned __int128 mid = (unsigned __int128)(2 * acc + rows[g]) * partitions;
      uint64_t p = (uint64_t)(mid / ((unsigned __int128)2 * n));
      if (p >= partitions) p = partitions - 1;
      for (uint32_t u = first[g]; u < first[g + 1]; u++) unit_part[u] = (uint32_t)p;
      if (rows[g]) filled[p] = 1;
      acc += rows[g];
    }
    for (uint32_t p = 0; p < partitions && rc == 0; p++)
      if (!filled[p]) rc = LARDER_EINVAL;
  }
  free(first);
  free(order);
  free(rows);
  free(filled);
  return rc;
}

void shuffle_node_partitions(uint32_t partitions, uint32_t nodes, uint32_t node, uint32_t *first,
                             uint32_t *last) {
  if (nodes == 0) nodes = 1;
  if (node >= nodes) node = nodes - 1;
  /* Node n's ranks take offsets [n*G/N, (n+1)*G/N) of each global batch,
   * and partition p offsets [p*G/P, (p+1)*G/P). */
  *first = (uint32_t)((uint64_t)node * partitions / nodes);
  *last = (uint32_t)(((uint64_t)(node + 1) * partitions + nodes - 1) / nodes);
  if (*last > partitions) *last = partitions;
}

int shuffle_plan_create_partitioned(const uint64_t *unit_rows, uint32_t num_units,
                                    const uint32_t *group_units, uint32_t num_groups,
                                    int block_order, const shuffle_params_t *params,
                                    shuffle_plan_t **out) {
  if (out == NULL || params == NULL) return LARDER_EINVAL;
  *out = NULL;
  uint32_t np = params->partitions;
  if (np < 2) {
    shuffle_params_t one = *params;
    one.partitions = 0;
    return shuffle_plan_create_blocked(unit_rows, num_units, block_order ? group_units : NULL,
                                       num_groups, &one, out);
  }
  if (unit_rows == NULL || num_units == 0 || params->batch_size == 0 ||
      params->batch_size > INT_MAX || params->world_size == 0 ||
      params->rank >= params->world_size || params->window_units == 0)
    return LARDER_EINVAL;
  uint64_t g = (uint64_t)params->world_size * params->batch_size;
  if (g % np != 0 || g / np > INT_MAX) return LARDER_EINVAL;
  uint32_t *unit_part = calloc(num_units, sizeof(*unit_part));
  shuffle_plan_t *plan = calloc(1, sizeof(*plan));
  if (unit_part == NULL || plan == NULL) {
    free(unit_part);
    free(plan);
    return LARDER_ENOMEM;
  }
  int rc = shuffle_partition_assign(unit_rows, num_units, group_units, num_groups, np, params->seed,
                                    unit_part);
  plan->params = *params;
  plan->params.shuffle = params->shuffle != 0;
  plan->params.drop_last = params->drop_last != 0;
  plan->num_units = num_units;
  plan->global_batch = g;
  plan->slice = g / np;
  plan->nparts = np;
  /* Arrays of pointers, one per partition. */
  plan->part = calloc(np, sizeof(shuffle_plan_t *)); /* NOLINT(bugprone-sizeof-expression) */
  plan->part_unit = calloc(np, sizeof(uint32_t *));
  uint32_t *count = calloc(np, sizeof(*count));
  uint64_t *prows = malloc((size_t)num_units * sizeof(*prows));
  uint32_t *pgroups = malloc((size_t)num_units * sizeof(*pgroups));
  if (rc == 0 && (plan->part == NULL || plan->part_unit == NULL || count == NULL || prows == NULL ||
                  pgroups == NULL))
    rc = LARDER_ENOMEM;
  for (uint32_t u = 0; rc == 0 && u < num_units; u++)
    if (unit_part[u] < np) count[unit_part[u]]++;
  for (uint32_t p = 0; rc == 0 && p < np; p++) {
    /* Never empty (shuffle_partition_assign refuses that), but never a
     * zero-byte allocation either. */
    plan->part_unit[p] = malloc((size_t)(count[p] ? count[p] : 1) * sizeof(uint32_t));
    if (plan->part_unit[p] == NULL) rc = LARDER_ENOMEM;
  }
  uint64_t min_n = UINT64_MAX, max_n = 0;
  for (uint32_t p = 0; rc == 0 && p < np; p++) {
    /* Partition p's units in dataset order, and its groups among them. */
    uint32_t k = 0, ng = 0;
    for (uint32_t gi = 0, u = 0; u < num_units; gi++) {
      uint32_t len = group_units ? group_units[gi] : 1;
      if (unit_part[u] == p) {
        for (uint32_t i = 0; i < len; i++) {
          plan->part_unit[p][k] = u + i;
          prows[k++] = unit_rows[u + i];
        }
        pgroups[ng++] = len;
      }
      u += len;
    }
    shuffle_params_t sp = *params;
    uint64_t state = stream_state(params->seed, 0, PURPOSE_PARTITION, (uint64_t)p + 1);
    sp.seed = next64(&state);
    sp.window_units = params->window_units / np ? params->window_units / np : 1;
    sp.batch_size = (uint32_t)plan->slice;
    sp.world_size = 1;
    sp.rank = 0;
    sp.partitions = 0;
    sp.local_world_size = 0;
    rc = shuffle_plan_create_blocked(prows, k, block_order ? pgroups : NULL, ng, &sp,
                                     &plan->part[p]);
    if (rc == 0) {
      uint64_t pn = plan->part[p]->num_samples;
      plan->num_samples += pn;
      if (pn < min_n) min_n = pn;
      if (pn > max_n) max_n = pn;
    }
  }
  free(unit_part);
  free(count);
  free(prows);
  free(pgroups);
  if (rc) {
    shuffle_plan_free(plan);
    return rc;
  }
  plan->batches = plan->params.drop_last ? min_n / plan->slice
                                         : max_n / plan->slice + (max_n % plan->slice != 0);
  *out = plan;
  return 0;
}

uint64_t shuffle_num_samples(const shuffle_plan_t *plan) { return plan->num_samples; }

uint64_t shuffle_batches_per_epoch(const shuffle_plan_t *plan) { return plan->batches; }

const shuffle_params_t *shuffle_params(const shuffle_plan_t *plan) { return &plan->params; }

/* ------------------------------------------------------------------------ */
/* Cursors                                                                   */

int shuffle_epoch_open(const shuffle_plan_t *plan, uint64_t epoch, shuffle_epoch_t **out) {
  if (out == NULL) return LARDER_EINVAL;
  *out = NULL;
  if (plan == NULL) return LARDER_EINVAL;
  shuffle_epoch_t *ep = calloc(1, sizeof(*ep));
  if (ep == NULL) return LARDER_ENOMEM;
  ep->plan = plan;
  ep->epoch = epoch;
  ep->win[0].index = ep->win[1].index = NO_WINDOW;
  if (plan->nparts > 1) {
    ep->sub =
        calloc(plan->nparts, sizeof(shuffle_epoch_t *)); /* NOLINT(bugprone-sizeof-expression) */
    if (ep->sub == NULL) {
      free(ep);
      return LARDER_ENOMEM;
    }
    *out = ep;
    return 0;
  }
  if (!plan->params.shuffle) {
    ep->start = plan->start; /* borrowed: dataset order */
    *out = ep;
    return 0;
  }
  uint32_t u = plan->num_units;
  /* Zeroed: the blocks cover every position, which the analyzer cannot
   * tell. */
  ep->order = calloc((size_t)u ? (size_t)u : 1, sizeof(*ep->order));
  ep->start = malloc(((size_t)u + 1) * sizeof(*ep->start));
  if (ep->order == NULL || ep->start == NULL) {
    free(ep->order);
    free(ep->start);
    free(ep);
    return LARDER_ENOMEM;
  }
  if (plan->num_blocks == 0) {
    for (uint32_t i = 0; i < u; i++) ep->order[i] = i;
    fisher_yates(ep->order, u, stream_state(plan->params.seed, epoch, PURPOSE_UNITS, 0));
  } else {
    uint32_t nb = plan->num_blocks;
    uint32_t *blocks = malloc((size_t)nb * sizeof(*blocks));
    if (blocks == NULL) {
      free(ep->order);
      free(ep->start);
      free(ep);
      return LARDER_ENOMEM;
    }
    for (uint32_t b = 0; b < nb; b++) blocks[b] = b;
    fisher_yates(blocks, nb, stream_state(plan->params.seed, epoch, PURPOSE_UNITS, 0));
    uint32_t pos = 0;
    for (uint32_t k = 0; k < nb; k++) {
      uint32_t b = blocks[k];
      uint32_t first = plan->block_first[b], len = plan->block_first[b + 1] - first;
      for (uint32_t i = 0; i < len; i++) ep->order[pos + i] = first + i;
      fisher_yates(ep->order + pos, len, stream_state(plan->params.seed, epoch, PURPOSE_BLOCK, b));
      pos += len;
    }
    free(blocks);
  }
  uint64_t acc = 0;
  for (uint32_t i = 0; i < u; i++) {
    ep->start[i] = acc;
    uint32_t unit = ep->order[i];
    acc += plan->start[unit + 1] - plan->start[unit];
  }
  ep->start[u] = acc;
  *out = ep;
  return 0;
}

static void perm_unref(perm_cache_t *cache, shared_perm_t *sp) {
  if (sp == NULL) return;
  pthread_mutex_lock(&cache->lock);
  int last = --sp->refs == 0;
  if (last) {
    shared_perm_t **pp = &cache->perms;
    while (*pp != sp) pp = &(*pp)->next;
    *pp = sp->next;
  }
  pthread_mutex_unlock(&cache->lock);
  if (last) {
    free(sp->perm);
    free(sp);
  }
}

/* Another cursor's permutation of window w of epoch, with a reference
 * taken, or NULL. */
static shared_perm_t *perm_find(perm_cache_t *cache, uint64_t epoch, uint64_t w) {
  pthread_mutex_lock(&cache->lock);
  shared_perm_t *sp = cache->perms;
  while (sp && !(sp->epoch == epoch && sp->window == w)) sp = sp->next;
  if (sp) sp->refs++;
  pthread_mutex_unlock(&cache->lock);
  return sp;
}

/* Publishes a permutation made by this cursor; returns the one to use
 * (another cursor's, when it published the same window meanwhile). */
static shared_perm_t *perm_publish(perm_cache_t *cache, shared_perm_t *mine) {
  pthread_mutex_lock(&cache->lock);
  shared_perm_t *sp = cache->perms;
  while (sp && !(sp->epoch == mine->epoch && sp->window == mine->window)) sp = sp->next;
  if (sp) {
    sp->refs++;
  } else {
    mine->next = cache->perms;
    cache->perms = mine;
  }
  pthread_mutex_unlock(&cache->lock);
  if (sp) {
    free(mine->perm);
    free(mine);
    return sp;
  }
  return mine;
}

/* Frees the order ep was making, if any. */
static void pending_drop(shuffle_epoch_t *ep) {
  if (ep->pending == NULL) return;
  free(ep->pending->perm);
  free(ep->pending);
  ep->pending = NULL;
}

void shuffle_epoch_close(shuffle_epoch_t *ep) {
  if (ep == NULL) return;
  if (ep->sub) {
    for (uint32_t p = 0; p < ep->plan->nparts; p++) shuffle_epoch_close(ep->sub[p]);
    free(ep->sub);
    free(ep->seen);
    free(ep);
    return;
  }
  if (ep->order != NULL) free(ep->start); /* else borrowed from the plan */
  free(ep->order);
  perm_unref(ep->plan->cache, ep->win[0].shared);
  perm_unref(ep->plan->cache, ep->win[1].shared);
  pending_drop(ep);
  free(ep->seen);
  free(ep);
}

/* The largest i in [lo, lo + n) with start[i] <= x, for n >= 1 and
 * start[lo] <= x < start[lo + n]: the unit holding position x (never one of
 * no rows, since those have start[i] == start[i + 1]). */
static inline uint32_t find_unit(const uint64_t *start, uint32_t lo, uint32_t n, uint64_t x) {
  const uint64_t *base = start + lo;
  while (n > 1) {
    uint32_t half = n / 2;
    if (base[half] <= x) base += half;
    n -= half;
  }
  return (uint32_t)(base - start);
}

/* Window w's first unit (in the unit order), its number of units and its
 * rows. */
static void window_extent(const shuffle_epoch_t *ep, uint64_t w, uint32_t *first, uint32_t *nunits,
                          uint32_t *rows) {
  const shuffle_plan_t *plan = ep->plan;
  uint64_t f = w * plan->params.window_units; /* < num_units */
  uint64_t end = f + plan->params.window_units;
  if (end > plan->num_units) end = plan->num_units;
  *first = (uint32_t)f;
  *nunits = (uint32_t)(end - f);
  *rows = (uint32_t)(ep->start[end] - ep->start[f]); /* <= UINT32_MAX */
}

/* Starts making window w's row order in ep->pending (dropping any other
 * pending one): the rows in window order, and the stream that shuffles
 * them.  Returns 0 or LARDER_ENOMEM. */
static int perm_start(shuffle_epoch_t *ep, uint64_t w) {
  const shuffle_plan_t *plan = ep->plan;
  pending_drop(ep);
  uint32_t first, nunits, rows;
  window_extent(ep, w, &first, &nunits, &rows);
  (void)nunits;
  shared_perm_t *sp = calloc(1, sizeof(*sp));
  if (sp == NULL) return LARDER_ENOMEM;
  /* Not zeroed: pending_steps writes every entry before the shuffle reads
   * any. */
  sp->perm = malloc((size_t)(rows ? rows : 1) * sizeof(*sp->perm));
  if (sp->perm == NULL) {
    free(sp);
    return LARDER_ENOMEM;
  }
  sp->epoch = ep->epoch;
  sp->window = w;
  sp->rows = rows;
  sp->refs = 1;
  ep->pending = sp;
  ep->pending_left = rows;
  ep->pending_state = stream_state(plan->params.seed, ep->epoch, PURPOSE_WINDOW, w);
  ep->pending_filled = 0;
  ep->pending_first = first;
  ep->pending_unit = 0;
  return 0;
}

/* Makes progress on ep->pending: writes its entries (the rows in window
 * order; packed: the index of the row's unit in the window << row_bits |
 * the row), then shuffles them, about `budget` entries or swaps in all.
 * Returns nonzero once the order is made. */
static int pending_steps(shuffle_epoch_t *ep, uint64_t budget) {
  const shuffle_plan_t *plan = ep->plan;
  shared_perm_t *sp = ep->pending;
  if (ep->pending_filled < sp->rows) {
    uint32_t from = ep->pending_filled;
    uint32_t to = sp->rows - from > budget ? from + (uint32_t)budget : sp->rows;
    if (plan->packed) {
      const uint64_t *start = ep->start + ep->pending_first;
      uint32_t k = ep->pending_unit;
      for (uint32_t q = from; q < to;) {
        /* Units of no rows end where they begin: skip them. */
        while (start[k + 1] - start[0] <= q) k++;
        uint32_t unit_end = (uint32_t)(start[k + 1] - start[0]);
        uint32_t row = q - (uint32_t)(start[k] - start[0]);
        uint32_t tag = (uint32_t)((uint64_t)k << plan->row_bits);
        uint32_t stop = unit_end < to ? unit_end : to;
        for (; q < stop; q++) sp->perm[q] = tag | row++;
      }
      ep->pending_unit = k;
    } else {
      for (uint32_t q = from; q < to; q++) sp->perm[q] = q;
    }
    ep->pending_filled = to;
    budget -= to - from;
    if (to < sp->rows || (budget == 0 && ep->pending_left > 1)) return 0;
  }
  fisher_yates_steps(sp->perm, &ep->pending_left, &ep->pending_state, budget);
  return ep->pending_left <= 1;
}

/* Takes a slot of ep for window w (a free one, else the one used least
 * recently, whose order it lets go) and sets its extent; the caller gives
 * it its order with slot_fill. */
static window_t *slot_claim(shuffle_epoch_t *ep, uint64_t w) {
  window_t *slot;
  if (ep->win[0].index == NO_WINDOW) slot = &ep->win[0];
  else if (ep->win[1].index == NO_WINDOW) slot = &ep->win[1];
  else slot = ep->win[0].last_use <= ep->win[1].last_use ? &ep->win[0] : &ep->win[1];
  slot->index = NO_WINDOW;
  perm_unref(ep->plan->cache, slot->shared);
  slot->shared = NULL;
  slot->perm = NULL;
  window_extent(ep, w, &slot->first, &slot->nunits, &slot->rows);
  slot->begin = ep->start[slot->first];
  return slot;
}

static void slot_fill(shuffle_epoch_t *ep, window_t *slot, uint64_t w, shared_perm_t *sp) {
  slot->shared = sp;
  slot->perm = sp->perm;
  slot->index = w;
  slot->last_use = ++ep->clock;
}

/* The row order of window w (which has rows), made if not cached. */
static int get_window(shuffle_epoch_t *ep, uint64_t w, window_t **out) {
  for (int i = 0; i < 2; i++) {
    if (ep->win[i].index == w) {
      ep->win[i].last_use = ++ep->clock;
      *out = &ep->win[i];
      return 0;
    }
  }
  window_t *slot = slot_claim(ep, w);
  shared_perm_t *sp = perm_find(ep->plan->cache, ep->epoch, w);
  if (sp == NULL) {
    /* Finish the order shuffle_epoch_prepare began, or make it whole. */
    if (ep->pending == NULL || ep->pending->window != w) {
      int rc = perm_start(ep, w);
      if (rc < 0) return rc;
    }
    pending_steps(ep, UINT64_MAX);
    sp = ep->pending;
    ep->pending = NULL;
    sp = perm_publish(ep->plan->cache, sp);
  }
  slot_fill(ep, slot, w, sp);
  *out = slot;
  return 0;
}

/* Writes the samples at epoch positions [x, x + n), x + n <= N. */
static int map_segment(shuffle_epoch_t *ep, uint64_t x, uint64_t n, shuffle_sample_t *out) {
  const shuffle_plan_t *plan = ep->plan;
  const uint64_t *start = ep->start;
  if (!plan->params.shuffle) {
    uint32_t i = find_unit(start, 0, plan->num_units, x);
    while (n > 0) {
      uint64_t take = start[i + 1] - x;
      if (take > n) take = n;
      uint32_t row = (uint32_t)(x - start[i]);
      for (uint64_t k = 0; k < take; k++) {
        out->unit = i;
        out->row = row + (uint32_t)k;
        out++;
      }
      x += take;
      n -= take;
      i++;
    }
    return 0;
  }
  const uint32_t *order = ep->order;
  while (n > 0) {
    uint32_t i = find_unit(start, 0, plan->num_units, x);
    window_t *win;
    int rc = get_window(ep, i / plan->params.window_units, &win);
    if (rc < 0) return rc;
    uint64_t q = x - win->begin;
    uint64_t take = win->rows - q;
    if (take > n) take = n;
    const uint32_t *perm = win->perm + q;
    if (plan->packed) {
      const uint32_t *units = order + win->first;
      unsigned rb = plan->row_bits;
      uint32_t mask = (uint32_t)((UINT64_C(1) << rb) - 1);
      for (uint64_t k = 0; k < take; k++) {
        uint32_t v = perm[k];
        out->unit = units[(uint64_t)v >> rb];
        out->row = v & mask;
        out++;
      }
    } else {
      uint32_t lo = win->first, nu = win->nunits;
      uint64_t begin = win->begin;
      for (uint64_t k = 0; k < take; k++) {
        uint64_t pos = begin + perm[k];
        uint32_t u = find_unit(start, lo, nu, pos);
        out->unit = order[u];
        out->row = (uint32_t)(pos - start[u]);
        out++;
      }
    }
    x += take;
    n -= take;
  }
  return 0;
}

/* Writes the samples at positions [p, p + n) of the padded epoch. */
static int map_positions(shuffle_epoch_t *ep, uint64_t p, uint64_t n, shuffle_sample_t *out) {
  uint64_t total = ep->plan->num_samples;
  uint64_t x = p % total;
  while (n > 0) {
    uint64_t take = total - x;
    if (take > n) take = n;
    int rc = map_segment(ep, x, take, out);
    if (rc < 0) return rc;
    out += take;
    n -= take;
    x = 0;
  }
  return 0;
}

/* The first position of this rank's part of batch b. */
static uint64_t batch_position(const shuffle_plan_t *plan, uint64_t b) {
  return b * plan->global_batch + (uint64_t)plan->params.rank * plan->params.batch_size;
}

/* Partition p's cursor, opened when first needed. */
static int sub_cursor(shuffle_epoch_t *ep, uint32_t p, shuffle_epoch_t **out) {
  if (ep->sub[p] == NULL) {
    int rc = shuffle_epoch_open(ep->plan->part[p], ep->epoch, &ep->sub[p]);
    if (rc < 0) return rc;
  }
  *out = ep->sub[p];
  return 0;
}

/* Writes the samples at offsets [o, o + n) of global batch b (o + n <= G),
 * in dataset unit indices. */
static int map_global(shuffle_epoch_t *ep, uint64_t b, uint64_t o, uint64_t n,
                      shuffle_sample_t *out) {
  const shuffle_plan_t *plan = ep->plan;
  if (plan->nparts <= 1) return map_positions(ep, b * plan->global_batch + o, n, out);
  while (n > 0) {
    uint32_t p = (uint32_t)(o / plan->slice);
    uint64_t within = o - (uint64_t)p * plan->slice;
    uint64_t take = plan->slice - within;
    if (take > n) take = n;
    shuffle_epoch_t *sub;
    int rc = sub_cursor(ep, p, &sub);
    if (rc == 0) rc = map_positions(sub, b * plan->slice + within, take, out);
    if (rc < 0) return rc;
    const uint32_t *to = plan->part_unit[p];
    for (uint64_t k = 0; k < take; k++) out[k].unit = to[out[k].unit];
    out += take;
    o += take;
    n -= take;
  }
  return 0;
}

int shuffle_epoch_batch(shuffle_epoch_t *ep, uint64_t batch, shuffle_sample_t *out) {
  if (ep == NULL || out == NULL || batch >= ep->plan->batches) return LARDER_EINVAL;
  const shuffle_plan_t *plan = ep->plan;
  int rc = map_global(ep, batch, (uint64_t)plan->params.rank * plan->params.batch_size,
                      plan->params.batch_size, out);
  return rc < 0 ? rc : (int)plan->params.batch_size;
}

static int prepare_at(shuffle_epoch_t *ep, uint64_t x, uint64_t budget);

int shuffle_epoch_prepare(shuffle_epoch_t *ep, uint64_t batch, uint64_t budget) {
  if (ep == NULL || batch >= ep->plan->batches) return LARDER_EINVAL;
  const shuffle_plan_t *plan = ep->plan;
  if (!plan->params.shuffle || plan->num_samples == 0) return 1;
  if (plan->nparts <= 1)
    return prepare_at(ep, batch_position(plan, batch) % plan->num_samples, budget);
  /* Each partition the rank's part of the batch draws on, in turn. */
  uint64_t o = (uint64_t)plan->params.rank * plan->params.batch_size;
  uint64_t end = o + plan->params.batch_size;
  while (o < end) {
    uint32_t p = (uint32_t)(o / plan->slice);
    uint64_t within = o - (uint64_t)p * plan->slice;
    shuffle_epoch_t *sub;
    int rc = sub_cursor(ep, p, &sub);
    if (rc == 0)
      rc = prepare_at(sub, (batch * plan->slice + within) % sub->plan->num_samples, budget);
    if (rc <= 0) return rc;
    o += plan->slice - within;
  }
  return 1;
}

/* shuffle_epoch_prepare for the window holding epoch position x (< N) of
 * an unpartitioned cursor. */
static int prepare_at(shuffle_epoch_t *ep, uint64_t x, uint64_t budget) {
  const shuffle_plan_t *plan = ep->plan;
  uint64_t w = find_unit(ep->start, 0, plan->num_units, x) / plan->params.window_units;
  if (ep->win[0].index == w || ep->win[1].index == w) return 1;
  /* Another cursor of the plan made it already (perhaps while this one
   * was part way through): hold theirs. */
  shared_perm_t *made = perm_find(plan->cache, ep->epoch, w);
  if (made != NULL) {
    if (ep->pending != NULL && ep->pending->window == w) pending_drop(ep);
    slot_fill(ep, slot_claim(ep, w), w, made);
    return 1;
  }
  if (ep->pending == NULL || ep->pending->window != w) {
    int rc = perm_start(ep, w);
    if (rc < 0) return rc;
  }
  if (!pending_steps(ep, budget)) return 0;
  window_t *win;
  int rc = get_window(ep, w, &win);
  return rc < 0 ? rc : 1;
}

/* The common start of shuffle_epoch_units and shuffle_epoch_window_units:
 * checks the arguments, clamps last and max, and makes the bitmap of units
 * listed.  Returns 1 to go on, 0 when there is nothing to list, or a
 * negative code. */
static int units_begin(shuffle_epoch_t *ep, uint64_t first, uint64_t *last, const uint32_t *units,
                       uint32_t *max) {
  if (ep == NULL || first > *last || (units == NULL && *max > 0)) return LARDER_EINVAL;
  const shuffle_plan_t *plan = ep->plan;
  if (*last > plan->batches) *last = plan->batches;
  if (*max > INT_MAX) *max = INT_MAX;
  if (first >= *last || *max == 0 || plan->num_samples == 0) return 0;
  if (ep->seen == NULL) {
    ep->seen = calloc(((size_t)plan->num_units + 63) / 64, sizeof(uint64_t));
    if (ep->seen == NULL) return LARDER_ENOMEM;
  }
  return 1;
}

/* Leaves the bitmap clear for the next call. */
static void units_end(shuffle_epoch_t *ep, const uint32_t *units, uint32_t count) {
  for (uint32_t k = 0; k < count; k++) ep->seen[units[k] / 64] &= ~(UINT64_C(1) << (units[k] % 64));
}

/* Appends unit u unless the bitmap has it; returns the new count. */
static inline uint32_t units_add(shuffle_epoch_t *ep, uint32_t u, uint32_t *units, uint32_t count) {
  uint64_t bit = UINT64_C(1) << (u % 64);
  if (ep->seen[u / 64] & bit) return count;
  ep->seen[u / 64] |= bit;
  units[count] = u;
  return count + 1;
}

int shuffle_epoch_units(shuffle_epoch_t *ep, uint64_t first, uint64_t last, uint32_t *units,
                        uint32_t max) {
  int go = units_begin(ep, first, &last, units, &max);
  if (go <= 0) return go;
  const shuffle_plan_t *plan = ep->plan;
  enum { CHUNK = 512 };
  shuffle_sample_t buf[CHUNK] = {{0, 0}};
  uint32_t count = 0;
  int rc = 0;
  for (uint64_t b = first; b < last && count < max && rc == 0; b++) {
    uint64_t p = (uint64_t)plan->params.rank * plan->params.batch_size;
    uint64_t left = plan->params.batch_size;
    while (left > 0 && count < max) {
      uint64_t n = left < CHUNK ? left : CHUNK;
      rc = map_global(ep, b, p, n, buf);
      if (rc < 0) break;
      for (uint64_t k = 0; k < n && count < max; k++)
        count = units_add(ep, buf[k].unit, units, count);
      p += n;
      left -= n;
    }
  }
  units_end(ep, units, count);
  return rc < 0 ? rc : (int)count;
}

/* Appends the units at epoch-order positions [from, to) that hold rows and
 * are not in the bitmap yet. */
static uint32_t add_unit_span(shuffle_epoch_t *ep, uint32_t from, uint32_t to, uint32_t *units,
                              uint32_t count, uint32_t max) {
  for (uint32_t pos = from; pos < to && count < max; pos++)
    if (ep->start[pos + 1] != ep->start[pos])
      count = units_add(ep, ep->order ? ep->order[pos] : pos, units, count);
  return count;
}

static uint32_t window_units_at(shuffle_epoch_t *ep, uint64_t p0, uint64_t len, uint32_t *units,
                                uint32_t count, uint32_t max);

int shuffle_epoch_window_units(shuffle_epoch_t *ep, uint64_t first, uint64_t last, uint32_t *units,
                               uint32_t max) {
  int go = units_begin(ep, first, &last, units, &max);
  if (go <= 0) return go;
  const shuffle_plan_t *plan = ep->plan;
  uint32_t count = 0;
  if (plan->nparts <= 1) {
    count = window_units_at(ep, first * plan->global_batch, (last - first) * plan->global_batch,
                            units, 0, max);
    units_end(ep, units, count);
    return (int)count;
  }
  /* The partitions this rank's node draws on: its ranks' offsets of each
   * global batch. */
  uint32_t l =
      plan->params.local_world_size ? plan->params.local_world_size : plan->params.world_size;
  uint64_t node = plan->params.rank / l, bs = plan->params.batch_size;
  uint64_t lo = node * l * bs, hi = lo + (uint64_t)l * bs;
  if (hi > plan->global_batch) hi = plan->global_batch;
  int rc = 0;
  for (uint32_t p = (uint32_t)(lo / plan->slice); p < plan->nparts && rc == 0 && count < max; p++) {
    if ((uint64_t)p * plan->slice >= hi) break;
    shuffle_epoch_t *sub;
    rc = sub_cursor(ep, p, &sub);
    if (rc < 0) break;
    uint32_t pn = sub->plan->num_units;
    if (sub->seen == NULL) sub->seen = calloc(((size_t)pn + 63) / 64 + 1, sizeof(uint64_t));
    uint32_t *local = malloc((size_t)(pn ? pn : 1) * sizeof(*local));
    if (sub->seen == NULL || local == NULL) {
      free(local);
      rc = LARDER_ENOMEM;
      break;
    }
    uint32_t k =
        window_units_at(sub, first * plan->slice, (last - first) * plan->slice, local, 0, pn);
    units_end(sub, local, k);
    for (uint32_t i = 0; i < k && count < max; i++)
      count = units_add(ep, plan->part_unit[p][local[i]], units, count);
    free(local);
  }
  units_end(ep, units, count);
  return rc < 0 ? rc : (int)count;
}

/* Appends to units (from count, up to max) the units of the windows that
 * epoch positions [p0, p0 + len) of an unpartitioned cursor draw on,
 * wrapping past N; returns the new count. */
static uint32_t window_units_at(shuffle_epoch_t *ep, uint64_t p0, uint64_t len, uint32_t *units,
                                uint32_t count, uint32_t max) {
  const shuffle_plan_t *plan = ep->plan;
  uint64_t n = plan->num_samples;
  uint64_t ranges[2][2];
  int nr = 1;
  if (len >= n) {
    ranges[0][0] = 0;
    ranges[0][1] = n;
  } else {
    uint64_t a = p0 % n;
    ranges[0][0] = a;
    ranges[0][1] = a + len <= n ? a + len : n;
    if (a + len > n) {
      ranges[1][0] = 0;
      ranges[1][1] = a + len - n;
      nr = 2;
    }
  }
  uint32_t nu = plan->num_units;
  uint32_t w = plan->params.shuffle ? plan->params.window_units : 1;
  for (int r = 0; r < nr; r++) {
    /* The units holding the range's ends, widened to whole windows. */
    uint32_t i0 = find_unit(ep->start, 0, nu, ranges[r][0]);
    uint32_t i1 = find_unit(ep->start, 0, nu, ranges[r][1] - 1);
    uint32_t from = i0 / w * w;
    uint64_t to = ((uint64_t)i1 / w + 1) * w;
    count = add_unit_span(ep, from, to < nu ? (uint32_t)to : nu, units, count, max);
  }
  return count;
}
