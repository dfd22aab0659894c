/*
 * ctl_daemon.c: the larderctl commands that talk to larderd: status,
 * stats, clients, ls, evict, prefetch, verify, reload, config, and
 * inspect / cat of remote URLs (the daemon fetches them with its
 * credentials, within its allowlist).
 *
 * Every command sends one AdminRequest on a fresh connection and prints
 * the AdminReply frames (more = 1 until the last).  The daemon renders the
 * text, or JSON with --json; larderctl renders only what is live on the
 * terminal: the stats view refreshed in place and prefetch's progress bar.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "wire.h"

const char *ctl_socket_path(void) {
  if (ctl_socket && *ctl_socket) return ctl_socket;
  const char *env = getenv("LARDER_SOCKET");
  return env && *env ? env : LARDER_DEFAULT_SOCKET;
}

/* ------------------------------------------------------------------------ */
/* The connection                                                            */

typedef struct ctl_conn {
  int fd;
  uint8_t *buf;
  size_t len, cap;
} ctl_conn_t;

static int send_frame(int fd, const Larder__Frame *f) {
  size_t len;
  uint8_t *buf = wire_encode(f, &len);
  if (buf == NULL) return LARDER_ENOMEM;
  size_t off = 0;
  while (off < len) {
    ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      free(buf);
      return LARDER_ECLOSED;
    }
    off += (size_t)n;
  }
  free(buf);
  return 0;
}

/* The next frame, waiting up to timeout_ms (-1: forever).  NULL with *rc
 * set at the end of the connection, on a timeout or on garbage. */
static Larder__Frame *recv_frame(ctl_conn_t *c, int timeout_ms, int *rc) {
  for (;;) {
    int64_t n = wire_frame_ready(c->buf, c->len, WIRE_MAX_FRAME);
    if (n < 0) {
      *rc = LARDER_EPROTO;
      return NULL;
    }
    if (n > 0 && c->buf) {
      Larder__Frame *f = wire_decode(c->buf, (size_t)n, 0, NULL);
      if (c->len > (size_t)n) memmove(c->buf, c->buf + n, c->len - (size_t)n);
      c->len -= (size_t)n;
      if (f == NULL) *rc = LARDER_EPROTO;
      return f;
    }
    if (c->cap - c->len < 65536) {
      size_t cap = c->cap ? c->cap * 2 : 131072;
      uint8_t *p = realloc(c->buf, cap);
      if (p == NULL) {
        *rc = LARDER_ENOMEM;
        return NULL;
      }
      c->buf = p;
      c->cap = cap;
    }
    struct pollfd pfd = {c->fd, POLLIN, 0};
    int pr = poll(&pfd, 1, timeout_ms);
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) {
      *rc = LARDER_ETIMEDOUT;
      return NULL;
    }
    ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *rc = LARDER_ECLOSED;
      return NULL;
    }
    c->len += (size_t)r;
  }
}

static void ctl_disconnect(ctl_conn_t *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  free(c->buf);
  c->buf = NULL;
  c->len = c->cap = 0;
}

/* Connects and says Hello.  Returns 0, or a code with a message for
 * people in err. */
