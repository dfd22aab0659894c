/*
 * test-daemon-cache.c: the decoded-data cache, end to end: the hit ratio a
 * cache of half the dataset keeps, warm restarts, kill -9 while the cache
 * fills, column entries shared between projections, and changed files.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon-harness.h"

#include <rocksdb/c.h>

#include "cache/store.h"

#define ARENA (8u << 20)

static void std_opts(larder_stream_options_t *o, uint32_t batch_size, uint64_t epochs) {
  dh_std_opts(o, dh_std_source(), 1, batch_size, 99, epochs, ARENA);
}

/* The dataset's decoded bytes for o: what a cache that admits everything
 * holds after one epoch (with no memory for units, so that all of it goes
 * through the cache).  The epoch's batches go to *run when not NULL. */
static uint64_t decoded_total(const larder_stream_options_t *o, dh_run *run) {
  dh_daemon big;
  static const char *const fb[] = {"--memory_limit=1", NULL};
  dh_init(&big, "big", fb);
  dh_start(&big);
  dh_run r = {0};
  ASSERT_OK(dh_collect(big.socket, o, 0, &r));
  if (run) *run = r;
  else dh_run_free(&r);
  char *json = dh_admin(&big, "stats");
  uint64_t total = dh_json_u64(json, "cache.used_bytes");
  ASSERT_EQ(dh_json_u64(json, "cache.entries"), DH_STD_UNITS * DH_NUM_COLS);
  free(json);
  dh_stop(&big);
  ASSERT_GT(total, 0);
  return total;
}

/* Starts d ("half") with a cache of half of total and no memory for units. */
static void half_cache_daemon(dh_daemon *d, uint64_t total) {
  char cap[64];
  snprintf(cap, sizeof(cap), "--cache_capacity=%llu", (unsigned long long)(total / 2));
  const char *const fl[] = {"--memory_limit=1", cap, NULL};
  dh_init(d, "half", fl);
  dh_start(d);
}

/*
 * Hit floor: with cache_capacity f = 1/2 of the dataset's decoded bytes
 * (and a memory pool too small to hide the cache), every epoch after the
 * first reads at least 0.95 f of the dataset's bytes from the cache.  (Not
 * of the bytes it loads: with no memory to speak of, a unit pinned ahead
 * is dropped and loaded again when its batch comes, and which units that
 * happens to depends on the epoch's order, cached or not: the loads of an
 * epoch vary from 1.0 to 1.1 times the dataset.)  The bytes each epoch
 * reads from the cache are a function of the order alone, whatever the
 * window or the timing: the cache keeps whole units of the best priorities
 * (store.c, evict_put), so the set it converges to is the same in every
 * run.  (Before units were evicted whole, the halves of units left behind
 * made it vary by run: 281,088 bytes once in CI, at the window of 32.)
 */
/*
 * The first epoch on an empty cache has no hits: a worker that decodes a
 * unit decodes the rest of its row group into the cache too, and those
 * units, read back when their turn comes, are decode work of this epoch
 * (cache_readback_bytes), not hits.  A second run over the same cache
 * (a restart: nothing in memory) hits it.
 */
TEST_IMPL(daemon_cache_cold_epoch_no_hits) {
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  dh_run r = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r));
  dh_run_free(&r);
  uint64_t from_cache = dh_stat(&d, "units_from_cache");
  fprintf(stderr,
          "cold epoch: %" PRIu64 " units decoded, %" PRIu64 " read back; hit %" PRIu64
          ", read back %" PRIu64 ", miss %" PRIu64 " bytes\n",
          dh_stat(&d, "units_decoded"), from_cache, dh_stat(&d, "cache_hit_bytes"),
          dh_stat(&d, "cache_readback_bytes"), dh_stat(&d, "cache_miss_bytes"));
  ASSERT_GT(from_cache, 0); /* row groups of 8 units: decoded ahead */
  ASSERT_EQ(dh_stat(&d, "cache_hit_bytes"), 0);
  ASSERT_GT(dh_stat(&d, "cache_readback_bytes"), 0);
  dh_stop(&d);
  dh_start(&d);
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r));
  dh_run_free(&r);
  ASSERT_GT(dh_stat(&d, "cache_hit_bytes"), 0);
  ASSERT_EQ(dh_stat(&d, "cache_readback_bytes"), 0);
  dh_stop(&d);
  return 0;
}

TEST_IMPL(daemon_cache_hit_ratio) {
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  /* The dataset's decoded bytes: what a cache that admits everything holds
   * after one epoch. */
  dh_run r0 = {0};
  uint64_t total = decoded_total(&o, &r0);
  dh_daemon d;
  half_cache_daemon(&d, total);
  const double f = 0.5;
  uint64_t prev_hit = 0, prev_miss = 0;
  for (uint64_t e = 0; e < 6; e++) {
    larder_stream_options_t eo = o;
    eo.start_epoch = e;
    eo.epochs = e + 1;
    dh_run r = {0};
    ASSERT_OK(dh_collect(d.socket, &eo, 0, &r));
    ASSERT_EQ(r.n, r0.n);
    if (e == 0) dh_expect_same(&r0, &r);
    dh_run_free(&r);
    char *json = dh_admin(&d, "stats");
    uint64_t hit = dh_json_u64(json, "cache_hit_bytes");
    uint64_t miss = dh_json_u64(json, "cache_miss_bytes");
    uint64_t used = dh_json_u64(json, "cache.used_bytes");
    uint64_t capacity = dh_json_u64(json, "cache.capacity_bytes");
    free(json);
    double ratio = (double)(hit - prev_hit) / (double)((hit - prev_hit) + (miss - prev_miss));
    fprintf(stderr,
            "epoch %" PRIu64 ": hit %.3f of %" PRIu64 " bytes (cache %" PRIu64 " / %" PRIu64 ")\n",
            e, ratio, (hit - prev_hit) + (miss - prev_miss), used, capacity);
    /* The cache never holds more than its capacity plus one unit. */
    ASSERT_LE(used, capacity + total / DH_STD_UNITS * 2);
    if (e > 0) ASSERT_DOUBLE_GE((double)(hit - prev_hit), 0.95 * f * (double)total);
    prev_hit = hit;
    prev_miss = miss;
  }
  dh_run_free(&r0);
  dh_stop(&d);
  return 0;
}

