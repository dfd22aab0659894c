/*
 * admin_jobs.c: the long-running jobs of larderctl (see admin.c for the
 * whole and for the job machinery): prefetch of datasets into the cache,
 * and inspect and cat of remote objects.
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
/* prefetch                                                                  */

typedef struct pf_rg {
  uint32_t next, end; /* its units [next, end) not yet started */
  int fetched;        /* its fetched bytes are counted (fetched_bytes) */
} pf_rg_t;

typedef struct pf_active {
  unit_t *u;
  uint32_t index;
  uint32_t rg;
  int offering; /* a worker writes it to the cache (pf_offer) */
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
  uint8_t *cached; /* per unit: every column was cached at the start */
  pf_rg_t *rgs;
  uint32_t num_rgs, next_rg;
  pf_active_t *active;
  int num_active, max_active;
  int polling;
  uint64_t total_bytes, done_bytes, before_bytes;
  /* Bytes fetched from remote sources for its row groups: each row
   * group's buffer once, when its first unit completes from one. */
  uint64_t fetched_bytes;
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
  p->rc =
      dataset_open((const char *const *)p->sources, p->num_sources, (const char *const *)p->columns,
                   p->num_columns, &p->dopts, &p->ds, p->err, sizeof(p->err));
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
  double fetch_rate = elapsed > 0 ? (double)p->fetched_bytes / elapsed : 0;
  uint64_t done_units = p->before_units + p->cached_units + p->not_admitted + p->failed;
  store_stats_t st;
  memset(&st, 0, sizeof(st));
  if (srv->store) store_stats_get(srv->store, &st);
  strbuf_t b = {0};
  strbuf_printf(&b, "{\"event\":\"%s\",\"dataset\":", event);
  admin_sb_json(&b, p->label);
  strbuf_printf(&b,
                ",\"files\":%u,\"units\":%u,\"units_done\":%" PRIu64 ",\"total_bytes\":%" PRIu64
                ",\"done_bytes\":%" PRIu64 ",\"cached_before_units\":%" PRIu64
                ",\"cached_before_bytes\":%" PRIu64 ",\"cached_units\":%" PRIu64
                ",\"not_admitted_units\":%" PRIu64 ",\"failed_units\":%" PRIu64 ",\"bytes_per_s\":",
                p->ds->num_files, p->units_total, done_units, p->total_bytes, p->done_bytes,
                p->before_units, p->before_bytes, p->cached_units, p->not_admitted, p->failed);
  admin_sb_num(&b, rate);
  strbuf_puts(&b, ",\"eta_s\":");
  if (eta >= 0) admin_sb_num(&b, eta);
  else strbuf_puts(&b, "null");
  strbuf_printf(&b, ",\"fetched_bytes\":%" PRIu64 ",\"fetched_bytes_per_s\":", p->fetched_bytes);
  admin_sb_num(&b, fetch_rate);
  strbuf_printf(&b, ",\"concurrency\":%d", p->max_active);
  strbuf_puts(&b, ",\"elapsed_s\":");
  admin_sb_num(&b, elapsed);
  strbuf_printf(&b, ",\"cache_used_bytes\":%" PRIu64 ",\"cache_capacity_bytes\":%" PRIu64,
                st.used_bytes, st.capacity_bytes);
  /* Why units were not kept, for larderctl's note: the cache's ranking, or
   * admission being off. */
  strbuf_puts(&b, ",\"admission\":");
  admin_sb_json(&b, srv->store == NULL ? "none: larderd runs without a cache (larderctl stats)"
                    : !st.admission_disabled ? "on"
                    : st.write_error == LARDER_EIO
                        ? "off: writes to the cache disk failed (see the log)"
                        : "off: the cache disk is full");
  if (p->first_error[0]) {
    strbuf_puts(&b, ",\"error\":");
    admin_sb_json(&b, p->first_error);
  }
  strbuf_puts(&b, "}");
  if (final) {
    log_notice("admin prefetch %s: %" PRIu64 " units cached now, %" PRIu64 " already, %" PRIu64
               " not admitted, %" PRIu64 " failed, in %.1f s",
               p->label, p->cached_units, p->before_units, p->not_admitted, p->failed, elapsed);
    admin_job_finish(&p->j, b.error ? LARDER_ENOMEM : 0, b.data);
  } else {
    conn_t *c = admin_job_conn(&p->j);
    /* Progress is periodic: skip a frame rather than queue behind a slow
     * reader. */
    if (c && uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) < (1u << 20))
      admin_reply_frame(c, p->j.request_id, 0, b.data ? b.data : "", b.len, 1);
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
  if (a.u->state != UNIT_FAILED && a.u->rg_fetched && !p->rgs[a.rg].fetched) {
    p->rgs[a.rg].fetched = 1;
    p->fetched_bytes += a.u->rg_fetched;
  }
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
  if (p->j.cancelled) admin_job_maybe_free(&p->j);
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
    admin_job_fail(j, p->rc, "%s", p->err);
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
    admin_job_fail(j, LARDER_ENOMEM, "out of memory");
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
      admin_job_fail(j, rc, "prefetch: %s",
                     rc == LARDER_EINVAL
                         ? "the dataset has fewer row groups with rows than partitions"
                         : "out of memory");
      return;
    }
    shuffle_node_partitions((uint32_t)p->partitions, (uint32_t)p->nodes, (uint32_t)p->node, &pfirst,
                            &plast);
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
        u->rg != ds->units[p->rgs[p->num_rgs - 1].end - 1].rg || p->rgs[p->num_rgs - 1].end != k)
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
    admin_job_maybe_free(&p->j);
    return;
  }
  if (status) {
    admin_job_fail(&p->j, status, "%s", message ? message : larder_strerror(status));
    return;
  }
  p->dopts.remote = objects;
  p->dopts.num_remote = count;
  if (admin_job_queue(&p->j, pf_open_work, pf_opened) != 0)
    admin_job_fail(&p->j, LARDER_ENOMEM, "cannot queue the request");
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
  admin_free_list(p->sources, p->num_sources);
  admin_free_list(p->columns, p->num_columns);
  free(p->roots);
  acl_peer_clear(&p->peer);
  free(p->label);
  free(p->cached);
  free(p->rgs);
  free(p->active);
}

