/*
 * test-remote-creds.c: S3 credentials as fleets have them (awscreds.h),
 * against s3front.mjs, which verifies every signature and takes the
 * temporary keys that credfake.mjs (STS, container endpoint, IMDSv2 on
 * loopback) hands out, refusing each once it expires: every source on its
 * own serves a stream; the chain's precedence, with the sources after the
 * winner never asked; credentials expiring mid-stream refreshed without a
 * lost row; failing refreshes retried, counted and survived; no secret in
 * the log or the stats.  The instance metadata service is never the real
 * one: the runner disables it, and the tests that want it point it at
 * credfake.
 */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fetch/awscreds.h"
#include "larder.h"
#include "remote-harness.h"
#include "test-ctl-common.h"

#define KEY "larder-test-key"
#define SECRET "larder-test-secret"
#define WEB_TOKEN "eyJhbGciOiJSUzI1NiJ9.larder-test-web-identity.c2lnbmF0dXJl"
#define ROLE_ARN "arn:aws:iam::123456789012:role/larder"
#define CONTAINER_AUTH "Bearer larder-container-auth-0123456789"

static char issued[PATH_MAX];

/* Every AWS variable the chain reads, cleared; the metadata service off. */
static void clear_aws_env(void) {
  static const char *const vars[] = {"AWS_ACCESS_KEY_ID",
                                     "AWS_SECRET_ACCESS_KEY",
                                     "AWS_SESSION_TOKEN",
                                     "AWS_PROFILE",
                                     "AWS_SHARED_CREDENTIALS_FILE",
                                     "AWS_CONFIG_FILE",
                                     "AWS_ENDPOINT_URL",
                                     "AWS_WEB_IDENTITY_TOKEN_FILE",
                                     "AWS_ROLE_ARN",
                                     "AWS_ROLE_SESSION_NAME",
                                     "AWS_ENDPOINT_URL_STS",
                                     "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                                     "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                                     "AWS_CONTAINER_AUTHORIZATION_TOKEN",
                                     "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                                     "AWS_EC2_METADATA_SERVICE_ENDPOINT"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) unsetenv(vars[i]);
  setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
  char home[PATH_MAX];
  snprintf(home, sizeof(home), "%s/nohome", test_tmpdir());
  setenv("HOME", home, 1);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ASSERT_NOT_NULL(f);
  fputs(text, f);
  ASSERT_OK(fclose(f));
}

static void tmp_path(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/%s", test_tmpdir(), name);
}

/* The front (with the standard dataset under std/, taking the keys of
 * issued as well as its own) and credfake (ttl_s lifetime, extra flags). */
static void start_servers(rs_server *s3, rs_server *fake, int ttl_s, const char *const *s3_extra) {
  tmp_path(issued, sizeof(issued), "issued.jsonl");
  write_text(issued, "");
  const char *flags[16] = {"--credentials-file", issued};
  int n = 2;
  for (int i = 0; s3_extra && s3_extra[i] && n < 15; i++) flags[n++] = s3_extra[i];
  flags[n] = NULL;
  rh_s3(s3, "s3", flags);
  ASSERT_EQ(rh_s3_put(s3, "data", "std/", dh_std_dir()), 4);

  char dir[PATH_MAX], log[PATH_MAX + 32], err[PATH_MAX + 32], ttl[32], watch[32];
  tmp_path(dir, sizeof(dir), "fake");
  ASSERT_EQ(test_system("mkdir -p '%s'", dir), 0);
  snprintf(log, sizeof(log), "%s/credfake.log", dir);
  snprintf(err, sizeof(err), "%s/credfake.stderr", dir);
  snprintf(ttl, sizeof(ttl), "%d", ttl_s);
  snprintf(watch, sizeof(watch), "%d", (int)getpid());
  const char *dirv = getenv("LARDER_REMOTE_DIR");
  char script[PATH_MAX];
  snprintf(script, sizeof(script), "%s/credfake.mjs", dirv && *dirv ? dirv : "tests/remote");
  const char *argv[] = {"node",       script,   "--issued",         issued,
                        "--ttl-s",    ttl,      "--web-token",      WEB_TOKEN,
                        "--role-arn", ROLE_ARN, "--container-auth", CONTAINER_AUTH,
                        "--log",      log,      "--watch-pid",      watch,
                        NULL};
  ASSERT_OK(rs_start(fake, argv, err, 20000));
}

/* Revokes a key at the front: a copy of its line of issued with an
 * expiration long past, which the front reads last and so refuses the
 * key with ExpiredToken (the credential source knows nothing of it).  The
 * key is that of the first line whose field is value ("source",
 * "container": the first key the container endpoint handed out).
 * Returns 0, or -1 when there is no such key; asserts nothing (it also
 * runs on a thread of its own). */
static int revoke_key(const char *field, const char *value) {
  rh_log lg;
  rh_log_read(&lg, issued);
  static char line[8192];
  line[0] = '\0';
  char buf[256];
  for (int i = 0; i < lg.n && !line[0]; i++) {
    if (strcmp(rh_field(lg.lines[i], field, buf, sizeof(buf)), value) != 0) continue;
    const char *exp = strstr(lg.lines[i], "\"expiration\":\"");
    if (exp == NULL) continue;
    size_t head = (size_t)(exp - lg.lines[i]) + 14;
    const char *tail = strchr(exp + 14, '"');
    if (tail == NULL) continue;
    snprintf(line, sizeof(line), "%.*s2000-01-01T00:00:00Z%s", (int)head, lg.lines[i], tail);
  }
  rh_log_free(&lg);
  if (!line[0]) return -1;
  FILE *f = fopen(issued, "a");
  if (f == NULL) return -1;
  fprintf(f, "%s\n", line);
  return fclose(f) == 0 ? 0 : -1;
}

/* Revokes the first key of a source once the front has answered `after`
 * object reads (206): mid-epoch, whatever the machine's speed. */
typedef struct revoker {
  const rs_server *s3;
  const char *source;
  int after;
  int done; /* 1: revoked; -1: failed */
} revoker_t;

static void *revoke_mid_epoch(void *arg) {
  revoker_t *rv = arg;
  double end = test_now_ms() + 60000;
  while (test_now_ms() < end) {
    char *st = rs_stats(rv->s3);
    int64_t n = st ? rs_json_int(st, "by_status.206", 0) : 0;
    free(st);
    if (n >= rv->after) {
      rv->done = revoke_key("source", rv->source) == 0 ? 1 : -1;
      return NULL;
    }
    usleep(20 * 1000);
  }
  rv->done = -1;
  return NULL;
}

/* Registers static keys with the front (as if an admin had issued them):
 * a JSON line of issued, expiring in an hour. */
static void register_keys(const char *ak, const char *sk, const char *token) {
  FILE *f = fopen(issued, "a");
  ASSERT_NOT_NULL(f);
  time_t exp = time(NULL) + 3600;
  char when[64];
  strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime(&exp));
  fprintf(f,
          "{\"access_key\":\"%s\",\"secret_key\":\"%s\",\"session_token\":\"%s\","
          "\"expiration\":\"%s\"}\n",
          ak, sk, token, when);
  ASSERT_OK(fclose(f));
}

