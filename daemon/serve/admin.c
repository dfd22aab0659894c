/*
 * admin.c: the administrative requests larderctl sends.
 *
 *   status, stats, clients, ls                 anyone who can reach the socket
 *   inspect URL, cat URL                       anyone, within the allowlist
 *   evict, prefetch, verify, reload, config    root, the daemon's user, or
 *                                              admin_group (acl.h)
 *
 * What one user sees of another: admins see every client, stream and
 * cached object; anyone else sees only the clients of their own uid, their
 * streams, and the cached objects those streams read (visible_to).  Pids,
 * uids and source paths are another user's business: a path may name a
 * project, a customer or a person.  Counters over everyone (clients,
 * streams, bytes, rates, the cache's use) stay visible to all.
 *
 * Replies are JSON when the request asks for it (stable keys, one object),
 * else text for people.  Long texts travel in several AdminReply frames
 * (more = 1), and so do progress (prefetch) and rows (cat); the last frame
 * has more = 0 and the request's final code.
 *
 * Jobs: evict, verify, prefetch, inspect and cat run asynchronously (the
 * thread pool, the fetcher, the unit pool) and belong to their connection:
 * when it closes, they stop.  Each counts as one of the connection's
 * pending requests (max_pending_per_client).  A prefetch is resumable: it
 * skips what the cache already holds, so running it again after an
 * interruption continues where it stopped.
 *
 * Rates: admin_tick samples the counters every second; stats reports
 * rates over the last RATE_SAMPLES seconds (since the start when younger).
 */
#include <ctype.h>
#include <fnmatch.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fetch/awscreds.h"
#include "cred.h"
#include "serve/cuda.h"
#include "log.h"
#include "serve/metrics.h"
#include "parquet/pq_inspect.h"
#include "fetch/remote.h"
#include "serve/admin.h"
#include "serve/conn.h"
#include "serve/stream.h"
#include "serve/units.h"
#include "serve/server.h"
#include "plan/shuffle.h"
#include "util.h"

#define RATE_SAMPLES 6           /* one a second: rates over up to 5 s */
#define REPLY_CHUNK (1u << 20)   /* text per AdminReply frame */
#define CAT_CHUNK (1u << 20)     /* rows rendered per cat frame, about */
#define CAT_BACKLOG (8u << 20)   /* stop rendering while this much is queued */
#define PROGRESS_NS 250000000ull /* prefetch progress frames, at most */
#define PREFETCH_POLL_MS 20

/* ------------------------------------------------------------------------ */
/* Text buffers                                                              */

/* Replies are built in a strbuf_t (strbuf.h) with unchecked appends: its
 * error sticks, and is checked once at the end. */

/* A JSON string literal (UTF-8 passes through; control characters are
 * escaped). */
static void sb_json(strbuf_t *b, const char *s) {
  strbuf_append(b, "\"", 1);
  for (const char *p = s ? s : ""; *p; p++) {
    unsigned char ch = (unsigned char)*p;
    if (ch == '"') strbuf_puts(b, "\\\"");
    else if (ch == '\\') strbuf_puts(b, "\\\\");
    else if (ch == '\n') strbuf_puts(b, "\\n");
    else if (ch == '\t') strbuf_puts(b, "\\t");
    else if (ch == '\r') strbuf_puts(b, "\\r");
    else if (ch < 0x20) strbuf_printf(b, "\\u%04x", ch);
    else strbuf_append(b, (const char *)p, 1);
  }
  strbuf_append(b, "\"", 1);
}

/* A finite JSON number (NaN and infinities become 0). */
static void sb_num(strbuf_t *b, double v) {
  if (!isfinite(v)) v = 0;
  strbuf_printf(b, "%.6g", v);
}

/* ------------------------------------------------------------------------ */
/* Human formatting                                                          */

static const char *fmt_bytes(char *buf, size_t size, double v) {
  util_human_bytes(buf, size, v);
  return buf;
}

/* Seconds as "2h 03m", "5m 07s", "12s", "0.4s". */
static const char *fmt_dur(char *buf, size_t size, double s) {
  if (!isfinite(s) || s < 0) snprintf(buf, size, "?");
  else if (s < 10) snprintf(buf, size, "%.1fs", s);
  else if (s < 60) snprintf(buf, size, "%.0fs", s);
  else if (s < 3600) snprintf(buf, size, "%dm %02ds", (int)(s / 60), (int)s % 60);
  else if (s < 86400) snprintf(buf, size, "%dh %02dm", (int)(s / 3600), (int)(s / 60) % 60);
  else snprintf(buf, size, "%dd %02dh", (int)(s / 86400), (int)(s / 3600) % 24);
  return buf;
}