/* Runs epoch e of o on d and returns the bytes it read from the cache. */
static uint64_t epoch_hit_bytes(dh_daemon *d, const larder_stream_options_t *o, uint64_t e) {
  uint64_t before = dh_stat(d, "cache_hit_bytes");
  larder_stream_options_t eo = *o;
  eo.start_epoch = e;
  eo.epochs = e + 1;
  dh_run r = {0};
  ASSERT_OK(dh_collect(d->socket, &eo, 0, &r));
  dh_run_free(&r);
  return dh_stat(d, "cache_hit_bytes") - before;
}

/* Files touched (a new ctime: a new identity, so new cache entries) keep
 * the hit floor: the old identities' entries, which nothing reads again,
 * are evicted first (store.c, obj_supersede) instead of keeping their
 * share of a cache of f = 1/2 at random priorities until they go idle
 * (7 days by default), which left about 0.3 of each epoch's bytes to the
 * cache. */
TEST_IMPL(daemon_cache_touched_files) {
  char dir[1024];
  snprintf(dir, sizeof(dir), "%s/data", test_tmpdir());
  ASSERT_OK(test_system("mkdir -p '%s' && cp '%s'/*.parquet '%s'/", dir, dh_std_dir(), dir));
  const char *src[1] = {dir};
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  o.sources = src;
  uint64_t total = decoded_total(&o, NULL);
  dh_daemon d;
  half_cache_daemon(&d, total);
  const double floor_bytes = 0.95 * 0.5 * (double)total;
  for (uint64_t e = 0; e < 2; e++) {
    uint64_t hit = epoch_hit_bytes(&d, &o, e);
    if (e > 0) ASSERT_DOUBLE_GE((double)hit, floor_bytes);
  }
  /* Touch every file: the same bytes under new identities. */
  ASSERT_OK(test_system("sleep 0.01 && touch '%s'/*.parquet", dir));
  for (uint64_t e = 2; e < 6; e++) {
    uint64_t hit = epoch_hit_bytes(&d, &o, e);
    fprintf(stderr,
            "epoch %" PRIu64 " after the touch: %" PRIu64 " bytes from the cache (floor %.0f)\n", e,
            hit, floor_bytes);
    if (e > 2) ASSERT_DOUBLE_GE((double)hit, floor_bytes);
  }
  char *json = dh_admin(&d, "stats");
  ASSERT_LE(dh_json_u64(json, "cache.used_bytes"), total / 2 + total / DH_STD_UNITS * 2);
  free(json);
  dh_stop(&d);
  return 0;
}

/* The second run of a job after a restart starts warm: nothing decoded,
 * the same bytes. */
TEST_IMPL(daemon_cache_restart_warm) {
  larder_stream_options_t o;
  std_opts(&o, 100, 2);
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  dh_run a = {0}, b = {0};
  a.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &a));
  ASSERT_GT(dh_stat(&d, "units_decoded"), 0);
  dh_stop(&d);
  dh_start(&d);
  ASSERT_OK(dh_collect(d.socket, &o, 0, &b));
  dh_expect_same(&a, &b);
  char *json = dh_admin(&d, "stats");
  ASSERT_EQ(dh_json_u64(json, "units_decoded"), 0);
  ASSERT_GE(dh_json_u64(json, "units_from_cache"), DH_STD_UNITS);
  ASSERT_EQ(dh_json_u64(json, "cache.checksum_failures"), 0);
  free(json);
  dh_stop(&d);
  dh_run_free(&a);
  dh_run_free(&b);
  return 0;
}

/*
 * A cache that RocksDB finds corrupt at open (a damaged CURRENT file, one
 * naming a missing MANIFEST, lost table files) is discarded with an error in the log, and the daemon
 * starts with an empty one and serves the same batches, decoding them
 * again.  (Were the daemon to refuse to start, systemd would restart it in
 * a loop.)
 */