/* A token of n characters (long lines: Debian's inih stops at 200). */
static char *long_token(size_t n, char seed) {
  char *t = malloc(n + 1);
  ASSERT_NOT_NULL(t);
  for (size_t i = 0; i < n; i++) t[i] = (char)('A' + (seed + i * 7) % 26);
  memcpy(t, "LongTok", 7);
  t[n] = '\0';
  return t;
}

static void daemon_for(dh_daemon *d, const char *name, const rs_server *s3) {
  static const char *const fl[] = {"--workers=2", "--log_level=debug", "--s3_path_style=true",
                                   NULL};
  dh_init(d, name, fl);
  char f[160];
  snprintf(f, sizeof(f), "--s3_endpoint=%s", s3->url);
  dh_flag(d, f);
}

/* Streams the dataset from S3 once: every row, or the log and the error. */
static void expect_all_rows(dh_daemon *d, const char *what) {
  const char *src[1] = {"s3://data/std/"};
  larder_stream_options_t o;
  dh_opts(&o, src, 100, 11, 1);
  o.num_sources = 1;
  o.unit_rows = DH_STD_UNIT_ROWS;
  o.shuffle_window = 8;
  o.arena_bytes = 8u << 20;
  dh_run r = {0};
  if (dh_collect(d->socket, &o, 0, &r) != 0) {
    dh_print_log(d);
    ASSERT_FAIL_("%s: %s", what, r.err);
  }
  int64_t rows = 0;
  for (size_t i = 0; i < r.n; i++) rows += r.b[i].rows;
  ASSERT_EQ(rows, DH_STD_ROWS);
  dh_run_free(&r);
}

/* No secret key or session token of issued (nor the web identity and
 * container tokens) in the daemon's log or its stats. */
static void expect_no_secrets(const dh_daemon *d) {
  char *log = dh_read_log(d);
  ASSERT_NOT_NULL(log);
  /* larderctl stats --json, then its text, one after the other. */
  tc_out js, tx;
  ASSERT_EQ(tc_ctl(&js, NULL, d->socket, "stats", "--json", NULL), 0);
  ASSERT_EQ(tc_ctl(&tx, NULL, d->socket, "stats", NULL), 0);
  size_t n = strlen(js.out) + strlen(tx.out) + 2;
  char *stats = malloc(n);
  ASSERT_NOT_NULL(stats);
  snprintf(stats, n, "%s\n%s", js.out, tx.out);
  tc_out_free(&js);
  tc_out_free(&tx);
  rh_log lg;
  rh_log_read(&lg, issued);
  static char buf[8192];
  for (int i = 0; i < lg.n; i++) {
    const char *keys[] = {"secret_key", "session_token"};
    for (int k = 0; k < 2; k++) {
      rh_field(lg.lines[i], keys[k], buf, sizeof(buf));
      if (strlen(buf) < 8) continue;
      if (strstr(log, buf)) ASSERT_FAIL_("the log shows a %s", keys[k]);
      if (strstr(stats, buf)) ASSERT_FAIL_("the stats show a %s", keys[k]);
    }
  }
  const char *const other[] = {WEB_TOKEN, CONTAINER_AUTH, SECRET, NULL};
  for (int i = 0; other[i]; i++) {
    if (strstr(log, other[i])) ASSERT_FAIL_("the log shows %s", other[i]);
    if (strstr(stats, other[i])) ASSERT_FAIL_("the stats show %s", other[i]);
  }
  rh_log_free(&lg);
  free(log);
  free(stats);
}

/* Front requests with this status (0: any) in its log. */
static int front_status(int status) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/s3/s3front.mjs.log", test_tmpdir());
  rh_log lg;
  rh_log_read(&lg, path);
  int n = 0;
  char buf[256];
  for (int i = 0; i < lg.n; i++) {
    if (strcmp(rh_field(lg.lines[i], "event", buf, sizeof(buf)), "request") != 0) continue;
    if (status && rh_field_int(lg.lines[i], "status", 0) != status) continue;
    n++;
  }
  rh_log_free(&lg);
  return n;
}

/* The distinct access keys that signed object reads at the front. */
static int front_keys(char keys[][64], int max) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/s3/s3front.mjs.log", test_tmpdir());
  rh_log lg;
  rh_log_read(&lg, path);
  int n = 0;
  char buf[256];
  for (int i = 0; i < lg.n; i++) {
    if (strcmp(rh_field(lg.lines[i], "event", buf, sizeof(buf)), "request") != 0) continue;
    rh_field(lg.lines[i], "akid", buf, sizeof(buf));
    if (!buf[0]) continue;
    int seen = 0;
    for (int k = 0; k < n; k++) seen |= strcmp(keys[k], buf) == 0;
    if (!seen && n < max) snprintf(keys[n++], 64, "%.63s", buf);
  }
  rh_log_free(&lg);
  return n;
}

