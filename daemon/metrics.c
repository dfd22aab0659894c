/*
 * metrics.c: the Prometheus exposition text, its HTTP endpoint and its
 * node_exporter textfile.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "server.h"
#include "util.h"

#define METRICS_MAX_CONNS 64
#define METRICS_MAX_REQUEST 8192
#define METRICS_TIMEOUT_MS 10000

typedef struct mconn mconn_t;

typedef struct metrics {
  server_t *srv;
  uv_tcp_t listener;
  int listening;
  char endpoint[300];
  uv_timer_t textfile_timer;
  int timer_init;
  uint64_t interval_s;
  char *textfile;
  mconn_t *conns;
  int num_conns;
  int stopped;
} metrics_t;

struct mconn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  metrics_t *m;
  char req[METRICS_MAX_REQUEST];
  size_t len;
  int responded;
  int closing;
  int handles;          /* open handles (tcp, timer) */
  char *resp;
  mconn_t *next, *prev;
};

/* ------------------------------------------------------------------------ */
/* The text                                                                  */

static void label_value(FILE *out, const char *s) {
  for (; *s; s++) {
    if (*s == '\\') fputs("\\\\", out);
    else if (*s == '"') fputs("\\\"", out);
    else if (*s == '\n') fputs("\\n", out);
    else fputc(*s, out);
  }
}

