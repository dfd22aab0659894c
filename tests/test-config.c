/*
 * test-config.c: larderd's configuration (daemon/config.c): values outside
 * a key's documented range are refused with a message naming the key,
 * whichever way they come (file, flag or reload all go through
 * config_set); the file's lines may be of any length, and a line it
 * refuses gets a message naming the file, the line and the reason; secrets
 * may come from files (s3_*_file), read at start and at every reload, and
 * never shown.
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "larder.h"
#include "remote-harness.h"
#include "task.h"

static void expect_refused(const char *key, const char *value, const char *why) {
  config_t cfg;
  ASSERT_OK(config_defaults(&cfg));
  char err[256] = "";
  ASSERT_EQ(config_set(&cfg, key, value, err, sizeof(err)), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(err, key);
  ASSERT_STR_CONTAINS(err, why);
  config_free(&cfg);
}

/* Negative values are refused: strtoull takes "-1" as 2^64 - 1, so
 * workers=-1 would start a daemon with no workers (streams get no batch and
 * no error), and a negative cache_capacity would mean 16 EiB. */
TEST_IMPL(config_rejects_out_of_range) {
  expect_refused("workers", "-1", "negative");
  expect_refused("cache_capacity", "-5", "negative");
  expect_refused("memory_limit", " -1G", "negative");
  expect_refused("unit_rows", "70000", "outside 1 .. 65536");
  expect_refused("unit_rows", "0", "outside");
  expect_refused("workers", "100000", "outside");
  expect_refused("socket_mode", "077777", "outside");
  expect_refused("memory_limit", "12Q", "not a size");
  expect_refused("shm_ring", "auto", "not true or false");
  expect_refused("shuffle_row_groups", "maybe", "not true or false (or auto)");
  /* The bounds themselves are fine. */
  config_t cfg;
  ASSERT_OK(config_defaults(&cfg));
  char err[256];
  ASSERT_OK(config_set(&cfg, "unit_rows", "65536", err, sizeof(err)));
  ASSERT_EQ(cfg.unit_rows, 65536);
  ASSERT_OK(config_set(&cfg, "workers", "0", err, sizeof(err)));
  ASSERT_OK(config_set(&cfg, "cache_capacity", "0", err, sizeof(err)));
  ASSERT_OK(config_set(&cfg, "memory_limit", "1", err, sizeof(err)));
  /* A key that may be auto: the default, and a boolean otherwise. */
  ASSERT_EQ(cfg.shuffle_row_groups, CONFIG_AUTO);
  ASSERT_OK(config_set(&cfg, "shuffle_row_groups", "on", err, sizeof(err)));
  ASSERT_EQ(cfg.shuffle_row_groups, 1);
  ASSERT_OK(config_set(&cfg, "shuffle_row_groups", "false", err, sizeof(err)));
  ASSERT_EQ(cfg.shuffle_row_groups, 0);
  ASSERT_OK(config_set(&cfg, "shuffle_row_groups", "AUTO", err, sizeof(err)));
  ASSERT_EQ(cfg.shuffle_row_groups, CONFIG_AUTO);
  config_free(&cfg);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The file                                                                  */

/* n characters of a base64-like secret (letters, digits, '+', '/'), seeded
 * by seed, followed by "==" (malloc'd). */
static char *fake_secret(size_t n, unsigned seed) {
  static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *s = malloc(n + 3);
  ASSERT_NOT_NULL(s);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    s[i] = abc[(x >> 24) & 63];
  }
  memcpy(s + n, "==", 3);
  return s;
}

/* Writes len bytes of text to <tmpdir>/name; returns the path (static). */
static const char *write_conf(const char *name, const char *text, size_t len) {
  static char path[4096];
  snprintf(path, sizeof(path), "%s/%s", test_tmpdir(), name);
  FILE *f = fopen(path, "w");
  ASSERT_NOT_NULL(f);
  ASSERT_EQ(fwrite(text, 1, len, f), len);
  ASSERT_OK(fclose(f));
  return path;
}

/*
 * Lines of any length: a 4 KiB session token, a 2 KiB allow line with
 * several owners, a 64 KiB comment and a 64 KiB value (ca_file) are read
 * whole, the value equal to the same given as a flag.  Around them, the
 * syntax inih took stays: a byte order mark, [sections], CR LF line ends,
 * "key: value", an inline "; comment" and indented lines.
 */
