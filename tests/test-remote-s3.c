/*
 * test-remote-s3.c: s3:// sources through s3front.mjs (s3rver behind a
 * front that verifies every SigV4 signature): keys, prefixes and globs
 * listed with ListObjectsV2 over several pages; credentials from the
 * environment, the daemon's config and ~/.aws/credentials, with and
 * without a session token; path-style and virtual-hosted addressing; final
 * errors (wrong secret, missing key) that are clear and not retried; and
 * credentials that never show in the log, the errors or the stats.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote-harness.h"

#define ARENA (8u << 20)
#define KEY "larder-test-key"
#define SECRET "larder-test-secret"
#define TOKEN "larder-session-TOKEN-0123456789"

static void std_opts(larder_stream_options_t *o, const char *const *src, size_t nsrc,
                     uint64_t epochs) {
  dh_std_opts(o, src, nsrc, 100, 11, epochs, ARENA);
}

/* The standard dataset read locally: what every S3 run must equal. */
static void local_reference(uint64_t epochs, dh_run *out) {
  const char *src[1] = {dh_std_dir()};
  larder_stream_options_t o;
  std_opts(&o, src, 1, epochs);
  rh_local_reference(&o, out);
}

/* No AWS_* variable of the test's environment may reach a daemon unless a
 * test sets it. */
static void clear_aws_env(void) {
  static const char *const vars[] = {"AWS_ACCESS_KEY_ID",           "AWS_SECRET_ACCESS_KEY",
                                     "AWS_SESSION_TOKEN",           "AWS_PROFILE",
                                     "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) unsetenv(vars[i]);
}

/* The front with the standard dataset under std/, plus objects a listing
 * must step over: a _SUCCESS marker, and keys of another prefix. */
static void s3_with_std(rs_server *s3, const char *name, const char *const *extra) {
  rh_s3(s3, name, extra);
  ASSERT_EQ(rh_s3_put(s3, "data", "std/", dh_std_dir()), 4);
  ASSERT_EQ(rh_s3_put(s3, "data", "other/", dh_std_dir()), 4);
  char marker[PATH_MAX];
  snprintf(marker, sizeof(marker), "%s/_SUCCESS", test_tmpdir());
  ASSERT_EQ(test_system(": > '%s'", marker), 0);
  ASSERT_EQ(test_system("node tests/remote/s3put.mjs --endpoint %s --bucket data --prefix std/ "
                        "'%s' > /dev/null",
                        s3->url, marker),
            0);
}

/* Daemon flags for the front at s3 (path-style unless virtual). */
static void s3_flags(dh_daemon *d, const rs_server *s3, int virtual_host) {
  char f[160];
  if (virtual_host) snprintf(f, sizeof(f), "--s3_endpoint=http://s3.localhost:%d", s3->port);
  else snprintf(f, sizeof(f), "--s3_endpoint=%s", s3->url);
  dh_flag(d, f);
  dh_flag(d, virtual_host ? "--s3_path_style=false" : "--s3_path_style=true");
}

/* Requests in the front's log: those of method whose url starts with
 * prefix (NULL: any) and, if status > 0, with that status. */
static int front_requests(const char *name, const char *method, const char *prefix, int status) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/%s/s3front.mjs.log", test_tmpdir(), name);
  rh_log lg;
  rh_log_read(&lg, path);
  int n = 0;
  char buf[2048];
  for (int i = 0; i < lg.n; i++) {
    if (strcmp(rh_field(lg.lines[i], "event", buf, sizeof(buf)), "request") != 0) continue;
    if (method && strcmp(rh_field(lg.lines[i], "method", buf, sizeof(buf)), method) != 0) continue;
    if (prefix && strncmp(rh_field(lg.lines[i], "url", buf, sizeof(buf)), prefix, strlen(prefix)))
      continue;
    if (status > 0 && rh_field_int(lg.lines[i], "status", 0) != status) continue;
    n++;
  }
  rh_log_free(&lg);
  return n;
}

/* Asserts that no secret appears in the daemon's log or stats. */
static void expect_no_secrets(const dh_daemon *d, const char *const *secrets) {
  char *log = dh_read_log(d);
  ASSERT_NOT_NULL(log);
  char *stats = dh_admin(d, "stats");
  ASSERT_NOT_NULL(stats);
  for (size_t i = 0; secrets[i]; i++) {
    if (strstr(log, secrets[i])) ASSERT_FAIL_("the daemon's log shows a secret (%s)", secrets[i]);
    if (strstr(stats, secrets[i])) ASSERT_FAIL_("the stats show a secret (%s)", secrets[i]);
  }
  free(log);
  free(stats);
}

