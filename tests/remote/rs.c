/*
 * rs.c: starting, controlling and stopping the loopback test servers of
 * tests/remote from C tests (see rs.h).
 */
#include "rs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RS_START_TIMEOUT_MS 30000
#define RS_MAX_ARGS 64

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *remote_dir(void) {
  const char *d = getenv("LARDER_REMOTE_DIR");
  return d && *d ? d : "tests/remote";
}

static void kill_and_reap(pid_t pid) {
  kill(pid, SIGKILL);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
}

int rs_start(rs_server *s, const char *const argv[], const char *stderr_path, int timeout_ms) {
  memset(s, 0, sizeof(*s));
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    perror("rs_start: pipe");
    return -1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    perror("rs_start: fork");
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    int in = open("/dev/null", O_RDONLY);
    if (in >= 0) dup2(in, STDIN_FILENO);
    if (stderr_path) {
      int err = open(stderr_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (err >= 0) dup2(err, STDERR_FILENO);
    }
    execvp(argv[0], (char *const *)argv);
    fprintf(stderr, "rs_start: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  /* Read up to the first newline. */
  size_t n = 0;
  int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : RS_START_TIMEOUT_MS);
  int ok = 0;
  while (n + 1 < sizeof(s->ready)) {
    int64_t left = deadline - now_ms();
    if (left <= 0) {
      fprintf(stderr, "rs_start: %s: no ready line within the timeout\n", argv[0]);
      break;
    }
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    int r = poll(&p, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t got = read(fds[0], s->ready + n, 1);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      fprintf(stderr, "rs_start: %s exited before it was ready%s%s\n", argv[0],
              stderr_path ? "; see " : "", stderr_path ? stderr_path : "");
      break;
    }
    if (s->ready[n] == '\n') {
      ok = 1;
      break;
    }
    n++;
  }
  s->ready[n] = '\0';
  /* The rest of stdout is not read: it must not block the child, and the
   * servers print nothing more, so closing our end is fine. */
  close(fds[0]);
  if (!ok) {
    kill_and_reap(pid);
    return -1;
  }
  s->pid = pid;
  s->port = (int)rs_json_int(s->ready, "port", 0);
  if (s->port <= 0) {
    fprintf(stderr, "rs_start: no port in the ready line: %s\n", s->ready);
    kill_and_reap(pid);
    s->pid = 0;
    return -1;
  }
  snprintf(s->url, sizeof(s->url), "http://127.0.0.1:%d", s->port);
  return 0;
}

/* Builds argv: prefix..., extra..., NULL. */
static int build_argv(const char **out, const char *const *prefix, int nprefix,
                      const char *const extra[]) {
  int n = 0;
  for (int i = 0; i < nprefix; i++) out[n++] = prefix[i];
  for (int i = 0; extra && extra[i]; i++) {
    if (n >= RS_MAX_ARGS - 1) return -1;
    out[n++] = extra[i];
  }
  out[n] = NULL;
  return 0;
}

static int start_node(rs_server *s, const char *script, const char *dir, const char *const *prefix,
                      int nprefix, const char *const extra[]) {
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "rs: mkdir %s: %s\n", dir, strerror(errno));
    return -1;
  }
  char path[1024], log[1024], err[1024], data[1024], watch[32];
  snprintf(path, sizeof(path), "%s/%s", remote_dir(), script);
  snprintf(log, sizeof(log), "%s/%s.log", dir, script);
  snprintf(err, sizeof(err), "%s/%s.stderr", dir, script);
  snprintf(data, sizeof(data), "%s/s3data", dir);
  snprintf(watch, sizeof(watch), "%d", (int)getpid());
  const char *pre[16] = {"node", path, "--log", log, "--watch-pid", watch};
  int np = 6;
  for (int i = 0; i < nprefix && np < 14; i++) pre[np++] = prefix[i];
  if (strcmp(script, "s3front.mjs") == 0) {
    pre[np++] = "--data";
    pre[np++] = data;
  }
  const char *argv[RS_MAX_ARGS];
  if (build_argv(argv, pre, np, extra) != 0) return -1;
  return rs_start(s, argv, err, RS_START_TIMEOUT_MS);
}

int rs_start_s3front(rs_server *s, const char *dir, const char *const extra[]) {
  return start_node(s, "s3front.mjs", dir, NULL, 0, extra);
}

int rs_start_faultproxy(rs_server *s, const char *upstream, const char *dir,
                        const char *const extra[]) {
  const char *pre[] = {"--upstream", upstream};
  return start_node(s, "faultproxy.mjs", dir, pre, 2, extra);
}

int rs_start_nginx(rs_server *s, const char *dir, const char *root, const char *const extra[]) {
  char script[1024], err[1024], watch[32];
  snprintf(script, sizeof(script), "%s/nginx.sh", remote_dir());
  snprintf(err, sizeof(err), "%s.stderr", dir);
  snprintf(watch, sizeof(watch), "%d", (int)getpid());
  const char *pre[] = {"bash", script, "run", dir, root, "--watch-pid", watch};
  const char *argv[RS_MAX_ARGS];
  if (build_argv(argv, pre, 7, extra) != 0) return -1;
  return rs_start(s, argv, err, RS_START_TIMEOUT_MS);
}

