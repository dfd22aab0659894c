/*
 * bench-util.h: helpers shared by the benchmark programs (prefix bench_).
 * Header-only; any thread.
 */
#ifndef LARDER_BENCH_UTIL_H
#define LARDER_BENCH_UTIL_H

#include <stdlib.h>
#include <string.h>
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

#endif /* LARDER_BENCH_UTIL_H */