/*
 * Listing: s3://data/std/ (a prefix), a glob and the four keys named one by
 * one serve the batches of the local files, with ListObjectsV2 pages of two
 * keys (s3_list_max_keys=2: four pages for the five keys under std/, each
 * page's query signed and verified); the _SUCCESS marker and the keys of
 * other/ are left out.  Credentials from the environment.
 */
TEST_IMPL(remote_s3_listing) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  dh_run ref = {0};
  local_reference(2, &ref);
  clear_aws_env();
  rs_server s3;
  s3_with_std(&s3, "s3", NULL);
  setenv("AWS_ACCESS_KEY_ID", KEY, 1);
  setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", "--s3_list_max_keys=2", "--log_level=debug",
                                   NULL};
  dh_init(&d, "d", fl);
  s3_flags(&d, &s3, 0);
  dh_start(&d);

  const char *prefix[1] = {"s3://data/std/"};
  const char *glob[1] = {"s3://data/std/part-00[0-9].parquet"};
  const char *keys[4] = {"s3://data/std/part-002.parquet", "s3://data/std/part-000.parquet",
                         "s3://data/std/part-003.parquet", "s3://data/std/part-001.parquet"};
  struct {
    const char *const *src;
    size_t n;
  } cases[] = {{prefix, 1}, {glob, 1}, {keys, 4}};
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    larder_stream_options_t o;
    std_opts(&o, cases[k].src, cases[k].n, 2);
    dh_run r = {0};
    r.check_rows = k == 0;
    if (dh_collect(d.socket, &o, 0, &r) != 0) {
      dh_print_log(&d);
      ASSERT_FAIL_("case %zu: %s", k, r.err);
    }
    dh_expect_same(&ref, &r);
    dh_run_free(&r);
  }
  static const char *const secrets[] = {SECRET, NULL};
  expect_no_secrets(&d, secrets);
  dh_stop(&d);
  rh_stop(&s3);
  /* Two listings, two keys a page: the prefix's five keys in three pages,
   * the glob's four (listed from std/part-00) in two, the pages after the
   * first with a continuation token, all verified. */
  int lists =
      front_requests("s3", "GET", "/data?", 200) + front_requests("s3", "GET", "/data/?", 200);
  int tokens = 0;
  {
    char path[PATH_MAX], url[2048];
    snprintf(path, sizeof(path), "%s/s3/s3front.mjs.log", test_tmpdir());
    rh_log lg;
    rh_log_read(&lg, path);
    for (int i = 0; i < lg.n; i++)
      tokens +=
          strstr(rh_field(lg.lines[i], "url", url, sizeof(url)), "continuation-token=") != NULL;
    rh_log_free(&lg);
  }
  fprintf(stderr, "%d list pages, %d with a continuation token\n", lists, tokens);
  ASSERT_EQ(lists, 5);
  ASSERT_EQ(tokens, 3);
  ASSERT_EQ(front_requests("s3", NULL, NULL, 403), 0);
  ASSERT_EQ(front_requests("s3", "GET", "/data/other/", 0), 0);
  dh_run_free(&ref);
  return 0;
}

/* One run of the standard job on daemon d (named name); asserts it equals
 * ref, or prints the log and fails. */
static void expect_serves(dh_daemon *d, const dh_run *ref, const char *what) {
  const char *src[1] = {"s3://data/std/"};
  larder_stream_options_t o;
  std_opts(&o, src, 1, 1);
  dh_run r = {0};
  if (dh_collect(d->socket, &o, 0, &r) != 0) {
    dh_print_log(d);
    ASSERT_FAIL_("%s: %s", what, r.err);
  }
  ASSERT_EQ(r.n, ref->batches_per_epoch);
  for (size_t i = 0; i < r.n; i++) ASSERT_UINT_EQ(r.b[i].hash, ref->b[i].hash);
  dh_run_free(&r);
}

/* Writes an ~/.aws/credentials under <tmpdir>/<home>/.aws with a default
 * profile of wrong keys and a profile "larder" of the right ones. */
