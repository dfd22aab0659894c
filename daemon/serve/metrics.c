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

#include "fetch/fetch.h"
#include "log.h"
#include "serve/metrics.h"
#include "fetch/remote.h"
#include "serve/conn.h"
#include "serve/stream.h"
#include "serve/server.h"
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
  int handles; /* open handles (tcp, timer) */
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

/* ------------------------------------------------------------------------ */
/* Histograms                                                                */

static const double bucket_s[] = {METRICS_BUCKETS};
#define NUM_BUCKETS (sizeof(bucket_s) / sizeof(bucket_s[0]))

/* Per bucket (not cumulative: one add per sample), the last for +Inf. */
typedef struct hist {
  uint64_t n[NUM_BUCKETS + 1];
  uint64_t sum_ns;
} hist_t;

static void hist_observe(hist_t *h, uint64_t ns) {
  double s = (double)ns / 1e9;
  size_t i = 0;
  while (i < NUM_BUCKETS && s > bucket_s[i]) i++;
  __atomic_add_fetch(&h->n[i], 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&h->sum_ns, ns, __ATOMIC_RELAXED);
}

/* One histogram's samples; labels is "" or `a="x",b="y",` (ending in a
 * comma, already escaped).  _count is the +Inf bucket's cumulative count,
 * so the two always agree. */
static void hist_render(FILE *out, const char *name, const char *labels, const hist_t *h) {
  uint64_t cum = 0;
  for (size_t i = 0; i <= NUM_BUCKETS; i++) {
    cum += __atomic_load_n(&h->n[i], __ATOMIC_RELAXED);
    if (i < NUM_BUCKETS)
      fprintf(out, "%s_bucket{%sle=\"%g\"} %" PRIu64 "\n", name, labels, bucket_s[i], cum);
    else fprintf(out, "%s_bucket{%sle=\"+Inf\"} %" PRIu64 "\n", name, labels, cum);
  }
  size_t ll = strlen(labels);
  /* Without the trailing comma for _sum and _count. */
  if (ll) {
    fprintf(out, "%s_sum{%.*s} %.9f\n", name, (int)(ll - 1), labels,
            (double)__atomic_load_n(&h->sum_ns, __ATOMIC_RELAXED) / 1e9);
    fprintf(out, "%s_count{%.*s} %" PRIu64 "\n", name, (int)(ll - 1), labels, cum);
  } else {
    fprintf(out, "%s_sum %.9f\n", name,
            (double)__atomic_load_n(&h->sum_ns, __ATOMIC_RELAXED) / 1e9);
    fprintf(out, "%s_count %" PRIu64 "\n", name, cum);
  }
}

static hist_t fetch_hist;

void metrics_observe_fetch(uint64_t ns) { hist_observe(&fetch_hist, ns); }

/* ------------------------------------------------------------------------ */
/* Groups: (job, dataset)                                                    */

typedef struct group {
  char job[METRICS_MAX_LABEL + 1];
  char dataset[METRICS_MAX_LABEL + 1];
  int used;
  int streams;           /* open */
  stats_stream_t closed; /* the totals of its closed streams */
  hist_t wait, first_batch;
} group_t;

/* 1 .. METRICS_MAX_JOBS, then the overflow group; 0 is no group.  The
 * names are written and read on the loop thread only; the histograms by
 * atomic adds. */
#define GROUP_OTHER (METRICS_MAX_JOBS + 1)
static group_t groups[METRICS_MAX_JOBS + 2];
static int num_groups; /* used of 1 .. METRICS_MAX_JOBS */

int metrics_job_valid(const char *job) {
  size_t n = 0;
  for (; job[n]; n++)
    if (job[n] < 0x20 || job[n] > 0x7e) return 0;
  return n <= METRICS_MAX_LABEL;
}

