/*
 * admin_stats.c: what `larderctl stats` shows (see admin.c for the whole):
 * the rates sampled every second, the verdict on what limits throughput,
 * and the stats reply, human and JSON.
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
#include "serve/admin_int.h"
#include "serve/conn.h"
#include "serve/stream.h"
#include "serve/units.h"
#include "serve/server.h"
#include "plan/shuffle.h"
#include "util.h"

/* ------------------------------------------------------------------------ */
/* Rates                                                                     */

/* The counters a rate is made of, at time t: the daemon's (g) and one
 * stream's (x).  admin_tick samples everything at one t, so that a
 * stream's sample and the daemon's of one tick share their time. */
static void global_now(server_t *srv, uint64_t t, gsample_t *g) {
  g->t = t;
  g->v[G_FETCH_BYTES] = STATS_GET(&srv->stats, fetch_bytes);
  g->v[G_BATCH_BYTES] = STATS_GET(&srv->stats, batch_bytes);
  g->v[G_BATCHES] = STATS_GET(&srv->stats, batches);
  g->v[G_FETCH_NS] = STATS_GET(&srv->stats, fetch_ns);
  g->v[G_DECODE_NS] = STATS_GET(&srv->stats, decode_ns);
  g->v[G_CACHE_NS] = STATS_GET(&srv->stats, cache_read_ns);
  g->v[G_ASSEMBLE_NS] = STATS_GET(&srv->stats, assemble_ns);
}

static void stream_now(const stream_t *s, uint64_t t, ssample_t *x) {
  const stats_stream_t *st = stream_stats(s);
  x->t = t;
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
  admin_state_t *as = admin_state(srv);
  if (as == NULL) return;
  if (as->ng == RATE_SAMPLES) {
    memmove(&as->g[0], &as->g[1], sizeof(gsample_t) * (RATE_SAMPLES - 1));
    as->ng--;
  }
  uint64_t t = util_now_ns();
  global_now(srv, t, &as->g[as->ng++]);
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
      stream_now(s, t, &r->s[r->n++]);
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

/* The start of the window every rate of a reply covers, for a reply made
 * at now: the oldest sample of the daemon's counters, once it is 200 ms
 * old, else the daemon's start (its counters all 0 then).  One window for
 * the daemon's rates and each stream's, so that the header's batches/s is
 * the sum of its streams' (those that closed in the window aside). */
static void window_start(server_t *srv, uint64_t now, gsample_t *old) {
  const admin_state_t *as = srv->admin;
  if (as && as->ng > 0 && now > as->g[0].t + 200000000ull) {
    *old = as->g[0];
  } else {
    memset(old, 0, sizeof(*old));
    old->t = srv->started_ns;
  }
}

/* Stream s's counters at the window's start t0: its sample of the tick
 * at t0, or 0 when it has none.  admin_tick samples every open stream at
 * every tick, so a stream without one was not open at t0 (or opened after
 * the daemon's start, t0 then) and had delivered nothing yet. */
static void stream_start(server_t *srv, const conn_t *c, const stream_t *s, uint64_t t0,
                         ssample_t *old) {
  memset(old, 0, sizeof(*old));
  old->t = t0;
  const srate_t *r = find_rate(srv->admin, c->id, stream_id(s));
  for (int i = 0; r && i < r->n; i++) {
    if (r->s[i].t == t0) {
      *old = r->s[i];
      return;
    }
  }
}

void admin_stream_rates(server_t *srv, const conn_t *c, const stream_t *s, double *batches_per_s,
                        double *bytes_per_s, double *stall) {
  ssample_t now, old;
  gsample_t g0;
  stream_now(s, util_now_ns(), &now);
  window_start(srv, now.t, &g0);
  stream_start(srv, c, s, g0.t, &old);
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
  gsample_t now, old;
  global_now(srv, util_now_ns(), &now);
  window_start(srv, now.t, &old);
  double dt = (double)(now.t - old.t) / 1e9;
  if (dt <= 0) dt = 1e-9;
  out->window_s = dt;
  out->workers = srv->workers > 0 ? srv->workers : 1;
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
      ssample_t sn, so;
      stream_now(s, now.t, &sn);
      stream_start(srv, c, s, old.t, &so);
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

static void make_verdict(server_t *srv, const admin_rates_t *r, verdict_t *v) {
  uint64_t streams = STATS_GET(&srv->stats, streams);
  double stages = r->fetch_ns + r->decode_ns + r->cache_read_ns + r->assemble_ns;
  double busy = r->decode_ns + r->cache_read_ns + r->assemble_ns; /* worker time */
  double util = busy / (r->window_s * 1e9 * (srv->workers > 0 ? srv->workers : 1));
  if (util > 1) util = 1; /* time counts when work ends: a window may hold more */
  double stall = r->wait_ns + r->compute_ns > 0 ? r->wait_ns / (r->wait_ns + r->compute_ns) : -1;
  int prefetches = 0, jobs = admin_jobs_running(srv, &prefetches);
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
/* stats                                                                     */

/* A stage's time in the window per second of it: the average number of
 * requests (fetch) or workers at work in that stage.  Stage time is summed
 * over concurrent requests and workers, so it may exceed the window; per
 * second it reads as a count, never as more time than passed. */
static double stage_busy(double ns, const admin_rates_t *r) {
  return r->window_s > 0 ? ns / 1e9 / r->window_s : 0;
}

/* The share of the workers a worker stage (decode, cache read, assembly)
 * took, in [0, 1].  Time counts when a unit or batch is done, whole, so a
 * short window may hold more than the workers had: clipped at 1. */
static double stage_share(double ns, const admin_rates_t *r) {
  double v = stage_busy(ns, r) / (r->workers > 0 ? r->workers : 1);
  return v < 0 ? 0 : v > 1 ? 1 : v;
}

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
    if (!admin_visible_to(self, all, c)) continue;
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
      /* Units read back after a decode ahead were decoded for this epoch:
       * misses, not hits. */
      v[i].miss += STATS_GET(ss, cache_miss_bytes) + STATS_GET(ss, cache_readback_bytes);
    }
  }
  return v;
}

