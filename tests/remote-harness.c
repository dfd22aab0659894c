/*
 * remote-harness.c: see remote-harness.h.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "parquet/parquet.h"
#include "remote-harness.h"

int rh_require(int need_nginx, int need_node) {
  if (need_node) {
    if (test_system("command -v node >/dev/null 2>&1") != 0) {
      fprintf(stderr, "skip: node is not installed (the S3 front and the fault proxy need it)\n");
      return TEST_SKIP;
    }
    if (access("tests/node_modules/s3rver", R_OK) != 0 ||
        access("tests/node_modules/@smithy/signature-v4", R_OK) != 0) {
      fprintf(stderr,
              "skip: tests/node_modules lacks s3rver or @smithy/signature-v4 "
              "(make deps installs them)\n");
      return TEST_SKIP;
    }
  }
  if (need_nginx &&
      test_system("command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx") != 0) {
    fprintf(stderr, "skip: nginx is not installed (apt-get install nginx-light)\n");
    return TEST_SKIP;
  }
  return 0;
}

void rh_nginx(rs_server *s, const char *name, const char *root, const char *const *extra) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s/%s", test_tmpdir(), name);
  if (rs_start_nginx(s, dir, root, extra) != 0) {
    test_system("cat '%s.stderr' >&2", dir);
    ASSERT_FAIL_("cannot start nginx on %s", root);
  }
}

void rh_nginx_log(const char *name, char *buf, size_t size) {
  snprintf(buf, size, "%s/%s/access.log", test_tmpdir(), name);
}

void rh_s3(rs_server *s, const char *name, const char *const *extra) {
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s/%s", test_tmpdir(), name);
  const char *flags[32] = {"--bucket", "data"};
  int n = 2;
  for (int i = 0; extra && extra[i] && n < 31; i++) flags[n++] = extra[i];
  flags[n] = NULL;
  if (rs_start_s3front(s, dir, flags) != 0) {
    test_system("cat '%s/s3front.mjs.stderr' >&2", dir);
    ASSERT_FAIL_("%s", "cannot start s3front.mjs");
  }
}

int rh_s3_put(const rs_server *s3, const char *bucket, const char *prefix, const char *dir) {
  char *names[RH_MAX_FILES];
  int n = rh_files(dir, names, RH_MAX_FILES);
  ASSERT_GT(n, 0);
  rh_files_free(names, n);
  char out[PATH_MAX];
  snprintf(out, sizeof(out), "%s/s3put.out", test_tmpdir());
  int rc = test_system(
      "node tests/remote/s3put.mjs --endpoint %s --bucket %s --prefix '%s' "
      "'%s'/*.parquet > '%s'",
      s3->url, bucket, prefix, dir, out);
  ASSERT_EQ(rc, 0);
  return n;
}

void rh_stop(rs_server *s) {
  if (s->pid > 0) rs_stop(s, 10000);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int rh_files(const char *dir, char **names, int max) {
  DIR *d = opendir(dir);
  ASSERT_NOT_NULL(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len < 9 || strcmp(e->d_name + len - 8, ".parquet") != 0) continue;
    ASSERT_LT(n, max);
    names[n] = strdup(e->d_name);
    ASSERT_NOT_NULL(names[n]);
    n++;
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof(char *), cmp_str);
  return n;
}

void rh_files_free(char **names, int n) {
  for (int i = 0; i < n; i++) free(names[i]);
}

int rh_urls(const char *base, const char *dir, char **urls, int max) {
  char *names[RH_MAX_FILES];
  int n = rh_files(dir, names, max < RH_MAX_FILES ? max : RH_MAX_FILES);
  for (int i = 0; i < n; i++) {
    size_t len = strlen(base) + strlen(names[i]) + 2;
    urls[i] = malloc(len);
    ASSERT_NOT_NULL(urls[i]);
    snprintf(urls[i], len, "%s/%s", base, names[i]);
  }
  rh_files_free(names, n);
  return n;
}

int rh_ranges(const char *path, const char *const *cols, size_t ncols, uint64_t gap, char out[][64],
              int max, uint64_t *bytes) {
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
      else r[m++] = r[i];
    }
    for (int i = 0; i < m; i++) {
      if (bytes) *bytes += r[i].length;
      if (out) {
        ASSERT_LT(n, max);
        snprintf(out[n], 64, "bytes=%llu-%llu", (unsigned long long)r[i].offset,
                 (unsigned long long)(r[i].offset + r[i].length - 1));
      }
      n++;
    }
    free(r);
  }
  pq_projection_free(proj);
  pq_file_close(f);
  pq_source_close_file(&src);
  return n;
}

uint64_t rh_projected_bytes(const char *dir, const char *const *cols, size_t ncols, uint64_t gap) {
  char *names[RH_MAX_FILES];
  int n = rh_files(dir, names, RH_MAX_FILES);
  uint64_t total = 0;
  for (int i = 0; i < n; i++) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    rh_ranges(path, cols, ncols, gap, NULL, 0, &total);
  }
  rh_files_free(names, n);
  return total;
}

void rh_copy_dir(const char *src, const char *dst) {
  ASSERT_EQ(
      test_system("rm -rf '%s' && mkdir -p '%s' && cp '%s'/*.parquet '%s'/", dst, dst, src, dst),
      0);
}

/* ------------------------------------------------------------------------ */

