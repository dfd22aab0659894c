/*
 * test-ctl-common.c: helpers of the larderctl and access-control tests.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test-ctl-common.h"

const char *tc_ctl_bin(void) {
  static char path[PATH_MAX];
  const char *env = getenv("LARDERCTL_BIN");
  if (env && *env) return env;
  const char *d = getenv("LARDERD_BIN");
  if (d && *d) {
    snprintf(path, sizeof(path), "%s", d);
  } else {
    ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 16);
    if (n <= 0) return "larderctl";
    path[n] = '\0';
  }
  char *slash = strrchr(path, '/');
  if (slash == NULL) return "larderctl";
  snprintf(slash + 1, sizeof(path) - (size_t)(slash + 1 - path), "larderctl");
  return path;
}

static void drop_to(const tc_cred *cred) {
  if (cred == NULL) return;
  if (setgroups((size_t)cred->ngroups, cred->groups) != 0 || setgid(cred->gid) != 0 ||
      setuid(cred->uid) != 0) {
    fprintf(stderr, "cannot become uid %u gid %u: %s\n", (unsigned)cred->uid, (unsigned)cred->gid,
            strerror(errno));
    _exit(126);
  }
}

static void append(char **buf, size_t *len, const char *data, size_t n) {
  char *p = realloc(*buf, *len + n + 1);
  ASSERT_NOT_NULL(p);
  memcpy(p + *len, data, n);
  *len += n;
  p[*len] = '\0';
  *buf = p;
}

int tc_run(tc_out *o, const tc_cred *cred, int timeout_ms, const char *const *argv) {
  memset(o, 0, sizeof(*o));
  int out[2], err[2];
  ASSERT_OK(pipe(out));
  ASSERT_OK(pipe(err));
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    for (int fd = 3; fd < 1024; fd++) close(fd);
    signal(SIGPIPE, SIG_DFL);
    drop_to(cred);
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  size_t olen = 0, elen = 0;
  append(&o->out, &olen, "", 0);
  append(&o->err, &elen, "", 0);
  double deadline = test_now_ms() + timeout_ms;
  int open_fds = 2;
  struct pollfd p[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  while (open_fds > 0) {
    int left = (int)(deadline - test_now_ms());
    if (left <= 0) break;
    int n = poll(p, 2, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (int i = 0; i < 2; i++) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t r = read(p[i].fd, buf, sizeof(buf));
      if (r <= 0) {
        close(p[i].fd);
        p[i].fd = -1;
        open_fds--;
      } else if (i == 0) {
        append(&o->out, &olen, buf, (size_t)r);
      } else {
        append(&o->err, &elen, buf, (size_t)r);
      }
    }
  }
  for (int i = 0; i < 2; i++)
    if (p[i].fd >= 0) close(p[i].fd);
  int status;
  if (open_fds > 0) kill(pid, SIGKILL);
  for (;;) {
    pid_t w = waitpid(pid, &status, open_fds > 0 ? 0 : WNOHANG);
    if (w == pid) break;
    if (test_now_ms() > deadline + 5000) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    usleep(2000);
  }
  if (open_fds > 0) o->status = -1;
  else if (WIFEXITED(status)) o->status = WEXITSTATUS(status);
  else o->status = 128 + WTERMSIG(status);
  return o->status;
}

int tc_ctl(tc_out *o, const tc_cred *cred, const char *socket, ...) {
  const char *argv[64];
  int n = 0;
  argv[n++] = tc_ctl_bin();
  argv[n++] = "--socket";
  argv[n++] = socket;
  va_list ap;
  va_start(ap, socket);
  const char *a;
  while ((a = va_arg(ap, const char *)) != NULL && n < 63) argv[n++] = a;
  va_end(ap);
  argv[n] = NULL;
  return tc_run(o, cred, 120000 * dh_slow(), argv);
}

void tc_out_free(tc_out *o) {
  free(o->out);
  free(o->err);
  o->out = o->err = NULL;
}

void tc_out_print(const char *what, const tc_out *o) {
  fprintf(stderr, "---- %s: status %d\n-- stdout:\n%s\n-- stderr:\n%s\n----\n", what, o->status,
          o->out ? o->out : "", o->err ? o->err : "");
}

/* ------------------------------------------------------------------------ */
/* JSON                                                                      */

static const char *ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

static const char *json_value(const char *p, int depth);

static const char *json_string(const char *p) {
  if (*p != '"') return NULL;
  for (p++; *p && *p != '"'; p++) {
    if ((unsigned char)*p < 0x20) return NULL;
    if (*p == '\\') {
      p++;
      if (*p == 'u') {
        for (int i = 1; i <= 4; i++)
          if (!isxdigit((unsigned char)p[i])) return NULL;
        p += 4;
      } else if (!strchr("\"\\/bfnrt", *p) || *p == '\0') {
        return NULL;
      }
    }
  }
  return *p == '"' ? p + 1 : NULL;
}

