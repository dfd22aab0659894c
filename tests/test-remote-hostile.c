/*
 * test-remote-hostile.c: remote sources against servers that misbehave in
 * ways a fault of one request does not cover: objects replaced on servers
 * without ETags (or with weak ones), endless bodies, error pages answering
 * ranges with 200, a server that ignores Range and whose object changes,
 * SIGTERM while an open waits for a silent server, S3 listings that loop,
 * literal http URLs (query strings, IPv6 hosts), and odd headers
 * (Retry-After, a 304 nobody asked for, an oversized header line).  Each
 * runs the real daemon against nginx behind faultproxy.mjs.
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "remote-harness.h"

#define ARENA (8u << 20)

static void std_opts(larder_stream_options_t *o, const char *const *src, size_t nsrc,
                     uint64_t epochs) {
  dh_std_opts(o, src, nsrc, 100, 7, epochs, ARENA);
}

/* A local run of the dataset at dir (the reference batches). */
static void local_reference(const char *dir, uint64_t epochs, dh_run *out) {
  const char *src[1] = {dir};
  larder_stream_options_t o;
  std_opts(&o, src, 1, epochs);
  rh_local_reference(&o, out);
}

/* A copy of the standard dataset at root with file 1 uncompressed, so
 * that its variant (replace_file1) has exactly its size. */
static void make_root(const char *dir, const char *root) {
  rh_copy_dir(dir, root);
  dh_spec v = dh_std_spec;
  v.codec = 0;
  char path[PATH_MAX + 32];
  snprintf(path, sizeof(path), "%s/part-001.parquet", root);
  dh_write_file(&v, 1, path);
}

/* Replaces file 1 of a make_root copy by a variant of it (same ids and
 * size, other values: the first variant whose file has the old size) with
 * another mtime, so that nginx's ETag and Last-Modified change and its
 * size does not. */
static void replace_file1(const char *root) {
  dh_spec v = dh_std_spec;
  v.codec = 0;
  char tmp[PATH_MAX + 32], dst[PATH_MAX + 32];
  snprintf(tmp, sizeof(tmp), "%s/.part-001.tmp", root);
  snprintf(dst, sizeof(dst), "%s/part-001.parquet", root);
  struct stat a, b;
  ASSERT_OK(stat(dst, &b));
  for (v.variant = 1; v.variant < 100; v.variant++) {
    dh_write_file(&v, 1, tmp);
    ASSERT_OK(stat(tmp, &a));
    if (a.st_size == b.st_size) break; /* only validators can tell */
  }
  ASSERT_EQ(a.st_size, b.st_size);
  ASSERT_EQ(test_system("touch -d '2001-02-03 04:05:06' '%s' && mv '%s' '%s'", tmp, tmp, dst), 0);
}

/* The standard dataset in dir, its local reference run, nginx serving it
 * behind the fault proxy, and the proxy's URL of each file (returns their
 * number). */
static int proxied_std(char *dir, size_t dirlen, dh_run *ref, rs_server *ng, rs_server *fp,
                       char **urls) {
  ASSERT_EQ(dh_std_dataset(dir, dirlen), DH_STD_ROWS);
  local_reference(dir, 1, ref);
  rh_nginx(ng, "ng", dir, NULL);
  char fpdir[PATH_MAX];
  snprintf(fpdir, sizeof(fpdir), "%s/fp", test_tmpdir());
  ASSERT_OK(rs_start_faultproxy(fp, ng->url, fpdir, NULL));
  return rh_urls(fp->url, dir, urls, RH_MAX_FILES);
}

/* How many times needle occurs in hay. */
static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
  return n;
}

static void free_urls(char **urls, int n) {
  for (int i = 0; i < n; i++) free(urls[i]);
}

/*
 * Versions without strong ETags (issue: mixed data).
 * - Last-Modified only (the proxy drops ETag): part-001 is replaced by an
 *   object of the same size right after the open, before any of its row
 *   groups is fetched (they are delayed).  The stream ends with "changed
 *   since the stream opened" naming part-001, and every batch before is of
 *   the old version: old footer and new pages are never decoded together.
 * - Weak ETags on the ranges (W/"x" where the footer had "x"): the same
 *   version, so the stream reads to its end, equal to the local run.
 * - Neither validator: the daemon warns once per object, however many
 *   streams open it.
 */
