/*
 * test-config.c: larderd's configuration (daemon/config.c): values outside
 * a key's documented range are refused with a message naming the key,
 * whichever way they come (file, flag or reload all go through
 * config_set); the file's lines may be of any length, and a line it
 * refuses gets a message naming the file, the line and the reason.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../daemon/config.h"
#include "larder.h"
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

/* Bug fix: strtoull took "-1" as 2^64 - 1, so workers=-1 started a daemon
 * with no workers (streams got no batch and no error), and a negative
 * cache_capacity meant 16 EiB. */
TEST_IMPL(config_rejects_out_of_range) {
  expect_refused("workers", "-1", "negative");
  expect_refused("cache_capacity", "-5", "negative");
  expect_refused("memory_limit", " -1G", "negative");
  expect_refused("unit_rows", "70000", "outside 1 .. 65536");
  expect_refused("unit_rows", "0", "outside");
  expect_refused("workers", "100000", "outside");
  expect_refused("socket_mode", "077777", "outside");
  expect_refused("memory_limit", "12Q", "not a size");
  /* The bounds themselves are fine. */
  config_t cfg;
  ASSERT_OK(config_defaults(&cfg));
  char err[256];
  ASSERT_OK(config_set(&cfg, "unit_rows", "65536", err, sizeof(err)));
  ASSERT_EQ(cfg.unit_rows, 65536);
  ASSERT_OK(config_set(&cfg, "workers", "0", err, sizeof(err)));
  ASSERT_OK(config_set(&cfg, "cache_capacity", "0", err, sizeof(err)));
  ASSERT_OK(config_set(&cfg, "memory_limit", "1", err, sizeof(err)));
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
    memcpy(text, "# ok\n[larderd]\n", 15);
    memcpy(text + 15, cases[k].line, n);
    memcpy(text + 15 + n, "\nworkers = 1\n", 13);
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
