/*
 * bench-store.c: `make bench-store`, how fast the decoded-data cache takes
 * the units of a cold epoch.
 *
 *   bench-store DIR [UNITS]
 *
 * A cold epoch decodes units on every worker and puts each one into the
 * RocksDB cache (store_put), so the cache's sustained put rate bounds how
 * fast any number of cores can fill it.  This puts UNITS units (default
 * 600, about 1 GB) shaped like the bench dataset's (8 columns, 4096 rows of
 * 431 B: 1.77 MB a unit) into a fresh cache under DIR, from 1 thread and
 * from one thread per core, once with a single memtable flush thread and
 * once with the daemon's default for this machine (cache_flush_threads = 0),
 * and prints the rate of the puts and the rate including the final flush,
 * beside this machine's single-core memcpy bandwidth measured in the same
 * run.  DIR should be on the disk the cache would use.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache/store.h"
#include "util.h"
#include "bench-util.h"

#define COLUMNS 8
#define COLUMN_BYTES (4096 * 431 / COLUMNS)

typedef struct worker {
  store_t *st;
  int id, units;
  int failed;
} worker_t;

static void *put_units(void *arg) {
  worker_t *w = arg;
  unsigned char *col = malloc(COLUMN_BYTES);
  if (col == NULL) {
    w->failed = 1;
    return NULL;
  }
  for (size_t i = 0; i < COLUMN_BYTES; i++) col[i] = (unsigned char)(i * 7 + (size_t)w->id);
  for (int u = 0; u < w->units && !w->failed; u++) {
    store_key_t keys[COLUMNS];
    uint64_t sizes[COLUMNS];
    store_entry_t entries[COLUMNS];
    for (int c = 0; c < COLUMNS; c++) {
      memset(&keys[c], 0, sizeof(keys[c]));
      keys[c].len = 12;
      memcpy(keys[c].bytes, &w->id, 4);
      memcpy(keys[c].bytes + 4, &u, 4);
      memcpy(keys[c].bytes + 8, &c, 4);
      col[c] = (unsigned char)u; /* values differ, as real ones do */
      sizes[c] = COLUMN_BYTES;
      entries[c].key = keys[c];
      entries[c].data = col;
      entries[c].size = COLUMN_BYTES;
    }
    if (store_reserve(w->st, 1, keys, sizes, COLUMNS, 1) <= 0 ||
        store_put(w->st, 1, 1, entries, COLUMNS) != 0)
      w->failed = 1;
  }
  free(col);
  return NULL;
}

/* Puts `units` units from `threads` threads into a fresh cache; prints the
 * put rate and the rate to the end of store_close (every memtable
 * flushed).  Returns 0, or 1 when the cache failed. */
static int run(const char *dir, int flush_threads, int threads, int units, double memcpy) {
  char cmd[4200], err[512];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s/cache'", dir);
  if (system(cmd) != 0) return 1;
  char path[4096];
  snprintf(path, sizeof(path), "%s/cache", dir);
  store_options_t o;
  store_options_init(&o);
  o.dir = path;
  o.capacity_bytes = 1ull << 40;
  o.flush_threads = flush_threads;
  store_t *st = NULL;
  if (store_open(&o, &st, err, sizeof(err)) != 0) {
    fprintf(stderr, "bench-store: %s\n", err);
    return 1;
  }
  worker_t w[256];
  pthread_t tid[256];
  double t0 = bench_now_s();
  for (int i = 0; i < threads; i++) {
    w[i] = (worker_t){st, i, units / threads, 0};
    pthread_create(&tid[i], NULL, put_units, &w[i]);
  }
  int failed = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(tid[i], NULL);
    failed |= w[i].failed;
  }
  double puts = bench_now_s() - t0;
  store_close(st);
  double all = bench_now_s() - t0;
  double gb = (double)(units / threads * threads) * COLUMNS * COLUMN_BYTES / 1e9;
  printf(
      "  %d flush thread%s, %2d putting thread%s  puts %6.2f GB/s (%4.2f x memcpy)  "
      "to flushed %6.2f GB/s%s\n",
      flush_threads, flush_threads == 1 ? " " : "s", threads, threads == 1 ? " " : "s", gb / puts,
      gb / puts / memcpy, gb / all, failed ? "  (a put failed)" : "");
  return failed;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench-store DIR [UNITS]\n");
    return 2;
  }
  int units = argc > 2 ? atoi(argv[2]) : 600;
  /* The heap settings larderd runs with, so that memtables and write
   * batches reuse memory as they do there. */
  util_heap_setup();
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores < 1) cores = 1;
  if (cores > 256) cores = 256;
  int dflt = store_default_flush_threads((int)cores);
  double mc = bench_memcpy_gbps();
  printf("bench-store: %d units of %d columns, %.2f MB a unit, %ld cores\n", units, COLUMNS,
         COLUMNS * COLUMN_BYTES / 1e6, cores);
  printf("  single-core memcpy %.2f GB/s\n", mc);
  int rc = 0;
  int flushes[2] = {1, dflt};
  for (int f = 0; f < 2; f++) {
    rc |= run(argv[1], flushes[f], 1, units, mc);
    rc |= run(argv[1], flushes[f], (int)cores, units, mc);
  }
  return rc;
}
