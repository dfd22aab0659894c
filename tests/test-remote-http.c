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

#include "remote-harness.h"

#define ARENA (8u << 20)

static void std_opts(larder_stream_options_t *o, const char *const *src, size_t nsrc,
                     uint64_t epochs) {
  dh_std_opts(o, src, nsrc, 100, 7, epochs, ARENA);
}

/* Asserts that the requests for /name in the access log are: `opens`
 * suffix ranges for the footers, and exactly the ranges in want (each
 * once). */
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
 * and open (and a second, exact range when footer_guess is smaller than the
 * footer), each row group's projected chunks fetched once with chunks
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
   * its cache): merged into one range per row group with every gap below
   * fetch_merge_gap merged (fetch_merge_gap_auto off: what the link
   * measures is tested by remote_merge_gap_auto), one range per chunk
   * with fetch_merge_gap=0. */
  static const char *const cols[] = {"id", "name"};
  larder_stream_options_t po = ro;
  po.columns = cols;
  po.num_columns = 2;
  po.epochs = 1;
  dh_run proj = {0}, proj0 = {0};
  dh_daemon dm, d0;
  static const char *const flm[] = {"--workers=2", "--fetch_merge_gap_auto=false", NULL};
  static const char *const fl0[] = {"--workers=2", "--fetch_merge_gap=0", "--footer_guess=256",
                                    NULL};
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
    int n = rh_ranges(path, NULL, 0, 1u << 20, want, 256, NULL);
    int n1 = rh_ranges(path, cols, 2, 1u << 20, want + n, 256 - n, NULL);
    int n0 = rh_ranges(path, cols, 2, 0, want + n + n1, 256 - n - n1, NULL);
    /* Each row group: one range for all columns, one for the merged
     * projection, two for the unmerged one. */
    ASSERT_EQ(n1, n);
    ASSERT_EQ(n0, 2 * n);
    /* d0 guessed 256 bytes for the footer, fewer than it has: a second,
     * exact range reads the rest of it. */
    size_t size = 0;
    uint8_t *bytes = test_read_file(path, &size);
    ASSERT_NOT_NULL(bytes);
    uint32_t flen = (uint32_t)bytes[size - 8] | (uint32_t)bytes[size - 7] << 8 |
                    (uint32_t)bytes[size - 6] << 16 | (uint32_t)bytes[size - 5] << 24;
    free(bytes);
    ASSERT_GT(flen + 8, 256);
    snprintf(want[n + n1 + n0], 64, "bytes=%zu-%zu", size - 8 - flen, size - 9);
    expect_file_requests(&log, names[i], want, n + n1 + n0 + 1, 3);
    requests += 3 + n + n1 + n0 + 1;
  }
  rh_files_free(names, nn);
  ASSERT_EQ(log.n, requests);
  /* Keep-alive: each daemon reads the footers on up to four connections,
   * which are idle once the dataset opens; the column requests that follow
   * reuse every one of them (more connections open only for requests in
   * flight at once). */
  int reused = 0;
  for (int i = 0; i < log.n; i++)
    reused += rh_field_int(log.lines[i], "connection_requests", 1) > 1;
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

/* Requests per path in an access log (nginx's "request" field), and their
 * statuses and body bytes. */
typedef struct path_count {
  int requests, whole, ranged;
  int64_t bytes;
  int not_modified; /* 304 */
} path_count;

static path_count count_path(const rh_log *log, const char *name) {
  path_count c = {0, 0, 0, 0, 0};
  char path[256], req[512];
  snprintf(path, sizeof(path), "GET /%s HTTP/1.1", name);
  for (int i = 0; i < log->n; i++) {
    rh_field(log->lines[i], "request", req, sizeof(req));
    if (strcmp(req, path) != 0) continue;
    c.requests++;
    int64_t st = rh_field_int(log->lines[i], "status", 0);
    c.whole += st == 200;
    c.ranged += st == 206;
    c.not_modified += st == 304;
    c.bytes += rh_field_int(log->lines[i], "body_bytes_sent", 0);
  }
  return c;
}