void rh_log_read(rh_log *log, const char *path) {
  memset(log, 0, sizeof(*log));
  size_t len = 0;
  uint8_t *p = test_read_file(path, &len);
  log->text = malloc(len + 1);
  ASSERT_NOT_NULL(log->text);
  if (p) memcpy(log->text, p, len);
  log->text[len] = '\0';
  free(p);
  int cap = 64;
  log->lines = malloc((size_t)cap * sizeof(char *));
  ASSERT_NOT_NULL(log->lines);
  char *s = log->text;
  while (*s) {
    char *nl = strchr(s, '\n');
    if (nl) *nl = '\0';
    if (*s) {
      if (log->n == cap) {
        cap *= 2;
        log->lines = realloc(log->lines, (size_t)cap * sizeof(char *));
        ASSERT_NOT_NULL(log->lines);
      }
      log->lines[log->n++] = s;
    }
    if (nl == NULL) break;
    s = nl + 1;
  }
}

void rh_log_free(rh_log *log) {
  free(log->text);
  free(log->lines);
  memset(log, 0, sizeof(*log));
}

/* The value after "key": in a flat JSON object, or NULL. */
static const char *field_at(const char *line, const char *key) {
  char pat[128];
  snprintf(pat, sizeof(pat), "\"%s\":", key);
  const char *p = strstr(line, pat);
  if (p == NULL) return NULL;
  p += strlen(pat);
  while (*p == ' ') p++;
  return p;
}

const char *rh_field(const char *line, const char *key, char *buf, size_t size) {
  buf[0] = '\0';
  const char *p = field_at(line, key);
  if (p == NULL || *p != '"') return buf;
  p++;
  size_t k = 0;
  while (*p && *p != '"' && k + 1 < size) {
    if (*p == '\\' && p[1]) p++;
    buf[k++] = *p++;
  }
  buf[k] = '\0';
  return buf;
}

int64_t rh_field_int(const char *line, const char *key, int64_t def) {
  const char *p = field_at(line, key);
  if (p == NULL) return def;
  if (*p == '"') p++;
  char *e;
  long long v = strtoll(p, &e, 10);
  return e == p ? def : (int64_t)v;
}

int rh_wait_lines(const char *path, int n, int timeout_ms) {
  double deadline = test_now_ms() + timeout_ms;
  for (;;) {
    size_t len = 0;
    uint8_t *p = test_read_file(path, &len);
    int lines = 0;
    for (size_t i = 0; i < len; i++) lines += p[i] == '\n';
    free(p);
    if (lines >= n) return lines;
    if (test_now_ms() > deadline) return lines;
    test_sleep_ms(10);
  }
}

int rh_file_contains(const char *path, const char *needle) {
  size_t len = 0;
  uint8_t *p = test_read_file(path, &len);
  if (p == NULL) return 0;
  int found = memmem(p, len, needle, strlen(needle)) != NULL;
  free(p);
  return found;
}

void rh_local_reference(const larder_stream_options_t *o, dh_run *out) {
  static int runs;
  char name[32];
  snprintf(name, sizeof(name), "ref%d", runs++);
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", NULL};
  dh_init(&d, name, fl);
  dh_start(&d);
  ASSERT_OK(dh_collect(d.socket, o, 0, out));
  dh_stop(&d);
}