TEST_IMPL(config_long_lines) {
  char *token = fake_secret(4096, 1);
  char allow[2300];
  int n = snprintf(allow, sizeof(allow), "s3://training-data/%01750d/", 7);
  for (int u = 0; u < 16; u++)
    n += snprintf(allow + n, sizeof(allow) - (size_t)n, " uid=%d gid=%d", 1000 + u, 2000 + u);
  ASSERT_GE(n, 2048);
  ASSERT_LT(n, (int)sizeof(allow));
  size_t big = 64 * 1024;
  char *comment = malloc(big + 1), *value = malloc(big + 1);
  ASSERT_NOT_NULL(comment);
  ASSERT_NOT_NULL(value);
  memset(comment, 'c', big);
  comment[0] = '#';
  comment[big] = '\0';
  value[0] = '/';
  for (size_t i = 1; i < big; i++) value[i] = i % 64 == 0 ? '/' : (char)('a' + i % 26);
  value[big] = '\0';
  size_t cap = 3 * big + 16384;
  char *text = malloc(cap);
  ASSERT_NOT_NULL(text);
  size_t len = (size_t)snprintf(text, cap,
                                "\xEF\xBB\xBF# larderd.conf with long lines\n"
                                "[larderd]\n"
                                "s3_session_token = %s\n"
                                "allow = %s\n"
                                "%s\n"
                                "ca_file=%s\r\n"
                                "  workers = 3 ; three cores\n"
                                "log_level: debug\r\n"
                                "[s3]\n"
                                "\ts3_region = eu-west-1\n",
                                token, allow, comment, value);
  ASSERT_LT(len, cap);
  const char *path = write_conf("long.conf", text, len);
  config_t cfg;
  ASSERT_OK(config_defaults(&cfg));
  char err[512] = "";
  if (config_load_file(&cfg, path, 0, err, sizeof(err)) != 0) ASSERT_FAIL_("%s", err);
  ASSERT_STR_EQ(cfg.s3_session_token, token);
  ASSERT_EQ(cfg.num_allow, 1);
  ASSERT_STR_EQ(cfg.allow[0], allow);
  ASSERT_EQ(strlen(cfg.ca_file), big);
  ASSERT_STR_EQ(cfg.ca_file, value);
  ASSERT_EQ(cfg.workers, 3);
  ASSERT_STR_EQ(cfg.s3_region, "eu-west-1");
  ASSERT_STR_EQ(cfg.path, path);
  /* The same value as a flag. */
  config_t flag;
  ASSERT_OK(config_defaults(&flag));
  ASSERT_OK(config_set(&flag, "ca_file", value, err, sizeof(err)));
  ASSERT_STR_EQ(flag.ca_file, cfg.ca_file);
  config_free(&flag);
  config_free(&cfg);
  free(text);
  free(value);
  free(comment);
  free(token);
  return 0;
}

/*
 * A line the file cannot hold is refused with "path:line: reason", and the
 * reason is what is wrong with it: a NUL byte or another control character
 * (and its column), no '=', a section header left open, no key, an unknown
 * key, a bad value.  Text that may be a secret (a token on a line of its
 * own, whatever stands before its '=') is never shown.
 */