/* Length of the valid UTF-8 sequence at s (1 .. 4), or 0. */
static size_t utf8_len(const unsigned char *s) {
  if (s[0] < 0x80) return 1;
  size_t n = (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
  if (n == 0 || (n == 2 && s[0] < 0xc2) || (n == 4 && s[0] > 0xf4)) return 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  return n;
}

/* The dataset label of a source: its last path component that has no glob
 * character (so "/data/imagenet/train/part-*.parquet" is "train"), taken
 * from a URL only after its credentials and query are gone, as valid UTF-8
 * with no control characters, cut to METRICS_MAX_LABEL bytes on a
 * character's boundary.  Labels must be short and say nothing secret: the
 * dataset label ends up in every series of its group and in dashboards. */
static void dataset_label(const char *source, char *out, size_t size) {
  char red[1024];
  if (remote_is_url(source)) fetch_redact(source, red, sizeof(red));
  else snprintf(red, sizeof(red), "%s", source);
  red[strcspn(red, "?#")] = '\0';
  char *path = red;
  char *scheme = strstr(red, "://");
  if (scheme) {
    /* The path starts after the host; with none, the host is the name. */
    char *slash = strchr(scheme + 3, '/');
    path = slash ? slash : scheme + 3;
  }
  const char *best = NULL;
  size_t best_len = 0;
  for (char *p = path; *p;) {
    size_t n = strcspn(p, "/");
    if (n && strcspn(p, "*?[{") >= n) {
      best = p;
      best_len = n;
    }
    p += n;
    if (*p == '/') p++;
  }
  if (best == NULL) {
    best = path;
    best_len = strlen(path);
  }
  size_t o = 0;
  const unsigned char *u = (const unsigned char *)best;
  for (size_t i = 0; i < best_len && u[i];) {
    size_t n = utf8_len(u + i);
    if (n == 0 || i + n > best_len || (n == 1 && (u[i] < 0x20 || u[i] == 0x7f))) {
      if (o + 1 >= size) break;
      out[o++] = '_';
      i++;
      continue;
    }
    if (o + n >= size) break;
    memcpy(out + o, u + i, n);
    o += n;
    i += n;
  }
  out[o] = '\0';
}

int metrics_group(const char *job, const char *first_source) {
  char ds[METRICS_MAX_LABEL + 1];
  dataset_label(first_source ? first_source : "", ds, sizeof(ds));
  if (job == NULL) job = "";
  int g = 1;
  while (g <= num_groups && (strcmp(groups[g].job, job) != 0 || strcmp(groups[g].dataset, ds) != 0))
    g++;
  /* A job that names itself "other" on a dataset named "other" joins the
   * overflow group rather than print a second series with its labels. */
  int is_other = strcmp(job, "other") == 0 && strcmp(ds, "other") == 0;
  if (g > num_groups) {
    if (num_groups < METRICS_MAX_JOBS && metrics_job_valid(job) && !is_other) {
      g = ++num_groups;
      snprintf(groups[g].job, sizeof(groups[g].job), "%s", job);
      snprintf(groups[g].dataset, sizeof(groups[g].dataset), "%s", ds);
    } else {
      g = GROUP_OTHER;
      snprintf(groups[g].job, sizeof(groups[g].job), "other");
      snprintf(groups[g].dataset, sizeof(groups[g].dataset), "other");
    }
  }
  groups[g].used = 1;
  groups[g].streams++;
  return g;
}

static group_t *group_at(int g) { return g > 0 && g <= GROUP_OTHER ? &groups[g] : NULL; }

void metrics_group_stream_closed(int g, const stats_stream_t *st) {
  group_t *gr = group_at(g);
  if (gr == NULL) return;
  gr->streams--;
#define METRICS_CLOSED_(name, kind, help) STATS_ADD(&gr->closed, name, STATS_GET(st, name));
  STATS_STREAM(METRICS_CLOSED_)
#undef METRICS_CLOSED_
}

void metrics_observe_wait(int g, uint64_t ns) {
  group_t *gr = group_at(g);
  if (gr) hist_observe(&gr->wait, ns);
}

void metrics_observe_first_batch(int g, uint64_t ns) {
  group_t *gr = group_at(g);
  if (gr) hist_observe(&gr->first_batch, ns);
}

/* `job="..",dataset="..",` of group g, escaped. */
static void group_labels(const group_t *gr, char *buf, size_t size) {
  FILE *f = fmemopen(buf, size, "w");
  if (f == NULL) {
    buf[0] = '\0';
    return;
  }
  fputs("job=\"", f);
  label_value(f, gr->job);
  fputs("\",dataset=\"", f);
  label_value(f, gr->dataset);
  fputs("\",", f);
  fclose(f);
}

/* ------------------------------------------------------------------------ */
/* The exposition text                                                       */

#define KIND_IS(kind, what) (strcmp(#kind, #what) == 0)

/* "fetch_ns" -> "fetch". */
static void strip_ns(const char *name, char *out, size_t size) {
  size_t n = strlen(name);
  if (n > 3 && strcmp(name + n - 3, "_ns") == 0) n -= 3;
  snprintf(out, size, "%.*s", (int)n, name);
}

void metrics_render(server_t *srv, FILE *out, int up) {
  one(out, "larder_up", "gauge", "1 while larderd serves", up);
  family(out, "larder_build_info", "gauge", "larderd's version (always 1)");
  fprintf(out, "larder_build_info{version=\"%s\"} 1\n", LARDERD_VERSION);
  one(out, "larder_uptime_seconds", "gauge", "seconds since larderd started",
      (double)(util_now_ns() - srv->started_ns) / 1e9);
  one(out, "larder_start_time_seconds", "gauge", "unix time larderd started",
      (double)srv->started_unix);
  /* The single definition in stats.h; the stages after, as one family. */
  char base[128], full[192];
#define METRICS_GLOBAL_(name, kind, help)                                                      \
  if (KIND_IS(kind, COUNTER)) {                                                                \
    one(out, "larder_" #name "_total", "counter", help, (double)STATS_GET(&srv->stats, name)); \
  } else if (KIND_IS(kind, GAUGE)) {                                                           \
    one(out, "larder_" #name, "gauge", help, (double)STATS_GET(&srv->stats, name));            \
  } else if (KIND_IS(kind, SECONDS)) {                                                         \
    strip_ns(#name, base, sizeof(base));                                                       \
    snprintf(full, sizeof(full), "larder_%s_seconds_total", base);                             \
    one(out, full, "counter", help, (double)STATS_GET(&srv->stats, name) / 1e9);               \
  }
  STATS_GLOBAL(METRICS_GLOBAL_)
#undef METRICS_GLOBAL_
  family(out, "larder_stage_seconds_total", "counter",
         "seconds spent in each stage (fetch: over requests; decode, cache_read, assemble: "
         "over the workers)");
#define METRICS_STAGE_(name, kind, help)                                  \
  if (KIND_IS(kind, STAGE)) {                                             \
    strip_ns(#name, base, sizeof(base));                                  \
    fprintf(out, "larder_stage_seconds_total{stage=\"%s\"} %.9f\n", base, \
            (double)STATS_GET(&srv->stats, name) / 1e9);                  \
  }
  STATS_GLOBAL(METRICS_STAGE_)
#undef METRICS_STAGE_
  if (srv->store) {
    store_stats_t st;
    store_stats_get(srv->store, &st);
    one(out, "larder_cache_capacity_bytes", "gauge",
        "bytes of decoded data the cache keeps at most", (double)st.capacity_bytes);
    one(out, "larder_cache_used_bytes", "gauge", "bytes cached", (double)st.used_bytes);
    one(out, "larder_cache_reserved_bytes", "gauge", "bytes reserved for units being written",
        (double)st.reserved_bytes);
    one(out, "larder_cache_entries", "gauge", "cached values (one per column of a unit)",
        (double)st.entries);
    one(out, "larder_cache_objects", "gauge", "files and objects with cached values",
        (double)st.objects);
    one(out, "larder_cache_admission_disabled", "gauge",
        "1 while the disk is full and nothing is admitted", st.admission_disabled ? 1 : 0);
    one(out, "larder_cache_lookup_hits_total", "counter", "cache lookups that hit",
        (double)st.hits);
    one(out, "larder_cache_lookup_misses_total", "counter", "cache lookups that missed",
        (double)st.misses);
    one(out, "larder_cache_puts_total", "counter", "values written", (double)st.puts);
    one(out, "larder_cache_put_bytes_total", "counter", "bytes written", (double)st.put_bytes);
    one(out, "larder_cache_evictions_total", "counter", "values evicted", (double)st.evictions);
    one(out, "larder_cache_evicted_bytes_total", "counter", "bytes evicted",
        (double)st.evicted_bytes);
    one(out, "larder_cache_rejected_total", "counter", "units refused admission (priority)",
        (double)st.rejected);
    one(out, "larder_cache_checksum_failures_total", "counter", "corrupt values found and dropped",
        (double)st.checksum_failures);
    one(out, "larder_cache_write_errors_total", "counter", "failed cache writes",
        (double)st.write_errors);
  }
  family(out, "larder_fetch_request_duration_seconds", "histogram",
         "seconds each successful remote request took, retries included");
  hist_render(out, "larder_fetch_request_duration_seconds", "", &fetch_hist);

  /* Per group: its closed streams' totals and its open streams' counters. */
  /* Static: the loop thread alone renders. */
  static stats_stream_t sum[GROUP_OTHER + 1];
  memset(sum, 0, sizeof(sum));
  for (int g = 1; g <= GROUP_OTHER; g++) {
#define METRICS_SUM_(name, kind, help) sum[g].name = STATS_GET(&groups[g].closed, name);
    STATS_STREAM(METRICS_SUM_)
#undef METRICS_SUM_
  }
  for (conn_t *c = srv->conns; c; c = c->next) {
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      stream_info_t si;
      stream_info(s, &si);
      if (group_at(si.metrics_group) == NULL) continue;
      const stats_stream_t *st = stream_stats(s);
#define METRICS_SUM_(name, kind, help) sum[si.metrics_group].name += STATS_GET(st, name);
      STATS_STREAM(METRICS_SUM_)
#undef METRICS_SUM_
    }
  }
  static char labels[GROUP_OTHER + 1][4 * METRICS_MAX_LABEL + 32];
  for (int g = 1; g <= GROUP_OTHER; g++)
    if (groups[g].used) group_labels(&groups[g], labels[g], sizeof(labels[g]));
  family(out, "larder_job_streams", "gauge", "open streams of the job on the dataset");
  for (int g = 1; g <= GROUP_OTHER; g++)
    if (groups[g].used)
      fprintf(out, "larder_job_streams{%.*s} %d\n", (int)strlen(labels[g]) - 1, labels[g],
              groups[g].streams);
#define METRICS_STREAM_(name, kind, help)                                                   \
  if (!KIND_IS(kind, STAGE)) {                                                              \
    if (KIND_IS(kind, SECONDS)) {                                                           \
      strip_ns(#name, base, sizeof(base));                                                  \
      snprintf(full, sizeof(full), "larder_stream_%s_seconds_total", base);                 \
    } else {                                                                                \
      snprintf(full, sizeof(full), "larder_stream_%s_total", #name);                        \
    }                                                                                       \
    family(out, full, "counter", help);                                                     \
    for (int g = 1; g <= GROUP_OTHER; g++) {                                                \
      if (!groups[g].used) continue;                                                        \
      if (KIND_IS(kind, SECONDS))                                                           \
        fprintf(out, "%s{%.*s} %.9f\n", full, (int)strlen(labels[g]) - 1, labels[g],        \
                (double)sum[g].name / 1e9);                                                 \
      else                                                                                  \
        fprintf(out, "%s{%.*s} %" PRIu64 "\n", full, (int)strlen(labels[g]) - 1, labels[g], \
                sum[g].name);                                                               \
    }                                                                                       \
  }
  STATS_STREAM(METRICS_STREAM_)
#undef METRICS_STREAM_
  family(out, "larder_stream_stage_seconds_total", "counter",
         "seconds in each stage of the units and batches the job's streams read");
#define METRICS_STREAM_STAGE_(name, kind, help)                                                   \
  if (KIND_IS(kind, STAGE)) {                                                                     \
    strip_ns(#name, base, sizeof(base));                                                          \
    for (int g = 1; g <= GROUP_OTHER; g++)                                                        \
      if (groups[g].used)                                                                         \
        fprintf(out, "larder_stream_stage_seconds_total{%sstage=\"%s\"} %.9f\n", labels[g], base, \
                (double)sum[g].name / 1e9);                                                       \
  }
  STATS_STREAM(METRICS_STREAM_STAGE_)
#undef METRICS_STREAM_STAGE_
  family(out, "larder_batch_wait_seconds", "histogram",
         "seconds the trainer waited for each batch, as liblarder reports it");
  for (int g = 1; g <= GROUP_OTHER; g++)
    if (groups[g].used) hist_render(out, "larder_batch_wait_seconds", labels[g], &groups[g].wait);
  family(out, "larder_stream_first_batch_seconds", "histogram",
         "seconds from a stream's open request to its first batch sent");
  for (int g = 1; g <= GROUP_OTHER; g++)
    if (groups[g].used)
      hist_render(out, "larder_stream_first_batch_seconds", labels[g], &groups[g].first_batch);
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
