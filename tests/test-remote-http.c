/*
 * test-remote-http.c: remote shards over HTTP(S) from nginx: the batch
 * sequence equals the local one, footers by suffix range, projected
 * columns by merged ranges over kept-alive connections; servers that
 * ignore Range; TLS with and without the CA file; a dataset mixing local
 * and remote files; revalidation of a replaced object.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../daemon/parquet.h"
#include "remote-harness.h"

#define ARENA (8u << 20)

static void std_opts(larder_stream_options_t *o, const char *const *src, size_t nsrc,
                     uint64_t epochs) {
  dh_opts(o, src, 100, 7, epochs);
  o->num_sources = nsrc;
  o->unit_rows = DH_STD_UNIT_ROWS;
  o->shuffle_window = 8;
  o->arena_bytes = ARENA;
}

/* The Range headers the daemon should send for the projected columns of
 * every row group of the local file at path, with chunks closer than gap
 * merged (as units.c does): "bytes=a-b" strings appended to out. */
static int expected_ranges(const char *path, const char *const *cols, size_t ncols, uint64_t gap,
                           char out[][64], int max) {
  pq_source src;
  pq_error err = {0, ""};
  ASSERT_OK(pq_source_open_file(&src, path, &err));
  pq_options po;
  pq_options_init(&po);
  pq_file *f = NULL;
  ASSERT_OK(pq_file_open(&src, &po, &f, &err));
  pq_projection *proj = NULL;
  ASSERT_OK(pq_projection_create(f, cols, ncols, &proj, &err));
  int n = 0;
  for (int g = 0; g < pq_file_meta(f)->num_row_groups; g++) {
    pq_range_t *r = NULL;
    int k = pq_projection_ranges(f, proj, g, &r, &err);
    ASSERT_GE(k, 0);
    int m = 0;
    for (int i = 0; i < k; i++) {
      if (m > 0 && r[i].offset <= r[m - 1].offset + r[m - 1].length + gap)
        r[m - 1].length = r[i].offset + r[i].length - r[m - 1].offset;
      else
        r[m++] = r[i];
    }
    for (int i = 0; i < m; i++) {
      ASSERT_LT(n, max);
      snprintf(out[n++], 64, "bytes=%llu-%llu", (unsigned long long)r[i].offset,
               (unsigned long long)(r[i].offset + r[i].length - 1));
    }
    free(r);
  }
  pq_projection_free(proj);
  pq_file_close(f);
  pq_source_close_file(&src);
  return n;
}

/* Asserts that the requests for /name in the access log are: one suffix
 * range for the footer, then exactly the ranges in want (each once). */
static void expect_file_requests(const rh_log *log, const char *name, char want[][64], int nwant,
                                 int opens) {
  char path[256], req[512], range[128];
  snprintf(path, sizeof(path), "GET /%s HTTP/1.1", name);
  int footers = 0;
  int *seen = calloc((size_t)nwant + 1, sizeof(int));
  ASSERT_NOT_NULL(seen);
  for (int i = 0; i < log->n; i++) {
    rh_field(log->lines[i], "request", req, sizeof(req));
    if (strcmp(req, path) != 0) continue;
    rh_field(log->lines[i], "range", range, sizeof(range));
    ASSERT_EQ(rh_field_int(log->lines[i], "status", 0), 206);
    if (strncmp(range, "bytes=-", 7) == 0) {
      footers++;
      continue;
    }
    int k = 0;
    while (k < nwant && strcmp(want[k], range) != 0) k++;
    if (k == nwant) ASSERT_FAIL_("%s: unexpected range %s", name, range);
    seen[k]++;
  }
  ASSERT_EQ(footers, opens);
  for (int k = 0; k < nwant; k++)
    if (seen[k] != 1) ASSERT_FAIL_("%s: range %s fetched %d times", name, want[k], seen[k]);
  free(seen);
}

/*
 * A dataset served by nginx gives the same batches (per-batch hash of every
 * byte, and ids) as the same files read locally, with the same seed, over
 * two epochs; the access log shows one suffix-range footer read per file
 * and open, each row group's projected chunks fetched once with chunks
 * merged when the gap allows (fetch_merge_gap) and split when it does not,
 * and connections kept alive across requests.
 */
