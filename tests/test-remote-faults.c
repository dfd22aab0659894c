/*
 * test-remote-faults.c: remote reads through faultproxy.mjs (in front of
 * nginx) and s3front.mjs's own faults: transient faults (503, 429, S3
 * SlowDown, connections cut mid-body or dropped, stalls, latency, short
 * bodies, Range ignored) are retried and the batches stay byte-identical
 * to a fault-free run; answers with another range than asked are never
 * decoded; permanent faults (always 503, a dead server, a stall that never
 * ends) end the stream in bounded time with an error naming the URL, the
 * status and the cause, while a healthy stream beside it completes.
 */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "remote-harness.h"

#define ARENA (8u << 20)

static void std_opts(larder_stream_options_t *o, const char *const *src, size_t nsrc,
                     uint64_t epochs) {
  dh_std_opts(o, src, nsrc, 100, 5, epochs, ARENA);
}

static void local_reference(uint64_t epochs, dh_run *out) {
  const char *src[1] = {dh_std_dir()};
  larder_stream_options_t o;
  std_opts(&o, src, 1, epochs);
  rh_local_reference(&o, out);
}

/* Daemon settings for fault runs: quick retries, and a stall detected
 * after one second under 1000 bytes/s. */
static const char *const fault_flags[] = {"--workers=2",
                                          "--fetch_retry_base_ms=10",
                                          "--fetch_retries=6",
                                          "--fetch_low_speed_time=1",
                                          "--fetch_low_speed_bytes=1000",
                                          "--fetch_connect_timeout=2",
                                          NULL};

typedef struct fault_case {
  const char *name;
  const char *rules; /* JSON array of fault rules for the proxy */
  const char *type;  /* the faults.<type> counter that must show them */
  int applied;       /* how many times they must have been applied */
} fault_case;

/*
 * Each transient fault, on a footer read (the first request) and on row
 * group reads (skip 4: after the four footers), for a fresh daemon (cold
 * cache) reading two epochs through the proxy: the batches equal the local
 * run's, the proxy applied the faults, and the daemon retried.
 */