/* A local run of the standard dataset with the options of the remote one
 * (the reference batches). */
static void local_reference(const char *dir, uint64_t epochs, dh_run *out) {
  const char *src[1] = {dir};
  larder_stream_options_t o;
  std_opts(&o, src, 1, epochs);
  rh_local_reference(&o, out);
}

/*
 * A server that ignores Range (nginx with max_ranges 0: 200 and the whole
 * body): the batches are still right, and each object is downloaded whole
 * exactly once over two epochs although the footer and every row group
 * asked for ranges of it.  A second job asks once per object whether it
 * changed (If-None-Match: a 304, no body) and downloads nothing again.
 */
TEST_IMPL(remote_http_no_range) {
  int skip = rh_require(1, 0);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  dh_run ref = {0};
  local_reference(dir, 2, &ref);
  rs_server ng;
  static const char *const nx[] = {"--no-range", NULL};
  rh_nginx(&ng, "ng", dir, nx);
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(ng.url, dir, urls, RH_MAX_FILES);
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", NULL};
  dh_init(&d, "d", fl);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, (const char *const *)urls, (size_t)nf, 2);
  dh_run r = {0};
  r.check_rows = 1;
  if (dh_collect(d.socket, &o, 0, &r) != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("the stream failed: %s", r.err);
  }
  dh_expect_same(&ref, &r);
  /* A second job on the same objects (another projection): still no new
   * download, the objects are kept whole. */
  static const char *const cols[] = {"x", "id"};
  larder_stream_options_t po = o;
  po.columns = cols;
  po.num_columns = 2;
  po.epochs = 1;
  dh_run p = {0};
  p.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &po, 0, &p));
  char *log = dh_read_log(&d);
  ASSERT_STR_CONTAINS(log, "ignores Range requests");
  free(log);
  dh_stop(&d);
  rh_stop(&ng);
  char log_path[PATH_MAX];
  rh_nginx_log("ng", log_path, sizeof(log_path));
  rh_log lg;
  rh_log_read(&lg, log_path);
  char *names[RH_MAX_FILES];
  int nn = rh_files(dir, names, RH_MAX_FILES);
  for (int i = 0; i < nn; i++) {
    path_count c = count_path(&lg, names[i]);
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    size_t size = 0;
    free(test_read_file(path, &size));
    if (c.requests != 2 || c.whole != 1 || c.not_modified != 1 || c.bytes != (int64_t)size)
      ASSERT_FAIL_("%s: %d requests (%d whole, %d not modified), %lld bytes of %zu", names[i],
                   c.requests, c.whole, c.not_modified, (long long)c.bytes, size);
  }
  ASSERT_EQ(lg.n, 2 * nn);
  rh_files_free(names, nn);
  rh_log_free(&lg);

  /* With room for one object kept whole (fetch_whole_bytes below two
   * files), objects are dropped and downloaded again as needed: more
   * downloads, the same batches. */
  rh_nginx(&ng, "ng2", dir, nx);
  for (int i = 0; i < nf; i++) free(urls[i]);
  nf = rh_urls(ng.url, dir, urls, RH_MAX_FILES);
  dh_daemon s;
  static const char *const fs[] = {"--workers=2", "--fetch_whole_bytes=100K", NULL};
  dh_init(&s, "small", fs);
  dh_start(&s);
  std_opts(&o, (const char *const *)urls, (size_t)nf, 2);
  dh_run r2 = {0};
  ASSERT_OK(dh_collect(s.socket, &o, 0, &r2));
  dh_expect_same(&ref, &r2);
  dh_stop(&s);
  rh_stop(&ng);
  rh_nginx_log("ng2", log_path, sizeof(log_path));
  rh_log_read(&lg, log_path);
  fprintf(stderr, "%d whole downloads with room for one object\n", lg.n);
  ASSERT_GT(lg.n, nn);
  rh_log_free(&lg);

  /* Objects larger than fetch_whole_bytes behind such a server: the
   * stream fails with a clear error, no body grows past that bound, and
   * the daemon carries on. */
  rh_nginx(&ng, "ng3", dir, nx);
  for (int i = 0; i < nf; i++) free(urls[i]);
  nf = rh_urls(ng.url, dir, urls, RH_MAX_FILES);
  dh_daemon t;
  static const char *const ft[] = {"--workers=2", "--fetch_whole_bytes=8K", NULL};
  dh_init(&t, "tiny", ft);
  dh_start(&t);
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);
  dh_run r3 = {0};
  ASSERT_EQ(dh_collect(t.socket, &o, 0, &r3), LARDER_ELIMIT);
  fprintf(stderr, "objects over fetch_whole_bytes: %s\n", r3.err);
  ASSERT_STR_CONTAINS(r3.err, "fetch_whole_bytes");
  dh_run_free(&r3);
  ASSERT(dh_alive(&t));
  const char *lsrc[1] = {dir};
  std_opts(&o, lsrc, 1, 1);
  dh_run r4 = {0};
  ASSERT_OK(dh_collect(t.socket, &o, 0, &r4));
  dh_run_free(&r4);
  dh_stop(&t);
  rh_stop(&ng);
  for (int i = 0; i < nf; i++) free(urls[i]);
  dh_run_free(&ref);
  dh_run_free(&r);
  dh_run_free(&r2);
  dh_run_free(&p);
  return 0;
}