static void write_profile(const char *home, const char *token) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s/%s/.aws", test_tmpdir(), home);
  ASSERT_EQ(test_system("mkdir -p '%s'", dir), 0);
  char path[PATH_MAX + 16];
  snprintf(path, sizeof(path), "%s/credentials", dir);
  FILE *f = fopen(path, "w");
  ASSERT_NOT_NULL(f);
  fprintf(f,
          "# test profiles\n[default]\naws_access_key_id = wrong-key\n"
          "aws_secret_access_key = wrong-secret\n\n[larder]\n"
          "aws_access_key_id = " KEY "\naws_secret_access_key = " SECRET "\n");
  if (token) fprintf(f, "aws_session_token = %s\n", token);
  fclose(f);
}

/*
 * Credentials, each way the daemon takes them, against a front that
 * verifies signatures (and, for the second front, a session token):
 * --s3_access_key/--s3_secret_key flags; the same keys in the config file;
 * a named profile of ~/.aws/credentials (HOME of the daemon) chosen with
 * s3_profile and with AWS_PROFILE; the environment with AWS_SESSION_TOKEN;
 * the config's s3_session_token; a profile's aws_session_token; a store in
 * another region (s3_region, signed for eu-west-1).  Virtual-hosted
 * addressing (data.s3.localhost) for half of them.  Neither the
 * secret nor the token ever shows in the log (debug level) or the stats.
 */
TEST_IMPL(remote_s3_credentials) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  dh_run ref = {0};
  local_reference(1, &ref);
  clear_aws_env();
  rs_server s3, s3t;
  s3_with_std(&s3, "s3", NULL);
  static const char *const tok[] = {"--session-token", TOKEN, NULL};
  s3_with_std(&s3t, "s3t", NULL);
  /* s3_with_std uploads with the default credentials; restart the second
   * front on the same data with a session token required. */
  rh_stop(&s3t);
  {
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/s3t", test_tmpdir());
    const char *flags[] = {"--bucket", "data", tok[0], tok[1], NULL};
    ASSERT_OK(rs_start_s3front(&s3t, dir, flags));
  }
  /* A third front signing in another region. */
  rs_server s3r;
  static const char *const region[] = {"--region", "eu-west-1", NULL};
  rh_s3(&s3r, "s3r", region);
  {
    char out[PATH_MAX];
    snprintf(out, sizeof(out), "%s/s3put-r.out", test_tmpdir());
    ASSERT_EQ(test_system("node tests/remote/s3put.mjs --endpoint %s --region eu-west-1 "
                          "--bucket data --prefix std/ '%s'/*.parquet > '%s'",
                          s3r.url, dh_std_dir(), out),
              0);
  }
  static const char *const secrets[] = {SECRET, TOKEN, NULL};
  char home[PATH_MAX + 16];
  write_profile("home", NULL);
  write_profile("home-token", TOKEN);

  struct {
    const char *name;
    int token, virt; /* token: 1 = the front that wants one, 2 = eu-west-1 */
  } cases[] = {
      {"flags", 0, 0},     {"file", 0, 1},         {"profile", 0, 0},       {"aws-profile", 0, 1},
      {"env-token", 1, 0}, {"config-token", 1, 1}, {"profile-token", 1, 0}, {"region", 2, 1},
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    clear_aws_env();
    dh_daemon d;
    static const char *const fl[] = {"--workers=2", "--log_level=debug", NULL};
    dh_init(&d, cases[k].name, fl);
    const rs_server *front = cases[k].token == 2 ? &s3r : cases[k].token ? &s3t : &s3;
    s3_flags(&d, front, cases[k].virt);
    const char *n = cases[k].name;
    /* HOME without credentials, unless the case uses a profile. */
    snprintf(home, sizeof(home), "%s/%s", test_tmpdir(), "nohome");
    if (strcmp(n, "flags") == 0) {
      dh_flag(&d, "--s3_access_key=" KEY);
      dh_flag(&d, "--s3_secret_key=" SECRET);
    } else if (strcmp(n, "file") == 0 || strcmp(n, "config-token") == 0) {
      FILE *f = fopen(d.config, "w");
      ASSERT_NOT_NULL(f);
      fprintf(f, "[s3]\ns3_access_key = " KEY "\ns3_secret_key = " SECRET "\n");
      if (cases[k].token) fprintf(f, "s3_session_token = " TOKEN "\n");
      fclose(f);
    } else if (strcmp(n, "profile") == 0) {
      snprintf(home, sizeof(home), "%s/home", test_tmpdir());
      dh_flag(&d, "--s3_profile=larder");
    } else if (strcmp(n, "aws-profile") == 0) {
      snprintf(home, sizeof(home), "%s/home", test_tmpdir());
      setenv("AWS_PROFILE", "larder", 1);
    } else if (strcmp(n, "env-token") == 0) {
      setenv("AWS_ACCESS_KEY_ID", KEY, 1);
      setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
      setenv("AWS_SESSION_TOKEN", TOKEN, 1);
    } else if (strcmp(n, "region") == 0) {
      dh_flag(&d, "--s3_access_key=" KEY);
      dh_flag(&d, "--s3_secret_key=" SECRET);
      dh_flag(&d, "--s3_region=eu-west-1");
    } else if (strcmp(n, "profile-token") == 0) {
      snprintf(home, sizeof(home), "%s/home-token", test_tmpdir());
      dh_flag(&d, "--s3_profile=larder");
    }
    setenv("HOME", home, 1);
    dh_start(&d);
    expect_serves(&d, &ref, n);
    expect_no_secrets(&d, secrets);
    dh_stop(&d);
  }
  clear_aws_env();
  rh_stop(&s3);
  rh_stop(&s3t);
  rh_stop(&s3r);
  /* Every request carried a valid signature (and the token where one was
   * required). */
  ASSERT_EQ(front_requests("s3", NULL, NULL, 403), 0);
  ASSERT_EQ(front_requests("s3t", NULL, NULL, 403), 0);
  ASSERT_EQ(front_requests("s3t", NULL, NULL, 400), 0);
  ASSERT_EQ(front_requests("s3r", NULL, NULL, 403), 0);
  ASSERT_EQ(front_requests("s3r", NULL, NULL, 400), 0);
  dh_run_free(&ref);
  return 0;
}