static void family(FILE *out, const char *name, const char *type, const char *help) {
  fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(FILE *out, const char *name, const char *type, const char *help, double v) {
  family(out, name, type, help);
  fprintf(out, "%s %.17g\n", name, v);
}

void metrics_render(server_t *srv, FILE *out, int up) {
  one(out, "larder_up", "gauge", "1 while larderd serves", up);
  family(out, "larder_build_info", "gauge", "larderd's version (always 1)");
  fprintf(out, "larder_build_info{version=\"%s\"} 1\n", LARDERD_VERSION);
  one(out, "larder_uptime_seconds", "gauge", "seconds since larderd started",
      (double)(util_now_ns() - srv->started_ns) / 1e9);
  one(out, "larder_start_time_seconds", "gauge", "unix time larderd started",
      (double)srv->started_unix);
  /* The single definition in stats.h. */
#define METRICS_GLOBAL_(name, kind, help)                                        \
  {                                                                              \
    int counter_ = strcmp(#kind, "COUNTER") == 0;                                \
    const char *n_ = counter_ ? "larder_" #name "_total" : "larder_" #name;      \
    one(out, n_, counter_ ? "counter" : "gauge", help,                           \
        (double)STATS_GET(&srv->stats, name));                                   \
  }
  STATS_GLOBAL(METRICS_GLOBAL_)
#undef METRICS_GLOBAL_
  if (srv->store) {
    store_stats_t st;
    store_stats_get(srv->store, &st);
    one(out, "larder_cache_capacity_bytes", "gauge", "bytes of decoded data the cache keeps at most",
        (double)st.capacity_bytes);
    one(out, "larder_cache_used_bytes", "gauge", "bytes cached", (double)st.used_bytes);
    one(out, "larder_cache_reserved_bytes", "gauge", "bytes reserved for units being written",
        (double)st.reserved_bytes);
    one(out, "larder_cache_entries", "gauge", "cached values (one per column of a unit)",
        (double)st.entries);
    one(out, "larder_cache_objects", "gauge", "files and objects with cached values",
        (double)st.objects);
    one(out, "larder_cache_admission_disabled", "gauge",
        "1 while the disk is full and nothing is admitted", st.admission_disabled ? 1 : 0);
    one(out, "larder_cache_lookup_hits_total", "counter", "cache lookups that hit", (double)st.hits);
    one(out, "larder_cache_lookup_misses_total", "counter", "cache lookups that missed",
        (double)st.misses);
    one(out, "larder_cache_lookup_hit_bytes_total", "counter", "bytes read by lookups that hit",
        (double)st.hit_bytes);
    one(out, "larder_cache_puts_total", "counter", "values written", (double)st.puts);
    one(out, "larder_cache_put_bytes_total", "counter", "bytes written", (double)st.put_bytes);
    one(out, "larder_cache_evictions_total", "counter", "values evicted", (double)st.evictions);
    one(out, "larder_cache_evicted_bytes_total", "counter", "bytes evicted",
        (double)st.evicted_bytes);
    one(out, "larder_cache_rejected_total", "counter", "units refused admission (priority)",
        (double)st.rejected);
    one(out, "larder_cache_checksum_failures_total", "counter",
        "corrupt values found and dropped", (double)st.checksum_failures);
    one(out, "larder_cache_write_errors_total", "counter", "failed cache writes",
        (double)st.write_errors);
  }
  /* Per stream: one family at a time, one series per open stream. */
#define METRICS_STREAM_(name, kind, help)                                          \
  {                                                                                \
    family(out, "larder_stream_" #name "_total", "counter", help);                 \
    for (conn_t *c = srv->conns; c; c = c->next) {                                 \
      for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {              \
        stream_info_t si;                                                          \
        stream_info(s, &si);                                                       \
        fprintf(out,                                                               \
                "larder_stream_" #name "_total{client=\"%" PRIu64 "\",stream=\"%u\"," \
                "pid=\"%d\",uid=\"%u\",rank=\"%u\",world_size=\"%u\",dataset=\"",  \
                c->id, si.id, (int)c->pid, (unsigned)c->uid, si.rank, si.world_size); \
        label_value(out, si.dataset);                                              \
        fprintf(out, "\"} %" PRIu64 "\n", STATS_GET(stream_stats(s), name));       \
      }                                                                            \
    }                                                                              \
  }
  STATS_STREAM(METRICS_STREAM_)
#undef METRICS_STREAM_
}

static char *render_text(server_t *srv, int up, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  if (f == NULL) return NULL;
  metrics_render(srv, f, up);
  if (fclose(f) != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* ------------------------------------------------------------------------ */
/* The textfile                                                              */

static void write_textfile(metrics_t *m, int up) {
  if (m->textfile == NULL || !*m->textfile) return;
  size_t len = 0;
  char *text = render_text(m->srv, up, &len);
  if (text == NULL) return;
  char tmp[4200];
  snprintf(tmp, sizeof(tmp), "%s.tmp", m->textfile);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int ok = fd >= 0;
  size_t off = 0;
  while (ok && off < len) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) ok = 0;
    else off += (size_t)w;
  }
  if (fd >= 0 && close(fd) != 0) ok = 0;
  if (ok && rename(tmp, m->textfile) != 0) ok = 0;
  if (!ok) {
    static uint64_t last_warn_ns;
    uint64_t now = util_now_ns();
    /* Once a minute at most: a full disk must not flood the log. */
    if (now - last_warn_ns > 60ull * 1000000000ull) {
      char hint[600];
      int e = errno;
      log_warn("cannot write the metrics file %s: %s%s", m->textfile, strerror(e),
               util_sandbox_hint(e, m->textfile, 0, hint, sizeof(hint)));
      last_warn_ns = now;
    }
    unlink(tmp);
  }
  free(text);
}

static void on_textfile_timer(uv_timer_t *t) {
  metrics_t *m = t->data;
  write_textfile(m, 1);
}

static void start_textfile(metrics_t *m) {
  server_t *srv = m->srv;
  free(m->textfile);
  m->textfile = NULL;
  if (m->timer_init) uv_timer_stop(&m->textfile_timer);
  if (srv->cfg.metrics_textfile == NULL || !*srv->cfg.metrics_textfile) return;
  m->textfile = strdup(srv->cfg.metrics_textfile);
  if (m->textfile == NULL) return;
  m->interval_s = srv->cfg.metrics_interval ? srv->cfg.metrics_interval : 15;
  if (!m->timer_init) {
    uv_timer_init(srv->loop, &m->textfile_timer);
    m->textfile_timer.data = m;
    m->timer_init = 1;
  }
  write_textfile(m, 1);
  uv_timer_start(&m->textfile_timer, on_textfile_timer, m->interval_s * 1000, m->interval_s * 1000);
}

/* ------------------------------------------------------------------------ */
/* The HTTP endpoint                                                         */

static void mconn_free(mconn_t *mc) {
  metrics_t *m = mc->m;
  if (mc->prev) mc->prev->next = mc->next;
  else if (m->conns == mc) m->conns = mc->next;
  if (mc->next) mc->next->prev = mc->prev;
  m->num_conns--;
  free(mc->resp);
  free(mc);
  if (m->stopped && m->conns == NULL && !m->listening && !m->timer_init) free(m);
}

static void on_mconn_close(uv_handle_t *h) {
  mconn_t *mc = h->data;
  if (--mc->handles == 0) mconn_free(mc);
}

static void mconn_close(mconn_t *mc) {
  if (mc->closing) return;
  mc->closing = 1;
  uv_timer_stop(&mc->timer);
  uv_close((uv_handle_t *)&mc->timer, on_mconn_close);
  uv_close((uv_handle_t *)&mc->tcp, on_mconn_close);
}

static void on_mconn_timeout(uv_timer_t *t) { mconn_close(t->data); }

static void on_written(uv_write_t *req, int status) {
  (void)status;
  mconn_t *mc = req->data;
  free(req);
  mconn_close(mc);
}

static void respond(mconn_t *mc, int code, const char *reason, const char *type, const char *body,
                    size_t body_len, int head) {
  mc->responded = 1;
  uv_read_stop((uv_stream_t *)&mc->tcp);
  char hdr[512];
  int n = snprintf(hdr, sizeof(hdr),
                   "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                   "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
                   code, reason, type, body_len);
  size_t total = (size_t)n + (head ? 0 : body_len);
  mc->resp = malloc(total);
  uv_write_t *w = malloc(sizeof(*w));
  if (mc->resp == NULL || w == NULL) {
    free(w);
    mconn_close(mc);
    return;
  }
  memcpy(mc->resp, hdr, (size_t)n);
  if (!head && body_len) memcpy(mc->resp + n, body, body_len);
  uv_buf_t b = uv_buf_init(mc->resp, (unsigned)total);
  w->data = mc;
  if (uv_write(w, (uv_stream_t *)&mc->tcp, &b, 1, on_written) != 0) {
    free(w);
    mconn_close(mc);
  }
}

static void handle_request(mconn_t *mc) {
  /* Request line: METHOD SP TARGET SP VERSION */
  char method[16], target[1024];
  if (sscanf(mc->req, "%15s %1023s", method, target) != 2) {
    static const char body[] = "bad request\n";
    respond(mc, 400, "Bad Request", "text/plain; charset=utf-8", body, sizeof(body) - 1, 0);
    return;
  }
  int head = strcmp(method, "HEAD") == 0;
  if (strcmp(method, "GET") != 0 && !head) {
    static const char body[] = "only GET and HEAD\n";
    respond(mc, 405, "Method Not Allowed", "text/plain; charset=utf-8", body, sizeof(body) - 1, 0);
    return;
  }
  char *q = strchr(target, '?');
  if (q) *q = '\0';
  if (strcmp(target, "/metrics") == 0) {
    size_t len = 0;
    char *text = render_text(mc->m->srv, 1, &len);
    if (text == NULL) {
      static const char body[] = "out of memory\n";
      respond(mc, 500, "Internal Server Error", "text/plain; charset=utf-8", body, sizeof(body) - 1,
              head);
      return;
    }
    respond(mc, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text, len, head);
    free(text);
  } else if (strcmp(target, "/") == 0) {
    static const char body[] = "larderd: Prometheus metrics are at /metrics\n";
    respond(mc, 200, "OK", "text/plain; charset=utf-8", body, sizeof(body) - 1, head);
  } else {
    static const char body[] = "not found: the metrics are at /metrics\n";
    respond(mc, 404, "Not Found", "text/plain; charset=utf-8", body, sizeof(body) - 1, head);
  }
}

static void on_mconn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  mconn_t *mc = h->data;
  size_t room = sizeof(mc->req) - 1 - mc->len;
  *buf = uv_buf_init(mc->req + mc->len, (unsigned)room);
}

static void on_mconn_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  mconn_t *mc = st->data;
  if (mc->responded || mc->closing) return;
  if (nread < 0) {
    mconn_close(mc);
    return;
  }
  mc->len += (size_t)nread;
  mc->req[mc->len] = '\0';
  if (strstr(mc->req, "\r\n\r\n") || strstr(mc->req, "\n\n")) {
    handle_request(mc);
  } else if (mc->len >= sizeof(mc->req) - 1) {
    static const char body[] = "request too large\n";
    respond(mc, 431, "Request Header Fields Too Large", "text/plain; charset=utf-8", body,
            sizeof(body) - 1, 0);
  }
}

static void on_metrics_connection(uv_stream_t *listener, int status) {
  metrics_t *m = listener->data;
  if (status < 0 || m->stopped) return;
  mconn_t *mc = calloc(1, sizeof(*mc));
  if (mc == NULL) return;
  mc->m = m;
  uv_tcp_init(m->srv->loop, &mc->tcp);
  uv_timer_init(m->srv->loop, &mc->timer);
  mc->tcp.data = mc->timer.data = mc;
  mc->handles = 2;
  mc->next = m->conns;
  if (m->conns) m->conns->prev = mc;
  m->conns = mc;
  m->num_conns++;
  if (uv_accept(listener, (uv_stream_t *)&mc->tcp) != 0 || m->num_conns > METRICS_MAX_CONNS) {
    mconn_close(mc);
    return;
  }
  uv_timer_start(&mc->timer, on_mconn_timeout, METRICS_TIMEOUT_MS, 0);
  uv_read_start((uv_stream_t *)&mc->tcp, on_mconn_alloc, on_mconn_read);
}

/* "host:port", "[v6]:port" or ":port" (every interface). */
static int parse_listen(const char *spec, struct sockaddr_storage *ss, char *err, size_t errlen) {
  char host[256];
  const char *port;
  if (spec[0] == '[') {
    const char *end = strchr(spec, ']');
    if (end == NULL || end[1] != ':' || (size_t)(end - spec - 1) >= sizeof(host)) goto bad;
    snprintf(host, sizeof(host), "%.*s", (int)(end - spec - 1), spec + 1);
    port = end + 2;
  } else {
    const char *colon = strrchr(spec, ':');
    if (colon == NULL || (size_t)(colon - spec) >= sizeof(host)) goto bad;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - spec), spec);
    if (host[0] == '\0') snprintf(host, sizeof(host), "0.0.0.0");
    port = colon + 1;
  }
  char *end;
  long p = strtol(port, &end, 10);
  if (*port == '\0' || *end || p < 0 || p > 65535) goto bad;
  if (uv_ip4_addr(host, (int)p, (struct sockaddr_in *)ss) == 0) return 0;
  if (uv_ip6_addr(host, (int)p, (struct sockaddr_in6 *)ss) == 0) return 0;