TEST_IMPL(daemon_cache_corrupt_at_start) {
  larder_stream_options_t o;
  std_opts(&o, 100, 1);
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  dh_run a = {0}, b = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &a));
  dh_stop(&d);
  for (int round = 0; round < 3; round++) {
    char path[1200];
    if (round < 2) {
      /* A CURRENT file of garbage, then one naming no MANIFEST there is. */
      snprintf(path, sizeof(path), "%s/db/CURRENT", d.cache);
      FILE *f = fopen(path, "w");
      ASSERT_NOT_NULL(f);
      fputs(round == 0 ? "garbage" : "MANIFEST-999999\n", f);
      fclose(f);
    } else {
      /* Every table file, lost. */
      ASSERT_EQ(test_system("ls %s/db/*.sst >/dev/null 2>&1", d.cache), 0);
      ASSERT_EQ(test_system("rm -f %s/db/*.sst", d.cache), 0);
    }
    dh_start(&d);
    ASSERT_OK(dh_collect(d.socket, &o, 0, &b));
    dh_expect_same(&a, &b);
    dh_run_free(&b);
    char *log = dh_read_log(&d);
    int seen = 0;
    for (const char *p = log; (p = strstr(p, "is corrupt")) != NULL; p++) seen++;
    ASSERT_EQ(seen, round + 1);
    ASSERT_STR_CONTAINS(log, "discarding it and starting an empty one");
    free(log);
    if (round == 0) ASSERT_GT(dh_stat(&d, "units_decoded"), 0);
    dh_stop(&d);
  }
  dh_run_free(&a);
  return 0;
}

/* Overwrites path, file f of the std dataset, in place with other values
 * of the same size, and puts its mtime back, as cp -p or rsync -t leave a
 * file.  The footer's statistics are varints: it looks for a variant of
 * the values whose file has exactly the old size.  Returns the variant. */
static int rewrite_same_size(const char *path, int f) {
  char tmp[1300];
  snprintf(tmp, sizeof(tmp), "%s/rewrite-%d.v", test_tmpdir(), f);
  struct stat st, sv;
  ASSERT_OK(stat(path, &st));
  dh_spec spec = dh_std_spec;
  for (spec.variant = 1; spec.variant < 200; spec.variant++) {
    dh_write_file(&spec, f, tmp);
    ASSERT_OK(stat(tmp, &sv));
    if (sv.st_size == st.st_size) break;
  }
  ASSERT_EQ(sv.st_size, st.st_size);
  ASSERT_OK(test_system("cat '%s' > '%s'", tmp, path));
  struct timespec keep[2] = {st.st_atim, st.st_mtim};
  ASSERT_OK(utimensat(AT_FDCWD, path, keep, 0));
  return spec.variant;
}

/* Reads s to its end, checking each batch against ref from position *k.
 * Returns the stream's last code (LARDER_EEOF at a clean end). */
static int read_against(larder_stream_t *s, const dh_run *ref, size_t *k) {
  larder_batch_t *b;
  int rc;
  while ((rc = larder_stream_next(s, 60000 * dh_slow(), &b)) == 0) {
    ASSERT(*k < ref->n);
    ASSERT_UINT_EQ(dh_batch_hash(b), ref->b[*k].hash);
    (*k)++;
    larder_batch_release(b);
  }
  return rc;
}

/*
 * A change of a file's metadata alone (chmod, a new hard link: its ctime
 * moves, its footer does not) under a stream that reads it from the file
 * again: the stream goes on with the same batches, not ending with "the
 * file changed since the stream opened".  A rewrite of the same
 * size with its mtime put back, which moves the ctime too, still ends it,
 * naming the file, after batches of the old content only.
 */
TEST_IMPL(daemon_cache_chmod_file) {
  char dir[1200], path[1300], link_path[1300];
  snprintf(dir, sizeof(dir), "%s/ds", test_tmpdir());
  ASSERT_EQ(test_system("cp -a '%s' '%s'", dh_std_dir(), dir), 0);
  snprintf(path, sizeof(path), "%s/part-001.parquet", dir);
  snprintf(link_path, sizeof(link_path), "%s/linked.parquet", test_tmpdir());
  const char *src[1] = {dir};
  larder_stream_options_t o;
  std_opts(&o, 100, 1);
  o.sources = src;
  o.window = 1;
  /* No cache and no memory to spare: every unit is read from its file
   * when a batch needs it. */
  static const char *const fl[] = {"--cache_capacity=0", "--memory_limit=1", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  dh_run ref = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &ref));
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  for (int round = 0; round < 2; round++) {
    larder_stream_t *s;
    ASSERT_OK(larder_stream_open(c, &o, &s));
    larder_batch_t *b;
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    ASSERT_UINT_EQ(dh_batch_hash(b), ref.b[0].hash);
    larder_batch_release(b);
    size_t k = 1;
    if (round == 0) {
      struct stat before, after;
      ASSERT_OK(stat(path, &before));
      ASSERT_OK(chmod(path, 0600));
      ASSERT_OK(link(path, link_path));
      ASSERT_OK(stat(path, &after));
      ASSERT(after.st_ctim.tv_sec != before.st_ctim.tv_sec ||
             after.st_ctim.tv_nsec != before.st_ctim.tv_nsec);
      int rc = read_against(s, &ref, &k);
      if (rc != LARDER_EEOF) ASSERT_FAIL_("after chmod: %s", larder_client_last_error(c));
      ASSERT_EQ(k, ref.n);
    } else {
      rewrite_same_size(path, 1);
      int rc = read_against(s, &ref, &k);
      ASSERT_EQ(rc, LARDER_EIO);
      ASSERT_STR_CONTAINS(larder_client_last_error(c), "part-001.parquet");
      ASSERT_STR_CONTAINS(larder_client_last_error(c), "changed since the stream opened");
    }
    larder_stream_close(s);
  }
  larder_client_close(c);
  dh_run_free(&ref);
  dh_stop(&d);
  return 0;
}

/* A client streaming job `o` until the daemon dies, checking each batch
 * against the clean run. */
