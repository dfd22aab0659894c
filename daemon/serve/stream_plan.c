/*
 * stream_plan.c: a stream's look ahead (see stream.c for the whole): the
 * prefetch pins of the coming units, the row orders made ahead in the
 * background, the read-ahead of remote row groups into the cache, the
 * revalidation of remote objects at epoch starts, and the planning of the
 * coming batches' samples on workers.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ring.h"
#include "serve/cuda.h"
#include "log.h"
#include "serve/metrics.h"
#include "serve/arena.h"
#include "serve/conn.h"
#include "serve/stream.h"
#include "serve/stream_int.h"
#include "serve/units.h"
#include "serve/server.h"
#include "util.h"

/* ------------------------------------------------------------------------ */
/* Prefetch pins                                                             */

/*
 * Pins the units of the next pin_span batches past the pin position, so
 * their loads start a window before the batches are planned.  A worker
 * lists them (pin_task_work: the units of the windows the span draws on);
 * the loop only takes the references (pin_task_done).  The pins run half a
 * span ahead of the planner.
 */
static void pin_task_work(work_t *w) {
  pin_task_t *t = w->data;
  stream_t *s = t->s;
  if (s->pin_ep == NULL || s->pin_ep_epoch != t->epoch) {
    shuffle_epoch_close(s->pin_ep);
    s->pin_ep = NULL;
    if (shuffle_epoch_open(s->plan, t->epoch, &s->pin_ep) != 0) return;
    s->pin_ep_epoch = t->epoch;
  }
  uint32_t max = s->ds->num_units;
  t->idx = malloc((size_t)(max ? max : 1) * sizeof(uint32_t));
  if (t->idx == NULL) return;
  t->n = shuffle_epoch_window_units(s->pin_ep, t->first, t->last, t->idx, max);
}

/*
 * The row orders of the windows a pinned span starts and ends in (a span is
 * about a window long) are made ahead too, so that the planner, half a span
 * behind, finds them made (cursors of a plan share them) instead of making
 * a window's permutation (milliseconds for a large window) ahead of the
 * next batch.  An order task is background work (work_queue_background): a
 * worker takes it only when no batch waits to be assembled, and it stops
 * every ORDER_SLICE_SWAPS swaps if one does, so the permutation fills the
 * gaps between assemblies instead of delaying them.  (Measured on 2 cores,
 * bench/work's dataset, a trainer at 1.6x the daemon's cost: made in slices
 * of 2^16 swaps queued behind the assemblies, the order took a worker for
 * bursts of 4-5 ms at each window, and the trainer waited 0.3-0.7 ms after
 * most of them.)  While the workers are never idle (a trainer that waits on
 * the daemon anyway) the orders are left to the planner, which makes any it
 * does not find.  One task runs at a time, for the latest span pinned.
 */
#define ORDER_SLICE_SWAPS (1u << 13)
#define ORDER_URGENT_SWAPS (1u << 16)

static void order_task_work(work_t *w) {
  order_task_t *t = w->data;
  stream_t *s = t->s;
  t->more = 0;
  if (s->order_ep == NULL || s->order_ep_epoch != t->epoch) {
    shuffle_epoch_close(s->order_ep);
    s->order_ep = NULL;
    /* Out of memory: the planner makes the orders. */
    if (shuffle_epoch_open(s->plan, t->epoch, &s->order_ep) != 0) return;
    s->order_ep_epoch = t->epoch;
  }
  uint64_t done = 0;
  while (t->last > t->first && t->windows < 2) {
    if (done > 0 &&
        (t->urgent ? done >= ORDER_URGENT_SWAPS : work_pool_foreground_waiting(t->pool))) {
      t->more = 1;
      return;
    }
    uint64_t b = t->windows == 0 ? t->first : t->last - 1;
    done += ORDER_SLICE_SWAPS;
    /* 0: more swaps to make; 1: made; < 0 (out of memory): left to the
     * planner. */
    if (shuffle_epoch_prepare(s->order_ep, b, ORDER_SLICE_SWAPS) != 0) t->windows++;
  }
}