static int64_t fake_stat(const rs_server *fake, const char *key) {
  char *s = rs_stats(fake);
  ASSERT_NOT_NULL(s);
  int64_t v = rs_json_int(s, key, 0);
  free(s);
  return v;
}

/* Sets the environment of source (the others stay as they are). */
static void use_source(const char *source, const rs_server *fake) {
  char path[PATH_MAX], url[256];
  if (strcmp(source, "env") == 0) {
    setenv("AWS_ACCESS_KEY_ID", KEY, 1);
    setenv("AWS_SECRET_ACCESS_KEY", SECRET, 1);
  } else if (strcmp(source, "web_identity") == 0) {
    tmp_path(path, sizeof(path), "web-token");
    write_text(path, WEB_TOKEN "\n");
    setenv("AWS_WEB_IDENTITY_TOKEN_FILE", path, 1);
    setenv("AWS_ROLE_ARN", ROLE_ARN, 1);
    setenv("AWS_ROLE_SESSION_NAME", "larder-test", 1);
    snprintf(url, sizeof(url), "%s/", fake->url);
    setenv("AWS_ENDPOINT_URL_STS", url, 1);
  } else if (strcmp(source, "profile") == 0 || strcmp(source, "process") == 0) {
    /* Keys in ~/.aws/config's "[profile larder]" (the credentials file
     * lacks the profile), with a token longer than inih's lines. */
    char *tok = long_token(1200, 3);
    register_keys("AKIAPROFILETEST1", "profile-secret-0123456789", tok);
    char text[8192], cmdjson[PATH_MAX];
    tmp_path(cmdjson, sizeof(cmdjson), "process.json");
    if (strcmp(source, "process") == 0) {
      char *ptok = long_token(900, 5);
      register_keys("AKIAPROCESSTEST1", "process-secret-0123456789", ptok);
      time_t exp = time(NULL) + 3600;
      char when[64];
      strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime(&exp));
      snprintf(text, sizeof(text),
               "{\"Version\": 1, \"AccessKeyId\": \"AKIAPROCESSTEST1\", \"SecretAccessKey\": "
               "\"process-secret-0123456789\", \"SessionToken\": \"%s\", \"Expiration\": "
               "\"%s\"}\n",
               ptok, when);
      write_text(cmdjson, text);
      free(ptok);
      snprintf(text, sizeof(text),
               "# larder test\n[default]\nregion = us-east-1\n\n[profile larder]\n"
               "credential_process = cat '%s'\n",
               cmdjson);
    } else {
      snprintf(text, sizeof(text),
               "[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n"
               "[profile larder]\n  aws_access_key_id=AKIAPROFILETEST1\n"
               "aws_secret_access_key = profile-secret-0123456789\naws_session_token = %s\n",
               tok);
    }
    free(tok);
    tmp_path(path, sizeof(path), "aws-config");
    write_text(path, text);
    setenv("AWS_CONFIG_FILE", path, 1);
    tmp_path(path, sizeof(path), "no-credentials-file");
    setenv("AWS_SHARED_CREDENTIALS_FILE", path, 1);
    setenv("AWS_PROFILE", "larder", 1);
  } else if (strcmp(source, "container") == 0) {
    snprintf(url, sizeof(url), "%s/container/v2/credentials", fake->url);
    setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", url, 1);
    tmp_path(path, sizeof(path), "container-auth");
    write_text(path, CONTAINER_AUTH "\n");
    setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", path, 1);
  } else if (strcmp(source, "imds") == 0) {
    unsetenv("AWS_EC2_METADATA_DISABLED");
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake->url, 1);
  }
}

/*
 * Each source on its own: the environment, web identity (STS), a profile
 * of ~/.aws/config with a 1200-character token, credential_process, the
 * container endpoint with its authorization token file, and IMDSv2.  Each
 * daemon says which source it took, serves every row with keys the front
 * verifies, and shows no secret; the fake answered each of its sources
 * once.
 */
TEST_IMPL(remote_creds_sources) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  clear_aws_env();
  rs_server s3, fake;
  start_servers(&s3, &fake, 3600, NULL);
  static const char *const sources[] = {"env",     "web_identity", "profile",
                                        "process", "container",    "imds"};
  for (size_t i = 0; i < sizeof(sources) / sizeof(sources[0]); i++) {
    clear_aws_env();
    use_source(sources[i], &fake);
    dh_daemon d;
    daemon_for(&d, sources[i], &s3);
    dh_start(&d);
    char want[64];
    snprintf(want, sizeof(want), "S3 credentials from %s", sources[i]);
    dh_wait_log(&d, want, 1, 10000.0 * dh_slow());
    expect_all_rows(&d, sources[i]);
    expect_no_secrets(&d);
    dh_stop(&d);
  }
  clear_aws_env();
  ASSERT_EQ(fake_stat(&fake, "issued.web_identity"), 1);
  ASSERT_EQ(fake_stat(&fake, "issued.container"), 1);
  ASSERT_EQ(fake_stat(&fake, "issued.imds"), 1);
  ASSERT_EQ(fake_stat(&fake, "denied"), 0);
  rh_stop(&fake);
  rh_stop(&s3);
  ASSERT_EQ(front_status(403), 0);
  ASSERT_EQ(front_status(400), 0);
  /* The upload's key (also the environment's), and five handed out. */
  char keys[8][64];
  ASSERT_EQ(front_keys(keys, 8), 6);
  return 0;
}

/*
 * Precedence: with every source set, the environment wins; without it web
 * identity, then the profile, then the container endpoint, then IMDS.  A
 * source after the winner is never asked: no container or IMDS request
 * reaches the fake before the steps that take them.  A SIGHUP walks the
 * chain again (one more IMDS answer, counted in credentials_refreshes).
 */