TEST_IMPL(remote_hostile_no_etag) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  char dir[1024], root[PATH_MAX];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  snprintf(root, sizeof(root), "%s/lm-root", test_tmpdir());
  make_root(dir, root);
  dh_run ref = {0};
  local_reference(root, 1, &ref);
  rs_server ng, fp;
  rh_nginx(&ng, "ng", root, NULL);
  char fpdir[PATH_MAX];
  snprintf(fpdir, sizeof(fpdir), "%s/fp", test_tmpdir());
  ASSERT_OK(rs_start_faultproxy(&fp, ng.url, fpdir, NULL));
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(fp.url, root, urls, RH_MAX_FILES);
  /* No footers kept: the server below stops sending validators, which a
   * server without them never sent, so no footer would have been kept. */
  static const char *const fl[] = {"--workers=2", "--fetch_retry_base_ms=10",
                                   "--remote_footer_memory=0", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);

  /* Weak ETags on every range (the footers, asked first, keep theirs). */
  char ctl[512];
  snprintf(ctl, sizeof(ctl),
           "{\"clear\":true,\"add\":{\"type\":\"strip_headers\",\"weak_etag\":true,\"skip\":%d,"
           "\"count\":-1}}",
           nf);
  ASSERT_OK(rs_control(&fp, ctl));
  dh_run weak = {0};
  if (dh_collect(d.socket, &o, 0, &weak) != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("weak ETags: the stream failed: %s", weak.err);
  }
  dh_expect_same(&ref, &weak);

  /* Neither validator: one warning per object over two streams. */
  ASSERT_OK(rs_control(&fp,
                       "{\"clear\":true,\"add\":{\"type\":\"strip_headers\","
                       "\"drop\":\"etag,last-modified\",\"count\":-1}}"));
  larder_stream_options_t one = o;
  one.epochs = 1;
  for (int k = 0; k < 2; k++) {
    dh_run r = {0};
    ASSERT_OK(dh_collect(d.socket, &one, 5, &r));
    dh_run_free(&r);
  }
  char *log = dh_read_log(&d);
  ASSERT_EQ(count_of(log, "part-000.parquet has neither an ETag nor a Last-Modified"), 1);
  ASSERT_EQ(count_of(log, "has neither an ETag nor a Last-Modified"), nf);
  free(log);
  dh_stop(&d);

  /* Last-Modified only, object replaced after the open (a fresh daemon:
   * nothing of it in memory or in the cache). */
  dh_daemon d2;
  dh_init(&d2, "d2", fl);
  dh_start(&d2);
  ASSERT_OK(rs_control(&fp,
                       "{\"clear\":true,\"add\":["
                       "{\"type\":\"strip_headers\",\"drop\":\"etag\",\"count\":-1},"
                       "{\"type\":\"latency\",\"ms\":1500,\"path\":\"/part-001.parquet\","
                       "\"skip\":1,\"count\":-1}]}"));
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d2.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  replace_file1(root);
  uint64_t n = 0;
  int rc;
  larder_batch_t *b;
  for (;;) {
    rc = larder_stream_next(s, 60000 * dh_slow(), &b);
    if (rc) break;
    ASSERT_LT(n, ref.n);
    ASSERT_UINT_EQ(dh_batch_hash(b), ref.b[n].hash);
    n++;
    larder_batch_release(b);
  }
  char err[1024];
  snprintf(err, sizeof(err), "%s", larder_client_last_error(c));
  fprintf(stderr, "Last-Modified only: ended after %llu of %zu batches: %s\n",
          (unsigned long long)n, ref.n, err);
  ASSERT_NE(rc, LARDER_EEOF);
  ASSERT_STR_CONTAINS(err, "/part-001.parquet");
  ASSERT_STR_CONTAINS(err, "changed since the stream opened");
  ASSERT_STR_CONTAINS(err, "2001");
  larder_stream_close(s);
  larder_client_close(c);
  dh_stop(&d2);

  /* Last-Modified only, the object changed between epochs, everything
   * cached: the revalidation at the epoch start must see it (it compared
   * size and ETag only). */
  static const char *const flr[] = {"--workers=2", "--fetch_retry_base_ms=10", "--revalidate=1",
                                    NULL};
  dh_daemon d3;
  dh_init(&d3, "d3", flr);
  dh_start(&d3);
  ASSERT_OK(rs_control(&fp,
                       "{\"clear\":true,\"add\":"
                       "{\"type\":\"strip_headers\",\"drop\":\"etag\",\"count\":-1}}"));
  larder_stream_options_t two = o;
  two.epochs = 3;
  ASSERT_OK(larder_client_connect(d3.socket, &c));
  ASSERT_OK(larder_stream_open(c, &two, &s));
  uint64_t bpe = larder_stream_batches_per_epoch(s);
  for (uint64_t k = 0; k < bpe; k++) {
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    larder_batch_release(b);
  }
  char path1[PATH_MAX + 32];
  snprintf(path1, sizeof(path1), "%s/part-001.parquet", root);
  ASSERT_EQ(test_system("touch -d '2002-03-04 05:06:07' '%s'", path1), 0);
  usleep(1200000);
  n = 0;
  while ((rc = larder_stream_next(s, 60000 * dh_slow(), &b)) == 0) {
    n++;
    larder_batch_release(b);
  }
  snprintf(err, sizeof(err), "%s", larder_client_last_error(c));
  fprintf(stderr, "revalidation, Last-Modified only: ended after %llu more batches: %s\n",
          (unsigned long long)n, err);
  ASSERT_NE(rc, LARDER_EEOF);
  ASSERT_LT(n, 2 * bpe);
  ASSERT_STR_CONTAINS(err, "part-001.parquet");
  ASSERT_STR_CONTAINS(err, "changed");
  ASSERT_STR_CONTAINS(err, "2002");
  larder_stream_close(s);
  larder_client_close(c);
  dh_stop(&d3);
  rh_stop(&fp);
  rh_stop(&ng);
  free_urls(urls, nf);
  dh_run_free(&ref);
  dh_run_free(&weak);
  return 0;
}