void admin_cmd_prefetch(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  const char *pos[1024];
  size_t n = admin_positional(req, pos, 1024);
  if (n == 0) {
    admin_reply_error(
        c, req->request_id, LARDER_EINVAL,
        "prefetch: name the dataset: paths, globs, directories or URLs, as the trainers "
        "open it");
    return;
  }
  acl_peer_t peer;
  conn_peer(c, &peer);
  for (size_t i = 0; i < n; i++) {
    char why[2200];
    if (remote_is_url(pos[i]) && acl_check_url(srv->acl, &peer, pos[i], why, sizeof(why)) != 0) {
      admin_reply_error(c, req->request_id, LARDER_EACCES, "%s", why);
      return;
    }
    if (dataset_source_absolute(pos[i], why, sizeof(why)) != 0) {
      admin_reply_error(c, req->request_id, LARDER_EINVAL, "prefetch: %s", why);
      return;
    }
  }
  uint64_t unit_rows = srv->cfg.unit_rows;
  const char *ur = admin_opt_value(req, "unit-rows");
  if (ur && (admin_parse_u64(ur, &unit_rows) != 0 || unit_rows == 0)) {
    admin_reply_error(c, req->request_id, LARDER_EINVAL, "prefetch: bad --unit-rows %s", ur);
    return;
  }
  uint64_t partitions = 1, nodes = 1, node = 0, seed = 0;
  static const char *const part_opts[] = {"partitions", "nodes", "node", "seed"};
  uint64_t *part_vals[] = {&partitions, &nodes, &node, &seed};
  for (int k = 0; k < 4; k++) {
    const char *v = admin_opt_value(req, part_opts[k]);
    if (v && admin_parse_u64(v, part_vals[k]) != 0) {
      admin_reply_error(c, req->request_id, LARDER_EINVAL, "prefetch: bad --%s %s", part_opts[k],
                        v);
      return;
    }
  }
  if (partitions == 0 || partitions > STREAM_MAX_PARTITIONS || nodes == 0 ||
      nodes > STREAM_MAX_PARTITIONS || node >= nodes) {
    admin_reply_error(c, req->request_id, LARDER_EINVAL,
                      "prefetch: --partitions must be 1 to %u, and --node below --nodes",
                      STREAM_MAX_PARTITIONS);
    return;
  }
  prefetch_job_t *p = admin_job_new(c, req, JOB_PREFETCH, sizeof(prefetch_job_t));
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
  p->columns = admin_split_list(admin_opt_value(req, "columns"), &p->num_columns);
  int oom = 0;
  p->roots = acl_split_roots(srv->cfg.local_roots, &oom);
  if (p->num_sources != n || p->label == NULL || oom ||
      (admin_opt_value(req, "columns") && *admin_opt_value(req, "columns") && p->columns == NULL)) {
    admin_job_fail(&p->j, LARDER_ENOMEM, "out of memory");
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
    admin_job_fail(&p->j, LARDER_ENOMEM, "out of memory");
    return;
  }
  p->dopts.peer = &p->peer;
  int remote = 0;
  for (size_t i = 0; i < n; i++) remote |= remote_is_url(pos[i]);
  log_notice("admin prefetch %s: started by pid %d uid %u", p->label, (int)c->pid,
             (unsigned)c->uid);
  if (remote) {
    if (srv->fetch == NULL) {
      admin_job_fail(&p->j, LARDER_EUNSUPPORTED,
                     "remote sources are unavailable: the daemon could not start libcurl");
      return;
    }
    p->j.async++;
    int rc = server_resolve(srv, (const char *const *)p->sources, p->num_sources, pf_resolved, p);
    if (rc) {
      p->j.async--;
      admin_job_fail(&p->j, rc, "cannot resolve the remote sources");
    }
    return;
  }
  if (admin_job_queue(&p->j, pf_open_work, pf_opened) != 0)
    admin_job_fail(&p->j, LARDER_ENOMEM, "cannot queue the request");
}

