/*
 * label-mix.c: how well larder's windowed shuffle (daemon/plan/shuffle.c) mixes a
 * dataset stored sorted by label, and how fast it computes an epoch's order.
 *
 * Usage: label-mix [max_rows]     (default: every dataset, up to 100M rows)
 *
 * Each synthetic dataset has N rows in units of 65536 rows (the last one
 * shorter) and 10 labels, stored sorted: row g has label g * 10 / N.  For
 * each window_units W the program reads one epoch (seed 1, epoch 0, batch
 * 256, world_size 1, drop_last) and reports:
 *   - mean TV: the mean over batches of the total-variation distance between
 *     the batch's label histogram and the dataset's;
 *   - uniform: the same for a perfect shuffle (Fisher-Yates over all N
 *     labels), the best any order can do on average;
 *   - window rows: the rows of the largest window, which the daemon must hold
 *     (decoded, or at least fetched) at once, and the bytes of the window's
 *     row permutation (4 per row) that each cursor keeps;
 *   - the time the cursor took for the epoch (opening it and every
 *     shuffle_epoch_batch call, nothing else) and samples per second.
 * A second table shows the per-rank cost when world_size is 8: every rank
 * still generates every window's permutation, but maps only its own slice.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "larder.h"
#include "plan/shuffle.h"
#include "bench-util.h"

#define CLASSES 10
#define UNIT_ROWS 65536u /* for the first two tables */
#define BATCH 256u

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL) {
    fprintf(stderr, "label-mix: out of memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}

typedef struct dataset {
  uint64_t n;
  uint32_t unit_rows;
  uint32_t units;
  uint64_t *rows;   /* per unit */
  uint64_t *prefix; /* units + 1 */
  double share[CLASSES];
} dataset_t;

static void dataset_init(dataset_t *d, uint64_t n, uint32_t unit_rows) {
  d->n = n;
  d->unit_rows = unit_rows;
  d->units = (uint32_t)((n + unit_rows - 1) / unit_rows);
  d->rows = xmalloc(d->units * sizeof(*d->rows));
  d->prefix = xmalloc((d->units + 1) * sizeof(*d->prefix));
  d->prefix[0] = 0;
  for (uint32_t i = 0; i < d->units; i++) {
    d->rows[i] = i + 1 < d->units ? unit_rows : n - (uint64_t)i * unit_rows;
    d->prefix[i + 1] = d->prefix[i] + d->rows[i];
  }
  for (int c = 0; c < CLASSES; c++) {
    uint64_t lo = (c * n + CLASSES - 1) / CLASSES;
    uint64_t hi = ((c + 1) * n + CLASSES - 1) / CLASSES;
    d->share[c] = (double)(hi - lo) / (double)n;
  }
}

static void dataset_free(dataset_t *d) {
  free(d->rows);
  free(d->prefix);
}

static double batch_tv(const uint32_t *hist, const double *share) {
  double tv = 0;
  for (int c = 0; c < CLASSES; c++) tv += fabs((double)hist[c] / BATCH - share[c]);
  return tv / 2;
}

/* SplitMix64 and Lemire's bounded draw, for the uniform baseline only. */
static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static uint64_t rng_bounded(uint64_t *s, uint64_t n) {
  if (n <= 1) return 0;
  uint64_t t = (0 - n) % n;
  for (;;) {
    unsigned __int128 m = (unsigned __int128)rng_next(s) * n;
    if ((uint64_t)m >= t) return (uint64_t)(m >> 64);
  }
}

/* Mean TV of a uniform shuffle; *secs gets the Fisher-Yates time. */
static double uniform_tv(const dataset_t *d, double *secs) {
  *secs = 0;
  if (d->n < BATCH) return 0;
  uint8_t *labels = xmalloc(d->n);
  memset(labels, 0, d->n);
  for (uint64_t g = 0; g < d->n; g++) labels[g] = (uint8_t)(g * CLASSES / d->n);
  uint64_t s = 0xba5e11e;
  double t0 = bench_now_s();
  for (uint64_t i = d->n - 1; i > 0; i--) {
    uint64_t j = rng_bounded(&s, i + 1);
    uint8_t x = labels[i];
    labels[i] = labels[j];
    labels[j] = x;
  }
  *secs = bench_now_s() - t0;
  double sum = 0;
  uint64_t batches = d->n / BATCH;
  for (uint64_t b = 0; b < batches; b++) {
    uint32_t hist[CLASSES] = {0};
    for (uint32_t i = 0; i < BATCH; i++) hist[labels[b * BATCH + i]]++;
    sum += batch_tv(hist, d->share);
  }
  free(labels);
  return sum / (double)batches;
}

typedef struct result {
  double tv;
  double secs; /* cursor time for the epoch */
  uint64_t samples;
} result_t;

/* One epoch of rank `rank` of `world`; TV over this rank's batches. */
static int run_epoch_blocked(const dataset_t *d, int shuffle, uint32_t window_units, uint32_t world,
                             uint32_t rank, uint32_t block_units, result_t *res) {
  shuffle_params_t p;
  memset(&p, 0, sizeof(p));
  p.seed = 1;
  p.shuffle = shuffle;
  p.window_units = window_units;
  p.batch_size = BATCH;
  p.world_size = world;
  p.rank = rank;
  p.drop_last = 1;
  shuffle_plan_t *plan;
  uint32_t nb = 0, *blocks = NULL;
  if (block_units > 0) {
    blocks = xmalloc(((size_t)d->units / block_units + 1) * sizeof(*blocks));
    for (uint32_t u = 0; u < d->units; u += block_units)
      blocks[nb++] = d->units - u < block_units ? d->units - u : block_units;
  }
  int rc = shuffle_plan_create_blocked(d->rows, d->units, blocks, nb, &p, &plan);
  free(blocks);
  if (rc < 0) return rc;
  shuffle_sample_t *s = xmalloc(BATCH * sizeof(*s));
  double t0 = bench_now_s();
  shuffle_epoch_t *ep;
  rc = shuffle_epoch_open(plan, 0, &ep);
  double secs = bench_now_s() - t0;
  if (rc < 0) {
    shuffle_plan_free(plan);
    free(s);
    return rc;
  }
  uint64_t batches = shuffle_batches_per_epoch(plan);
  double sum = 0;
  for (uint64_t b = 0; b < batches && rc >= 0; b++) {
    t0 = bench_now_s();
    rc = shuffle_epoch_batch(ep, b, s);
    secs += bench_now_s() - t0;
    uint32_t hist[CLASSES] = {0};
    for (uint32_t i = 0; i < BATCH && rc >= 0; i++)
      hist[(d->prefix[s[i].unit] + s[i].row) * CLASSES / d->n]++;
    sum += batch_tv(hist, d->share);
  }
  shuffle_epoch_close(ep);
  shuffle_plan_free(plan);
  free(s);
  if (rc < 0) return rc;
  res->tv = sum / (double)batches;
  res->secs = secs;
  res->samples = batches * BATCH;
  return 0;
}

/* One epoch of world_size 1 over `parts` node partitions (shuffle.h steps
 * 7-10) of row groups of group_units units, units mixed singly; TV over
 * its batches. */
static int run_epoch_parts(const dataset_t *d, uint32_t window_units, uint32_t group_units,
                           uint32_t parts, result_t *res) {
  shuffle_params_t p;
  memset(&p, 0, sizeof(p));
  p.seed = 1;
  p.shuffle = 1;
  p.window_units = window_units;
  p.batch_size = BATCH;
  p.world_size = 1;
  p.drop_last = 1;
  p.partitions = parts;
  uint32_t ng = 0, *groups = xmalloc(((size_t)d->units / group_units + 1) * sizeof(*groups));
  for (uint32_t u = 0; u < d->units; u += group_units)
    groups[ng++] = d->units - u < group_units ? d->units - u : group_units;
  shuffle_plan_t *plan;
  int rc = shuffle_plan_create_partitioned(d->rows, d->units, groups, ng, 0, &p, &plan);
  free(groups);
  if (rc < 0) return rc;
  shuffle_sample_t *s = xmalloc(BATCH * sizeof(*s));
  shuffle_epoch_t *ep;
  double t0 = bench_now_s();
  rc = shuffle_epoch_open(plan, 0, &ep);
  uint64_t batches = shuffle_batches_per_epoch(plan);
  double sum = 0;
  for (uint64_t b = 0; b < batches && rc >= 0; b++) {
    rc = shuffle_epoch_batch(ep, b, s);
    uint32_t hist[CLASSES] = {0};
    for (uint32_t i = 0; i < BATCH && rc >= 0; i++)
      hist[(d->prefix[s[i].unit] + s[i].row) * CLASSES / d->n]++;
    sum += batch_tv(hist, d->share);
  }
  res->secs = bench_now_s() - t0;
  if (ep) shuffle_epoch_close(ep);
  shuffle_plan_free(plan);
  free(s);
  if (rc < 0) return rc;
  res->tv = sum / (double)batches;
  res->samples = batches * BATCH;
  return 0;
}

static int run_epoch(const dataset_t *d, int shuffle, uint32_t window_units, uint32_t world,
                     uint32_t rank, result_t *res) {
  return run_epoch_blocked(d, shuffle, window_units, world, rank, 0, res);
}

/* The mean TV expected when every unit holds one label: a batch of B rows
 * from a window of W of the U units varies, per label, with variance
 * p(1-p) (1/B + (U-W) / (W (U-1))) against p(1-p) / B for a uniform
 * shuffle, so the TV grows by the square root of the ratio. */
static double predicted_tv(double uniform, uint32_t units, uint32_t w) {
  if (w >= units) return uniform;
  double f = (double)(units - w) / (double)(units - 1);
  return uniform * sqrt(1 + (double)BATCH * f / w);
}

static void row(const dataset_t *d, const char *wname, uint32_t w, double uni, int world) {
  result_t r;
  int rc = run_epoch(d, w > 0, w > 0 ? w : 1, (uint32_t)world, 0, &r);
  if (rc < 0) {
    fprintf(stderr, "label-mix: %s\n", larder_strerror(rc));
    exit(1);
  }
  char wrows[24] = "-", mib[24] = "-", pred[24] = "-";
  if (w > 0) {
    uint64_t n = (uint64_t)w * d->unit_rows;
    if (n > d->n) n = d->n;
    snprintf(wrows, sizeof(wrows), "%" PRIu64, n);
    snprintf(mib, sizeof(mib), "%.1f", (double)n * 4 / 1048576);
    snprintf(pred, sizeof(pred), "%.4f", predicted_tv(uni, d->units, w));
  }
  printf("%11" PRIu64
         " %6u %9u %6s %11s %8s %8.4f %8s %8.4f %6.2f %9.1f "
         "%9.1f\n",
         d->n, d->units, d->unit_rows, wname, wrows, mib, r.tv, pred, uni, r.tv / uni, r.secs * 1e3,
         (double)r.samples / r.secs / 1e6);
}

static void header(void) {
  printf("%11s %6s %9s %6s %11s %8s %8s %8s %8s %6s %9s %9s\n", "rows", "units", "unit rows",
         "window", "window rows", "perm MiB", "mean TV", "expected", "uniform", "ratio", "epoch ms",
         "Msample/s");
}

int main(int argc, char **argv) {
  static const uint64_t sizes[] = {1000000, 10000000, 100000000};
  static const uint32_t windows[] = {4, 8, 16, 32, 64};
  uint64_t max_rows = argc > 1 ? strtoull(argv[1], NULL, 10) : UINT64_MAX;
  char name[16];

  printf(
      "label-mix: 10 labels stored sorted, batch %u, seed 1, epoch 0, "
      "drop_last.\n"
      "mean TV: mean over batches of the total-variation distance between "
      "the batch's\nlabel histogram and the dataset's; expected: the "
      "formula in predicted_tv();\nuniform: the same for a perfect "
      "shuffle; epoch ms: opening the cursor and every\n"
      "shuffle_epoch_batch call of one epoch.\n\n",
      BATCH);
  header();
  uint64_t biggest = 0;
  for (size_t di = 0; di < sizeof(sizes) / sizeof(sizes[0]); di++) {
    if (sizes[di] > max_rows) continue;
    biggest = sizes[di];
    dataset_t d;
    dataset_init(&d, sizes[di], UNIT_ROWS);
    double fy_secs;
    double uni = uniform_tv(&d, &fy_secs);
    row(&d, "none", 0, uni, 1);
    for (size_t wi = 0; wi < sizeof(windows) / sizeof(windows[0]); wi++) {
      snprintf(name, sizeof(name), "%u", windows[wi]);
      row(&d, name, windows[wi], uni, 1);
    }
    printf("%11" PRIu64 " %6u %9u %6s %11" PRIu64
           " %8.1f %8s %8s %8.4f %6s %9.1f %9.1f   (uniform: Fisher-Yates "
           "of every label)\n",
           d.n, d.units, d.unit_rows, "all", d.n, (double)d.n * 4 / 1048576, "-", "-", uni, "-",
           fy_secs * 1e3, (double)d.n / fy_secs / 1e6);
    dataset_free(&d);
  }
  if (biggest == 0) return 0;

  /* Smaller units at the same window memory: more, smaller draws. */
  static const struct {
    uint32_t unit_rows, window;
  } alt[] = {{65536, 16}, {65536, 64},  {65536, 328}, {8192, 128},
             {8192, 512}, {1024, 1024}, {1024, 4096}, {1024, 512}};
  printf("\n%" PRIu64 " rows, other unit sizes (world_size 1)\n", biggest);
  header();
  double uni = 0;
  for (size_t ai = 0; ai < sizeof(alt) / sizeof(alt[0]); ai++) {
    dataset_t d;
    dataset_init(&d, biggest, alt[ai].unit_rows);
    if (ai == 0) {
      double fy_secs;
      uni = uniform_tv(&d, &fy_secs); /* labels do not depend on units */
    }
    snprintf(name, sizeof(name), "%u", alt[ai].window);
    row(&d, name, alt[ai].window, uni, 1);
    dataset_free(&d);
  }

  /* The daemon's default: a row group's units stay together (its blocks;
   * shuffle_row_groups).  Units of 4096 rows, row groups of 8 or 30 units
   * (32768 and 122880 rows, DuckDB's default), against single units. */
  printf("\n%" PRIu64 " rows in units of 4096 rows: single units against row-group blocks\n",
         biggest);
  printf("%8s %12s %8s %8s %6s\n", "window", "block units", "mean TV", "uniform", "ratio");
  {
    dataset_t b;
    dataset_init(&b, biggest, 4096);
    static const uint32_t bw[] = {64, 128, 512};
    static const uint32_t bb[] = {0, 8, 30};
    for (size_t wi = 0; wi < sizeof(bw) / sizeof(bw[0]); wi++)
      for (size_t bi = 0; bi < sizeof(bb) / sizeof(bb[0]); bi++) {
        result_t r;
        if (run_epoch_blocked(&b, 1, bw[wi], 1, 0, bb[bi], &r) < 0) exit(1);
        printf("%8u %12u %8.4f %8.4f %6.2f\n", bw[wi], bb[bi] ? bb[bi] : 1, r.tv, uni, r.tv / uni);
      }
    dataset_free(&b);
  }

  /* Node partitions: the whole dataset still mixes into every global
   * batch, each partition's windows holding window / P units. */
  printf("\n%" PRIu64
         " rows in units of 4096 rows, row groups of 8 units: node partitions "
         "(goal: P = 4 within 1.10 of P = 1)\n",
         biggest);
  printf("%8s %6s %8s %8s %10s %8s\n", "window", "P", "mean TV", "uniform", "vs P = 1", "epoch ms");
  {
    dataset_t b;
    dataset_init(&b, biggest, 4096);
    static const uint32_t pw[] = {64, 512};
    static const uint32_t pp[] = {1, 2, 4, 8};
    for (size_t wi = 0; wi < sizeof(pw) / sizeof(pw[0]); wi++) {
      double one = 0;
      for (size_t pi = 0; pi < sizeof(pp) / sizeof(pp[0]); pi++) {
        result_t r;
        if (run_epoch_parts(&b, pw[wi], 8, pp[pi], &r) < 0) exit(1);
        if (pp[pi] == 1) one = r.tv;
        printf("%8u %6u %8.4f %8.4f %10.3f %8.1f\n", pw[wi], pp[pi], r.tv, uni, r.tv / one,
               r.secs * 1e3);
      }
    }
    dataset_free(&b);
  }

  /* One rank of eight: every rank still builds every window. */
  printf("\n%" PRIu64
         " rows, world_size 8: rank 0's share (its own "
         "samples per second)\n",
         biggest);
  header();
  dataset_t d;
  dataset_init(&d, biggest, UNIT_ROWS);
  for (size_t wi = 0; wi < sizeof(windows) / sizeof(windows[0]); wi++) {
    snprintf(name, sizeof(name), "%u", windows[wi]);
    row(&d, name, windows[wi], uni, 8);
  }
  dataset_free(&d);
  return 0;
}