static void order_task_done(work_t *w, int status);

/* Queues order task t: as background work while the planner is more than a
 * quarter span from the span's start, else (the gaps between assemblies
 * did not leave it time enough) as foreground work, a slice of
 * ORDER_URGENT_SWAPS at a time, queued behind the assemblies as they come. */
static int queue_orders(stream_t *s, order_task_t *t) {
  uint64_t plan_pos = stream_linear(s, s->plan_epoch, s->plan_batch);
  uint64_t span_pos = stream_linear(s, t->epoch, t->first);
  t->urgent = span_pos < plan_pos + s->pin_span / 4;
  return t->urgent
             ? work_queue(s->srv->pool, &t->work, order_task_work, order_task_done)
             : work_queue_background(s->srv->pool, &t->work, order_task_work, order_task_done);
}

/* Ends order task t without running it again (not queued, not running). */
void stream_drop_orders(stream_t *s, order_task_t *t) {
  s->tasks--;
  s->order_task = NULL;
  free(t);
}

/* Queues the stream's order task again as foreground work if it still
 * waits in the background queue when the planner has come within a quarter
 * span of it.  Otherwise a task is promoted only when it is queued again
 * after a slice, so one that waits for a gap between assemblies would never
 * be, and the planner would meet the epoch's start with the order not made:
 * it would make the whole permutation itself, and the trainer would wait
 * 3-5 ms at the start of most epochs (seen in per-task traces on 2 cores, a
 * trainer at 1.6x the daemon's cost).  A task that is running promotes
 * itself when its slice ends. */
void stream_promote_orders(stream_t *s) {
  order_task_t *t = s->order_task;
  if (t == NULL || t->urgent) return;
  uint64_t plan_pos = stream_linear(s, s->plan_epoch, s->plan_batch);
  if (stream_linear(s, t->epoch, t->first) >= plan_pos + s->pin_span / 4) return;
  if (work_cancel(s->srv->pool, &t->work) != 0) return;
  if (queue_orders(s, t) != 0) stream_drop_orders(s, t);
}

/* Starts an order task for the span that wants one, unless one runs. */
static void start_orders(stream_t *s) {
  if (s->order_task || !s->order_wanted || s->closed || s->srv->shutting_down) return;
  order_task_t *t = calloc(1, sizeof(*t));
  if (t == NULL) return; /* the planner makes the orders */
  t->s = s;
  t->pool = s->srv->pool;
  t->epoch = s->order_epoch;
  t->first = s->order_first;
  t->last = s->order_last;
  t->work.data = t;
  t->work.owner = s->owner;
  s->order_wanted = 0;
  s->order_task = t;
  s->tasks++;
  if (queue_orders(s, t) != 0) stream_drop_orders(s, t);
}

static void order_task_done(work_t *w, int status) {
  order_task_t *t = w->data;
  stream_t *s = t->s;
  if (t->more && status == 0 && !s->closed && !s->srv->shutting_down && queue_orders(s, t) == 0)
    return; /* the same task, behind the work that stopped it */
  stream_drop_orders(s, t);
  if (s->closed || status != 0 || s->srv->shutting_down) {
    stream_maybe_free(s);
    return;
  }
  start_orders(s);
}

/*
 * Units one turn of the loop pins at most.  A span's units number up to a
 * whole shuffle window, which is the whole dataset when units are small (a
 * million one-row row groups): acquiring them all in one turn (an
 * allocation and a queued load each) held the loop for seconds, and other
 * clients' connects timed out.  The rest are pinned in later turns, the
 * task going once more through the pool (a task that runs nothing), so it
 * also waits behind the loads it has just queued.
 */
#define PIN_SLICE 2048

static void pin_task_resume(work_t *w) { (void)w; }