/* 1234567 as "1,234,567". */
static const char *fmt_count(char *buf, size_t size, uint64_t v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof(tmp), "%" PRIu64, v);
  size_t o = 0;
  for (int i = 0; i < n && o + 2 < size; i++) {
    if (i && (n - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = tmp[i];
  }
  buf[o] = '\0';
  return buf;
}

/* s shortened to width columns with "..." in the middle. */
static const char *fmt_fit(char *buf, size_t size, const char *s, size_t width) {
  size_t n = strlen(s);
  if (n <= width || width < 8) {
    snprintf(buf, size, "%s", s);
    return buf;
  }
  size_t head = (width - 3) / 2, tail = width - 3 - head;
  snprintf(buf, size, "%.*s...%s", (int)head, s, s + n - tail);
  return buf;
}

/* ------------------------------------------------------------------------ */
/* Replies                                                                   */

static void reply_frame(conn_t *c, uint32_t request_id, int code, const char *text, size_t len,
                        int more) {
  if (c == NULL || c->closing || c->draining) return;
  char *copy = NULL;
  Larder__AdminReply r = LARDER__ADMIN_REPLY__INIT;
  r.request_id = request_id;
  r.code = code;
  r.more = more;
  if (text && text[len] != '\0') {
    copy = malloc(len + 1);
    if (copy == NULL) return;
    memcpy(copy, text, len);
    copy[len] = '\0';
    r.text = copy;
  } else {
    r.text = (char *)(text ? text : "");
  }
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_ADMIN_REPLY;
  f.admin_reply = &r;
  conn_send(c, &f, -1);
  free(copy);
}

/* The final reply, cut into frames of about REPLY_CHUNK bytes (never
 * inside a UTF-8 sequence) so that no frame exceeds the client's limit. */
static void reply(conn_t *c, uint32_t request_id, int code, const char *text) {
  const char *t = text ? text : "";
  size_t n = strlen(t), off = 0;
  while (n - off > REPLY_CHUNK) {
    size_t cut = off + REPLY_CHUNK;
    while (cut > off && ((unsigned char)t[cut] & 0xC0) == 0x80) cut--;
    reply_frame(c, request_id, 0, t + off, cut - off, 1);
    off = cut;
  }
  reply_frame(c, request_id, code, t + off, n - off, 0);
}

static void reply_error(conn_t *c, uint32_t request_id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void reply_error(conn_t *c, uint32_t request_id, int code, const char *fmt, ...) {
  char msg[2400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  reply_frame(c, request_id, code, msg, strlen(msg), 0);
}

static conn_t *find_conn(server_t *srv, uint64_t id) {
  for (conn_t *c = srv->conns; c; c = c->next)
    if (c->id == id && !c->closing && !c->draining) return c;
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Request arguments: positional words and --name=value options              */

static const char *opt_value(const Larder__AdminRequest *req, const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i < req->n_args; i++) {
    const char *a = req->args[i];
    if (a && strncmp(a, "--", 2) == 0 && strncmp(a + 2, name, n) == 0 && a[2 + n] == '=')
      return a + 3 + n;
  }
  return NULL;
}

static int opt_flag(const Larder__AdminRequest *req, const char *name) {
  for (size_t i = 0; i < req->n_args; i++)
    if (req->args[i] && strncmp(req->args[i], "--", 2) == 0 && strcmp(req->args[i] + 2, name) == 0)
      return 1;
  return 0;
}

static size_t positional(const Larder__AdminRequest *req, const char **out, size_t max) {
  size_t k = 0;
  for (size_t i = 0; i < req->n_args && k < max; i++)
    if (req->args[i] && strncmp(req->args[i], "--", 2) != 0) out[k++] = req->args[i];
  return k;
}

static int parse_u64(const char *s, uint64_t *out) {
  if (s == NULL || !isdigit((unsigned char)*s)) return -1;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end) return -1;
  *out = v;
  return 0;
}

/* "a,b.c" into a malloc'd vector of malloc'd strings. */
static char **split_list(const char *spec, size_t *n) {
  *n = 0;
  if (spec == NULL || *spec == '\0') return NULL;
  size_t count = 1;
  for (const char *p = spec; *p; p++) count += *p == ',';
  char **v = calloc(count + 1, sizeof(char *));
  if (v == NULL) return NULL;
  const char *p = spec;
  while (*p) {
    size_t len = strcspn(p, ",");
    if (len) {
      v[*n] = strndup(p, len);
      if (v[*n] == NULL) break;
      (*n)++;
    }
    p += len;
    if (*p == ',') p++;
  }
  return v;
}

static void free_list(char **v, size_t n) {
  if (v == NULL) return;
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

/* ------------------------------------------------------------------------ */
/* Rates                                                                     */

enum { G_FETCH_BYTES, G_BATCH_BYTES, G_BATCHES, G_FETCH_NS, G_DECODE_NS, G_CACHE_NS, G_ASSEMBLE_NS, G_N };

typedef struct gsample {
  uint64_t t;
  uint64_t v[G_N];
} gsample_t;

typedef struct ssample {
  uint64_t t, batches, bytes, wait, compute;
} ssample_t;

typedef struct srate {
  uint64_t conn_id;
  uint32_t stream;
  int seen;
  int n;
  ssample_t s[RATE_SAMPLES];
} srate_t;

typedef struct job job_t;

typedef struct admin_state {
  gsample_t g[RATE_SAMPLES];
  int ng;
  srate_t *rates;         /* rates[0 .. num_sorted) by (conn_id, stream) */
  size_t num_rates, cap_rates, num_sorted;
  job_t *jobs;
} admin_state_t;

static admin_state_t *state_of(server_t *srv) {
  if (srv->admin == NULL) srv->admin = calloc(1, sizeof(admin_state_t));
  return srv->admin;
}

static void global_now(server_t *srv, gsample_t *g) {
  g->t = util_now_ns();
  g->v[G_FETCH_BYTES] = STATS_GET(&srv->stats, fetch_bytes);
  g->v[G_BATCH_BYTES] = STATS_GET(&srv->stats, batch_bytes);
  g->v[G_BATCHES] = STATS_GET(&srv->stats, batches);
  g->v[G_FETCH_NS] = STATS_GET(&srv->stats, fetch_ns);
  g->v[G_DECODE_NS] = STATS_GET(&srv->stats, decode_ns);
  g->v[G_CACHE_NS] = STATS_GET(&srv->stats, cache_read_ns);
  g->v[G_ASSEMBLE_NS] = STATS_GET(&srv->stats, assemble_ns);
}

static void stream_now(const stream_t *s, ssample_t *x) {
  const stats_stream_t *st = stream_stats(s);
  x->t = util_now_ns();
  x->batches = STATS_GET(st, batches);
  x->bytes = STATS_GET(st, bytes);
  x->wait = STATS_GET(st, wait_ns);
  x->compute = STATS_GET(st, compute_ns);
}

static int cmp_rate_key(uint64_t conn_a, uint32_t stream_a, const srate_t *b) {
  if (conn_a != b->conn_id) return conn_a < b->conn_id ? -1 : 1;
  return (stream_a > b->stream) - (stream_a < b->stream);
}

static int cmp_rate(const void *a, const void *b) {
  const srate_t *x = a;
  return cmp_rate_key(x->conn_id, x->stream, b);
}

/* The samples of a stream, or NULL: a binary search of the sorted rates,
 * so that a tick over every stream costs O(S log S), not O(S^2) (clients
 * may open tens of thousands of streams, and the tick runs on the loop). */
static srate_t *find_rate(admin_state_t *as, uint64_t conn_id, uint32_t stream) {
  if (as == NULL) return NULL;
  size_t lo = 0, hi = as->num_sorted;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = cmp_rate_key(conn_id, stream, &as->rates[mid]);
    if (c == 0) return &as->rates[mid];
    if (c < 0) hi = mid;
    else lo = mid + 1;
  }
  return NULL;
}

void admin_tick(server_t *srv) {
  admin_state_t *as = state_of(srv);
  if (as == NULL) return;
  if (as->ng == RATE_SAMPLES) {
    memmove(&as->g[0], &as->g[1], sizeof(gsample_t) * (RATE_SAMPLES - 1));
    as->ng--;
  }
  global_now(srv, &as->g[as->ng++]);
  for (size_t i = 0; i < as->num_rates; i++) as->rates[i].seen = 0;
  for (conn_t *c = srv->conns; c; c = c->next) {
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      srate_t *r = find_rate(as, c->id, stream_id(s));
      if (r == NULL) {
        if (as->num_rates == as->cap_rates) {
          size_t cap = as->cap_rates ? as->cap_rates * 2 : 16;
          srate_t *v = realloc(as->rates, cap * sizeof(*v));
          if (v == NULL) continue;
          as->rates = v;
          as->cap_rates = cap;
        }
        r = &as->rates[as->num_rates++];
        memset(r, 0, sizeof(*r));
        r->conn_id = c->id;
        r->stream = stream_id(s);
      }
      r->seen = 1;
      if (r->n == RATE_SAMPLES) {
        memmove(&r->s[0], &r->s[1], sizeof(ssample_t) * (RATE_SAMPLES - 1));
        r->n--;
      }
      stream_now(s, &r->s[r->n++]);
    }
  }
  /* Streams that ended lose their samples; those new this tick (appended,
   * each stream once) join the sorted order. */
  size_t k = 0;
  for (size_t i = 0; i < as->num_rates; i++)
    if (as->rates[i].seen) as->rates[k++] = as->rates[i];
  as->num_rates = k;
  /* With no streams yet as->rates is NULL, which qsort must not be given. */
  if (as->num_rates > 1) qsort(as->rates, as->num_rates, sizeof(*as->rates), cmp_rate);
  as->num_sorted = as->num_rates;
}

void admin_stream_rates(server_t *srv, const conn_t *c, const stream_t *s, double *batches_per_s,
                        double *bytes_per_s, double *stall) {
  ssample_t now, old = {0, 0, 0, 0, 0};
  stream_now(s, &now);
  srate_t *r = find_rate(srv->admin, c->id, stream_id(s));
  if (r && r->n > 0 && now.t > r->s[0].t + 200000000ull) {
    old = r->s[0];
  } else {
    stream_info_t si;
    stream_info(s, &si);
    old.t = si.opened_ns;
  }
  double dt = (double)(now.t - old.t) / 1e9;
  if (dt <= 0) dt = 1e-9;
  *batches_per_s = (double)(now.batches - old.batches) / dt;
  *bytes_per_s = (double)(now.bytes - old.bytes) / dt;
  double w = (double)(now.wait - old.wait), cpt = (double)(now.compute - old.compute);
  if (w + cpt <= 0) {
    /* No release in the window: the lifetime figure, if any. */
    w = (double)now.wait;
    cpt = (double)now.compute;
  }
  *stall = w + cpt > 0 ? w / (w + cpt) : -1;
}

void admin_global_rates(server_t *srv, admin_rates_t *out) {
  memset(out, 0, sizeof(*out));
  admin_state_t *as = srv->admin;
  gsample_t now, old;
  global_now(srv, &now);
  if (as && as->ng > 0 && now.t > as->g[0].t + 200000000ull) {
    old = as->g[0];
  } else {
    memset(&old, 0, sizeof(old));
    old.t = srv->started_ns;
  }
  double dt = (double)(now.t - old.t) / 1e9;
  if (dt <= 0) dt = 1e-9;
  out->window_s = dt;
  out->fetch_bytes_per_s = (double)(now.v[G_FETCH_BYTES] - old.v[G_FETCH_BYTES]) / dt;
  out->batch_bytes_per_s = (double)(now.v[G_BATCH_BYTES] - old.v[G_BATCH_BYTES]) / dt;
  out->batches_per_s = (double)(now.v[G_BATCHES] - old.v[G_BATCHES]) / dt;
  out->fetch_ns = (double)(now.v[G_FETCH_NS] - old.v[G_FETCH_NS]);
  out->decode_ns = (double)(now.v[G_DECODE_NS] - old.v[G_DECODE_NS]);
  out->cache_read_ns = (double)(now.v[G_CACHE_NS] - old.v[G_CACHE_NS]);
  out->assemble_ns = (double)(now.v[G_ASSEMBLE_NS] - old.v[G_ASSEMBLE_NS]);
  /* The trainers' wait and compute over the same window, summed over the
   * streams that are open now. */
  for (conn_t *c = srv->conns; c; c = c->next) {
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      ssample_t sn, so = {0, 0, 0, 0, 0};
      stream_now(s, &sn);
      srate_t *r = find_rate(as, c->id, stream_id(s));
      if (r && r->n > 0) {
        /* The sample closest to the window's start. */
        so = r->s[0];
        for (int i = 0; i < r->n; i++)
          if (r->s[i].t <= old.t) so = r->s[i];
      }
      out->wait_ns += (double)(sn.wait - so.wait);
      out->compute_ns += (double)(sn.compute - so.compute);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* The verdict: what limits throughput right now                             */

typedef struct verdict {
  /* consumer, network, decode, cache, assembly, latency, idle, starting */
  const char *limit;
  char text[400];
} verdict_t;

static int jobs_running(server_t *srv, int *prefetches);

static void make_verdict(server_t *srv, const admin_rates_t *r, verdict_t *v) {
  uint64_t streams = STATS_GET(&srv->stats, streams);
  double stages = r->fetch_ns + r->decode_ns + r->cache_read_ns + r->assemble_ns;
  double busy = r->decode_ns + r->cache_read_ns + r->assemble_ns; /* worker time */
  double util = busy / (r->window_s * 1e9 * (srv->workers > 0 ? srv->workers : 1));
  double stall = r->wait_ns + r->compute_ns > 0 ? r->wait_ns / (r->wait_ns + r->compute_ns) : -1;
  int prefetches = 0, jobs = jobs_running(srv, &prefetches);
  if (streams == 0 && jobs > 0) {
    v->limit = "admin";
    if (prefetches)
      snprintf(v->text, sizeof(v->text),
               "prefetching: no trainer is reading; %d `larderctl prefetch` job%s warm%s the "
               "cache",
               prefetches, prefetches == 1 ? "" : "s", prefetches == 1 ? "s" : "");
    else
      snprintf(v->text, sizeof(v->text), "admin: no trainer is reading; %d admin job%s running",
               jobs, jobs == 1 ? " is" : "s are");
    return;
  }
  if (streams == 0) {
    v->limit = "idle";
    snprintf(v->text, sizeof(v->text), "idle: no trainer is reading");
    return;
  }
  if (stall < 0 && r->batches_per_s <= 0) {
    v->limit = "starting";
    snprintf(v->text, sizeof(v->text),
             "starting: no batch has been released yet, so there is nothing to judge");
    return;
  }
  if (stall >= 0 && stall < 0.05) {
    v->limit = "consumer";
    snprintf(v->text, sizeof(v->text),
             "the consumer (the trainers themselves): they wait for data %.1f%% of the time, "
             "so larder keeps up. Healthy.",
             stall * 100);
    return;
  }
  if (stall >= 0 && r->compute_ns < 0.02 * (r->wait_ns + r->compute_ns)) {
    /* A consumer that does nothing between batches waits all the time
     * however fast larder is: its stall says nothing of a shortfall. */
    v->limit = "consumer";
    snprintf(v->text, sizeof(v->text),
             "the consumer does no work between batches (a benchmark, or a loader that only "
             "queues them): it waits for data %.0f%% of the time whatever larder does; "
             "%.0f batches/s is larder's rate for it",
             stall * 100, r->batches_per_s);
    return;
  }
  double st = stall >= 0 ? stall * 100 : 0;
  const char *which;
  double share;
  if (util < 0.7 && r->fetch_ns < busy) {
    /* Nothing is saturated: the pipeline is not deep enough. */
    v->limit = "latency";
    snprintf(v->text, sizeof(v->text),
             "latency: trainers wait for data %.0f%% of the time although the workers are only "
             "%.0f%% busy and little is fetched. Deeper read-ahead helps: a larger stream window "
             "(larder_stream_options_t.window) or prefetch_batches.",
             st, util * 100);
    return;
  }
  if (util >= 0.7) {
    /* The workers are the constraint: by the stage that fills them. */
    if (r->decode_ns >= r->cache_read_ns && r->decode_ns >= r->assemble_ns) {
      which = "decode";
      share = r->decode_ns;
    } else if (r->cache_read_ns >= r->assemble_ns) {
      which = "cache";
      share = r->cache_read_ns;
    } else {
      which = "assembly";
      share = r->assemble_ns;
    }
  } else {
    which = "network";
    share = r->fetch_ns;
  }
  double pct = stages > 0 ? share / stages * 100 : 0;
  v->limit = which;
  if (strcmp(which, "network") == 0)
    snprintf(v->text, sizeof(v->text),
             "the network: trainers wait for data %.0f%% of the time while the workers are "
             "%.0f%% busy and remote fetches take %.0f%% of the stage time. Raise "
             "fetch_inflight_per_host / fetch_inflight_bytes, or warm the cache with "
             "`larderctl prefetch`.",
             st, util * 100, pct);
  else if (strcmp(which, "decode") == 0)
    snprintf(v->text, sizeof(v->text),
             "decoding: trainers wait for data %.0f%% of the time; the workers are %.0f%% busy, "
             "%.0f%% of it decoding Parquet. More workers (cores) help, and so does a warm "
             "cache (`larderctl prefetch`): cached units skip decoding.",
             st, util * 100, pct);
  else if (strcmp(which, "cache") == 0)
    snprintf(v->text, sizeof(v->text),
             "the cache disk: trainers wait for data %.0f%% of the time; the workers are %.0f%% "
             "busy, %.0f%% of it reading the cache. A faster cache disk would help.",
             st, util * 100, pct);
  else
    snprintf(v->text, sizeof(v->text),
             "batch assembly: trainers wait for data %.0f%% of the time; the workers are %.0f%% "
             "busy, %.0f%% of it copying rows into batches. More workers (cores) would help.",
             st, util * 100, pct);
}

/* ------------------------------------------------------------------------ */
/* Visibility                                                                */

/* Whether the peer of conn may see everyone's clients, streams and objects:
 * root, the daemon's user or admin_group (acl_is_admin).  Loop thread. */
static int sees_all(const conn_t *self) {
  acl_peer_t peer;
  conn_peer(self, &peer);
  return acl_is_admin(self->srv->acl, &peer);
}

/* Whether a listing for self (all: sees_all) may show connection c and its
 * streams: an admin's may, anyone else's only for c of the same uid. */
static int visible_to(const conn_t *self, int all, const conn_t *c) {
  return all || c->uid == self->uid;
}

/* ------------------------------------------------------------------------ */
/* status                                                                    */

/* Connections that are trainers (not larderctl). */
static uint64_t count_trainers(server_t *srv) {
  uint64_t n = 0;
  for (conn_t *c = srv->conns; c; c = c->next)
    if (!c->is_admin_conn && !c->closing && !c->draining) n++;
  return n;
}

static void cmd_status(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  store_stats_t st;
  memset(&st, 0, sizeof(st));
  if (srv->store) store_stats_get(srv->store, &st);
  double up = (double)(util_now_ns() - srv->started_ns) / 1e9;
  const char *metrics = metrics_endpoint(srv);
  strbuf_t b = {0};
  if (req->json) {
    strbuf_printf(&b, "{\"up\":true,\"version\":\"%s\",\"pid\":%d,\"uptime_s\":", LARDERD_VERSION,
              (int)getpid());
    sb_num(&b, up);
    strbuf_printf(&b, ",\"started_unix\":%" PRId64 ",\"config_path\":", srv->started_unix);
    if (srv->config_path) sb_json(&b, srv->config_path);
    else strbuf_puts(&b, "null");
    strbuf_puts(&b, ",\"socket\":");
    sb_json(&b, srv->cfg.socket);
    strbuf_puts(&b, ",\"cache_dir\":");
    sb_json(&b, srv->cfg.cache_dir);
    strbuf_printf(&b,
              ",\"cache_capacity_bytes\":%" PRIu64 ",\"cache_used_bytes\":%" PRIu64
              ",\"cache_entries\":%" PRIu64 ",\"workers\":%d,\"clients\":%" PRIu64
              ",\"trainers\":%" PRIu64 ",\"streams\":%" PRIu64
              ",\"allowlist_rules\":%zu,\"metrics_endpoint\":",
              st.capacity_bytes, st.used_bytes, st.entries, srv->workers,
              /* the other connections: not the larderctl asking */
              STATS_GET(&srv->stats, clients) - 1, count_trainers(srv),
              STATS_GET(&srv->stats, streams), acl_num_rules(srv->acl));
    if (*metrics) sb_json(&b, metrics);
    else strbuf_puts(&b, "null");
    strbuf_puts(&b, ",\"metrics_textfile\":");
    if (srv->cfg.metrics_textfile && *srv->cfg.metrics_textfile) sb_json(&b, srv->cfg.metrics_textfile);
    else strbuf_puts(&b, "null");
    strbuf_puts(&b, "}");
  } else {
    char a[32], bb[32], d[32], n[32];
    strbuf_printf(&b, "larderd %s is up (pid %d)\n", LARDERD_VERSION, (int)getpid());
    strbuf_printf(&b, "  uptime      %s\n", fmt_dur(d, sizeof(d), up));
    strbuf_printf(&b, "  config      %s\n", srv->config_path ? srv->config_path : "(none: defaults and flags)");
    strbuf_printf(&b, "  socket      %s\n", srv->cfg.socket);
    strbuf_printf(&b, "  cache       %s: %s of %s used (%.0f%%), %s entries\n", srv->cfg.cache_dir,
              fmt_bytes(a, sizeof(a), (double)st.used_bytes),
              fmt_bytes(bb, sizeof(bb), (double)st.capacity_bytes),
              st.capacity_bytes ? (double)st.used_bytes * 100.0 / (double)st.capacity_bytes : 0.0,
              fmt_count(n, sizeof(n), st.entries));
    strbuf_printf(&b, "  workers     %d\n", srv->workers);
    uint64_t trainers = count_trainers(srv), streams = STATS_GET(&srv->stats, streams);
    strbuf_printf(&b, "  trainers    %" PRIu64 " connected, %" PRIu64 " stream%s open\n", trainers,
              streams, streams == 1 ? "" : "s");
    if (acl_num_rules(srv->acl))
      strbuf_printf(&b, "  allowlist   %zu rule%s\n", acl_num_rules(srv->acl),
                acl_num_rules(srv->acl) == 1 ? "" : "s");
    else
      strbuf_puts(&b, "  allowlist   off: any URL may be fetched (set allow = ... lines)\n");
    if (*metrics) strbuf_printf(&b, "  metrics     %s\n", metrics);
    if (srv->cfg.metrics_textfile && *srv->cfg.metrics_textfile)
      strbuf_printf(&b, "  metrics     %s (every %" PRIu64 " s)\n", srv->cfg.metrics_textfile,
                srv->cfg.metrics_interval);
  }
  reply(c, req->request_id, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

/* ------------------------------------------------------------------------ */
/* stats                                                                     */

typedef struct dsagg {
  const char *name;
  int streams;
  uint64_t hit, miss;
} dsagg_t;

/* The streams self may see (visible_to), grouped by dataset, with their
 * cache hit and miss bytes.  Returns a calloc'd array of *n (the names
 * point into the streams), or NULL when out of memory. */
static dsagg_t *datasets_of(server_t *srv, const conn_t *self, int all, size_t *n) {
  *n = 0;
  uint64_t total = STATS_GET(&srv->stats, streams) + 1;
  dsagg_t *v = calloc(total, sizeof(*v));
  if (v == NULL) return NULL;
  for (conn_t *c = srv->conns; c; c = c->next) {
    if (!visible_to(self, all, c)) continue;
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      stream_info_t si;
      stream_info(s, &si);
      const stats_stream_t *ss = stream_stats(s);
      size_t i = 0;
      while (i < *n && strcmp(v[i].name, si.dataset) != 0) i++;
      if (i == *n) {
        if (*n == total) continue;
        v[i].name = si.dataset;
        (*n)++;
      }
      v[i].streams++;
      v[i].hit += STATS_GET(ss, cache_hit_bytes);
      v[i].miss += STATS_GET(ss, cache_miss_bytes);
    }
  }
  return v;
}

/* Writes the stats object for self: every counter, and the datasets and
 * streams self may see (visible_to). */
static void stats_json(server_t *srv, const conn_t *self, strbuf_t *b) {
  int all = sees_all(self);
  strbuf_printf(b, "{\"version\":\"%s\",\"uptime_s\":%.3f", LARDERD_VERSION,
            (double)(util_now_ns() - srv->started_ns) / 1e9);
#define ADMIN_STAT_(name, kind, help) \
  strbuf_printf(b, ",\"%s\":%" PRIu64, #name, STATS_GET(&srv->stats, name));
  STATS_GLOBAL(ADMIN_STAT_)
#undef ADMIN_STAT_
  /* CUDA streams: device bytes per GPU ordinal (cuda.h). */
  strbuf_puts(b, ",\"cuda_devices\":[");
  for (int d = 0; d < cuda_devices_seen(); d++)
    strbuf_printf(b, "%s{\"device\":%d,\"bytes\":%" PRIu64 "}", d ? "," : "", d,
              cuda_device_bytes_of(d));
  strbuf_puts(b, "]");
  if (srv->store) {
    store_stats_t st;
    store_stats_get(srv->store, &st);
    strbuf_printf(b,
              ",\"cache\":{\"capacity_bytes\":%" PRIu64 ",\"used_bytes\":%" PRIu64
              ",\"entries\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64
              ",\"evictions\":%" PRIu64 ",\"admission_disabled\":%s",
              st.capacity_bytes, st.used_bytes, st.entries, st.hits, st.misses, st.evictions,
              st.admission_disabled ? "true" : "false");
    /* The rest of store_stats_t, for the integration tests and monitoring. */
    strbuf_printf(b,
              ",\"reserved_bytes\":%" PRIu64 ",\"objects\":%" PRIu64 ",\"hit_bytes\":%" PRIu64
              ",\"puts\":%" PRIu64 ",\"put_bytes\":%" PRIu64 ",\"evicted_bytes\":%" PRIu64
              ",\"rejected\":%" PRIu64 ",\"checksum_failures\":%" PRIu64
              ",\"write_errors\":%" PRIu64 "}",
              st.reserved_bytes, st.objects, st.hit_bytes, st.puts, st.put_bytes,
              st.evicted_bytes, st.rejected, st.checksum_failures, st.write_errors);
  } else {
    /* Serving without a cache: why (larderd could not open it at start). */
    strbuf_puts(b, ",\"cache_error\":");
    sb_json(b, srv->cache_error);
  }
  if (srv->awscreds) {
    /* Where the S3 credentials came from and when they expire: never the
     * credentials themselves. */
    char source[16];
    int64_t exp;
    awscreds_describe(srv->awscreds, source, sizeof(source), &exp);
    strbuf_puts(b, ",\"credentials\":{\"source\":");
    sb_json(b, source);
    strbuf_printf(b, ",\"expires_unix\":%lld}", (long long)exp);
  }
  admin_rates_t r;
  admin_global_rates(srv, &r);
  strbuf_puts(b, ",\"rates\":{\"window_s\":");
  sb_num(b, r.window_s);
  strbuf_puts(b, ",\"fetch_bytes_per_s\":");
  sb_num(b, r.fetch_bytes_per_s);
  strbuf_puts(b, ",\"batch_bytes_per_s\":");
  sb_num(b, r.batch_bytes_per_s);
  strbuf_puts(b, ",\"batches_per_s\":");
  sb_num(b, r.batches_per_s);
  strbuf_puts(b, "},\"stages\":{\"window_s\":");
  sb_num(b, r.window_s);
  strbuf_printf(b, ",\"fetch_ns\":%.0f,\"decode_ns\":%.0f,\"cache_read_ns\":%.0f,\"assemble_ns\":%.0f}",
            r.fetch_ns, r.decode_ns, r.cache_read_ns, r.assemble_ns);
  verdict_t v;
  make_verdict(srv, &r, &v);
  strbuf_printf(b, ",\"verdict\":{\"limit\":\"%s\",\"text\":", v.limit);
  sb_json(b, v.text);
  strbuf_puts(b, "}");
  size_t nd = 0;
  dsagg_t *ds = datasets_of(srv, self, all, &nd);
  strbuf_puts(b, ",\"datasets\":[");
  for (size_t i = 0; ds && i < nd; i++) {
    strbuf_puts(b, i ? ",{\"dataset\":" : "{\"dataset\":");
    sb_json(b, ds[i].name);
    strbuf_printf(b, ",\"streams\":%d,\"cache_hit_bytes\":%" PRIu64 ",\"cache_miss_bytes\":%" PRIu64
                 ",\"hit_ratio\":",
              ds[i].streams, ds[i].hit, ds[i].miss);
    if (ds[i].hit + ds[i].miss) sb_num(b, (double)ds[i].hit / (double)(ds[i].hit + ds[i].miss));
    else strbuf_puts(b, "null");
    strbuf_puts(b, "}");
  }
  strbuf_puts(b, "]");
  free(ds);
  /* Per stream: what it delivered and the stall its trainer reported
   * (wait_ns: blocked in larder_stream_next; compute_ns: between calls). */
  strbuf_printf(b, ",\"per_stream\":[");
  int first = 1;
  for (conn_t *c = srv->conns; c; c = c->next) {
    if (!visible_to(self, all, c)) continue;
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      const stats_stream_t *ss = stream_stats(s);
      stream_info_t si;
      stream_info(s, &si);
      strbuf_printf(b,
                "%s{\"client\":%" PRIu64 ",\"pid\":%d,\"uid\":%u,\"stream\":%u,\"rank\":%u,"
                "\"world_size\":%u,\"window\":%u,\"dataset\":",
                first ? "" : ",", c->id, (int)c->pid, (unsigned)c->uid, stream_id(s), si.rank,
                si.world_size, si.window);
      sb_json(b, si.dataset);
#define ADMIN_STREAM_STAT_(name, kind, help) \
  strbuf_printf(b, ",\"%s\":%" PRIu64, #name, STATS_GET(ss, name));
      STATS_STREAM(ADMIN_STREAM_STAT_)
#undef ADMIN_STREAM_STAT_
      double bps, byps, stall;
      admin_stream_rates(srv, c, s, &bps, &byps, &stall);
      strbuf_puts(b, ",\"batches_per_s\":");
      sb_num(b, bps);
      strbuf_puts(b, ",\"bytes_per_s\":");
      sb_num(b, byps);
      strbuf_puts(b, ",\"stall\":");
      if (stall >= 0) sb_num(b, stall);
      else strbuf_puts(b, "null");
      strbuf_printf(b, "}");
      first = 0;
    }
  }
  strbuf_printf(b, "]}");
}

static void bar(strbuf_t *b, double frac, int width) {
  int n = (int)(frac * width + 0.5);
  if (n < 0) n = 0;
  if (n > width) n = width;
  for (int i = 0; i < n; i++) strbuf_append(b, "#", 1);
  for (int i = n; i < width; i++) strbuf_append(b, " ", 1);
}

/* The same for people; the clients section lists the streams self may see
 * and counts the others. */
static void stats_human(server_t *srv, const conn_t *self, strbuf_t *b) {
  int all = sees_all(self);
  char x[48], y[48], z[48], w[48];
  admin_rates_t r;
  admin_global_rates(srv, &r);
  uint64_t nclients = count_trainers(srv), nstreams = STATS_GET(&srv->stats, streams);
  strbuf_printf(b, "larderd %s · up %s · %" PRIu64 " trainer%s · %" PRIu64 " stream%s · rates over the last %.0f s\n",
            LARDERD_VERSION, fmt_dur(x, sizeof(x), (double)(util_now_ns() - srv->started_ns) / 1e9),
            nclients, nclients == 1 ? "" : "s", nstreams, nstreams == 1 ? "" : "s",
            r.window_s < 1 ? 1.0 : r.window_s);

  /* The cache. */
  store_stats_t st;
  memset(&st, 0, sizeof(st));
  if (srv->store) store_stats_get(srv->store, &st);
  strbuf_printf(b, "\nCache  %s\n", srv->cfg.cache_dir);
  if (srv->store == NULL) {
    strbuf_printf(b, "  none        serving without a cache, every epoch decoded from the sources: "
                 "%s (restart larderd once the cache directory is usable)\n",
              srv->cache_error[0] ? srv->cache_error : "it could not be opened");
  } else {
    strbuf_printf(b, "  used        %s of %s (%.0f%%) · %s entries · %s objects · admission %s\n",
              fmt_bytes(x, sizeof(x), (double)st.used_bytes),
              fmt_bytes(y, sizeof(y), (double)st.capacity_bytes),
              st.capacity_bytes ? (double)st.used_bytes * 100.0 / (double)st.capacity_bytes : 0.0,
              fmt_count(z, sizeof(z), st.entries), fmt_count(w, sizeof(w), st.objects),
              !st.admission_disabled ? "on"
              : st.write_error == LARDER_EIO
                  ? "OFF (writes to the cache disk failed: see the log)"
                  : "OFF (the cache disk is full)");
  }
  uint64_t hit = STATS_GET(&srv->stats, cache_hit_bytes), miss = STATS_GET(&srv->stats, cache_miss_bytes);
  if (hit + miss)
    strbuf_printf(b, "  hit ratio   %.1f%% of unit bytes since the start (%s from the cache, %s decoded)\n",
              (double)hit * 100.0 / (double)(hit + miss), fmt_bytes(x, sizeof(x), (double)hit),
              fmt_bytes(y, sizeof(y), (double)miss));
  else
    strbuf_puts(b, "  hit ratio   - (nothing served yet)\n");
  size_t nd = 0;
  dsagg_t *ds = datasets_of(srv, self, all, &nd);
  if (ds && nd) {
    strbuf_printf(b, "  %-48s %7s %10s\n", "DATASET", "STREAMS", "HIT RATIO");
    for (size_t i = 0; i < nd; i++) {
      char name[64], ratio[16];
      if (ds[i].hit + ds[i].miss)
        snprintf(ratio, sizeof(ratio), "%.1f%%",
                 (double)ds[i].hit * 100.0 / (double)(ds[i].hit + ds[i].miss));
      else
        snprintf(ratio, sizeof(ratio), "-");
      strbuf_printf(b, "  %-48s %7d %10s\n", fmt_fit(name, sizeof(name), ds[i].name, 48), ds[i].streams,
                ratio);
    }
  }
  free(ds);

  /* What memory_limit and footer_memory bound. */
  strbuf_puts(b, "\nMemory\n");
  strbuf_printf(b, "  units       %s of %s (memory_limit)\n",
            fmt_bytes(x, sizeof(x), (double)STATS_GET(&srv->stats, memory_bytes)),
            fmt_bytes(y, sizeof(y), (double)srv->cfg.memory_limit));
  strbuf_printf(b, "  footers     %s of %s (footer_memory) · %s files\n",
            fmt_bytes(x, sizeof(x), (double)STATS_GET(&srv->stats, footer_bytes)),
            fmt_bytes(y, sizeof(y), (double)srv->cfg.footer_memory),
            fmt_count(z, sizeof(z), STATS_GET(&srv->stats, footer_files)));
  /* CUDA streams (cuda.h): device memory per GPU, once one was used. */
  if (cuda_devices_seen() > 0)
    strbuf_printf(b, "  gpu         %s (cuda_device_bytes)\n",
              fmt_bytes(x, sizeof(x), (double)STATS_GET(&srv->stats, cuda_device_bytes)));
  for (int d = 0; d < cuda_devices_seen(); d++)
    strbuf_printf(b, "    device %-3d %s\n", d, fmt_bytes(x, sizeof(x), (double)cuda_device_bytes_of(d)));

  /* Remote fetches. */
  strbuf_puts(b, "\nFetch\n");
  strbuf_printf(b, "  fetched     %s since the start · %.1f MB/s now\n",
            fmt_bytes(x, sizeof(x), (double)STATS_GET(&srv->stats, fetch_bytes)),
            r.fetch_bytes_per_s / 1e6);
  strbuf_printf(b, "  requests    %" PRIu64 " in flight · %s done · %" PRIu64 " retries · %" PRIu64 " errors\n",
            STATS_GET(&srv->stats, fetch_inflight),
            fmt_count(y, sizeof(y), STATS_GET(&srv->stats, fetch_requests)),
            STATS_GET(&srv->stats, fetch_retries), STATS_GET(&srv->stats, fetch_errors));
  char source[16] = "";
  int64_t exp = 0;
  if (srv->awscreds) awscreds_describe(srv->awscreds, source, sizeof(source), &exp);
  if (source[0] || STATS_GET(&srv->stats, credentials_refresh_errors)) {
    /* Where the S3 credentials came from, never what they are (nothing
     * for a daemon that found none and never failed to). */
    int64_t left = exp ? exp - (int64_t)time(NULL) : 0;
    strbuf_printf(b, "  s3 keys     %s", source[0] ? source : "none");
    if (exp) strbuf_printf(b, " · expire in %llds", (long long)(left > 0 ? left : 0));
    strbuf_printf(b, " · %" PRIu64 " refreshes · %" PRIu64 " refresh errors\n",
              STATS_GET(&srv->stats, credentials_refreshes),
              STATS_GET(&srv->stats, credentials_refresh_errors));
  }

  /* Clients. */
  strbuf_printf(b, "\nClients · %.1f MB/s delivered, %.1f batches/s\n", r.batch_bytes_per_s / 1e6,
            r.batches_per_s);
  if (nstreams == 0) {
    strbuf_puts(b, "  (no trainer is reading)\n");
  } else {
    strbuf_printf(b, "  %8s %6s %7s  %-36s %9s %8s %6s\n", "PID", "UID", "RANK", "DATASET", "BATCHES/S",
              "MB/S", "STALL");
    uint64_t hidden = 0;
    for (conn_t *c = srv->conns; c; c = c->next) {
      if (!visible_to(self, all, c)) {
        hidden += (uint64_t)c->num_streams;
        continue;
      }
      for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
        stream_info_t si;
        stream_info(s, &si);
        double bps, byps, stall;
        admin_stream_rates(srv, c, s, &bps, &byps, &stall);
        char rank[24], name[48], st_s[16];
        snprintf(rank, sizeof(rank), "%u/%u", si.rank, si.world_size);
        if (stall >= 0) snprintf(st_s, sizeof(st_s), "%.1f%%", stall * 100);
        else snprintf(st_s, sizeof(st_s), "-");
        strbuf_printf(b, "  %8d %6u %7s  %-36s %9.1f %8.1f %6s\n", (int)c->pid, (unsigned)c->uid, rank,
                  fmt_fit(name, sizeof(name), si.dataset, 36), bps, byps / 1e6, st_s);
      }
    }
    if (hidden)
      strbuf_printf(b, "  (and %" PRIu64 " stream%s of other users, listed to admins only)\n", hidden,
                hidden == 1 ? "" : "s");
  }

  /* Stages. */
  double total = r.fetch_ns + r.decode_ns + r.cache_read_ns + r.assemble_ns;
  strbuf_printf(b, "\nStages · time spent in the last %.0f s, summed over requests and workers\n",
            r.window_s < 1 ? 1.0 : r.window_s);
  const struct {
    const char *name;
    double ns;
  } stages[] = {{"fetch", r.fetch_ns},
                {"decode", r.decode_ns},
                {"cache read", r.cache_read_ns},
                {"assembly", r.assemble_ns}};
  for (size_t i = 0; i < 4; i++) {
    double frac = total > 0 ? stages[i].ns / total : 0;
    strbuf_printf(b, "  %-11s %8.2f s %4.0f%%  ", stages[i].name, stages[i].ns / 1e9, frac * 100);
    bar(b, frac, 30);
    strbuf_puts(b, "\n");
  }
  verdict_t v;
  make_verdict(srv, &r, &v);
  strbuf_printf(b, "\nLimit: %s\n", v.text);
}

static void cmd_stats(conn_t *c, const Larder__AdminRequest *req) {
  strbuf_t b = {0};
  if (req->json) stats_json(c->srv, c, &b);
  else stats_human(c->srv, c, &b);
  reply(c, req->request_id, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

/* ------------------------------------------------------------------------ */
/* clients                                                                   */

/* Lists the connections self may see (visible_to), itself left out. */
static void cmd_clients(conn_t *self, const Larder__AdminRequest *req) {
  server_t *srv = self->srv;
  int all = sees_all(self);
  strbuf_t b = {0};
  uint64_t now = util_now_ns();
  int n = 0;
  if (req->json) strbuf_puts(&b, "{\"clients\":[");
  else
    strbuf_printf(&b, "%6s %8s %6s %6s  %-16s %10s %7s\n", "CLIENT", "PID", "UID", "GID", "NAME",
              "CONNECTED", "STREAMS");
  for (conn_t *c = srv->conns; c; c = c->next) {
    if (c == self || c->closing || c->draining || !visible_to(self, all, c)) continue;
    double age = (double)(now - c->connected_ns) / 1e9;
    if (req->json) {
      strbuf_printf(&b, "%s{\"client\":%" PRIu64 ",\"pid\":%d,\"uid\":%u,\"gid\":%u,\"name\":",
                n ? "," : "", c->id, (int)c->pid, (unsigned)c->uid, (unsigned)c->gid);
      sb_json(&b, c->name);
      strbuf_puts(&b, ",\"connected_s\":");
      sb_num(&b, age);
      strbuf_printf(&b, ",\"arena_bytes\":%" PRIu64 ",\"pending\":%d,\"streams\":[", c->arena_bytes,
                c->pending_requests);
    } else {
      char d[32];
      strbuf_printf(&b, "%6" PRIu64 " %8d %6u %6u  %-16.16s %10s %7d\n", c->id, (int)c->pid,
                (unsigned)c->uid, (unsigned)c->gid, c->name[0] ? c->name : "?",
                fmt_dur(d, sizeof(d), age), c->num_streams);
    }
    int k = 0;
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      stream_info_t si;
      stream_info(s, &si);
      const stats_stream_t *ss = stream_stats(s);
      double bps, byps, stall;
      admin_stream_rates(srv, c, s, &bps, &byps, &stall);
      if (req->json) {
        strbuf_printf(&b, "%s{\"stream\":%u,\"rank\":%u,\"world_size\":%u,\"dataset\":", k ? "," : "",
                  si.id, si.rank, si.world_size);
        sb_json(&b, si.dataset);
        strbuf_puts(&b, ",\"job\":");
        sb_json(&b, si.job);
        strbuf_printf(&b,
                  ",\"files\":%" PRIu64 ",\"rows\":%" PRIu64 ",\"batches_per_epoch\":%" PRIu64
                  ",\"epochs\":%" PRIu64 ",\"batches\":%" PRIu64 ",\"bytes\":%" PRIu64
                  ",\"arena_bytes\":%" PRIu64 ",\"window\":%u,\"partitions\":%u,"
                  "\"node_partitions\":[%u,%u],\"stall\":",
                  si.num_files, si.total_rows, si.batches_per_epoch, si.epochs,
                  STATS_GET(ss, batches), STATS_GET(ss, bytes), si.arena_bytes, si.window,
                  si.partitions, si.part_first, si.part_last);
        if (stall >= 0) sb_num(&b, stall);
        else strbuf_puts(&b, "null");
        strbuf_puts(&b, "}");
      } else {
        char name[64], a[32], st_s[16];
        if (stall >= 0) snprintf(st_s, sizeof(st_s), "%.1f%%", stall * 100);
        else snprintf(st_s, sizeof(st_s), "-");
        uint64_t bpe = si.batches_per_epoch ? si.batches_per_epoch : 1;
        uint64_t done = STATS_GET(ss, batches);
        char epochs[32];
        if (si.epochs) snprintf(epochs, sizeof(epochs), "of %" PRIu64, si.epochs);
        else snprintf(epochs, sizeof(epochs), "(unbounded)");
        char parts[48 + 80] = "";
        if (si.partitions > 1)
          snprintf(parts, sizeof(parts), " · partitions %u-%u of %u", si.part_first,
                   si.part_last - 1, si.partitions);
        if (si.job[0]) snprintf(parts + strlen(parts), sizeof(parts) - strlen(parts), " · job %s", si.job);
        strbuf_printf(&b,
                  "         stream %u: rank %u/%u%s · %s · %.1f epochs %s · %" PRIu64
                  " batches (%s) · stall %s\n",
                  si.id, si.rank, si.world_size, parts,
                  fmt_fit(name, sizeof(name), si.dataset, 48), (double)done / (double)bpe, epochs,
                  done, fmt_bytes(a, sizeof(a), (double)STATS_GET(ss, bytes)), st_s);
      }
      k++;
    }
    if (req->json) strbuf_puts(&b, "]}");
    n++;
  }
  if (req->json) strbuf_puts(&b, "]}");
  else if (n == 0) {
    free(b.data);
    memset(&b, 0, sizeof(b));
    strbuf_puts(&b, all ? "no client is connected\n"
                    : "no client of yours is connected (other users' are listed to admins only)\n");
  }
  reply(self, req->request_id, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

/* ------------------------------------------------------------------------ */
/* ls                                                                        */

typedef struct objlist {
  store_object_info_t *v;
  size_t n, cap;
  int oom;
} objlist_t;

static void collect_object(const store_object_info_t *info, void *arg) {
  objlist_t *l = arg;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    store_object_info_t *v = realloc(l->v, cap * sizeof(*v));
    if (v == NULL) {
      l->oom = 1;
      return;
    }
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = *info;
}

static int cmp_object(const void *a, const void *b) {
  const store_object_info_t *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c) return c;
  return x->last_use < y->last_use ? 1 : x->last_use > y->last_use ? -1 : 0;
}

static int list_objects(server_t *srv, objlist_t *l) {
  memset(l, 0, sizeof(*l));
  if (srv->store == NULL) return 0;
  int rc = store_list_objects(srv->store, collect_object, l);
  if (rc < 0) return rc;
  if (l->oom) return LARDER_ENOMEM;
  if (l->n > 1) qsort(l->v, l->n, sizeof(*l->v), cmp_object);
  return 0;
}

static const char *fmt_ago(char *buf, size_t size, int64_t unix_s) {
  if (unix_s <= 0) {
    snprintf(buf, size, "never");
    return buf;
  }
  char d[32];
  double ago = (double)((int64_t)time(NULL) - unix_s);
  if (ago < 1) snprintf(buf, size, "just now");
  else snprintf(buf, size, "%s ago", fmt_dur(d, sizeof(d), ago));
  return buf;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The objects a non-admin's ls shows: the files that the open streams of
 * self's uid read (any of its connections), as a sorted array of object
 * ids in *ids (free it; NULL when *n is 0).  Returns 0 or LARDER_ENOMEM.
 * Loop thread. */
static int own_objects(const conn_t *self, uint64_t **ids, size_t *n) {
  *ids = NULL;
  *n = 0;
  size_t cap = 0;
  for (conn_t *c = self->srv->conns; c; c = c->next) {
    if (!visible_to(self, 0, c)) continue;
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      stream_info_t si;
      stream_info(s, &si);
      for (uint32_t i = 0; si.ds && i < si.ds->num_files; i++) {
        if (*n == cap) {
          cap = cap ? cap * 2 : 64;
          uint64_t *v = realloc(*ids, cap * sizeof(*v));
          if (v == NULL) {
            free(*ids);
            *ids = NULL;
            *n = 0;
            return LARDER_ENOMEM;
          }
          *ids = v;
        }
        (*ids)[(*n)++] = si.ds->files[i].object_id;
      }
    }
  }
  if (*n > 1) qsort(*ids, *n, sizeof(**ids), cmp_u64);
  return 0;
}

/* Lists the cached objects: all of them to an admin, else those that the
 * user's open streams read (own_objects). */
static void cmd_ls(conn_t *c, const Larder__AdminRequest *req) {
  int all = sees_all(c);
  uint64_t *own = NULL;
  size_t num_own = 0;
  if (!all && own_objects(c, &own, &num_own) != 0) {
    reply_error(c, req->request_id, LARDER_ENOMEM, "cannot list the cache: %s",
                larder_strerror(LARDER_ENOMEM));
    return;
  }
  objlist_t l;
  int rc = list_objects(c->srv, &l);
  if (rc) {
    free(own);
    reply_error(c, req->request_id, rc, "cannot list the cache: %s", larder_strerror(rc));
    return;
  }
  const char *pos[1];
  const char *prefix = positional(req, pos, 1) ? pos[0] : NULL;
  strbuf_t b = {0};
  uint64_t bytes = 0, entries = 0;
  size_t shown = 0;
  if (req->json) strbuf_puts(&b, "{\"objects\":[");
  else
    /* Fixed-width columns first, then the object and its identity whole:
     * a name or an identity is never cut to fit a column. */
    strbuf_printf(&b, "%-16s  %10s %8s  %-16s  %s\n", "ID", "BYTES", "ENTRIES", "LAST USE",
              "OBJECT (IDENTITY)");
  for (size_t i = 0; i < l.n; i++) {
    const store_object_info_t *o = &l.v[i];
    if (prefix && strncmp(o->name, prefix, strlen(prefix)) != 0) continue;
    if (!all && (num_own == 0 || !bsearch(&o->id, own, num_own, sizeof(*own), cmp_u64))) continue;
    bytes += o->bytes;
    entries += o->entries;
    if (req->json) {
      strbuf_printf(&b, "%s{\"id\":\"%016" PRIx64 "\",\"object\":", shown ? "," : "", o->id);
      sb_json(&b, o->name);
      strbuf_puts(&b, ",\"identity\":");
      sb_json(&b, o->identity);
      strbuf_printf(&b, ",\"bytes\":%" PRIu64 ",\"entries\":%" PRIu64 ",\"last_use_unix\":%" PRId64 "}",
                o->bytes, o->entries, o->last_use);
    } else {
      char a[32], ago[48];
      strbuf_printf(&b, "%016" PRIx64 "  %10s %8" PRIu64 "  %-16s  %s (%s)\n", o->id,
                fmt_bytes(a, sizeof(a), (double)o->bytes), o->entries,
                fmt_ago(ago, sizeof(ago), o->last_use), o->name, o->identity);
    }
    shown++;
  }
  if (req->json) {
    strbuf_printf(&b, "],\"total\":{\"objects\":%zu,\"bytes\":%" PRIu64 ",\"entries\":%" PRIu64 "}}",
              shown, bytes, entries);
  } else {
    char a[32], n[32];
    if (shown == 0) {
      free(b.data);
      memset(&b, 0, sizeof(b));
      if (all)
        strbuf_printf(&b, "the cache holds nothing%s%s\n", prefix ? " under " : "",
                  prefix ? prefix : "");
      else
        strbuf_printf(&b,
                  "the cache holds nothing%s%s that your open streams read (other users' "
                  "objects are listed to admins only)\n",
                  prefix ? " under " : "", prefix ? prefix : "");
    } else {
      strbuf_printf(&b, "%zu object%s, %s in %s entries (an entry is one column of one unit)\n", shown,
                shown == 1 ? "" : "s", fmt_bytes(a, sizeof(a), (double)bytes),
                fmt_count(n, sizeof(n), entries));
    }
  }
  free(l.v);
  free(own);
  reply(c, req->request_id, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

/* ------------------------------------------------------------------------ */
/* config and reload                                                         */

typedef struct cfgdump {
  strbuf_t *b;
  int json;
  int n;
} cfgdump_t;

static void dump_key(const char *key, const char *value, int live, void *arg) {
  cfgdump_t *d = arg;
  if (d->json) {
    strbuf_puts(d->b, d->n ? "," : "");
    strbuf_printf(d->b, "{\"key\":\"%s\",\"value\":", key);
    sb_json(d->b, value);
    strbuf_printf(d->b, ",\"live\":%s}", live ? "true" : "false");
  } else {
    strbuf_printf(d->b, "%-28s = %s\n", key, value);
  }
  d->n++;
}

static void cmd_config(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  strbuf_t b = {0};
  cfgdump_t d = {&b, req->json, 0};
  if (req->json) {
    strbuf_puts(&b, "{\"config_path\":");
    if (srv->config_path) sb_json(&b, srv->config_path);
    else strbuf_puts(&b, "null");
    strbuf_puts(&b, ",\"keys\":[");
  } else {
    strbuf_printf(&b, "# the configuration in effect (%s, then command-line flags); secrets hidden\n",
              srv->config_path ? srv->config_path : "defaults");
  }
  config_each(&srv->cfg, dump_key, &d);
  if (req->json) strbuf_puts(&b, "]}");
  reply(c, req->request_id, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

/* Appends a JSON array of the keys in list ("a, b, c"; "" for none). */
static void sb_key_list(strbuf_t *b, const char *list) {
  strbuf_puts(b, "[");
  int first = 1;
  for (const char *p = list; *p;) {
    while (*p == ' ' || *p == ',') p++;
    size_t n = strcspn(p, ", ");
    if (n == 0) break;
    char key[128];
    snprintf(key, sizeof(key), "%.*s", (int)(n < sizeof(key) - 1 ? n : sizeof(key) - 1), p);
    if (!first) strbuf_puts(b, ",");
    sb_json(b, key);
    first = 0;
    p += n;
  }
  strbuf_puts(b, "]");
}

static void cmd_reload(conn_t *c, const Larder__AdminRequest *req) {
  char summary[2400], changed[1024], restart[512];
  int rc = server_reload(c->srv, summary, sizeof(summary), changed, sizeof(changed), restart,
                         sizeof(restart));
  if (rc) {
    reply_error(c, req->request_id, rc, "reload failed: %s", summary);
    return;
  }
  strbuf_t b = {0};
  if (req->json) {
    strbuf_puts(&b, "{\"reloaded\":true,\"changed\":");
    sb_key_list(&b, changed);
    strbuf_puts(&b, ",\"restart_needed\":");
    sb_key_list(&b, restart);
    strbuf_puts(&b, ",\"summary\":");
    sb_json(&b, summary);
    strbuf_puts(&b, "}");
  } else {
    strbuf_printf(&b, "%s\n", summary);
  }
  reply(c, req->request_id, 0, b.data);
  free(b.data);
}

/* ------------------------------------------------------------------------ */
/* Jobs                                                                      */

enum { JOB_EVICT, JOB_VERIFY, JOB_PREFETCH, JOB_REMOTE };

struct job {
  int kind;
  server_t *srv;
  uint64_t conn_id;
  uint32_t request_id;
  int json;
  int dry_run;
  int cancelled;
  int finished;        /* the last reply went out (or cannot) */
  int async;           /* callbacks still to come */
  int freeing;
  job_t *next;
  work_t work;
  uv_timer_t timer;    /* prefetch polls, cat waits out a backlog */
  void (*cancel)(job_t *j);   /* stop what is in flight (the job is cancelled) */
  void (*destroy)(job_t *j);  /* free what the kind owns */
  void (*work_fn)(job_t *j);
  void (*after_fn)(job_t *j);
};

static void on_job_timer_closed(uv_handle_t *h) {
  job_t *j = h->data;
  free(j);
}

static void job_maybe_free(job_t *j) {
  if (j->freeing || j->async > 0 || !(j->finished || j->cancelled)) return;
  j->freeing = 1;
  admin_state_t *as = j->srv->admin;
  if (as) {
    job_t **pp = &as->jobs;
    while (*pp && *pp != j) pp = &(*pp)->next;
    if (*pp) *pp = j->next;
  }
  conn_t *c = find_conn(j->srv, j->conn_id);
  if (c && c->pending_requests > 0) c->pending_requests--;
  if (j->destroy) j->destroy(j);
  uv_timer_stop(&j->timer);
  uv_close((uv_handle_t *)&j->timer, on_job_timer_closed);
}

/* Allocates a job of size bytes (a struct that starts with job_t) for
 * connection c, or replies with the limit it would exceed. */
static void *job_new(conn_t *c, const Larder__AdminRequest *req, int kind, size_t size) {
  server_t *srv = c->srv;
  if (c->pending_requests >= (int)srv->cfg.max_pending_per_client) {
    reply_error(c, req->request_id, LARDER_ELIMIT,
                "this client has %d requests in progress, the limit (max_pending_per_client)",
                c->pending_requests);
    return NULL;
  }
  admin_state_t *as = state_of(srv);
  job_t *j = calloc(1, size);
  if (j == NULL || as == NULL) {
    free(j);
    reply_error(c, req->request_id, LARDER_ENOMEM, "out of memory");
    return NULL;
  }
  j->kind = kind;
  j->srv = srv;
  j->conn_id = c->id;
  j->request_id = req->request_id;
  j->json = req->json;
  j->dry_run = req->dry_run;
  uv_timer_init(srv->loop, &j->timer);
  j->timer.data = j;
  j->work.data = j;
  j->next = as->jobs;
  as->jobs = j;
  c->pending_requests++;
  return j;
}

static conn_t *job_conn(job_t *j) { return j->cancelled ? NULL : find_conn(j->srv, j->conn_id); }

static void job_finish(job_t *j, int code, const char *text) {
  if (!j->finished) {
    j->finished = 1;
    reply(job_conn(j), j->request_id, code, text);
  }
  job_maybe_free(j);
}

/* The admin jobs running (prefetch, verify, evict, remote reads), and how
 * many of them are prefetches. */
static int jobs_running(server_t *srv, int *prefetches) {
  int n = 0;
  *prefetches = 0;
  admin_state_t *as = srv->admin;
  for (job_t *j = as ? as->jobs : NULL; j; j = j->next) {
    n++;
    *prefetches += j->kind == JOB_PREFETCH;
  }
  return n;
}

static void job_fail(job_t *j, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void job_fail(job_t *j, int code, const char *fmt, ...) {
  char msg[2400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  job_finish(j, code, msg);
}

static void job_work_cb(work_t *w) {
  job_t *j = w->data;
  j->work_fn(j);
}

static void job_after_cb(work_t *w, int status) {
  job_t *j = w->data;
  j->async--;
  if (j->cancelled) {
    job_maybe_free(j);
    return;
  }
  if (status == UV_ECANCELED) {
    job_fail(j, LARDER_ESHUTDOWN, "the daemon is shutting down");
    return;
  }
  j->after_fn(j);
}

/* Runs work(j) on a worker thread, then after(j) on the loop unless the
 * job was cancelled meanwhile (then it is freed).  Returns 0 or
 * LARDER_ENOMEM (nothing queued). */
static int job_queue(job_t *j, void (*work)(job_t *j), void (*after)(job_t *j)) {
  j->work_fn = work;
  j->after_fn = after;
  j->async++;
  if (work_queue(j->srv->pool, &j->work, job_work_cb, job_after_cb) != 0) {
    j->async--;
    return LARDER_ENOMEM;
  }
  return 0;
}

static void admin_cancel(job_t *j) {
  if (j->cancelled || j->freeing) return;
  j->cancelled = 1;
  if (j->cancel) j->cancel(j);
  job_maybe_free(j);
}

void admin_conn_closed(conn_t *c) {
  admin_state_t *as = c->srv->admin;
  if (as == NULL) return;
  job_t *j = as->jobs;
  while (j) {
    job_t *next = j->next;
    if (j->conn_id == c->id) admin_cancel(j);
    j = next;
  }
}

void admin_shutdown(server_t *srv) {
  admin_state_t *as = srv->admin;
  if (as == NULL) return;
  job_t *j = as->jobs;
  while (j) {
    job_t *next = j->next;
    admin_cancel(j);
    j = next;
  }
  if (as->jobs == NULL) {
    free(as->rates);
    free(as);
    srv->admin = NULL;
  }
}

/* ------------------------------------------------------------------------ */
/* evict and verify                                                          */

typedef struct evict_job {
  job_t j;
  uint64_t *ids;
  size_t num_ids;
  uint64_t entries, bytes;
  int rc;
  char what[600];
} evict_job_t;

/* Whether a cached object's name belongs to a dataset source: the object
 * itself, a file of a directory (not recursive, as streams read them), an
 * object under an S3 prefix, or a match of a glob. */
static int source_matches(const char *src, const char *name) {
  int url = remote_is_url(src);
  /* src is never NULL: cmd_evict counts the --dataset arguments and then
   * collects them in a second pass over the same arguments, which the
   * analyzer cannot tell finds as many. */
  /* NOLINTNEXTLINE(clang-analyzer-core.NonNullParamChecker) */
  if (strpbrk(src, "*?[")) return fnmatch(src, name, url ? 0 : FNM_PATHNAME) == 0;
  size_t n = strlen(src);
  if (n == 0 || strncmp(name, src, n) != 0) return 0;
  if (name[n] == '\0') return 1;
  const char *rest = name + n;
  if (src[n - 1] != '/') {
    if (*rest != '/') return 0;
    rest++;
  }
  return url || strchr(rest, '/') == NULL;
}

/* Local sources also match through their resolved paths (what streams
 * record as object names). */
static int dataset_matches(char **sources, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++) {
    if (source_matches(sources[i], name)) return 1;
    if (remote_is_url(sources[i])) continue;
    if (strpbrk(sources[i], "*?[")) {
      glob_t g;
      if (glob(sources[i], 0, NULL, &g) == 0) {
        int hit = 0;
        for (size_t k = 0; k < g.gl_pathc && !hit; k++) {
          char real[PATH_MAX];
          hit = realpath(g.gl_pathv[k], real) && strcmp(real, name) == 0;
        }
        globfree(&g);
        if (hit) return 1;
      }
    } else {
      char real[PATH_MAX];
      if (realpath(sources[i], real) && source_matches(real, name)) return 1;
    }
  }
  return 0;
}

static int is_object_id(const char *s, uint64_t *id) {
  if (strlen(s) != 16) return 0;
  for (int i = 0; i < 16; i++)
    if (!isxdigit((unsigned char)s[i])) return 0;
  *id = strtoull(s, NULL, 16);
  return 1;
}

static void evict_work(job_t *j) {
  evict_job_t *e = (evict_job_t *)j;
  for (size_t i = 0; i < e->num_ids; i++) {
    uint64_t n = 0, b = 0;
    int rc = store_evict(j->srv->store, NULL, e->ids[i], j->dry_run, &n, &b);
    if (rc && e->rc == 0) e->rc = rc;
    e->entries += n;
    e->bytes += b;
  }
}

static void evict_after(job_t *j) {
  evict_job_t *e = (evict_job_t *)j;
  if (e->rc) {
    job_fail(j, e->rc, "evict %s: %s", e->what, larder_strerror(e->rc));
    return;
  }
  char a[32], n[32];
  log_notice("admin evict %s%s: %zu objects, %" PRIu64 " entries, %" PRIu64 " bytes", e->what,
             j->dry_run ? " (dry run)" : "", e->num_ids, e->entries, e->bytes);
  strbuf_t b = {0};
  if (j->json)
    strbuf_printf(&b,
              "{\"dry_run\":%s,\"objects\":%zu,\"entries\":%" PRIu64 ",\"bytes\":%" PRIu64 "}",
              j->dry_run ? "true" : "false", e->num_ids, e->entries, e->bytes);
  else if (e->num_ids == 0)
    strbuf_printf(&b, "nothing to evict: no cached object matches %s\n", e->what);
  else
    strbuf_printf(&b, "%s %s in %s entries of %zu object%s (%s)%s\n",
              j->dry_run ? "would free" : "freed", fmt_bytes(a, sizeof(a), (double)e->bytes),
              fmt_count(n, sizeof(n), e->entries), e->num_ids, e->num_ids == 1 ? "" : "s", e->what,
              j->dry_run ? "; nothing was evicted (--dry-run)" : "");
  job_finish(j, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

static void evict_destroy(job_t *j) { free(((evict_job_t *)j)->ids); }

static void cmd_evict(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  const char *pos[256];
  size_t npos = positional(req, pos, 256);
  int all = opt_flag(req, "all");
  const char *prefix = opt_value(req, "prefix");
  size_t ndatasets = 0;
  for (size_t i = 0; i < req->n_args; i++)
    if (req->args[i] && strncmp(req->args[i], "--dataset=", 10) == 0) ndatasets++;
  int modes = (all != 0) + (prefix != NULL) + (ndatasets > 0) + (npos > 0);
  if (modes != 1) {
    reply_error(c, req->request_id, LARDER_EINVAL,
                "evict: name what to evict, one way: OBJECT... (ids or names from `larderctl "
                "ls`), --prefix URL-OR-PATH, --dataset SOURCE, or --all");
    return;
  }
  if (srv->store == NULL) {
    reply_error(c, req->request_id, LARDER_EUNSUPPORTED, "the daemon has no cache");
    return;
  }
  objlist_t l;
  int rc = list_objects(srv, &l);
  if (rc) {
    reply_error(c, req->request_id, rc, "cannot list the cache: %s", larder_strerror(rc));
    return;
  }
  char **datasets = NULL;
  if (ndatasets) {
    datasets = calloc(ndatasets, sizeof(char *));
    size_t k = 0;
    for (size_t i = 0; datasets && i < req->n_args; i++)
      if (req->args[i] && strncmp(req->args[i], "--dataset=", 10) == 0)
        datasets[k++] = req->args[i] + 10;
  }
  evict_job_t *e = job_new(c, req, JOB_EVICT, sizeof(evict_job_t));
  if (e == NULL) {
    free(datasets);
    free(l.v);
    return;
  }
  e->j.destroy = evict_destroy;
  e->ids = calloc(l.n + 1, sizeof(uint64_t));
  if (e->ids == NULL || (ndatasets && datasets == NULL)) {
    free(datasets);
    free(l.v);
    job_fail(&e->j, LARDER_ENOMEM, "out of memory");
    return;
  }
  if (all) snprintf(e->what, sizeof(e->what), "the whole cache");
  else if (prefix) snprintf(e->what, sizeof(e->what), "prefix %s", prefix);
  else if (ndatasets) snprintf(e->what, sizeof(e->what), "dataset %s%s", datasets[0], ndatasets > 1 ? " ..." : "");
  else snprintf(e->what, sizeof(e->what), "%s%s", pos[0], npos > 1 ? " ..." : "");
  /* Local datasets are resolved as the admin who named them, as a stream
   * or a prefetch of theirs would be. */
  cred_saved_t saved = {0};
  if (ndatasets) {
    acl_peer_t peer;
    conn_peer(c, &peer);
    char why[512];
    rc = cred_enter(&peer, &saved, why, sizeof(why));
    if (rc) {
      free(datasets);
      free(l.v);
      job_fail(&e->j, rc, "%s", why);
      return;
    }
  }
  for (size_t i = 0; i < l.n; i++) {
    const store_object_info_t *o = &l.v[i];
    int take = all;
    if (prefix) take = strncmp(o->name, prefix, strlen(prefix)) == 0;
    if (ndatasets) take = dataset_matches(datasets, ndatasets, o->name);
    for (size_t k = 0; k < npos && !take; k++) {
      uint64_t id;
      take = (is_object_id(pos[k], &id) && id == o->id) || strcmp(pos[k], o->name) == 0;
    }
    if (take) e->ids[e->num_ids++] = o->id;
  }
  if (ndatasets) cred_leave(&saved);
  free(datasets);
  free(l.v);
  if (npos && e->num_ids == 0) {
    job_fail(&e->j, LARDER_ENOENT, "evict: no cached object is %s (see `larderctl ls`)", pos[0]);
    return;
  }
  if (job_queue(&e->j, evict_work, evict_after) != 0)
    job_fail(&e->j, LARDER_ENOMEM, "cannot queue the eviction");
}

typedef struct verify_job {
  job_t j;
  uint64_t checked, bad;
  int rc;
  char err[512];
} verify_job_t;

static void verify_work(job_t *j) {
  verify_job_t *v = (verify_job_t *)j;
  v->rc = store_verify(j->srv->store, &v->checked, &v->bad, v->err, sizeof(v->err));
}

static void verify_after(job_t *j) {
  verify_job_t *v = (verify_job_t *)j;
  if (v->rc == LARDER_ECORRUPT) {
    /* The scan stopped at a damaged table file: values past it were not
     * read, and reads of them fail (and are decoded again) until the file
     * goes. */
    job_fail(j, v->rc,
             "verify: stopped after %" PRIu64 " values (%" PRIu64 " bad, dropped): %s; stop "
             "larderd and remove %s to start an empty cache (the sources hold everything "
             "in it)",
             v->checked, v->bad, v->err[0] ? v->err : larder_strerror(v->rc),
             j->srv->cfg.cache_dir);
    return;
  }
  if (v->rc) {
    job_fail(j, v->rc, "verify: %s", v->err[0] ? v->err : larder_strerror(v->rc));
    return;
  }
  log_notice("admin verify: %" PRIu64 " values checked, %" PRIu64 " bad ones dropped", v->checked,
             v->bad);
  strbuf_t b = {0};
  char n[32];
  if (j->json)
    strbuf_printf(&b, "{\"checked\":%" PRIu64 ",\"bad\":%" PRIu64 ",\"dropped\":%" PRIu64 "}",
              v->checked, v->bad, v->bad);
  else if (v->bad == 0)
    strbuf_printf(&b, "checked %s cached values: every checksum matches\n",
              fmt_count(n, sizeof(n), v->checked));
  else
    strbuf_printf(&b,
              "checked %s cached values: %" PRIu64 " had a bad checksum and were dropped "
              "(they are rebuilt when next needed)\n",
              fmt_count(n, sizeof(n), v->checked), v->bad);
  job_finish(j, 0, b.data);
  free(b.data);
}

static void cmd_verify(conn_t *c, const Larder__AdminRequest *req) {
  if (c->srv->store == NULL) {
    reply_error(c, req->request_id, LARDER_EUNSUPPORTED, "the daemon has no cache");
    return;
  }
  verify_job_t *v = job_new(c, req, JOB_VERIFY, sizeof(verify_job_t));
  if (v == NULL) return;
  if (job_queue(&v->j, verify_work, verify_after) != 0)
    job_fail(&v->j, LARDER_ENOMEM, "cannot queue the verification");
}

/* ------------------------------------------------------------------------ */
/* prefetch                                                                  */

typedef struct pf_rg {
  uint32_t next, end; /* its units [next, end) not yet started */
} pf_rg_t;

typedef struct pf_active {
  unit_t *u;
  uint32_t index;
  uint32_t rg;
  int offering;       /* a worker writes it to the cache (pf_offer) */
} pf_active_t;

typedef struct prefetch_job {
  job_t j;
  char **sources;
  size_t num_sources;
  char **columns;
  size_t num_columns;
  char **roots;
  acl_peer_t peer; /* who asked: local sources are opened as it */
  /* --partitions P --nodes N --node n --seed S: the row groups of node n's
   * partitions alone (shuffle_partition_assign). */
  uint64_t partitions, nodes, node, seed;
  uint32_t units_total; /* the units it warms: the dataset's, or the node's */
  char *label;
  remote_object_t *remote;
  size_t num_remote;
  dataset_options_t dopts;
  dataset_t *ds;
  int rc;
  char err[1024];
  uint8_t *cached;  /* per unit: every column was cached at the start */
  pf_rg_t *rgs;
  uint32_t num_rgs, next_rg;
  pf_active_t *active;
  int num_active, max_active;
  int polling;
  uint64_t total_bytes, done_bytes, before_bytes;
  uint64_t before_units, cached_units, not_admitted, failed;
  char first_error[600];
  uint64_t started_ns, last_progress_ns, last_done_bytes;
} prefetch_job_t;

static int pf_unit_cached(prefetch_job_t *p, uint32_t k) {
  store_t *st = p->j.srv->store;
  for (int c = 0; c < p->ds->num_columns; c++) {
    store_key_t key;
    dataset_column_key(p->ds, k, c, &key);
    if (!store_contains(st, &key)) return 0;
  }
  return 1;
}

static void pf_open_work(job_t *j) {
  prefetch_job_t *p = (prefetch_job_t *)j;
  p->rc = dataset_open((const char *const *)p->sources, p->num_sources,
                       (const char *const *)p->columns, p->num_columns, &p->dopts, &p->ds, p->err,
                       sizeof(p->err));
  if (p->rc) return;
  /* What the cache holds already: the resumable part. */
  p->cached = calloc((size_t)p->ds->num_units + 1, 1);
  if (p->cached == NULL) {
    p->rc = LARDER_ENOMEM;
    snprintf(p->err, sizeof(p->err), "out of memory");
    return;
  }
  for (uint32_t k = 0; k < p->ds->num_units; k++) p->cached[k] = (uint8_t)pf_unit_cached(p, k);
  dataset_register_objects(j->srv->store, p->ds);
}

static void pf_event(prefetch_job_t *p, const char *event, int final) {
  server_t *srv = p->j.srv;
  double elapsed = (double)(util_now_ns() - p->started_ns) / 1e9;
  double rate = elapsed > 0 ? (double)(p->done_bytes - p->before_bytes) / elapsed : 0;
  double eta = rate > 0 ? (double)(p->total_bytes - p->done_bytes) / rate : -1;
  uint64_t done_units = p->before_units + p->cached_units + p->not_admitted + p->failed;
  store_stats_t st;
  memset(&st, 0, sizeof(st));
  if (srv->store) store_stats_get(srv->store, &st);
  strbuf_t b = {0};
  strbuf_printf(&b, "{\"event\":\"%s\",\"dataset\":", event);
  sb_json(&b, p->label);
  strbuf_printf(&b,
            ",\"files\":%u,\"units\":%u,\"units_done\":%" PRIu64 ",\"total_bytes\":%" PRIu64
            ",\"done_bytes\":%" PRIu64 ",\"cached_before_units\":%" PRIu64
            ",\"cached_before_bytes\":%" PRIu64 ",\"cached_units\":%" PRIu64
            ",\"not_admitted_units\":%" PRIu64 ",\"failed_units\":%" PRIu64 ",\"bytes_per_s\":",
            p->ds->num_files, p->units_total, done_units, p->total_bytes, p->done_bytes,
            p->before_units, p->before_bytes, p->cached_units, p->not_admitted, p->failed);
  sb_num(&b, rate);
  strbuf_puts(&b, ",\"eta_s\":");
  if (eta >= 0) sb_num(&b, eta);
  else strbuf_puts(&b, "null");
  strbuf_printf(&b, ",\"concurrency\":%d", p->max_active);
  strbuf_puts(&b, ",\"elapsed_s\":");
  sb_num(&b, elapsed);
  strbuf_printf(&b, ",\"cache_used_bytes\":%" PRIu64 ",\"cache_capacity_bytes\":%" PRIu64,
            st.used_bytes, st.capacity_bytes);
  /* Why units were not kept, for larderctl's note: the cache's ranking, or
   * admission being off. */
  strbuf_puts(&b, ",\"admission\":");
  sb_json(&b, srv->store == NULL            ? "none: larderd runs without a cache (larderctl stats)"
              : !st.admission_disabled      ? "on"
              : st.write_error == LARDER_EIO ? "off: writes to the cache disk failed (see the log)"
                                            : "off: the cache disk is full");
  if (p->first_error[0]) {
    strbuf_puts(&b, ",\"error\":");
    sb_json(&b, p->first_error);
  }
  strbuf_puts(&b, "}");
  if (final) {
    log_notice("admin prefetch %s: %" PRIu64 " units cached now, %" PRIu64
               " already, %" PRIu64 " not admitted, %" PRIu64 " failed, in %.1f s",
               p->label, p->cached_units, p->before_units, p->not_admitted, p->failed, elapsed);
    job_finish(&p->j, b.error ? LARDER_ENOMEM : 0, b.data);
  } else {
    conn_t *c = job_conn(&p->j);
    /* Progress is periodic: skip a frame rather than queue behind a slow
     * reader. */
    if (c && uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) < (1u << 20))
      reply_frame(c, p->j.request_id, 0, b.data ? b.data : "", b.len, 1);
  }
  free(b.data);
}

/* Starts the next uncached unit of row group r; 1 when one started. */
static int pf_start_in_rg(prefetch_job_t *p, uint32_t r) {
  pf_rg_t *g = &p->rgs[r];
  while (g->next < g->end) {
    uint32_t k = g->next++;
    if (p->cached[k]) continue;
    uint64_t est = p->ds->units[k].est_bytes;
    if (pf_unit_cached(p, k)) {
      /* Cached meanwhile (the load of an earlier unit decodes ahead). */
      p->cached_units++;
      p->done_bytes += est;
      continue;
    }
    unit_t *u = units_acquire(p->j.srv, p->ds, k);
    /* A load this prefetch started, no stream wanting it yet. */
    if (u && u->refs == 1 && u->state == UNIT_LOADING) u->for_prefetch = 1;
    if (u == NULL) {
      p->failed++;
      p->done_bytes += est;
      if (!p->first_error[0]) snprintf(p->first_error, sizeof(p->first_error), "out of memory");
      continue;
    }
    pf_active_t *a = &p->active[p->num_active++];
    a->u = u;
    a->index = k;
    a->rg = r;
    a->offering = 0;
    return 1;
  }
  return 0;
}

static void pf_fill(prefetch_job_t *p) {
  while (p->num_active < p->max_active && p->next_rg < p->num_rgs) pf_start_in_rg(p, p->next_rg++);
}

/* Ends active slot i: counts what became of its unit, lets the unit go and
 * starts the next one of its row group. */
static void pf_complete(prefetch_job_t *p, int i, int cached) {
  pf_active_t a = p->active[i];
  if (a.u->state == UNIT_FAILED) {
    p->failed++;
    if (!p->first_error[0])
      snprintf(p->first_error, sizeof(p->first_error), "%s",
               a.u->message ? a.u->message : larder_strerror(a.u->error));
  } else if (cached) {
    p->cached_units++;
  } else {
    p->not_admitted++;
  }
  p->done_bytes += p->ds->units[a.index].est_bytes;
  units_release(p->j.srv, a.u);
  p->active[i] = p->active[--p->num_active];
  pf_start_in_rg(p, a.rg);
}

/*
 * A unit that was in memory already (a stream decoded it, or it stayed
 * after an evict) is READY without being cached: its column blobs are
 * written to the cache on a worker, as a load would have offered them.
 * READY units are immutable, so the worker may read them.
 */
typedef struct pf_offer {
  work_t work;
  prefetch_job_t *p;
  unit_t *u;
  uint32_t index;
  int admitted;
} pf_offer_t;

/* Writes the columns of o's unit that the cache lacks (units_offer), from
 * its decoded blobs or the cache values it was read from; o->admitted says
 * whether the cache holds them all afterwards. */
static void pf_offer_work(work_t *w) {
  pf_offer_t *o = w->data;
  store_t *st = o->p->j.srv->store;
  const dataset_t *ds = o->p->ds;
  const unit_t *u = o->u;
  size_t nc = (size_t)ds->num_columns;
  if (st == NULL) return;
  const void **data = malloc((nc ? nc : 1) * sizeof(*data));
  size_t *sizes = malloc((nc ? nc : 1) * sizeof(*sizes));
  if (data && sizes) {
    for (size_t c = 0; c < nc; c++) {
      data[c] = NULL;
      sizes[c] = 0;
      if (u->blobs && u->blobs[c]) {
        data[c] = u->blobs[c];
        sizes[c] = (size_t)((const layout_blob_header_t *)data[c])->total_size;
      } else if (u->cached && u->cached[c]) {
        data[c] = store_value_data(u->cached[c]);
        sizes[c] = (size_t)store_value_size(u->cached[c]);
      }
    }
    int r = units_offer(st, ds, o->index, data, sizes);
    o->admitted = r == UNITS_OFFER_HELD || r == UNITS_OFFER_WRITTEN;
  }
  free(data);
  free(sizes);
}

static void pf_offer_done(work_t *w, int status) {
  (void)status;
  pf_offer_t *o = w->data;
  prefetch_job_t *p = o->p;
  p->j.async--;
  int i = 0;
  while (i < p->num_active && p->active[i].u != o->u) i++;
  if (i < p->num_active && !p->j.cancelled) {
    pf_complete(p, i, o->admitted);
  } else if (i < p->num_active) {
    /* Cancelled: pf_cancel left offering units to us. */
    units_release(p->j.srv, o->u);
    p->active[i] = p->active[--p->num_active];
  }
  free(o);
  if (p->j.cancelled) job_maybe_free(&p->j);
}

static void pf_poll(uv_timer_t *t) {
  prefetch_job_t *p = t->data;
  if (p->j.cancelled || p->j.finished) return;
  server_t *srv = p->j.srv;
  for (int i = p->num_active - 1; i >= 0; i--) {
    pf_active_t *a = &p->active[i];
    if (a->u->state == UNIT_LOADING || a->offering) continue;
    if (a->u->state == UNIT_READY && !pf_unit_cached(p, a->index) && srv->store) {
      pf_offer_t *o = calloc(1, sizeof(*o));
      if (o) {
        o->p = p;
        o->u = a->u;
        o->index = a->index;
        o->work.data = o;
        p->j.async++;
        if (work_queue(srv->pool, &o->work, pf_offer_work, pf_offer_done) == 0) {
          a->offering = 1;
          continue;
        }
        p->j.async--;
        free(o);
      }
    }
    pf_complete(p, i, pf_unit_cached(p, a->index));
  }
  pf_fill(p);
  if (p->num_active == 0 && p->next_rg >= p->num_rgs) {
    uv_timer_stop(&p->j.timer);
    pf_event(p, "done", 1);
    return;
  }
  /* Progress when something moved, and once a second regardless. */
  uint64_t now = util_now_ns();
  if ((now - p->last_progress_ns >= PROGRESS_NS && p->done_bytes != p->last_done_bytes) ||
      now - p->last_progress_ns >= 4 * PROGRESS_NS) {
    p->last_progress_ns = now;
    p->last_done_bytes = p->done_bytes;
    pf_event(p, "progress", 0);
  }
}

static void pf_opened(job_t *j) {
  prefetch_job_t *p = (prefetch_job_t *)j;
  if (p->rc) {
    job_fail(j, p->rc, "%s", p->err);
    return;
  }
  dataset_t *ds = p->ds;
  p->rgs = calloc((size_t)ds->num_units + 1, sizeof(pf_rg_t));
  /* Row groups loading at once: a worker's worth for local files; for
   * remote ones as many as the fetch settings let fly, since a load then
   * waits on the network, not on a core (one per worker left a prefetch
   * over HTTP at two or three requests where a stream made sixteen). */
  int want = j->srv->workers;
  for (uint32_t f = 0; f < ds->num_files; f++)
    if (ds->files[f].remote && (int)j->srv->cfg.fetch_inflight_per_host > want) {
      want = (int)j->srv->cfg.fetch_inflight_per_host;
      break;
    }
  p->max_active = want < 1 ? 1 : want > 64 ? 64 : want;
  p->active = calloc((size_t)p->max_active + 1, sizeof(pf_active_t));
  if (p->rgs == NULL || p->active == NULL) {
    job_fail(j, LARDER_ENOMEM, "out of memory");
    return;
  }
  uint32_t *part = NULL, pfirst = 0, plast = 1;
  if (p->partitions > 1) {
    /* The node's partitions, as its streams cut them: whole row groups. */
    uint64_t *rows = malloc((size_t)ds->num_units * sizeof(*rows));
    uint32_t *groups = malloc((size_t)ds->num_units * sizeof(*groups));
    part = malloc((size_t)ds->num_units * sizeof(*part));
    int rc = rows && groups && part ? 0 : LARDER_ENOMEM;
    uint32_t ng = 0;
    for (uint32_t k = 0; rc == 0 && k < ds->num_units; k++) {
      const dataset_unit_t *u = &ds->units[k];
      rows[k] = u->rows;
      if (k > 0 && u->file == u[-1].file && u->rg == u[-1].rg) groups[ng - 1]++;
      else groups[ng++] = 1;
    }
    if (rc == 0)
      rc = shuffle_partition_assign(rows, ds->num_units, groups, ng, (uint32_t)p->partitions,
                                    p->seed, part);
    free(rows);
    free(groups);
    if (rc) {
      free(part);
      job_fail(j, rc, "prefetch: %s",
               rc == LARDER_EINVAL ? "the dataset has fewer row groups with rows than partitions"
                                   : "out of memory");
      return;
    }
    shuffle_node_partitions((uint32_t)p->partitions, (uint32_t)p->nodes, (uint32_t)p->node,
                            &pfirst, &plast);
  }
  uint32_t units_in = 0;
  for (uint32_t k = 0; k < ds->num_units; k++) {
    const dataset_unit_t *u = &ds->units[k];
    if (part && (part[k] < pfirst || part[k] >= plast)) continue;
    units_in++;
    p->total_bytes += u->est_bytes;
    if (p->cached[k]) {
      p->before_units++;
      p->before_bytes += u->est_bytes;
    }
    if (p->num_rgs == 0 || u->file != ds->units[p->rgs[p->num_rgs - 1].end - 1].file ||
        u->rg != ds->units[p->rgs[p->num_rgs - 1].end - 1].rg ||
        p->rgs[p->num_rgs - 1].end != k)
      p->rgs[p->num_rgs++].next = k;
    p->rgs[p->num_rgs - 1].end = k + 1;
  }
  free(part);
  p->units_total = units_in;
  p->done_bytes = p->before_bytes;
  p->started_ns = p->last_progress_ns = util_now_ns();
  pf_event(p, "start", 0);
  if (p->before_units == units_in) {
    pf_event(p, "done", 1);
    return;
  }
  pf_fill(p);
  uv_timer_start(&j->timer, pf_poll, PREFETCH_POLL_MS, PREFETCH_POLL_MS);
}

static void pf_resolved(int status, const char *message, remote_object_t *objects, size_t count,
                        void *arg) {
  prefetch_job_t *p = arg;
  p->j.async--;
  p->remote = objects;
  p->num_remote = count;
  if (p->j.cancelled) {
    job_maybe_free(&p->j);
    return;
  }
  if (status) {
    job_fail(&p->j, status, "%s", message ? message : larder_strerror(status));
    return;
  }
  p->dopts.remote = objects;
  p->dopts.num_remote = count;
  if (job_queue(&p->j, pf_open_work, pf_opened) != 0)
    job_fail(&p->j, LARDER_ENOMEM, "cannot queue the request");
}

static void pf_cancel(job_t *j) {
  prefetch_job_t *p = (prefetch_job_t *)j;
  uv_timer_stop(&j->timer);
  /* Units a worker is writing stay until it is done (pf_offer_done). */
  int k = 0;
  for (int i = 0; i < p->num_active; i++) {
    if (p->active[i].offering) p->active[k++] = p->active[i];
    else units_release(j->srv, p->active[i].u);
  }
  p->num_active = k;
}

static void pf_destroy(job_t *j) {
  prefetch_job_t *p = (prefetch_job_t *)j;
  pf_cancel(j);
  if (p->ds && --p->ds->refs == 0) dataset_free(p->ds);
  remote_objects_free(p->remote, p->num_remote);
  free_list(p->sources, p->num_sources);
  free_list(p->columns, p->num_columns);
  free(p->roots);
  acl_peer_clear(&p->peer);
  free(p->label);
  free(p->cached);
  free(p->rgs);
  free(p->active);
}

static void cmd_prefetch(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  const char *pos[1024];
  size_t n = positional(req, pos, 1024);
  if (n == 0) {
    reply_error(c, req->request_id, LARDER_EINVAL,
                "prefetch: name the dataset: paths, globs, directories or URLs, as the trainers "
                "open it");
    return;
  }
  acl_peer_t peer;
  conn_peer(c, &peer);
  for (size_t i = 0; i < n; i++) {
    char why[2200];
    if (remote_is_url(pos[i]) && acl_check_url(srv->acl, &peer, pos[i], why, sizeof(why)) != 0) {
      reply_error(c, req->request_id, LARDER_EACCES, "%s", why);
      return;
    }
    if (dataset_source_absolute(pos[i], why, sizeof(why)) != 0) {
      reply_error(c, req->request_id, LARDER_EINVAL, "prefetch: %s", why);
      return;
    }
  }
  uint64_t unit_rows = srv->cfg.unit_rows;
  const char *ur = opt_value(req, "unit-rows");
  if (ur && (parse_u64(ur, &unit_rows) != 0 || unit_rows == 0)) {
    reply_error(c, req->request_id, LARDER_EINVAL, "prefetch: bad --unit-rows %s", ur);
    return;
  }
  uint64_t partitions = 1, nodes = 1, node = 0, seed = 0;
  static const char *const part_opts[] = {"partitions", "nodes", "node", "seed"};
  uint64_t *part_vals[] = {&partitions, &nodes, &node, &seed};
  for (int k = 0; k < 4; k++) {
    const char *v = opt_value(req, part_opts[k]);
    if (v && parse_u64(v, part_vals[k]) != 0) {
      reply_error(c, req->request_id, LARDER_EINVAL, "prefetch: bad --%s %s", part_opts[k], v);
      return;
    }
  }
  if (partitions == 0 || partitions > STREAM_MAX_PARTITIONS || nodes == 0 ||
      nodes > STREAM_MAX_PARTITIONS || node >= nodes) {
    reply_error(c, req->request_id, LARDER_EINVAL,
                "prefetch: --partitions must be 1 to %u, and --node below --nodes",
                STREAM_MAX_PARTITIONS);
    return;
  }
  prefetch_job_t *p = job_new(c, req, JOB_PREFETCH, sizeof(prefetch_job_t));
  if (p == NULL) return;
  p->j.cancel = pf_cancel;
  p->j.destroy = pf_destroy;
  p->partitions = partitions;
  p->nodes = nodes;
  p->node = node;
  p->seed = seed;
  p->sources = calloc(n + 1, sizeof(char *));
  for (size_t i = 0; p->sources && i < n; i++) {
    p->sources[i] = strdup(pos[i]);
    if (p->sources[i] == NULL) break;
    p->num_sources++;
  }
  if (p->sources && p->num_sources == n) p->label = dataset_sources_label(p->sources, n);
  p->columns = split_list(opt_value(req, "columns"), &p->num_columns);
  int oom = 0;
  p->roots = acl_split_roots(srv->cfg.local_roots, &oom);
  if (p->num_sources != n || p->label == NULL || oom ||
      (opt_value(req, "columns") && *opt_value(req, "columns") && p->columns == NULL)) {
    job_fail(&p->j, LARDER_ENOMEM, "out of memory");
    return;
  }
  p->dopts.unit_rows = (uint32_t)(unit_rows > 65536 ? 65536 : unit_rows < 64 ? 64 : unit_rows);
  p->dopts.unit_bytes = srv->cfg.unit_bytes;
  pq_options_init(&p->dopts.pq);
  p->dopts.pq.verify_crc = srv->cfg.verify_crc;
  p->dopts.pq.max_chunk_decoded_bytes = srv->cfg.max_chunk_decoded_bytes;
  p->dopts.footers = srv->footers;
  p->dopts.footer_limit = srv->cfg.footer_memory;
  p->dopts.allowed_roots = (const char *const *)p->roots;
  if (acl_peer_copy(&p->peer, &peer) != 0) {
    job_fail(&p->j, LARDER_ENOMEM, "out of memory");
    return;
  }
  p->dopts.peer = &p->peer;
  int remote = 0;
  for (size_t i = 0; i < n; i++) remote |= remote_is_url(pos[i]);
  log_notice("admin prefetch %s: started by pid %d uid %u", p->label, (int)c->pid, (unsigned)c->uid);
  if (remote) {
    if (srv->fetch == NULL) {
      job_fail(&p->j, LARDER_EUNSUPPORTED,
               "remote sources are unavailable: the daemon could not start libcurl");
      return;
    }
    p->j.async++;
    int rc = server_resolve(srv, (const char *const *)p->sources, p->num_sources, pf_resolved, p);
    if (rc) {
      p->j.async--;
      job_fail(&p->j, rc, "cannot resolve the remote sources");
    }
    return;
  }
  if (job_queue(&p->j, pf_open_work, pf_opened) != 0)
    job_fail(&p->j, LARDER_ENOMEM, "cannot queue the request");
}

/* ------------------------------------------------------------------------ */
/* inspect and cat of remote objects                                         */

typedef struct remote_job {
  job_t j;
  int cat;              /* else inspect */
  char *url;
  char **columns;
  size_t num_columns;
  int64_t skip, left;
  pq_options opts;
  remote_object_t *objs;
  size_t num_objs;
  pq_file *file;
  pq_projection *proj;
  int rc;
  pq_error perr;
  pq_strbuf_t out;
  int rg;
  /* The row group being read: its projected ranges, fetched. */
  pq_range_t *ranges;
  int num_ranges;
  uint8_t **data;
  fetch_req_t **reqs;
  int fetching;
  int issuing;          /* the range fetch_get is being called for, or -1 */
  int issued_done;      /* its callback ran inside fetch_get */
  int fetch_rc;
  char fetch_err[700];
  pq_source src;
  pq_reader *reader;
  pq_batch_t batch;
  int64_t batch_rows, batch_pos, want;
  int rg_done;
} remote_job_t;

static void rj_next_rg(remote_job_t *r);

static const uint8_t *rj_map(const pq_source *src, uint64_t off, size_t len) {
  const remote_job_t *r = src->ctx;
  int lo = 0, hi = r->num_ranges - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    const pq_range_t *g = &r->ranges[mid];
    if (off < g->offset) hi = mid - 1;
    else if (off >= g->offset + g->length) lo = mid + 1;
    else return len <= g->offset + g->length - off ? r->data[mid] + (off - g->offset) : NULL;
  }
  return NULL;
}

static int rj_read(const pq_source *src, uint64_t off, size_t len, void *buf) {
  const uint8_t *p = rj_map(src, off, len);
  if (p == NULL) return LARDER_ECORRUPT;
  memcpy(buf, p, len);
  return 0;
}

static void rj_free_rg(remote_job_t *r) {
  if (r->reader) pq_reader_close(r->reader);
  r->reader = NULL;
  for (int i = 0; i < r->num_ranges; i++) {
    if (r->reqs && r->reqs[i]) {
      fetch_cancel(r->reqs[i]);
      r->reqs[i] = NULL;
      r->j.async--;
    }
    if (r->data) free(r->data[i]);
  }
  free(r->ranges);
  free(r->data);
  free(r->reqs);
  r->ranges = NULL;
  r->data = NULL;
  r->reqs = NULL;
  r->num_ranges = 0;
  r->fetching = 0;
  r->batch_rows = r->batch_pos = 0;
  r->rg_done = 0;
}

static void rj_cancel(job_t *j) {
  remote_job_t *r = (remote_job_t *)j;
  uv_timer_stop(&j->timer);
  for (int i = 0; i < r->num_ranges; i++)
    if (r->reqs && r->reqs[i]) {
      fetch_cancel(r->reqs[i]);
      r->reqs[i] = NULL;
      j->async--;
    }
}

static void rj_destroy(job_t *j) {
  remote_job_t *r = (remote_job_t *)j;
  rj_free_rg(r);
  pq_batch_free(&r->batch);
  pq_strbuf_free(&r->out);
  pq_projection_free(r->proj);
  pq_file_close(r->file);
  remote_objects_free(r->objs, r->num_objs);
  free_list(r->columns, r->num_columns);
  free(r->url);
}


/* Worker: decodes and renders rows of the current row group until about
 * CAT_CHUNK bytes of text are ready, the row group ends or the limit is
 * reached. */
static void rj_render_work(job_t *j) {
  remote_job_t *r = (remote_job_t *)j;
  r->out.len = 0;
  if (r->out.data) r->out.data[0] = '\0';
  if (r->reader == NULL) {
    r->rc = pq_reader_open(r->file, &r->src, r->proj, r->rg, &r->opts, &r->reader, &r->perr);
    if (r->rc) return;
    if (r->skip > 0) {
      int64_t s = pq_reader_skip(r->reader, r->skip, &r->perr);
      if (s < 0) {
        r->rc = (int)s;
        return;
      }
      r->skip = 0;
    }
  }
  while (r->out.len < CAT_CHUNK && r->left > 0) {
    if (r->batch_pos >= r->batch_rows) {
      int64_t want = r->left < r->want ? r->left : r->want;
      int64_t got = pq_reader_next(r->reader, want, &r->batch, &r->perr);
      if (got < 0) {
        r->rc = (int)got;
        return;
      }
      if (got == 0) {
        r->rg_done = 1;
        return;
      }
      r->batch_rows = got;
      r->batch_pos = 0;
    }
    size_t before = r->out.len;
    int64_t first = r->batch_pos;
    while (r->batch_pos < r->batch_rows && r->out.len < CAT_CHUNK && r->left > 0) {
      if (pq_json_append_row(&r->out, &r->batch, r->batch_pos) || pq_strbuf_puts(&r->out, "\n")) {
        r->rc = pq_error_set(&r->perr, LARDER_ENOMEM, "out of memory");
        return;
      }
      r->batch_pos++;
      r->left--;
    }
    /* Big rows: decode fewer at a time, so a batch stays near CAT_CHUNK. */
    int64_t rows = r->batch_pos - first;
    if (rows > 0) {
      int64_t per_row = (int64_t)(r->out.len - before) / rows + 1;
      int64_t fit = (int64_t)CAT_CHUNK / per_row;
      r->want = fit < 1 ? 1 : fit > 4096 ? 4096 : fit;
    }
  }
  if (r->left == 0) r->rg_done = 1;
}

static void rj_render_after(job_t *j);
static void rj_backlog_timer(uv_timer_t *t);

static void rj_render_next(remote_job_t *r) {
  conn_t *c = job_conn(&r->j);
  if (c == NULL) {
    r->j.cancelled = 1;
    job_maybe_free(&r->j);
    return;
  }
  if (uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) > CAT_BACKLOG) {
    /* The client reads slower than we decode: wait, holding one row
     * group's bytes at most. */
    uv_timer_start(&r->j.timer, rj_backlog_timer, 10, 0);
    return;
  }
  if (job_queue(&r->j, rj_render_work, rj_render_after) != 0)
    job_fail(&r->j, LARDER_ENOMEM, "cannot queue the request");
}

static void rj_backlog_timer(uv_timer_t *t) {
  remote_job_t *r = t->data;
  if (r->j.cancelled || r->j.finished) return;
  rj_render_next(r);
}

static void rj_render_after(job_t *j) {
  remote_job_t *r = (remote_job_t *)j;
  if (r->rc) {
    job_fail(j, r->rc, "%s", r->perr.msg[0] ? r->perr.msg : larder_strerror(r->rc));
    return;
  }
  if (r->out.len) reply_frame(job_conn(j), j->request_id, 0, r->out.data, r->out.len, 1);
  if (r->rg_done) {
    rj_free_rg(r);
    r->rg++;
    rj_next_rg(r);
    return;
  }
  rj_render_next(r);
}

static void rj_fetched(remote_job_t *r) {
  if (r->fetch_rc) {
    job_fail(&r->j, r->fetch_rc, "%s", r->fetch_err);
    return;
  }
  memset(&r->src, 0, sizeof(r->src));
  r->src.fd = -1;
  r->src.read = rj_read;
  r->src.map = rj_map;
  r->src.ctx = r;
  r->src.size = r->objs[0].size;
  /* The name goes into error messages: never with credentials. */
  fetch_redact(r->url, r->src.name, sizeof(r->src.name));
  rj_render_next(r);
}

static void rj_on_range(fetch_req_t *req, const fetch_result_t *res, void *arg) {
  remote_job_t *r = arg;
  r->j.async--;
  int i = 0;
  while (i < r->num_ranges && r->reqs[i] != req) i++;
  if (i == r->num_ranges && r->issuing >= 0) {
    /* Done inside fetch_get (a zero-length range, a whole object kept
     * from an earlier response): the pointer was never stored. */
    i = r->issuing;
    r->issued_done = 1;
  }
  if (i < r->num_ranges) {
    r->reqs[i] = NULL;
    if (res->status) {
      if (!r->fetch_rc) {
        r->fetch_rc = res->status;
        snprintf(r->fetch_err, sizeof(r->fetch_err), "%s",
                 res->message ? res->message : larder_strerror(res->status));
      }
    } else if (r->objs[0].etag[0] && res->etag[0] && strcmp(r->objs[0].etag, res->etag) != 0) {
      if (!r->fetch_rc) {
        r->fetch_rc = LARDER_EIO;
        snprintf(r->fetch_err, sizeof(r->fetch_err),
                 "the object changed while it was read (ETag %s, now %s); run again",
                 r->objs[0].etag, res->etag);
      }
    } else {
      uint64_t len;
      r->data[i] = fetch_req_steal(req, &len);
      if (r->data[i] == NULL || len != r->ranges[i].length) {
        if (!r->fetch_rc) {
          r->fetch_rc = LARDER_EREMOTE;
          char where[600];
          fetch_redact(r->url, where, sizeof(where));
          snprintf(r->fetch_err, sizeof(r->fetch_err), "short read of %s", where);
        }
      }
    }
  }
  fetch_req_free(req);
  if (r->j.cancelled) {
    job_maybe_free(&r->j);
    return;
  }
  if (--r->fetching == 0) rj_fetched(r);
}

static void rj_next_rg(remote_job_t *r) {
  server_t *srv = r->j.srv;
  const pq_file_meta_t *m = pq_file_meta(r->file);
  while (r->rg < m->num_row_groups && r->left > 0 && r->skip >= m->row_groups[r->rg].num_rows) {
    r->skip -= m->row_groups[r->rg].num_rows;
    r->rg++;
  }
  if (r->rg >= m->num_row_groups || r->left == 0) {
    job_finish(&r->j, 0, "");
    return;
  }
  pq_error err = {0, ""};
  pq_range_t *ranges = NULL;
  int n = pq_projection_ranges(r->file, r->proj, r->rg, &ranges, &err);
  if (n < 0) {
    free(ranges);
    job_fail(&r->j, n, "%s", err.msg);
    return;
  }
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (k > 0 && ranges[i].offset <= ranges[k - 1].offset + ranges[k - 1].length + srv->cfg.fetch_merge_gap)
      ranges[k - 1].length = ranges[i].offset + ranges[i].length - ranges[k - 1].offset;
    else
      ranges[k++] = ranges[i];
  }
  r->ranges = ranges;
  r->num_ranges = k;
  r->data = calloc((size_t)k + 1, sizeof(uint8_t *));
  r->reqs = calloc((size_t)k + 1, sizeof(fetch_req_t *));
  if (r->data == NULL || r->reqs == NULL) {
    job_fail(&r->j, LARDER_ENOMEM, "out of memory");
    return;
  }
  r->fetching = 1; /* held until every request is made */
  for (int i = 0; i < k; i++) {
    fetch_range_t fr = {ranges[i].offset, ranges[i].length, 0};
    r->fetching++;
    r->j.async++;
    r->issuing = i;
    r->issued_done = 0;
    fetch_req_t *q = fetch_get(srv->fetch, r->url, &fr, rj_on_range, r);
    r->issuing = -1;
    if (q && !r->issued_done) r->reqs[i] = q;
    if (q == NULL) {
      r->fetching--;
      r->j.async--;
      r->fetch_rc = LARDER_ENOMEM;
      snprintf(r->fetch_err, sizeof(r->fetch_err), "out of memory");
    }
  }
  if (--r->fetching == 0) rj_fetched(r);
}

static void rj_parse_work(job_t *j) {
  remote_job_t *r = (remote_job_t *)j;
  const remote_object_t *o = &r->objs[0];
  r->rc = pq_file_parse(o->footer, o->footer_len, o->size, &r->opts, r->url, &r->file, &r->perr);
  if (r->rc) return;
  if (r->cat) {
    r->rc = pq_projection_create(r->file, (const char *const *)r->columns, r->num_columns,
                                 &r->proj, &r->perr);
    return;
  }
  if (j->json) pq_inspect_json(&r->out, r->file);
  else pq_inspect_human(&r->out, r->file);
}

static void rj_parsed(job_t *j) {
  remote_job_t *r = (remote_job_t *)j;
  if (r->rc) {
    job_fail(j, r->rc, "%s", r->perr.msg[0] ? r->perr.msg : larder_strerror(r->rc));
    return;
  }
  if (!r->cat) {
    job_finish(j, 0, r->out.data ? r->out.data : "");
    return;
  }
  rj_next_rg(r);
}

static void rj_resolved(int status, const char *message, remote_object_t *objects, size_t count,
                        void *arg) {
  remote_job_t *r = arg;
  r->j.async--;
  r->objs = objects;
  r->num_objs = count;
  if (r->j.cancelled) {
    job_maybe_free(&r->j);
    return;
  }
  if (status) {
    job_fail(&r->j, status, "%s", message ? message : larder_strerror(status));
    return;
  }
  if (count != 1) {
    char first[600];
    fetch_redact(count ? objects[0].url : r->url, first, sizeof(first));
    job_fail(&r->j, LARDER_EINVAL, "%s names %zu objects; %s takes one%s%s%s", r->url, count,
             r->cat ? "cat" : "inspect", count ? " (the first is " : "", count ? first : "",
             count ? ")" : "");
    return;
  }
  if (job_queue(&r->j, rj_parse_work, rj_parsed) != 0)
    job_fail(&r->j, LARDER_ENOMEM, "cannot queue the request");
}

static void cmd_remote(conn_t *c, const Larder__AdminRequest *req, int cat) {
  server_t *srv = c->srv;
  const char *pos[2];
  size_t n = positional(req, pos, 2);
  const char *what = cat ? "cat" : "inspect";
  if (n != 1 || !remote_is_url(pos[0])) {
    reply_error(c, req->request_id, LARDER_EINVAL, "%s: one URL (http://, https:// or s3://)", what);
    return;
  }
  acl_peer_t peer;
  conn_peer(c, &peer);
  char why[2200];
  int rc = acl_check_url(srv->acl, &peer, pos[0], why, sizeof(why));
  if (rc) {
    char red[600];
    fetch_redact(pos[0], red, sizeof(red));
    log_notice("client pid %d uid %u: %s of %s refused: outside the allowlist", (int)c->pid,
               (unsigned)c->uid, what, red);
    reply_error(c, req->request_id, rc, "%s", why);
    return;
  }
  if (srv->fetch == NULL) {
    reply_error(c, req->request_id, LARDER_EUNSUPPORTED,
                "remote sources are unavailable: the daemon could not start libcurl");
    return;
  }
  uint64_t offset = 0, limit = UINT64_MAX, max_chunk = 0;
  const char *v;
  if ((v = opt_value(req, "offset")) && parse_u64(v, &offset) != 0) {
    reply_error(c, req->request_id, LARDER_EINVAL, "cat: bad --offset %s", v);
    return;
  }
  if ((v = opt_value(req, "limit")) && parse_u64(v, &limit) != 0) {
    reply_error(c, req->request_id, LARDER_EINVAL, "cat: bad --limit %s", v);
    return;
  }
  if ((v = opt_value(req, "max-chunk-bytes")) && (parse_u64(v, &max_chunk) != 0 || max_chunk == 0)) {
    reply_error(c, req->request_id, LARDER_EINVAL, "cat: bad --max-chunk-bytes %s", v);
    return;
  }
  remote_job_t *r = job_new(c, req, JOB_REMOTE, sizeof(remote_job_t));
  if (r == NULL) return;
  r->j.cancel = rj_cancel;
  r->j.destroy = rj_destroy;
  r->cat = cat;
  r->url = strdup(pos[0]);
  r->skip = (int64_t)(offset > INT64_MAX ? INT64_MAX : offset);
  r->left = (int64_t)(limit > INT64_MAX ? INT64_MAX : limit);
  r->want = 1024;
  r->issuing = -1;
  pq_batch_init(&r->batch);
  pq_options_init(&r->opts);
  r->opts.verify_crc = srv->cfg.verify_crc && !opt_flag(req, "no-verify-crc");
  r->opts.max_chunk_decoded_bytes = srv->cfg.max_chunk_decoded_bytes;
  /* A client may lower the bomb guard, never raise it. */
  if (max_chunk && max_chunk < r->opts.max_chunk_decoded_bytes) r->opts.max_chunk_decoded_bytes = max_chunk;
  const char *cols = opt_value(req, "columns");
  r->columns = split_list(cols, &r->num_columns);
  if (r->url == NULL || (cols && *cols && r->columns == NULL)) {
    job_fail(&r->j, LARDER_ENOMEM, "out of memory");
    return;
  }
  r->j.async++;
  rc = server_resolve(srv, (const char *const *)&r->url, 1, rj_resolved, r);
  if (rc) {
    r->j.async--;
    job_fail(&r->j, rc, "cannot resolve %s", pos[0]);
  }
}

static void cmd_inspect(conn_t *c, const Larder__AdminRequest *req) { cmd_remote(c, req, 0); }
static void cmd_cat(conn_t *c, const Larder__AdminRequest *req) { cmd_remote(c, req, 1); }

/* ------------------------------------------------------------------------ */
/* Dispatch                                                                  */

typedef struct admin_cmd {
  const char *name;
  int admin;   /* root, the daemon's user or admin_group only */
  int job;     /* runs asynchronously (refused while shutting down) */
  void (*fn)(conn_t *c, const Larder__AdminRequest *req);
} admin_cmd_t;

static const admin_cmd_t commands[] = {
    {"status", 0, 0, cmd_status},   {"stats", 0, 0, cmd_stats},
    {"clients", 0, 0, cmd_clients}, {"ls", 0, 0, cmd_ls},
    {"inspect", 0, 1, cmd_inspect}, {"cat", 0, 1, cmd_cat},
    {"evict", 1, 1, cmd_evict},     {"prefetch", 1, 1, cmd_prefetch},
    {"verify", 1, 1, cmd_verify},   {"reload", 1, 0, cmd_reload},
    {"config", 1, 0, cmd_config},
};

void admin_handle(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  const char *cmd = req->command ? req->command : "";
  c->is_admin_conn = 1;
  const admin_cmd_t *ac = NULL;
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
    if (strcmp(commands[i].name, cmd) == 0) ac = &commands[i];
  if (ac == NULL) {
    reply_error(c, req->request_id, LARDER_EUNSUPPORTED,
                "unknown admin command '%.64s' (is larderctl newer than larderd %s?)", cmd,
                LARDERD_VERSION);
    return;
  }
  if (ac->admin) {
    acl_peer_t peer;
    conn_peer(c, &peer);
    if (!acl_is_admin(srv->acl, &peer)) {
      log_notice("client pid %d uid %u: `%s` refused: not root or in the admin group", (int)c->pid,
                 (unsigned)c->uid, cmd);
      reply_error(c, req->request_id, LARDER_EACCES,
                  "not allowed: `larderctl %s` needs root or membership in the admin group%s%s "
                  "(you are uid %u)",
                  cmd, srv->cfg.admin_group && *srv->cfg.admin_group ? " " : " (admin_group is not set)",
                  srv->cfg.admin_group && *srv->cfg.admin_group ? srv->cfg.admin_group : "",
                  (unsigned)c->uid);
      return;
    }
    log_info("admin: %s by pid %d uid %u%s", cmd, (int)c->pid, (unsigned)c->uid,
             req->dry_run ? " (dry run)" : "");
  }
  if (ac->job && srv->shutting_down) {
    reply_error(c, req->request_id, LARDER_ESHUTDOWN, "the daemon is shutting down");
    return;
  }
  ac->fn(c, req);
}
