/*
 * example-trainer.c: a trainer's data loop against larderd, printing
 * throughput and the stall fraction (the share of time the trainer waited
 * for data instead of computing) per epoch.
 *
 *   example-trainer [--socket PATH] [--batch-size N] [--epochs N]
 *                   [--compute-ms X] [--columns a,b] [--seed N]
 *                   [--rank R --world-size W] SOURCE...
 *
 * --compute-ms simulates the model's step per batch, so that the stall
 * fraction means what it means on a GPU: 0% when data is always ready, 100%
 * when the trainer does nothing but wait.  Like a trainer waiting on its
 * GPU, it sleeps through the step and leaves the CPU free.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "larder.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void step(double seconds) {
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Touches every byte of the batch once, as a real trainer's copy to the GPU
 * would, and folds it into a checksum. */
static uint64_t touch(const larder_array_t *a) {
  uint64_t h = 0;
  const uint8_t *v = larder_array_values(a);
  uint64_t n = larder_array_values_size(a);
  for (uint64_t i = 0; i + 8 <= n; i += 64) {
    uint64_t x;
    memcpy(&x, v + i, 8);
    h += x;
  }
  for (int i = 0; i < larder_array_num_children(a); i++) h += touch(larder_array_child(a, i));
  return h;
}

int main(int argc, char **argv) {
  const char *socket = NULL, *columns = NULL;
  larder_stream_options_t o;
  larder_stream_options_init(&o);
  o.epochs = 1;
  double compute_ms = 0;
  const char *sources[256];
  size_t ns = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    /* argv[i] is not NULL for i < argc (C11 5.1.2.2.1), which the analyzer
     * does not know. */
    /* NOLINTNEXTLINE(clang-analyzer-core.NonNullParamChecker) */
    if (!strcmp(a, "--socket") && v) socket = argv[++i];
    else if (!strcmp(a, "--batch-size") && v) o.batch_size = (uint32_t)atoi(argv[++i]);
    else if (!strcmp(a, "--epochs") && v) o.epochs = (uint64_t)atoll(argv[++i]);
    else if (!strcmp(a, "--compute-ms") && v) compute_ms = atof(argv[++i]);
    else if (!strcmp(a, "--columns") && v) columns = argv[++i];
    else if (!strcmp(a, "--seed") && v) o.seed = (uint64_t)atoll(argv[++i]);
    else if (!strcmp(a, "--rank") && v) o.rank = atoi(argv[++i]);
    else if (!strcmp(a, "--world-size") && v) o.world_size = atoi(argv[++i]);
    else if (!strcmp(a, "--window") && v) o.window = (uint32_t)atoi(argv[++i]);
    else if (!strcmp(a, "--partitions") && v) o.partitions = (uint32_t)atoi(argv[++i]);
    else if (!strcmp(a, "--local-world-size") && v) o.local_world_size = atoi(argv[++i]);
    else if (!strcmp(a, "--unit-rows") && v) o.unit_rows = (uint32_t)atoi(argv[++i]);
    else if (!strcmp(a, "--no-shuffle")) o.shuffle = 0;
    else if (a[0] == '-') {
      fprintf(stderr, "example-trainer: unknown option %s\n", a);
      return 2;
    } else if (ns < 256) sources[ns++] = a;
  }
  if (ns == 0) {
    fprintf(stderr, "usage: example-trainer [options] SOURCE...\n");
    return 2;
  }
  char *colbuf = NULL;
  const char *cols[64];
  size_t nc = 0;
  if (columns) {
    colbuf = strdup(columns);
    for (char *t = strtok(colbuf, ","); t && nc < 64; t = strtok(NULL, ",")) cols[nc++] = t;
    o.columns = cols;
    o.num_columns = nc;
  }
  o.sources = sources;
  o.num_sources = ns;
  larder_client_t *c;
  int rc = larder_client_connect(socket, &c);
  if (rc) {
    fprintf(stderr, "example-trainer: cannot connect to larderd: %s\n", larder_strerror(rc));
    return 1;
  }
  larder_stream_t *s;
  rc = larder_stream_open(c, &o, &s);
  if (rc) {
    fprintf(stderr, "example-trainer: %s\n", larder_client_last_error(c));
    larder_client_close(c);
    return 1;
  }
  printf("stream: %llu samples, %llu batches of %u per epoch\n",
         (unsigned long long)larder_stream_num_samples(s),
         (unsigned long long)larder_stream_batches_per_epoch(s), o.batch_size);
  uint32_t parts, pfirst, plast;
  larder_stream_partitions(s, &parts, &pfirst, &plast);
  if (parts > 1) printf("partitions: %u to %u of %u\n", pfirst, plast - 1, parts);
  if (larder_stream_note(s)[0]) printf("note: %s\n", larder_stream_note(s));
  uint64_t epoch = 0, batches = 0, rows = 0, bytes = 0, sum = 0;
  uint64_t w0 = 0, c0 = 0;
  double t0 = now_s();
  int status = 0;
  for (;;) {
    larder_batch_t *b;
    rc = larder_stream_next(s, -1, &b);
    int end_of_epoch = rc == LARDER_EEOF || (rc == 0 && larder_batch_epoch(b) != epoch);
    if (end_of_epoch && batches > 0) {
      uint64_t w, cp;
      larder_stream_stall(s, &w, &cp);
      double secs = now_s() - t0;
      double stall = (double)(w - w0) / (double)((w - w0) + (cp - c0) + 1);
      printf("epoch %llu: %llu batches, %llu rows in %.2f s: %.0f rows/s, %.1f MB/s, "
             "stall %.2f%%\n",
             (unsigned long long)epoch, (unsigned long long)batches, (unsigned long long)rows,
             secs, (double)rows / secs, (double)bytes / secs / 1e6, 100.0 * stall);
      fflush(stdout);
      w0 = w;
      c0 = cp;
      t0 = now_s();
      batches = rows = bytes = 0;
    }
    if (rc == LARDER_EEOF) break;
    if (rc) {
      fprintf(stderr, "example-trainer: %s\n", larder_client_last_error(c));
      status = 1;
      break;
    }
    epoch = larder_batch_epoch(b);
    for (int i = 0; i < larder_batch_num_columns(b); i++) sum += touch(larder_batch_column(b, i));
    batches++;
    rows += (uint64_t)larder_batch_num_rows(b);
    bytes += larder_batch_bytes(b);
    larder_batch_release(b);
    if (compute_ms > 0) step(compute_ms / 1000.0);
  }
  printf("checksum %016llx\n", (unsigned long long)sum);
  larder_stream_close(s);
  larder_client_close(c);
  free(colbuf);
  return status;
}