TEST_IMPL(remote_faults_transient) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  dh_run ref = {0};
  local_reference(2, &ref);
  rs_server ng, fp;
  rh_nginx(&ng, "ng", dh_std_dir(), NULL);
  char fpdir[PATH_MAX];
  snprintf(fpdir, sizeof(fpdir), "%s/fp", test_tmpdir());
  ASSERT_OK(rs_start_faultproxy(&fp, ng.url, fpdir, NULL));
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(fp.url, dh_std_dir(), urls, RH_MAX_FILES);
  static const fault_case cases[] = {
      {"503",
       "[{\"type\":\"status\",\"status\":503,\"count\":2},"
       "{\"type\":\"status\",\"status\":503,\"count\":3,\"skip\":4}]",
       "status", 5},
      {"429",
       "[{\"type\":\"status\",\"status\":429,\"retry_after\":0,\"count\":1},"
       "{\"type\":\"status\",\"status\":429,\"count\":2,\"skip\":4}]",
       "status", 3},
      {"500", "[{\"type\":\"status\",\"status\":500,\"count\":2,\"skip\":5}]", "status", 2},
      {"cut-rst",
       "[{\"type\":\"cut\",\"after_bytes\":1000,\"mode\":\"rst\",\"count\":1},"
       "{\"type\":\"cut\",\"after_bytes\":3000,\"mode\":\"rst\",\"count\":2,\"skip\":4}]",
       "cut", 3},
      {"cut-fin",
       "[{\"type\":\"cut\",\"after_bytes\":500,\"mode\":\"fin\",\"count\":1},"
       "{\"type\":\"cut\",\"after_bytes\":2000,\"mode\":\"fin\",\"count\":2,\"skip\":4}]",
       "cut", 3},
      {"drop",
       "[{\"type\":\"drop\",\"mode\":\"rst\",\"count\":1},"
       "{\"type\":\"drop\",\"mode\":\"fin\",\"count\":2,\"skip\":4}]",
       "drop", 3},
      {"short",
       "[{\"type\":\"short\",\"missing\":100,\"count\":1},"
       "{\"type\":\"short\",\"count\":2,\"skip\":4}]",
       "short", 3},
      {"stall",
       "[{\"type\":\"stall\",\"seconds\":4,\"count\":1,\"skip\":4},"
       "{\"type\":\"stall\",\"seconds\":4,\"after_bytes\":2000,\"count\":1,\"skip\":4}]",
       "stall", 2},
      {"ignore-range", "[{\"type\":\"ignore_range\",\"count\":1,\"skip\":5}]", "ignore_range", 1},
      {"wrong-content-range",
       "[{\"type\":\"wrong_content_range\",\"shift\":1,\"count\":1},"
       "{\"type\":\"wrong_content_range\",\"shift\":-7,\"count\":2,\"skip\":4}]",
       "wrong_content_range", 3},
      {"latency", "[{\"type\":\"latency\",\"ms\":40}]", "latency", 0},
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    const fault_case *fc = &cases[k];
    char ctl[1024];
    ASSERT_OK(rs_control(&fp, "{\"clear\":true,\"reset_stats\":true}"));
    snprintf(ctl, sizeof(ctl), "{\"add\":%s}", fc->rules);
    ASSERT_OK(rs_control(&fp, ctl));
    dh_daemon d;
    dh_init(&d, fc->name, fault_flags);
    dh_start(&d);
    larder_stream_options_t o;
    std_opts(&o, (const char *const *)urls, (size_t)nf, 2);
    dh_run r = {0};
    double t0 = test_now_ms();
    if (dh_collect(d.socket, &o, 0, &r) != 0) {
      dh_print_log(&d);
      ASSERT_FAIL_("%s: the stream failed: %s", fc->name, r.err);
    }
    dh_expect_same(&ref, &r);
    char *st = rs_stats(&fp);
    ASSERT_NOT_NULL(st);
    char key[64];
    snprintf(key, sizeof(key), "faults.%s", fc->type);
    int64_t applied = rs_json_int(st, key, 0);
    uint64_t retries = dh_stat(&d, "fetch_retries");
    fprintf(stderr,
            "%-20s %5.0f ms, %" PRId64 " faults, %" PRIu64 " retries, %" PRId64 " requests\n",
            fc->name, test_now_ms() - t0, applied, retries, rs_json_int(st, "requests", 0));
    free(st);
    if (fc->applied > 0) {
      ASSERT_EQ(applied, fc->applied);
      /* Every fault but an ignored Range (the whole object is fine as it
       * is) costs a retry; libcurl itself retries a request that a reused
       * connection dropped without an answer, so drops count at least
       * once. */
      if (strcmp(fc->type, "drop") == 0) ASSERT_GE(retries, 1);
      else if (strcmp(fc->type, "ignore_range") != 0) ASSERT_GE(retries, (uint64_t)fc->applied);
    }
    ASSERT_EQ(dh_stat(&d, "fetch_errors"), 0);
    dh_stop(&d);
    dh_run_free(&r);
  }
  rh_stop(&fp);
  rh_stop(&ng);
  for (int i = 0; i < nf; i++) free(urls[i]);
  dh_run_free(&ref);
  return 0;
}

/*
 * S3 throttling and errors from the store itself (s3front's faults, S3 XML
 * bodies): 503 SlowDown, 429 SlowDown and 500 InternalError on the listing
 * and on reads are retried, and the batches are right.
 */
