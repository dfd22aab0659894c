/*
 * bench-util.h: helpers shared by the benchmark programs (prefix bench_).
 * Header-only; any thread.
 */
#ifndef LARDER_BENCH_UTIL_H
#define LARDER_BENCH_UTIL_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* CLOCK_MONOTONIC in seconds. */
static inline double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* This machine's single-core memcpy bandwidth in GB/s: the best of five
 * copies of 256 MiB, the physical limit the benchmarks print their ratios
 * against.  Returns 0 when out of memory. */
static inline double bench_memcpy_gbps(void) {
  size_t n = 256u << 20;
  unsigned char *a = malloc(n), *b = malloc(n);
  double best = 0;
  if (a != NULL && b != NULL) {
    memset(a, 1, n);
    memset(b, 2, n);
    for (int i = 0; i < 5; i++) {
      double t = bench_now_s();
      memcpy(b, a, n);
      t = bench_now_s() - t;
      if ((double)n / t / 1e9 > best) best = (double)n / t / 1e9;
      a[i] = b[n - 1 - (size_t)i]; /* keep the copies observable */
    }
  }
  free(a);
  free(b);
  return best;
}

/* One thread of bench_gather_gbps: its own order of the rows and its own
 * batch buffer, over the shared window. */
typedef struct bench_gather_thread {
  const uint8_t *win;
  size_t rows, row_bytes, batch_rows;
  uint32_t *order;
  uint8_t *out;
  uint64_t sink;
  pthread_mutex_t *mu; /* with cv and go: the start, for all at once */
  pthread_cond_t *cv;
  const int *go;
  double seconds;
} bench_gather_thread_t;

static inline void *bench_gather_run(void *arg) {
  bench_gather_thread_t *g = arg;
  size_t rows = g->rows, rb = g->row_bytes, batch = g->batch_rows;
  pthread_mutex_lock(g->mu);
  while (!*g->go) pthread_cond_wait(g->cv, g->mu);
  pthread_mutex_unlock(g->mu);
  double t = bench_now_s();
  for (size_t i = 0; i < rows; i++) {
    /* Prefetch ahead, as the daemon's gather does: the copy is bound by
     * memory latency, and this keeps several misses in flight. */
    if (i + 16 < rows) {
      const uint8_t *a = g->win + (size_t)g->order[i + 16] * rb;
      for (size_t l = 0; l < rb; l += 64) __builtin_prefetch(a + l);
    }
    memcpy(g->out + (i % batch) * rb, g->win + (size_t)g->order[i] * rb, rb);
    if (i % batch == batch - 1) g->sink += g->out[i % rb];
  }
  g->seconds = bench_now_s() - t;
  return NULL;
}

/*
 * The ideal shuffled gather on `threads` threads at once: each copies every
 * row of one shared window of window_bytes (rows of row_bytes, each
 * contiguous, in huge pages where the kernel allows, as larderd's row
 * blocks are) in a random order of its own into a batch buffer of
 * batch_rows rows, as larderd's workers gather the rows of the units in
 * memory.  Returns the best of three rounds in GB/s, all threads together
 * (the bytes they copied over the longest thread's time), or 0 when out of
 * memory or arguments.  The physical limit under a CPU assembly of
 * shuffled batches on that many cores.
 */
static inline double bench_gather_gbps(size_t row_bytes, size_t window_bytes, size_t batch_rows,
                                       int threads) {
  if (row_bytes == 0 || batch_rows == 0 || window_bytes < row_bytes || threads < 1) return 0;
  size_t rows = window_bytes / row_bytes;
  if (rows > UINT32_MAX) return 0;
  uint8_t *win = NULL;
  if (posix_memalign((void **)&win, 2u << 20, rows * row_bytes) != 0) return 0;
  (void)madvise(win, rows * row_bytes, MADV_HUGEPAGE);
  memset(win, 3, rows * row_bytes);
  bench_gather_thread_t *g = calloc((size_t)threads, sizeof(*g));
  pthread_t *th = calloc((size_t)threads, sizeof(*th));
  double best = 0;
  int ok = g != NULL && th != NULL;
  for (int k = 0; ok && k < threads; k++) {
    g[k].win = win;
    g[k].rows = rows;
    g[k].row_bytes = row_bytes;
    g[k].batch_rows = batch_rows;
    g[k].order = malloc(rows * sizeof(uint32_t));
    g[k].out = malloc(batch_rows * row_bytes);
    if (g[k].order == NULL || g[k].out == NULL) {
      ok = 0;
      break;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1);
    for (size_t i = 0; i < rows; i++) g[k].order[i] = (uint32_t)i;
    for (size_t i = rows - 1; i > 0; i--) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      size_t j = (size_t)(x % (i + 1));
      uint32_t t = g[k].order[i];
      g[k].order[i] = g[k].order[j];
      g[k].order[j] = t;
    }
  }
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  for (int rep = 0; ok && rep < 3; rep++) {
    int go = 0, started = 0;
    for (int k = 0; k < threads; k++) {
      g[k].mu = &mu;
      g[k].cv = &cv;
      g[k].go = &go;
      g[k].seconds = 0;
      if (pthread_create(&th[k], NULL, bench_gather_run, &g[k]) != 0) break;
      started++;
    }
    pthread_mutex_lock(&mu);
    go = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    if (started < threads) {
      ok = 0;
      break;
    }
    double longest = 0;
    for (int k = 0; k < threads; k++)
      if (g[k].seconds > longest) longest = g[k].seconds;
    double gbps = longest > 0 ? (double)(rows * row_bytes) * threads / longest / 1e9 : 0;
    if (gbps > best) best = gbps;
  }
  uint64_t sink = 0;
  for (int k = 0; g != NULL && k < threads; k++) {
    sink += g[k].sink;
    free(g[k].order);
    free(g[k].out);
  }
  if (sink == 42) fprintf(stderr, " "); /* keep the copies observable */
  free(g);
  free(th);
  free(win);
  return best;
}

#endif /* LARDER_BENCH_UTIL_H */