/* ------------------------------------------------------------------------ */
/* inspect and cat of remote objects                                         */

typedef struct remote_job {
  job_t j;
  int cat; /* else inspect */
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
  int issuing;     /* the range fetch_get is being called for, or -1 */
  int issued_done; /* its callback ran inside fetch_get */
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
  admin_free_list(r->columns, r->num_columns);
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
  conn_t *c = admin_job_conn(&r->j);
  if (c == NULL) {
    r->j.cancelled = 1;
    admin_job_maybe_free(&r->j);
    return;
  }
  if (uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) > CAT_BACKLOG) {
    /* The client reads slower than we decode: wait, holding one row
     * group's bytes at most. */
    uv_timer_start(&r->j.timer, rj_backlog_timer, 10, 0);
    return;
  }
  if (admin_job_queue(&r->j, rj_render_work, rj_render_after) != 0)
    admin_job_fail(&r->j, LARDER_ENOMEM, "cannot queue the request");
}

static void rj_backlog_timer(uv_timer_t *t) {
  remote_job_t *r = t->data;
  if (r->j.cancelled || r->j.finished) return;
  rj_render_next(r);
}

static void rj_render_after(job_t *j) {
  remote_job_t *r = (remote_job_t *)j;
  if (r->rc) {
    admin_job_fail(j, r->rc, "%s", r->perr.msg[0] ? r->perr.msg : larder_strerror(r->rc));
    return;
  }
  if (r->out.len)
    admin_reply_frame(admin_job_conn(j), j->request_id, 0, r->out.data, r->out.len, 1);
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
    admin_job_fail(&r->j, r->fetch_rc, "%s", r->fetch_err);
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
    admin_job_maybe_free(&r->j);
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
    admin_job_finish(&r->j, 0, "");
    return;
  }
  pq_error err = {0, ""};
  pq_range_t *ranges = NULL;
  int n = pq_projection_ranges(r->file, r->proj, r->rg, &ranges, &err);
  if (n < 0) {
    free(ranges);
    admin_job_fail(&r->j, n, "%s", err.msg);
    return;
  }
  int k = 0;
  uint64_t gap = units_merge_gap(srv, r->url);
  for (int i = 0; i < n; i++) {
    if (k > 0 && ranges[i].offset <= ranges[k - 1].offset + ranges[k - 1].length + gap)
      ranges[k - 1].length = ranges[i].offset + ranges[i].length - ranges[k - 1].offset;
    else ranges[k++] = ranges[i];
  }
  r->ranges = ranges;
  r->num_ranges = k;
  r->data = calloc((size_t)k + 1, sizeof(uint8_t *));
  r->reqs = calloc((size_t)k + 1, sizeof(fetch_req_t *));
  if (r->data == NULL || r->reqs == NULL) {
    admin_job_fail(&r->j, LARDER_ENOMEM, "out of memory");
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
    r->rc = pq_projection_create(r->file, (const char *const *)r->columns, r->num_columns, &r->proj,
                                 &r->perr);
    return;
  }
  if (j->json) pq_inspect_json(&r->out, r->file);
  else pq_inspect_human(&r->out, r->file);
}