static const char *json_number(const char *p) {
  const char *s = p;
  if (*p == '-') p++;
  if (*p == '0') p++;
  else if (isdigit((unsigned char)*p))
    while (isdigit((unsigned char)*p)) p++;
  else return NULL;
  if (*p == '.') {
    p++;
    if (!isdigit((unsigned char)*p)) return NULL;
    while (isdigit((unsigned char)*p)) p++;
  }
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p)) return NULL;
    while (isdigit((unsigned char)*p)) p++;
  }
  return p > s ? p : NULL;
}

static const char *json_value(const char *p, int depth) {
  if (depth > 64) return NULL;
  p = ws(p);
  if (*p == '{') {
    p = ws(p + 1);
    if (*p == '}') return p + 1;
    for (;;) {
      p = json_string(ws(p));
      if (p == NULL) return NULL;
      p = ws(p);
      if (*p != ':') return NULL;
      p = json_value(p + 1, depth + 1);
      if (p == NULL) return NULL;
      p = ws(p);
      if (*p == '}') return p + 1;
      if (*p != ',') return NULL;
      p++;
    }
  }
  if (*p == '[') {
    p = ws(p + 1);
    if (*p == ']') return p + 1;
    for (;;) {
      p = json_value(p, depth + 1);
      if (p == NULL) return NULL;
      p = ws(p);
      if (*p == ']') return p + 1;
      if (*p != ',') return NULL;
      p++;
    }
  }
  if (*p == '"') return json_string(p);
  if (strncmp(p, "true", 4) == 0) return p + 4;
  if (strncmp(p, "false", 5) == 0) return p + 5;
  if (strncmp(p, "null", 4) == 0) return p + 4;
  return json_number(p);
}

int tc_json_valid(const char *s) {
  if (s == NULL) return 0;
  const char *p = json_value(s, 0);
  return p != NULL && *ws(p) == '\0';
}

int tc_json_lines(const char *s) {
  int n = 0;
  while (s && *s) {
    const char *nl = strchr(s, '\n');
    size_t len = nl ? (size_t)(nl - s) : strlen(s);
    char *line = strndup(s, len);
    ASSERT_NOT_NULL(line);
    if (*ws(line)) {
      if (!tc_json_valid(line)) {
        fprintf(stderr, "not JSON: %.300s\n", line);
        free(line);
        return -1;
      }
      n++;
    }
    free(line);
    s = nl ? nl + 1 : s + len;
  }
  return n;
}

/* ------------------------------------------------------------------------ */
/* Prometheus text format                                                    */

static int metric_name(const char *p, size_t n) {
  if (n == 0 || !(isalpha((unsigned char)p[0]) || p[0] == '_' || p[0] == ':')) return 0;
  for (size_t i = 1; i < n; i++)
    if (!(isalnum((unsigned char)p[i]) || p[i] == '_' || p[i] == ':')) return 0;
  return 1;
}