static int ctl_connect(ctl_conn_t *c, char *err, size_t errlen) {
  memset(c, 0, sizeof(*c));
  const char *path = ctl_socket_path();
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return LARDER_ECONNECT;
  }
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof(addr.sun_path)) {
    snprintf(err, errlen, "socket path too long: %s", path);
    ctl_disconnect(c);
    return LARDER_ECONNECT;
  }
  memcpy(addr.sun_path, path, strlen(path) + 1);
  if (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
    int e = errno;
    if (e == ENOENT || e == ECONNREFUSED)
      snprintf(err, errlen,
               "cannot connect to larderd at %s: %s (is it running? --socket or $LARDER_SOCKET "
               "choose another socket)",
               path, strerror(e));
    else if (e == EACCES || e == EPERM)
      snprintf(err, errlen,
               "cannot connect to larderd at %s: %s (the socket admits its group only: is this "
               "user in the larder group?)",
               path, strerror(e));
    else snprintf(err, errlen, "cannot connect to larderd at %s: %s", path, strerror(e));
    ctl_disconnect(c);
    return LARDER_ECONNECT;
  }
  Larder__Hello h = LARDER__HELLO__INIT;
  h.protocol_version = WIRE_PROTOCOL_VERSION;
  h.client_name = (char *)"larderctl/0.1";
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_HELLO;
  f.hello = &h;
  int rc = send_frame(c->fd, &f);
  Larder__Frame *r = rc ? NULL : recv_frame(c, 30000, &rc);
  if (r && r->msg_case == LARDER__FRAME__MSG_HELLO_REPLY) {
    wire_free(r);
    return 0;
  }
  if (r && r->msg_case == LARDER__FRAME__MSG_ERROR) {
    snprintf(err, errlen, "larderd refused the connection: %s",
             r->error->message ? r->error->message : larder_strerror(r->error->code));
    rc = r->error->code ? r->error->code : LARDER_EPROTO;
  } else {
    snprintf(err, errlen, "larderd at %s did not answer the handshake (%s)", path,
             larder_strerror(rc ? rc : LARDER_EPROTO));
    if (rc == 0) rc = LARDER_EPROTO;
  }
  wire_free(r);
  ctl_disconnect(c);
  return rc;
}

static int send_request(ctl_conn_t *c, uint32_t id, const char *command, char **args, size_t nargs,
                        int json, int dry_run) {
  Larder__AdminRequest req = LARDER__ADMIN_REQUEST__INIT;
  req.request_id = id;
  req.command = (char *)command;
  req.args = args;
  req.n_args = nargs;
  req.json = json;
  req.dry_run = dry_run;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_ADMIN_REQUEST;
  f.admin_request = &req;
  return send_frame(c->fd, &f);
}

/* What a command does with each reply frame: return 0 to go on. */
typedef int (*reply_fn)(const Larder__AdminReply *r, void *arg);

/* The error output of a failed command: "larderctl: MESSAGE" on stderr, or,
 * with --json, {"error":{"code":"LARDER_...","message":"..."}} on stdout
 * as well, so that a script reading JSON always gets JSON.  Returns code. */
int ctl_fail(int json, int code, const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  size_t n = strlen(msg);
  while (n && msg[n - 1] == '\n') msg[--n] = '\0';
  fprintf(stderr, "larderctl: %s\n", msg);
  if (json) {
    printf("{\"error\":{\"code\":\"%s\",\"message\":\"", larder_err_name(code ? code : LARDER_EIO));
    for (const char *q = msg; *q; q++) {
      unsigned char ch = (unsigned char)*q;
      if (ch == '"' || ch == '\\') printf("\\%c", ch);
      else if (ch < 0x20) printf("\\u%04x", ch);
      else putchar(ch);
    }
    printf("\"}}\n");
    fflush(stdout);
  }
  return code;
}

/* Sends one request and hands every reply frame to fn until the last.
 * Returns the final code (0, the daemon's error code, or a connection
 * error, reported on stderr). */