/*
 * Endless bodies (issue: unbounded buffering): a 200 with a body that
 * never ends answering the footer's range, and a 206 without a length
 * answering it.  Each open fails with an error naming the URL and the cap
 * (fetch_whole_bytes; the range asked for), the daemon's memory stays
 * small, the proxy sent a bounded number of bytes, and once the server is
 * healthy the same sources read right.
 */
TEST_IMPL(remote_hostile_endless_body) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  char dir[1024];
  dh_run ref = {0};
  rs_server ng, fp;
  char *urls[RH_MAX_FILES];
  int nf = proxied_std(dir, sizeof(dir), &ref, &ng, &fp, urls);
  static const char *const fl[] = {"--workers=2", "--fetch_retries=1", "--fetch_retry_base_ms=10",
                                   "--fetch_whole_bytes=4M", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);
  static const char *const rules[] = {
      "{\"clear\":true,\"reset_stats\":true,\"add\":{\"type\":\"endless\",\"status\":200,"
      "\"path\":\"/part-000.parquet\",\"count\":-1}}",
      "{\"clear\":true,\"reset_stats\":true,\"add\":{\"type\":\"endless\",\"status\":206,"
      "\"content_range\":\"bytes 0-99/*\",\"path\":\"/part-000.parquet\",\"count\":-1}}",
  };
  static const char *const want[] = {"larger than fetch_whole_bytes",
                                     "HTTP 206: the body is longer"};
  for (int k = 0; k < 2; k++) {
    ASSERT_OK(rs_control(&fp, rules[k]));
    double t0 = test_now_ms();
    dh_run r = {0};
    int rc = dh_collect(d.socket, &o, 0, &r);
    double ms = test_now_ms() - t0;
    long rss = dh_rss_kb(d.pid);
    char *st = rs_stats(&fp);
    ASSERT_NOT_NULL(st);
    int64_t sent = rs_json_int(st, "bytes_sent", 0);
    free(st);
    fprintf(stderr, "%s: failed in %.0f ms, rss %ld kB, %lld bytes sent: %s\n", k ? "206" : "200",
            ms, rss, (long long)sent, r.err);
    ASSERT_NE(rc, 0);
    ASSERT_STR_CONTAINS(r.err, "/part-000.parquet");
    ASSERT_STR_CONTAINS(r.err, want[k]);
    ASSERT_LT(ms, 30000.0 * dh_slow());
    /* Two attempts of at most 4 MiB each, plus what sockets hold. */
    ASSERT_LT(sent, (int64_t)64 << 20);
    ASSERT_LT(rss, 400 * 1024L * (dh_asan() ? 2 : 1));
    dh_run_free(&r);
  }
  ASSERT_OK(rs_control(&fp, "{\"clear\":true}"));
  dh_run good = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &good));
  dh_expect_same(&ref, &good);
  dh_stop(&d);
  rh_stop(&fp);
  rh_stop(&ng);
  free_urls(urls, nf);
  dh_run_free(&ref);
  dh_run_free(&good);
  return 0;
}

/*
 * A maintenance page (200, 24 bytes) answering row-group ranges (issue: a
 * poisoned whole object).  A few such answers are retried and the stream
 * is right; answers that never stop fail the stream with an error naming
 * the URL and the status; and once the server is healthy the next stream
 * reads the object from it (the page was never kept as the object).
 */