static void pin_task_done(work_t *w, int status) {
  pin_task_t *t = w->data;
  stream_t *s = t->s;
  s->tasks--;
  if (s->closed || status != 0 || s->srv->shutting_down) {
    s->pin_busy = 0;
    free(t->idx);
    free(t);
    stream_maybe_free(s);
    return;
  }
  int n = t->idx ? t->n : 0;
  if (t->next == 0) {
    stream_rotate_pins(s);
    if (n > 0 && n > s->cap_pins) {
      pin_t *p = realloc(s->pins, (size_t)n * sizeof(pin_t));
      if (p == NULL) n = t->n = 0;
      else {
        s->pins = p;
        s->cap_pins = n;
      }
    }
  }
  int end = n - t->next > PIN_SLICE ? t->next + PIN_SLICE : n;
  uint64_t outer = s->srv->acquiring_owner;
  s->srv->acquiring_owner = s->owner; /* the loads are this stream's work */
  const uint32_t *idx = t->idx;
  for (; idx != NULL && t->next < end; t->next++) {
    unit_t *u = units_acquire(s->srv, s->ds, idx[t->next]);
    if (u == NULL) {
      t->next = n; /* out of memory: the rest is left to the planner */
      break;
    }
    s->pins[s->num_pins].u = u;
    s->pins[s->num_pins].index = idx[t->next];
    s->num_pins++;
    if (s->pinned) s->pinned[idx[t->next]] = u;
  }
  s->srv->acquiring_owner = outer;
  if (t->next < n) {
    /* pin_busy stays set: no other span starts until this one is done. */
    s->tasks++;
    if (work_queue(s->srv->pool, &t->work, pin_task_resume, pin_task_done) == 0) return;
    s->tasks--;
  }
  s->pin_busy = 0;
  /* Pins are a prefetch: a span they could not find (out of memory) is
   * skipped, and its batches load their units when planned. */
  s->order_wanted = 1;
  s->order_epoch = t->epoch;
  s->order_first = t->first;
  s->order_last = t->last;
  start_orders(s);
  s->pin_batch = t->last;
  if (s->pin_batch >= s->batches_per_epoch) {
    s->pin_epoch++;
    s->pin_batch = 0;
  }
  free(t->idx);
  free(t);
  stream_pump(s);
}

void stream_advance_pins(stream_t *s) {
  if (s->pin_busy) return;
  uint64_t plan_pos = stream_linear(s, s->plan_epoch, s->plan_batch);
  uint64_t pin_pos = stream_linear(s, s->pin_epoch, s->pin_batch);
  if (pin_pos > plan_pos + s->pin_span / 2) return;
  if (s->epochs && s->pin_epoch >= s->epochs) return;
  /* A changed object ends the stream at this epoch's end: loading what
   * comes after would only fetch the new version to throw it away. */
  if (s->stale_msg) return;
  pin_task_t *t = calloc(1, sizeof(*t));
  if (t == NULL) return;
  t->s = s;
  t->epoch = s->pin_epoch;
  t->first = s->pin_batch;
  t->last = t->first + s->pin_span;
  if (t->last > s->batches_per_epoch) t->last = s->batches_per_epoch;
  t->work.data = t;
  t->work.owner = s->owner;
  s->tasks++;
  s->pin_busy = 1;
  if (work_queue(s->srv->pool, &t->work, pin_task_work, pin_task_done) != 0) {
    s->tasks--;
    s->pin_busy = 0;
    free(t);
  }
}

/* ------------------------------------------------------------------------ */
/* Read-ahead                                                                */

/*
 * Offers the row groups of the batches past the pins to units_read_ahead,
 * in the order the batches will need them, up to one epoch past the
 * batch being planned (the next epoch's order is known too).  The fetcher
 * then works through the epoch in consumption order while the trainer
 * consumes it, bounded by fetch_inflight_bytes of fetches outstanding and
 * by what the cache will keep; pins alone look only a window ahead, which
 * leaves the network idle between windows.  Stops when the budget is spent;
 * stream_read_ahead_all resumes it as fetches complete.
 */