TEST_IMPL(config_refuses_junk_lines) {
  char *secret = fake_secret(40, 2);
  char pasted[128];
  snprintf(pasted, sizeof(pasted), "%s", secret); /* "...==": a key before '=' */
  char long_junk[70000];
  memset(long_junk, 'x', sizeof(long_junk) - 1);
  long_junk[sizeof(long_junk) - 1] = '\0';
  struct {
    const char *line;
    size_t len; /* 0: strlen */
    const char *why;
  } cases[] = {
      {"work\0ers = 2", 12, "3: a NUL byte (is this a binary file?) at column 5"},
      {"workers = 2\x1b[0m", 0, "3: a control character (0x1b) at column 12"},
      {"workers = 2\rmore", 0, "3: a carriage return inside the line at column 12"},
      {"just some words", 0, "3: not a setting: no '='"},
      {long_junk, 0, "3: not a setting: no '='"},
      {"[larderd", 0, "3: a section header without its closing ']'"},
      {" = 4", 0, "3: no key before the '='"},
      {"wrokers = 4", 0, "3: unknown setting 'wrokers'"},
      {pasted, 0, "3: unknown setting (not shown"},
      {"workers = lots", 0, "3: workers: 'lots' is not a number"},
      {"workers = 4 ;; = 5", 0, NULL}, /* an inline comment: fine */
  };
  for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
    size_t n = cases[k].len ? cases[k].len : strlen(cases[k].line);
    char *text = malloc(n + 64);
    ASSERT_NOT_NULL(text);
    static const char head[] = "# ok\n[larderd]\n", tail[] = "\nworkers = 1\n";
    ASSERT_EQ(snprintf(text, n + 64, "%s", head), 15);
    memcpy(text + 15, cases[k].line, n);
    memcpy(text + 15 + n, tail, sizeof(tail));
    char name[32];
    snprintf(name, sizeof(name), "junk-%zu.conf", k);
    const char *path = write_conf(name, text, 15 + n + 13);
    free(text);
    config_t cfg;
    ASSERT_OK(config_defaults(&cfg));
    char err[512] = "";
    int rc = config_load_file(&cfg, path, 0, err, sizeof(err));
    if (cases[k].why == NULL) {
      if (rc != 0) ASSERT_FAIL_("case %zu: %s", k, err);
      ASSERT_EQ(cfg.workers, 1);
      config_free(&cfg);
      continue;
    }
    ASSERT_EQ(rc, LARDER_EINVAL);
    fprintf(stderr, "case %zu: %s\n", k, err);
    char want[4200];
    snprintf(want, sizeof(want), "%s:%s", path, cases[k].why);
    ASSERT_STR_CONTAINS(err, want);
    ASSERT(strstr(err, secret) == NULL);
    ASSERT(strstr(err, "xxxxxxxx") == NULL);
    config_free(&cfg);
  }
  /* A missing file names itself. */
  config_t cfg;
  ASSERT_OK(config_defaults(&cfg));
  char err[512] = "", missing[4096];
  snprintf(missing, sizeof(missing), "%s/none.conf", test_tmpdir());
  ASSERT_EQ(config_load_file(&cfg, missing, 0, err, sizeof(err)), LARDER_EIO);
  ASSERT_STR_CONTAINS(err, missing);
  ASSERT_OK(config_load_file(&cfg, missing, 1, err, sizeof(err)));
  config_free(&cfg);
  free(secret);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Secrets from files                                                        */

/* Writes text to <tmpdir>/name and returns the path (malloc'd). */
static char *write_secret(const char *name, const char *text) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", test_tmpdir(), name);
  FILE *f = fopen(path, "w");
  ASSERT_NOT_NULL(f);
  fputs(text, f);
  ASSERT_OK(fclose(f));
  return strdup(path);
}

typedef struct shown {
  char text[200000];
  size_t len;
} shown_t;

static void show_key(const char *key, const char *value, int live, void *arg) {
  (void)live;
  shown_t *s = arg;
  s->len += (size_t)snprintf(s->text + s->len, sizeof(s->text) - s->len, "%s = %s\n", key, value);
  ASSERT_LT(s->len, sizeof(s->text));
}

/* Expects config_set(key, value) to fail with code and a message holding
 * what (and never secret). */
static void expect_file_error(const char *key, const char *value, int code, const char *what,
                              const char *secret) {
  config_t cfg;
  ASSERT_OK(config_defaults(&cfg));
  char err[4096] = "";
  ASSERT_EQ(config_set(&cfg, key, value, err, sizeof(err)), code);
  fprintf(stderr, "%s\n", err);
  ASSERT_STR_CONTAINS(err, key);
  ASSERT_STR_CONTAINS(err, value);
  ASSERT_STR_CONTAINS(err, what);
  if (secret) ASSERT(strstr(err, secret) == NULL);
  config_free(&cfg);
}

/*
 * s3_access_key_file, s3_secret_key_file and s3_session_token_file fill
 * their keys with the file's content, without the spaces and line end
 * around it (a 4 KiB token included); loading the file again (what a
 * reload does) reads them again; of a key and its file, the one set last
 * wins, and an empty path forgets the file's secret.  A missing file, an
 * empty one, one of two lines, a directory and a FIFO (not waited on) are
 * errors naming the key and the path and never the secret, and in a
 * config file they name its line too.  config_each shows "(set)".
 */