TEST_IMPL(remote_creds_precedence) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  clear_aws_env();
  rs_server s3, fake;
  start_servers(&s3, &fake, 3600, NULL);
  static const char *const order[] = {"env", "web_identity", "profile", "container", "imds"};
  const size_t n = sizeof(order) / sizeof(order[0]);
  for (size_t i = 0; i < n; i++) use_source(order[i], &fake);
  for (size_t i = 0; i < n; i++) {
    dh_daemon d;
    daemon_for(&d, order[i], &s3);
    dh_start(&d);
    char want[64];
    snprintf(want, sizeof(want), "S3 credentials from %s", order[i]);
    dh_wait_log(&d, want, 1, 10000.0 * dh_slow());
    if (i + 1 == n) {
      expect_all_rows(&d, order[i]);
      /* SIGHUP walks the chain again, off the loop. */
      ASSERT_EQ(dh_stat(&d, "credentials_refreshes"), 0);
      kill(d.pid, SIGHUP);
      double end = test_now_ms() + 10000;
      while (dh_stat(&d, "credentials_refreshes") < 1 && test_now_ms() < end) usleep(50 * 1000);
      ASSERT_EQ(dh_stat(&d, "credentials_refreshes"), 1);
      ASSERT_EQ(fake_stat(&fake, "issued.imds"), 2);
      expect_all_rows(&d, "after a reload");
    }
    expect_no_secrets(&d);
    dh_stop(&d);
    ASSERT_EQ(fake_stat(&fake, "issued.web_identity"), i >= 1 ? 1 : 0);
    ASSERT_EQ(fake_stat(&fake, "by_path./container/v2/credentials"), i >= 3 ? 1 : 0);
    ASSERT_EQ(fake_stat(&fake, "by_path./latest/api/token"), i >= 4 ? 2 : 0);
    /* The next step goes without this source. */
    if (strcmp(order[i], "env") == 0) {
      unsetenv("AWS_ACCESS_KEY_ID");
      unsetenv("AWS_SECRET_ACCESS_KEY");
    } else if (strcmp(order[i], "web_identity") == 0) {
      unsetenv("AWS_WEB_IDENTITY_TOKEN_FILE");
      unsetenv("AWS_ROLE_ARN");
    } else if (strcmp(order[i], "profile") == 0) {
      unsetenv("AWS_CONFIG_FILE");
    } else if (strcmp(order[i], "container") == 0) {
      unsetenv("AWS_CONTAINER_CREDENTIALS_FULL_URI");
    }
  }
  clear_aws_env();
  rh_stop(&fake);
  rh_stop(&s3);
  ASSERT_EQ(front_status(403), 0);
  ASSERT_EQ(front_status(400), 0);
  return 0;
}

/* Front latency per request that makes one cold epoch last a while. */
#define SLOW_MS "1000"

/*
 * Expiry during an epoch: web identity credentials that live 10 s, and a
 * front slow enough (1 s a request, one at a time) that the epoch
 * outlasts them.  The refresher asks STS
 * again at half their life; the epoch delivers every row, the front
 * refused nothing (it refuses a key past its expiration), and object
 * reads were signed with more than one key: new requests took the new
 * credentials.
 */
TEST_IMPL(remote_creds_refresh) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  clear_aws_env();
  rs_server s3, fake;
  static const char *const slow[] = {"--latency-ms", SLOW_MS, NULL};
  start_servers(&s3, &fake, 10, slow);
  use_source("web_identity", &fake);
  dh_daemon d;
  daemon_for(&d, "d", &s3);
  dh_flag(&d, "--fetch_inflight_per_host=1");
  dh_start(&d);
  dh_wait_log(&d, "S3 credentials from web_identity", 1, 10000.0 * dh_slow());
  double t0 = test_now_ms();
  expect_all_rows(&d, "an epoch across the expiry");
  double took = test_now_ms() - t0;
  fprintf(stderr, "epoch: %.1f s; credential requests: %lld\n", took / 1000,
          (long long)fake_stat(&fake, "issued.web_identity"));
  ASSERT_GE(fake_stat(&fake, "issued.web_identity"), 2);
  ASSERT_GE(dh_stat(&d, "credentials_refreshes"), 1);
  ASSERT_EQ(dh_stat(&d, "credentials_refresh_errors"), 0);
  ASSERT_LE(dh_stat(&d, "credentials_expiry_seconds"), 10);
  char *stats = dh_admin(&d, "stats");
  ASSERT_STR_CONTAINS(stats, "\"credentials\":{\"source\":\"web_identity\",\"expires_unix\":");
  free(stats);
  tc_out tx;
  ASSERT_EQ(tc_ctl(&tx, NULL, d.socket, "stats", NULL), 0);
  ASSERT_STR_CONTAINS(tx.out, "s3 keys     web_identity · expire in ");
  tc_out_free(&tx);
  expect_no_secrets(&d);
  dh_stop(&d);
  clear_aws_env();
  rh_stop(&fake);
  rh_stop(&s3);
  ASSERT_EQ(front_status(400), 0);
  ASSERT_EQ(front_status(403), 0);
  char keys[16][64];
  ASSERT_GE(front_keys(keys, 16), 2);
  return 0;
}

/*
 * A failing refresh: container credentials that live 12 s, the endpoint
 * failing the next two requests after the first (at 6 and 7 s; the third,
 * at 9 s, succeeds).  The refresher retries
 * with backoff, counts both failures in credentials_refresh_errors, logs
 * them without a secret, and gets new credentials before the old expire;
 * the epoch running through it all delivers every row.
 */