int tc_prom_check(const char *text, char *err, size_t errlen, char (*names)[128], int max,
                  int *num_names) {
  char types[512][256];
  char kinds[512][16];
  int nfam = 0, samples = 0, lineno = 0;
  char **series = NULL;
  size_t nseries = 0;
  int rc = -1;
  *num_names = 0;
  const char *s = text;
  while (*s) {
    lineno++;
    const char *nl = strchr(s, '\n');
    if (nl == NULL) {
      snprintf(err, errlen, "line %d: no newline at the end of the text", lineno);
      goto out;
    }
    size_t len = (size_t)(nl - s);
    char line[8192];
    if (len >= sizeof(line)) {
      snprintf(err, errlen, "line %d: too long", lineno);
      goto out;
    }
    memcpy(line, s, len);
    line[len] = '\0';
    s = nl + 1;
    if (len == 0) continue;
    if (line[0] == '#') {
      char kw[16], name[256], rest[8192];
      rest[0] = '\0';
      int k = sscanf(line, "# %15s %255s %8191[^\n]", kw, name, rest);
      if (k >= 2 && strcmp(kw, "TYPE") == 0) {
        if (!metric_name(name, strlen(name))) {
          snprintf(err, errlen, "line %d: bad metric name '%s'", lineno, name);
          goto out;
        }
        if (strcmp(rest, "counter") && strcmp(rest, "gauge") && strcmp(rest, "histogram") &&
            strcmp(rest, "summary") && strcmp(rest, "untyped")) {
          snprintf(err, errlen, "line %d: bad type '%s'", lineno, rest);
          goto out;
        }
        for (int i = 0; i < nfam; i++)
          if (strcmp(types[i], name) == 0) {
            snprintf(err, errlen, "line %d: second TYPE for %s", lineno, name);
            goto out;
          }
        if (strcmp(rest, "counter") == 0 &&
            (strlen(name) < 6 || strcmp(name + strlen(name) - 6, "_total") != 0)) {
          snprintf(err, errlen, "line %d: counter %s does not end in _total", lineno, name);
          goto out;
        }
        if (nfam == 512) goto out;
        snprintf(types[nfam], sizeof(types[nfam]), "%s", name);
        snprintf(kinds[nfam], sizeof(kinds[nfam]), "%.15s", rest);
        if (*num_names < max) snprintf(names[(*num_names)++], 128, "%.127s", name);
        nfam++;
      } else if (k >= 2 && strcmp(kw, "HELP") == 0) {
        if (!metric_name(name, strlen(name))) {
          snprintf(err, errlen, "line %d: bad metric name in HELP '%s'", lineno, name);
          goto out;
        }
      }
      continue;
    }
    /* A sample. */
    const char *p = line;
    size_t nlen = strcspn(p, "{ ");
    if (!metric_name(p, nlen)) {
      snprintf(err, errlen, "line %d: bad sample name", lineno);
      goto out;
    }
    char name[256];
    snprintf(name, sizeof(name), "%.*s", (int)nlen, p);
    int fam = -1;
    for (int i = 0; i < nfam; i++)
      if (strcmp(types[i], name) == 0) fam = i;
    /* A histogram's samples are its name with _bucket (labelled le), _sum
     * and _count. */
    static const char *const hsuffix[] = {"_bucket", "_sum", "_count"};
    for (int k = 0; fam < 0 && k < 3; k++) {
      size_t sl = strlen(hsuffix[k]), nl2 = strlen(name);
      if (nl2 <= sl || strcmp(name + nl2 - sl, hsuffix[k]) != 0) continue;
      for (int i = 0; i < nfam; i++)
        if (strlen(types[i]) == nl2 - sl && strncmp(types[i], name, nl2 - sl) == 0 &&
            (strcmp(kinds[i], "histogram") == 0 || (k > 0 && strcmp(kinds[i], "summary") == 0))) {
          fam = i;
          if (k == 0 && strstr(p + nlen, "le=\"") == NULL) {
            snprintf(err, errlen, "line %d: a bucket without le", lineno);
            goto out;
          }
        }
    }
    if (fam < 0) {
      snprintf(err, errlen, "line %d: sample of %s before its # TYPE", lineno, name);
      goto out;
    }
    p += nlen;
    const char *series_end = p;
    if (*p == '{') {
      p++;
      while (*p != '}') {
        size_t ln = strcspn(p, "=");
        if (ln == 0 || !(isalpha((unsigned char)p[0]) || p[0] == '_')) {
          snprintf(err, errlen, "line %d: bad label name", lineno);
          goto out;
        }
        for (size_t i = 0; i < ln; i++)
          if (!(isalnum((unsigned char)p[i]) || p[i] == '_')) {
            snprintf(err, errlen, "line %d: bad label name", lineno);
            goto out;
          }
        p += ln;
        if (p[0] != '=' || p[1] != '"') {
          snprintf(err, errlen, "line %d: label without a quoted value", lineno);
          goto out;
        }
        p += 2;
        while (*p && *p != '"') {
          if (*p == '\\') {
            if (p[1] != '\\' && p[1] != '"' && p[1] != 'n') {
              snprintf(err, errlen, "line %d: bad escape in a label value", lineno);
              goto out;
            }
            p++;
          }
          p++;
        }
        if (*p != '"') {
          snprintf(err, errlen, "line %d: unterminated label value", lineno);
          goto out;
        }
        p++;
        if (*p == ',') p++;
        else if (*p != '}') {
          snprintf(err, errlen, "line %d: expected , or }", lineno);
          goto out;
        }
      }
      p++;
      series_end = p;
    }
    if (*p != ' ') {
      snprintf(err, errlen, "line %d: no space before the value", lineno);
      goto out;
    }
    p++;
    char *end;
    double v = strtod(p, &end);
    if (end == p && strncmp(p, "+Inf", 4) && strncmp(p, "-Inf", 4) && strncmp(p, "NaN", 3)) {
      snprintf(err, errlen, "line %d: bad value '%s'", lineno, p);
      goto out;
    }
    if (strcmp(kinds[fam], "counter") == 0 && v < 0) {
      snprintf(err, errlen, "line %d: negative counter", lineno);
      goto out;
    }
    if (*end && *end != ' ') {
      snprintf(err, errlen, "line %d: junk after the value", lineno);
      goto out;
    }
    char *key = strndup(line, (size_t)(series_end - line));
    ASSERT_NOT_NULL(key);
    for (size_t i = 0; i < nseries; i++)
      if (strcmp(series[i], key) == 0) {
        snprintf(err, errlen, "line %d: series %s repeats", lineno, key);
        free(key);
        goto out;
      }
    char **ns = realloc(series, (nseries + 1) * sizeof(char *));
    ASSERT_NOT_NULL(ns);
    series = ns;
    series[nseries++] = key;
    samples++;
  }
  rc = samples;
out:
  for (size_t i = 0; i < nseries; i++) free(series[i]);
  free(series);
  return rc;
}