TEST_IMPL(remote_faults_s3_slowdown) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  dh_run ref = {0};
  local_reference(1, &ref);
  rs_server s3;
  rh_s3(&s3, "s3", NULL);
  ASSERT_EQ(rh_s3_put(&s3, "data", "std/", dh_std_dir()), 4);
  ASSERT_OK(rs_control(&s3,
                       "{\"reset_stats\":true,\"add\":["
                       "{\"type\":\"slowdown\",\"count\":2},"
                       "{\"type\":\"status\",\"status\":429,\"count\":1,\"skip\":1},"
                       "{\"type\":\"status\",\"status\":500,\"count\":2,\"skip\":4}]}"));
  dh_daemon d;
  dh_init(&d, "d", fault_flags);
  char ep[160];
  snprintf(ep, sizeof(ep), "--s3_endpoint=%s", s3.url);
  dh_flag(&d, ep);
  dh_flag(&d, "--s3_path_style=true");
  dh_flag(&d, "--s3_access_key=larder-test-key");
  dh_flag(&d, "--s3_secret_key=larder-test-secret");
  dh_start(&d);
  const char *src[1] = {"s3://data/std/"};
  larder_stream_options_t o;
  std_opts(&o, src, 1, 1);
  dh_run r = {0};
  if (dh_collect(d.socket, &o, 0, &r) != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("the stream failed: %s", r.err);
  }
  dh_expect_same(&ref, &r);
  char *st = rs_stats(&s3);
  ASSERT_NOT_NULL(st);
  ASSERT_EQ(rs_json_int(st, "by_status.503", 0), 2);
  ASSERT_EQ(rs_json_int(st, "by_status.429", 0), 1);
  ASSERT_EQ(rs_json_int(st, "by_status.500", 0), 2);
  free(st);
  ASSERT_GE(dh_stat(&d, "fetch_retries"), 5);
  dh_stop(&d);
  rh_stop(&s3);
  dh_run_free(&r);
  dh_run_free(&ref);
  return 0;
}

/*
 * Answers with other bytes than asked for.
 * - wrong_content_range, always, for one file's row-group reads: the
 *   answer's Content-Range names another range than the request; the
 *   fetcher checks it on every ranged answer, so nothing is decoded and,
 *   once the retries are spent, the stream ends with an error that says
 *   which bytes were asked and what came.
 * - wrong_bytes (the bytes of another range under the Content-Range that
 *   was asked), on row-group reads and on a footer read (a true suffix:
 *   footer_guess 4K of a 57K file).  A server that lies in its headers and
 *   its body alike cannot be caught from the answer alone; here the shifted
 *   bytes are not the chunks the footer describes (the footer's magic, or
 *   the page headers, do not parse), so the daemon refuses them.
 * In every case each batch that does arrive equals the fault-free one.
 */