typedef struct kill_reader {
  pthread_t th;
  const char *socket;
  larder_stream_options_t o;
  const dh_run *clean;
  atomic_int got;
  int bad;
} kill_reader;

static void *kill_reader_main(void *p) {
  kill_reader *k = p;
  larder_client_t *c;
  if (larder_client_connect(k->socket, &c)) return NULL;
  larder_stream_t *s;
  if (larder_stream_open(c, &k->o, &s) == 0) {
    larder_batch_t *b;
    while (larder_stream_next(s, 60000 * dh_slow(), &b) == 0) {
      /* Batches that arrive are whole and right, even as the daemon dies. */
      if ((size_t)k->got >= k->clean->n || dh_batch_hash(b) != k->clean->b[k->got].hash) k->bad = 1;
      k->got++;
      larder_batch_release(b);
    }
    larder_stream_close(s);
  }
  larder_client_close(c);
  return NULL;
}

/*
 * kill -9 while the cache fills: the daemon is killed mid-epoch at several
 * moments (right after the opens, a few milliseconds later, after some
 * batches), with two clients streaming (two jobs: all columns, and two
 * columns with another seed), and restarted on the same cache each time.
 * Every restart serves byte-identical batches; at the end, every batch is
 * identical to a clean run, the cache fills and serves the rest, and any
 * entry found damaged was dropped, never served.
 */
TEST_IMPL(daemon_cache_kill9) {
  char dir[1024];
  ASSERT_EQ(dh_mid_dataset(dir, sizeof(dir)), DH_MID_ROWS);
  const char *src[1] = {dir};
  static const char *const cols[] = {"name", "id"};
  larder_stream_options_t o[2];
  for (int j = 0; j < 2; j++) {
    dh_opts(&o[j], src, 200, 3 + (uint64_t)j, 1);
    o[j].unit_rows = 512;
    o[j].shuffle_window = 5;
    o[j].arena_bytes = 8u << 20;
  }
  o[1].columns = cols;
  o[1].num_columns = 2;
  dh_run clean[2] = {{0}, {0}};
  {
    dh_daemon c;
    dh_init(&c, "clean", NULL);
    dh_start(&c);
    for (int j = 0; j < 2; j++) ASSERT_OK(dh_collect(c.socket, &o[j], 0, &clean[j]));
    dh_stop(&c);
  }
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", "--memory_limit=1M", NULL};
  dh_init(&d, "d", fl);
  /* Kill moments: milliseconds after the opens, or batches read first. */
  static const int after_ms[] = {0, 1, 2, 4, 7, 12, 0, 0, 0};
  static const int after_batches[] = {0, 0, 0, 0, 0, 0, 1, 10, 100};
  uint64_t checksum_failures = 0;
  for (size_t k = 0; k < sizeof(after_ms) / sizeof(after_ms[0]); k++) {
    dh_start(&d);
    if (k > 0) {
      /* What the killed daemon left serves identically (a prefix). */
      dh_run r = {0};
      ASSERT_OK(dh_collect(d.socket, &o[k % 2], 20, &r));
      for (size_t i = 0; i < r.n; i++) ASSERT_EQ(r.b[i].hash, clean[k % 2].b[i].hash);
      dh_run_free(&r);
      checksum_failures += dh_stat(&d, "cache.checksum_failures");
    }
    kill_reader rd[2];
    memset(rd, 0, sizeof(rd));
    for (int j = 0; j < 2; j++) {
      rd[j].socket = d.socket;
      rd[j].o = o[j];
      rd[j].clean = &clean[j];
      ASSERT_OK(pthread_create(&rd[j].th, NULL, kill_reader_main, &rd[j]));
    }
    if (after_batches[k]) {
      double deadline = test_now_ms() + 30000.0 * dh_slow();
      while (rd[0].got < after_batches[k] && test_now_ms() < deadline) usleep(500);
    } else {
      while (rd[0].got == 0 && rd[1].got == 0 && after_ms[k] == 0 && dh_stat(&d, "streams") < 2)
        usleep(200);
      usleep((useconds_t)after_ms[k] * 1000);
    }
    dh_kill(&d);
    for (int j = 0; j < 2; j++) {
      pthread_join(rd[j].th, NULL);
      ASSERT_EQ(rd[j].bad, 0);
    }
    fprintf(stderr, "killed after %d ms / %d batches: the clients had %d and %d batches\n",
            after_ms[k], after_batches[k], rd[0].got, rd[1].got);
  }
  dh_start(&d);
  for (int k = 0; k < 2; k++) {
    for (int j = 0; j < 2; j++) {
      dh_run r = {0};
      r.check_rows = 1;
      ASSERT_OK(dh_collect(d.socket, &o[j], 0, &r));
      dh_expect_same(&clean[j], &r);
      dh_run_free(&r);
    }
  }
  char *json = dh_admin(&d, "stats");
  checksum_failures += dh_json_u64(json, "cache.checksum_failures");
  ASSERT_EQ(dh_json_u64(json, "unit_errors"), 0);
  ASSERT_EQ(dh_json_u64(json, "stream_errors"), 0);
  ASSERT_GT(dh_json_u64(json, "units_from_cache"), 0);
  free(json);
  fprintf(stderr, "checksum failures after the kills: %" PRIu64 "\n", checksum_failures);
  dh_stop(&d);
  /* Once more on the cache the clean runs left: all from the cache. */
  dh_start(&d);
  for (int j = 0; j < 2; j++) {
    dh_run r = {0};
    ASSERT_OK(dh_collect(d.socket, &o[j], 0, &r));
    dh_expect_same(&clean[j], &r);
    dh_run_free(&r);
  }
  json = dh_admin(&d, "stats");
  ASSERT_EQ(dh_json_u64(json, "units_decoded"), 0);
  ASSERT_EQ(dh_json_u64(json, "cache.checksum_failures"), 0);
  free(json);
  dh_stop(&d);
  dh_run_free(&clean[0]);
  dh_run_free(&clean[1]);
  return 0;
}