bad:
  snprintf(err, errlen,
           "metrics_listen: '%s' is not an address such as 127.0.0.1:9464 or [::1]:9464", spec);
  return LARDER_EINVAL;
}

int metrics_start(server_t *srv, char *err, size_t errlen) {
  metrics_t *m = calloc(1, sizeof(*m));
  if (m == NULL) {
    snprintf(err, errlen, "out of memory");
    return LARDER_ENOMEM;
  }
  m->srv = srv;
  srv->metrics = m;
  const char *spec = srv->cfg.metrics_listen;
  if (spec && *spec) {
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    int rc = parse_listen(spec, &ss, err, errlen);
    if (rc) return rc;
    uv_tcp_init(srv->loop, &m->listener);
    m->listener.data = m;
    m->listening = 1;
    rc = uv_tcp_bind(&m->listener, (const struct sockaddr *)&ss, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&m->listener, 64, on_metrics_connection);
    if (rc) {
      snprintf(err, errlen, "metrics_listen: cannot listen on %s: %s", spec, uv_strerror(rc));
      return LARDER_EIO;
    }
    /* The port actually bound (":0" picks one; the tests use that). */
    struct sockaddr_storage got;
    int len = sizeof(got);
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (uv_tcp_getsockname(&m->listener, (struct sockaddr *)&got, &len) == 0) {
      if (got.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&got, ip, sizeof(ip));
        port = ntohs(((struct sockaddr_in6 *)&got)->sin6_port);
        snprintf(m->endpoint, sizeof(m->endpoint), "http://[%s]:%d/metrics", ip, port);
      } else {
        uv_ip4_name((struct sockaddr_in *)&got, ip, sizeof(ip));
        port = ntohs(((struct sockaddr_in *)&got)->sin_port);
        snprintf(m->endpoint, sizeof(m->endpoint), "http://%s:%d/metrics", ip, port);
      }
    }
    log_notice("Prometheus metrics on %s", m->endpoint);
  }
  start_textfile(m);
  return 0;
}

