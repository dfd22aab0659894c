/*
 * serve-client.c: the client side of `make bench-serve`.
 *
 *   serve-client memcpy
 *       prints the single-core memcpy bandwidth of 256 MiB copies (GB/s)
 *   serve-client gather ROW_BYTES WINDOW_BYTES BATCH_ROWS [THREADS]
 *       prints the bandwidth of the ideal shuffled gather (bench-util.h), on
 *       one core or THREADS at once: rows
 *       of ROW_BYTES, each stored contiguously in a WINDOW_BYTES buffer,
 *       copied in a random order into batches of BATCH_ROWS rows (GB/s);
 *       the physical limit of serving shuffled rows from memory on a core,
 *       which no columnar layout can beat (its rows are spread over columns);
 *       the window is in huge pages where the kernel allows, as larderd's
 *       row blocks are
 *   serve-client run SOCKET SOURCE [SOURCE...] [--epochs N] [--batch-size N]
 *       [--compute-us N] [--seed N] [--rank R --world-size W]
 *       [--daemon-pid PID] [--touch] [--start-epoch N] [--columns a,b]
 *       [--window N] [--wait-log FILE] [--evict-kb N]
 *       consumes a stream with liblarder's default window (32 batches)
 *       unless --window says otherwise, and prints one JSON line per epoch: seconds, rows,
 *       batch bytes, GB/s, rows/s, the stall fraction, and the daemon's RSS
 *       at the end of the epoch; the first line also has the time from
 *       opening the stream to holding its first batch (first_batch_s), and
 *       each line the wall-clock time the epoch ended (end_unix), to match
 *       against a server's request log; --wait-log writes a line for each
 *       next-batch call that waited 20 us or more (epoch, batch of the
 *       epoch, microseconds, and the CLOCK_MONOTONIC second the call
 *       began), to see where a stall comes from and match it with other
 *       events on the machine.  Each line also has the median and 90th
 *       percentile of the time a next-batch call took when it returned a
 *       batch (call_ns_p50, call_ns_p90): with --compute-us long enough for
 *       the daemon to fill the window, the library's own cost per batch,
 *       which sets a floor under the stall fraction of a short step;
 *       stall_long is the part of the stall fraction spent in calls of
 *       20 us or more, which waited for the daemon (a call whose batch was
 *       ready takes about a microsecond);
 *       --evict-kb writes that many KiB of the client's own memory after
 *       each step, as a trainer's step leaves the caches cold.
 *
 * The client reads batches where they lie, in the shared arena: with
 * --touch it reads every cache line once (as a copy to the GPU would),
 * without it it only looks at the descriptors.  --compute-us simulates the
 * model's step per batch the way a GPU trainer spends it: asleep, waiting
 * for the GPU, its CPU free (a busy wait would instead take one of the
 * daemon's cores on a small machine).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>

#include "larder.h"
#include "bench-util.h"

static double unix_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rss_kb(int pid) {
  if (pid <= 0) return 0;
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  uint64_t kb = 0;
  while (fgets(line, sizeof(line), f))
    if (strncmp(line, "VmRSS:", 6) == 0) kb = strtoull(line + 6, NULL, 10);
  fclose(f);
  return kb;
}

/* The durations of next-batch calls, in 10 ns buckets up to 1 ms (the
 * last bucket holds the rest): a histogram keeps an epoch of any length in
 * fixed memory. */
#define CALL_BUCKETS 100000
static uint32_t call_hist[CALL_BUCKETS];

static void call_record(double seconds) {
  double b = seconds * 1e8;
  call_hist[b >= CALL_BUCKETS - 1 ? CALL_BUCKETS - 1 : (size_t)b]++;
}