/*
 * Part sizes at their edges: fetch_part_bytes 0 (no splitting) and 2^63,
 * with chunks not merged (fetch_merge_gap 0, a projection of columns apart
 * from each other), give the local batches.  (Were the count of parts to
 * wrap to 0 for such sizes, the daemon would write past its array of
 * parts: a heap overflow that ASan catches, and a crash.)
 */
TEST_IMPL(remote_part_sizes) {
  int skip = rh_require(1, 0);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  static const char *const cols[] = {"id", "name"};
  dh_daemon ld;
  static const char *const lf[] = {"--workers=2", NULL};
  dh_init(&ld, "local", lf);
  dh_start(&ld);
  const char *src[1] = {dir};
  larder_stream_options_t o;
  std_opts(&o, src, 1, 1);
  o.columns = cols;
  o.num_columns = 2;
  dh_run ref = {0};
  ASSERT_OK(dh_collect(ld.socket, &o, 0, &ref));
  dh_stop(&ld);
  rs_server ng;
  rh_nginx(&ng, "ng", dir, NULL);
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(ng.url, dir, urls, RH_MAX_FILES);
  static const char *const sizes[] = {"--fetch_part_bytes=0",
                                      "--fetch_part_bytes=9223372036854775808"};
  for (int k = 0; k < 2; k++) {
    dh_daemon d;
    const char *const fl[] = {"--workers=2", "--fetch_merge_gap=0", sizes[k], NULL};
    dh_init(&d, k ? "d1" : "d0", fl);
    dh_start(&d);
    larder_stream_options_t ro = o;
    ro.sources = (const char *const *)urls;
    ro.num_sources = (size_t)nf;
    dh_run r = {0};
    if (dh_collect(d.socket, &ro, 0, &r) != 0) {
      dh_print_log(&d);
      ASSERT_FAIL_("%s: the stream failed: %s", sizes[k], r.err);
    }
    dh_expect_same(&ref, &r);
    ASSERT(dh_alive(&d));
    dh_run_free(&r);
    dh_stop(&d);
  }
  rh_stop(&ng);
  for (int i = 0; i < nf; i++) free(urls[i]);
  dh_run_free(&ref);
  return 0;
}

/*
 * TLS: https:// from nginx with the test CA.  Verification is on by
 * default, so without ca_file the open fails with a certificate error that
 * names the URL (not retried: one request per file), and the daemon keeps
 * serving (a local stream works afterwards); with ca_file the batches equal
 * the local ones.
 */