TEST_IMPL(config_secret_files) {
  char *token = fake_secret(4096, 3), *token2 = fake_secret(4096, 4);
  char *secret = fake_secret(38, 5);
  char buf[8192];
  char *key_path = write_secret("key", "AKIAEXAMPLEKEY\n");
  snprintf(buf, sizeof(buf), "  %s\r\n", secret);
  char *secret_path = write_secret("secret", buf);
  snprintf(buf, sizeof(buf), "%s\n", token);
  char *token_path = write_secret("token", buf);
  char conf[16384];
  int n = snprintf(conf, sizeof(conf),
                   "[s3]\ns3_access_key_file = %s\ns3_secret_key_file = %s\n"
                   "s3_session_token_file = %s\n",
                   key_path, secret_path, token_path);
  const char *path = write_conf("secrets.conf", conf, (size_t)n);
  config_t cfg;
  ASSERT_OK(config_defaults(&cfg));
  char err[4096] = "";
  if (config_load_file(&cfg, path, 0, err, sizeof(err)) != 0) ASSERT_FAIL_("%s", err);
  ASSERT_STR_EQ(cfg.s3_access_key, "AKIAEXAMPLEKEY");
  ASSERT_STR_EQ(cfg.s3_secret_key, secret);
  ASSERT_STR_EQ(cfg.s3_session_token, token);
  ASSERT_STR_EQ(cfg.s3_secret_key_file, secret_path);
  ASSERT_STR_EQ(cfg.s3_session_token_file, token_path);
  /* Shown as "(set)", the paths as they are. */
  static shown_t shown;
  shown.len = 0;
  config_each(&cfg, show_key, &shown);
  ASSERT_STR_CONTAINS(shown.text, "s3_secret_key = (set)\n");
  ASSERT_STR_CONTAINS(shown.text, "s3_session_token = (set)\n");
  ASSERT_STR_CONTAINS(shown.text, "s3_access_key = (set)\n");
  ASSERT_STR_CONTAINS(shown.text, token_path);
  ASSERT(strstr(shown.text, secret) == NULL);
  ASSERT(strstr(shown.text, token) == NULL);
  ASSERT(strstr(shown.text, "AKIAEXAMPLEKEY") == NULL);
  config_free(&cfg);

  /* The token file rewritten: loaded again, the new token. */
  snprintf(buf, sizeof(buf), "%s\n", token2);
  free(write_secret("token", buf));
  ASSERT_OK(config_defaults(&cfg));
  ASSERT_OK(config_load_file(&cfg, path, 0, err, sizeof(err)));
  ASSERT_STR_EQ(cfg.s3_session_token, token2);
  /* The last setting wins. */
  ASSERT_OK(config_set(&cfg, "s3_session_token", "inline-token", err, sizeof(err)));
  ASSERT_STR_EQ(cfg.s3_session_token, "inline-token");
  ASSERT_STR_EQ(cfg.s3_session_token_file, "");
  ASSERT_OK(config_set(&cfg, "s3_session_token_file", "", err, sizeof(err)));
  ASSERT_STR_EQ(cfg.s3_session_token, "inline-token");
  ASSERT_OK(config_set(&cfg, "s3-session-token-file", token_path, err, sizeof(err)));
  ASSERT_STR_EQ(cfg.s3_session_token, token2);
  ASSERT_OK(config_set(&cfg, "s3_session_token_file", "", err, sizeof(err)));
  ASSERT_STR_EQ(cfg.s3_session_token, "");
  ASSERT_STR_EQ(cfg.s3_session_token_file, "");
  config_free(&cfg);

  /* Errors name the key and the path, never the secret. */
  char missing[4096], dir[4096], fifo[4096];
  snprintf(missing, sizeof(missing), "%s/no-such-token", test_tmpdir());
  snprintf(dir, sizeof(dir), "%s/a-directory", test_tmpdir());
  snprintf(fifo, sizeof(fifo), "%s/a-fifo", test_tmpdir());
  ASSERT_OK(mkdir(dir, 0700));
  ASSERT_OK(mkfifo(fifo, 0600));
  expect_file_error("s3_session_token_file", missing, LARDER_EIO, "cannot read", NULL);
  expect_file_error("s3_session_token_file", missing, LARDER_EIO, "No such file", NULL);
  char *empty = write_secret("empty", "\n \n");
  expect_file_error("s3_secret_key_file", empty, LARDER_EINVAL, "is empty", NULL);
  snprintf(buf, sizeof(buf), "%s\n%s\n", secret, token);
  char *two = write_secret("two-lines", buf);
  expect_file_error("s3_secret_key_file", two, LARDER_EINVAL, "more than one line", secret);
  expect_file_error("s3_access_key_file", dir, LARDER_EINVAL, "not a regular file", NULL);
  expect_file_error("s3_access_key_file", fifo, LARDER_EINVAL, "not a regular file", NULL);
  /* In the file, with its line. */
  n = snprintf(conf, sizeof(conf),
               "# secrets\ns3_secret_key_file = %s\ns3_session_token_file = %s\n", secret_path,
               missing);
  path = write_conf("missing.conf", conf, (size_t)n);
  ASSERT_OK(config_defaults(&cfg));
  ASSERT_EQ(config_load_file(&cfg, path, 0, err, sizeof(err)), LARDER_EIO);
  char want[8192];
  snprintf(want, sizeof(want), "%s:3: s3_session_token_file: cannot read %s", path, missing);
  ASSERT_STR_CONTAINS(err, want);
  ASSERT(strstr(err, secret) == NULL);
  config_free(&cfg);
  free(two);
  free(empty);
  free(key_path);
  free(secret_path);
  free(token_path);
  free(secret);
  free(token2);
  free(token);
  return 0;
}

