/*
 * test-partitions.c: node partitions of the epoch order (shuffle.h, steps
 * 7-10), through the public API of daemon/plan/shuffle.c.
 *
 * A dataset here is a list of row groups, each cut into units of made-up
 * row counts; a sample is named by its dataset index (the rows of the units
 * before its unit, plus its row).  The checks: every sample once per epoch
 * over all ranks (plus the documented padding, or minus the dropped tail);
 * global batch k the same set of samples for every world size with the same
 * global batch; the ranks of a node reading their node's partitions alone
 * when the node count divides P; the prefetch sets of a node covering what
 * its ranks read and nothing of other nodes' partitions; partitions of
 * nearly equal rows; P = 1 giving today's order exactly.
 */
#include <stdlib.h>
#include <string.h>

#include "larder.h"
#include "plan/shuffle.h"
#include "task.h"

typedef struct pdata {
  uint32_t units, groups;
  uint64_t *rows;        /* per unit */
  uint32_t *group_units; /* per group */
  uint64_t *prefix;      /* units + 1 */
  uint64_t n;
} pdata;

/* num_groups row groups of 1 to 4 units of 20 to 139 rows, by seed. */
static void pdata_make(pdata *d, uint32_t num_groups, uint64_t seed) {
  memset(d, 0, sizeof(*d));
  d->groups = num_groups;
  d->group_units = calloc(num_groups, sizeof(uint32_t));
  d->rows = calloc((size_t)num_groups * 4, sizeof(uint64_t));
  ASSERT(d->group_units && d->rows);
  uint64_t s = seed * 2654435761u + 1;
  for (uint32_t g = 0; g < num_groups; g++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    d->group_units[g] = 1 + (uint32_t)((s >> 33) % 4);
    for (uint32_t i = 0; i < d->group_units[g]; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      d->rows[d->units++] = 20 + (s >> 33) % 120;
    }
  }
  d->prefix = calloc((size_t)d->units + 1, sizeof(uint64_t));
  ASSERT_NOT_NULL(d->prefix);
  for (uint32_t u = 0; u < d->units; u++) d->prefix[u + 1] = d->prefix[u] + d->rows[u];
  d->n = d->prefix[d->units];
}

static void pdata_free(pdata *d) {
  free(d->rows);
  free(d->group_units);
  free(d->prefix);
}

static shuffle_params_t pparams(uint64_t seed, uint32_t window, uint32_t bs, uint32_t ws,
                                uint32_t rank, uint32_t parts, uint32_t local, int drop_last) {
  shuffle_params_t p;
  memset(&p, 0, sizeof(p));
  p.seed = seed;
  p.shuffle = 1;
  p.window_units = window;
  p.batch_size = bs;
  p.world_size = ws;
  p.rank = rank;
  p.partitions = parts;
  p.local_world_size = local;
  p.drop_last = drop_last;
  return p;
}

static shuffle_plan_t *pplan(const pdata *d, const shuffle_params_t *p) {
  shuffle_plan_t *plan = NULL;
  int rc =
      shuffle_plan_create_partitioned(d->rows, d->units, d->group_units, d->groups, 0, p, &plan);
  if (rc) ASSERT_FAIL_("plan: %s", larder_err_name(rc));
  return plan;
}

/* Every rank's batches of one epoch, as dataset indices: out[b][r * bs + k].
 * Returns the batches per epoch. */