int rs_stop(rs_server *s, int timeout_ms) {
  if (s->pid <= 0) return 0;
  kill(s->pid, SIGTERM);
  int64_t deadline = now_ms() + timeout_ms;
  for (;;) {
    int st;
    pid_t r = waitpid(s->pid, &st, WNOHANG);
    if (r == s->pid) {
      s->pid = 0;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (r < 0 && errno != EINTR) {
      s->pid = 0;
      return -1;
    }
    if (now_ms() >= deadline) break;
    usleep(10000);
  }
  fprintf(stderr, "rs_stop: pid %d did not stop within %d ms; SIGKILL\n", (int)s->pid, timeout_ms);
  kill_and_reap(s->pid);
  s->pid = 0;
  return -1;
}

int rs_http(int port, const char *method, const char *path, const char *body, char **reply) {
  if (reply) *reply = NULL;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    fprintf(stderr, "rs_http: connect 127.0.0.1:%d: %s\n", port, strerror(errno));
    close(fd);
    return -1;
  }
  size_t blen = body ? strlen(body) : 0;
  size_t cap = strlen(path) + blen + 256;
  char *req = malloc(cap);
  if (req == NULL) {
    close(fd);
    return -1;
  }
  int hl = snprintf(req, cap,
                    "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n"
                    "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                    method, path, port, blen);
  if (body) memcpy(req + hl, body, blen);
  size_t total = (size_t)hl + blen, off = 0;
  while (off < total) {
    ssize_t w = write(fd, req + off, total - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += (size_t)w;
  }
  free(req);
  size_t size = 0, rcap = 4096;
  char *buf = malloc(rcap);
  if (buf == NULL) {
    close(fd);
    return -1;
  }
  for (;;) {
    if (size + 1024 > rcap) {
      char *nb = realloc(buf, rcap * 2);
      if (nb == NULL) break;
      buf = nb;
      rcap *= 2;
    }
    ssize_t r = read(fd, buf + size, rcap - size - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    size += (size_t)r;
  }
  close(fd);
  buf[size] = '\0';
  int status = -1;
  if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) status = -1;
  if (reply && status > 0) {
    const char *b = strstr(buf, "\r\n\r\n");
    *reply = strdup(b ? b + 4 : "");
  }
  free(buf);
  return status;
}

int rs_control(const rs_server *s, const char *json) {
  char *reply = NULL;
  int st = rs_http(s->port, "POST", "/__control", json, &reply);
  if (st != 200) fprintf(stderr, "rs_control: %d: %s\n", st, reply ? reply : "(no reply)");
  free(reply);
  return st == 200 ? 0 : -1;
}

char *rs_stats(const rs_server *s) {
  char *reply = NULL;
  int st = rs_http(s->port, "GET", "/__stats", NULL, &reply);
  if (st != 200) {
    free(reply);
    return NULL;
  }
  return reply;
}

/* ------------------------------------------------------------------------ */
/* A minimal JSON walk, enough for the servers' own replies.                */

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
  return p;
}

/* Past a JSON string starting at p (on the quote); NULL if malformed. */
static const char *skip_string(const char *p) {
  for (p++; *p; p++) {
    if (*p == '\\' && p[1]) p++;
    else if (*p == '"') return p + 1;
  }
  return NULL;
}

/* Past any JSON value at p; NULL if malformed. */
static const char *skip_value(const char *p) {
  p = skip_ws(p);
  if (*p == '"') return skip_string(p);
  if (*p == '{' || *p == '[') {
    int depth = 0;
    while (*p) {
      if (*p == '"') {
        p = skip_string(p);
        if (p == NULL) return NULL;
        continue;
      }
      if (*p == '{' || *p == '[') depth++;
      if (*p == '}' || *p == ']') {
        if (--depth == 0) return p + 1;
      }
      p++;
    }
    return NULL;
  }
  while (*p && *p != ',' && *p != '}' && *p != ']') p++;
  return p;
}

int64_t rs_json_int(const char *json, const char *path, int64_t def) {
  const char *p = skip_ws(json);
  if (*p != '{') return def;
  p++;
  for (;;) {
    p = skip_ws(p);
    if (*p != '"') return def;
    const char *k = p + 1;
    const char *end = skip_string(p);
    if (end == NULL) return def;
    size_t klen = (size_t)(end - 1 - k);
    p = skip_ws(end);
    if (*p != ':') return def;
    p = skip_ws(p + 1);
    if (strncmp(path, k, klen) == 0) {
      if (path[klen] == '\0') {
        char *e;
        long long v = strtoll(p, &e, 10);
        return e == p ? def : (int64_t)v;
      }
      if (path[klen] == '.' && *p == '{') {
        int64_t v = rs_json_int(p, path + klen + 1, INT64_MIN);
        if (v != INT64_MIN) return v;
      }
    }
    p = skip_value(p);
    if (p == NULL) return def;
    p = skip_ws(p);
    if (*p == ',') {
      p++;
      continue;
    }
    return def;
  }
}