TEST_IMPL(remote_https) {
  int skip = rh_require(1, 0);
  if (skip) return skip;
  if (test_system("command -v openssl >/dev/null 2>&1") != 0) {
    fprintf(stderr, "skip: openssl is not installed (nginx.sh --tls makes its CA with it)\n");
    return TEST_SKIP;
  }
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  dh_run ref = {0};
  local_reference(dir, 1, &ref);
  rs_server ng;
  static const char *const nx[] = {"--tls", NULL};
  rh_nginx(&ng, "ng", dir, nx);
  char ca[PATH_MAX], base[128];
  rh_field(ng.ready, "ca_file", ca, sizeof(ca));
  ASSERT(ca[0] != '\0');
  snprintf(base, sizeof(base), "https://127.0.0.1:%d", ng.port);
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(base, dir, urls, RH_MAX_FILES);
  larder_stream_options_t o;
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);

  dh_daemon d;
  static const char *const fl[] = {"--workers=2", NULL};
  dh_init(&d, "d", fl);
  dh_start(&d);
  dh_run bad = {0};
  ASSERT_NE(dh_collect(d.socket, &o, 0, &bad), 0);
  fprintf(stderr, "without the CA: %s\n", bad.err);
  ASSERT_STR_CONTAINS(bad.err, "https://127.0.0.1:");
  ASSERT_STR_CONTAINS(bad.err, "TLS verification failed");
  ASSERT_STR_CONTAINS(bad.err, "certificate");
  ASSERT(dh_alive(&d));
  const char *lsrc[1] = {dir};
  larder_stream_options_t lo;
  std_opts(&lo, lsrc, 1, 1);
  dh_run after = {0};
  ASSERT_OK(dh_collect(d.socket, &lo, 0, &after));
  dh_expect_same(&ref, &after);
  dh_stop(&d);

  char caflag[PATH_MAX + 16];
  snprintf(caflag, sizeof(caflag), "--ca_file=%s", ca);
  dh_daemon dc;
  const char *const flc[] = {"--workers=2", caflag, NULL};
  dh_init(&dc, "dc", flc);
  dh_start(&dc);
  dh_run good = {0};
  good.check_rows = 1;
  ASSERT_OK(dh_collect(dc.socket, &o, 0, &good));
  dh_expect_same(&ref, &good);
  dh_stop(&dc);
  rh_stop(&ng);

  /* The failed opens were not retried: one request per file for the
   * refused handshakes never reach the access log at all, and the good run
   * read each footer once. */
  char log_path[PATH_MAX];
  rh_nginx_log("ng", log_path, sizeof(log_path));
  rh_log lg;
  rh_log_read(&lg, log_path);
  char range[64];
  int footers = 0;
  for (int i = 0; i < lg.n; i++)
    footers += strncmp(rh_field(lg.lines[i], "range", range, sizeof(range)), "bytes=-", 7) == 0;
  ASSERT_EQ(footers, nf);
  rh_log_free(&lg);
  for (int i = 0; i < nf; i++) free(urls[i]);
  dh_run_free(&ref);
  dh_run_free(&bad);
  dh_run_free(&after);
  dh_run_free(&good);
  return 0;
}

/*
 * A dataset mixing local files and URLs: the first two files local, the
 * last two from nginx (local paths sort before URLs, so the file order is
 * the all-local one): the same batches as the all-local run, and only the
 * remote files are fetched.
 */