/* The q-quantile of the recorded calls in ns, and clears them. */
static double call_quantile(double q, int clear) {
  uint64_t n = 0, seen = 0;
  for (size_t i = 0; i < CALL_BUCKETS; i++) n += call_hist[i];
  double at = 0;
  for (size_t i = 0; i < CALL_BUCKETS && n; i++) {
    seen += call_hist[i];
    if ((double)seen >= q * (double)n) {
      at = (double)i * 10 + 5;
      break;
    }
  }
  if (clear) memset(call_hist, 0, sizeof(call_hist));
  return at;
}

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
  if (argc >= 2 && strcmp(argv[1], "memcpy") == 0) {
    printf("{\"memcpy_gbps\":%.3f}\n", bench_memcpy_gbps());
    return 0;
  }
  if (argc >= 5 && strcmp(argv[1], "gather") == 0) {
    int threads = argc >= 6 ? atoi(argv[5]) : 1;
    printf("{\"gather_gbps\":%.3f}\n",
           bench_gather_gbps(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                             strtoull(argv[4], NULL, 10), threads));
    return 0;
  }
  if (argc < 4 || strcmp(argv[1], "run") != 0) {
    fprintf(stderr,
            "usage: serve-client memcpy | gather ROW_BYTES WINDOW_BYTES BATCH_ROWS [THREADS] | "
            "run SOCKET "
            "SOURCE [options]\n");
    return 2;
  }
  const char *sock = argv[2];
  const char *sources[256];
  int num_sources = 0;
  larder_stream_options_t o;
  larder_stream_options_init(&o);
  o.batch_size = 1024;
  o.epochs = 1;
  /* liblarder's default window unless --window says otherwise. */
  int pid = 0, do_touch = 0;
  FILE *wait_log = NULL;
  double compute_us = 0;
  size_t evict_bytes = 0;
  /* A thread's timer slack (50 us by default) lets the kernel end its
   * sleeps that much late: a simulated step of 100 us took 200.  A trainer
   * waiting on its GPU is woken by the driver, not by a lax timer. */
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  for (int i = 3; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "0";
    if (strncmp(a, "--", 2) != 0) {
      if (num_sources < 256) sources[num_sources++] = a;
    } else if (!strcmp(a, "--epochs")) o.epochs = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--batch-size")) o.batch_size = (uint32_t)atoi(v), i++;
    else if (!strcmp(a, "--compute-us")) compute_us = atof(v), i++;
    else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--columns")) {
      /* Comma-separated dotted paths (the arguments outlive the stream). */
      static const char *cols[64];
      size_t nc = 0;
      for (char *t = strtok(argv[++i], ","); t && nc < 64; t = strtok(NULL, ",")) cols[nc++] = t;
      o.columns = cols;
      o.num_columns = nc;
    } else if (!strcmp(a, "--start-epoch")) o.start_epoch = strtoull(v, NULL, 10), i++;
    else if (!strcmp(a, "--rank")) o.rank = atoi(v), i++;
    else if (!strcmp(a, "--world-size")) o.world_size = atoi(v), i++;
    else if (!strcmp(a, "--daemon-pid")) pid = atoi(v), i++;
    else if (!strcmp(a, "--window")) o.window = (uint32_t)atoi(v), i++;
    else if (!strcmp(a, "--touch")) do_touch = 1;
    else if (!strcmp(a, "--evict-kb")) evict_bytes = (size_t)strtoull(v, NULL, 10) << 10, i++;
    else if (!strcmp(a, "--wait-log")) {
      wait_log = fopen(v, "w");
      if (wait_log == NULL) {
        perror(v);
        return 1;
      }
      i++;
    }
  }
  o.sources = sources;
  o.num_sources = (size_t)num_sources;
  uint8_t *evict = evict_bytes ? malloc(evict_bytes) : NULL;
  if (evict_bytes && evict == NULL) {
    perror("serve-client");
    return 1;
  }
  larder_client_t *c;
  int rc = larder_client_connect(sock, &c);
  if (rc) {
    fprintf(stderr, "serve-client: %s\n", larder_strerror(rc));
    return 1;
  }
  larder_stream_t *s;
  double t_open = bench_now_s(); /* the time to the first batch includes reading the footers */
  rc = larder_stream_open(c, &o, &s);
  if (rc) {
    fprintf(stderr, "serve-client: %s\n", larder_client_last_error(c));
    return 1;
  }
  /* What the daemon chose for the stream (the order, shared partitions). */
  if (larder_stream_note(s)[0]) fprintf(stderr, "serve-client: note: %s\n", larder_stream_note(s));
  uint64_t epoch = o.start_epoch, rows = 0, bytes = 0, batches = 0, sum = 0;
  uint64_t w0 = 0, c0 = 0;
  double long_waits_s = 0; /* this epoch's calls of 20 us or more */
  double t0 = bench_now_s(), first_batch_s = -1;
  int got_first = 0;
  for (;;) {
    larder_batch_t *b;
    double t_call = bench_now_s();
    rc = larder_stream_next(s, -1, &b);
    double waited = bench_now_s() - t_call;
    if (rc == 0 && waited >= 20e-6) long_waits_s += waited;
    if (wait_log && rc == 0 && waited >= 20e-6)
      fprintf(wait_log, "%" PRIu64 " %" PRIu64 " %.1f %.6f\n", larder_batch_epoch(b),
              larder_batch_index(b), waited * 1e6, t_call);
    if ((rc == LARDER_EEOF || (rc == 0 && larder_batch_epoch(b) != epoch)) && batches) {
      double secs = bench_now_s() - t0;
      uint64_t w, cp;
      larder_stream_stall(s, &w, &cp);
      double call_p50 = call_quantile(0.5, 0), call_p90 = call_quantile(0.9, 1);
      if (first_batch_s >= 0) printf("{\"first_batch_s\":%.4f,", first_batch_s);
      else printf("{");
      printf("\"epoch\":%" PRIu64 ",\"seconds\":%.4f,\"batches\":%" PRIu64 ",\"rows\":%" PRIu64
             ",\"bytes\":%" PRIu64
             ",\"gbps\":%.3f,\"rows_per_s\":%.0f,\"stall\":%.5f,\"stall_long\":%.5f,"
             "\"compute_us\":%.1f,\"call_ns_p50\":%.0f,\"call_ns_p90\":%.0f,"
             "\"daemon_rss_kb\":%" PRIu64 ",\"end_unix\":%.6f}\n",
             epoch, secs, batches, rows, bytes, (double)bytes / secs / 1e9, (double)rows / secs,
             (double)(w - w0) / (double)((w - w0) + (cp - c0) + 1),
             long_waits_s * 1e9 / (double)((w - w0) + (cp - c0) + 1),
             (double)(cp - c0) / 1e3 / (double)batches, call_p50, call_p90, rss_kb(pid),
             unix_now_s());
      first_batch_s = -1;
      fflush(stdout);
      w0 = w;
      c0 = cp;
      rows = bytes = batches = 0;
      long_waits_s = 0;
      t0 = bench_now_s();
    }
    if (rc == LARDER_EEOF) break;
    if (rc) {
      fprintf(stderr, "serve-client: %s\n", larder_client_last_error(c));
      return 1;
    }
    if (!got_first) {
      first_batch_s = bench_now_s() - t_open;
      got_first = 1;
    }
    call_record(waited);
    epoch = larder_batch_epoch(b);
    if (do_touch)
      for (int i = 0; i < larder_batch_num_columns(b); i++) sum += touch(larder_batch_column(b, i));
    rows += (uint64_t)larder_batch_num_rows(b);
    bytes += larder_batch_bytes(b);
    batches++;
    larder_batch_release(b);
    if (compute_us > 0) {
      struct timespec ts = {(time_t)(compute_us / 1e6),
                            (long)((compute_us - (double)(time_t)(compute_us / 1e6) * 1e6) * 1e3)};
      nanosleep(&ts, NULL);
    }
    /* Each step writes a new value, so no line stays shared or clean. */
    if (evict) memset(evict, (int)batches, evict_bytes);
  }
  if (sum == 42) printf("#\n");
  if (wait_log) fclose(wait_log);
  free(evict);
  larder_stream_close(s);
  larder_client_close(c);
  return 0;
}