typedef struct prio_bytes {
  uint64_t prio, bytes;
} prio_bytes_t;

static int cmp_prio(const void *a, const void *b) {
  uint64_t x = ((const prio_bytes_t *)a)->prio, y = ((const prio_bytes_t *)b)->prio;
  return (x > y) - (x < y);
}

/* Sorts the dataset's row groups by cache priority, once. */
static int build_rg_prio(stream_t *s) {
  const dataset_t *ds = s->ds;
  prio_bytes_t *v = malloc(((size_t)ds->num_units + 1) * sizeof(*v));
  if (v == NULL) return LARDER_ENOMEM;
  uint32_t n = 0;
  for (uint32_t i = 0; i < ds->num_units; i++) {
    const dataset_unit_t *u = &ds->units[i];
    if (n > 0 && i > 0 && u->file == u[-1].file && u->rg == u[-1].rg)
      v[n - 1].bytes += u->est_bytes;
    else v[n++] = (prio_bytes_t){u->priority, u->est_bytes};
  }
  qsort(v, n, sizeof(*v), cmp_prio);
  s->rg_prio = malloc(((size_t)n + 1) * sizeof(uint64_t));
  s->rg_prio_bytes = malloc(((size_t)n + 1) * sizeof(uint64_t));
  if (s->rg_prio == NULL || s->rg_prio_bytes == NULL) {
    free(v);
    return LARDER_ENOMEM;
  }
  uint64_t acc = 0;
  for (uint32_t i = 0; i < n; i++) {
    acc += v[i].bytes;
    s->rg_prio[i] = v[i].prio;
    s->rg_prio_bytes[i] = acc;
  }
  s->num_rg_prio = n;
  free(v);
  return 0;
}

/* The worst priority among the row groups that the cache keeps for good
 * when it holds the best of this dataset up to its capacity: the cache
 * keeps the lowest priorities (store.c), so read-ahead into the cache of a
 * row group above this would be evicted again, maybe before its use. */
static uint64_t resident_priority_at(const stream_t *s, uint64_t cap) {
  if (s->num_rg_prio == 0 || s->rg_prio_bytes[s->num_rg_prio - 1] <= cap) return UINT64_MAX;
  uint32_t lo = 0, hi = s->num_rg_prio; /* first index whose running sum exceeds cap */
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (s->rg_prio_bytes[mid] <= cap) lo = mid + 1;
    else hi = mid;
  }
  return lo == 0 ? 0 : s->rg_prio[lo - 1];
}

static uint64_t resident_priority(const stream_t *s) {
  return resident_priority_at(s, s->srv->cfg.cache_capacity);
}