TEST_IMPL(remote_creds_refresh_errors) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  clear_aws_env();
  rs_server s3, fake;
  static const char *const slow[] = {"--latency-ms", SLOW_MS, NULL};
  start_servers(&s3, &fake, 12, slow);
  use_source("container", &fake);
  dh_daemon d;
  daemon_for(&d, "d", &s3);
  dh_flag(&d, "--fetch_inflight_per_host=1");
  dh_start(&d);
  dh_wait_log(&d, "S3 credentials from container", 1, 10000.0 * dh_slow());
  ASSERT_OK(rs_control(&fake, "{\"fail\":2}"));
  double t0 = test_now_ms();
  expect_all_rows(&d, "an epoch across failing refreshes");
  fprintf(stderr, "epoch: %.1f s\n", (test_now_ms() - t0) / 1000);
  /* The refreshes run on their own clock: wait for them, with a deadline. */
  double end = test_now_ms() + 30000;
  while (
      (dh_stat(&d, "credentials_refresh_errors") < 2 || dh_stat(&d, "credentials_refreshes") < 1) &&
      test_now_ms() < end)
    usleep(100 * 1000);
  ASSERT_EQ(dh_stat(&d, "credentials_refresh_errors"), 2);
  ASSERT_GE(dh_stat(&d, "credentials_refreshes"), 1);
  ASSERT_EQ(fake_stat(&fake, "failed"), 2);
  ASSERT_GE(fake_stat(&fake, "issued.container"), 2);
  dh_wait_log(&d, "refresh failed", 1, 10000.0 * dh_slow());
  expect_no_secrets(&d);
  dh_stop(&d);
  clear_aws_env();
  rh_stop(&fake);
  rh_stop(&s3);
  ASSERT_EQ(front_status(400), 0);
  ASSERT_EQ(front_status(403), 0);
  return 0;
}

/*
 * A source that applies but fails ends the walk, so that another identity
 * never stands in for a misconfigured one: a web identity token that STS
 * refuses leaves the daemon without credentials although a profile has
 * some, the log naming the source and STS's error code (never the token),
 * and a stream failing with "no S3 credentials"; a credential_process that
 * fails is named likewise.  Both are retried in the background
 * (credentials_refresh_errors grows).
 */
TEST_IMPL(remote_creds_errors) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  clear_aws_env();
  rs_server s3, fake;
  start_servers(&s3, &fake, 3600, NULL);
  for (int k = 0; k < 2; k++) {
    clear_aws_env();
    use_source("profile", &fake);
    char path[PATH_MAX];
    if (k == 0) {
      use_source("web_identity", &fake);
      tmp_path(path, sizeof(path), "web-token");
      write_text(path, "not-the-token\n");
    } else {
      tmp_path(path, sizeof(path), "aws-config");
      write_text(path, "[profile larder]\ncredential_process = echo oops >&2; exit 3\n");
    }
    dh_daemon d;
    daemon_for(&d, k == 0 ? "web" : "process", &s3);
    dh_start(&d);
    dh_wait_log(&d, k == 0 ? "web_identity: STS" : "credential_process exited with status 3", 1,
                10000.0 * dh_slow());
    if (k == 0) dh_wait_log(&d, "InvalidIdentityToken", 1, 10000.0 * dh_slow());
    const char *src[1] = {"s3://data/std/"};
    larder_stream_options_t o;
    dh_opts(&o, src, 100, 11, 1);
    o.num_sources = 1;
    o.unit_rows = DH_STD_UNIT_ROWS;
    o.arena_bytes = 8u << 20;
    dh_run r = {0};
    ASSERT_NE(dh_collect(d.socket, &o, 0, &r), 0);
    ASSERT_STR_CONTAINS(r.err, "no S3 credentials");
    dh_run_free(&r);
    double end = test_now_ms() + 10000;
    while (dh_stat(&d, "credentials_refresh_errors") < 1 && test_now_ms() < end) usleep(50 * 1000);
    ASSERT_GE(dh_stat(&d, "credentials_refresh_errors"), 1);
    char *log = dh_read_log(&d);
    ASSERT_NOT_NULL(log);
    ASSERT(strstr(log, "not-the-token") == NULL);
    free(log);
    expect_no_secrets(&d);
    dh_stop(&d);
  }
  clear_aws_env();
  ASSERT_EQ(fake_stat(&fake, "issued.web_identity"), 0);
  rh_stop(&fake);
  rh_stop(&s3);
  /* The profile's keys were never used. */
  char keys[4][64];
  int nk = front_keys(keys, 4);
  for (int i = 0; i < nk; i++) ASSERT(strcmp(keys[i], "AKIAPROFILETEST1") != 0);
  return 0;
}

/* Runs the chain in this process with a credential_process that prints
 * out (written to a file and cat'ed, or cmd itself when out is NULL). */
static int process_resolve(const char *out, const char *cmd, awscreds_value_t *v, char *err,
                           size_t errlen) {
  char json[PATH_MAX], conf[PATH_MAX], text[PATH_MAX + 128];
  tmp_path(json, sizeof(json), "out.json");
  tmp_path(conf, sizeof(conf), "unit-config");
  if (out) write_text(json, out);
  snprintf(text, sizeof(text), "[default]\ncredential_process = %s%s%s\n", out ? "cat '" : "",
           out ? json : cmd, out ? "'" : "");
  write_text(conf, text);
  clear_aws_env();
  setenv("AWS_CONFIG_FILE", conf, 1);
  awscreds_options_t o;
  memset(&o, 0, sizeof(o));
  o.timeout_s = 1;
  return awscreds_resolve(&o, v, err, errlen);
}

/*
 * The chain's readers, in process: ISO 8601 expirations (fractions,
 * offsets, junk); credential_process JSON with escapes, nested members it
 * skips and members in any order; what it refuses (another Version, a
 * missing secret, not an object, an unreadable Expiration, more than 64
 * KiB, a process that outlives its timeout), each with a message naming
 * the source and no secret.
 */