/* One daemon (its directory `name`, with `flags`), four jobs in turn on
 * the standard dataset with units of at most unit_rows rows. */
static int shared_columns_case(const char *name, const char *const *flags, uint32_t unit_rows) {
  dh_daemon d;
  dh_init(&d, name, flags);
  dh_start(&d);
  static const char *const cols_a[] = {"id", "label", "x"};
  static const char *const cols_b[] = {"id", "name"};
  static const char *const cols_c[] = {"label", "id"};
  static const char *const cols_d[] = {"name", "x", "id"};
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  o.unit_rows = unit_rows;
  o.columns = cols_a;
  o.num_columns = 3;
  dh_run ra = {0};
  ra.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &ra));
  char *json = dh_admin(&d, "stats");
  uint64_t e_a = dh_json_u64(json, "cache.entries");
  uint64_t dec_a = dh_json_u64(json, "units_decoded");
  free(json);
  ASSERT_EQ(e_a % 3, 0);
  uint64_t units = e_a / 3;
  ASSERT_GE(units, 10);

  o.columns = cols_b;
  o.num_columns = 2;
  dh_run rb = {0};
  rb.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &rb));
  json = dh_admin(&d, "stats");
  uint64_t e_b = dh_json_u64(json, "cache.entries");
  free(json);
  /* Only "name" was new. */
  ASSERT_EQ(e_b, units * 4);

  /* Subsets and recombinations of cached columns decode nothing. */
  uint64_t dec_before = dh_stat(&d, "units_decoded");
  ASSERT_GE(dec_before, dec_a);
  o.columns = cols_c;
  o.num_columns = 2;
  dh_run rc_ = {0};
  rc_.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &rc_));
  o.columns = cols_d;
  o.num_columns = 3;
  dh_run rd = {0};
  rd.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &rd));
  json = dh_admin(&d, "stats");
  ASSERT_EQ(dh_json_u64(json, "units_decoded"), dec_before);
  ASSERT_EQ(dh_json_u64(json, "cache.entries"), units * 4);
  free(json);
  /* The same samples in the same order whatever the projection. */
  ASSERT_EQ(ra.n, rb.n);
  for (size_t i = 0; i < ra.n; i++) {
    ASSERT_MEM_EQ(ra.b[i].ids, rb.b[i].ids, (size_t)ra.b[i].rows * 8);
    ASSERT_MEM_EQ(ra.b[i].ids, rc_.b[i].ids, (size_t)ra.b[i].rows * 8);
    ASSERT_MEM_EQ(ra.b[i].ids, rd.b[i].ids, (size_t)ra.b[i].rows * 8);
  }
  dh_run_free(&ra);
  dh_run_free(&rb);
  dh_run_free(&rc_);
  dh_run_free(&rd);
  dh_stop(&d);
  return 0;
}

/*
 * Two jobs projecting different columns share the cache entries of the
 * columns they have in common: the second job adds only its own columns'
 * entries, and a third job on a subset of what is cached decodes nothing.
 * Also when unit_bytes, not unit_rows, sets the units' size: units are cut
 * by the width of whole rows, not of the projected columns (otherwise two
 * projections of different widths would be cut differently, so they would
 * share no entry, each would decode everything, and their orders would
 * differ).
 */
TEST_IMPL(daemon_cache_shared_columns) {
  /* A tiny memory pool, so that nothing is shared through memory. */
  static const char *const fl[] = {"--memory_limit=1", NULL};
  ASSERT_OK(shared_columns_case("rows", fl, DH_STD_UNIT_ROWS));
  static const char *const fl_bytes[] = {"--memory_limit=1", "--unit_bytes=4096", NULL};
  ASSERT_OK(shared_columns_case("bytes", fl_bytes, 65536));
  return 0;
}

static int changed_variant(int64_t id) { return id >= 1000000 ? 1 : 0; }
/* The same, with file 1 (ids 2500 .. 4999) rewritten too, as variant
 * `rewritten`. */
static int rewritten;
static int rewritten_variant(int64_t id) {
  return id >= 2500 && id < 5000 ? rewritten : changed_variant(id);
}

/* Rewrites the cache's values (key prefix 'v', store.c's on-disk layout)
 * in place, the daemon stopped: of every three, the first gets a flipped
 * payload byte (its checksum fails), the second a serving-layout version
 * this build does not read, with its checksums made good again (what a
 * cache written by another build holds), the third is left alone.
 * Returns how many values were rewritten. */