TEST_IMPL(remote_hostile_wrong_whole) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  char dir[1024];
  dh_run ref = {0};
  rs_server ng, fp;
  char *urls[RH_MAX_FILES];
  int nf = proxied_std(dir, sizeof(dir), &ref, &ng, &fp, urls);
  static const char *const fl[] = {"--workers=2", "--fetch_retries=3", "--fetch_retry_base_ms=10",
                                   NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);
  /* skip 1: the footer read; then row-group ranges get the page. */
  ASSERT_OK(rs_control(&fp,
                       "{\"add\":{\"type\":\"status\",\"status\":200,"
                       "\"body\":\"<html>maintenance</html>\",\"path\":\"/part-000.parquet\","
                       "\"skip\":1,\"count\":2}}"));
  dh_run r1 = {0};
  if (dh_collect(d.socket, &o, 0, &r1) != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("two maintenance pages: the stream failed: %s", r1.err);
  }
  dh_expect_same(&ref, &r1);
  char *st = rs_stats(&fp);
  ASSERT_EQ(rs_json_int(st, "faults.status", 0), 2);
  free(st);

  /* A fresh daemon (nothing cached), pages forever. */
  dh_stop(&d);
  dh_daemon d2;
  dh_init(&d2, "d2", fl);
  dh_start(&d2);
  ASSERT_OK(rs_control(&fp,
                       "{\"clear\":true,\"add\":{\"type\":\"status\",\"status\":200,"
                       "\"body\":\"<html>maintenance</html>\",\"path\":\"/part-000.parquet\","
                       "\"skip\":1,\"count\":-1}}"));
  dh_run r2 = {0};
  ASSERT_NE(dh_collect(d2.socket, &o, 0, &r2), 0);
  fprintf(stderr, "pages forever: %s\n", r2.err);
  ASSERT_STR_CONTAINS(r2.err, "/part-000.parquet");
  ASSERT_STR_CONTAINS(r2.err, "HTTP 200 with 24 bytes");
  ASSERT_STR_CONTAINS(r2.err, "gave up after 4 attempts");
  /* Healthy again: read from the server, right. */
  ASSERT_OK(rs_control(&fp, "{\"clear\":true,\"reset_stats\":true}"));
  dh_run r3 = {0};
  if (dh_collect(d2.socket, &o, 0, &r3) != 0) {
    dh_print_log(&d2);
    ASSERT_FAIL_("after the pages: the stream failed: %s", r3.err);
  }
  dh_expect_same(&ref, &r3);
  st = rs_stats(&fp);
  ASSERT_GT(rs_json_int(st, "requests", 0), nf); /* footers, and row groups */
  free(st);
  char *log = dh_read_log(&d2);
  ASSERT(strstr(log, "ignores Range") == NULL);
  free(log);
  dh_stop(&d2);
  rh_stop(&fp);
  rh_stop(&ng);
  free_urls(urls, nf);
  dh_run_free(&ref);
  dh_run_free(&r1);
  dh_run_free(&r2);
  dh_run_free(&r3);
  return 0;
}

/*
 * A server that ignores Range, whose object is replaced between two
 * streams (issue: the object kept whole was never re-checked): the second
 * stream reads the new version, as a local run on the new files does; a
 * third, with nothing changed, is answered 304 for every object and
 * downloads nothing.  Then a server that ignored Range only for the first
 * stream's footers (a CDN on a miss): after the change, the copy of
 * part-001 kept whole is stale, and the second stream reads the new
 * version's ranges from the server, not from it.
 */
TEST_IMPL(remote_hostile_no_range_change) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  char dir[1024], root[PATH_MAX];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  snprintf(root, sizeof(root), "%s/nr-root", test_tmpdir());
  make_root(dir, root);
  dh_run old_ref = {0};
  local_reference(root, 1, &old_ref);
  rs_server ng;
  static const char *const nx[] = {"--no-range", NULL};
  rh_nginx(&ng, "ng", root, nx);
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(ng.url, root, urls, RH_MAX_FILES);
  static const char *const fl[] = {"--workers=2", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);
  dh_run r1 = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r1));
  dh_expect_same(&old_ref, &r1);
  replace_file1(root);
  dh_run new_ref = {0};
  local_reference(root, 1, &new_ref);
  dh_run r2 = {0};
  if (dh_collect(d.socket, &o, 0, &r2) != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("after the change: the stream failed: %s", r2.err);
  }
  dh_expect_same(&new_ref, &r2);
  char log_path[PATH_MAX];
  rh_nginx_log("ng", log_path, sizeof(log_path));
  int before = rh_wait_lines(log_path, 0, 0);
  dh_run r3 = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r3));
  dh_expect_same(&new_ref, &r3);
  ASSERT_GE(rh_wait_lines(log_path, before + nf, 10000), before + nf);
  rh_log lg;
  rh_log_read(&lg, log_path);
  ASSERT_EQ(lg.n, before + nf);
  for (int i = before; i < lg.n; i++) ASSERT_EQ(rh_field_int(lg.lines[i], "status", 0), 304);
  rh_log_free(&lg);
  dh_stop(&d);
  rh_stop(&ng);
  free_urls(urls, nf);
  dh_run_free(&r1);
  dh_run_free(&r2);
  dh_run_free(&r3);

  /* Range ignored only for the footers of the first stream. */
  char root2[PATH_MAX];
  snprintf(root2, sizeof(root2), "%s/nr-root2", test_tmpdir());
  make_root(dir, root2);
  rs_server ng2, fp;
  rh_nginx(&ng2, "ng2", root2, NULL);
  char fpdir[PATH_MAX];
  snprintf(fpdir, sizeof(fpdir), "%s/fp", test_tmpdir());
  ASSERT_OK(rs_start_faultproxy(&fp, ng2.url, fpdir, NULL));
  nf = rh_urls(fp.url, root2, urls, RH_MAX_FILES);
  char ctl[256];
  snprintf(ctl, sizeof(ctl), "{\"add\":{\"type\":\"ignore_range\",\"count\":%d}}", nf);
  ASSERT_OK(rs_control(&fp, ctl));
  dh_daemon d2;
  dh_init(&d2, "d2", fl);
  dh_start(&d2);
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);
  dh_run s1 = {0}, s2 = {0};
  ASSERT_OK(dh_collect(d2.socket, &o, 0, &s1));
  dh_expect_same(&old_ref, &s1);
  replace_file1(root2);
  if (dh_collect(d2.socket, &o, 0, &s2) != 0) {
    dh_print_log(&d2);
    ASSERT_FAIL_("after the change (Range ignored at first): the stream failed: %s", s2.err);
  }
  dh_expect_same(&new_ref, &s2);
  dh_stop(&d2);
  rh_stop(&fp);
  rh_stop(&ng2);
  free_urls(urls, nf);
  dh_run_free(&s1);
  dh_run_free(&s2);
  dh_run_free(&old_ref);
  dh_run_free(&new_ref);
  return 0;
}