/* Writes the stats object for self: every counter, and the datasets and
 * streams self may see (visible_to). */
static void stats_json(server_t *srv, const conn_t *self, strbuf_t *b) {
  int all = admin_sees_all(self);
  strbuf_printf(b, "{\"version\":\"%s\",\"uptime_s\":%.3f", LARDERD_VERSION,
                (double)(util_now_ns() - srv->started_ns) / 1e9);
  /* clients (below) counts every connection, larderctl's included;
   * trainers those of liblarder. */
  strbuf_printf(b, ",\"trainers\":%" PRIu64, admin_count_trainers(srv));
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
    admin_sb_json(b, srv->cache_error);
  }
  if (srv->awscreds) {
    /* Where the S3 credentials came from and when they expire: never the
     * credentials themselves. */
    char source[16];
    int64_t exp;
    awscreds_describe(srv->awscreds, source, sizeof(source), &exp);
    strbuf_puts(b, ",\"credentials\":{\"source\":");
    admin_sb_json(b, source);
    strbuf_printf(b, ",\"expires_unix\":%lld}", (long long)exp);
  }
  admin_rates_t r;
  admin_global_rates(srv, &r);
  strbuf_puts(b, ",\"rates\":{\"window_s\":");
  admin_sb_num(b, r.window_s);
  strbuf_puts(b, ",\"fetch_bytes_per_s\":");
  admin_sb_num(b, r.fetch_bytes_per_s);
  strbuf_puts(b, ",\"batch_bytes_per_s\":");
  admin_sb_num(b, r.batch_bytes_per_s);
  strbuf_puts(b, ",\"batches_per_s\":");
  admin_sb_num(b, r.batches_per_s);
  /* Stages: the time in the window (summed over requests and workers),
   * and the same per second of the window (<stage>_s_per_s, the average
   * number at work), and the worker stages' share of the workers. */
  strbuf_puts(b, "},\"stages\":{\"window_s\":");
  admin_sb_num(b, r.window_s);
  strbuf_printf(b,
                ",\"workers\":%d,\"fetch_ns\":%.0f,\"decode_ns\":%.0f,\"cache_read_ns\":%.0f,"
                "\"assemble_ns\":%.0f",
                r.workers, r.fetch_ns, r.decode_ns, r.cache_read_ns, r.assemble_ns);
  const struct {
    const char *name;
    double ns;
  } st_json[] = {{"fetch", r.fetch_ns},
                 {"decode", r.decode_ns},
                 {"cache_read", r.cache_read_ns},
                 {"assemble", r.assemble_ns}};
  for (size_t i = 0; i < 4; i++) {
    strbuf_printf(b, ",\"%s_s_per_s\":", st_json[i].name);
    admin_sb_num(b, stage_busy(st_json[i].ns, &r));
  }
  strbuf_puts(b, ",\"worker_share\":{");
  for (size_t i = 1; i < 4; i++) {
    strbuf_printf(b, "%s\"%s\":", i > 1 ? "," : "", st_json[i].name);
    admin_sb_num(b, stage_share(st_json[i].ns, &r));
  }
  strbuf_puts(b, "}}");
  int prefetches = 0, jobs = admin_jobs_running(srv, &prefetches);
  strbuf_printf(b, ",\"admin_jobs\":{\"running\":%d,\"prefetches\":%d}", jobs, prefetches);
  verdict_t v;
  make_verdict(srv, &r, &v);
  strbuf_printf(b, ",\"verdict\":{\"limit\":\"%s\",\"text\":", v.limit);
  admin_sb_json(b, v.text);
  strbuf_puts(b, "}");
  size_t nd = 0;
  dsagg_t *ds = datasets_of(srv, self, all, &nd);
  strbuf_puts(b, ",\"datasets\":[");
  for (size_t i = 0; ds && i < nd; i++) {
    strbuf_puts(b, i ? ",{\"dataset\":" : "{\"dataset\":");
    admin_sb_json(b, ds[i].name);
    strbuf_printf(b,
                  ",\"streams\":%d,\"cache_hit_bytes\":%" PRIu64 ",\"cache_miss_bytes\":%" PRIu64
                  ",\"hit_ratio\":",
                  ds[i].streams, ds[i].hit, ds[i].miss);
    if (ds[i].hit + ds[i].miss)
      admin_sb_num(b, (double)ds[i].hit / (double)(ds[i].hit + ds[i].miss));
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
    if (!admin_visible_to(self, all, c)) continue;
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      const stats_stream_t *ss = stream_stats(s);
      stream_info_t si;
      stream_info(s, &si);
      strbuf_printf(b,
                    "%s{\"client\":%" PRIu64
                    ",\"pid\":%d,\"uid\":%u,\"stream\":%u,\"rank\":%u,"
                    "\"world_size\":%u,\"window\":%u,\"dataset\":",
                    first ? "" : ",", c->id, (int)c->pid, (unsigned)c->uid, stream_id(s), si.rank,
                    si.world_size, si.window);
      admin_sb_json(b, si.dataset);
#define ADMIN_STREAM_STAT_(name, kind, help) \
  strbuf_printf(b, ",\"%s\":%" PRIu64, #name, STATS_GET(ss, name));
      STATS_STREAM(ADMIN_STREAM_STAT_)
#undef ADMIN_STREAM_STAT_
      double bps, byps, stall;
      admin_stream_rates(srv, c, s, &bps, &byps, &stall);
      strbuf_puts(b, ",\"batches_per_s\":");
      admin_sb_num(b, bps);
      strbuf_puts(b, ",\"bytes_per_s\":");
      admin_sb_num(b, byps);
      strbuf_puts(b, ",\"stall\":");
      if (stall >= 0) admin_sb_num(b, stall);
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
 * and counts the others.  Its length is the page's: one printf after
 * another, section by section, with nothing to share between them. */
static void stats_human(server_t *srv, const conn_t *self, strbuf_t *b) {
  int all = admin_sees_all(self);
  char x[48], y[48], z[48], w[48];
  admin_rates_t r;
  admin_global_rates(srv, &r);
  uint64_t nclients = admin_count_trainers(srv), nstreams = STATS_GET(&srv->stats, streams);
  strbuf_printf(b,
                "larderd %s · up %s · %" PRIu64 " trainer%s · %" PRIu64
                " stream%s · rates over the last %.0f s\n",
                LARDERD_VERSION,
                admin_fmt_dur(x, sizeof(x), (double)(util_now_ns() - srv->started_ns) / 1e9),
                nclients, nclients == 1 ? "" : "s", nstreams, nstreams == 1 ? "" : "s",
                r.window_s < 1 ? 1.0 : r.window_s);

  /* The cache. */
  store_stats_t st;
  memset(&st, 0, sizeof(st));
  if (srv->store) store_stats_get(srv->store, &st);
  strbuf_printf(b, "\nCache  %s\n", srv->cfg.cache_dir);
  if (srv->store == NULL) {
    strbuf_printf(b,
                  "  none        serving without a cache, every epoch decoded from the sources: "
                  "%s (restart larderd once the cache directory is usable)\n",
                  srv->cache_error[0] ? srv->cache_error : "it could not be opened");
  } else {
    strbuf_printf(
        b, "  used        %s of %s (%.0f%%) · %s entries · %s objects · admission %s\n",
        admin_fmt_bytes(x, sizeof(x), (double)st.used_bytes),
        admin_fmt_bytes(y, sizeof(y), (double)st.capacity_bytes),
        st.capacity_bytes ? (double)st.used_bytes * 100.0 / (double)st.capacity_bytes : 0.0,
        admin_fmt_count(z, sizeof(z), st.entries), admin_fmt_count(w, sizeof(w), st.objects),
        !st.admission_disabled         ? "on"
        : st.write_error == LARDER_EIO ? "OFF (writes to the cache disk failed: see the log)"
                                       : "OFF (the cache disk is full)");
  }
  uint64_t hit = STATS_GET(&srv->stats, cache_hit_bytes),
           miss = STATS_GET(&srv->stats, cache_miss_bytes) +
                  STATS_GET(&srv->stats, cache_readback_bytes);
  if (hit + miss)
    strbuf_printf(
        b, "  hit ratio   %.1f%% of unit bytes since the start (%s from the cache, %s decoded)\n",
        (double)hit * 100.0 / (double)(hit + miss), admin_fmt_bytes(x, sizeof(x), (double)hit),
        admin_fmt_bytes(y, sizeof(y), (double)miss));
  else strbuf_puts(b, "  hit ratio   - (nothing served yet)\n");
  size_t nd = 0;
  dsagg_t *ds = datasets_of(srv, self, all, &nd);
  if (ds && nd) {
    strbuf_printf(b, "  %-48s %7s %10s\n", "DATASET", "STREAMS", "HIT RATIO");
    for (size_t i = 0; i < nd; i++) {
      char name[64], ratio[16];
      if (ds[i].hit + ds[i].miss)
        snprintf(ratio, sizeof(ratio), "%.1f%%",
                 (double)ds[i].hit * 100.0 / (double)(ds[i].hit + ds[i].miss));
      else snprintf(ratio, sizeof(ratio), "-");
      strbuf_printf(b, "  %-48s %7d %10s\n", admin_fmt_fit(name, sizeof(name), ds[i].name, 48),
                    ds[i].streams, ratio);
    }
  }
  free(ds);

  /* What memory_limit and footer_memory bound. */
  strbuf_puts(b, "\nMemory\n");
  strbuf_printf(b, "  units       %s of %s (memory_limit)\n",
                admin_fmt_bytes(x, sizeof(x), (double)STATS_GET(&srv->stats, memory_bytes)),
                admin_fmt_bytes(y, sizeof(y), (double)srv->cfg.memory_limit));
  strbuf_printf(b, "  footers     %s of %s (footer_memory) · %s files\n",
                admin_fmt_bytes(x, sizeof(x), (double)STATS_GET(&srv->stats, footer_bytes)),
                admin_fmt_bytes(y, sizeof(y), (double)srv->cfg.footer_memory),
                admin_fmt_count(z, sizeof(z), STATS_GET(&srv->stats, footer_files)));
  /* CUDA streams (cuda.h): device memory per GPU, once one was used. */
  if (cuda_devices_seen() > 0)
    strbuf_printf(b, "  gpu         %s (cuda_device_bytes)\n",
                  admin_fmt_bytes(x, sizeof(x), (double)STATS_GET(&srv->stats, cuda_device_bytes)));
  for (int d = 0; d < cuda_devices_seen(); d++)
    strbuf_printf(b, "    device %-3d %s\n", d,
                  admin_fmt_bytes(x, sizeof(x), (double)cuda_device_bytes_of(d)));
  /* The copies to the GPUs: the worker time each takes beside assembly. */
  uint64_t copies = STATS_GET(&srv->stats, cuda_copies);
  if (copies > 0)
    strbuf_printf(b, "  gpu copies  %s · %s · %.1f us each (cuda_copies, cuda_copy_bytes)\n",
                  admin_fmt_count(z, sizeof(z), copies),
                  admin_fmt_bytes(x, sizeof(x), (double)STATS_GET(&srv->stats, cuda_copy_bytes)),
                  (double)STATS_GET(&srv->stats, cuda_copy_ns) / 1e3 / (double)copies);

  /* Remote fetches. */
  strbuf_puts(b, "\nFetch\n");
  strbuf_printf(b, "  fetched     %s since the start · %.1f MB/s now\n",
                admin_fmt_bytes(x, sizeof(x), (double)STATS_GET(&srv->stats, fetch_bytes)),
                r.fetch_bytes_per_s / 1e6);
  strbuf_printf(b,
                "  requests    %" PRIu64 " in flight · %s done · %" PRIu64 " retries · %" PRIu64
                " errors\n",
                STATS_GET(&srv->stats, fetch_inflight),
                admin_fmt_count(y, sizeof(y), STATS_GET(&srv->stats, fetch_requests)),
                STATS_GET(&srv->stats, fetch_retries), STATS_GET(&srv->stats, fetch_errors));
  if (srv->stage)
    strbuf_printf(b, "  staged      %s of %s (stage_capacity) · %s row groups read from it\n",
                  admin_fmt_bytes(x, sizeof(x), (double)STATS_GET(&srv->stats, stage_bytes)),
                  admin_fmt_bytes(y, sizeof(y), (double)srv->cfg.stage_capacity),
                  admin_fmt_count(z, sizeof(z), STATS_GET(&srv->stats, stage_reads)));
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
    strbuf_printf(b, "  %8s %6s %7s  %-36s %9s %8s %6s\n", "PID", "UID", "RANK", "DATASET",
                  "BATCHES/S", "MB/S", "STALL");
    uint64_t hidden = 0;
    for (conn_t *c = srv->conns; c; c = c->next) {
      if (!admin_visible_to(self, all, c)) {
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
        strbuf_printf(b, "  %8d %6u %7s  %-36s %9.1f %8.1f %6s\n", (int)c->pid, (unsigned)c->uid,
                      rank, admin_fmt_fit(name, sizeof(name), si.dataset, 36), bps, byps / 1e6,
                      st_s);
      }
    }
    if (hidden)
      strbuf_printf(b, "  (and %" PRIu64 " stream%s of other users, listed to admins only)\n",
                    hidden, hidden == 1 ? "" : "s");
  }

  /* larderctl's jobs (prefetch, verify, evict, remote reads) at work. */
  int prefetches = 0, jobs = admin_jobs_running(srv, &prefetches);
  if (jobs)
    strbuf_printf(b, "\nJobs · %d larderctl job%s running (%d prefetch%s)\n", jobs,
                  jobs == 1 ? "" : "s", prefetches, prefetches == 1 ? "" : "es");

  /* Stages: per second of the window, the average number at work in each
   * (stage_busy), so that no figure reads as more time than passed. */
  strbuf_printf(b,
                "\nStages · average at work over the last %.0f s, in seconds of stage time per "
                "second\n  (1.00 s/s: one request or worker at it all along; stages overlap; "
                "time counts as each request, unit or batch ends)\n",
                r.window_s < 1 ? 1.0 : r.window_s);
  strbuf_printf(b, "  %-11s %6.2f s/s  requests in flight on average (%" PRIu64 " now)\n", "fetch",
                stage_busy(r.fetch_ns, &r), STATS_GET(&srv->stats, fetch_inflight));
  const struct {
    const char *name;
    double ns;
  } stages[] = {
      {"decode", r.decode_ns}, {"cache read", r.cache_read_ns}, {"assembly", r.assemble_ns}};
  for (size_t i = 0; i < 3; i++) {
    double share = stage_share(stages[i].ns, &r);
    strbuf_printf(b, "  %-11s %6.2f s/s  %3.0f%% of %d worker%s  ", stages[i].name,
                  stage_busy(stages[i].ns, &r), share * 100, r.workers, r.workers == 1 ? "" : "s");
    bar(b, share, 30);
    strbuf_puts(b, "\n");
  }
  verdict_t v;
  make_verdict(srv, &r, &v);
  strbuf_printf(b, "\nLimit: %s\n", v.text);
}

void admin_cmd_stats(conn_t *c, const Larder__AdminRequest *req) {
  strbuf_t b = {0};
  if (req->json) stats_json(c->srv, c, &b);
  else stats_human(c->srv, c, &b);
  admin_reply(c, req->request_id, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}