static int spoil_cache_values(const char *cache_dir) {
  char path[700];
  snprintf(path, sizeof(path), "%s/db", cache_dir);
  rocksdb_options_t *opt = rocksdb_options_create();
  char *err = NULL;
  rocksdb_t *db = rocksdb_open(opt, path, &err);
  ASSERT_NULL(err);
  rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
  rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
  rocksdb_iterator_t *it = rocksdb_create_iterator(db, ro);
  rocksdb_writebatch_t *b = rocksdb_writebatch_create();
  enum { HDR = 32, LAYOUT_VERSION_AT = HDR + 4 };
  int seen = 0, spoiled = 0;
  for (rocksdb_iter_seek(it, "v", 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
    size_t kl, vl;
    const char *k = rocksdb_iter_key(it, &kl);
    if (kl == 0 || k[0] != 'v') break;
    const char *v = rocksdb_iter_value(it, &vl);
    ASSERT_GT(vl, HDR + 8);
    uint8_t *c = malloc(vl);
    ASSERT_NOT_NULL(c);
    memcpy(c, v, vl);
    int kind = seen++ % 3;
    if (kind == 0) {
      c[vl - 1] ^= 0x5a;
    } else if (kind == 1) {
      c[LAYOUT_VERSION_AT] = 0x7f;
      uint32_t crc = store_crc32c(0, c + HDR, vl - HDR);
      memcpy(c + 8, &crc, 4); /* little-endian hosts only, as the cache is */
      uint32_t hcrc = store_crc32c(store_crc32c(0, c, 12), c + 16, 16);
      memcpy(c + 12, &hcrc, 4);
    }
    if (kind != 2) {
      rocksdb_writebatch_put(b, k, kl, (const char *)c, vl);
      spoiled++;
    }
    free(c);
  }
  rocksdb_iter_destroy(it);
  rocksdb_write(db, wo, b, &err);
  ASSERT_NULL(err);
  rocksdb_writebatch_destroy(b);
  rocksdb_close(db);
  rocksdb_readoptions_destroy(ro);
  rocksdb_writeoptions_destroy(wo);
  rocksdb_options_destroy(opt);
  return spoiled;
}

/* Values that fail their checksum, and values whose checksums hold but
 * whose serving layout this build cannot read, are dropped and rebuilt:
 * the stream gets the same rows, the daemon stays up, and the next epoch
 * is served wholly from the cache again.  (The second kind crashed the
 * daemon on every load of its unit, and again after each restart.) */
TEST_IMPL(daemon_cache_bad_entries) {
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  dh_run r0 = {0};
  r0.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r0));
  ASSERT_GT(dh_stat(&d, "units_decoded"), 0);
  dh_stop(&d);
  ASSERT_GT(spoil_cache_values(d.cache), DH_STD_UNITS);

  dh_start(&d);
  dh_run r1 = {0};
  r1.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r1));
  dh_expect_same(&r0, &r1);
  /* Every unit had spoiled columns (its six lie side by side), so every
   * unit was decoded again, in runs of a row group's units at a time. */
  uint64_t decoded = dh_stat(&d, "units_decoded");
  ASSERT_GT(decoded, 0);
  char *json = dh_admin(&d, "stats");
  ASSERT_GT(dh_json_u64(json, "cache.checksum_failures"), 0);
  ASSERT_EQ(dh_json_u64(json, "cache.entries"), DH_STD_UNITS * DH_NUM_COLS);
  free(json);
  /* The log says so within the daemon's one-second tick.  (It said
   * nothing: only the stats showed a failing disk.) */
  int logged = 0;
  for (int i = 0; i < 50 && !logged; i++) {
    char *log = dh_read_log(&d);
    logged = strstr(log, "failed their checksum since the start") != NULL;
    free(log);
    if (!logged) usleep(100000);
  }
  ASSERT(logged);

  dh_run r2 = {0};
  r2.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r2));
  dh_expect_same(&r0, &r2);
  ASSERT_EQ(dh_stat(&d, "units_decoded"), decoded);
  dh_run_free(&r0);
  dh_run_free(&r1);
  dh_run_free(&r2);
  dh_stop(&d);
  return 0;
}

/*
 * A damaged table file in the cache (a failing disk): the units whose
 * entries lie in it are decoded again from their sources and served
 * right, and `larderctl verify` says which file is damaged and what to do.
 * Reads check RocksDB's block checksums: without them Debian's RocksDB
 * aborts the daemon on the damaged block's garbage compression type.
 */
TEST_IMPL(daemon_cache_damaged_table) {
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  dh_run r0 = {0};
  r0.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r0));
  dh_stop(&d);
  char db[700];
  snprintf(db, sizeof(db), "%s/db", d.cache);
  dh_damage_largest_table(db);

  dh_start(&d);
  dh_run r1 = {0};
  r1.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r1));
  dh_expect_same(&r0, &r1);
  ASSERT_GT(dh_stat(&d, "units_decoded"), 0);
  char *reply = dh_admin(&d, "verify");
  ASSERT_NOT_NULL(reply);
  ASSERT_STR_CONTAINS(reply, ".sst");
  ASSERT_STR_CONTAINS(reply, "stop larderd and remove");
  free(reply);
  ASSERT(dh_alive(&d));
  dh_run_free(&r0);
  dh_run_free(&r1);
  dh_stop(&d);
  return 0;
}

/* Serves the standard dataset twice from d, which has no cache: the same
 * rows each time, the second decoded again; the stats and the log say why
 * there is no cache (want in both), and the cache's admin commands fail
 * with a message instead of taking the daemon down. */