/* Asserts that none of secrets shows in the daemon's log or in reply. */
static void expect_hidden(const dh_daemon *d, const char *reply, const char *const *secrets) {
  char *log = dh_read_log(d);
  ASSERT_NOT_NULL(log);
  for (size_t i = 0; secrets[i]; i++) {
    if (strstr(log, secrets[i])) ASSERT_FAIL_("the log shows secret %zu", i);
    if (reply && strstr(reply, secrets[i])) ASSERT_FAIL_("larderctl config shows secret %zu", i);
  }
  free(log);
}

/*
 * The daemon itself: a configuration with a 2 KiB allow line, a 64 KiB
 * comment and secrets from files (a 4 KiB session token; the secret key's
 * file named by a flag) starts, and `larderctl config` shows the allow line
 * whole and the secrets as "(set)".  A SIGHUP reads the token file again
 * (the reload names s3_session_token as changed); with the file gone the
 * reload is refused, naming the key and the path, and the daemon keeps
 * serving; back, it reloads.  A daemon whose secret file is missing does
 * not start, and says which key and path.  No secret reaches the log.
 */
TEST_IMPL(config_daemon_long_lines_and_secret_files) {
  char *token = fake_secret(4096, 6), *token2 = fake_secret(4096, 7);
  char *secret = fake_secret(38, 8);
  char buf[8192];
  snprintf(buf, sizeof(buf), "%s\n", token);
  char *token_path = write_secret("token", buf);
  snprintf(buf, sizeof(buf), "%s\n", secret);
  char *secret_path = write_secret("secret", buf);
  char *key_path = write_secret("key", "AKIAEXAMPLEKEY\n");
  char allow[2300];
  int n = snprintf(allow, sizeof(allow), "s3://training-data/%01750d/", 9);
  for (int u = 0; u < 16; u++)
    n += snprintf(allow + n, sizeof(allow) - (size_t)n, " uid=%d gid=%d", 1000 + u, 2000 + u);
  ASSERT_GE(n, 2048);
  size_t big = 64 * 1024;
  char *conf = malloc(big + 16384);
  ASSERT_NOT_NULL(conf);
  size_t len = (size_t)snprintf(conf, 16384,
                                "[larderd]\nallow = %s\ns3_access_key_file = %s\n"
                                "s3_session_token_file = %s\n#",
                                allow, key_path, token_path);
  memset(conf + len, 'c', big);
  len += big;
  len += (size_t)snprintf(conf + len, 16384, "\nmax_clients = 77\n");

  dh_daemon d;
  dh_init(&d, "d", NULL);
  char flag[160];
  snprintf(flag, sizeof(flag), "--s3_secret_key_file=%s", secret_path);
  ASSERT_LT(strlen(secret_path) + 21, sizeof(flag));
  dh_flag(&d, flag);
  FILE *f = fopen(d.config, "w");
  ASSERT_NOT_NULL(f);
  ASSERT_EQ(fwrite(conf, 1, len, f), len);
  ASSERT_OK(fclose(f));
  dh_start(&d);
  const char *const secrets[] = {token, token2, secret, "AKIAEXAMPLEKEY", NULL};
  char *reply = dh_admin(&d, "config");
  ASSERT_NOT_NULL(reply);
  char want[2600];
  snprintf(want, sizeof(want), "{\"key\":\"allow\",\"value\":\"%s\"", allow);
  ASSERT_STR_CONTAINS(reply, want);
  ASSERT_STR_CONTAINS(reply, "{\"key\":\"max_clients\",\"value\":\"77\"");
  ASSERT_STR_CONTAINS(reply, "{\"key\":\"s3_session_token\",\"value\":\"(set)\"");
  ASSERT_STR_CONTAINS(reply, "{\"key\":\"s3_secret_key\",\"value\":\"(set)\"");
  ASSERT_STR_CONTAINS(reply, "{\"key\":\"s3_access_key\",\"value\":\"(set)\"");
  expect_hidden(&d, reply, secrets);
  free(reply);

  /* A new token: the reload reads it. */
  snprintf(buf, sizeof(buf), "%s\n", token2);
  free(write_secret("token", buf));
  kill(d.pid, SIGHUP);
  dh_wait_log(&d, "reload changed:", 1, 20000.0 * dh_slow());
  {
    char *log = dh_read_log(&d);
    const char *line = strstr(log, "reload changed:");
    ASSERT_NOT_NULL(line);
    const char *end = strchr(line, '\n');
    if (end == NULL) end = line + strlen(line);
    char *tok = strstr(line, "s3_session_token");
    if (tok == NULL || tok > end) ASSERT_FAIL_("%.*s", (int)(end - line), line);
    free(log);
  }
  /* The token file gone: refused, naming the key and the path. */
  ASSERT_OK(unlink(token_path));
  kill(d.pid, SIGHUP);
  dh_wait_log(&d, "keeping the current configuration", 1, 20000.0 * dh_slow());
  {
    char *log = dh_read_log(&d);
    snprintf(buf, sizeof(buf), "s3_session_token_file: cannot read %s", token_path);
    ASSERT_STR_CONTAINS(log, buf);
    free(log);
  }
  reply = dh_admin(&d, "config");
  ASSERT_NOT_NULL(reply);
  ASSERT_STR_CONTAINS(reply, "{\"key\":\"s3_session_token\",\"value\":\"(set)\"");
  free(reply);
  /* The secret key's file (a flag) gone: refused too. */
  snprintf(buf, sizeof(buf), "%s\n", token2);
  free(write_secret("token", buf));
  ASSERT_OK(unlink(secret_path));
  kill(d.pid, SIGHUP);
  dh_wait_log(&d, "keeping the current configuration", 2, 20000.0 * dh_slow());
  {
    char *log = dh_read_log(&d);
    snprintf(buf, sizeof(buf), "s3_secret_key_file: cannot read %s", secret_path);
    ASSERT_STR_CONTAINS(log, buf);
    free(log);
  }
  snprintf(buf, sizeof(buf), "%s\n", secret);
  free(write_secret("secret", buf));
  kill(d.pid, SIGHUP);
  dh_wait_log(&d, "reloaded", 2, 20000.0 * dh_slow());
  expect_hidden(&d, NULL, secrets);
  dh_stop(&d);

  /* A missing file at startup: the daemon does not start. */
  dh_daemon m;
  dh_init(&m, "missing", NULL);
  ASSERT_OK(unlink(token_path));
  f = fopen(m.config, "w");
  ASSERT_NOT_NULL(f);
  fprintf(f, "s3_access_key_file = %s\n\ns3_session_token_file = %s\n", key_path, token_path);
  ASSERT_OK(fclose(f));
  dh_spawn(&m);
  int status = dh_wait_exit(&m, 30000 * dh_slow());
  ASSERT(status != -1);
  ASSERT(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 2);
  {
    char *log = dh_read_log(&m);
    snprintf(buf, sizeof(buf), "%s:3: s3_session_token_file: cannot read %s", m.config, token_path);
    ASSERT_STR_CONTAINS(log, buf);
    free(log);
  }
  expect_hidden(&m, NULL, secrets);
  free(conf);
  free(key_path);
  free(secret_path);
  free(token_path);
  free(secret);
  free(token2);
  free(token);
  return 0;
}