TEST_IMPL(remote_http_order) {
  int skip = rh_require(1, 0);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  rs_server ng;
  rh_nginx(&ng, "ng", dir, NULL);
  char log_path[PATH_MAX];
  rh_nginx_log("ng", log_path, sizeof(log_path));
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(ng.url, dir, urls, RH_MAX_FILES);
  ASSERT_EQ(nf, 4);

  dh_daemon d;
  static const char *const fl[] = {"--workers=2", NULL};
  dh_init(&d, "d", fl);
  dh_start(&d);
  const char *local_src[1] = {dir};
  larder_stream_options_t lo, ro;
  std_opts(&lo, local_src, 1, 2);
  std_opts(&ro, (const char *const *)urls, (size_t)nf, 2);
  dh_run local = {0}, remote = {0};
  remote.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &lo, 0, &local));
  ASSERT_OK(dh_collect(d.socket, &ro, 0, &remote));
  dh_expect_same(&local, &remote);
  for (size_t i = 0; i < local.n; i++)
    ASSERT_MEM_EQ(local.b[i].ids, remote.b[i].ids, (size_t)local.b[i].rows * 8);
  ASSERT_GT(dh_stat(&d, "fetch_bytes"), 0);

  dh_stop(&d);

  /* The same projection of two columns apart (label and x lie between id
   * and name) on two fresh daemons (a warm one would serve the columns from
   * its cache): merged into one range per row group by default, one range
   * per chunk with fetch_merge_gap=0. */
  static const char *const cols[] = {"id", "name"};
  larder_stream_options_t po = ro;
  po.columns = cols;
  po.num_columns = 2;
  po.epochs = 1;
  dh_run proj = {0}, proj0 = {0};
  dh_daemon dm, d0;
  static const char *const flm[] = {"--workers=2", NULL};
  static const char *const fl0[] = {"--workers=2", "--fetch_merge_gap=0", NULL};
  dh_init(&dm, "dm", flm);
  dh_start(&dm);
  ASSERT_OK(dh_collect(dm.socket, &po, 0, &proj));
  dh_stop(&dm);
  dh_init(&d0, "d0", fl0);
  dh_start(&d0);
  ASSERT_OK(dh_collect(d0.socket, &po, 0, &proj0));
  dh_expect_same(&proj, &proj0);
  dh_stop(&d0);
  rh_stop(&ng);

  rh_log log;
  rh_log_read(&log, log_path);
  if (getenv("RH_VERBOSE"))
    for (int i = 0; i < log.n; i++) fprintf(stderr, "%s\n", log.lines[i]);
  /* Per file: what the all-columns stream, the merged projection and the
   * unmerged one asked for (three opens, so three footer reads). */
  char *names[RH_MAX_FILES];
  int nn = rh_files(dir, names, RH_MAX_FILES);
  static char want[256][64];
  int requests = 0;
  for (int i = 0; i < nn; i++) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    int n = expected_ranges(path, NULL, 0, 1u << 20, want, 256);
    int n1 = expected_ranges(path, cols, 2, 1u << 20, want + n, 256 - n);
    int n0 = expected_ranges(path, cols, 2, 0, want + n + n1, 256 - n - n1);
    /* Each row group: one range for all columns, one for the merged
     * projection, two for the unmerged one. */
    ASSERT_EQ(n1, n);
    ASSERT_EQ(n0, 2 * n);
    expect_file_requests(&log, names[i], want, n + n1 + n0, 3);
    requests += 3 + n + n1 + n0;
  }
  rh_files_free(names, nn);
  ASSERT_EQ(log.n, requests);
  /* Keep-alive: each daemon reads the footers on up to four connections,
   * which are idle once the dataset opens; the column requests that follow
   * reuse every one of them (more connections open only for requests in
   * flight at once). */
  int reused = 0;
  for (int i = 0; i < log.n; i++) reused += rh_field_int(log.lines[i], "connection_requests", 1) > 1;
  fprintf(stderr, "%d requests, %d on a reused connection\n", log.n, reused);
  ASSERT_GE(reused, 3 * nf);
  rh_log_free(&log);
  for (int i = 0; i < nf; i++) free(urls[i]);
  dh_run_free(&local);
  dh_run_free(&remote);
  dh_run_free(&proj);
  dh_run_free(&proj0);
  return 0;
}