/*
 * Final errors: a wrong secret gets 403 SignatureDoesNotMatch, a missing
 * key 404, an unknown session token 403: each stream open fails with a clear
 * message ("access denied for s3://data/...: check credentials", "not
 * found: s3://data/..."), after exactly one request per object (no
 * retries), and the daemon serves the next stream.  No credentials at all
 * say where they can come from.  The wrong secret is never shown either.
 */
TEST_IMPL(remote_s3_errors) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  dh_run ref = {0};
  local_reference(1, &ref);
  clear_aws_env();
  rs_server s3;
  s3_with_std(&s3, "s3", NULL);
  setenv("HOME", test_tmpdir(), 1);
  const char *keys[4] = {"s3://data/std/part-000.parquet", "s3://data/std/part-001.parquet",
                         "s3://data/std/part-002.parquet", "s3://data/std/part-003.parquet"};
  const char *missing[1] = {"s3://data/std/missing.parquet"};
  const char *prefix[1] = {"s3://data/std/"};
  const char *empty[1] = {"s3://data/nothing-here/"};
  larder_stream_options_t o;

  /* A wrong secret. */
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", "--log_level=debug", "--fetch_retry_base_ms=1",
                                   NULL};
  dh_init(&d, "wrong", fl);
  s3_flags(&d, &s3, 0);
  dh_flag(&d, "--s3_access_key=" KEY);
  dh_flag(&d, "--s3_secret_key=not-the-SECRET-42");
  dh_start(&d);
  ASSERT_OK(rs_control(&s3, "{\"reset_stats\":true}"));
  std_opts(&o, keys, 4, 1);
  dh_run r = {0};
  double t0 = test_now_ms();
  ASSERT_NE(dh_collect(d.socket, &o, 0, &r), 0);
  fprintf(stderr, "wrong secret: %s (%.0f ms)\n", r.err, test_now_ms() - t0);
  ASSERT_STR_CONTAINS(r.err, "access denied for s3://data/std/part-00");
  ASSERT_STR_CONTAINS(r.err, ".parquet: check credentials");
  ASSERT_STR_CONTAINS(r.err, "SignatureDoesNotMatch");
  ASSERT_NULL(strstr(r.err, "not-the-SECRET-42"));
  dh_run_free(&r);
  char *st = rs_stats(&s3);
  ASSERT_NOT_NULL(st);
  ASSERT_EQ(rs_json_int(st, "requests", -1), 4);
  ASSERT_EQ(rs_json_int(st, "by_status.403", -1), 4);
  free(st);
  /* A prefix: the listing itself is refused, once. */
  std_opts(&o, prefix, 1, 1);
  ASSERT_NE(dh_collect(d.socket, &o, 0, &r), 0);
  fprintf(stderr, "wrong secret, listing: %s\n", r.err);
  ASSERT_STR_CONTAINS(r.err, "access denied for s3://data/std/: check credentials");
  dh_run_free(&r);
  st = rs_stats(&s3);
  ASSERT_EQ(rs_json_int(st, "by_status.403", -1), 5);
  free(st);
  static const char *const wrong_secrets[] = {"not-the-SECRET-42", NULL};
  expect_no_secrets(&d, wrong_secrets);
  ASSERT_EQ(dh_stat(&d, "fetch_retries"), 0);
  dh_stop(&d);

  /* A session token the store does not know (this front takes none). */
  dh_daemon t;
  dh_init(&t, "token", fl);
  s3_flags(&t, &s3, 0);
  dh_flag(&t, "--s3_access_key=" KEY);
  dh_flag(&t, "--s3_secret_key=" SECRET);
  dh_flag(&t, "--s3_session_token=bogus-TOKEN-77");
  dh_start(&t);
  std_opts(&o, missing, 1, 1);
  ASSERT_NE(dh_collect(t.socket, &o, 0, &r), 0);
  fprintf(stderr, "unknown token: %s\n", r.err);
  ASSERT_STR_CONTAINS(r.err, "access denied for s3://data/std/missing.parquet: check credentials");
  ASSERT_NULL(strstr(r.err, "bogus-TOKEN-77"));
  ASSERT_NULL(strstr(r.err, SECRET));
  dh_run_free(&r);
  static const char *const tokens[] = {"bogus-TOKEN-77", SECRET, NULL};
  expect_no_secrets(&t, tokens);
  dh_stop(&t);

  /* Right keys: a missing key and an empty prefix, then a good stream. */
  dh_daemon g;
  dh_init(&g, "good", fl);
  s3_flags(&g, &s3, 0);
  dh_flag(&g, "--s3_access_key=" KEY);
  dh_flag(&g, "--s3_secret_key=" SECRET);
  dh_start(&g);
  ASSERT_OK(rs_control(&s3, "{\"reset_stats\":true}"));
  std_opts(&o, missing, 1, 1);
  ASSERT_NE(dh_collect(g.socket, &o, 0, &r), 0);
  fprintf(stderr, "missing key: %s\n", r.err);
  ASSERT_STR_CONTAINS(r.err, "not found: s3://data/std/missing.parquet");
  ASSERT_STR_CONTAINS(r.err, "404");
  dh_run_free(&r);
  st = rs_stats(&s3);
  ASSERT_EQ(rs_json_int(st, "requests", -1), 1);
  free(st);
  std_opts(&o, empty, 1, 1);
  ASSERT_NE(dh_collect(g.socket, &o, 0, &r), 0);
  fprintf(stderr, "empty prefix: %s\n", r.err);
  ASSERT_STR_CONTAINS(r.err, "s3://data/nothing-here/");
  ASSERT_STR_CONTAINS(r.err, "no objects");
  dh_run_free(&r);
  expect_serves(&g, &ref, "after the errors");
  ASSERT_EQ(dh_stat(&g, "fetch_retries"), 0);
  dh_stop(&g);

  /* No credentials anywhere. */
  dh_daemon n;
  dh_init(&n, "none", fl);
  s3_flags(&n, &s3, 0);
  dh_start(&n);
  std_opts(&o, keys, 4, 1);
  ASSERT_NE(dh_collect(n.socket, &o, 0, &r), 0);
  fprintf(stderr, "no credentials: %s\n", r.err);
  ASSERT_STR_CONTAINS(r.err, "no S3 credentials");
  ASSERT_STR_CONTAINS(r.err, "AWS_ACCESS_KEY_ID");
  dh_run_free(&r);
  dh_stop(&n);
  rh_stop(&s3);
  dh_run_free(&ref);
  return 0;
}