/* Whether the daemon's socket accepts. */
static int accepts(const char *path) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(s >= 0);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  size_t n = strlen(path);
  ASSERT_LT(n, sizeof(addr.sun_path));
  memcpy(addr.sun_path, path, n + 1);
  int ok = connect(s, (struct sockaddr *)&addr, sizeof(addr)) == 0;
  close(s);
  return ok;
}

/*
 * A 64 KiB flag (ca_file, which needs a restart to change) holds through a
 * SIGHUP: the reload applies the whole command line again on top of the
 * file, so the key is neither cut nor reported as changed, and `larderctl
 * config` shows it whole.  (The harness's flags are short, so this test
 * starts larderd itself.)
 */
TEST_IMPL(config_daemon_long_flag_reload) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  size_t big = 64 * 1024;
  char *value = malloc(big + 1);
  ASSERT_NOT_NULL(value);
  for (size_t i = 0; i < big; i++) value[i] = i % 50 == 0 ? '/' : (char)('a' + i % 26);
  value[big] = '\0';
  char *ca = malloc(big + 16);
  ASSERT_NOT_NULL(ca);
  snprintf(ca, big + 16, "--ca_file=%s", value);
  char bin[4096];
  const char *env = getenv("LARDERD_BIN");
  if (env) {
    snprintf(bin, sizeof(bin), "%s", env);
  } else {
    ssize_t n = readlink("/proc/self/exe", bin, sizeof(bin) - 16);
    ASSERT_GT(n, 0);
    bin[n] = '\0';
    strcpy(strrchr(bin, '/') + 1, "larderd");
  }
  char a_config[700], a_socket[700], a_cache[700];
  snprintf(a_config, sizeof(a_config), "--config=%s", d.config);
  snprintf(a_socket, sizeof(a_socket), "--socket=%s", d.socket);
  snprintf(a_cache, sizeof(a_cache), "--cache_dir=%s", d.cache);
  char *argv[] = {bin, a_config, a_socket, a_cache, "--workers=1", ca, NULL};
  FILE *f = fopen(d.config, "w");
  ASSERT_NOT_NULL(f);
  fputs("ca_file = /etc/ssl/certs/ca-certificates.crt\nmax_clients = 9\n", f);
  ASSERT_OK(fclose(f));
  int logfd = open(d.log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  ASSERT(logfd >= 0);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    dup2(logfd, 1);
    dup2(logfd, 2);
    for (int fd = 3; fd < 1024; fd++) close(fd);
    execv(bin, argv);
    _exit(127);
  }
  close(logfd);
  d.pid = pid;
  double deadline = test_now_ms() + 30000.0 * dh_slow();
  while (!accepts(d.socket)) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      d.pid = 0;
      dh_print_log(&d);
      ASSERT_FAIL_("larderd exited during startup (status 0x%x)", status);
    }
    if (test_now_ms() > deadline) ASSERT_FAIL_("larderd did not accept on %s in time", d.socket);
    usleep(5000);
  }
  f = fopen(d.config, "w");
  ASSERT_NOT_NULL(f);
  fputs("ca_file = /etc/ssl/certs/ca-certificates.crt\nmax_clients = 10\n", f);
  ASSERT_OK(fclose(f));
  kill(d.pid, SIGHUP);
  dh_wait_log(&d, "reloaded", 1, 20000.0 * dh_slow());
  char *log = dh_read_log(&d);
  if (strstr(log, "need a restart")) {
    dh_print_log(&d);
    ASSERT_FAIL_("%s", "the reload reported a key that needs a restart");
  }
  ASSERT_STR_CONTAINS(log, "reload changed: max_clients");
  free(log);
  char *reply = dh_admin(&d, "config");
  ASSERT_NOT_NULL(reply);
  char *want = malloc(big + 64);
  ASSERT_NOT_NULL(want);
  snprintf(want, big + 64, "{\"key\":\"ca_file\",\"value\":\"%s\"", value);
  ASSERT_STR_CONTAINS(reply, want);
  ASSERT_STR_CONTAINS(reply, "{\"key\":\"max_clients\",\"value\":\"10\"");
  free(want);
  free(reply);
  dh_stop(&d);
  free(ca);
  free(value);
  return 0;
}