TEST_IMPL(remote_faults_wrong_bytes) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  dh_run ref = {0};
  local_reference(1, &ref);
  rs_server ng, fp;
  rh_nginx(&ng, "ng", dh_std_dir(), NULL);
  char fpdir[PATH_MAX];
  snprintf(fpdir, sizeof(fpdir), "%s/fp", test_tmpdir());
  ASSERT_OK(rs_start_faultproxy(&fp, ng.url, fpdir, NULL));
  /* The URLs carry a user and password (nginx ignores them), which no
   * error may show. */
  char *urls[RH_MAX_FILES], base[128];
  snprintf(base, sizeof(base), "http://larder:pw-SECRET-9@127.0.0.1:%d", fp.port);
  int nf = rh_urls(base, dh_std_dir(), urls, RH_MAX_FILES);
  static const struct {
    const char *rule, *type, *expect[2];
  } cases[] = {
      {"{\"type\":\"wrong_content_range\",\"shift\":16,\"path\":\"/part-001.parquet\","
       "\"skip\":1,\"count\":-1}",
       "wrong_content_range",
       {"/part-001.parquet: asked for bytes ", ", the server answered bytes "}},
      {"{\"type\":\"wrong_bytes\",\"path\":\"/part-001.parquet\",\"skip\":1,\"count\":-1}",
       "wrong_bytes",
       {"/part-001.parquet", ""}},
      {"{\"type\":\"wrong_bytes\",\"path\":\"/part-002.parquet\",\"count\":1}",
       "wrong_bytes",
       {"/part-002.parquet", ""}},
  };
  static const char *const flags[] = {"--workers=2", "--fetch_retry_base_ms=10",
                                      "--fetch_retries=2", "--footer_guess=4K", NULL};
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    char ctl[1024], name[32];
    snprintf(ctl, sizeof(ctl), "{\"clear\":true,\"reset_stats\":true,\"add\":%s}", cases[k].rule);
    ASSERT_OK(rs_control(&fp, ctl));
    snprintf(name, sizeof(name), "d%zu", k);
    dh_daemon d;
    dh_init(&d, name, flags);
    dh_start(&d);
    larder_client_t *c;
    ASSERT_OK(larder_client_connect(d.socket, &c));
    larder_stream_options_t o;
    std_opts(&o, (const char *const *)urls, (size_t)nf, 1);
    larder_stream_t *s;
    int rc = larder_stream_open(c, &o, &s);
    size_t n = 0;
    if (rc == 0) {
      larder_batch_t *b;
      while ((rc = larder_stream_next(s, 60000 * dh_slow(), &b)) == 0) {
        ASSERT_LT(n, ref.n);
        if (dh_batch_hash(b) != ref.b[n].hash)
          ASSERT_FAIL_("case %zu: batch %zu holds wrong data", k, n);
        n++;
        larder_batch_release(b);
      }
      larder_stream_close(s);
    }
    fprintf(stderr, "case %zu: %zu batches, then %s: %s\n", k, n, larder_strerror(rc),
            larder_client_last_error(c));
    ASSERT_NE(rc, LARDER_EEOF);
    for (int j = 0; j < 2; j++)
      ASSERT_STR_CONTAINS(larder_client_last_error(c), cases[k].expect[j]);
    ASSERT_NULL(strstr(larder_client_last_error(c), "pw-SECRET-9"));
    char *log = dh_read_log(&d);
    if (strstr(log, "pw-SECRET-9")) {
      dh_print_log(&d);
      ASSERT_FAIL_("case %zu: the log shows the URL's password", k);
    }
    free(log);
    larder_client_close(c);
    char *st = rs_stats(&fp);
    char key[64];
    snprintf(key, sizeof(key), "faults.%s", cases[k].type);
    ASSERT_GE(rs_json_int(st, key, 0), 1);
    free(st);
    dh_stop(&d);
  }
  rh_stop(&fp);
  rh_stop(&ng);
  for (int i = 0; i < nf; i++) free(urls[i]);
  dh_run_free(&ref);
  return 0;
}

typedef struct healthy_arg {
  const char *socket;
  larder_stream_options_t o;
  dh_run run;
} healthy_arg;

static void *healthy_main(void *p) {
  healthy_arg *h = p;
  dh_collect(h->socket, &h->o, 0, &h->run);
  return NULL;
}

/*
 * Permanent faults end the stream with an error naming the URL, the status
 * and the cause, in bounded time (retries with backoff, then give up; a
 * stall is cut by the low-speed limit), and do not disturb a healthy stream
 * (a second client, on the same daemon, reading through nginx directly)
 * that runs at the same time.  The daemon serves on afterwards.
 */