static void rj_parsed(job_t *j) {
  remote_job_t *r = (remote_job_t *)j;
  if (r->rc) {
    admin_job_fail(j, r->rc, "%s", r->perr.msg[0] ? r->perr.msg : larder_strerror(r->rc));
    return;
  }
  if (!r->cat) {
    admin_job_finish(j, 0, r->out.data ? r->out.data : "");
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
    admin_job_maybe_free(&r->j);
    return;
  }
  if (status) {
    admin_job_fail(&r->j, status, "%s", message ? message : larder_strerror(status));
    return;
  }
  if (count != 1) {
    char first[600];
    fetch_redact(count ? objects[0].url : r->url, first, sizeof(first));
    admin_job_fail(&r->j, LARDER_EINVAL, "%s names %zu objects; %s takes one%s%s%s", r->url, count,
                   r->cat ? "cat" : "inspect", count ? " (the first is " : "", count ? first : "",
                   count ? ")" : "");
    return;
  }
  if (admin_job_queue(&r->j, rj_parse_work, rj_parsed) != 0)
    admin_job_fail(&r->j, LARDER_ENOMEM, "cannot queue the request");
}

static void cmd_remote(conn_t *c, const Larder__AdminRequest *req, int cat) {
  server_t *srv = c->srv;
  const char *pos[2];
  size_t n = admin_positional(req, pos, 2);
  const char *what = cat ? "cat" : "inspect";
  if (n != 1 || !remote_is_url(pos[0])) {
    admin_reply_error(c, req->request_id, LARDER_EINVAL, "%s: one URL (http://, https:// or s3://)",
                      what);
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
    admin_reply_error(c, req->request_id, rc, "%s", why);
    return;
  }
  if (srv->fetch == NULL) {
    admin_reply_error(c, req->request_id, LARDER_EUNSUPPORTED,
                      "remote sources are unavailable: the daemon could not start libcurl");
    return;
  }
  uint64_t offset = 0, limit = UINT64_MAX, max_chunk = 0;
  const char *v;
  if ((v = admin_opt_value(req, "offset")) && admin_parse_u64(v, &offset) != 0) {
    admin_reply_error(c, req->request_id, LARDER_EINVAL, "cat: bad --offset %s", v);
    return;
  }
  if ((v = admin_opt_value(req, "limit")) && admin_parse_u64(v, &limit) != 0) {
    admin_reply_error(c, req->request_id, LARDER_EINVAL, "cat: bad --limit %s", v);
    return;
  }
  if ((v = admin_opt_value(req, "max-chunk-bytes")) &&
      (admin_parse_u64(v, &max_chunk) != 0 || max_chunk == 0)) {
    admin_reply_error(c, req->request_id, LARDER_EINVAL, "cat: bad --max-chunk-bytes %s", v);
    return;
  }
  remote_job_t *r = admin_job_new(c, req, JOB_REMOTE, sizeof(remote_job_t));
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
  r->opts.verify_crc = srv->cfg.verify_crc && !admin_opt_flag(req, "no-verify-crc");
  r->opts.max_chunk_decoded_bytes = srv->cfg.max_chunk_decoded_bytes;
  /* A client may lower the bomb guard, never raise it. */
  if (max_chunk && max_chunk < r->opts.max_chunk_decoded_bytes)
    r->opts.max_chunk_decoded_bytes = max_chunk;
  const char *cols = admin_opt_value(req, "columns");
  r->columns = admin_split_list(cols, &r->num_columns);
  if (r->url == NULL || (cols && *cols && r->columns == NULL)) {
    admin_job_fail(&r->j, LARDER_ENOMEM, "out of memory");
    return;
  }
  r->j.async++;
  rc = server_resolve(srv, (const char *const *)&r->url, 1, rj_resolved, r);
  if (rc) {
    r->j.async--;
    admin_job_fail(&r->j, rc, "cannot resolve %s", pos[0]);
  }
}

void admin_cmd_inspect(conn_t *c, const Larder__AdminRequest *req) { cmd_remote(c, req, 0); }
void admin_cmd_cat(conn_t *c, const Larder__AdminRequest *req) { cmd_remote(c, req, 1); }