/*
 * A session token rotated through its file reaches S3: against a front that
 * wants a 2 KiB token, a daemon whose token file holds a stale one is
 * denied; the file rewritten and a SIGHUP sent, the same stream opens and
 * delivers every row, signed with the new token.  The secret key comes from
 * its file too; neither secret nor token reaches the log.
 */
TEST_IMPL(config_s3_token_file_rotation) {
  int skip = rh_require(0, 1);
  if (skip) return skip;
  char data[1024];
  ASSERT_EQ(dh_std_dataset(data, sizeof(data)), DH_STD_ROWS);
  static const char *const vars[] = {"AWS_ACCESS_KEY_ID",           "AWS_SECRET_ACCESS_KEY",
                                     "AWS_SESSION_TOKEN",           "AWS_PROFILE",
                                     "AWS_SHARED_CREDENTIALS_FILE", "AWS_ENDPOINT_URL"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) unsetenv(vars[i]);
  char home[PATH_MAX];
  snprintf(home, sizeof(home), "%s/nohome", test_tmpdir());
  setenv("HOME", home, 1);
  /* 2 KiB, twice a real token: the front's ready line, which repeats it,
   * must fit rs_server.ready. */
  char *token = fake_secret(2048, 9), *stale = fake_secret(2048, 10);
  /* Uploaded without a token, then served only with one. */
  rs_server s3;
  rh_s3(&s3, "s3", NULL);
  ASSERT_EQ(rh_s3_put(&s3, "data", "std/", data), 4);
  rh_stop(&s3);
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s/s3", test_tmpdir());
  const char *front[] = {"--bucket", "data", "--session-token", token, NULL};
  ASSERT_OK(rs_start_s3front(&s3, dir, front));

  char buf[8192];
  char *secret_path = write_secret("secret", "larder-test-secret\n");
  snprintf(buf, sizeof(buf), "%s\n", stale);
  char *token_path = write_secret("token", buf);
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", "--s3_path_style=true", NULL};
  dh_init(&d, "d", fl);
  char flag[160];
  snprintf(flag, sizeof(flag), "--s3_endpoint=%s", s3.url);
  dh_flag(&d, flag);
  FILE *f = fopen(d.config, "w");
  ASSERT_NOT_NULL(f);
  fprintf(f,
          "[s3]\ns3_access_key = larder-test-key\ns3_secret_key_file = %s\n"
          "s3_session_token_file = %s\n",
          secret_path, token_path);
  ASSERT_OK(fclose(f));
  dh_start(&d);

  const char *src[1] = {"s3://data/std/"};
  larder_stream_options_t o;
  dh_opts(&o, src, 100, 11, 1);
  o.num_sources = 1;
  o.unit_rows = DH_STD_UNIT_ROWS;
  o.arena_bytes = 8u << 20;
  dh_run r = {0};
  ASSERT_NE(dh_collect(d.socket, &o, 0, &r), 0);
  fprintf(stderr, "stale token: %s\n", r.err);
  ASSERT_STR_CONTAINS(r.err, "access denied");
  dh_run_free(&r);

  snprintf(buf, sizeof(buf), "%s\n", token);
  free(write_secret("token", buf));
  kill(d.pid, SIGHUP);
  dh_wait_log(&d, "reload changed:", 1, 20000.0 * dh_slow());
  dh_run ok = {0};
  if (dh_collect(d.socket, &o, 0, &ok) != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("after the reload: %s", ok.err);
  }
  int64_t rows = 0;
  for (size_t i = 0; i < ok.n; i++) rows += ok.b[i].rows;
  ASSERT_EQ(rows, DH_STD_ROWS);
  dh_run_free(&ok);
  const char *const secrets[] = {token, stale, "larder-test-secret", NULL};
  expect_hidden(&d, NULL, secrets);
  dh_stop(&d);
  rh_stop(&s3);
  free(secret_path);
  free(token_path);
  free(stale);
  free(token);
  return 0;
}