void stream_advance_read_ahead(stream_t *s) {
  if (!s->remote || s->closed || s->srv->shutting_down || s->batches_per_epoch == 0) return;
  /* A changed object ends the stream at this epoch's end (stream_advance_pins). */
  if (s->stale_msg) return;
  uint64_t plan_pos = stream_linear(s, s->plan_epoch, s->plan_batch);
  /* Up to one epoch past planning; with revalidation on, not past this
   * epoch, whose end checks the objects before anything more is read. */
  uint64_t horizon = s->srv->cfg.revalidate > 0 ? stream_linear(s, s->plan_epoch + 1, 0)
                                                : plan_pos + s->batches_per_epoch;
  uint64_t pin_pos = stream_linear(s, s->pin_epoch, s->pin_batch);
  if (stream_linear(s, s->ra_epoch, s->ra_batch) < pin_pos) {
    /* Behind the pins (the start, or a trainer faster than the network):
     * the pins have asked for those units already. */
    s->ra_epoch = s->pin_epoch;
    s->ra_batch = s->pin_batch;
    s->ra_n = s->ra_i = 0;
    shuffle_epoch_close(s->ra_ep);
    s->ra_ep = NULL;
  }
  if (s->ra_units == NULL) {
    s->ra_units = malloc((size_t)s->ds->num_units * sizeof(uint32_t));
    if (s->ra_units == NULL || build_rg_prio(s) != 0) {
      s->remote = 0; /* out of memory: no read-ahead for this stream */
      return;
    }
  }
  uint64_t resident = resident_priority(s);
  /* Staged once fetched: what lies beyond half the cache, not only beyond
   * all of it.  The units' sizes are estimates (Parquet's uncompressed
   * sizes count dictionary indices, not values), and the row groups at
   * the edge of what fits are the ones the cache evicts again when the
   * estimates fall short, after the first epoch fetched and cached them,
   * before their units' turn: staged too, those units decode from the
   * disk instead of fetching their row group a second time. */
  s->ds->resident_priority = resident;
  s->ds->stage_priority = resident_priority_at(s, s->srv->cfg.cache_capacity / 2);
  for (;;) {
    while (s->ra_i < s->ra_n) {
      uint32_t k = s->ra_units[s->ra_i];
      if (units_read_ahead(s->srv, s->ds, k, s->ds->units[k].priority <= resident) < 0) return;
      s->ra_i++;
    }
    if (s->epochs && s->ra_epoch >= s->epochs) return;
    if (stream_linear(s, s->ra_epoch, s->ra_batch) >= horizon) return;
    if (s->ra_ep == NULL || s->ra_batch == 0) {
      shuffle_epoch_close(s->ra_ep);
      s->ra_ep = NULL;
      if (shuffle_epoch_open(s->plan, s->ra_epoch, &s->ra_ep) != 0) return;
    }
    uint64_t first = s->ra_batch;
    uint64_t last = first + 64;
    if (last > s->batches_per_epoch) last = s->batches_per_epoch;
    int n = shuffle_epoch_units(s->ra_ep, first, last, s->ra_units, s->ds->num_units);
    if (n < 0) return;
    s->ra_n = n;
    s->ra_i = 0;
    s->ra_batch = last;
    if (s->ra_batch >= s->batches_per_epoch) {
      s->ra_epoch++;
      s->ra_batch = 0;
    }
  }
}

void stream_read_ahead_all(server_t *srv) {
  uint64_t outer = srv->acquiring_owner;
  for (conn_t *c = srv->conns; c; c = c->next)
    for (stream_t *s = c->streams; s; s = s->next_in_conn) {
      srv->acquiring_owner = s->owner; /* the loads are this stream's work */
      stream_advance_read_ahead(s);
    }
  srv->acquiring_owner = outer;
}

/* ------------------------------------------------------------------------ */
/* Planning                                                                  */

/* ------------------------------------------------------------------------ */
/* Revalidation of remote objects at epoch starts                            */

typedef struct reval {
  stream_t *s;
  uint32_t file;
} reval_t;