static uint64_t read_epoch(const pdata *d, uint64_t seed, uint32_t window, uint32_t ws, uint64_t g,
                           uint32_t parts, uint32_t local, int drop_last, uint64_t epoch,
                           uint64_t **out) {
  uint32_t bs = (uint32_t)(g / ws);
  uint64_t batches = 0;
  uint64_t *all = NULL;
  shuffle_sample_t *buf = calloc(bs, sizeof(*buf));
  ASSERT_NOT_NULL(buf);
  for (uint32_t r = 0; r < ws; r++) {
    shuffle_params_t p = pparams(seed, window, bs, ws, r, parts, local, drop_last);
    shuffle_plan_t *plan = pplan(d, &p);
    if (r == 0) {
      batches = shuffle_batches_per_epoch(plan);
      all = calloc((size_t)(batches * g + 1), sizeof(uint64_t));
      ASSERT_NOT_NULL(all);
    }
    ASSERT_EQ(shuffle_batches_per_epoch(plan), batches);
    shuffle_epoch_t *ep = NULL;
    ASSERT_OK(shuffle_epoch_open(plan, epoch, &ep));
    for (uint64_t b = 0; b < batches; b++) {
      ASSERT_EQ(shuffle_epoch_batch(ep, b, buf), (int)bs);
      for (uint32_t k = 0; k < bs; k++) {
        ASSERT_LT(buf[k].unit, d->units);
        ASSERT_LT(buf[k].row, d->rows[buf[k].unit]);
        all[b * g + (uint64_t)r * bs + k] = d->prefix[buf[k].unit] + buf[k].row;
      }
    }
    shuffle_epoch_close(ep);
    shuffle_plan_free(plan);
  }
  free(buf);
  *out = all;
  return batches;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/*
 * Every sample once per epoch over every rank, with and without drop_last,
 * for world sizes 1 to 8 with one global batch: without drop_last every
 * sample is read, and the repeats are only the padding; with it no sample
 * twice.  Global batch k holds the same samples for every world size, and a
 * new epoch reorders.
 */
TEST_IMPL(partitions_exactly_once) {
  pdata d;
  pdata_make(&d, 61, 7);
  const uint64_t g = 64;
  const uint32_t parts = 4;
  for (int drop = 0; drop < 2; drop++) {
    uint64_t *ref = NULL, ref_batches = 0;
    for (uint32_t ws = 1; ws <= 8; ws *= 2) {
      uint64_t *all;
      uint64_t batches = read_epoch(&d, 11, 8, ws, g, parts, 2, drop, 3, &all);
      ASSERT_GT(batches, 0);
      uint64_t total = batches * g;
      uint32_t *seen = calloc(d.n, sizeof(uint32_t));
      ASSERT_NOT_NULL(seen);
      for (uint64_t i = 0; i < total; i++) seen[all[i]]++;
      uint64_t distinct = 0, repeats = 0;
      for (uint64_t x = 0; x < d.n; x++) {
        distinct += seen[x] > 0;
        if (seen[x] > 1) repeats += seen[x] - 1;
      }
      if (drop) {
        ASSERT_EQ(repeats, 0);
        ASSERT_EQ(distinct, total);
        /* The dropped tail: less than one slice of each partition beyond
         * the smallest one's, plus the partitions' differences. */
        ASSERT_LE(total, d.n);
      } else {
        ASSERT_EQ(distinct, d.n);
        ASSERT_EQ(repeats, total - d.n);
      }
      free(seen);
      /* Each global batch as a set, the same for every world size. */
      for (uint64_t b = 0; b < batches; b++) qsort(all + b * g, g, sizeof(uint64_t), cmp_u64);
      if (ref == NULL) {
        ref = all;
        ref_batches = batches;
      } else {
        ASSERT_EQ(batches, ref_batches);
        ASSERT_EQ(memcmp(all, ref, total * sizeof(uint64_t)), 0);
        free(all);
      }
    }
    /* Another epoch is another order. */
    uint64_t *other;
    read_epoch(&d, 11, 8, 2, g, parts, 2, drop, 4, &other);
    for (uint64_t b = 0; b < ref_batches; b++) qsort(other + b * g, g, sizeof(uint64_t), cmp_u64);
    ASSERT(memcmp(other, ref, ref_batches * g * sizeof(uint64_t)) != 0);
    free(other);
    free(ref);
  }
  pdata_free(&d);
  return 0;
}

/*
 * The partitions: nearly equal rows (within the largest group of the
 * mean), whole row groups, the same for any epoch (a function of the seed),
 * another assignment for another seed; too many partitions for the groups
 * is refused; the nodes' partitions tile [0, P).
 */
TEST_IMPL(partitions_assign) {
  pdata d;
  pdata_make(&d, 200, 3);
  uint32_t *part = calloc(d.units, sizeof(uint32_t)), *other = calloc(d.units, sizeof(uint32_t));
  ASSERT(part && other);
  for (uint32_t parts = 2; parts <= 16; parts *= 2) {
    ASSERT_OK(shuffle_partition_assign(d.rows, d.units, d.group_units, d.groups, parts, 5, part));
    uint64_t *prow = calloc(parts, sizeof(uint64_t));
    ASSERT_NOT_NULL(prow);
    uint64_t largest = 0;
    for (uint32_t g = 0, u = 0; g < d.groups; g++) {
      uint64_t gr = 0;
      for (uint32_t i = 0; i < d.group_units[g]; i++) {
        ASSERT_EQ(part[u + i], part[u]); /* a group is never split */
        gr += d.rows[u + i];
      }
      if (gr > largest) largest = gr;
      u += d.group_units[g];
    }
    for (uint32_t u = 0; u < d.units; u++) prow[part[u]] += d.rows[u];
    for (uint32_t p = 0; p < parts; p++) {
      int64_t off = (int64_t)prow[p] - (int64_t)(d.n / parts);
      if (off < 0) off = -off;
      ASSERT_LE((uint64_t)off, largest);
    }
    free(prow);
    ASSERT_OK(shuffle_partition_assign(d.rows, d.units, d.group_units, d.groups, parts, 6, other));
    ASSERT(memcmp(part, other, d.units * sizeof(uint32_t)) != 0);
  }
  ASSERT_EQ(
      shuffle_partition_assign(d.rows, d.units, d.group_units, d.groups, d.groups + 1, 5, part),
      LARDER_EINVAL);
  for (uint32_t nodes = 1; nodes <= 8; nodes++) {
    uint32_t prev_last = 0;
    for (uint32_t n = 0; n < nodes; n++) {
      uint32_t a, b;
      shuffle_node_partitions(8, nodes, n, &a, &b);
      ASSERT_LE(a, prev_last);
      ASSERT_LT(a, b);
      if (8 % nodes == 0) ASSERT_EQ(a, prev_last);
      prev_last = b;
    }
    ASSERT_EQ(prev_last, 8);
  }
  free(part);
  free(other);
  pdata_free(&d);
  return 0;
}

/*
 * With N nodes of two ranks each and N dividing P = 4, every sample a rank
 * reads lies in its node's partitions, and the units its node prefetches
 * (shuffle_epoch_window_units) cover every unit its ranks read and lie in
 * its node's partitions alone.  With N = 3 (not dividing 4) a node reads a
 * partition its neighbour reads too.
 */
TEST_IMPL(partitions_node_local) {
  pdata d;
  pdata_make(&d, 80, 9);
  const uint32_t parts = 4, local = 2;
  uint32_t *part = calloc(d.units, sizeof(uint32_t));
  ASSERT_NOT_NULL(part);
  ASSERT_OK(shuffle_partition_assign(d.rows, d.units, d.group_units, d.groups, parts, 21, part));
  uint32_t *units = calloc(d.units, sizeof(uint32_t)), *win = calloc(d.units, sizeof(uint32_t));
  uint8_t *mark = calloc(d.units, 1);
  ASSERT(units && win && mark);
  for (uint32_t nodes = 1; nodes <= 4; nodes++) {
    uint32_t ws = nodes * local, bs = 96 / ws; /* G = 96, a multiple of P */
    if (96 % ws) continue;
    for (uint32_t r = 0; r < ws; r++) {
      uint32_t node = r / local, pa, pb;
      shuffle_node_partitions(parts, nodes, node, &pa, &pb);
      shuffle_params_t p = pparams(21, 8, bs, ws, r, parts, local, 0);
      shuffle_plan_t *plan = pplan(&d, &p);
      shuffle_epoch_t *ep = NULL;
      ASSERT_OK(shuffle_epoch_open(plan, 1, &ep));
      uint64_t batches = shuffle_batches_per_epoch(plan);
      int nu = shuffle_epoch_units(ep, 0, batches, units, d.units);
      int nw = shuffle_epoch_window_units(ep, 0, batches, win, d.units);
      ASSERT_GT(nu, 0);
      ASSERT_GE(nw, nu);
      memset(mark, 0, d.units);
      for (int i = 0; i < nw; i++) {
        if (parts % nodes == 0) {
          ASSERT_GE(part[win[i]], pa);
          ASSERT_LT(part[win[i]], pb);
        }
        mark[win[i]] = 1;
      }
      for (int i = 0; i < nu; i++) {
        ASSERT(mark[units[i]]);
        if (parts % nodes == 0) {
          ASSERT_GE(part[units[i]], pa);
          ASSERT_LT(part[units[i]], pb);
        }
      }
      /* Preparing a batch's windows, a slice at a time, ends. */
      int done = 0;
      for (int k = 0; k < 100000 && done == 0; k++) done = shuffle_epoch_prepare(ep, 0, 16);
      ASSERT_EQ(done, 1);
      shuffle_epoch_close(ep);
      shuffle_plan_free(plan);
    }
  }
  free(units);
  free(win);
  free(mark);
  free(part);
  pdata_free(&d);
  return 0;
}

/* P = 1 (and 0) is the order of before, to the sample; a global batch that
 * is not a multiple of P is refused. */
TEST_IMPL(partitions_one_is_today) {
  pdata d;
  pdata_make(&d, 30, 1);
  shuffle_sample_t a[48], b[48];
  for (uint32_t r = 0; r < 2; r++) {
    shuffle_params_t p0 = pparams(5, 4, 48, 2, r, 0, 0, 0), p1 = p0;
    p1.partitions = 1;
    shuffle_plan_t *x = NULL, *y = NULL;
    ASSERT_OK(shuffle_plan_create(d.rows, d.units, &p0, &x));
    ASSERT_OK(
        shuffle_plan_create_partitioned(d.rows, d.units, d.group_units, d.groups, 0, &p1, &y));
    ASSERT_EQ(shuffle_batches_per_epoch(x), shuffle_batches_per_epoch(y));
    shuffle_epoch_t *ex, *ey;
    ASSERT_OK(shuffle_epoch_open(x, 2, &ex));
    ASSERT_OK(shuffle_epoch_open(y, 2, &ey));
    for (uint64_t k = 0; k < shuffle_batches_per_epoch(x); k++) {
      ASSERT_EQ(shuffle_epoch_batch(ex, k, a), 48);
      ASSERT_EQ(shuffle_epoch_batch(ey, k, b), 48);
      ASSERT_EQ(memcmp(a, b, sizeof(a)), 0);
    }
    shuffle_epoch_close(ex);
    shuffle_epoch_close(ey);
    shuffle_plan_free(x);
    shuffle_plan_free(y);
  }
  shuffle_params_t bad = pparams(5, 4, 5, 3, 0, 4, 0, 0); /* G = 15 */
  shuffle_plan_t *z = NULL;
  ASSERT_EQ(shuffle_plan_create_partitioned(d.rows, d.units, d.group_units, d.groups, 0, &bad, &z),
            LARDER_EINVAL);
  pdata_free(&d);
  return 0;
}