TEST_IMPL(remote_mixed) {
  int skip = rh_require(1, 0);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  dh_run ref = {0};
  local_reference(dir, 2, &ref);
  rs_server ng;
  rh_nginx(&ng, "ng", dir, NULL);
  char *names[RH_MAX_FILES];
  int nn = rh_files(dir, names, RH_MAX_FILES);
  ASSERT_EQ(nn, 4);
  char src_buf[4][PATH_MAX];
  const char *src[4];
  for (int i = 0; i < 4; i++) {
    if (i < 2) snprintf(src_buf[i], sizeof(src_buf[i]), "%s/%s", dir, names[i]);
    else snprintf(src_buf[i], sizeof(src_buf[i]), "%s/%s", ng.url, names[i]);
    src[i] = src_buf[i];
  }
  /* Given in another order than they sort: the order is the dataset's. */
  const char *shuffled[4] = {src[3], src[0], src[2], src[1]};
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", NULL};
  dh_init(&d, "d", fl);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, shuffled, 4, 2);
  dh_run r = {0};
  r.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r));
  dh_expect_same(&ref, &r);
  dh_stop(&d);
  rh_stop(&ng);
  char log_path[PATH_MAX];
  rh_nginx_log("ng", log_path, sizeof(log_path));
  rh_log lg;
  rh_log_read(&lg, log_path);
  for (int i = 0; i < 4; i++) {
    path_count c = count_path(&lg, names[i]);
    if (i < 2) ASSERT_EQ(c.requests, 0);
    else ASSERT_GT(c.requests, 0);
  }
  rh_log_free(&lg);
  rh_files_free(names, nn);
  dh_run_free(&ref);
  dh_run_free(&r);
  return 0;
}

/* The ids of file 1 of the standard dataset carry variant 1 once it is
 * replaced. */
static int variant_file1(int64_t id) { return id >= 2500 && id < 5000 ? 1 : 0; }

/* Replaces file 1 of the standard dataset in root by its variant-1 version
 * (same ids, other values), atomically, with another mtime (nginx's ETag
 * is mtime and size). */
static void replace_file1(const char *root) {
  dh_spec v = dh_std_spec;
  v.variant = 1;
  char tmp[PATH_MAX + 32], dst[PATH_MAX + 32];
  snprintf(tmp, sizeof(tmp), "%s/.part-001.tmp", root);
  snprintf(dst, sizeof(dst), "%s/part-001.parquet", root);
  dh_write_file(&v, 1, tmp);
  ASSERT_EQ(test_system("touch -d '2001-02-03 04:05:06' '%s' && mv '%s' '%s'", tmp, tmp, dst), 0);
}

/*
 * One revalidation scenario on its own copy of the dataset: a job warms the
 * cache with epoch 0; a two-epoch job reads part of epoch 0, file 1 is
 * replaced (same name), and it reads on.
 * - revalidate > 0: the check at the start of epoch 1 (at least revalidate
 *   seconds after the open) sees the new ETag: the stream ends with an
 *   error naming the URL and saying it changed, every batch before it is
 *   of the old data, the old version's cache entries are dropped, and
 *   reopening at epoch 1 serves the new data (the batches of a local run
 *   on the new files).
 * - revalidate = 0 (the default: immutable shards): nothing is fetched
 *   after the open and both epochs are the old data.
 */