typedef struct opener {
  const char *socket;
  larder_stream_options_t o;
  int rc;
  char err[1024];
} opener_t;

static void *open_main(void *p) {
  opener_t *op = p;
  larder_client_t *c;
  op->rc = larder_client_connect(op->socket, &c);
  if (op->rc) return NULL;
  larder_stream_t *s = NULL;
  op->rc = larder_stream_open(c, &op->o, &s);
  snprintf(op->err, sizeof(op->err), "%s", op->rc ? larder_client_last_error(c) : "");
  if (s) larder_stream_close(s);
  larder_client_close(c);
  return NULL;
}

/*
 * A server that answers the footers' ranges but sends the whole object for
 * the row groups', objects larger than fetch_whole_bytes: the stream fails
 * with LARDER_ELIMIT saying so, and the daemon carries on.  (Were the
 * object's size alone to bound such a body, every range of a row group
 * would bring a whole shard into memory at once.)  With room for the objects,
 * the same server gives the local batches.
 */
TEST_IMPL(remote_hostile_no_range_large) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  dh_run ref = {0};
  local_reference(dir, 1, &ref);
  for (int room = 0; room < 2; room++) {
    rs_server ng, fp;
    rh_nginx(&ng, room ? "ng1" : "ng0", dir, NULL);
    char fpdir[PATH_MAX];
    snprintf(fpdir, sizeof(fpdir), "%s/fp%d", test_tmpdir(), room);
    ASSERT_OK(rs_start_faultproxy(&fp, ng.url, fpdir, NULL));
    char *urls[RH_MAX_FILES];
    int nf = rh_urls(fp.url, dir, urls, RH_MAX_FILES);
    /* The footers (one suffix range per file, first) are answered. */
    char ctl[256];
    snprintf(ctl, sizeof(ctl), "{\"add\":{\"type\":\"ignore_range\",\"skip\":%d,\"count\":-1}}",
             nf);
    ASSERT_OK(rs_control(&fp, ctl));
    const char *const fl[] = {"--workers=2",
                              room ? "--fetch_whole_bytes=64M" : "--fetch_whole_bytes=8K", NULL};
    dh_daemon d;
    dh_init(&d, room ? "d1" : "d0", fl);
    dh_start(&d);
    larder_stream_options_t o;
    std_opts(&o, (const char *const *)urls, (size_t)nf, 1);
    dh_run r = {0};
    int rc = dh_collect(d.socket, &o, 0, &r);
    fprintf(stderr, "fetch_whole_bytes %s: %s %s\n", room ? "64M" : "8K", larder_err_name(rc),
            r.err);
    if (room) {
      ASSERT_OK(rc);
      dh_expect_same(&ref, &r);
    } else {
      ASSERT_EQ(rc, LARDER_ELIMIT);
      ASSERT_STR_CONTAINS(r.err, "fetch_whole_bytes");
      ASSERT_STR_CONTAINS(r.err, "ignores Range");
    }
    dh_run_free(&r);
    ASSERT(dh_alive(&d));
    dh_stop(&d);
    rh_stop(&fp);
    rh_stop(&ng);
    free_urls(urls, nf);
  }
  dh_run_free(&ref);
  return 0;
}

/*
 * SIGTERM while a stream open waits for footers from a server that never
 * answers (issue: fetches outlived shutdown): the daemon exits cleanly
 * within seconds, not after every attempt's low-speed time, and the open
 * fails.
 */
