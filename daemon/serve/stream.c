/*
 * stream.c: one stream of batches, from OpenStream to its end.
 *
 * A stream walks its batch positions (epoch, batch) in order.  For each it
 * plans the samples (shuffle.c), takes references on the units they come
 * from, and once every unit is in memory, assembles the batch into its
 * arena on a worker thread.  Batches go out in order, while the client holds
 * fewer than `window` unreleased ones.  Ahead of planning, the stream pins
 * the units of the next window of batches (the shuffle says exactly which),
 * so loading runs a window ahead of consumption: clairvoyant prefetch.
 * The samples of the coming batches (plan_task_work) and the units of a pin
 * span (pin_task_work) are computed on workers: for a large shuffle window
 * they cost milliseconds, which the loop would otherwise spend while the
 * trainer waits for its next batch.
 *
 * Lifetime: a stream is freed when it is closed (by its client, its
 * connection or an error) and no task of its is in flight.
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
#include "serve/units.h"
#include "serve/server.h"
#include "util.h"

enum { PB_WAITING, PB_ASSEMBLING, PB_READY, PB_NOROOM };

typedef struct pbatch {
  struct pbatch *next;
  stream_t *s;
  uint64_t epoch, index, seq;
  int n;                    /* samples */
  shuffle_sample_t *samples;
  uint32_t *sample_slot;    /* per sample: its unit's position in units */
  unit_t **sample_unit;     /* per sample, filled in by the assembly */
  unit_t **units;           /* distinct, each holding one reference */
  uint32_t *unit_index;     /* their indices in the stream's dataset */
  int num_units;
  int units_ready;          /* units[0 .. units_ready) are READY (they stay) */
  int state;
  int error;
  char message[300];
  int64_t arena_off;
  uint64_t arena_len;
  /* When no gap held the batch whole: one region per column, each
   * released on its own (room_free); NULL for one region at arena_off. */
  int64_t *parts;
  int num_parts;
  layout_node_t *nodes;
  int num_nodes;
  uint64_t assemble_ns;
  uint64_t release_mark;    /* s->releases when its assembly started */
  work_t work;
} pbatch_t;

typedef struct sent {
  uint64_t seq;
  int64_t arena_off;
  int64_t *parts; /* the batch's, moved here when it was sent */
  int num_parts;
  uint64_t rows, bytes;
} sent_t;

typedef struct pin {
  unit_t *u;
  uint32_t index;
} pin_t;

/* The samples of batches [first, first + n) of an epoch, planned on a
 * worker. */
typedef struct plan_chunk {
  work_t work;
  stream_t *s;
  uint64_t epoch, first;
  uint64_t n;
  shuffle_sample_t *samples; /* n * batch_size */
  /* Per batch, its distinct units in order of first use (unit_start[k] ..
   * unit_start[k + 1] of units), and per sample the position of its unit
   * there: found on the worker, so the loop only takes the references. */
  uint32_t *units;
  size_t *unit_start;        /* n + 1 */
  uint32_t *slots;           /* n * batch_size */
  int rc;
} plan_chunk_t;

/* The units of batches [first, last) of an epoch, found on a worker. */
typedef struct pin_task {
  work_t work;
  stream_t *s;
  uint64_t epoch, first, last;
  uint32_t *idx;
  int n;
  int next;                 /* idx[next ..] are not pinned yet */
} pin_task_t;

/* The row orders of the windows that batches [first, last) of an epoch
 * start and end in, made on a worker in the background. */
typedef struct order_task {
  work_t work;
  stream_t *s;
  work_pool_t *pool;
  uint64_t epoch, first, last;
  int windows; /* row orders made: of the span's first window, then last */
  int urgent;  /* queued as foreground work: the planner is close */
  int more;    /* stopped: queue it again */
} order_task_t;

struct stream {
  server_t *srv;
  conn_t *conn;
  uint64_t resv_key;   /* its window's reservation (window_reserve), or 0 */
  uint32_t id;
  uint32_t request_id;
  stream_t *next_in_conn;
  int closed;
  int end_sent;
  int tasks;                /* worker tasks in flight */
  int pumping;              /* stream_pump frames on the stack */
  uint64_t owner;           /* its tasks' work owner (work.h): its dataset's
                               key, which the ranks of a job share, so they
                               share the workers as one; held
                               (work_pool_hold_owner) while nonzero, from
                               the open's reply to stream_destroy */

  unit_waiter_t waiter;     /* told when a unit it waits for has loaded
                               (units_wait); data is the stream */
  dataset_t *ds;
  shuffle_plan_t *plan;
  shuffle_params_t params;
  uint32_t part_first, part_last; /* the partitions of its rank's node */
  char note[384];           /* told the client at open; "" when nothing */
  uint64_t epochs;          /* 0 = unbounded */
  uint64_t batches_per_epoch;
  int num_nodes;            /* arrays per batch */

  /* Planning: the samples of the coming batches are computed on a worker,
   * a chunk at a time (see plan_task_work), into cur and next. */
  shuffle_epoch_t *plan_ep; /* cursor of the planning tasks */
  uint64_t plan_ep_epoch;
  uint64_t plan_epoch, plan_batch;
  plan_chunk_t *cur, *next; /* next: computed, or being computed (plan_busy) */
  int plan_busy;
  int exhausted;            /* every batch planned */

  shuffle_epoch_t *pin_ep;  /* cursor of the pin tasks */
  uint64_t pin_ep_epoch;
  int pin_busy;             /* a pin task is in flight */
  int client_closed;        /* CUDA: see `cuda` below */
  shuffle_epoch_t *order_ep; /* cursor of the order tasks */
  uint64_t order_ep_epoch;
  order_task_t *order_task; /* the order task in flight, if any */
  int order_wanted;         /* the span below wants its orders made */
  uint64_t order_epoch, order_first, order_last;
  uint64_t pin_epoch, pin_batch;
  uint64_t pin_span;        /* batches pinned ahead */
  pin_t *pins;              /* the span being pinned now */
  int num_pins, cap_pins;
  pin_t *old_pins;          /* the span before it, kept until the next one */
  int num_old_pins, cap_old_pins;
  unit_t **pinned;          /* by unit index: a pinned unit, or NULL */
  uint32_t *plan_slot;      /* by unit index: scratch of the planning task
                               (one at a time per stream) */
  uint64_t *counted;        /* by unit index: epoch + 1 its stage times were
                               added to this stream's stats */

  arena_t *arena;
  uint32_t window, prefetch;
  pbatch_t *q_head, *q_tail;
  int q_len;
  uint64_t next_seq;
  sent_t *sent;
  int num_sent, cap_sent;
  uint64_t releases;        /* Release frames processed (see PB_NOROOM) */
  /* Set by the pump while the client holds its whole window: nothing more
   * can go out until it releases a batch, which wakes the loop, so a batch
   * assembled meanwhile does not (work_queue_quiet). */
  atomic_int window_full;

  /* The descriptor ring (client/ring.h), when the client asked for one.
   * The counts are the daemon's own: what the client writes in the ring is
   * read, checked and never trusted. */
  ring_header_t *ring;
  ring_layout_t ring_layout; /* where its entries lie (never read back) */
  uint64_t ring_size;
  uint64_t ring_published;  /* descriptors written */
  uint64_t ring_drained;    /* release entries read */
  uint64_t ring_wake_at;    /* what the ring's wake_at says */
  uint64_t ring_client_woken; /* the wake_client_at a Wake answered */
  int ring_fd;              /* (beside `remote`, which fills its padding) */

  /* Read-ahead of remote row groups into the cache, beyond the pins: a
   * cursor of its own over the coming batches, and the units of the last
   * stretch it listed that it has not offered yet. */
  int remote;               /* the dataset has remote files */
  uint64_t *rg_prio;        /* its row groups' cache priorities, ascending */
  uint64_t *rg_prio_bytes;  /* bytes of the row groups up to each, summed */
  uint32_t num_rg_prio;
  shuffle_epoch_t *ra_ep;
  uint64_t ra_epoch, ra_batch;
  uint32_t *ra_units;
  int ra_n, ra_i;

  stats_stream_t st;
  char *label;              /* larder admin: its sources, for stats */
  char *job;                /* the trainer's job name (metrics_job_valid) */
  uint64_t requested_ns;    /* the OpenStream's arrival */
  uint64_t opened_ns;
  int validating;           /* revalidation requests outstanding */
  int metrics_group;        /* its (job, dataset) in the metrics */
  uint64_t validated_ns;    /* last revalidation */
  char *stale_msg;          /* a remote object changed: the error the stream
                               ends with once the epoch before is sent */
  uint8_t *stale;           /* by file: changed (cached data to drop) */
  /* CUDA streams (cuda.h): the device region mirroring the arena; every
   * batch's bytes are copied there before it is published.  cuda_owner:
   * the connection that may still map it, set when the daemon ended the
   * stream on a live connection (the region is then parked, not freed);
   * client_closed: the client's CloseStream closed it (it unmapped). */
  cuda_region_t *cuda;
  uint64_t cuda_owner;
};

uint32_t stream_id(const stream_t *s) { return s->id; }

const stats_stream_t *stream_stats(const stream_t *s) { return &s->st; }
stream_t *stream_next_in_conn(const stream_t *s) { return s->next_in_conn; }

/* larder admin: what the stream reads, for stats, clients and metrics. */
void stream_info(const stream_t *s, stream_info_t *out) {
  memset(out, 0, sizeof(*out));
  out->id = s->id;
  out->rank = s->params.rank;
  out->world_size = s->params.world_size;
  out->dataset = s->label ? s->label : "";
  if (s->ds) {
    out->num_files = s->ds->num_files;
    out->num_units = s->ds->num_units;
    out->total_rows = s->ds->total_rows;
  }
  out->batches_per_epoch = s->batches_per_epoch;
  out->epochs = s->epochs;
  out->arena_bytes = s->arena ? arena_size(s->arena) : 0;
  out->window = s->window;
  out->partitions = s->params.partitions > 1 ? s->params.partitions : 1;
  out->part_first = s->part_first;
  out->part_last = s->part_last;
  out->opened_ns = s->opened_ns;
  out->ds = s->ds;
  out->job = s->job ? s->job : "";
  out->metrics_group = s->metrics_group;
}

stream_t *stream_find(conn_t *c, uint32_t id) {
  for (stream_t *s = c->streams; s; s = s->next_in_conn)
    if (s->id == id) return s;
  return NULL;
}

static void stream_pump(stream_t *s);
static void stream_maybe_free(stream_t *s);
static void drop_orders(stream_t *s, order_task_t *t);

/* ------------------------------------------------------------------------ */

static uint64_t linear(const stream_t *s, uint64_t epoch, uint64_t batch) {
  return epoch * s->batches_per_epoch + batch;
}

/* Gives a batch's arena room back: the region at off, or its parts. */
static void room_free(stream_t *s, int64_t off, const int64_t *parts, int num_parts) {
  if (parts == NULL) {
    arena_release(s->arena, (uint64_t)off);
    return;
  }
  for (int i = 0; i < num_parts; i++) arena_release(s->arena, (uint64_t)parts[i]);
}

static void pbatch_free(stream_t *s, pbatch_t *b) {
  for (int i = 0; i < b->num_units; i++) {
    units_unwait(b->units[i], &s->waiter);
    units_release(s->srv, b->units[i]);
  }
  free(b->units);
  free(b->unit_index);
  free(b->sample_unit);
  free(b->sample_slot);
  free(b->samples);
  free(b->nodes);
  free(b->parts);
  free(b);
}