/* deleted: part-001 is removed instead of replaced. */
static void revalidation_case(const char *name, int no_range, int revalidate, int deleted) {
  char dir[1024], root[PATH_MAX], sub[PATH_MAX];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  snprintf(root, sizeof(root), "%s/%s-root", test_tmpdir(), name);
  rh_copy_dir(dir, root);
  dh_run old_ref = {0};
  local_reference(root, 2, &old_ref);
  rs_server ng;
  snprintf(sub, sizeof(sub), "%s-ng", name);
  static const char *const nx[] = {"--no-range", NULL};
  rh_nginx(&ng, sub, root, no_range ? nx : NULL);
  char log_path[PATH_MAX];
  rh_nginx_log(sub, log_path, sizeof(log_path));
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(ng.url, root, urls, RH_MAX_FILES);
  dh_daemon d;
  char rv[64];
  snprintf(rv, sizeof(rv), "--revalidate=%d", revalidate);
  const char *const fl[] = {"--workers=2", rv, NULL};
  snprintf(sub, sizeof(sub), "%s-d", name);
  dh_init(&d, sub, fl);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);
  dh_run warm = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &warm));
  uint64_t entries = dh_stat(&d, "cache.entries");
  ASSERT_EQ(entries, DH_STD_UNITS * DH_NUM_COLS);

  o.epochs = 2;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  double opened = test_now_ms();
  ASSERT_OK(larder_stream_open(c, &o, &s));
  uint64_t bpe = larder_stream_batches_per_epoch(s);
  dh_run got = {0};
  got.variant_of = variant_file1;
  larder_batch_t *b;
  for (int i = 0; i < 5; i++) {
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    larder_batch_release(b);
  }
  int lines_before = rh_wait_lines(log_path, 0, 0);
  /* The check runs at most every `revalidate` seconds: let that pass. */
  while (test_now_ms() - opened < revalidate * 1000.0 + 200) usleep(20000);
  if (deleted) {
    char gone[PATH_MAX + 32];
    snprintf(gone, sizeof(gone), "%s/part-001.parquet", root);
    ASSERT_OK(unlink(gone));
  } else {
    replace_file1(root);
  }
  int rc = 0;
  uint64_t n = 5;
  for (;;) {
    rc = larder_stream_next(s, 60000 * dh_slow(), &b);
    if (rc) break;
    /* Every batch delivered is the old data, in the old order. */
    ASSERT_LT(n, old_ref.n);
    ASSERT_UINT_EQ(dh_batch_hash(b), old_ref.b[n].hash);
    n++;
    larder_batch_release(b);
  }
  char err[1024];
  snprintf(err, sizeof(err), "%s", larder_client_last_error(c));
  larder_stream_close(s);
  larder_client_close(c);
  if (revalidate == 0) {
    ASSERT_EQ(rc, LARDER_EEOF);
    ASSERT_EQ(n, 2 * bpe);
    /* Not one request after the open's footers. */
    ASSERT_EQ(rh_wait_lines(log_path, 0, 0), lines_before);
  } else {
    fprintf(stderr, "%s: stream ended after %" PRIu64 " batches: %s\n", name, n, err);
    ASSERT_NE(rc, LARDER_EEOF);
    ASSERT_GE(n, bpe); /* epoch 0 came whole, from the cache */
    ASSERT_STR_CONTAINS(err, "/part-001.parquet");
    ASSERT_STR_CONTAINS(err, deleted ? "no longer exists" : "changed");
    /* The old version's entries are gone (20 units of 6 columns). */
    ASSERT_EQ(dh_stat(&d, "cache.entries"), entries - 20 * DH_NUM_COLS);
  }
  if (revalidate != 0 && !deleted) {
    /* Reopened at epoch 1: the new data, as a local run on the new files
     * serves it. */
    dh_run new_ref = {0}, reopened = {0};
    local_reference(root, 2, &new_ref);
    reopened.variant_of = variant_file1;
    reopened.check_rows = 1;
    larder_stream_options_t ro = o;
    ro.start_epoch = 1;
    ASSERT_OK(dh_collect(d.socket, &ro, 0, &reopened));
    ASSERT_EQ(reopened.n, bpe);
    for (size_t i = 0; i < reopened.n; i++) {
      ASSERT_UINT_EQ(reopened.b[i].hash, new_ref.b[bpe + i].hash);
      ASSERT_UINT_EQ(reopened.b[i].epoch, 1);
    }
    dh_run_free(&new_ref);
    dh_run_free(&reopened);
  }
  dh_stop(&d);
  rh_stop(&ng);
  for (int i = 0; i < nf; i++) free(urls[i]);
  dh_run_free(&old_ref);
  dh_run_free(&warm);
  dh_run_free(&got);
}

TEST_IMPL(remote_revalidate) {
  int skip = rh_require(1, 0);
  if (skip) return skip;
  revalidation_case("immutable", 0, 0, 0);
  revalidation_case("range", 0, 1, 0);
  revalidation_case("norange", 1, 1, 0);
  /* An object deleted meanwhile (a 404) has changed too: its cached data is
   * not served on (it was, as a failed check counted as "unchanged"). */
  revalidation_case("deleted", 0, 1, 1);
  return 0;
}