TEST_IMPL(remote_creds_readers) {
  ASSERT_EQ(awscreds_parse_time("2026-11-28T04:00:00Z"), 1795838400);
  ASSERT_EQ(awscreds_parse_time("2026-11-28T04:00:00.123Z"), 1795838400);
  ASSERT_EQ(awscreds_parse_time("2026-11-28T05:30:00+01:30"), 1795838400);
  ASSERT_EQ(awscreds_parse_time("2026-11-28T04:00:00"), 1795838400);
  ASSERT_EQ(awscreds_parse_time("tomorrow"), 0);
  ASSERT_EQ(awscreds_parse_time("2026-11-28T04:00:00Zjunk"), 0);
  ASSERT_EQ(awscreds_parse_time(NULL), 0);

  awscreds_value_t v;
  char err[512];
  ASSERT_OK(process_resolve(
      "  {\"Extra\": {\"a\": [1, {\"b\": \"}\"}], \"c\": null}, \"SessionToken\": "
      "\"tok\\\"en\\\\/\\u0041\", \"Version\": 1, \"AccessKeyId\": \"AKIAUNIT\", "
      "\"SecretAccessKey\": \"s3cr\\/et\", \"Expiration\": \"2026-11-28T04:00:00Z\", "
      "\"Flag\": true}\n",
      NULL, &v, err, sizeof(err)));
  ASSERT_STR_EQ(v.source, "process");
  ASSERT_STR_EQ(v.access_key, "AKIAUNIT");
  ASSERT_STR_EQ(v.secret_key, "s3cr/et");
  ASSERT_STR_EQ(v.session_token, "tok\"en\\/A");
  ASSERT_EQ(v.expiration, 1795838400);
  awscreds_value_clear(&v);
  /* No Expiration, no token: long-term keys. */
  ASSERT_OK(process_resolve("{\"Version\":1,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"S\"}", NULL,
                            &v, err, sizeof(err)));
  ASSERT_NULL(v.session_token);
  ASSERT_EQ(v.expiration, 0);
  awscreds_value_clear(&v);

  struct {
    const char *out, *cmd, *want;
  } bad[] = {
      {"{\"Version\":2,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"SECRETX\"}", NULL,
       "not Version 1"},
      {"{\"Version\":1,\"AccessKeyId\":\"A\"}", NULL, "lacks AccessKeyId or SecretAccessKey"},
      {"[\"SECRETX\"]", NULL, "not a JSON object"},
      {"{\"Version\":1,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"SECRETX\"", NULL,
       "not a JSON object"},
      {"{\"Version\":1,\"AccessKeyId\":\"A\",\"SecretAccessKey\":\"SECRETX\","
       "\"Expiration\":\"soon\"}",
       NULL, "unreadable Expiration"},
      {NULL, "head -c 70000 /dev/zero | tr '\\\\0' x", "wrote too much"},
      {NULL, "sleep 30", "took over 1 s"},
      {NULL, "true", "wrote nothing"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    double t0 = test_now_ms();
    int rc = process_resolve(bad[i].out, bad[i].cmd, &v, err, sizeof(err));
    if (rc == 0) ASSERT_FAIL_("case %zu took bad output", i);
    ASSERT_NULL(v.access_key);
    ASSERT_STR_CONTAINS(err, "process");
    ASSERT_STR_CONTAINS(err, bad[i].want);
    ASSERT(strstr(err, "SECRETX") == NULL);
    ASSERT_LT(test_now_ms() - t0, 10000);
  }
  /* Nothing set at all: ENOENT, saying what was looked at. */
  clear_aws_env();
  ASSERT_EQ(awscreds_resolve(&(awscreds_options_t){0}, &v, err, sizeof(err)), LARDER_ENOENT);
  ASSERT_STR_CONTAINS(err, "no S3 credentials");
  ASSERT_STR_CONTAINS(err, "instance metadata disabled");
  return 0;
}

/*
 * Credentials revoked mid-epoch (issue #31): container credentials good
 * for an hour, which the front starts refusing with ExpiredToken after a
 * few object reads, while the container endpoint hands out new ones.  The
 * refused requests ask the refresher for new credentials at once and are
 * retried with them: the epoch delivers every row, the refresh is counted
 * in credentials_refreshes (and no error), the front refused at least one
 * request and saw a second container key, and no secret is shown.
 */
TEST_IMPL(remote_creds_expired_token) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  clear_aws_env();
  rs_server s3, fake;
  static const char *const slow[] = {"--latency-ms", "300", NULL};
  start_servers(&s3, &fake, 3600, slow);
  use_source("container", &fake);
  dh_daemon d;
  daemon_for(&d, "d", &s3);
  dh_flag(&d, "--fetch_inflight_per_host=2");
  dh_start(&d);
  dh_wait_log(&d, "S3 credentials from container", 1, 10000.0 * dh_slow());
  ASSERT_EQ(fake_stat(&fake, "issued.container"), 1);
  ASSERT_OK(rs_control(&s3, "{\"reset_stats\":true}"));
  revoker_t rv = {&s3, "container", 3, 0};
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, NULL, revoke_mid_epoch, &rv), 0);
  double t0 = test_now_ms();
  expect_all_rows(&d, "an epoch across a revocation");
  pthread_join(th, NULL);
  fprintf(stderr, "epoch: %.1f s\n", (test_now_ms() - t0) / 1000);
  ASSERT_EQ(rv.done, 1);
  ASSERT_GE(front_status(400), 1);
  ASSERT_GE(fake_stat(&fake, "issued.container"), 2);
  ASSERT_GE(dh_stat(&d, "credentials_refreshes"), 1);
  ASSERT_EQ(dh_stat(&d, "credentials_refresh_errors"), 0);
  dh_wait_log(&d, "S3 refused the credentials in force", 1, 1000);
  expect_no_secrets(&d);
  dh_stop(&d);
  clear_aws_env();
  rh_stop(&fake);
  rh_stop(&s3);
  /* The upload's key, the first container key and at least one more. */
  char keys[16][64];
  ASSERT_GE(front_keys(keys, 16), 3);
  return 0;
}

/*
 * The same revocation with a source that keeps handing out the refused
 * credentials (a credential_process printing a fixed key): the refresh
 * gives them again, so the stream fails at once with LARDER_EACCES and a
 * message that says the credentials were refused as expired and renewing
 * them did not help; counted in credentials_refresh_errors.  The daemon
 * then serves nothing with that key, and shows no secret.
 */