/*
 * S3 secrets from systemd credentials (LoadCredential=, read from
 * $CREDENTIALS_DIRECTORY): each secret the configuration leaves unset comes
 * from the credential file of its name; one the configuration sets stays;
 * a credential file that cannot be read fails, naming it.
 */
TEST_IMPL(config_systemd_credentials) {
  char dir[1024];
  snprintf(dir, sizeof(dir), "%s/credentials", test_tmpdir());
  ASSERT_OK(mkdir(dir, 0700));
  char path[1200];
  snprintf(path, sizeof(path), "%s/s3_secret_key", dir);
  FILE *f = fopen(path, "w");
  ASSERT_NOT_NULL(f);
  fputs("CredentialSecret\n", f);
  ASSERT_OK(fclose(f));
  snprintf(path, sizeof(path), "%s/s3_access_key", dir);
  f = fopen(path, "w");
  ASSERT_NOT_NULL(f);
  fputs("AKIACREDENTIAL\n", f);
  ASSERT_OK(fclose(f));
  ASSERT_OK(setenv("CREDENTIALS_DIRECTORY", dir, 1));
  config_t cfg;
  char err[1024] = "";
  ASSERT_OK(config_defaults(&cfg));
  ASSERT_OK(config_set(&cfg, "s3_access_key", "AKIAFROMCONFIG", err, sizeof(err)));
  if (config_systemd_credentials(&cfg, err, sizeof(err)) != 0) ASSERT_FAIL_("%s", err);
  ASSERT_STR_EQ(cfg.s3_secret_key, "CredentialSecret");
  ASSERT_STR_EQ(cfg.s3_access_key, "AKIAFROMCONFIG");
  ASSERT(cfg.s3_session_token == NULL || cfg.s3_session_token[0] == '\0');
  config_free(&cfg);
  /* An unreadable one (a directory in its place) is an error naming it. */
  snprintf(path, sizeof(path), "%s/s3_session_token", dir);
  ASSERT_OK(mkdir(path, 0700));
  ASSERT_OK(config_defaults(&cfg));
  ASSERT_EQ(config_systemd_credentials(&cfg, err, sizeof(err)), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(err, "s3_session_token_file");
  ASSERT_STR_CONTAINS(err, path);
  config_free(&cfg);
  ASSERT_OK(unsetenv("CREDENTIALS_DIRECTORY"));
  return 0;
}