static void on_revalidated(fetch_req_t *req, const fetch_result_t *res, void *arg) {
  reval_t *rv = arg;
  stream_t *s = rv->s;
  dataset_file_t *f = &s->ds->files[rv->file];
  s->validating--;
  s->tasks--;
  /* Size, ETag and Last-Modified are all compared: an object whose server
   * sends Last-Modified alone changes with no ETag to show it.  Tested by
   * remote_hostile_no_etag. */
  int changed =
      res->status == 0 && !remote_same_version(f->size, f->etag, f->last_modified, res->object_size,
                                               res->etag, res->last_modified);
  /* A failed check does not count as "not changed": an object deleted
   * since the stream opened (404) has changed, and must not go on being
   * served from the cache.  Other failures (access, the network) cannot
   * tell, and are logged.  Tested by remote_revalidate. */
  int gone = res->status == LARDER_ENOENT;
  if (res->status != 0 && !gone && !s->closed) {
    char where[400];
    fetch_redact(f->path, where, sizeof(where));
    log_warn("stream %u: cannot check whether %s changed (%s); serving it as it was", s->id, where,
             res->message ? res->message : larder_strerror(res->status));
  }
  if (gone && !s->closed && s->stale_msg == NULL) {
    char where[400], m[1024];
    fetch_redact(f->path, where, sizeof(where));
    snprintf(m, sizeof(m),
             "%s no longer exists (HTTP 404): its cached data was dropped; reopen the stream "
             "without it",
             where);
    s->stale_msg = strdup(m);
  }
  changed = changed || gone;
  if (changed && !s->closed) {
    /* The stream does not fail at once: the check runs when planning
     * reaches the next epoch, up to prefetch_batches before the client
     * does, and failing here would lose the end of the epoch before, all of
     * it old and consistent data, while a client resuming at its position
     * would read the rest of that epoch from the new version.  The planned
     * batches are sent first, and the stream ends exactly at the epoch
     * boundary (stream_pump).  Tested by remote_revalidate. */
    if (s->stale == NULL) s->stale = calloc(s->ds->num_files, 1);
    if (s->stale) s->stale[rv->file] = 1;
    if (s->stale_msg == NULL) {
      char where[400], m[1024];
      fetch_redact(f->path, where, sizeof(where));
      snprintf(m, sizeof(m),
               "%s changed since the stream opened (size %llu, ETag '%s', Last-Modified '%s'; "
               "now %llu, '%s', '%s'): its cached data was dropped; reopen the stream at epoch "
               "%llu to read the new version",
               where, (unsigned long long)f->size, f->etag, f->last_modified,
               (unsigned long long)res->object_size, res->etag, res->last_modified,
               (unsigned long long)s->plan_epoch);
      s->stale_msg = strdup(m);
    }
  }
  fetch_req_free(req);
  free(rv);
  if (s->closed) {
    stream_maybe_free(s);
    return;
  }
  if (s->validating == 0) stream_pump(s);
}

/* Ends a stream whose remote objects changed, once every batch of the
 * epoch before the change is sent: their cached units are of the old
 * version, so they are dropped now. */
void stream_fail_stale(stream_t *s) {
  for (uint32_t i = 0; s->stale && i < s->ds->num_files; i++) {
    if (!s->stale[i] || s->srv->store == NULL) continue;
    uint64_t n = 0, bytes = 0;
    store_evict(s->srv->store, NULL, s->ds->files[i].object_id, 0, &n, &bytes);
  }
  stream_fail(s, LARDER_EIO, "%s", s->stale_msg ? s->stale_msg : "a remote object changed");
}

/* At the start of an epoch, and at most every `revalidate` seconds, checks
 * that no remote object changed (size and ETag of its tail); planning of
 * the epoch waits for the answers, so a changed object is never served. */
static void start_revalidation(stream_t *s) {
  server_t *srv = s->srv;
  if (srv->cfg.revalidate == 0 || srv->fetch == NULL) return;
  uint64_t now = util_now_ns();
  if (now - s->validated_ns < srv->cfg.revalidate * 1000000000ull) return;
  s->validated_ns = now;
  for (uint32_t i = 0; i < s->ds->num_files; i++) {
    if (!s->ds->files[i].remote) continue;
    reval_t *rv = malloc(sizeof(*rv));
    if (rv == NULL) continue;
    rv->s = s;
    rv->file = i;
    fetch_range_t r = {0, 0, 8, 1};
    s->validating++;
    s->tasks++;
    if (fetch_get(srv->fetch, s->ds->files[i].path, &r, on_revalidated, rv) == NULL) {
      s->validating--;
      s->tasks--;
      free(rv);
    }
  }
}

/* Batches a planning task computes: a fraction of a millisecond of work
 * for the loop to wait on at most, once per chunk. */
#define PLAN_CHUNK 32