TEST_IMPL(remote_faults_permanent) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  dh_run ref = {0};
  local_reference(1, &ref);
  rs_server ng, fp;
  rh_nginx(&ng, "ng", dh_std_dir(), NULL);
  char fpdir[PATH_MAX];
  snprintf(fpdir, sizeof(fpdir), "%s/fp", test_tmpdir());
  ASSERT_OK(rs_start_faultproxy(&fp, ng.url, fpdir, NULL));
  char *urls[RH_MAX_FILES], *direct[RH_MAX_FILES];
  int nf = rh_urls(fp.url, dh_std_dir(), urls, RH_MAX_FILES);
  rh_urls(ng.url, dh_std_dir(), direct, RH_MAX_FILES);
  /* A port nothing listens on: bind one, note it, close it. */
  char dead[RH_MAX_FILES][128];
  const char *dead_src[RH_MAX_FILES];
  {
    rs_server tmp;
    rh_nginx(&tmp, "tmp", dh_std_dir(), NULL);
    int port = tmp.port;
    rh_stop(&tmp);
    char *names[RH_MAX_FILES];
    int nn = rh_files(dh_std_dir(), names, RH_MAX_FILES);
    for (int i = 0; i < nn; i++) {
      snprintf(dead[i], sizeof(dead[i]), "http://127.0.0.1:%d/%s", port, names[i]);
      dead_src[i] = dead[i];
    }
    rh_files_free(names, nn);
  }
  static const char *const flags[] = {"--workers=2",
                                      "--fetch_retry_base_ms=20",
                                      "--fetch_retries=3",
                                      "--fetch_low_speed_time=1",
                                      "--fetch_low_speed_bytes=1000",
                                      "--fetch_connect_timeout=2",
                                      NULL};
  struct {
    const char *name;
    const char *rule; /* proxy rule (NULL: the dead server) */
    const char *const expect[3];
  } cases[] = {
      {"always-503",
       "{\"type\":\"status\",\"status\":503,\"path\":\"/"
       "part-002.parquet\",\"skip\":1,\"count\":-1}",
       {"/part-002.parquet", "HTTP 503", "gave up after 4 attempts"}},
      {"footer-503",
       "{\"type\":\"status\",\"status\":503,\"path\":\"/part-001.parquet\",\"count\":-1}",
       {"/part-001.parquet", "HTTP 503", "gave up after 4 attempts"}},
      {"stall",
       "{\"type\":\"stall\",\"seconds\":30,\"path\":\"/part-003.parquet\",\"skip\":1,\"count\":-1}",
       {"/part-003.parquet", "stalled or timed out", "gave up after 4 attempts"}},
      {"cut",
       "{\"type\":\"cut\",\"after_bytes\":100,\"path\":\"/part-000.parquet\",\"skip\":1,"
       "\"count\":-1}",
       {"/part-000.parquet", "gave up after 4 attempts", "reset"}},
      {"dead", NULL, {"http://127.0.0.1:", "onnect", "gave up after 4 attempts"}},
      /* Not followed (the allowlist would not cover the target), not retried. */
      {"redirect",
       "{\"type\":\"status\",\"status\":302,\"path\":\"/part-001.parquet\",\"count\":-1,"
       "\"location\":\"http://169.254.169.254/latest/meta-data?X-Amz-Signature=secret\"}",
       {"redirected (HTTP 302) to http://169.254.169.254/latest/meta-data?...", "/part-001.parquet",
        "does not follow redirects"}},
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    char ctl[1024];
    if (cases[k].rule) {
      snprintf(ctl, sizeof(ctl), "{\"clear\":true,\"reset_stats\":true,\"add\":%s}", cases[k].rule);
      ASSERT_OK(rs_control(&fp, ctl));
    }
    dh_daemon d;
    dh_init(&d, cases[k].name, flags);
    dh_start(&d);
    healthy_arg h;
    memset(&h, 0, sizeof(h));
    h.socket = d.socket;
    std_opts(&h.o, (const char *const *)direct, (size_t)nf, 1);
    pthread_t th;
    ASSERT_OK(pthread_create(&th, NULL, healthy_main, &h));
    larder_stream_options_t o;
    std_opts(&o, cases[k].rule ? (const char *const *)urls : dead_src, (size_t)nf, 1);
    dh_run r = {0};
    double t0 = test_now_ms();
    int rc = dh_collect(d.socket, &o, 0, &r);
    double ms = test_now_ms() - t0;
    fprintf(stderr, "%-12s %6.0f ms, %zu batches: %s\n", cases[k].name, ms, r.n, r.err);
    ASSERT_NE(rc, 0);
    for (int j = 0; j < 3; j++) ASSERT_STR_CONTAINS(r.err, cases[k].expect[j]);
    /* A presigned redirect target's query is not repeated to the client. */
    ASSERT_NULL(strstr(r.err, "X-Amz-Signature"));
    /* Four attempts with backoff (and, for the stall, a second each). */
    ASSERT_LT(ms, 30000.0 * dh_slow());
    pthread_join(th, NULL);
    if (h.run.rc != 0) ASSERT_FAIL_("%s: the healthy stream failed: %s", cases[k].name, h.run.err);
    dh_expect_same(&ref, &h.run);
    dh_run_free(&h.run);
    /* Still serving. */
    dh_run again = {0};
    ASSERT_OK(dh_collect(d.socket, &h.o, 0, &again));
    dh_expect_same(&ref, &again);
    dh_run_free(&again);
    dh_run_free(&r);
    dh_stop(&d);
  }
  rh_stop(&fp);
  rh_stop(&ng);
  for (int i = 0; i < nf; i++) {
    free(urls[i]);
    free(direct[i]);
  }
  dh_run_free(&ref);
  return 0;
}