TEST_IMPL(remote_hostile_shutdown) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  rs_server ng, fp;
  rh_nginx(&ng, "ng", dir, NULL);
  char fpdir[PATH_MAX];
  snprintf(fpdir, sizeof(fpdir), "%s/fp", test_tmpdir());
  ASSERT_OK(rs_start_faultproxy(&fp, ng.url, fpdir, NULL));
  ASSERT_OK(rs_control(&fp, "{\"add\":{\"type\":\"stall\",\"seconds\":600,\"count\":-1}}"));
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(fp.url, dir, urls, RH_MAX_FILES);
  static const char *const fl[] = {"--workers=2", "--fetch_low_speed_time=30", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  opener_t op = {.socket = d.socket};
  std_opts(&op.o, (const char *const *)urls, (size_t)nf, 1);
  pthread_t th;
  ASSERT_OK(pthread_create(&th, NULL, open_main, &op));
  double deadline = test_now_ms() + 30000.0 * dh_slow();
  for (;;) {
    char *st = rs_stats(&fp);
    ASSERT_NOT_NULL(st);
    int64_t stalls = rs_json_int(st, "faults.stall", 0);
    free(st);
    if (stalls >= nf) break;
    ASSERT(test_now_ms() < deadline);
    usleep(20000);
  }
  double t0 = test_now_ms();
  int status = dh_stop_status(&d, 20000 * dh_slow());
  double ms = test_now_ms() - t0;
  fprintf(stderr, "stopped in %.0f ms (status 0x%x)\n", ms, status);
  if (status == -1) {
    dh_print_log(&d);
    ASSERT_FAIL_("%s", "larderd did not exit within 20 s of SIGTERM with an open waiting");
  }
  ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  dh_check_log(&d);
  ASSERT_LT(ms, 5000.0 * dh_slow());
  pthread_join(th, NULL);
  fprintf(stderr, "the open: %d %s\n", op.rc, op.err);
  ASSERT_EQ(op.rc, LARDER_ESHUTDOWN);
  rh_stop(&fp);
  rh_stop(&ng);
  free_urls(urls, nf);
  return 0;
}

/*
 * An S3 endpoint whose ListObjectsV2 always says IsTruncated with the same
 * continuation token (issue: listing loop): the open fails at once, after
 * two pages, saying the listing does not progress.
 */
TEST_IMPL(remote_hostile_listing_loop) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  rs_server ng, fp;
  rh_nginx(&ng, "ng", dir, NULL);
  char fpdir[PATH_MAX];
  snprintf(fpdir, sizeof(fpdir), "%s/fp", test_tmpdir());
  ASSERT_OK(rs_start_faultproxy(&fp, ng.url, fpdir, NULL));
  ASSERT_OK(rs_control(
      &fp,
      "{\"add\":{\"type\":\"status\",\"status\":200,\"regex\":\"list-type=2\",\"count\":-1,"
      "\"headers\":{\"content-type\":\"application/xml\"},\"body\":\"<?xml version=\\\"1.0\\\"?>"
      "<ListBucketResult><Name>data</Name><Prefix></Prefix><KeyCount>1</KeyCount>"
      "<MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>"
      "<NextContinuationToken>SAME</NextContinuationToken><Contents><Key>a.parquet</Key>"
      "<Size>100</Size><ETag>&quot;x&quot;</ETag></Contents></ListBucketResult>\"}}"));
  char ep[160];
  snprintf(ep, sizeof(ep), "--s3_endpoint=%s", fp.url);
  const char *const fl[] = {"--workers=2",
                            ep,
                            "--s3_path_style=true",
                            "--s3_access_key=AKIDEXAMPLE",
                            "--s3_secret_key=SECRETEXAMPLE",
                            NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  const char *src[1] = {"s3://data/"};
  larder_stream_options_t o;
  std_opts(&o, src, 1, 1);
  double t0 = test_now_ms();
  dh_run r = {0};
  ASSERT_NE(dh_collect(d.socket, &o, 0, &r), 0);
  fprintf(stderr, "%.0f ms: %s\n", test_now_ms() - t0, r.err);
  ASSERT_STR_CONTAINS(r.err, "s3://data/");
  ASSERT_STR_CONTAINS(r.err, "the listing does not progress");
  char *st = rs_stats(&fp);
  ASSERT_LE(rs_json_int(st, "requests", 0), 3);
  free(st);
  dh_check_log(&d);
  dh_stop(&d);
  rh_stop(&fp);
  rh_stop(&ng);
  return 0;
}

/*
 * http(s) URLs are literal (issue: '?' and '[' taken for wildcards): a
 * presigned-style URL with a query string (and a '[' in it) reads right,
 * the query reaches the server, and never the daemon's log; an IPv6
 * literal host is tried (and fails to connect, naming the URL), not
 * refused as a wildcard.
 */