void metrics_config_changed(server_t *srv) {
  metrics_t *m = srv->metrics;
  if (m == NULL || m->stopped) return;
  const char *want = srv->cfg.metrics_textfile ? srv->cfg.metrics_textfile : "";
  const char *have = m->textfile ? m->textfile : "";
  if (strcmp(want, have) != 0 || m->interval_s != srv->cfg.metrics_interval) start_textfile(m);
}

const char *metrics_endpoint(server_t *srv) {
  metrics_t *m = srv->metrics;
  return m && m->listening ? m->endpoint : "";
}

static void on_listener_close(uv_handle_t *h) {
  metrics_t *m = h->data;
  m->listening = 0;
  if (m->conns == NULL && !m->timer_init) free(m);
}

static void on_timer_close(uv_handle_t *h) {
  metrics_t *m = h->data;
  m->timer_init = 0;
  if (m->conns == NULL && !m->listening) free(m);
}

void metrics_stop(server_t *srv) {
  metrics_t *m = srv->metrics;
  if (m == NULL) return;
  srv->metrics = NULL;
  m->stopped = 1;
  write_textfile(m, 0);
  free(m->textfile);
  m->textfile = NULL;
  for (mconn_t *mc = m->conns; mc; mc = mc->next) mconn_close(mc);
  int pending = 0;
  if (m->listening) {
    uv_close((uv_handle_t *)&m->listener, on_listener_close);
    pending = 1;
  }
  if (m->timer_init) {
    uv_timer_stop(&m->textfile_timer);
    uv_close((uv_handle_t *)&m->textfile_timer, on_timer_close);
    pending = 1;
  }
  if (!pending && m->conns == NULL) free(m);
}
