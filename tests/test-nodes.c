/*
 * test-nodes.c: many nodes, one dataset.  Several daemons on this machine,
 * each with its own cache, socket and nginx (so that each one's fetches
 * are counted on their own), stand for the nodes of a job; two ranks
 * stream from each.  With P = 4 node partitions and N = 1, 2 and 4 nodes:
 * every row once per epoch over all ranks of all nodes (plus the
 * documented padding), the same global batches whatever N, each node
 * fetching and caching its share alone (1/N of the dataset) in the first
 * epoch and nothing in the second.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote-harness.h"
#include "test-ctl-common.h"

#define NODES_MAX 4
#define LOCAL 2
#define PARTS 4
#define GLOBAL 256

typedef struct node_run {
  uint64_t batches;                   /* per epoch */
  uint64_t *ids[2];                   /* per epoch: global batch b at [b * GLOBAL] */
  int64_t column_bytes[NODES_MAX][2]; /* per node and epoch */
  uint64_t cache_bytes[NODES_MAX];
} node_run;

/* Column bytes nginx sent (range requests other than the footers' suffix
 * reads). */
static int64_t column_bytes(const char *log_path) {
  rh_log lg;
  rh_log_read(&lg, log_path);
  int64_t bytes = 0;
  for (int i = 0; i < lg.n; i++) {
    char range[64];
    rh_field(lg.lines[i], "range", range, sizeof(range));
    if (range[0] == '\0' || strncmp(range, "bytes=-", 7) == 0) continue;
    bytes += rh_field_int(lg.lines[i], "body_bytes_sent", 0);
  }
  rh_log_free(&lg);
  return bytes;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Runs two epochs of a job over `nodes` nodes into r. */
static void run_nodes(const char *dir, int nodes, node_run *r) {
  memset(r, 0, sizeof(*r));
  uint32_t ws = (uint32_t)nodes * LOCAL, bs = GLOBAL / ws;
  rs_server ng[NODES_MAX];
  dh_daemon d[NODES_MAX];
  char *urls[NODES_MAX][RH_MAX_FILES];
  int nf = 0;
  for (int n = 0; n < nodes; n++) {
    char name[32];
    snprintf(name, sizeof(name), "ng%d-%d", nodes, n);
    rh_nginx(&ng[n], name, dir, NULL);
    nf = rh_urls(ng[n].url, dir, urls[n], RH_MAX_FILES);
    snprintf(name, sizeof(name), "n%d-%d", nodes, n);
    static const char *const fl[] = {"--workers=2", NULL};
    dh_init(&d[n], name, fl);
    dh_start(&d[n]);
  }
  for (int e = 0; e < 2; e++) {
    int64_t before[NODES_MAX];
    for (int n = 0; n < nodes; n++) {
      char name[32], log_path[PATH_MAX];
      snprintf(name, sizeof(name), "ng%d-%d", nodes, n);
      rh_nginx_log(name, log_path, sizeof(log_path));
      before[n] = column_bytes(log_path);
    }
    for (int n = 0; n < nodes; n++) {
      larder_stream_options_t o[LOCAL];
      dh_run got[LOCAL];
      memset(got, 0, sizeof(got));
      for (int l = 0; l < LOCAL; l++) {
        dh_opts(&o[l], (const char *const *)urls[n], bs, 77, 1);
        o[l].num_sources = (size_t)nf;
        o[l].unit_rows = 512;
        o[l].shuffle_window = 16;
        o[l].world_size = (int32_t)ws;
        o[l].rank = n * LOCAL + l;
        o[l].local_world_size = LOCAL;
        o[l].partitions = PARTS;
        o[l].start_epoch = (uint64_t)e;
        o[l].epochs = (uint64_t)e + 1;
      }
      dh_collect_many(d[n].socket, o, LOCAL, got);
      for (int l = 0; l < LOCAL; l++) {
        if (got[l].rc) ASSERT_FAIL_("node %d rank %d: %s", n, n * LOCAL + l, got[l].err);
        if (r->batches == 0) {
          r->batches = got[l].n;
          for (int k = 0; k < 2; k++) {
            r->ids[k] = calloc(r->batches * GLOBAL, sizeof(uint64_t));
            ASSERT_NOT_NULL(r->ids[k]);
          }
        }
        ASSERT_EQ(got[l].n, r->batches);
        uint32_t rank = (uint32_t)(n * LOCAL + l);
        for (size_t b = 0; b < got[l].n; b++) {
          ASSERT_EQ(got[l].b[b].rows, (int64_t)bs);
          ASSERT_NOT_NULL(got[l].b[b].ids);
          memcpy(r->ids[e] + b * GLOBAL + (uint64_t)rank * bs, got[l].b[b].ids,
                 bs * sizeof(int64_t));
        }
        dh_run_free(&got[l]);
      }
    }
    for (int n = 0; n < nodes; n++) {
      char name[32], log_path[PATH_MAX];
      snprintf(name, sizeof(name), "ng%d-%d", nodes, n);
      rh_nginx_log(name, log_path, sizeof(log_path));
      rh_wait_lines(log_path, 1, 2000);
      r->column_bytes[n][e] = column_bytes(log_path) - before[n];
    }
  }
  for (int n = 0; n < nodes; n++) {
    /* The cache writes behind the stream: wait for it to settle. */
    uint64_t used = 0, last = UINT64_MAX;
    double deadline = test_now_ms() + 20000.0 * dh_slow();
    while (test_now_ms() < deadline) {
      used = dh_stat(&d[n], "cache.used_bytes");
      if (used == last && used > 0) break;
      last = used;
      usleep(200000);
    }
    r->cache_bytes[n] = used;
    dh_stop(&d[n]);
    rh_stop(&ng[n]);
    for (int i = 0; i < nf; i++) free(urls[n][i]);
  }
}

/*
 * N = 1, 2, 4 nodes of two ranks, P = 4: every row read once per epoch by
 * the ranks of all nodes (plus padding: partitions of 15,000 rows take 235
 * slices of 64), global batch k the same rows for every N, each node's
 * column fetches in the first epoch within 10% of 1/N of one node's, the
 * nodes' together within 5% of it (no row group fetched twice), none in the
 * second epoch, and each node's cache within 10% of 1/N of one node's.
 */
TEST_IMPL(daemon_partitions_nodes) {
  int skip = rh_require(1, 0);
  if (skip) return skip;
  char dir[1024];
  int64_t rows = dh_mid_dataset(dir, sizeof(dir));
  ASSERT_EQ(rows, DH_MID_ROWS);
  node_run runs[3];
  int counts[3] = {1, 2, 4};
  for (int i = 0; i < 3; i++) {
    run_nodes(dir, counts[i], &runs[i]);
    node_run *r = &runs[i];
    int64_t all = 0;
    for (int n = 0; n < counts[i]; n++) {
      fprintf(stderr,
              "%d nodes: node %d fetched %" PRId64 " column bytes in epoch 0, %" PRId64
              " in epoch 1; cache %" PRIu64 " bytes\n",
              counts[i], n, r->column_bytes[n][0], r->column_bytes[n][1], r->cache_bytes[n]);
      all += r->column_bytes[n][0];
      ASSERT_EQ(r->column_bytes[n][1], 0);
    }
    /* Every row once per epoch, the repeats being the padding alone. */
    for (int e = 0; e < 2; e++) {
      uint64_t total = r->batches * GLOBAL;
      uint32_t *seen = calloc(DH_MID_ROWS, sizeof(uint32_t));
      ASSERT_NOT_NULL(seen);
      for (uint64_t k = 0; k < total; k++) {
        int64_t id = (int64_t)r->ids[e][k];
        ASSERT(id >= 0 && id < DH_MID_ROWS);
        seen[id]++;
      }
      uint64_t repeats = 0;
      for (int64_t id = 0; id < DH_MID_ROWS; id++) {
        ASSERT_GE(seen[id], 1);
        repeats += seen[id] - 1;
      }
      ASSERT_EQ(repeats, total - DH_MID_ROWS);
      free(seen);
      for (uint64_t b = 0; b < r->batches; b++)
        qsort(r->ids[e] + b * GLOBAL, GLOBAL, sizeof(uint64_t), cmp_i64);
    }
    if (i > 0) {
      node_run *one = &runs[0];
      ASSERT_EQ(r->batches, one->batches);
      for (int e = 0; e < 2; e++)
        ASSERT_EQ(memcmp(r->ids[e], one->ids[e], r->batches * GLOBAL * sizeof(uint64_t)), 0);
      int64_t whole = one->column_bytes[0][0];
      ASSERT_LE((double)all, 1.05 * (double)whole);
      for (int n = 0; n < counts[i]; n++) {
        double share = (double)whole / counts[i];
        double got = (double)r->column_bytes[n][0];
        if (got < 0.9 * share || got > 1.1 * share)
          ASSERT_FAIL_("%d nodes: node %d fetched %.0f column bytes, its share is %.0f", counts[i],
                       n, got, share);
        double cshare = (double)one->cache_bytes[0] / counts[i];
        double c = (double)r->cache_bytes[n];
        if (c < 0.9 * cshare || c > 1.1 * cshare)
          ASSERT_FAIL_("%d nodes: node %d caches %.0f bytes, its share is %.0f", counts[i], n, c,
                       cshare);
      }
    }
  }
  for (int i = 0; i < 3; i++)
    for (int e = 0; e < 2; e++) free(runs[i].ids[e]);
  return 0;
}

/*
 * larderctl prefetch --partitions 4 --nodes 2 --node 1 warms node 1's
 * cache with its half alone: the prefetch fetches about half the dataset's
 * column bytes, and node 1's two ranks then read their first epoch without
 * fetching anything.
 */
TEST_IMPL(daemon_partitions_prefetch) {
  int skip = rh_require(1, 0);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_mid_dataset(dir, sizeof(dir)), DH_MID_ROWS);
  rs_server ng;
  rh_nginx(&ng, "ngp", dir, NULL);
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(ng.url, dir, urls, RH_MAX_FILES);
  char log_path[PATH_MAX];
  rh_nginx_log("ngp", log_path, sizeof(log_path));
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", NULL};
  dh_init(&d, "p", fl);
  dh_start(&d);
  const char *argv[RH_MAX_FILES + 16];
  int a = 0;
  argv[a++] = tc_ctl_bin();
  argv[a++] = "--socket";
  argv[a++] = d.socket;
  argv[a++] = "prefetch";
  for (int i = 0; i < nf; i++) argv[a++] = urls[i];
  static const char *const opts[] = {"--unit-rows", "512", "--partitions", "4",  "--nodes", "2",
                                     "--node",      "1",   "--seed",       "77", "--json"};
  for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) argv[a++] = opts[i];
  argv[a] = NULL;
  tc_out r;
  tc_run(&r, NULL, 120000 * dh_slow(), argv);
  if (r.status != 0) tc_out_print("prefetch", &r);
  ASSERT_EQ(r.status, 0);
  ASSERT_STR_CONTAINS(r.out, "\"event\":\"done\"");
  /* Remote row groups load as many at once as the fetch settings allow
   * (fetch_inflight_per_host, 16), not one per worker (2 here). */
  ASSERT_STR_CONTAINS(r.out, "\"concurrency\":16");
  tc_out_free(&r);
  rh_wait_lines(log_path, 1, 2000);
  int64_t prefetched = column_bytes(log_path);
  uint64_t whole = rh_projected_bytes(dir, NULL, 0, 1u << 20);
  fprintf(stderr, "prefetch of node 1 of 2: %" PRId64 " column bytes of %" PRIu64 "\n", prefetched,
          whole);
  ASSERT_GE((double)prefetched, 0.4 * (double)whole);
  ASSERT_LE((double)prefetched, 0.6 * (double)whole);
  larder_stream_options_t o[LOCAL];
  dh_run got[LOCAL];
  memset(got, 0, sizeof(got));
  for (int l = 0; l < LOCAL; l++) {
    dh_opts(&o[l], (const char *const *)urls, GLOBAL / 4, 77, 1);
    o[l].num_sources = (size_t)nf;
    o[l].unit_rows = 512;
    o[l].shuffle_window = 16;
    o[l].world_size = 4;
    o[l].rank = LOCAL + l;
    o[l].local_world_size = LOCAL;
    o[l].partitions = PARTS;
  }
  dh_collect_many(d.socket, o, LOCAL, got);
  for (int l = 0; l < LOCAL; l++) {
    if (got[l].rc) ASSERT_FAIL_("rank %d: %s", LOCAL + l, got[l].err);
    dh_run_free(&got[l]);
  }
  ASSERT_EQ(column_bytes(log_path), prefetched);
  for (int i = 0; i < nf; i++) free(urls[i]);
  dh_stop(&d);
  rh_stop(&ng);
  return 0;
}