TEST_IMPL(remote_hostile_query_url) {
  int skip = rh_require(1, 0);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  dh_run ref = {0};
  local_reference(dir, 1, &ref);
  rs_server ng;
  rh_nginx(&ng, "ng", dir, NULL);
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(ng.url, dir, urls, RH_MAX_FILES);
  for (int i = 0; i < nf; i++) {
    char *u = malloc(strlen(urls[i]) + 128);
    ASSERT_NOT_NULL(u);
    sprintf(u, "%s?X-Amz-Signature=SECRETSIG%d&X-Amz-Meta=%%5Bx%%5D&a[1]=b", urls[i], i);
    free(urls[i]);
    urls[i] = u;
  }
  static const char *const fl[] = {"--workers=2", "--fetch_retries=0", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_flag(&d, "--log_level=debug");
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);
  dh_run r = {0};
  if (dh_collect(d.socket, &o, 0, &r) != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("query URLs: the stream failed: %s", r.err);
  }
  dh_expect_same(&ref, &r);
  /* A source that does not exist, to get an error message with the URL. */
  const char *bad[1] = {"http://127.0.0.1:1/x.parquet?sig=SECRETSIG9"};
  larder_stream_options_t bo;
  std_opts(&bo, bad, 1, 1);
  dh_run br = {0};
  ASSERT_NE(dh_collect(d.socket, &bo, 0, &br), 0);
  ASSERT_STR_CONTAINS(br.err, "http://127.0.0.1:1/x.parquet?...");
  ASSERT(strstr(br.err, "SECRETSIG") == NULL);
  const char *v6[1] = {"http://[::1]:1/x.parquet"};
  larder_stream_options_t vo;
  std_opts(&vo, v6, 1, 1);
  dh_run vr = {0};
  ASSERT_NE(dh_collect(d.socket, &vo, 0, &vr), 0);
  fprintf(stderr, "IPv6: %s\n", vr.err);
  ASSERT_STR_CONTAINS(vr.err, "http://[::1]:1/x.parquet");
  ASSERT(strstr(vr.err, "wildcard") == NULL);
  char *log = dh_read_log(&d);
  ASSERT(strstr(log, "SECRETSIG") == NULL);
  free(log);
  dh_stop(&d);
  rh_stop(&ng);
  char log_path[PATH_MAX];
  rh_nginx_log("ng", log_path, sizeof(log_path));
  ASSERT(rh_file_contains(log_path, "X-Amz-Signature=SECRETSIG0"));
  free_urls(urls, nf);
  dh_run_free(&ref);
  dh_run_free(&r);
  dh_run_free(&br);
  dh_run_free(&vr);
  return 0;
}

/*
 * Odd headers and statuses: a 503 with Retry-After: 2 is retried after
 * about two seconds (not the 10 ms backoff), then the stream is right; a
 * 304 nobody asked for, and a header line over the limit, fail with
 * messages that say so, naming the URL.
 */
TEST_IMPL(remote_hostile_headers) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  char dir[1024];
  dh_run ref = {0};
  rs_server ng, fp;
  char *urls[RH_MAX_FILES];
  int nf = proxied_std(dir, sizeof(dir), &ref, &ng, &fp, urls);
  /* No footers kept: every footer read is unconditional, so that the
   * proxy's 304 below answers a request that did not ask for one (a kept
   * footer is revalidated, and a 304 to that is its due answer:
   * remote_footers_once). */
  static const char *const fl[] = {"--workers=2", "--fetch_retries=2", "--fetch_retry_base_ms=10",
                                   "--remote_footer_memory=0", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);

  ASSERT_OK(rs_control(&fp,
                       "{\"add\":{\"type\":\"status\",\"status\":503,\"retry_after\":2,"
                       "\"path\":\"/part-000.parquet\"}}"));
  double t0 = test_now_ms();
  dh_run r = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r));
  double ms = test_now_ms() - t0;
  fprintf(stderr, "Retry-After: 2: the stream took %.0f ms\n", ms);
  ASSERT_GE(ms, 1900.0);
  dh_expect_same(&ref, &r);

  ASSERT_OK(rs_control(&fp,
                       "{\"clear\":true,\"add\":{\"type\":\"status\",\"status\":304,"
                       "\"path\":\"/part-001.parquet\",\"count\":-1}}"));
  dh_run r304 = {0};
  ASSERT_NE(dh_collect(d.socket, &o, 0, &r304), 0);
  fprintf(stderr, "304: %s\n", r304.err);
  ASSERT_STR_CONTAINS(r304.err, "/part-001.parquet: HTTP 304 Not Modified");
  ASSERT(strstr(r304.err, "redirect") == NULL);

  size_t big = 20000;
  char *ctl = malloc(big + 256);
  ASSERT_NOT_NULL(ctl);
  int k = sprintf(ctl,
                  "{\"clear\":true,\"add\":{\"type\":\"status\",\"status\":503,"
                  "\"path\":\"/part-002.parquet\",\"count\":-1,\"headers\":{\"x-big\":\"");
  memset(ctl + k, 'a', big);
  sprintf(ctl + k + big, "\"}}}");
  ASSERT_OK(rs_control(&fp, ctl));
  free(ctl);
  dh_run rh = {0};
  ASSERT_NE(dh_collect(d.socket, &o, 0, &rh), 0);
  fprintf(stderr, "big header: %s\n", rh.err);
  ASSERT_STR_CONTAINS(rh.err, "/part-002.parquet");
  ASSERT_STR_CONTAINS(rh.err, "header line is longer than");
  ASSERT_STR_CONTAINS(rh.err, "gave up after 3 attempts");
  dh_check_log(&d);
  dh_stop(&d);
  rh_stop(&fp);
  rh_stop(&ng);
  free_urls(urls, nf);
  dh_run_free(&ref);
  dh_run_free(&r);
  dh_run_free(&r304);
  dh_run_free(&rh);
  return 0;
}

/*
 * S3 keys of the maximum length, 1024 bytes (issue: keys cut to 1023):
 * a prefix listing finds them and the stream reads them right.
 */