TEST_IMPL(remote_creds_expired_same) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  clear_aws_env();
  rs_server s3, fake;
  start_servers(&s3, &fake, 3600, NULL);
  use_source("process", &fake);
  dh_daemon d;
  daemon_for(&d, "d", &s3);
  dh_start(&d);
  dh_wait_log(&d, "S3 credentials from process", 1, 10000.0 * dh_slow());
  expect_all_rows(&d, "before the revocation");
  ASSERT_EQ(dh_stat(&d, "credentials_refreshes"), 0);
  ASSERT_OK(revoke_key("access_key", "AKIAPROCESSTEST1"));
  const char *src[1] = {"s3://data/std/"};
  larder_stream_options_t o;
  dh_opts(&o, src, 100, 12, 1);
  o.num_sources = 1;
  o.unit_rows = DH_STD_UNIT_ROWS;
  o.arena_bytes = 8u << 20;
  dh_run r = {0};
  double t0 = test_now_ms();
  int rc = dh_collect(d.socket, &o, 0, &r);
  double took = test_now_ms() - t0;
  fprintf(stderr, "revoked, same key again: rc %d in %.0f ms: %s\n", rc, took, r.err);
  ASSERT_NE(rc, 0);
  ASSERT_STR_CONTAINS(r.err, "refused the credentials as expired or revoked");
  ASSERT_STR_CONTAINS(r.err, "ExpiredToken");
  ASSERT_STR_CONTAINS(r.err, "renewing them did not help");
  ASSERT_STR_CONTAINS(r.err, "the same credentials");
  ASSERT_LT(took, 30000 * dh_slow());
  dh_run_free(&r);
  ASSERT_GE(dh_stat(&d, "credentials_refreshes"), 1);
  ASSERT_GE(dh_stat(&d, "credentials_refresh_errors"), 1);
  dh_wait_log(&d, "renewing them did not help", 1, 1000);
  expect_no_secrets(&d);
  dh_stop(&d);
  clear_aws_env();
  rh_stop(&fake);
  rh_stop(&s3);
  return 0;
}

/*
 * IMDSv1 fallback, in process against credfake: a token PUT answered 405
 * (an older metadata service, a proxy) lets the GETs go without a token,
 * as botocore does; 404 and 403 likewise.  A 400 does not (no credentials,
 * nothing asked after it), nor does AWS_EC2_METADATA_V1_DISABLED=true.  A
 * service that hands out tokens is always asked with one.
 */
TEST_IMPL(remote_creds_imds_v1) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  clear_aws_env();
  rs_server s3, fake;
  start_servers(&s3, &fake, 3600, NULL);
  rh_stop(&s3);
  awscreds_options_t ao;
  memset(&ao, 0, sizeof(ao));
  ao.timeout_s = 5;
  awscreds_value_t v;
  char err[512];
  ASSERT_OK(rs_control(&fake, "{\"imds_v1\":true}"));
  static const int fallback[] = {405, 404, 403};
  for (size_t i = 0; i < sizeof(fallback) / sizeof(fallback[0]); i++) {
    clear_aws_env();
    use_source("imds", &fake);
    char ctl[64];
    snprintf(ctl, sizeof(ctl), "{\"imds_token_status\":%d}", fallback[i]);
    ASSERT_OK(rs_control(&fake, ctl));
    int64_t before = fake_stat(&fake, "imds_v1");
    int rc = awscreds_resolve(&ao, &v, err, sizeof(err));
    if (rc != 0) ASSERT_FAIL_("token PUT answered %d: %s", fallback[i], err);
    ASSERT_STR_EQ(v.source, "imds");
    ASSERT_STR_CONTAINS(v.access_key, "ASIAIMDS");
    ASSERT_NOT_NULL(v.session_token);
    ASSERT_GT(v.expiration, (int64_t)time(NULL));
    awscreds_value_clear(&v);
    ASSERT_EQ(fake_stat(&fake, "imds_v1") - before, 2); /* the role, then its keys */
  }
  /* Turned off by the environment: no credentials. */
  setenv("AWS_EC2_METADATA_V1_DISABLED", "true", 1);
  int64_t before = fake_stat(&fake, "imds_v1");
  ASSERT_EQ(awscreds_resolve(&ao, &v, err, sizeof(err)), LARDER_ENOENT);
  ASSERT_EQ(fake_stat(&fake, "imds_v1"), before);
  unsetenv("AWS_EC2_METADATA_V1_DISABLED");
  /* A 400: no fallback. */
  ASSERT_OK(rs_control(&fake, "{\"imds_token_status\":400}"));
  ASSERT_EQ(awscreds_resolve(&ao, &v, err, sizeof(err)), LARDER_ENOENT);
  ASSERT_EQ(fake_stat(&fake, "imds_v1"), before);
  /* Tokens again: IMDSv2, though IMDSv1 would be served. */
  ASSERT_OK(rs_control(&fake, "{\"imds_token_status\":200}"));
  ASSERT_OK(awscreds_resolve(&ao, &v, err, sizeof(err)));
  ASSERT_STR_EQ(v.source, "imds");
  awscreds_value_clear(&v);
  ASSERT_EQ(fake_stat(&fake, "imds_v1"), before);
  ASSERT_EQ(fake_stat(&fake, "denied"), 0);
  clear_aws_env();
  rh_stop(&fake);
  return 0;
}

/* Role profiles of the config file of remote_creds_assume_role. */
#define ROLE_PREFIX "arn:aws:iam::123456789012:role/"
static const char role_config[] =
    "[profile base]\n"
    "aws_access_key_id = AKIASOURCETEST01\n"
    "aws_secret_access_key = source-secret-0123456789\n"
    "[profile mid]\n"
    "role_arn = " ROLE_PREFIX
    "mid\n"
    "source_profile = base\n"
    "[profile larder]\n"
    "role_arn = " ROLE_PREFIX
    "larder\n"
    "source_profile = mid\n"
    "role_session_name = larder-chain\n"
    "external_id = ext-42\n"
    "duration_seconds = 1800\n"
    "[profile node]\n"
    "role_arn = " ROLE_PREFIX
    "node\n"
    "credential_source = Ec2InstanceMetadata\n"
    "[profile mfa]\n"
    "role_arn = " ROLE_PREFIX
    "mfa\n"
    "source_profile = base\n"
    "mfa_serial = arn:aws:iam::123456789012:mfa/someone\n"
    "[profile loop1]\n"
    "role_arn = " ROLE_PREFIX
    "loop1\n"
    "source_profile = loop2\n"
    "[profile loop2]\n"
    "role_arn = " ROLE_PREFIX
    "loop2\n"
    "source_profile = loop1\n"
    "[profile elsewhere]\n"
    "role_arn = " ROLE_PREFIX
    "elsewhere\n"
    "credential_source = Somewhere\n"
    "[profile nosource]\n"
    "role_arn = " ROLE_PREFIX
    "nosource\n"
    "[profile missing]\n"
    "role_arn = " ROLE_PREFIX
    "missing\n"
    "source_profile = nobody\n"
    "[profile longer]\n"
    "role_arn = " ROLE_PREFIX
    "longer\n"
    "source_profile = base\n"
    "duration_seconds = 99\n";