static void expect_cacheless(dh_daemon *d, const char *want) {
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  dh_run r0 = {0}, r1 = {0};
  r0.check_rows = r1.check_rows = 1;
  ASSERT_OK(dh_collect(d->socket, &o, 0, &r0));
  uint64_t decoded = dh_stat(d, "units_decoded");
  ASSERT_GE(decoded, DH_STD_UNITS);
  /* No unit stays in memory (memory_limit=1), and none is cached. */
  ASSERT_OK(dh_collect(d->socket, &o, 0, &r1));
  dh_expect_same(&r0, &r1);
  ASSERT_GE(dh_stat(d, "units_decoded"), decoded + DH_STD_UNITS);
  char *json = dh_admin(d, "stats");
  ASSERT_NOT_NULL(json);
  ASSERT_STR_CONTAINS(json, "\"cache_error\":");
  ASSERT_STR_CONTAINS(json, want);
  free(json);
  char *log = dh_read_log(d);
  ASSERT_STR_CONTAINS(log, "serving without a cache");
  ASSERT_STR_CONTAINS(log, want);
  free(log);
  char *reply = dh_admin(d, "verify");
  free(reply);
  ASSERT(dh_alive(d));
  dh_run_free(&r0);
  dh_run_free(&r1);
}

/*
 * A cache that cannot be opened at startup: larderd serves without one,
 * decoding every epoch, and says why, rather than refusing to start, which
 * would have systemd restart it in a loop while every trainer on the node
 * waited.
 * Two cases: RocksDB cannot open its directory (a file stands in its way,
 * as a failing filesystem would answer), and a full disk (a tmpfs with less
 * free than the cache needs to open, where a mount is allowed).
 */
TEST_IMPL(daemon_cache_unusable) {
  static const char *const fl[] = {"--memory_limit=1", NULL};
  dh_daemon d;
  dh_init(&d, "blocked", fl);
  char path[700];
  ASSERT_EQ(test_system("mkdir -p '%s' && : > '%s/db'", d.cache, d.cache), 0);
  dh_start(&d);
  expect_cacheless(&d, "is not a directory");
  dh_stop(&d);

  dh_daemon f;
  dh_init(&f, "full", fl);
  ASSERT_EQ(test_system("mkdir -p '%s'", f.cache), 0);
  if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("tmpfs", f.cache, "tmpfs", 0, "size=32m") != 0) {
    fprintf(stderr, "cannot mount a tmpfs here (%s): the full disk is skipped\n", strerror(errno));
    return 0;
  }
  /* 2 MiB free: less than the 4 MiB that a cache on 32 MiB needs to open. */
  snprintf(path, sizeof(path), "%s/ballast", f.cache);
  ASSERT_EQ(test_system("head -c 30M /dev/zero > '%s'", path), 0);
  dh_start(&f);
  expect_cacheless(&f, "no space left");
  dh_stop(&f);
  umount(f.cache);
  return 0;
}

/*
 * A small cache filesystem (a 32 MiB tmpfs) caches what fits: its memtable
 * and the space it keeps free scale to the disk.  With the 64 MiB memtable
 * and 32 MiB reserve meant for large disks it cached nothing, and the log
 * said there was no space left while 28 MiB were free.  On one too full to
 * admit anything (8 MiB free) the log says how much is free and how much
 * the cache wants free.  Skipped where mounts are not allowed.
 */
TEST_IMPL(daemon_cache_small_disk) {
  static const char *const fl[] = {"--memory_limit=1", NULL};
  dh_daemon d;
  dh_init(&d, "small", fl);
  ASSERT_EQ(test_system("mkdir -p '%s'", d.cache), 0);
  if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("tmpfs", d.cache, "tmpfs", 0, "size=32m") != 0) {
    fprintf(stderr, "cannot mount a tmpfs here (%s): skipped\n", strerror(errno));
    return TEST_SKIP;
  }
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  dh_run r0 = {0}, r1 = {0};
  r0.check_rows = r1.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r0));
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r1)); /* memory_limit=1: from the cache */
  dh_expect_same(&r0, &r1);
  uint64_t from_cache = dh_stat(&d, "units_from_cache");
  printf("  32 MiB cache: %" PRIu64 " unit reads from it over two passes of %d units\n", from_cache,
         DH_STD_UNITS);
  ASSERT_GE(from_cache, DH_STD_UNITS);
  char *log = dh_read_log(&d);
  ASSERT(strstr(log, "no space left") == NULL && strstr(log, "too little space") == NULL);
  free(log);
  dh_stop(&d);
  umount(d.cache);

  dh_daemon f;
  dh_init(&f, "fuller", fl);
  ASSERT_EQ(test_system("mkdir -p '%s'", f.cache), 0);
  ASSERT_OK(mount("tmpfs", f.cache, "tmpfs", 0, "size=32m"));
  char path[700];
  snprintf(path, sizeof(path), "%s/ballast", f.cache);
  ASSERT_EQ(test_system("head -c 24M /dev/zero > '%s'", path), 0);
  dh_start(&f);
  dh_run r2 = {0};
  ASSERT_OK(dh_collect(f.socket, &o, 0, &r2));
  ASSERT_EQ(dh_stat(&f, "units_from_cache"), 0);
  log = dh_read_log(&f);
  ASSERT_STR_CONTAINS(log, "too little space on the device: ");
  ASSERT_STR_CONTAINS(log, "free, and a unit needs ");
  free(log);
  dh_stop(&f);
  umount(f.cache);
  dh_run_free(&r0);
  dh_run_free(&r1);
  dh_run_free(&r2);
  return 0;
}