/* ------------------------------------------------------------------------ */

void tc_open_tmpdir(const char *dir) {
  ASSERT_OK(chmod(test_tmpdir(), 0755));
  if (dir) ASSERT_OK(chmod(dir, 0755));
}

int tc_open_as(const tc_cred *cred, const char *socket, const char *source, char *msg,
               size_t msglen) {
  int p[2];
  ASSERT_OK(pipe(p));
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    drop_to(cred);
    char out[1100];
    larder_client_t *c;
    int rc = larder_client_connect(socket, &c);
    if (rc == 0) {
      const char *src[1] = {source};
      larder_stream_options_t o;
      dh_opts(&o, src, 16, 1, 1);
      o.arena_bytes = 1u << 20;
      larder_stream_t *s;
      rc = larder_stream_open(c, &o, &s);
      if (rc == 0) {
        larder_batch_t *b;
        rc = larder_stream_next(s, 60000, &b);
        if (rc == 0) larder_batch_release(b);
        larder_stream_close(s);
      }
      snprintf(out, sizeof(out), "%s", rc ? larder_client_last_error(c) : "");
      larder_client_close(c);
    } else {
      snprintf(out, sizeof(out), "connect: %s", larder_strerror(rc));
    }
    int32_t code = rc;
    if (write(p[1], &code, sizeof(code)) < 0 || write(p[1], out, strlen(out) + 1) < 0) _exit(3);
    _exit(0);
  }
  close(p[1]);
  int32_t code = LARDER_EIO;
  char buf[1200] = "";
  ssize_t n = read(p[0], &code, sizeof(code));
  ssize_t m = n == sizeof(code) ? read(p[0], buf, sizeof(buf) - 1) : 0;
  if (m > 0) buf[m] = '\0';
  close(p[0]);
  int status;
  waitpid(pid, &status, 0);
  if (n != sizeof(code)) {
    snprintf(msg, msglen, "the child died (status 0x%x)", status);
    return LARDER_EIO;
  }
  snprintf(msg, msglen, "%s", buf);
  return code;
}

int tc_nginx_start(const char *dir, const char *root, const char *options) {
  if (access("/usr/sbin/nginx", X_OK) != 0 || access("tests/remote/nginx.sh", X_OK) != 0) return 0;
  char cmd[2048];
  snprintf(cmd, sizeof(cmd), "tests/remote/nginx.sh start '%s' '%s' --workers 1 --watch-pid %d %s",
           dir, root, (int)getpid(), options ? options : "");
  FILE *f = popen(cmd, "r");
  if (f == NULL) return 0;
  char line[4096] = "";
  if (fgets(line, sizeof(line), f) == NULL) line[0] = '\0';
  int st = pclose(f);
  if (st != 0) return 0;
  const char *p = strstr(line, "\"port\":");
  return p ? atoi(p + 7) : 0;
}

void tc_nginx_stop(const char *dir) {
  test_system("tests/remote/nginx.sh stop '%s' >/dev/null 2>&1", dir);
}

int tc_wait_log(const dh_daemon *d, const char *needle, int timeout_ms) {
  double deadline = test_now_ms() + timeout_ms;
  for (;;) {
    char *log = dh_read_log(d);
    int found = log && strstr(log, needle) != NULL;
    free(log);
    if (found) return 1;
    if (test_now_ms() > deadline) return 0;
    usleep(10000);
  }
}

void tc_expect_open(const tc_cred *cred, const char *socket, const char *source, int want,
                    const char *needle) {
  char msg[1200];
  int rc = tc_open_as(cred, socket, source, msg, sizeof(msg));
  if (rc != want)
    ASSERT_FAIL_("uid %u opening %s: %s (%s), expected %s", cred ? (unsigned)cred->uid : 0u, source,
                 larder_err_name(rc), msg, larder_err_name(want));
  if (needle) ASSERT_STR_CONTAINS(msg, needle);
}

int tc_need_root(void) {
  if (geteuid() == 0) return 0;
  fprintf(stderr, "these checks switch users: run as root\n");
  return 1;
}