/* The environment of a role profile: the config file above, the fake's
 * STS, the profile name. */
static void use_role_profile(const rs_server *fake, const char *name) {
  char path[PATH_MAX], url[256];
  clear_aws_env();
  tmp_path(path, sizeof(path), "role-config");
  write_text(path, role_config);
  setenv("AWS_CONFIG_FILE", path, 1);
  tmp_path(path, sizeof(path), "no-credentials-file");
  setenv("AWS_SHARED_CREDENTIALS_FILE", path, 1);
  snprintf(url, sizeof(url), "%s/", fake->url);
  setenv("AWS_ENDPOINT_URL_STS", url, 1);
  setenv("AWS_PROFILE", name, 1);
}

/*
 * Role profiles, as fleets chain them.  "larder" assumes its role with the
 * credentials of its source_profile "mid", itself a role assumed with the
 * static keys of "base": two AssumeRole calls, each signed (SigV4 for STS,
 * which the fake checks with AWS's signer) with the key before it, the
 * second with its session token; the last carries the profile's session
 * name, external id and duration, and its key reads every row at the
 * front.  "node" assumes its role with the instance's credentials
 * (credential_source = Ec2InstanceMetadata).  Refused with a message that
 * names the profile: mfa_serial (nobody can type the code), a
 * source_profile loop, an unknown credential_source, a role without a
 * source, a source_profile with no credentials, a duration out of range.
 * No secret shows in the log or the stats.
 */
TEST_IMPL(remote_creds_assume_role) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  clear_aws_env();
  rs_server s3, fake;
  start_servers(&s3, &fake, 3600, NULL);
  register_keys("AKIASOURCETEST01", "source-secret-0123456789", "");

  /* A chain of two roles over static keys. */
  use_role_profile(&fake, "larder");
  dh_daemon d;
  daemon_for(&d, "chain", &s3);
  dh_start(&d);
  dh_wait_log(&d, "S3 credentials from assume_role", 1, 10000.0 * dh_slow());
  expect_all_rows(&d, "a role chain");
  expect_no_secrets(&d);
  dh_stop(&d);
  ASSERT_EQ(fake_stat(&fake, "issued.assume_role"), 2);
  char *st = rs_stats(&fake);
  ASSERT_NOT_NULL(st);
  fprintf(stderr, "the fake's record: %s\n", st);
  ASSERT_STR_CONTAINS(st, "\"role\":\"" ROLE_PREFIX "mid\",\"session\":\"larderd-");
  ASSERT_STR_CONTAINS(st, "\"by\":\"AKIASOURCETEST01\",\"issued\":\"ASIAROLE00000001\"");
  ASSERT_STR_CONTAINS(st, "\"role\":\"" ROLE_PREFIX
                          "larder\",\"session\":\"larder-chain\","
                          "\"external_id\":\"ext-42\",\"duration_s\":\"1800\","
                          "\"by\":\"ASIAROLE00000001\",\"issued\":\"ASIAROLE00000002\"");
  free(st);

  /* A role over the instance's credentials. */
  use_role_profile(&fake, "node");
  unsetenv("AWS_EC2_METADATA_DISABLED");
  setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.url, 1);
  daemon_for(&d, "node", &s3);
  dh_start(&d);
  dh_wait_log(&d, "S3 credentials from assume_role", 1, 10000.0 * dh_slow());
  expect_all_rows(&d, "a role over the instance's credentials");
  dh_stop(&d);
  ASSERT_EQ(fake_stat(&fake, "issued.imds"), 1);
  ASSERT_EQ(fake_stat(&fake, "issued.assume_role"), 3);
  st = rs_stats(&fake);
  ASSERT_NOT_NULL(st);
  ASSERT_STR_CONTAINS(st, "\"role\":\"" ROLE_PREFIX "node\"");
  ASSERT_STR_CONTAINS(st, "\"by\":\"ASIAIMDS00000003\",\"issued\":\"ASIAROLE00000004\"");
  free(st);
  ASSERT_EQ(fake_stat(&fake, "denied"), 0);

  /* What is refused, in process (no request reaches STS). */
  static const struct {
    const char *profile, *want;
  } refused[] = {
      {"mfa", "profile mfa: role_arn with mfa_serial needs a code typed by a person"},
      {"loop1", "role chain passes 8 profiles"},
      {"elsewhere", "credential_source = Somewhere is not Environment"},
      {"nosource", "profile nosource: role_arn needs source_profile, credential_source or"},
      {"missing", "its source_profile nobody has no credentials"},
      {"longer", "duration_seconds = 99 is not a number of seconds from 900 to 43200"},
  };
  int64_t asked = fake_stat(&fake, "requests");
  for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
    use_role_profile(&fake, refused[i].profile);
    awscreds_options_t o;
    memset(&o, 0, sizeof(o));
    o.timeout_s = 5;
    awscreds_value_t v;
    char err[512];
    ASSERT_EQ(awscreds_resolve(&o, &v, err, sizeof(err)), LARDER_EINVAL);
    fprintf(stderr, "%s: %s\n", refused[i].profile, err);
    ASSERT_STR_CONTAINS(err, refused[i].want);
    ASSERT_NULL(strstr(err, "source-secret"));
  }
  ASSERT_EQ(fake_stat(&fake, "requests"), asked);
  clear_aws_env();
  rh_stop(&fake);
  rh_stop(&s3);
  ASSERT_EQ(front_status(403), 0);
  return 0;
}