static int run_request(ctl_conn_t *c, uint32_t id, const char *command, char **args, size_t nargs,
                       int json, int dry_run, reply_fn fn, void *arg) {
  int rc = send_request(c, id, command, args, nargs, json, dry_run);
  if (rc) return ctl_fail(json, rc, "cannot send the request: %s", larder_strerror(rc));
  for (;;) {
    Larder__Frame *f = recv_frame(c, -1, &rc);
    if (f == NULL)
      return ctl_fail(json, rc ? rc : LARDER_ECLOSED, "%s",
                      rc == LARDER_ECLOSED ? "larderd closed the connection (did it stop?)"
                                           : larder_strerror(rc));
    if (f->msg_case == LARDER__FRAME__MSG_ERROR) {
      rc = f->error->code ? f->error->code : LARDER_EPROTO;
      ctl_fail(json, rc, "%s",
               f->error->message && *f->error->message ? f->error->message
                                                       : larder_strerror(f->error->code));
      wire_free(f);
      return rc;
    }
    if (f->msg_case != LARDER__FRAME__MSG_ADMIN_REPLY || f->admin_reply->request_id != id) {
      wire_free(f);
      continue;
    }
    const Larder__AdminReply *r = f->admin_reply;
    int more = r->more;
    int code = r->code;
    if (code && !more) {
      ctl_fail(json, code, "%s", r->text && *r->text ? r->text : larder_strerror(code));
      wire_free(f);
      return code;
    }
    int stop = fn ? fn(r, arg) : 0;
    wire_free(f);
    if (stop) return stop;
    if (!more) return 0;
  }
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */

typedef struct collect {
  char *p;
  size_t len, cap;
} collect_t;

static int collect_reply(const Larder__AdminReply *r, void *arg) {
  collect_t *c = arg;
  size_t n = r->text ? strlen(r->text) : 0;
  if (c->len + n + 2 > c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 65536;
    while (cap < c->len + n + 2) cap *= 2;
    char *p = realloc(c->p, cap);
    if (p == NULL) return LARDER_ENOMEM;
    c->p = p;
    c->cap = cap;
  }
  memcpy(c->p + c->len, r->text ? r->text : "", n);
  c->len += n;
  c->p[c->len] = '\0';
  return 0;
}

static int print_reply(const Larder__AdminReply *r, void *arg) {
  (void)arg;
  if (r->text && *r->text) fputs(r->text, stdout);
  return 0;
}

static void print_text(const char *t) {
  if (t == NULL || *t == '\0') return;
  fputs(t, stdout);
  size_t n = strlen(t);
  if (t[n - 1] != '\n') fputc('\n', stdout);
}

static int exit_status(int rc) {
  if (rc == 0) return 0;
  return 1;
}

/* One request, its whole answer printed. */
static int simple(const char *command, char **args, size_t nargs, int json, int dry_run) {
  ctl_conn_t c;
  char err[1024];
  if (ctl_connect(&c, err, sizeof(err)) != 0) {
    ctl_fail(json, LARDER_ECONNECT, "%s", err);
    return 1;
  }
  collect_t out = {0};
  int rc = run_request(&c, 1, command, args, nargs, json, dry_run, collect_reply, &out);
  ctl_disconnect(&c);
  if (rc == 0) print_text(out.p);
  free(out.p);
  fflush(stdout);
  return exit_status(rc);
}

static void human_bytes(char *buf, size_t size, double v) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static void human_dur(char *buf, size_t size, double s) {
  if (!isfinite(s) || s < 0) snprintf(buf, size, "?");
  else if (s < 10) snprintf(buf, size, "%.1fs", s);
  else if (s < 60) snprintf(buf, size, "%.0fs", s);
  else if (s < 3600) snprintf(buf, size, "%dm %02ds", (int)(s / 60), (int)s % 60);
  else snprintf(buf, size, "%dh %02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

/* Minimal readers for the flat JSON objects prefetch sends. */
/* A number member of a JSON object (jansson), or -1 when absent or null. */
static int json_num(const json_t *js, const char *key, double *out) {
  const json_t *v = json_is_object(js) ? json_object_get(js, key) : NULL;
  if (v == NULL || !json_is_number(v)) return -1;
  *out = json_number_value(v);
  return 0;
}

static double json_num_or(const json_t *js, const char *key, double dflt) {
  double v;
  return json_num(js, key, &v) == 0 ? v : dflt;
}

/* A string member, as UTF-8 (jansson decodes every escape), into out. */
static int json_str(const json_t *js, const char *key, char *out, size_t size) {
  const json_t *v = json_is_object(js) ? json_object_get(js, key) : NULL;
  if (v == NULL || !json_is_string(v) || size == 0) return -1;
  snprintf(out, size, "%s", json_string_value(v));
  return 0;
}

/* ------------------------------------------------------------------------ */
/* status                                                                    */

int ctl_cmd_status(int json) {
  ctl_conn_t c;
  char err[1024];
  if (ctl_connect(&c, err, sizeof(err)) != 0) {
    if (json) {
      printf("{\"up\":false,\"socket\":\"");
      for (const char *p = ctl_socket_path(); *p; p++) {
        if (*p == '"' || *p == '\\') putchar('\\');
        putchar(*p);
      }
      printf("\",\"error\":\"");
      for (const char *p = err; *p; p++) {
        if (*p == '"' || *p == '\\') putchar('\\');
        if ((unsigned char)*p >= 0x20) putchar(*p);
      }
      printf("\"}\n");
    } else if (strstr(err, "(is it running?")) {
      printf("larderd is not running: %s\n", err);
    } else {
      printf("larderd cannot be reached: %s\n", err);
    }
    return 1;
  }
  collect_t out = {0};
  int rc = run_request(&c, 1, "status", NULL, 0, json, 0, collect_reply, &out);
  ctl_disconnect(&c);
  if (rc == 0) print_text(out.p);
  free(out.p);
  return exit_status(rc);
}

/* ------------------------------------------------------------------------ */
/* stats [--watch]                                                           */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
  (void)sig;
  interrupted = 1;
}

int ctl_cmd_stats(int json, int watch, double interval, long count) {
  if (!watch) return simple("stats", NULL, 0, json, 0);
  ctl_conn_t c;
  char err[1024];
  if (ctl_connect(&c, err, sizeof(err)) != 0) {
    ctl_fail(json, LARDER_ECONNECT, "%s", err);
    return 1;
  }
  int tty = isatty(1) && !json;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_sigint;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  if (tty) fputs("\033[?25l\033[H\033[2J", stdout); /* hide the cursor, clear */
  int status = 0;
  uint32_t id = 1;
  for (long n = 0; !interrupted && (count <= 0 || n < count); n++) {
    collect_t out = {0};
    int rc = run_request(&c, id++, "stats", NULL, 0, json, 0, collect_reply, &out);
    if (rc) {
      free(out.p);
      status = 1;
      break;
    }
    if (tty) {
      /* Redraw in place: home, each line erased to its end, then the rest
       * of the screen. */
      time_t now = time(NULL);
      struct tm tm;
      localtime_r(&now, &tm);
      char when[16];
      strftime(when, sizeof(when), "%H:%M:%S", &tm);
      printf(
          "\033[H\033[7m larderctl stats --watch · every %gs · %s · Ctrl-C to stop "
          "\033[0m\033[K\n\033[K\n",
          interval, when);
      for (char *line = out.p, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        printf("%s\033[K\n", line);
        if (!nl) break;
      }
      fputs("\033[J", stdout);
    } else if (json) {
      print_text(out.p);
    } else {
      time_t now = time(NULL);
      printf("---- %s", ctime(&now));
      print_text(out.p);
      putchar('\n');
    }
    fflush(stdout);
    free(out.p);
    if (count > 0 && n + 1 >= count) break;
    /* Sleep in slices so that Ctrl-C is prompt. */
    double left = interval;
    while (left > 0 && !interrupted) {
      double step = left < 0.1 ? left : 0.1;
      struct timespec ts = {(time_t)step, (long)((step - (double)(time_t)step) * 1e9)};
      nanosleep(&ts, NULL);
      left -= step;
    }
  }
  if (tty) fputs("\033[?25h", stdout);
  fflush(stdout);
  ctl_disconnect(&c);
  return status;
}

/* ------------------------------------------------------------------------ */
/* Commands with a plain answer                                              */

int ctl_cmd_simple(const char *command, char **args, size_t nargs, int json, int dry_run) {
  return simple(command, args, nargs, json, dry_run);
}

/* ------------------------------------------------------------------------ */
/* prefetch                                                                  */

typedef struct progress {
  int json, tty;
  double last_print;
  int bar_shown;
  int failed;
  char dataset[1024];
} progress_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void progress_line(const json_t *js, progress_t *p, char *line, size_t size, int bar) {
  double total = json_num_or(js, "total_bytes", 0), done = json_num_or(js, "done_bytes", 0);
  double rate = json_num_or(js, "bytes_per_s", 0), eta = json_num_or(js, "eta_s", -1);
  double units = json_num_or(js, "units", 0), units_done = json_num_or(js, "units_done", 0);
  double frac = total > 0 ? done / total : 1;
  if (frac > 1) frac = 1;
  char a[32], b[32], e[32];
  human_bytes(a, sizeof(a), done);
  human_bytes(b, sizeof(b), total);
  if (eta >= 0) human_dur(e, sizeof(e), eta);
  else snprintf(e, sizeof(e), "?");
  size_t o = 0;
  if (bar) {
    const int width = 28;
    int n = (int)(frac * width);
    o += (size_t)snprintf(line + o, size - o, "[");
    for (int i = 0; i < width && o + 2 < size; i++) line[o++] = i < n ? '#' : (i == n ? '>' : '.');
    o += (size_t)snprintf(line + o, size - o, "] ");
  } else {
    o += (size_t)snprintf(line + o, size - o, "prefetch: ");
  }
  /* Decoded bytes (the estimate the bar and the ETA follow), then what was
   * fetched for them from remote sources, when anything was. */
  double fetched = json_num_or(js, "fetched_bytes", 0);
  double frate = json_num_or(js, "fetched_bytes_per_s", 0);
  char f[96] = "";
  if (fetched > 0) {
    char fb[32], fr[32];
    human_bytes(fb, sizeof(fb), fetched);
    human_bytes(fr, sizeof(fr), frate);
    snprintf(f, sizeof(f), ", %s fetched (%s/s)", fb, fr);
  }
  if (frac >= 1 || units_done >= units)
    snprintf(line + o, size - o, "%3.0f%%  %s / %s decoded%s  (%.0f/%.0f units)", frac * 100, a, b,
             f, units_done, units);
  else if (rate <= 0 || eta < 0)
    snprintf(line + o, size - o, "%3.0f%%  %s / %s decoded%s  (%.0f/%.0f units, starting)",
             frac * 100, a, b, f, units_done, units);
  else
    snprintf(line + o, size - o, "%3.0f%%  %s / %s decoded%s  %.1f MB/s  ETA %s  (%.0f/%.0f units)",
             frac * 100, a, b, f, rate / 1e6, e, units_done, units);
  (void)p;
}

static int on_prefetch_event(const Larder__AdminReply *r, const json_t *js, progress_t *p);

static int on_prefetch_reply(const Larder__AdminReply *r, void *arg) {
  progress_t *p = arg;
  json_t *js = json_loads(r->text ? r->text : "", 0, NULL);
  if (p->json) {
    print_text(r->text ? r->text : "");
    fflush(stdout);
    if (!r->more && json_num_or(js, "failed_units", 0) > 0) p->failed = 1;
    json_decref(js);
    return 0;
  }
  int rc = on_prefetch_event(r, js, p);
  json_decref(js);
  return rc;
}

/* Prints one prefetch event (start, progress, done) for a person. */
static int on_prefetch_event(const Larder__AdminReply *r, const json_t *js, progress_t *p) {
  (void)r;
  char ev[32] = "";
  json_str(js, "event", ev, sizeof(ev));
  char line[512], a[32], b[32];
  if (strcmp(ev, "start") == 0) {
    json_str(js, "dataset", p->dataset, sizeof(p->dataset));
    human_bytes(a, sizeof(a), json_num_or(js, "total_bytes", 0));
    printf("prefetch %s: %.0f files, %.0f units, %s decoded (estimated)\n", p->dataset,
           json_num_or(js, "files", 0), json_num_or(js, "units", 0), a);
    double before = json_num_or(js, "cached_before_units", 0);
    if (before > 0) {
      human_bytes(b, sizeof(b), json_num_or(js, "cached_before_bytes", 0));
      printf("already cached: %.0f units (%s)%s\n", before, b,
             before >= json_num_or(js, "units", 0) ? "" : "; fetching the rest");
    }
    fflush(stdout);
    p->last_print = now_s();
  } else if (strcmp(ev, "progress") == 0) {
    if (p->tty) {
      progress_line(js, p, line, sizeof(line), 1);
      printf("\r%s\033[K", line);
      p->bar_shown = 1;
      fflush(stdout);
    } else if (now_s() - p->last_print >= 1.0) {
      progress_line(js, p, line, sizeof(line), 0);
      printf("%s\n", line);
      fflush(stdout);
      p->last_print = now_s();
    }
  } else if (strcmp(ev, "done") == 0) {
    if (p->tty) {
      progress_line(js, p, line, sizeof(line), 1);
      printf("\r%s\033[K\n", line);
    } else {
      progress_line(js, p, line, sizeof(line), 0);
      printf("%s\n", line);
    }
    char e[32];
    human_dur(e, sizeof(e), json_num_or(js, "elapsed_s", 0));
    human_bytes(a, sizeof(a), json_num_or(js, "cache_used_bytes", 0));
    human_bytes(b, sizeof(b), json_num_or(js, "cache_capacity_bytes", 0));
    double now_units = json_num_or(js, "cached_units", 0);
    double before = json_num_or(js, "cached_before_units", 0);
    double na = json_num_or(js, "not_admitted_units", 0);
    double failed = json_num_or(js, "failed_units", 0);
    printf(
        "done in %s: %.0f units cached now, %.0f were cached already; the cache holds %s of %s\n",
        e, now_units, before, a, b);
    char admission[160] = "";
    json_str(js, "admission", admission, sizeof(admission));
    /* When admission is off (a full disk, failing writes), the note says so
     * rather than blame the cache's ranking: more capacity helps nothing
     * there. */
    if (na > 0 && admission[0] && strcmp(admission, "on") != 0)
      printf("note: %.0f units were decoded but not kept: cache admission is %s\n", na, admission);
    else if (na > 0)
      printf(
          "note: %.0f units were decoded but not kept: the cache prefers data it ranks "
          "higher (raise cache_capacity to keep them all)\n",
          na);
    if (failed > 0) {
      char msg[1024] = "";
      json_str(js, "error", msg, sizeof(msg));
      fprintf(stderr, "larderctl: %.0f units failed to load: %s\n", failed, msg);
      p->failed = 1;
    }
    fflush(stdout);
  }
  return 0;
}

int ctl_cmd_prefetch(char **args, size_t nargs, int json) {
  ctl_conn_t c;
  char err[1024];
  if (ctl_connect(&c, err, sizeof(err)) != 0) {
    ctl_fail(json, LARDER_ECONNECT, "%s", err);
    return 1;
  }
  progress_t p;
  memset(&p, 0, sizeof(p));
  p.json = json;
  p.tty = isatty(1);
  int rc = run_request(&c, 1, "prefetch", args, nargs, 1, 0, on_prefetch_reply, &p);
  if (rc && p.tty && p.bar_shown) fputs("\n", stdout);
  ctl_disconnect(&c);
  fflush(stdout);
  return rc || p.failed ? 1 : 0;
}

/* ------------------------------------------------------------------------ */
/* inspect and cat of URLs                                                   */

int ctl_inspect_remote(const char *url, int json) {
  char *args[1] = {(char *)url};
  return simple("inspect", args, 1, json, 0);
}

int ctl_cat_remote(const char *url, const char *columns, int64_t offset, int64_t limit,
                   int no_verify_crc, uint64_t max_chunk) {
  char bufs[4][96];
  char *args[6];
  size_t n = 0;
  args[n++] = (char *)url;
  char *cols = NULL;
  if (columns && *columns) {
    size_t len = strlen(columns) + 16;
    cols = malloc(len);
    if (cols == NULL) return 1;
    snprintf(cols, len, "--columns=%s", columns);
    args[n++] = cols;
  }
  if (offset > 0) {
    snprintf(bufs[0], sizeof(bufs[0]), "--offset=%" PRId64, offset);
    args[n++] = bufs[0];
  }
  if (limit >= 0) {
    snprintf(bufs[1], sizeof(bufs[1]), "--limit=%" PRId64, limit);
    args[n++] = bufs[1];
  }
  if (no_verify_crc) {
    snprintf(bufs[2], sizeof(bufs[2]), "--no-verify-crc");
    args[n++] = bufs[2];
  }
  if (max_chunk) {
    snprintf(bufs[3], sizeof(bufs[3]), "--max-chunk-bytes=%" PRIu64, max_chunk);
    args[n++] = bufs[3];
  }
  ctl_conn_t c;
  char err[1024];
  if (ctl_connect(&c, err, sizeof(err)) != 0) {
    ctl_fail(0, LARDER_ECONNECT, "%s", err);
    free(cols);
    return 1;
  }
  /* Rows stream out as they come. */
  int rc = run_request(&c, 1, "cat", args, n, 0, 0, print_reply, NULL);
  ctl_disconnect(&c);
  free(cols);
  fflush(stdout);
  return exit_status(rc);
}