static void plan_task_work(work_t *w) {
  plan_chunk_t *c = w->data;
  stream_t *s = c->s;
  if (s->plan_ep == NULL || s->plan_ep_epoch != c->epoch) {
    shuffle_epoch_close(s->plan_ep);
    s->plan_ep = NULL;
    c->rc = shuffle_epoch_open(s->plan, c->epoch, &s->plan_ep);
    if (c->rc) return;
    s->plan_ep_epoch = c->epoch;
  }
  size_t bs = s->params.batch_size;
  size_t nu = 0;
  c->unit_start[0] = 0;
  for (uint64_t i = 0; i < c->n && c->rc == 0; i++) {
    shuffle_sample_t *smp = c->samples + i * bs;
    int rc = shuffle_epoch_batch(s->plan_ep, c->first + i, smp);
    if (rc < 0) {
      c->rc = rc;
      break;
    }
    /* plan_slot holds UINT32_MAX for every unit between batches. */
    uint32_t *units = c->units + c->unit_start[i];
    uint32_t nd = 0;
    for (size_t j = 0; j < bs; j++) {
      uint32_t u = smp[j].unit;
      if (s->plan_slot[u] == UINT32_MAX) {
        s->plan_slot[u] = nd;
        units[nd++] = u;
      }
      c->slots[i * bs + j] = s->plan_slot[u];
    }
    for (uint32_t k = 0; k < nd; k++) s->plan_slot[units[k]] = UINT32_MAX;
    nu += nd;
    c->unit_start[i + 1] = nu;
  }
}

static void plan_task_done(work_t *w, int status) {
  plan_chunk_t *c = w->data;
  stream_t *s = c->s;
  s->tasks--;
  s->plan_busy = 0;
  if (s->closed || status != 0 || s->srv->shutting_down) {
    s->next = NULL;
    stream_plan_chunk_free(c);
    stream_maybe_free(s);
    return;
  }
  if (c->rc) {
    s->next = NULL;
    int rc = c->rc;
    stream_plan_chunk_free(c);
    stream_fail(s, rc, "cannot plan the next batches: %s", larder_strerror(rc));
    return;
  }
  stream_pump(s);
}

/* Starts planning the chunk that begins at (epoch, first) into s->next. */
static int start_plan_task(stream_t *s, uint64_t epoch, uint64_t first) {
  if (s->plan_busy || s->next) return 0;
  if (first >= s->batches_per_epoch) {
    epoch++;
    first = 0;
  }
  if (s->epochs && epoch >= s->epochs) return 0;
  plan_chunk_t *c = calloc(1, sizeof(*c));
  if (c == NULL) return LARDER_ENOMEM;
  c->s = s;
  c->epoch = epoch;
  c->first = first;
  c->n = s->batches_per_epoch - first < PLAN_CHUNK ? s->batches_per_epoch - first : PLAN_CHUNK;
  size_t bs = s->params.batch_size;
  uint64_t chunk_max = PLAN_MAX_SAMPLES / 4 / bs;
  if (c->n > chunk_max) c->n = chunk_max ? chunk_max : 1;
  size_t per_batch = bs < s->ds->num_units ? bs : s->ds->num_units;
  c->samples = malloc((size_t)c->n * bs * sizeof(shuffle_sample_t));
  c->slots = malloc((size_t)c->n * bs * sizeof(uint32_t));
  c->units = malloc(((size_t)c->n * per_batch + 1) * sizeof(uint32_t));
  c->unit_start = malloc(((size_t)c->n + 1) * sizeof(size_t));
  if (c->samples == NULL || c->slots == NULL || c->units == NULL || c->unit_start == NULL) {
    stream_plan_chunk_free(c);
    return LARDER_ENOMEM;
  }
  c->work.data = c;
  c->work.owner = s->owner;
  s->next = c;
  s->plan_busy = 1;
  s->tasks++;
  if (work_queue(s->srv->pool, &c->work, plan_task_work, plan_task_done) != 0) {
    s->tasks--;
    s->plan_busy = 0;
    s->next = NULL;
    stream_plan_chunk_free(c);
    return LARDER_ENOMEM;
  }
  return 0;
}