TEST_IMPL(remote_hostile_long_key) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  dh_run ref = {0};
  local_reference(dir, 1, &ref);
  rs_server s3;
  rh_s3(&s3, "s3", NULL);
  /* Four path components of 200 bytes and one of 203 (each under the
   * file system's 255, as s3rver keeps keys as files), then
   * "part-00N.parquet": 1024 bytes in all. */
  char prefix[1100];
  size_t k = 0;
  for (int c = 0; c < 5; c++) {
    size_t n = c < 4 ? 200 : 203;
    memset(prefix + k, 'a' + c, n);
    k += n;
    prefix[k++] = '/';
  }
  prefix[k] = '\0';
  ASSERT_EQ(k + strlen("part-000.parquet"), 1024);
  ASSERT_EQ(rh_s3_put(&s3, "data", prefix, dir), 4);
  char ep[160];
  snprintf(ep, sizeof(ep), "--s3_endpoint=%s", s3.url);
  const char *const fl[] = {"--workers=2",
                            ep,
                            "--s3_path_style=true",
                            "--s3_access_key=larder-test-key",
                            "--s3_secret_key=larder-test-secret",
                            NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  char src0[1200];
  snprintf(src0, sizeof(src0), "s3://data/%s", prefix);
  const char *src[1] = {src0};
  larder_stream_options_t o;
  std_opts(&o, src, 1, 1);
  dh_run r = {0};
  if (dh_collect(d.socket, &o, 0, &r) != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("1024-byte keys: the stream failed: %s", r.err);
  }
  dh_expect_same(&ref, &r);
  dh_stop(&d);
  rh_stop(&s3);
  dh_run_free(&ref);
  dh_run_free(&r);
  return 0;
}

/*
 * A listing is read as XML, not searched as text: keys written with
 * character references or in CDATA are the keys they stand for, elements
 * the reader does not know (an Owner inside Contents) change nothing, and
 * a page that is not well-formed XML fails the open saying so.
 */
TEST_IMPL(remote_s3_listing_xml) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  char dir[1024];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  /* The bucket "data" as nginx serves it, path style. */
  char www[PATH_MAX];
  snprintf(www, sizeof(www), "%s/www", test_tmpdir());
  ASSERT_EQ(test_system("mkdir -p '%s/data' && cp '%s'/*.parquet '%s/data/'", www, dir, www), 0);
  rs_server ng, fp;
  rh_nginx(&ng, "ng", www, NULL);
  char fpdir[PATH_MAX];
  snprintf(fpdir, sizeof(fpdir), "%s/fp", test_tmpdir());
  ASSERT_OK(rs_start_faultproxy(&fp, ng.url, fpdir, NULL));
  ASSERT_OK(rs_control(
      &fp,
      "{\"add\":{\"type\":\"status\",\"status\":200,\"regex\":\"list-type=2\",\"count\":-1,"
      "\"headers\":{\"content-type\":\"application/xml\"},\"body\":\"<?xml version=\\\"1.0\\\"?>"
      "<ListBucketResult><Name>data</Name><IsTruncated>false</IsTruncated>"
      "<Contents><Key>part-00&#48;.parquet</Key><Size>0</Size><ETag>&quot;a&quot;</ETag>"
      "<Owner><ID>x</ID><Key>not-this.parquet</Key></Owner></Contents>"
      "<Contents><Key><![CDATA[part-001.parquet]]></Key><Size>0</Size></Contents>"
      "</ListBucketResult>\"}}"));
  char ep[160];
  snprintf(ep, sizeof(ep), "--s3_endpoint=%s", fp.url);
  const char *const fl[] = {"--workers=2",
                            ep,
                            "--s3_path_style=true",
                            "--s3_access_key=AKIDEXAMPLE",
                            "--s3_secret_key=SECRETEXAMPLE",
                            NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  const char *src[1] = {"s3://data/"};
  larder_stream_options_t o;
  std_opts(&o, src, 1, 1);
  dh_run r = {0};
  if (dh_collect(d.socket, &o, 0, &r) != 0) ASSERT_FAIL_("the listing: %s", r.err);
  ASSERT_EQ(r.num_samples, 5000); /* part-000 and part-001, 2,500 rows each */
  dh_run_free(&r);
  ASSERT_OK(rs_control(
      &fp,
      "{\"clear\":true,\"add\":{\"type\":\"status\",\"status\":200,\"regex\":\"list-type=2\","
      "\"count\":-1,\"headers\":{\"content-type\":\"application/xml\"},"
      "\"body\":\"<ListBucketResult><Contents><Key>a.parquet</Contents>\"}}"));
  dh_run bad = {0};
  ASSERT_NE(dh_collect(d.socket, &o, 0, &bad), 0);
  ASSERT_STR_CONTAINS(bad.err, "not well-formed XML");
  dh_run_free(&bad);
  dh_stop(&d);
  rh_stop(&fp);
  rh_stop(&ng);
  return 0;
}