static void unpin(stream_t *s, pin_t *p) {
  if (s->pinned && s->pinned[p->index] == p->u) {
    /* Still mapped unless a newer pin of the same unit replaced it. */
    s->pinned[p->index] = NULL;
  }
  units_release(s->srv, p->u);
}

static void release_pins(stream_t *s) {
  for (int i = 0; i < s->num_pins; i++) unpin(s, &s->pins[i]);
  s->num_pins = 0;
  for (int i = 0; i < s->num_old_pins; i++) unpin(s, &s->old_pins[i]);
  s->num_old_pins = 0;
}

/* Moves the current pins to the old generation, releasing the old one: the
 * span the planner is in stays pinned while the next one loads. */
static void rotate_pins(stream_t *s) {
  for (int i = 0; i < s->num_old_pins; i++) unpin(s, &s->old_pins[i]);
  pin_t *p = s->old_pins;
  int cap = s->cap_old_pins;
  s->old_pins = s->pins;
  s->num_old_pins = s->num_pins;
  s->cap_old_pins = s->cap_pins;
  s->pins = p;
  s->cap_pins = cap;
  s->num_pins = 0;
}

static void plan_chunk_free(plan_chunk_t *c) {
  if (c == NULL) return;
  free(c->samples);
  free(c->units);
  free(c->unit_start);
  free(c->slots);
  free(c);
}

/*
 * Admission of shuffle windows.  A stream keeps the units of its window in
 * memory for as long as it draws on them (units.c never frees a referenced
 * unit), so the windows of all the streams open at once add up: without
 * admission, a client that opened 31 streams, each within memory_limit on
 * its own, and read none, took a daemon with memory_limit 256M to 3.4 GB.
 * Each distinct shuffle (dataset, columns, seed, window) reserves its
 * window's estimated bytes, once for all the streams that share it (the
 * ranks of a job draw the same units), and a stream whose window would
 * take the reservations past memory_limit is refused with LARDER_ELIMIT,
 * not cut: a cut window would change the order.  The first window is
 * always admitted (the open checks it alone against memory_limit or
 * shuffle_window_bytes).  The estimate comes from the footers: a stream
 * pins one to two windows at a time (daemon/README.md, Memory), and
 * dictionary-encoded values can decode to more than the footers say, so
 * this bounds the daemon by configuration, within a small multiple of
 * memory_limit rather than exactly.  Tested by
 * daemon_stream_windows_admission.
 */
static uint64_t window_key(const stream_t *s) {
  uint64_t k[4] = {s->ds->key, s->params.seed, s->params.window_units,
                   (uint64_t)s->params.shuffle};
  /* Odd: 0 means no reservation. */
  return util_hash64(k, sizeof(k), 0x77696e64ull) | 1;
}

/* A window's decoded bytes as the footers tell, twice over when its units
 * build row blocks (layout.h), which take about as much again. */
static uint64_t window_estimate(const stream_t *s) {
  const dataset_t *ds = s->ds;
  uint64_t units = s->params.window_units < ds->num_units ? s->params.window_units
                                                          : ds->num_units;
  uint64_t avg = ds->num_units ? ds->est_bytes / ds->num_units : 0;
  return units * avg * (ds->rowplan ? 2 : 1);
}

/* Reserves s's window; returns 0, or LARDER_ELIMIT (with *held, the bytes
 * the others hold, and *need) or LARDER_ENOMEM. */
static int window_reserve(stream_t *s, uint64_t *held, uint64_t *need) {
  server_t *srv = s->srv;
  uint64_t key = window_key(s);
  *held = srv->resv_bytes;
  *need = 0;
  for (int i = 0; i < srv->num_resv; i++) {
    if (srv->resv[i].key != key) continue;
    srv->resv[i].refs++;
    s->resv_key = key;
    return 0;
  }
  uint64_t bytes = window_estimate(s);
  *need = bytes;
  /* The first window is always admitted (its own check is at open). */
  if (srv->num_resv > 0 && srv->resv_bytes + bytes > srv->cfg.memory_limit) return LARDER_ELIMIT;
  if (srv->num_resv == srv->cap_resv) {
    int cap_resv = srv->cap_resv ? srv->cap_resv * 2 : 16;
    struct window_resv *r = realloc(srv->resv, (size_t)cap_resv * sizeof(*r));
    if (r == NULL) return LARDER_ENOMEM;
    srv->resv = r;
    srv->cap_resv = cap_resv;
  }
  srv->resv[srv->num_resv++] = (struct window_resv){key, bytes, 1};
  srv->resv_bytes += bytes;
  s->resv_key = key;
  return 0;
}

static void window_unreserve(stream_t *s) {
  server_t *srv = s->srv;
  if (s->resv_key == 0) return;
  for (int i = 0; i < srv->num_resv; i++) {
    if (srv->resv[i].key != s->resv_key) continue;
    if (--srv->resv[i].refs == 0) {
      srv->resv_bytes -= srv->resv[i].bytes;
      srv->resv[i] = srv->resv[--srv->num_resv];
    }
    break;
  }
  s->resv_key = 0;
  if (srv->num_resv == 0) {
    free(srv->resv);
    srv->resv = NULL;
    srv->cap_resv = 0;
  }
}

static conn_t *find_conn(server_t *srv, uint64_t id);

static void stream_destroy(stream_t *s) {
  if (s->owner) work_pool_release_owner(s->srv->pool, s->owner);
  s->owner = 0;
  window_unreserve(s);
  while (s->q_head) {
    pbatch_t *b = s->q_head;
    s->q_head = b->next;
    pbatch_free(s, b);
  }
  release_pins(s);
  free(s->pins);
  free(s->old_pins);
  free(s->pinned);
  free(s->plan_slot);
  free(s->counted);
  for (int i = 0; i < s->num_sent; i++) free(s->sent[i].parts);
  free(s->sent);
  shuffle_epoch_close(s->plan_ep);
  shuffle_epoch_close(s->pin_ep);
  shuffle_epoch_close(s->order_ep);
  shuffle_epoch_close(s->ra_ep);
  plan_chunk_free(s->cur);
  plan_chunk_free(s->next);
  free(s->ra_units);
  free(s->rg_prio);
  free(s->rg_prio_bytes);
  shuffle_plan_free(s->plan);
  free(s->stale_msg);
  free(s->stale);
  if (s->ds && --s->ds->refs == 0) dataset_free(s->ds);
  /* The region unpins the arena: before the arena goes. */
  if (s->cuda) {
    conn_t *owner = s->cuda_owner ? find_conn(s->srv, s->cuda_owner) : NULL;
    cuda_region_t *r = s->cuda;
    s->cuda = NULL;
    if (owner && !owner->closing && !owner->draining) {
      /* Parked: the host side goes with the arena, the device side waits
       * for the client (cuda.h). */
      cuda_region_detach_host(r);
      cuda_park(s->cuda_owner, s->id, r);
    } else {
      cuda_region_close(r);
    }
  }
  arena_destroy(s->arena);
  if (s->ring) munmap(s->ring, s->ring_size);
  if (s->ring_fd >= 0) close(s->ring_fd);
  STATS_SUB(&s->srv->stats, streams, 1);
  free(s->label);
  free(s->job);
  free(s);
}

static void stream_maybe_free(stream_t *s) {
  if (s->closed && s->tasks == 0 && s->pumping == 0) stream_destroy(s);
}

static void unlink_from_conn(stream_t *s) {
  if (s->conn == NULL) return;
  stream_t **pp = &s->conn->streams;
  while (*pp && *pp != s) pp = &(*pp)->next_in_conn;
  if (*pp) *pp = s->next_in_conn;
  s->conn->num_streams--;
  /* larder per-client limits: its arena no longer counts for the client. */
  if (s->arena) s->conn->arena_bytes -= arena_size(s->arena);
  if (s->ring) s->conn->arena_bytes -= s->ring_size;
  s->conn = NULL;
}

void stream_close(stream_t *s) {
  if (s->closed) return;
  s->closed = 1;
  /* CUDA: ended by the daemon while its trainer is connected, which may
   * still map the region (cuda.h). */
  if (s->cuda && s->conn && !s->client_closed && !s->conn->closing && !s->conn->draining)
    s->cuda_owner = s->conn->id;
  /* Its tasks' ends free it now: each wakes the loop again. */
  atomic_store_explicit(&s->window_full, 0, memory_order_relaxed);
  unlink_from_conn(s);
  metrics_group_stream_closed(s->metrics_group, &s->st);
  /* Queued batches drop their units now; one being assembled keeps its
   * units until its task returns. */
  pbatch_t **pp = &s->q_head;
  while (*pp) {
    pbatch_t *b = *pp;
    if (b->state == PB_ASSEMBLING) {
      pp = &b->next;
      continue;
    }
    *pp = b->next;
    s->q_len--;
    pbatch_free(s, b);
  }
  s->q_tail = NULL;
  for (pbatch_t *b = s->q_head; b; b = b->next) s->q_tail = b;
  release_pins(s);
  /* Its window's room goes back now, with its pins, not when its last
   * task ends: an open that follows the close at once (the workers take
   * other owners' tasks in turn, work.h) must find it free. */
  window_unreserve(s);
  /* A queued order task is background work, which may wait long while
   * other streams keep the workers busy: the stream takes it back rather
   * than stay allocated (its arena with it) until a worker is free. */
  if (s->order_task && work_cancel(s->srv->pool, &s->order_task->work) == 0)
    drop_orders(s, s->order_task);
  stream_maybe_free(s);
}

void stream_fail(stream_t *s, int code, const char *fmt, ...) {
  if (s->closed) return;
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  STATS_ADD(&s->srv->stats, stream_errors, 1);
  log_notice("stream %u of client pid %d failed: %s", s->id, s->conn ? (int)s->conn->pid : -1, msg);
  if (s->conn) conn_send_error(s->conn, code, s->id, 0, "%s", msg);
  stream_close(s);
}

void stream_client_close(conn_t *c, const Larder__CloseStream *cs) {
  stream_t *s = stream_find(c, cs->stream_id);
  if (s) {
    /* A client that still maps the CUDA region (it holds batches) frees
     * it with a second CloseStream: the region is parked till then. */
    s->client_closed = !cs->device_memory_held;
    stream_close(s);
  } else if (!cs->device_memory_held) {
    cuda_unpark(c->id, cs->stream_id); /* a CUDA region kept for a stream ended before */
  }
}

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
    if (done > 0 && (t->urgent ? done >= ORDER_URGENT_SWAPS
                               : work_pool_foreground_waiting(t->pool))) {
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
  uint64_t plan_pos = linear(s, s->plan_epoch, s->plan_batch);
  uint64_t span_pos = linear(s, t->epoch, t->first);
  t->urgent = span_pos < plan_pos + s->pin_span / 4;
  return t->urgent ? work_queue(s->srv->pool, &t->work, order_task_work, order_task_done)
                   : work_queue_background(s->srv->pool, &t->work, order_task_work,
                                           order_task_done);
}