/*
 * SIGTERM while remote reads hang (a stall of a minute, longer than the
 * low-speed limit and the test) and others wait in backoff: the daemon
 * still exits promptly and cleanly (status 0, no sanitizer report), and the
 * client gets an error rather than a hang.
 */
TEST_IMPL(remote_faults_shutdown) {
  int skip = rh_require(1, 1);
  if (skip) return skip;
  rs_server ng, fp;
  rh_nginx(&ng, "ng", dh_std_dir(), NULL);
  char fpdir[PATH_MAX];
  snprintf(fpdir, sizeof(fpdir), "%s/fp", test_tmpdir());
  ASSERT_OK(rs_start_faultproxy(&fp, ng.url, fpdir, NULL));
  char *urls[RH_MAX_FILES];
  int nf = rh_urls(fp.url, dh_std_dir(), urls, RH_MAX_FILES);
  /* After the footers: part-000 and part-001 stall, part-002 answers 503
   * (backoff), the rest is fine. */
  ASSERT_OK(rs_control(&fp,
                       "{\"add\":["
                       "{\"type\":\"stall\",\"seconds\":60,\"path\":\"/part-000.parquet\","
                       "\"skip\":1,\"count\":-1},"
                       "{\"type\":\"stall\",\"seconds\":60,\"after_bytes\":100,"
                       "\"path\":\"/part-001.parquet\",\"skip\":1,\"count\":-1},"
                       "{\"type\":\"status\",\"status\":503,\"path\":\"/part-002.parquet\","
                       "\"skip\":1,\"count\":-1}]}"));
  static const char *const flags[] = {"--workers=2", "--fetch_retry_base_ms=2000",
                                      "--fetch_low_speed_time=30", NULL};
  dh_daemon d;
  dh_init(&d, "d", flags);
  dh_start(&d);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_options_t o;
  std_opts(&o, (const char *const *)urls, (size_t)nf, 1);
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  /* Wait until both stalls hold a request and a 503 was answered. */
  double deadline = test_now_ms() + 30000.0 * dh_slow();
  for (;;) {
    char *st = rs_stats(&fp);
    ASSERT_NOT_NULL(st);
    int64_t stalls = rs_json_int(st, "faults.stall", 0), e503 = rs_json_int(st, "by_status.503", 0);
    free(st);
    if (stalls >= 2 && e503 >= 1) break;
    ASSERT(test_now_ms() < deadline);
    usleep(20000);
  }
  double t0 = test_now_ms();
  int status = dh_stop_status(&d, 20000 * dh_slow());
  double ms = test_now_ms() - t0;
  fprintf(stderr, "stopped in %.0f ms (status 0x%x)\n", ms, status);
  if (status == -1) {
    dh_print_log(&d);
    ASSERT_FAIL_("%s", "larderd did not exit within 20 s of SIGTERM with stalled fetches");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("larderd exited with status 0x%x after SIGTERM", status);
  }
  dh_check_log(&d);
  ASSERT_LT(ms, 10000.0 * dh_slow());
  larder_batch_t *b;
  int rc = larder_stream_next(s, 10000, &b);
  ASSERT_NE(rc, 0);
  ASSERT_NE(rc, LARDER_ETIMEDOUT);
  larder_stream_close(s);
  larder_client_close(c);
  rh_stop(&fp);
  rh_stop(&ng);
  for (int i = 0; i < nf; i++) free(urls[i]);
  return 0;
}