/*
 * A changed file is never served stale: after a file is rewritten with
 * other content (and mtime), a new stream sees only the new rows, from a
 * warm daemon and after a restart; a stream opened before the file was
 * replaced serves the old file to its end, through its own descriptor.
 * That holds too for a file overwritten with content of the same size and
 * its mtime put back (which an identity of size and mtime alone would
 * miss).
 */
TEST_IMPL(daemon_cache_changed_file) {
  char dir[1024];
  snprintf(dir, sizeof(dir), "%s/data", test_tmpdir());
  ASSERT_OK(test_system("mkdir -p '%s' && cp '%s'/*.parquet '%s'/", dir, dh_std_dir(), dir));
  const char *src[1] = {dir};
  larder_stream_options_t o;
  dh_opts(&o, src, 64, 5, 1);
  o.unit_rows = DH_STD_UNIT_ROWS;
  o.shuffle_window = 4;
  o.arena_bytes = ARENA;
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  dh_run before = {0};
  before.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &before));

  /* A stream opened before the change, paused after one batch, with a
   * small window so that most of its units are not loaded yet; on a second
   * daemon without cache or memory to spare, so that it must read the file
   * again. */
  dh_daemon d2;
  static const char *const fl2[] = {"--cache_capacity=0", "--memory_limit=1", NULL};
  dh_init(&d2, "d2", fl2);
  dh_start(&d2);
  larder_stream_options_t so = o;
  so.window = 1;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d2.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &so, &s));
  larder_batch_t *b;
  ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
  larder_batch_release(b);

  /* Rewrite file 0: ids from 1000000, variant 1, a later mtime. */
  char path[1200];
  snprintf(path, sizeof(path), "%s/part-000.parquet", dir);
  struct stat st0;
  ASSERT_OK(stat(path, &st0));
  dh_spec spec = dh_std_spec;
  spec.id_base = 1000000;
  spec.variant = 1;
  dh_write_file(&spec, 0, path);
  struct timespec ts[2] = {st0.st_mtim, st0.st_mtim};
  ts[0].tv_sec += 10;
  ts[1].tv_sec += 10;
  ASSERT_OK(utimensat(AT_FDCWD, path, ts, 0));

  /* The old stream reads through the descriptor it opened, which the
   * rename left on the old file: old rows only, every one of them, to a
   * clean end.  (A file rewritten in place ends it naming the file:
   * daemon_cache_chmod_file.) */
  int rc;
  uint64_t old_batches = 1;
  while ((rc = larder_stream_next(s, 60000 * dh_slow(), &b)) == 0) {
    int64_t ids[64];
    int64_t n = dh_batch_ids(b, ids, 64);
    for (int64_t i = 0; i < n; i++) {
      ASSERT_LT(ids[i], DH_STD_ROWS);
      dh_expect_row(b, i, 0);
    }
    larder_batch_release(b);
    old_batches++;
  }
  fprintf(stderr, "the old stream ended with %s after %" PRIu64 " batches: %s\n",
          larder_err_name(rc), old_batches, larder_client_last_error(c));
  ASSERT_EQ(rc, LARDER_EEOF);
  ASSERT_EQ(old_batches, before.n);
  larder_stream_close(s);
  larder_client_close(c);
  /* A new stream on that daemon sees the new file. */
  dh_run after2 = {0};
  after2.check_rows = 1;
  after2.variant_of = changed_variant;
  ASSERT_OK(dh_collect(d2.socket, &o, 0, &after2));
  ASSERT_EQ(after2.n, before.n);
  dh_run_free(&after2);
  dh_stop(&d2);

  for (int pass = 0; pass < 2; pass++) {
    dh_run after = {0};
    after.check_rows = 1;
    after.variant_of = changed_variant;
    ASSERT_OK(dh_collect(d.socket, &o, 0, &after));
    ASSERT_EQ(after.n, before.n);
    size_t fresh = 0;
    for (size_t i = 0; i < after.n; i++)
      for (int64_t j = 0; j < after.b[i].rows; j++) {
        int64_t id = after.b[i].ids[j];
        /* File 0's old ids (0 .. 2499) must never come back. */
        ASSERT(id >= 2500);
        fresh += id >= 1000000;
      }
    ASSERT_GE(fresh, 2500);
    dh_run_free(&after);
    if (pass == 0) {
      dh_stop(&d);
      dh_start(&d);
    }
  }

  /* File 1 overwritten in place by other values of the same size, its old
   * mtime put back, as cp -p or rsync -t leave it: the warm daemon must
   * serve the new values. */
  char path1[1200];
  snprintf(path1, sizeof(path1), "%s/part-001.parquet", dir);
  struct stat st1;
  ASSERT_OK(stat(path1, &st1));
  rewritten = rewrite_same_size(path1, 1);
  struct stat st1b;
  ASSERT_OK(stat(path1, &st1b));
  ASSERT_EQ(st1b.st_size, st1.st_size);
  ASSERT_EQ(st1b.st_mtim.tv_sec, st1.st_mtim.tv_sec);
  ASSERT_EQ(st1b.st_mtim.tv_nsec, st1.st_mtim.tv_nsec);
  dh_run same = {0};
  same.check_rows = 1;
  same.variant_of = rewritten_variant;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &same));
  ASSERT_EQ(same.n, before.n);
  dh_run_free(&same);
  dh_run_free(&before);
  dh_stop(&d);
  return 0;
}