/* Ends order task t without running it again (not queued, not running). */
static void drop_orders(stream_t *s, order_task_t *t) {
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
static void promote_orders(stream_t *s) {
  order_task_t *t = s->order_task;
  if (t == NULL || t->urgent) return;
  uint64_t plan_pos = linear(s, s->plan_epoch, s->plan_batch);
  if (linear(s, t->epoch, t->first) >= plan_pos + s->pin_span / 4) return;
  if (work_cancel(s->srv->pool, &t->work) != 0) return;
  if (queue_orders(s, t) != 0) drop_orders(s, t);
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
  if (queue_orders(s, t) != 0) drop_orders(s, t);
}

static void order_task_done(work_t *w, int status) {
  order_task_t *t = w->data;
  stream_t *s = t->s;
  if (t->more && status == 0 && !s->closed && !s->srv->shutting_down && queue_orders(s, t) == 0)
    return; /* the same task, behind the work that stopped it */
  drop_orders(s, t);
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
    rotate_pins(s);
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

static void advance_pins(stream_t *s) {
  if (s->pin_busy) return;
  uint64_t plan_pos = linear(s, s->plan_epoch, s->plan_batch);
  uint64_t pin_pos = linear(s, s->pin_epoch, s->pin_batch);
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
    if (n > 0 && i > 0 && u->file == u[-1].file && u->rg == u[-1].rg) v[n - 1].bytes += u->est_bytes;
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
static uint64_t resident_priority(const stream_t *s) {
  uint64_t cap = s->srv->cfg.cache_capacity;
  if (s->num_rg_prio == 0 || s->rg_prio_bytes[s->num_rg_prio - 1] <= cap) return UINT64_MAX;
  uint32_t lo = 0, hi = s->num_rg_prio; /* first index whose running sum exceeds cap */
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (s->rg_prio_bytes[mid] <= cap) lo = mid + 1;
    else hi = mid;
  }
  return lo == 0 ? 0 : s->rg_prio[lo - 1];
}

static void advance_read_ahead(stream_t *s) {
  if (!s->remote || s->closed || s->srv->shutting_down || s->batches_per_epoch == 0) return;
  /* A changed object ends the stream at this epoch's end (advance_pins). */
  if (s->stale_msg) return;
  uint64_t plan_pos = linear(s, s->plan_epoch, s->plan_batch);
  /* Up to one epoch past planning; with revalidation on, not past this
   * epoch, whose end checks the objects before anything more is read. */
  uint64_t horizon = s->srv->cfg.revalidate > 0 ? linear(s, s->plan_epoch + 1, 0)
                                                 : plan_pos + s->batches_per_epoch;
  uint64_t pin_pos = linear(s, s->pin_epoch, s->pin_batch);
  if (linear(s, s->ra_epoch, s->ra_batch) < pin_pos) {
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
  for (;;) {
    while (s->ra_i < s->ra_n) {
      uint32_t k = s->ra_units[s->ra_i];
      if (units_read_ahead(s->srv, s->ds, k, s->ds->units[k].priority <= resident) < 0) return;
      s->ra_i++;
    }
    if (s->epochs && s->ra_epoch >= s->epochs) return;
    if (linear(s, s->ra_epoch, s->ra_batch) >= horizon) return;
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
      advance_read_ahead(s);
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
  int changed = res->status == 0 &&
                !remote_same_version(f->size, f->etag, f->last_modified, res->object_size,
                                     res->etag, res->last_modified);
  /* A failed check does not count as "not changed": an object deleted
   * since the stream opened (404) has changed, and must not go on being
   * served from the cache.  Other failures (access, the network) cannot
   * tell, and are logged.  Tested by remote_revalidate. */
  int gone = res->status == LARDER_ENOENT;
  if (res->status != 0 && !gone && !s->closed) {
    char where[400];
    fetch_redact(f->path, where, sizeof(where));
    log_warn("stream %u: cannot check whether %s changed (%s); serving it as it was", s->id,
             where, res->message ? res->message : larder_strerror(res->status));
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
static void fail_stale(stream_t *s) {
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

/* Samples planned ahead of a stream at most (or one batch, if larger):
 * each costs about 28 bytes until its batch is sent.  Without this cap, a
 * stream of batches of 2^24 rows planned 32 of them at once, and held
 * prefetch_batches more: gigabytes per stream.  A chunk takes a quarter.
 * Tested by daemon_stream_options. */
#define PLAN_MAX_SAMPLES (1u << 20)

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
    plan_chunk_free(c);
    stream_maybe_free(s);
    return;
  }
  if (c->rc) {
    s->next = NULL;
    int rc = c->rc;
    plan_chunk_free(c);
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
    plan_chunk_free(c);
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
    plan_chunk_free(c);
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
static int plan_one(stream_t *s) {
  if (!chunk_has(s->cur, s->plan_epoch, s->plan_batch)) {
    if (!s->plan_busy && chunk_has(s->next, s->plan_epoch, s->plan_batch)) {
      plan_chunk_free(s->cur);
      s->cur = s->next;
      s->next = NULL;
    } else {
      if (!s->plan_busy && s->next) {
        /* Not the chunk needed (cannot happen in order; be safe). */
        plan_chunk_free(s->next);
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
  pbatch_free(s, b);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Assembly, on a worker thread                                              */

/* Samples a row-block prefetch runs ahead, and the most bytes of a row it
 * fetches (the rest of a long row streams in behind them). */
#define ROW_AHEAD 20
#define ROW_PREFETCH_MAX 1024

static void assemble_work(work_t *w) {
  pbatch_t *b = w->data;
  stream_t *s = b->s;
  uint64_t t0 = util_now_ns();
  const pq_field_t *schema = s->ds->schema;
  int nc = schema->num_children;
  layout_pick_t *picks = malloc((size_t)b->n * sizeof(layout_pick_t));
  int64_t *sizes = malloc((size_t)(nc ? nc : 1) * sizeof(int64_t));
  for (int i = 0; i < b->n; i++) b->sample_unit[i] = b->units[b->sample_slot[i]];
  layout_scratch_t *scratch = NULL;
  uint8_t *tmp = NULL;
  int64_t *nulls_by_bit = NULL;
  uint8_t *from_rows = NULL;
  if (picks == NULL || sizes == NULL) {
    b->error = LARDER_ENOMEM;
    goto out;
  }
  /* The packed columns come from the units' row blocks: copy each sample's
   * fixed part once, its inline values following it in the same lines,
   * then split it into columns from memory that is already in cache. */
  const layout_rowplan_t *rp = s->ds->rowplan;
  from_rows = calloc((size_t)(nc ? nc : 1), 1);
  if (from_rows == NULL) {
    b->error = LARDER_ENOMEM;
    goto out;
  }
  if (rp) {
    tmp = malloc((size_t)b->n * rp->stride + 1);
    nulls_by_bit = malloc((size_t)(rp->null_bytes ? rp->null_bytes : 1) * 8 * sizeof(int64_t));
    if (tmp == NULL || nulls_by_bit == NULL) {
      b->error = LARDER_ENOMEM;
      goto out;
    }
    /* A LIST slot comes from the rows only when every unit inlined it. */
    uint64_t lists = ~0ull;
    for (int i = 0; i < b->num_units; i++) lists &= b->units[i]->rowblock.inline_lists;
    for (int c = 0; c < nc; c++) {
      int p = rp->slot_of[c];
      from_rows[c] = p >= 0 && (rp->packed[p].kind != LAYOUT_SLOT_LIST || ((lists >> p) & 1));
    }
    size_t stride = rp->stride;
    for (int i = 0; i < b->n; i++) {
      /* Two steps ahead: a row's start, then (once that is in cache) the
       * row's lines, so each sample's misses overlap those of the next
       * ROW_AHEAD samples. */
      if (i + 2 * ROW_AHEAD < b->n) {
        const unit_t *u = b->sample_unit[i + 2 * ROW_AHEAD];
        if (u->rowblock.start) __builtin_prefetch(u->rowblock.start + b->samples[i + 2 * ROW_AHEAD].row);
      }
      if (i + ROW_AHEAD < b->n) {
        size_t len;
        const uint8_t *ahead = layout_rows_row(&b->sample_unit[i + ROW_AHEAD]->rowblock,
                                               b->samples[i + ROW_AHEAD].row, &len);
        /* The fixed part, which this loop copies, into the core's first
         * cache; the inline values, which the split reads after the whole
         * batch is gathered, only as far as the second.  A core tracks few
         * misses into its first cache at once, and lines that wait there
         * for the split held up the gather itself (bench-serve: warm
         * delivery +15% against prefetching every line into the first
         * cache, 11 of 12 alternating rounds). */
        size_t lim = len < ROW_PREFETCH_MAX ? len : ROW_PREFETCH_MAX;
        size_t fixed = stride < lim ? stride : lim;
        for (size_t at = 0; at < fixed; at += 64) __builtin_prefetch(ahead + at);
        __builtin_prefetch(ahead + fixed - 1);
        for (size_t at = fixed; at < lim; at += 64) __builtin_prefetch(ahead + at, 0, 1);
        if (lim > fixed) __builtin_prefetch(ahead + lim - 1, 0, 1);
      }
      size_t len;
      const uint8_t *row =
          layout_rows_row(&b->sample_unit[i]->rowblock, b->samples[i].row, &len);
      memcpy(tmp + (size_t)i * stride, row, stride);
    }
    layout_rows_count_nulls(rp, tmp, b->n, nulls_by_bit);
  }
  uint64_t total = 0;
  for (int c = 0; c < nc; c++) {
    if (from_rows[c]) {
      sizes[c] =
          layout_rows_column(rp, rp->slot_of[c], tmp, b->n, nulls_by_bit, 1, NULL, NULL, NULL);
      if (sizes[c] < 0) {
        b->error = (int)sizes[c];
        snprintf(b->message, sizeof(b->message), "column '%s': %s", schema->children[c].name,
                 "more than 2 GiB of values in one batch");
        goto out;
      }
      total += (uint64_t)sizes[c];
      continue;
    }
    for (int i = 0; i < b->n; i++) {
      picks[i].view = &b->sample_unit[i]->views[c];
      picks[i].row = b->samples[i].row;
    }
    sizes[c] = layout_gather_size(&schema->children[c], picks, b->n, &scratch);
    if (sizes[c] < 0) {
      b->error = (int)sizes[c];
      snprintf(b->message, sizeof(b->message), "column '%s': %s", schema->children[c].name,
               sizes[c] == LARDER_ELIMIT ? "more than 2 GiB of values in one batch"
                                         : larder_strerror((int)sizes[c]));
      goto out;
    }
    total += (uint64_t)sizes[c];
  }
  int64_t off = arena_alloc(s->arena, total);
  free(b->parts);
  b->parts = NULL;
  b->num_parts = 0;
  if (off == LARDER_EAGAIN && nc > 1) {
    /* With a small arena, the batches a trainer holds can leave free room
     * only in gaps each too small for the next batch, and the stream would
     * wait for good for a release the trainer, holding less than its
     * window, need not make.  A batch's buffers need not be contiguous:
     * place it column by column.  Tested by daemon_arena_fragments. */
    int64_t *parts = malloc((size_t)nc * sizeof(int64_t));
    uint64_t *lens = malloc((size_t)nc * sizeof(uint64_t));
    if (parts == NULL || lens == NULL) {
      free(parts);
      free(lens);
      b->error = LARDER_ENOMEM;
      goto out;
    }
    for (int c = 0; c < nc; c++) lens[c] = (uint64_t)sizes[c];
    int prc = arena_alloc_parts(s->arena, lens, (size_t)nc, parts);
    free(lens);
    if (prc == 0) {
      b->parts = parts;
      b->num_parts = nc;
      off = parts[0];
      for (int c = 1; c < nc; c++)
        if (parts[c] < off) off = parts[c];
    } else {
      free(parts);
    }
  }
  if (off == LARDER_EAGAIN) {
    b->error = LARDER_EAGAIN;
    goto out;
  }
  if (off < 0) {
    b->error = (int)off;
    snprintf(b->message, sizeof(b->message),
             "a batch of %llu bytes does not fit the stream's %llu-byte arena; open the "
             "stream with a larger arena_bytes or a smaller batch_size",
             (unsigned long long)total, (unsigned long long)arena_size(s->arena));
    goto out;
  }
  b->arena_off = off;
  b->arena_len = total;
  uint8_t *base = arena_base(s->arena);
  uint8_t *dst = base + off;
  int node = 0;
  for (int c = 0; c < nc; c++) {
    if (b->parts) dst = base + b->parts[c];
    if (from_rows[c]) {
      layout_rows_column(rp, rp->slot_of[c], tmp, b->n, nulls_by_bit, 0, base, dst,
                         b->nodes + node);
      dst += sizes[c];
      node += layout_rows_num_nodes(rp, rp->slot_of[c]);
      continue;
    }
    for (int i = 0; i < b->n; i++) {
      picks[i].view = &b->sample_unit[i]->views[c];
      picks[i].row = b->samples[i].row;
    }
    int rc = layout_gather(&schema->children[c], picks, b->n, &scratch, base, dst,
                           b->nodes + node);
    if (rc) {
      b->error = rc;
      snprintf(b->message, sizeof(b->message), "column '%s': %s", schema->children[c].name,
               larder_strerror(rc));
      room_free(s, off, b->parts, b->num_parts);
      free(b->parts);
      b->parts = NULL;
      goto out;
    }
    dst += sizes[c];
    node += layout_num_nodes(&schema->children[c]);
  }
  if (s->cuda) {
    /* CUDA: the batch's bytes to the same offsets of the device region,
     * complete before the loop publishes the batch (cuda.h). */
    int rc = 0;
    if (b->parts) {
      for (int c = 0; c < nc && rc == 0; c++)
        rc = cuda_region_copy(s->cuda, (uint64_t)b->parts[c], (uint64_t)sizes[c], b->message,
                              sizeof(b->message));
    } else {
      rc = cuda_region_copy(s->cuda, (uint64_t)off, total, b->message, sizeof(b->message));
    }
    if (rc) {
      b->error = rc;
      room_free(s, off, b->parts, b->num_parts);
      free(b->parts);
      b->parts = NULL;
      goto out;
    }
  }
out:
  layout_scratch_free(scratch);
  free(from_rows);
  free(tmp);
  free(nulls_by_bit);
  free(picks);
  free(sizes);
  b->assemble_ns = util_now_ns() - t0;
}

static void assemble_done(work_t *w, int status) {
  pbatch_t *b = w->data;
  stream_t *s = b->s;
  s->tasks--;
  if (status == UV_ECANCELED && b->error == 0) b->error = LARDER_ESHUTDOWN;
  STATS_ADD(&s->srv->stats, assemble_ns, b->assemble_ns);
  STATS_ADD(&s->st, assemble_ns, b->assemble_ns);
  if (s->closed) {
    if (b->error == 0) room_free(s, b->arena_off, b->parts, b->num_parts);
    pbatch_t **pp = &s->q_head;
    while (*pp && *pp != b) pp = &(*pp)->next;
    if (*pp) *pp = b->next;
    pbatch_free(s, b);
    stream_maybe_free(s);
    return;
  }
  if (b->error == LARDER_EAGAIN) {
    /* The arena is full of unreleased batches: retry after a release (at
     * once if one came while this assembly ran), not right away: a stream
     * whose client holds its arena full would otherwise keep a worker
     * spinning through failed assemblies until the client released
     * something.  Tested by daemon_robust_stalled_client. */
    b->error = 0;
    b->state = s->releases != b->release_mark ? PB_WAITING : PB_NOROOM;
    stream_pump(s);
    return;
  }
  if (b->error) {
    stream_fail(s, b->error, "%s", b->message[0] ? b->message : larder_strerror(b->error));
    return;
  }
  b->state = PB_READY;
  /* The batch keeps its units until it is sent (pbatch_free): the pump may
   * have to assemble it again (see the end of stream_pump). */
  stream_pump(s);
}

/* Adds the stage times of the batch's units to the stream's stats, once per
 * unit and epoch: what this stream's data cost to fetch, decode or read. */
static void count_stages(stream_t *s, const pbatch_t *b) {
  for (int i = 0; i < b->num_units; i++) {
    const unit_t *u = b->units[i];
    uint32_t idx = b->unit_index[i];
    if (idx >= s->ds->num_units || s->counted[idx] == b->epoch + 1) continue;
    s->counted[idx] = b->epoch + 1;
    STATS_ADD(&s->st, fetch_ns, u->fetch_ns);
    STATS_ADD(&s->st, decode_ns, u->decode_ns);
    STATS_ADD(&s->st, cache_read_ns, u->cache_read_ns);
    uint64_t db = u->data_bytes ? u->data_bytes : u->bytes;
    if (u->from_cache) STATS_ADD(&s->st, cache_hit_bytes, db);
    else STATS_ADD(&s->st, cache_miss_bytes, db);
  }
}

static int start_assembly(stream_t *s, pbatch_t *b) {
  count_stages(s, b);
  if (b->nodes == NULL) {
    b->nodes = calloc((size_t)s->num_nodes, sizeof(layout_node_t));
    if (b->nodes == NULL) return LARDER_ENOMEM;
    b->num_nodes = s->num_nodes;
  }
  b->state = PB_ASSEMBLING;
  b->release_mark = s->releases;
  b->work.data = b;
  b->work.owner = s->owner;
  s->tasks++;
  if (work_queue_quiet(s->srv->pool, &b->work, assemble_work, assemble_done,
                       &s->window_full) != 0) {
    s->tasks--;
    b->state = PB_WAITING;
    return LARDER_ENOMEM;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Sending                                                                   */

/* Writes the layout of b's arrays (ARRAY_NUM_FIELDS values per array, as
 * proto/larder.proto orders them) to out.  Returns the batch's bytes. */
static uint64_t fill_layout(const pbatch_t *b, uint64_t *out) {
  uint64_t bytes = 0;
  for (int i = 0; i < b->num_nodes; i++) {
    const layout_node_t *nd = &b->nodes[i];
    uint64_t *l = out + (size_t)i * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS;
    l[LARDER__ARRAY_FIELD__ARRAY_LENGTH] = (uint64_t)nd->length;
    l[LARDER__ARRAY_FIELD__ARRAY_NULL_COUNT] = (uint64_t)nd->null_count;
    l[LARDER__ARRAY_FIELD__ARRAY_VALIDITY_OFFSET] = nd->validity_offset;
    l[LARDER__ARRAY_FIELD__ARRAY_VALIDITY_LENGTH] = nd->validity_length;
    l[LARDER__ARRAY_FIELD__ARRAY_OFFSETS_OFFSET] = nd->offsets_offset;
    l[LARDER__ARRAY_FIELD__ARRAY_OFFSETS_LENGTH] = nd->offsets_length;
    l[LARDER__ARRAY_FIELD__ARRAY_VALUES_OFFSET] = nd->values_offset;
    l[LARDER__ARRAY_FIELD__ARRAY_VALUES_LENGTH] = nd->values_length;
    bytes += nd->validity_length + nd->offsets_length + nd->values_length;
  }
  return bytes;
}

/* Writes b's descriptor into the ring.  The window guarantees that the
 * client has read the slot's previous descriptor (client/ring.h). */
static uint64_t publish_batch(stream_t *s, const pbatch_t *b) {
  ring_desc_t *d = ring_layout_desc(&s->ring_layout, s->ring_published);
  d->seq = b->seq;
  d->epoch = b->epoch;
  d->index = b->index;
  d->num_rows = (uint64_t)b->n;
  d->arena_offset = (uint64_t)b->arena_off;
  d->arena_length = b->arena_len;
  uint64_t bytes = fill_layout(b, d->layout);
  atomic_store_explicit(&s->ring->published, ++s->ring_published, memory_order_release);
  return bytes;
}

static int send_batch(stream_t *s, pbatch_t *b) {
  uint64_t bytes;
  if (s->num_sent == s->cap_sent) {
    int cap = s->cap_sent ? s->cap_sent * 2 : 16;
    sent_t *p = realloc(s->sent, (size_t)cap * sizeof(sent_t));
    if (p == NULL) return LARDER_ENOMEM;
    s->sent = p;
    s->cap_sent = cap;
  }
  if (s->ring) {
    bytes = publish_batch(s, b);
  } else {
    Larder__Batch msg = LARDER__BATCH__INIT;
    msg.stream_id = s->id;
    msg.seq = b->seq;
    msg.epoch = b->epoch;
    msg.index = b->index;
    msg.num_rows = (uint64_t)b->n;
    msg.arena_offset = (uint64_t)b->arena_off;
    msg.arena_length = b->arena_len;
    uint64_t *layout = malloc((size_t)b->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS *
                              sizeof(uint64_t));
    if (layout == NULL) return LARDER_ENOMEM;
    bytes = fill_layout(b, layout);
    msg.n_layout = (size_t)b->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS;
    msg.layout = layout;
    Larder__Frame f = LARDER__FRAME__INIT;
    f.msg_case = LARDER__FRAME__MSG_BATCH;
    f.batch = &msg;
    int rc = conn_send(s->conn, &f, -1);
    free(layout);
    if (rc) return rc;
  }
  s->sent[s->num_sent++] = (sent_t){b->seq, b->arena_off, b->parts, b->num_parts, (uint64_t)b->n, bytes};
  b->parts = NULL; /* the sent entry has them now */
  if (STATS_ADD(&s->st, batches, 1) == 1)
    metrics_observe_first_batch(s->metrics_group, util_now_ns() - s->requested_ns);
  STATS_ADD(&s->st, rows, b->n);
  STATS_ADD(&s->st, bytes, bytes);
  STATS_ADD(&s->srv->stats, batches, 1);
  STATS_ADD(&s->srv->stats, batch_rows, b->n);
  STATS_ADD(&s->srv->stats, batch_bytes, bytes);
  return 0;
}

static void send_end(stream_t *s) {
  Larder__EndOfStream eos = LARDER__END_OF_STREAM__INIT;
  eos.stream_id = s->id;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_END_OF_STREAM;
  f.end_of_stream = &eos;
  conn_send(s->conn, &f, -1);
  s->end_sent = 1;
}

/* ------------------------------------------------------------------------ */
/* Releases, and the descriptor ring                                         */

/* Frees the arena room of sent batch seq and records the stall figures
 * that came with its release.  Returns 0, or LARDER_EPROTO when the client
 * does not hold that batch (the caller fails the stream). */
static int release_one(stream_t *s, uint64_t seq, uint64_t wait_ns, uint64_t compute_ns) {
  for (int i = 0; i < s->num_sent; i++) {
    if (s->sent[i].seq != seq) continue;
    room_free(s, s->sent[i].arena_off, s->sent[i].parts, s->sent[i].num_parts);
    free(s->sent[i].parts);
    s->sent[i] = s->sent[--s->num_sent];
    STATS_ADD(&s->st, wait_ns, wait_ns);
    STATS_ADD(&s->st, compute_ns, compute_ns);
    metrics_observe_wait(s->metrics_group, wait_ns);
    server_trainer_report(s->srv, wait_ns, compute_ns);
    /* Batches that found the arena full can try again now. */
    s->releases++;
    for (pbatch_t *b = s->q_head; b; b = b->next)
      if (b->state == PB_NOROOM) b->state = PB_WAITING;
    return 0;
  }
  stream_fail(s, LARDER_EPROTO, "release of batch %llu, which the client does not hold",
              (unsigned long long)seq);
  return LARDER_EPROTO;
}

/* Reads the release entries the client wrote in the ring since the last
 * call.  Its count is untrusted: it may claim no more releases than batches
 * it holds, and every entry must name one of them.  Returns 0, or an error
 * after failing the stream. */
static int ring_drain(stream_t *s) {
  uint64_t released = atomic_load_explicit(&s->ring->released, memory_order_acquire);
  uint64_t n = released - s->ring_drained;
  if (n == 0) return 0;
  if (n > (uint64_t)s->num_sent) {
    stream_fail(s, LARDER_EPROTO,
                "the ring claims %llu releases, but the client holds %d batches",
                (unsigned long long)n, s->num_sent);
    return LARDER_EPROTO;
  }
  for (uint64_t k = 0; k < n; k++) {
    /* One read of each field: the client may be rewriting the entry. */
    const volatile ring_release_t *e = ring_layout_release(&s->ring_layout, s->ring_drained);
    uint64_t seq = e->seq, wait_ns = e->wait_ns, compute_ns = e->compute_ns;
    s->ring_drained++;
    int rc = release_one(s, seq, wait_ns, compute_ns);
    if (rc) return rc;
  }
  return 0;
}

/* After a pump (assembling: the stream's batches being assembled): wakes a
 * client asleep on the socket once the descriptors it asked for are
 * published, or sooner when some are and nothing more is on its way; and
 * asks to be woken when the stream can only go on once the client releases
 * batches.  Returns 1 when releases arrived meanwhile (the caller pumps
 * again). */
static int ring_settle(stream_t *s, int noroom, int assembling) {
  ring_header_t *h = s->ring;
  /* Pairs with the client's fence between setting wake_client_at and
   * looking at `published`: one of the two sees the other's write. */
  atomic_thread_fence(memory_order_seq_cst);
  /* Acquire: pairs with the client's release store of wake_client_at, so
   * `consumed` below is at least what the client wrote before it (on a
   * weakly ordered CPU a relaxed pair could show the new wake_client_at
   * with the old `consumed`, and answer a sleep early for a descriptor
   * the client has taken). */
  uint64_t wake_client_at = atomic_load_explicit(&h->wake_client_at, memory_order_acquire);
  if (wake_client_at && wake_client_at != s->ring_client_woken && s->conn) {
    /* Untrusted figures: a client that lies only delays its own wakeup. */
    uint64_t consumed = atomic_load_explicit(&h->consumed, memory_order_relaxed);
    int waiting_for_it = s->ring_published > consumed;
    int more_coming = assembling && s->num_sent < (int)s->window;
    if (s->ring_published >= wake_client_at || (waiting_for_it && !more_coming)) {
      s->ring_client_woken = wake_client_at;
      Larder__Wake wk = LARDER__WAKE__INIT;
      wk.stream_id = s->id;
      Larder__Frame f = LARDER__FRAME__INIT;
      f.msg_case = LARDER__FRAME__MSG_WAKE;
      f.wake = &wk;
      conn_send(s->conn, &f, -1);
      STATS_ADD(&s->srv->stats, ring_wakes_sent, 1);
    }
  }
  /* With the window full nothing more can go out until the client
   * releases, whatever the queue holds now: batches still being planned or
   * assembled, or none yet (the pump plans before it sends, so a pump that
   * sent the whole window leaves the queue empty until the next one). */
  int blocked = noroom || s->num_sent >= (int)s->window;
  uint64_t want = 0;
  if (blocked) {
    /* Half of what the client holds: it then makes one system call per
     * half window, and the batches that answer it go out together. */
    uint64_t half = (uint64_t)s->num_sent / 2;
    want = s->ring_drained + (half ? half : 1);
  }
  if (want != s->ring_wake_at) {
    s->ring_wake_at = want;
    atomic_store_explicit(&h->wake_at, want, memory_order_relaxed);
  }
  if (want == 0) return 0;
  /* Pairs with the client's fence between writing `released` and looking
   * at `wake_at`. */
  atomic_thread_fence(memory_order_seq_cst);
  uint64_t released = atomic_load_explicit(&h->released, memory_order_relaxed);
  return released != s->ring_drained;
}

void stream_wake(stream_t *s) {
  STATS_ADD(&s->srv->stats, ring_wakes_received, 1);
  stream_pump(s);
}

/* Rings larger than this are not offered: a stream of thousands of arrays
 * with a window of a thousand batches gets frames instead. */
#define RING_MAX_BYTES (16u << 20)

/* The bytes of s's descriptor ring for its window and arrays, in whole
 * pages, or 0 when it would exceed RING_MAX_BYTES (no ring is offered). */
static uint64_t ring_size_for(const stream_t *s) {
  uint32_t num_layout = (uint32_t)s->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS;
  uint64_t size = ring_bytes(s->window, num_layout);
  uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
  return size > RING_MAX_BYTES ? 0 : (size + page - 1) / page * page;
}

/* Creates s's descriptor ring of ring_size_for(s) bytes.  Returns 0 (with
 * no ring when that is 0) or a negative code. */
static int ring_create(stream_t *s, const char *name) {
  uint64_t size = ring_size_for(s);
  if (size == 0) return 0;
  char ring_name[96];
  snprintf(ring_name, sizeof(ring_name), "%s-ring", name);
  uint8_t *base;
  int rc = arena_memfd_create(&size, ring_name, &s->ring_fd, &base);
  if (rc) return rc;
  (void)fcntl(s->ring_fd, F_ADD_SEALS, F_SEAL_SEAL);
  s->ring = (ring_header_t *)(void *)base;
  s->ring_size = size;
  ring_init(s->ring, s->window, (uint32_t)s->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS);
  ring_layout_init(&s->ring_layout, s->ring);
  STATS_ADD(&s->srv->stats, ring_streams, 1);
  return 0;
}

/* ------------------------------------------------------------------------ */

static void pump_once(stream_t *s);

/* Runs the stream as far as it can go.  A send that fails closes the
 * connection, and with it the stream: it is freed once the pump returns,
 * not under it, since the pump goes on to read it after the send (as when
 * a connection's client vanishes as a batch goes out). */
static void stream_pump(stream_t *s) {
  s->pumping++;
  /* Loads the pump starts (planning, read-ahead) are this stream's work. */
  uint64_t outer = s->srv->acquiring_owner;
  s->srv->acquiring_owner = s->owner;
  pump_once(s);
  s->srv->acquiring_owner = outer;
  s->pumping--;
  atomic_store_explicit(&s->window_full, !s->closed && s->num_sent >= (int)s->window,
                        memory_order_relaxed);
  stream_maybe_free(s);
}

static void pump_once(stream_t *s) {
again:
  if (s->closed || s->srv->shutting_down) return;
  if (s->ring && ring_drain(s)) return;
  advance_pins(s);
  advance_read_ahead(s);
  while (!s->exhausted && s->validating == 0 && s->stale_msg == NULL &&
         s->q_len < (int)s->prefetch &&
         (s->q_len == 0 ||
          (uint64_t)(s->q_len + 1) * s->params.batch_size <= PLAN_MAX_SAMPLES)) {
    int rc = plan_one(s);
    if (rc == LARDER_EAGAIN) break;
    if (rc) {
      stream_fail(s, rc, "cannot plan the next batch: %s", larder_strerror(rc));
      return;
    }
  }
  /* Start assembling every planned batch whose units are all in memory.
   * Waiting on a unit that is still loading re-runs this pump when the load
   * ends. */
  promote_orders(s);
  int assembling = 0;
  pbatch_t *noroom = NULL;
  for (pbatch_t *b = s->q_head; b; b = b->next) {
    if (b->state == PB_ASSEMBLING) assembling++;
    /* A batch that found the arena full waits for a release, and no later
     * batch may take the room before it.  Tested by daemon_arena_small. */
    if (b->state == PB_NOROOM) {
      noroom = b;
      break;
    }
    if (b->state != PB_WAITING) continue;
    /* A READY unit stays READY while the batch holds it, so each pump
     * looks only at the units not seen ready yet (a batch draws on
     * hundreds of units, and the pump runs several times per batch).  The
     * batch waits for its first unit still loading, and the pump looks on
     * from there when that one is loaded.  Waiting for every loading unit
     * of each planned batch instead would have each unit's load wake the
     * pump to rescan them all; with a window of 60,000 small units (20,000
     * files of 300 rows) the loop thread spent 13 s on that, most of the
     * time to a trainer's first batch. */
    int ready = 1;
    for (int i = b->units_ready; i < b->num_units; i++) {
      unit_t *u = b->units[i];
      if (u->state == UNIT_FAILED) {
        stream_fail(s, u->error, "%s", u->message ? u->message : larder_strerror(u->error));
        return;
      }
      if (u->state == UNIT_LOADING) {
        ready = 0;
        if (units_wait(u, &s->waiter) != 0) {
          stream_fail(s, LARDER_ENOMEM, "out of memory");
          return;
        }
        break;
      }
      b->units_ready++;
    }
    /* Twice as many assemblies as there are workers: a worker that
     * finishes one finds the next queued instead of sleeping until the loop
     * has handled the first (measured: about 1.2 times the delivery rate
     * of one per worker on 2 cores).  More would only queue behind other
     * streams' work. */
    if (ready && assembling < 2 * s->srv->workers) {
      int rc = start_assembly(s, b);
      if (rc) {
        stream_fail(s, rc, "cannot start assembling a batch");
        return;
      }
      assembling++;
    }
  }
  while (s->q_head && s->q_head->state == PB_READY && s->num_sent < (int)s->window) {
    pbatch_t *b = s->q_head;
    int rc = send_batch(s, b);
    if (rc) {
      stream_fail(s, rc, "cannot send a batch");
      return;
    }
    s->q_head = b->next;
    if (s->q_head == NULL) s->q_tail = NULL;
    s->q_len--;
    pbatch_free(s, b);
    if (s->closed) return;
  }
  if (noroom != NULL) {
    /* Batches are assembled out of order, so later batches may fill the
     * arena before an earlier one gets its room.  They cannot be sent
     * before it, and the client, which may keep what it holds, need not
     * release anything: a deadlock.  Once no assembly is in flight, give
     * their room back and assemble them again after it.  Tested by
     * daemon_arena_small. */
    int busy = 0, later = 0;
    for (pbatch_t *b = s->q_head; b; b = b->next) busy |= b->state == PB_ASSEMBLING;
    for (pbatch_t *b = noroom->next; b; b = b->next) later |= b->state == PB_READY;
    if (!busy && later) {
      for (pbatch_t *b = noroom->next; b; b = b->next) {
        if (b->state != PB_READY) continue;
        room_free(s, b->arena_off, b->parts, b->num_parts);
        free(b->parts);
        b->parts = NULL;
        b->state = PB_WAITING;
      }
      noroom->state = PB_WAITING;
      goto again;
    }
  }
  if (s->ring && ring_settle(s, noroom != NULL, assembling)) goto again;
  if (s->stale_msg && s->validating == 0 && s->q_head == NULL) {
    fail_stale(s);
    return;
  }
  if (s->exhausted && s->q_head == NULL && !s->end_sent) send_end(s);
}

/* A unit the stream waits for is READY or FAILED (units_wait). */
static void on_unit_loaded(unit_waiter_t *w) { stream_pump(w->data); }

void stream_release(stream_t *s, const Larder__Release *rel) {
  if (release_one(s, rel->seq, rel->wait_ns, rel->compute_ns) == 0) stream_pump(s);
}

/* ------------------------------------------------------------------------ */
/* Opening                                                                   */

typedef struct open_req {
  work_t work;
  server_t *srv;
  conn_t *conn;      /* NULL once the connection went away */
  uint64_t conn_id;
  uint32_t request_id;
  char **sources;
  size_t num_sources;
  char **columns;
  size_t num_columns;
  Larder__OpenStream params;
  dataset_options_t dopts;
  dataset_t *ds;
  int rc;
  char err[1024];
  remote_object_t *remote;
  size_t num_remote;
  char **roots;      /* larder ACL: local_roots, split (NULL: anywhere) */
  acl_peer_t peer;   /* the client, whose credentials open local files */
  uint64_t window_bytes; /* cfg.shuffle_window_bytes when it was asked */
  int row_group_blocks;  /* cfg.shuffle_row_groups, likewise */
  uint32_t partitions;   /* cfg.partitions, likewise */
  shuffle_plan_t *plan;  /* made by open_work; NULL: open_done makes it */
  char *job;         /* the trainer's job name, checked */
  uint64_t requested_ns;
} open_req_t;

/* The stream's shuffle parameters, from its request and its dataset. */
static void open_shuffle_params(const open_req_t *o, const dataset_t *ds, shuffle_params_t *sp) {
  const Larder__OpenStream *p = &o->params;
  memset(sp, 0, sizeof(*sp));
  sp->seed = p->seed;
  sp->shuffle = p->shuffle;
  sp->window_units = p->shuffle_window ? p->shuffle_window
                                       : dataset_window_units(ds, o->window_bytes);
  sp->batch_size = p->batch_size;
  sp->world_size = p->world_size ? p->world_size : 1;
  sp->rank = p->rank;
  sp->drop_last = p->drop_last;
  sp->partitions = p->partitions ? p->partitions : o->partitions;
  if (sp->partitions == 0) sp->partitions = 1;
  sp->local_world_size = p->local_world_size && p->local_world_size < sp->world_size
                             ? p->local_world_size
                             : sp->world_size;
}

/* The dataset, and its shuffle plan: both cost time linear in the units
 * (a million for a file of a million small row groups, a fifth of a second
 * for the plan), which the loop must not spend.  A plan refused here (bad
 * settings, no memory) is made again by open_done, which reports why. */
static void open_work(work_t *w) {
  open_req_t *o = w->data;
  o->rc = dataset_open((const char *const *)o->sources, o->num_sources,
                       (const char *const *)o->columns, o->num_columns, &o->dopts, &o->ds, o->err,
                       sizeof(o->err));
  if (o->rc != 0) return;
  dataset_register_objects(o->srv->store, o->ds); /* larder admin: names for ls, evict */
  shuffle_params_t sp;
  open_shuffle_params(o, o->ds, &sp);
  if (dataset_shuffle_plan(o->ds, &sp, o->row_group_blocks, &o->plan) != 0) o->plan = NULL;
}

static conn_t *find_conn(server_t *srv, uint64_t id);

static void free_open_req(open_req_t *o) {
  /* larder per-client limits: the open is no longer pending. */
  conn_t *c = find_conn(o->srv, o->conn_id);
  if (c && c->pending_requests > 0) c->pending_requests--;
  free(o->roots);
  acl_peer_clear(&o->peer);
  shuffle_plan_free(o->plan);
  remote_objects_free(o->remote, o->num_remote);
  for (size_t i = 0; i < o->num_sources; i++) free(o->sources[i]);
  for (size_t i = 0; i < o->num_columns; i++) free(o->columns[i]);
  free(o->sources);
  free(o->columns);
  free(o->job);
  free(o);
}

/* Refuses an open once its stream is made: the client gets the error, and
 * the stream and the request go. */
/* The partitions of s's node (shuffle_node_partitions), and the note that
 * tells a job whose node count does not divide them that nodes share. */
static void stream_set_partitions(stream_t *s) {
  const shuffle_params_t *p = &s->params;
  uint32_t l = p->local_world_size ? p->local_world_size : p->world_size;
  uint32_t nodes = (p->world_size + l - 1) / l, node = p->rank / l;
  s->note[0] = '\0';
  if (p->partitions <= 1) {
    s->part_first = 0;
    s->part_last = 1;
    return;
  }
  shuffle_node_partitions(p->partitions, nodes, node, &s->part_first, &s->part_last);
  if (p->partitions % nodes != 0)
    snprintf(s->note, sizeof(s->note),
             "%u nodes (%u ranks, %u a node) do not divide %u partitions: node %u reads "
             "partitions %u to %u, which it shares with its neighbours; with a node count "
             "that divides the partitions each node reads its own",
             nodes, p->world_size, l, p->partitions, node, s->part_first, s->part_last - 1);
}

static void refuse_open(conn_t *c, stream_t *s, open_req_t *o, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void refuse_open(conn_t *c, stream_t *s, open_req_t *o, int code, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  conn_send_error(c, code, 0, o->request_id, "%s", msg);
  s->closed = 1;
  stream_destroy(s);
  free_open_req(o);
}

static Larder__Field *field_to_proto(const pq_field_t *f) {
  Larder__Field *p = calloc(1, sizeof(*p));
  if (p == NULL) return NULL;
  larder__field__init(p);
  p->name = (char *)f->name;
  p->type = (uint32_t)f->type;
  p->nullable = f->nullable;
  p->byte_width = f->byte_width;
  p->precision = f->precision;
  p->scale = f->scale;
  p->unit = (uint32_t)f->unit;
  p->utc = f->utc;
  if (f->num_children) {
    p->children = calloc((size_t)f->num_children, sizeof(Larder__Field *));
    if (p->children == NULL) return p;
    for (int i = 0; i < f->num_children; i++) {
      p->children[i] = field_to_proto(&f->children[i]);
      if (p->children[i]) p->n_children++;
    }
  }
  return p;
}

static void field_proto_free(Larder__Field *p) {
  if (p == NULL) return;
  for (size_t i = 0; i < p->n_children; i++) field_proto_free(p->children[i]);
  free(p->children);
  free(p);
}

static conn_t *find_conn(server_t *srv, uint64_t id) {
  for (conn_t *c = srv->conns; c; c = c->next)
    if (c->id == id && !c->closing && !c->draining) return c;
  return NULL;
}

/* Whether a stream of bpe batches an epoch can start at (epoch, batch):
 * the position, and two epochs past it, must count in 64 bits as epoch *
 * bpe + batch (the pins compare positions so), which leaves an unbounded
 * stream more epochs than any job will run. */
static int start_position_fits(uint64_t epoch, uint64_t batch, uint64_t bpe) {
  uint64_t q = UINT64_MAX / bpe, last = q > 3 ? q - 3 : 0;
  uint64_t e = batch / bpe;
  return e <= last && epoch <= last - e;
}

/* What an open that ran out of descriptors tells the client. */
#define OUT_OF_FDS ": the daemon is out of file descriptors (raise its LimitNOFILE)"

static void open_done(work_t *w, int status) {
  open_req_t *o = w->data;
  server_t *srv = o->srv;
  conn_t *c = find_conn(srv, o->conn_id);
  if (status == UV_ECANCELED && o->rc == 0) {
    o->rc = LARDER_ESHUTDOWN;
    snprintf(o->err, sizeof(o->err), "the daemon is shutting down");
  }
  if (c == NULL || srv->shutting_down) {
    if (o->ds) dataset_free(o->ds);
    if (c && srv->shutting_down)
      conn_send_error(c, LARDER_ESHUTDOWN, 0, o->request_id, "the daemon is shutting down");
    free_open_req(o);
    return;
  }
  if (o->rc == 0 && o->params.shuffle_window) {
    /* A stream keeps the units of its shuffle window in memory.  The
     * daemon's default window is shuffle_window_bytes; a client's may be
     * larger, but not past what the memory pool can hold, or one stream
     * would take the daemon past memory_limit (and every client down with
     * it).  It is refused, not cut: a cut window would change the order. */
    const dataset_t *ds = o->ds;
    uint64_t units = o->params.shuffle_window < ds->num_units ? o->params.shuffle_window
                                                              : ds->num_units;
    uint64_t avg = ds->num_units ? ds->est_bytes / ds->num_units : 0;
    if (avg == 0) avg = 1; /* an estimate of nothing is no exemption */
    uint64_t cap = srv->cfg.memory_limit > srv->cfg.shuffle_window_bytes
                       ? srv->cfg.memory_limit
                       : srv->cfg.shuffle_window_bytes;
    uint64_t rows = dataset_window_rows(ds, units);
    if (rows > DATASET_MAX_WINDOW_ROWS) {
      o->rc = LARDER_ELIMIT;
      snprintf(o->err, sizeof(o->err),
               "shuffle_window %u units holds about %llu rows, more than one window may "
               "(%llu)",
               o->params.shuffle_window, (unsigned long long)rows,
               (unsigned long long)DATASET_MAX_WINDOW_ROWS);
    } else if (units > cap / avg) {
      char want[32], have[32];
      util_human_bytes(want, sizeof(want), (double)units * (double)avg);
      util_human_bytes(have, sizeof(have), (double)cap);
      o->rc = LARDER_ELIMIT;
      /* The message names the cap that applies, memory_limit or
       * shuffle_window_bytes.  Tested by daemon_stream_shuffle_window_limit. */
      snprintf(o->err, sizeof(o->err),
               "shuffle_window %u units holds about %s of decoded rows, more than the "
               "daemon allows (%s, its %s)",
               o->params.shuffle_window, want, have,
               cap == srv->cfg.memory_limit ? "memory_limit" : "shuffle_window_bytes");
    }
  }
  if (o->rc) {
    if (o->ds) dataset_free(o->ds);
    conn_send_error(c, o->rc, 0, o->request_id, "%s", o->err);
    free_open_req(o);
    return;
  }
  const Larder__OpenStream *p = &o->params;
  stream_t *s = calloc(1, sizeof(*s));
  if (s == NULL) {
    dataset_free(o->ds);
    conn_send_error(c, LARDER_ENOMEM, 0, o->request_id, "out of memory");
    free_open_req(o);
    return;
  }
  s->srv = srv;
  s->waiter.cb = on_unit_loaded;
  s->waiter.data = s;
  s->ring_fd = -1;
  s->ds = o->ds;
  o->ds = NULL;
  s->id = ++c->next_stream_id;
  s->request_id = o->request_id;
  s->opened_ns = util_now_ns();
  s->validated_ns = s->opened_ns;
  STATS_ADD(&srv->stats, streams, 1);
  open_shuffle_params(o, s->ds, &s->params);
  s->epochs = p->epochs;
  s->window = p->window ? p->window : LARDER_DEFAULT_WINDOW;
  s->prefetch = (uint32_t)srv->cfg.prefetch_batches;
  if (s->prefetch < s->window) s->prefetch = s->window;
  s->num_nodes = 0;
  for (int i = 0; i < s->ds->schema->num_children; i++)
    s->num_nodes += layout_num_nodes(&s->ds->schema->children[i]);
  s->pinned = calloc((size_t)s->ds->num_units + 1, sizeof(unit_t *));
  s->plan_slot = malloc(((size_t)s->ds->num_units + 1) * sizeof(uint32_t));
  s->counted = calloc((size_t)s->ds->num_units + 1, sizeof(uint64_t));
  int rc = s->pinned && s->plan_slot && s->counted ? 0 : LARDER_ENOMEM;
  if (rc == 0) memset(s->plan_slot, 0xff, ((size_t)s->ds->num_units + 1) * sizeof(uint32_t));
  uint64_t global_batch = (uint64_t)s->params.batch_size * s->params.world_size;
  if (rc == 0 && s->params.partitions > 1 &&
      (s->params.partitions > STREAM_MAX_PARTITIONS || global_batch % s->params.partitions)) {
    refuse_open(c, s, o, LARDER_EINVAL,
                "partitions %u: the global batch (%u rows x %u ranks = %llu) must be a multiple "
                "of the partitions, at most %u",
                s->params.partitions, p->batch_size, s->params.world_size,
                (unsigned long long)global_batch, STREAM_MAX_PARTITIONS);
    return;
  }
  if (rc == 0 && o->plan) {
    s->plan = o->plan;
    o->plan = NULL;
  } else if (rc == 0) {
    rc = dataset_shuffle_plan(s->ds, &s->params, o->row_group_blocks, &s->plan);
  }
  if (rc == LARDER_EINVAL && s->params.partitions > 1) {
    refuse_open(c, s, o, rc,
                "partitions %u: the dataset's row groups with rows are fewer than that, and a "
                "partition is made of whole row groups",
                s->params.partitions);
    return;
  }
  if (rc == 0) stream_set_partitions(s);
  if (rc) {
    refuse_open(c, s, o, rc, "invalid stream settings (batch_size %u, rank %u of %u)",
                p->batch_size, p->rank, s->params.world_size);
    return;
  }
  s->batches_per_epoch = shuffle_batches_per_epoch(s->plan);
  /* With drop_last and a global batch larger than the dataset an epoch has
   * no batch, and an unbounded stream of such epochs would end at once, as
   * if it had run its course: refuse it.  A bounded one ends at once, as a
   * DataLoader's would.  Tested by daemon_stream_options. */
  if (s->batches_per_epoch == 0 && s->epochs == 0) {
    refuse_open(c, s, o, LARDER_EINVAL,
                "an unbounded stream with no batch in an epoch: %llu samples are fewer than one "
                "global batch (%u rows x %u ranks), and drop_last drops them",
                (unsigned long long)shuffle_num_samples(s->plan), p->batch_size,
                s->params.world_size);
    return;
  }
  if (s->batches_per_epoch && !start_position_fits(p->start_epoch, p->start_batch,
                                                   s->batches_per_epoch)) {
    /* Past this, the epoch would wrap to a small one, and an unbounded
     * stream would begin its order anew.  Tested by daemon_open_checks. */
    refuse_open(c, s, o, LARDER_EINVAL,
                "start position (epoch %llu, batch %llu) is past the last epoch there is",
                (unsigned long long)p->start_epoch, (unsigned long long)p->start_batch);
    return;
  }
  uint64_t arena_bytes = p->arena_bytes ? p->arena_bytes : srv->cfg.arena_bytes;
  if (arena_bytes > srv->cfg.max_arena_bytes) {
    refuse_open(c, s, o, LARDER_ELIMIT, "arena of %llu bytes exceeds max_arena_bytes (%llu)",
                (unsigned long long)arena_bytes, (unsigned long long)srv->cfg.max_arena_bytes);
    return;
  }
  /* larder per-client limits: the arenas and rings of all of a client's
   * streams. */
  uint64_t ring_need = p->ring && srv->cfg.shm_ring ? ring_size_for(s) : 0;
  uint64_t shm_need = arena_bytes + ring_need;
  if (c->arena_bytes + shm_need > srv->cfg.max_arena_bytes_per_client) {
    refuse_open(c, s, o, LARDER_ELIMIT,
                "this client's streams already hold %llu bytes of shared memory; another "
                "%llu would exceed max_arena_bytes_per_client (%llu)",
                (unsigned long long)c->arena_bytes, (unsigned long long)shm_need,
                (unsigned long long)srv->cfg.max_arena_bytes_per_client);
    return;
  }
  /* The same over all of a user's connections: the per-client cap alone
   * lets one user hold max_clients_per_uid times it. */
  if (srv->cfg.max_arena_bytes_per_uid) {
    uint64_t uid_bytes = 0;
    for (conn_t *other = srv->conns; other; other = other->next)
      if (other->uid == c->uid) uid_bytes += other->arena_bytes;
    if (uid_bytes + shm_need > srv->cfg.max_arena_bytes_per_uid) {
      refuse_open(c, s, o, LARDER_ELIMIT,
                  "the streams of uid %u already hold %llu bytes of shared memory; another "
                  "%llu would exceed max_arena_bytes_per_uid (%llu)",
                  (unsigned)c->uid, (unsigned long long)uid_bytes, (unsigned long long)shm_need,
                  (unsigned long long)srv->cfg.max_arena_bytes_per_uid);
      return;
    }
  }
  uint64_t held, need;
  rc = window_reserve(s, &held, &need);
  if (rc == LARDER_ENOMEM) {
    refuse_open(c, s, o, rc, "out of memory");
    return;
  }
  if (rc) {
    char held_h[32], need_h[32], cap_h[32];
    util_human_bytes(held_h, sizeof(held_h), (double)held);
    util_human_bytes(need_h, sizeof(need_h), (double)need);
    util_human_bytes(cap_h, sizeof(cap_h), (double)srv->cfg.memory_limit);
    refuse_open(c, s, o, rc,
                "the shuffle windows of the streams open now take about %s of memory; this "
                "stream's window (about %s) would take them past memory_limit (%s): "
                "close streams, share a shuffle (same sources, columns, seed and window), or "
                "raise memory_limit",
                held_h, need_h, cap_h);
    return;
  }
  char name[64];
  snprintf(name, sizeof(name), "larder-stream-%d-%u", (int)c->pid, s->id);
  rc = arena_create(arena_bytes, name, &s->arena);
  if (rc) {
    refuse_open(c, s, o, rc, "cannot create a %llu-byte arena%s", (unsigned long long)arena_bytes,
                rc == LARDER_ELIMIT ? OUT_OF_FDS : "");
    return;
  }
  uint8_t cuda_handle[CUDA_IPC_HANDLE_BYTES];
  if (p->memory_kind == LARDER__MEMORY_KIND__MEMORY_CUDA) {
    char why[600];
    rc = cuda_region_open(p->cuda_device, arena_base(s->arena), arena_size(s->arena), &srv->stats,
                          &s->cuda, cuda_handle, why, sizeof(why));
    if (rc) {
      refuse_open(c, s, o, rc, "larderd: %s", why);
      return;
    }
  }
  if (p->ring && srv->cfg.shm_ring) {
    rc = ring_create(s, name);
    if (rc) {
      refuse_open(c, s, o, rc, "cannot create the stream's descriptor ring%s",
                  rc == LARDER_ELIMIT ? OUT_OF_FDS : "");
      return;
    }
  }
  /* Resume: start at (start_epoch, start_batch), exactly where an
   * uninterrupted run would be. */
  s->plan_epoch = p->start_epoch;
  s->plan_batch = p->start_batch;
  if (s->batches_per_epoch && s->plan_batch >= s->batches_per_epoch) {
    s->plan_epoch += s->plan_batch / s->batches_per_epoch;
    s->plan_batch %= s->batches_per_epoch;
  }
  s->exhausted = s->batches_per_epoch == 0 || (s->epochs && s->plan_epoch >= s->epochs);
  s->pin_epoch = s->plan_epoch;
  s->pin_batch = s->plan_batch;
  s->ra_epoch = s->plan_epoch;
  s->ra_batch = s->plan_batch;
  for (uint32_t i = 0; i < s->ds->num_files; i++) s->remote |= s->ds->files[i].remote;
  {
    /* A window's worth of batches: the span the pins cover. */
    uint64_t g = (uint64_t)s->params.batch_size * s->params.world_size;
    uint64_t window_rows = s->ds->total_rows / (s->ds->num_units ? s->ds->num_units : 1) *
                           s->params.window_units;
    s->pin_span = window_rows / (g ? g : 1) + 1;
    if (s->pin_span < s->prefetch) s->pin_span = s->prefetch;
  }
  s->conn = c;
  /* Held while it lives: a worker stays free for its next batch while
   * another job's costly units queue (work.h, Fairness). */
  s->owner = s->ds->key ? s->ds->key : 1;
  work_pool_hold_owner(srv->pool, s->owner);
  s->next_in_conn = c->streams;
  c->streams = s;
  c->num_streams++;
  c->arena_bytes += arena_size(s->arena) + (s->ring ? s->ring_size : 0); /* larder limits */
  /* larder admin: the sources as the client named them (URLs redacted),
   * for stats and metrics. */
  s->label = dataset_sources_label(o->sources, o->num_sources);
  s->job = o->job;
  o->job = NULL;
  s->requested_ns = o->requested_ns;
  s->metrics_group = metrics_group(s->job, o->num_sources ? o->sources[0] : "");
  STATS_ADD(&srv->stats, streams_opened, 1);

  Larder__OpenStreamReply reply = LARDER__OPEN_STREAM_REPLY__INIT;
  reply.request_id = o->request_id;
  reply.stream_id = s->id;
  reply.schema = field_to_proto(s->ds->schema);
  reply.batches_per_epoch = s->batches_per_epoch;
  reply.num_samples = shuffle_num_samples(s->plan);
  reply.arena_bytes = arena_size(s->arena);
  reply.num_files = s->ds->num_files;
  reply.num_units = s->ds->num_units;
  reply.partitions = s->params.partitions;
  reply.partitions_first = s->part_first;
  reply.partitions_last = s->part_last;
  reply.note = s->note;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_OPEN_STREAM_REPLY;
  f.open_stream_reply = &reply;
  reply.ring_bytes = s->ring ? s->ring_size : 0;
  if (s->cuda) {
    reply.memory_kind = LARDER__MEMORY_KIND__MEMORY_CUDA;
    reply.cuda_ipc_handle.data = cuda_handle;
    reply.cuda_ipc_handle.len = sizeof(cuda_handle);
    reply.cuda_device = cuda_region_device(s->cuda);
  }
  int fds[2] = {arena_fd(s->arena), s->ring_fd};
  log_info("stream %u for pid %d: %u files, %u units, %llu rows, %llu batches/epoch, "
           "window %u units, partitions %u (its node's: %u to %u)%s%s",
           s->id, (int)c->pid, s->ds->num_files, s->ds->num_units,
           (unsigned long long)s->ds->total_rows, (unsigned long long)s->batches_per_epoch,
           s->params.window_units, s->params.partitions, s->part_first, s->part_last - 1,
           s->note[0] ? "; " : "", s->note);
  rc = conn_send_fds(c, &f, fds, s->ring ? 2 : 1);
  field_proto_free(reply.schema);
  if (rc == LARDER_EBUSY) {
    /* The client has not read the replies to its earlier opens. */
    conn_send_error(c, LARDER_EBUSY, 0, o->request_id,
                    "the client has %d stream replies unread (at most %d)", c->pending_fd_frames,
                    CONN_MAX_PENDING_FD_FRAMES);
    free_open_req(o);
    stream_close(s);
    return;
  }
  if (rc == LARDER_ELIMIT) {
    /* Out of descriptors: this open fails, the connection and its other
     * streams carry on: closing the connection would free s, which this
     * function goes on to read.  Tested by daemon_robust_out_of_fds. */
    log_warn("stream %u for pid %d: out of file descriptors to pass its shared memory", s->id,
             (int)c->pid);
    conn_send_error(c, LARDER_ELIMIT, 0, o->request_id, "cannot pass the stream's arena%s",
                    OUT_OF_FDS);
    free_open_req(o);
    stream_close(s);
    return;
  }
  free_open_req(o);
  /* Any other failure broke the connection, which closes on the loop's
   * next turn, and s with it. */
  if (rc) return;
  stream_pump(s);
}

static char **copy_strings(char **v, size_t n) {
  char **out = calloc(n + 1, sizeof(char *));
  if (out == NULL) return NULL;
  for (size_t i = 0; i < n; i++) {
    out[i] = strdup(v[i] ? v[i] : "");
    if (out[i] == NULL) {
      for (size_t j = 0; j < i; j++) free(out[j]);
      free(out);
      return NULL;
    }
  }
  return out;
}

static void queue_open(open_req_t *o) {
  server_t *srv = o->srv;
  o->work.data = o;
  o->work.owner = o->conn_id;
  if (work_queue(srv->pool, &o->work, open_work, open_done) != 0) {
    conn_t *c = find_conn(srv, o->conn_id);
    if (c) conn_send_error(c, LARDER_ENOMEM, 0, o->request_id, "cannot queue the request");
    free_open_req(o);
  }
}

static void on_resolved(int status, const char *message, remote_object_t *objects, size_t count,
                        void *arg) {
  open_req_t *o = arg;
  conn_t *c = find_conn(o->srv, o->conn_id);
  if (c == NULL || o->srv->shutting_down) {
    /* The open ends with the shutdown's error, not a closed connection. */
    if (c) conn_send_error(c, LARDER_ESHUTDOWN, 0, o->request_id, "the daemon is shutting down");
    remote_objects_free(objects, count);
    free_open_req(o);
    return;
  }
  if (status) {
    conn_send_error(c, status, 0, o->request_id, "%s", message ? message : larder_strerror(status));
    remote_objects_free(objects, count);
    free_open_req(o);
    return;
  }
  o->remote = objects;
  o->num_remote = count;
  o->dopts.remote = objects;
  o->dopts.num_remote = count;
  queue_open(o);
}

void stream_open(conn_t *c, const Larder__OpenStream *req) {
  server_t *srv = c->srv;
  if (c->num_streams >= (int)srv->cfg.max_streams_per_client) {
    conn_send_error(c, LARDER_ELIMIT, 0, req->request_id,
                    "this client has %d streams open, the limit (max_streams_per_client)",
                    c->num_streams);
    return;
  }
  /* larder per-client limits: opens in progress (each resolves listings
   * and footers, and holds a worker while it reads them). */
  if (c->pending_requests >= (int)srv->cfg.max_pending_per_client) {
    conn_send_error(c, LARDER_ELIMIT, 0, req->request_id,
                    "this client has %d requests in progress, the limit "
                    "(max_pending_per_client)",
                    c->pending_requests);
    return;
  }
  /* Local sources must be absolute: the daemon would resolve a relative
   * path against its own working directory, not the client's.  Tested by
   * daemon_open_checks. */
  for (size_t i = 0; i < req->n_sources; i++) {
    char why[400];
    if (req->sources[i] && req->sources[i][0] &&
        dataset_source_absolute(req->sources[i], why, sizeof(why)) != 0) {
      conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "%s", why);
      return;
    }
  }
  /* larder ACL: remote sources must be inside the allowlist. */
  {
    acl_peer_t peer;
    conn_peer(c, &peer);
    char why[2200];
    for (size_t i = 0; i < req->n_sources; i++) {
      if (req->sources[i] == NULL || !remote_is_url(req->sources[i])) continue;
      int rc = acl_check_url(srv->acl, &peer, req->sources[i], why, sizeof(why));
      if (rc) {
        char red[600];
        fetch_redact(req->sources[i], red, sizeof(red)); /* never log query secrets */
        log_notice("client pid %d uid %u: stream source %s refused: outside the allowlist",
                   (int)c->pid, (unsigned)c->uid, red);
        conn_send_error(c, rc, 0, req->request_id, "%s", why);
        return;
      }
    }
  }
  if (req->batch_size == 0 || req->batch_size > STREAM_MAX_BATCH) {
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "batch_size %u is out of range",
                    req->batch_size);
    return;
  }
  if (req->world_size > 1u << 16) {
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "world_size %u is above %u",
                    req->world_size, 1u << 16);
    return;
  }
  if (req->world_size && req->rank >= req->world_size) {
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "rank %u is not below world_size %u",
                    req->rank, req->world_size);
    return;
  }
  if (req->memory_kind != LARDER__MEMORY_KIND__MEMORY_HOST &&
      req->memory_kind != LARDER__MEMORY_KIND__MEMORY_CUDA) {
    conn_send_error(c, LARDER_EUNSUPPORTED, 0, req->request_id,
                    "memory_kind %d: this daemon delivers batches in host or CUDA memory",
                    (int)req->memory_kind);
    return;
  }
  int cuda_device = req->cuda_device;
  if (req->memory_kind == LARDER__MEMORY_KIND__MEMORY_CUDA) {
    /* CUDA (cuda.h): the driver and the device, before any work.  The
     * trainer's device is found by its UUID: its ordinal may differ from
     * this process's (CUDA_VISIBLE_DEVICES). */
    char why[600];
    int rc = cuda_check(req->cuda_device, why, sizeof(why));
    if (req->cuda_device_uuid.len == 16 && (rc == 0 || rc == LARDER_EINVAL)) {
      cuda_device = cuda_device_by_uuid(req->cuda_device_uuid.data);
      rc = cuda_device >= 0 ? 0 : LARDER_EINVAL;
      if (rc)
        snprintf(why, sizeof(why),
                 "the trainer's CUDA device %d is none of the GPUs larderd sees (by UUID): "
                 "larderd and the trainer must see the same GPUs",
                 req->cuda_device);
    }
    if (rc) {
      conn_send_error(c, rc, 0, req->request_id, "larderd: %s", why);
      return;
    }
  }
  if (req->window > STREAM_MAX_WINDOW) {
    /* A larger window is refused, not cut to this silently: a client that
     * held more batches than the cut window would wait for ever.  Tested by
     * daemon_stream_options. */
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "window %u is above %u batches",
                    req->window, STREAM_MAX_WINDOW);
    return;
  }
  if (req->n_sources == 0 || req->n_sources > 1u << 20) {
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "a stream needs at least one source");
    return;
  }
  /* The job is a metrics label: short and plain. */
  if (req->job && !metrics_job_valid(req->job)) {
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id,
                    "job: at most %d printable ASCII characters", METRICS_MAX_LABEL);
    return;
  }
  open_req_t *o = calloc(1, sizeof(*o));
  if (o == NULL || (o->job = strdup(req->job ? req->job : "")) == NULL) {
    free(o);
    conn_send_error(c, LARDER_ENOMEM, 0, req->request_id, "out of memory");
    return;
  }
  o->srv = srv;
  o->conn = c;
  o->conn_id = c->id;
  c->pending_requests++; /* free_open_req takes it back */
  o->request_id = req->request_id;
  o->params = *req;
  o->params.sources = NULL;
  o->params.columns = NULL;
  o->params.job = NULL;
  o->requested_ns = util_now_ns();
  o->params.cuda_device = cuda_device; /* this process's ordinal */
  o->params.cuda_device_uuid.data = NULL;
  o->params.cuda_device_uuid.len = 0;
  o->sources = copy_strings(req->sources, req->n_sources);
  o->num_sources = req->n_sources;
  o->columns = copy_strings(req->columns, req->n_columns);
  o->num_columns = req->n_columns;
  if (o->sources == NULL || o->columns == NULL) {
    free_open_req(o);
    conn_send_error(c, LARDER_ENOMEM, 0, req->request_id, "out of memory");
    return;
  }
  o->dopts.unit_rows = (uint32_t)(req->unit_rows ? req->unit_rows : srv->cfg.unit_rows);
  if (o->dopts.unit_rows > 65536) o->dopts.unit_rows = 65536;
  if (o->dopts.unit_rows < 64) o->dopts.unit_rows = 64;
  o->dopts.unit_bytes = srv->cfg.unit_bytes;
  pq_options_init(&o->dopts.pq);
  o->dopts.pq.verify_crc = srv->cfg.verify_crc;
  o->dopts.pq.max_chunk_decoded_bytes = srv->cfg.max_chunk_decoded_bytes;
  o->dopts.footers = srv->footers;
  o->dopts.footer_limit = srv->cfg.footer_memory;
  o->window_bytes = srv->cfg.shuffle_window_bytes;
  o->row_group_blocks = srv->cfg.shuffle_row_groups;
  o->partitions = (uint32_t)srv->cfg.partitions;
  {
    /* larder ACL: local paths stay inside local_roots (a copy: a reload
     * may change the key while the open runs on a worker). */
    int oom = 0;
    o->roots = acl_split_roots(srv->cfg.local_roots, &oom);
    if (oom) {
      free_open_req(o);
      conn_send_error(c, LARDER_ENOMEM, 0, req->request_id, "out of memory");
      return;
    }
    o->dopts.allowed_roots = (const char *const *)o->roots;
    acl_peer_t peer;
    conn_peer(c, &peer);
    if (acl_peer_copy(&o->peer, &peer) != 0) {
      free_open_req(o);
      conn_send_error(c, LARDER_ENOMEM, 0, req->request_id, "out of memory");
      return;
    }
    o->dopts.peer = &o->peer;
  }
  int remote = 0;
  for (size_t i = 0; i < o->num_sources; i++) remote |= remote_is_url(o->sources[i]);
  if (remote) {
    /* Listings and footers first, on the loop; then the dataset. */
    if (srv->fetch == NULL) {
      conn_send_error(c, LARDER_EUNSUPPORTED, 0, req->request_id,
                      "remote sources are unavailable: the daemon could not start libcurl");
      free_open_req(o);
      return;
    }
    int rc = server_resolve(srv, (const char *const *)o->sources, o->num_sources, on_resolved, o);
    if (rc) {
      conn_send_error(c, rc, 0, req->request_id, "cannot resolve the remote sources");
      free_open_req(o);
    }
    return;
  }
  queue_open(o);
}