static int chunk_has(const plan_chunk_t *c, uint64_t epoch, uint64_t batch) {
  return c && c->epoch == epoch && batch >= c->first && batch < c->first + c->n;
}

/* Plans the batch at (plan_epoch, plan_batch).  Returns 0, LARDER_EAGAIN
 * while its samples are still being computed (the task's end pumps the
 * stream again), or a negative code. */
int stream_plan_one(stream_t *s) {
  if (!chunk_has(s->cur, s->plan_epoch, s->plan_batch)) {
    if (!s->plan_busy && chunk_has(s->next, s->plan_epoch, s->plan_batch)) {
      stream_plan_chunk_free(s->cur);
      s->cur = s->next;
      s->next = NULL;
    } else {
      if (!s->plan_busy && s->next) {
        /* Not the chunk needed (cannot happen in order; be safe). */
        stream_plan_chunk_free(s->next);
        s->next = NULL;
      }
      int rc = start_plan_task(s, s->plan_epoch, s->plan_batch);
      return rc ? rc : LARDER_EAGAIN;
    }
  }
  /* Plan the chunk after this one while this one is used. */
  int trc = start_plan_task(s, s->cur->epoch, s->cur->first + s->cur->n);
  if (trc) return trc;
  pbatch_t *b = calloc(1, sizeof(*b));
  if (b == NULL) return LARDER_ENOMEM;
  b->s = s;
  b->epoch = s->plan_epoch;
  b->index = s->plan_batch;
  b->n = (int)s->params.batch_size;
  uint64_t k = b->index - s->cur->first;
  const uint32_t *idx = s->cur->units + s->cur->unit_start[k];
  int nd = (int)(s->cur->unit_start[k + 1] - s->cur->unit_start[k]);
  b->samples = malloc((size_t)b->n * sizeof(shuffle_sample_t));
  b->sample_slot = malloc((size_t)b->n * sizeof(uint32_t));
  b->sample_unit = malloc((size_t)b->n * sizeof(unit_t *));
  b->units = calloc((size_t)(nd ? nd : 1), sizeof(unit_t *));
  b->unit_index = malloc((size_t)(nd ? nd : 1) * sizeof(uint32_t));
  int rc = LARDER_ENOMEM;
  if (b->samples == NULL || b->sample_slot == NULL || b->sample_unit == NULL || b->units == NULL ||
      b->unit_index == NULL)
    goto fail;
  memcpy(b->samples, s->cur->samples + k * (uint64_t)b->n, (size_t)b->n * sizeof(shuffle_sample_t));
  memcpy(b->sample_slot, s->cur->slots + k * (uint64_t)b->n, (size_t)b->n * sizeof(uint32_t));
  /* Each distinct unit gets one reference for the batch, taken directly
   * when the stream already pins it. */
  for (int i = 0; i < nd; i++) {
    unit_t *u = s->pinned[idx[i]];
    if (u != NULL) u->refs++;
    else u = units_acquire(s->srv, s->ds, idx[i]);
    if (u == NULL) goto fail;
    b->units[i] = u;
    b->unit_index[i] = idx[i];
    b->num_units++;
  }
  b->seq = s->next_seq++;
  b->state = PB_WAITING;
  if (s->q_tail) s->q_tail->next = b;
  else s->q_head = b;
  s->q_tail = b;
  s->q_len++;
  if (++s->plan_batch >= s->batches_per_epoch) {
    s->plan_batch = 0;
    s->plan_epoch++;
    if (s->epochs && s->plan_epoch >= s->epochs) s->exhausted = 1;
    else start_revalidation(s);
  }
  return 0;
fail:
  stream_pbatch_free(s, b);
  return rc;
}
