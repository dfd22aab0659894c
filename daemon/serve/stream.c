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
 *
 * Files: this one holds a stream's lifecycle and its opening;
 * stream_plan.c the look ahead (pins, row orders, read-ahead,
 * revalidation, planning); stream_deliver.c the assembly, sending,
 * releases and the pump.  stream_int.h is what they share.
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
  out->shuffle = s->params.shuffle;
  out->rg_together = s->rg_together;
  out->rg_auto = s->rg_auto;
  out->order_note = s->rg_auto && s->ds ? s->ds->order.note : "";
}

stream_t *stream_find(conn_t *c, uint32_t id) {
  for (stream_t *s = c->streams; s; s = s->next_in_conn)
    if (s->id == id) return s;
  return NULL;
}

/* ------------------------------------------------------------------------ */

uint64_t stream_linear(const stream_t *s, uint64_t epoch, uint64_t batch) {
  return epoch * s->batches_per_epoch + batch;
}

/* Gives a batch's arena room back: the region at off, or its parts. */
void stream_room_free(stream_t *s, int64_t off, const int64_t *parts, int num_parts) {
  if (parts == NULL) {
    arena_release(s->arena, (uint64_t)off);
    return;
  }
  for (int i = 0; i < num_parts; i++) arena_release(s->arena, (uint64_t)parts[i]);
}

void stream_pbatch_free(stream_t *s, pbatch_t *b) {
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
void stream_rotate_pins(stream_t *s) {
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

void stream_plan_chunk_free(plan_chunk_t *c) {
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
  uint64_t k[4] = {s->ds->key, s->params.seed, s->params.window_units, (uint64_t)s->params.shuffle};
  /* Odd: 0 means no reservation. */
  return util_hash64(k, sizeof(k), 0x77696e64ull) | 1;
}

/* A window's decoded bytes as the footers tell, twice over when its units
 * build row blocks (layout.h), which take about as much again. */
static uint64_t window_estimate(const stream_t *s) {
  const dataset_t *ds = s->ds;
  uint64_t units = s->params.window_units < ds->num_units ? s->params.window_units : ds->num_units;
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

/* A CUDA stream's region and arena, freed on a worker: unpinning the arena
 * and freeing the device memory (cuMemHostUnregister, cuMemFree, which
 * may wait for the device's copies in flight) take milliseconds that the
 * loop, handing every trainer its batches, must not spend. */
typedef struct region_close {
  work_t work;
  cuda_region_t *r;
  arena_t *arena;
  cuda_park_t *park; /* parked: only the host side goes, then it settles */
  int ran;
} region_close_t;

static void region_close_work(work_t *w) {
  region_close_t *rc = w->data;
  /* The region unpins the arena: before the arena goes. */
  if (rc->park) cuda_region_detach_host(rc->r);
  else cuda_region_close(rc->r);
  arena_destroy(rc->arena);
  rc->ran = 1;
}

static void region_close_done(work_t *w, int status) {
  region_close_t *rc = w->data;
  (void)status;
  if (!rc->ran) region_close_work(w); /* cancelled at shutdown: here, then */
  if (rc->park) cuda_park_settle(rc->park);
  free(rc);
}

/* Frees region r (or, parked, only its host side, then settles the park),
 * then arena a, on a worker; on the loop when none takes it (out of
 * memory, or the pool stopping). */
static void close_region_later(server_t *srv, cuda_region_t *r, arena_t *a, cuda_park_t *park) {
  region_close_t now = {.r = r, .arena = a, .park = park};
  region_close_t *rc = malloc(sizeof(*rc));
  if (rc) {
    *rc = now;
    rc->work.data = rc;
    if (srv && work_queue(srv->pool, &rc->work, region_close_work, region_close_done) == 0) return;
    free(rc);
  }
  region_close_work(&(work_t){.data = &now});
  if (park) cuda_park_settle(park);
}

void stream_close_region(void *srv, cuda_region_t *r) { close_region_later(srv, r, NULL, NULL); }

static void stream_destroy(stream_t *s) {
  if (s->owner) work_pool_release_owner(s->srv->pool, s->owner);
  s->owner = 0;
  window_unreserve(s);
  while (s->q_head) {
    pbatch_t *b = s->q_head;
    s->q_head = b->next;
    stream_pbatch_free(s, b);
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
  stream_plan_chunk_free(s->cur);
  stream_plan_chunk_free(s->next);
  free(s->ra_units);
  free(s->rg_prio);
  free(s->rg_prio_bytes);
  shuffle_plan_free(s->plan);
  free(s->stale_msg);
  free(s->stale);
  if (s->ds && --s->ds->refs == 0) dataset_free(s->ds);
  /* The region unpins the arena: before the arena goes, on a worker.
   * Parked, the host side goes with the arena, and the device side waits
   * for the client, unless it was unparked meanwhile (cuda.h). */
  if (s->cuda) {
    close_region_later(s->srv, s->cuda, s->arena, s->cuda_park);
    s->arena = NULL;
  }
  s->cuda = NULL;
  arena_destroy(s->arena);
  if (s->ring) munmap(s->ring, s->ring_size);
  if (s->ring_fd >= 0) close(s->ring_fd);
  STATS_SUB(&s->srv->stats, streams, 1);
  free(s->label);
  free(s->job);
  free(s);
}

void stream_maybe_free(stream_t *s) {
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
  /* CUDA: ended by the daemon (or with the connection) while its trainer
   * lives, or closed by a trainer that holds batches: once its reply went
   * out, the trainer may map the region, which is parked (cuda.h), and
   * counts against the connection's limit until the trainer lets go. */
  if (s->cuda && s->conn && !s->client_closed && !conn_reply_unsent(s->conn, s->id)) {
    s->cuda_park = cuda_park(s->conn->id, (int)s->conn->pid, (uint32_t)s->conn->uid, s->conn->pidfd,
                             s->id, s->cuda);
    if (s->cuda_park) s->conn->cuda_parked++;
  }
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
    stream_pbatch_free(s, b);
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
    stream_drop_orders(s, s->order_task);
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
  if (s->conn && s->cuda && conn_reply_unsent(s->conn, s->id)) {
    /* Its reply still waits for the client to read: it goes, so that no
     * trainer maps a region freed now (its handle was never sent), and
     * the client's open gets the error instead. */
    conn_cancel_unsent(s->conn, s->id);
    s->client_closed = 1;
    conn_send_error(s->conn, code, 0, s->request_id, "%s", msg);
  } else if (s->conn) {
    conn_send_error(s->conn, code, s->id, 0, "%s", msg);
  }
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
    /* A CUDA region kept for a stream ended before. */
    c->cuda_parked -= cuda_unpark(c->id, cs->stream_id);
  }
}

/* ------------------------------------------------------------------------ */
/* Opening                                                                   */

/* A unit the stream waits for is READY or FAILED (units_wait). */
static void on_unit_loaded(unit_waiter_t *w) { stream_pump(w->data); }

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

typedef struct open_req {
  work_t work;
  server_t *srv;
  conn_t *conn; /* NULL once the connection went away */
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
  char **roots;          /* larder ACL: local_roots, split (NULL: anywhere) */
  acl_peer_t peer;       /* the client, whose credentials open local files */
  uint64_t window_bytes; /* cfg.shuffle_window_bytes when it was asked */
  int row_group_blocks;  /* cfg.shuffle_row_groups, likewise */
  uint32_t partitions;   /* cfg.partitions, likewise */
  shuffle_plan_t *plan;  /* made by open_work; NULL: open_done makes it */
  char *job;             /* the trainer's job name, checked */
  uint64_t requested_ns;
  /* A CUDA stream's region, opened on a worker (region_work): */
  stream_t *s;           /* the stream, made and not yet attached */
  uint64_t reserved;     /* its arena's bytes, counted for the client meanwhile */
  cuda_region_t *region; /* the region, for region_done to give s */
  cuda_export_t ex;      /* its export */
} open_req_t;

/* The stream's shuffle parameters, from its request and its dataset. */
static void open_shuffle_params(const open_req_t *o, const dataset_t *ds, shuffle_params_t *sp) {
  const Larder__OpenStream *p = &o->params;
  memset(sp, 0, sizeof(*sp));
  sp->seed = p->seed;
  sp->shuffle = p->shuffle;
  sp->window_units =
      p->shuffle_window ? p->shuffle_window : dataset_window_units(ds, o->window_bytes);
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
  o->rc =
      dataset_open((const char *const *)o->sources, o->num_sources, (const char *const *)o->columns,
                   o->num_columns, &o->dopts, &o->ds, o->err, sizeof(o->err));
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
  if (o->ex.fd >= 0) close(o->ex.fd); /* a region's descriptor never sent */
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

/* A client's shuffle window must fit: o->rc and o->err say why not.  A
 * stream keeps the units of its shuffle window in memory.  The daemon's
 * default window is shuffle_window_bytes; a client's may be larger, but not
 * past what the memory pool can hold, or one stream would take the daemon
 * past memory_limit (and every client down with it).  It is refused, not
 * cut: a cut window would change the order. */
static void open_check_window(server_t *srv, open_req_t *o) {
  const dataset_t *ds = o->ds;
  uint64_t units =
      o->params.shuffle_window < ds->num_units ? o->params.shuffle_window : ds->num_units;
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

/* A new stream of connection c for o, taking o's dataset; its per-unit
 * arrays are allocated, and *rc says whether they were (0 or
 * LARDER_ENOMEM).  Not yet in c's list.  NULL when out of memory (the
 * dataset is then o's still). */
static stream_t *open_new_stream(server_t *srv, conn_t *c, open_req_t *o, int *rc) {
  const Larder__OpenStream *p = &o->params;
  stream_t *s = calloc(1, sizeof(*s));
  if (s == NULL) return NULL;
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
  *rc = s->pinned && s->plan_slot && s->counted ? 0 : LARDER_ENOMEM;
  if (*rc == 0) memset(s->plan_slot, 0xff, ((size_t)s->ds->num_units + 1) * sizeof(uint32_t));
  return s;
}

/* Gives s its shuffle plan (the one open_work made, or a new one), its
 * node's partitions and its batches per epoch, and checks the settings
 * that only the plan can judge.  rc is open_new_stream's.  Returns 0, or
 * -1 when the open was refused (s and o are then freed). */
static int open_plan(conn_t *c, stream_t *s, open_req_t *o, int rc) {
  const Larder__OpenStream *p = &o->params;
  uint64_t global_batch = (uint64_t)s->params.batch_size * s->params.world_size;
  if (rc == 0 && s->params.partitions > 1 &&
      (s->params.partitions > STREAM_MAX_PARTITIONS || global_batch % s->params.partitions)) {
    refuse_open(c, s, o, LARDER_EINVAL,
                "partitions %u: the global batch (%u rows x %u ranks = %llu) must be a multiple "
                "of the partitions, at most %u",
                s->params.partitions, p->batch_size, s->params.world_size,
                (unsigned long long)global_batch, STREAM_MAX_PARTITIONS);
    return -1;
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
    return -1;
  }
  if (rc == 0) {
    stream_set_partitions(s);
    s->rg_auto = o->row_group_blocks < 0;
    s->rg_together = s->rg_auto ? s->ds->order.together : o->row_group_blocks;
    /* What auto chose for this dataset, and why (clustered.h). */
    if (s->rg_auto && s->params.shuffle) {
      size_t len = strlen(s->note);
      snprintf(s->note + len, sizeof(s->note) - len, "%s%s", len ? "; " : "", s->ds->order.note);
    }
  }
  if (rc) {
    refuse_open(c, s, o, rc, "invalid stream settings (batch_size %u, rank %u of %u)",
                p->batch_size, p->rank, s->params.world_size);
    return -1;
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
    return -1;
  }
  if (s->batches_per_epoch &&
      !start_position_fits(p->start_epoch, p->start_batch, s->batches_per_epoch)) {
    /* Past this, the epoch would wrap to a small one, and an unbounded
     * stream would begin its order anew.  Tested by daemon_open_checks. */
    refuse_open(c, s, o, LARDER_EINVAL,
                "start position (epoch %llu, batch %llu) is past the last epoch there is",
                (unsigned long long)p->start_epoch, (unsigned long long)p->start_batch);
    return -1;
  }
  return 0;
}

/* Checks the shared memory s would take (its arena and ring) against the
 * per-stream, per-client and per-uid limits, and its shuffle window against
 * memory_limit (window_reserve, which holds it from now on).  Sets
 * *arena_bytes.  Returns 0, or -1 when the open was refused (s and o are
 * then freed). */
static int open_check_limits(conn_t *c, stream_t *s, open_req_t *o, uint64_t *arena_bytes) {
  server_t *srv = s->srv;
  const Larder__OpenStream *p = &o->params;
  *arena_bytes = p->arena_bytes ? p->arena_bytes : srv->cfg.arena_bytes;
  if (*arena_bytes > srv->cfg.max_arena_bytes) {
    refuse_open(c, s, o, LARDER_ELIMIT, "arena of %llu bytes exceeds max_arena_bytes (%llu)",
                (unsigned long long)*arena_bytes, (unsigned long long)srv->cfg.max_arena_bytes);
    return -1;
  }
  /* larder per-client limits: the arenas and rings of all of a client's
   * streams, and the device memory of the CUDA regions its trainer has
   * not let go of (parked, cuda.h), which outlive their streams. */
  uint64_t ring_need = p->ring && srv->cfg.shm_ring ? ring_size_for(s) : 0;
  uint64_t shm_need = *arena_bytes + ring_need;
  uint64_t mine = c->arena_bytes + cuda_parked_bytes(c->id, (int)c->pid);
  if (mine + shm_need > srv->cfg.max_arena_bytes_per_client) {
    refuse_open(c, s, o, LARDER_ELIMIT,
                "this client's streams already hold %llu bytes of shared memory (with the "
                "CUDA regions kept for it); another %llu would exceed "
                "max_arena_bytes_per_client (%llu)",
                (unsigned long long)mine, (unsigned long long)shm_need,
                (unsigned long long)srv->cfg.max_arena_bytes_per_client);
    return -1;
  }
  /* The same over all of a user's connections: the per-client cap alone
   * lets one user hold max_clients_per_uid times it. */
  if (srv->cfg.max_arena_bytes_per_uid) {
    uint64_t uid_bytes = cuda_parked_bytes_of_uid((uint32_t)c->uid);
    for (conn_t *other = srv->conns; other; other = other->next)
      if (other->uid == c->uid) uid_bytes += other->arena_bytes;
    if (uid_bytes + shm_need > srv->cfg.max_arena_bytes_per_uid) {
      refuse_open(c, s, o, LARDER_ELIMIT,
                  "the streams of uid %u already hold %llu bytes of shared memory (with the "
                  "CUDA regions kept for it); another %llu would exceed "
                  "max_arena_bytes_per_uid (%llu)",
                  (unsigned)c->uid, (unsigned long long)uid_bytes, (unsigned long long)shm_need,
                  (unsigned long long)srv->cfg.max_arena_bytes_per_uid);
      return -1;
    }
  }
  uint64_t held, need;
  int rc = window_reserve(s, &held, &need);
  if (rc == LARDER_ENOMEM) {
    refuse_open(c, s, o, rc, "out of memory");
    return -1;
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
    return -1;
  }
  return 0;
}

/* Creates s's descriptor ring when asked for and allowed.  Returns 0, or
 * -1 when the open was refused (s and o are then freed). */
static int open_ring(conn_t *c, stream_t *s, open_req_t *o) {
  if (!o->params.ring || !s->srv->cfg.shm_ring) return 0;
  char name[64];
  snprintf(name, sizeof(name), "larder-stream-%d-%u", (int)c->pid, s->id);
  int rc = ring_create(s, name);
  if (rc) {
    refuse_open(c, s, o, rc, "cannot create the stream's descriptor ring%s",
                rc == LARDER_ELIMIT ? OUT_OF_FDS : "");
    return -1;
  }
  return 0;
}

/* Sets s's cursors at its start position, its pin span and its labels, and
 * links it into connection c: from here on it is a stream of c's, which
 * closes with c. */
static void open_attach(conn_t *c, stream_t *s, open_req_t *o) {
  server_t *srv = s->srv;
  const Larder__OpenStream *p = &o->params;
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
    uint64_t window_rows =
        s->ds->total_rows / (s->ds->num_units ? s->ds->num_units : 1) * s->params.window_units;
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
}

/* Sends the OpenStreamReply of attached stream s with its descriptors (the
 * arena's, and the ring's), and frees o.  Returns 0 when it went out and
 * the stream may run; else the stream is closed (the client has too many
 * replies unread, or the daemon is out of descriptors: the client is told),
 * or the connection broke and closes on the loop's next turn, s with it. */
static int open_reply(conn_t *c, stream_t *s, open_req_t *o, const cuda_export_t *ex) {
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
  int fds[3] = {arena_fd(s->arena), s->ring_fd, -1}, num_fds = s->ring ? 2 : 1;
  if (s->cuda) {
    reply.memory_kind = LARDER__MEMORY_KIND__MEMORY_CUDA;
    reply.cuda_device = cuda_region_device(s->cuda);
    reply.cuda_region_bytes = ex->region_bytes;
    if (ex->fd >= 0) {
      reply.cuda_region_fd = 1;
      fds[num_fds++] = ex->fd;
    } else {
      reply.cuda_ipc_handle.data = (uint8_t *)ex->handle;
      reply.cuda_ipc_handle.len = CUDA_IPC_HANDLE_BYTES;
    }
  }
  log_info(
      "stream %u for pid %d: %u files, %u units, %llu rows, %llu batches/epoch, "
      "window %u units, partitions %u (its node's: %u to %u)%s%s",
      s->id, (int)c->pid, s->ds->num_files, s->ds->num_units, (unsigned long long)s->ds->total_rows,
      (unsigned long long)s->batches_per_epoch, s->params.window_units, s->params.partitions,
      s->part_first, s->part_last - 1, s->note[0] ? "; " : "", s->note);
  /* A connection already going takes no frame, and one that cannot be
   * encoded is not queued: the client then has none of the stream's
   * memory (for the CUDA region's park, stream_close). */
  int queueable = !c->closing && !c->draining && !c->broken;
  int rc = conn_send_fds(c, &f, fds, num_fds);
  if (rc != 0 && (!queueable || rc == LARDER_ENOMEM)) s->client_closed = 1;
  field_proto_free(reply.schema);
  if (rc == LARDER_EBUSY) {
    /* The client has not read the replies to its earlier opens. */
    conn_send_error(c, LARDER_EBUSY, 0, o->request_id,
                    "the client has %d stream replies unread (at most %d)", c->pending_fd_frames,
                    CONN_MAX_PENDING_FD_FRAMES);
    free_open_req(o);
    s->client_closed = 1; /* the reply never went: nothing of it is mapped */
    stream_close(s);
    return rc;
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
    s->client_closed = 1; /* the reply never went: nothing of it is mapped */
    stream_close(s);
    return rc;
  }
  free_open_req(o);
  /* Any other failure broke the connection, which closes on the loop's
   * next turn, and s with it. */
  return rc;
}

/* The rest of an open whose shared memory (arena, CUDA region) is made:
 * its ring, its place in connection c, its reply, and its start. */
static void open_finish(conn_t *c, stream_t *s, open_req_t *o) {
  /* The reply carries its own copy of the region's descriptor, and o goes
   * with the reply. */
  int fd = o->ex.fd;
  cuda_export_t ex = o->ex;
  o->ex.fd = -1;
  int opened = open_ring(c, s, o) == 0;
  if (opened) {
    open_attach(c, s, o);
    opened = open_reply(c, s, o, &ex) == 0;
  }
  if (fd >= 0) close(fd);
  if (opened) stream_pump(s);
}

/* A CUDA stream's region, on a worker: the driver's calls (the context's
 * first retain, the allocation, pinning the arena) take from milliseconds
 * to a second, which the loop, handing every trainer its batches, must
 * not spend.  s is not yet any connection's, so nothing else reads it. */
static void region_work(work_t *w) {
  open_req_t *o = w->data;
  stream_t *s = o->s;
  o->rc = cuda_region_open(o->params.cuda_device, arena_base(s->arena), arena_size(s->arena),
                           &o->srv->stats, &o->region, &o->ex, o->err, sizeof(o->err));
}

/* The region's end, on the loop: gives s its region and finishes the open,
 * or refuses it. */
static void region_done(work_t *w, int status) {
  open_req_t *o = w->data;
  server_t *srv = o->srv;
  stream_t *s = o->s;
  /* The reservation goes back to the connection whatever its state (a
   * draining one may live on). */
  for (conn_t *any = srv->conns; any; any = any->next)
    if (any->id == o->conn_id) any->arena_bytes -= o->reserved;
  conn_t *c = find_conn(srv, o->conn_id);
  s->cuda = o->region;
  o->region = NULL;
  if (c == NULL || srv->shutting_down || status == UV_ECANCELED) {
    if (c) conn_send_error(c, LARDER_ESHUTDOWN, 0, o->request_id, "the daemon is shutting down");
    s->closed = 1;
    stream_destroy(s);
    free_open_req(o);
    return;
  }
  if (o->rc) {
    refuse_open(c, s, o, o->rc, "larderd: %s", o->err);
    return;
  }
  open_finish(c, s, o);
}

/* Opens s's CUDA region on a worker (region_work), its arena and ring
 * counted for connection c meanwhile, so that the client's other opens
 * see them. */
static void open_region(conn_t *c, stream_t *s, open_req_t *o) {
  server_t *srv = o->srv;
  /* The trainer's process, watched while it is surely the one connected:
   * its regions may outlive the connection (cuda.h). */
  if (c->pidfd < 0) c->pidfd = cuda_watch_pid((int)c->pid);
  o->ex = (cuda_export_t){.fd = -1, .fd_wanted = o->params.cuda_fd_ok && srv->cfg.cuda_fd_handles};
  o->s = s;
  o->rc = 0;
  o->reserved = arena_size(s->arena) + (o->params.ring && srv->cfg.shm_ring ? ring_size_for(s) : 0);
  c->arena_bytes += o->reserved;
  o->work.data = o;
  o->work.owner = o->conn_id;
  if (work_queue(srv->pool, &o->work, region_work, region_done) != 0) {
    c->arena_bytes -= o->reserved;
    refuse_open(c, s, o, LARDER_ESHUTDOWN, "the daemon is shutting down");
  }
}

/* The open's end, on the loop: checks what the worker found (open_work)
 * against the daemon's limits, makes the stream, its shared memory and its
 * reply, and starts it.  Every refusal goes to the client as an Error
 * frame for the open's request, and frees what was made for it. */
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
  if (o->rc == 0 && o->params.shuffle_window) open_check_window(srv, o);
  if (o->rc) {
    if (o->ds) dataset_free(o->ds);
    conn_send_error(c, o->rc, 0, o->request_id, "%s", o->err);
    free_open_req(o);
    return;
  }
  int rc;
  stream_t *s = open_new_stream(srv, c, o, &rc);
  if (s == NULL) {
    dataset_free(o->ds);
    conn_send_error(c, LARDER_ENOMEM, 0, o->request_id, "out of memory");
    free_open_req(o);
    return;
  }
  if (open_plan(c, s, o, rc) != 0) return;
  uint64_t arena_bytes;
  if (open_check_limits(c, s, o, &arena_bytes) != 0) return;
  char name[64];
  snprintf(name, sizeof(name), "larder-stream-%d-%u", (int)c->pid, s->id);
  rc = arena_create(arena_bytes, name, &s->arena);
  if (rc) {
    refuse_open(c, s, o, rc, "cannot create a %llu-byte arena%s", (unsigned long long)arena_bytes,
                rc == LARDER_ELIMIT ? OUT_OF_FDS : "");
    return;
  }
  if (o->params.memory_kind == LARDER__MEMORY_KIND__MEMORY_CUDA) {
    open_region(c, s, o);
    return;
  }
  open_finish(c, s, o);
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

/* Checks an OpenStream request before any work: the client's limits,
 * its sources (absolute, inside the allowlist), its settings, and its CUDA
 * device, found in this process's numbering (*cuda_device).  Returns 0, or
 * -1 once the client has been sent the error. */
static int open_check_request(conn_t *c, const Larder__OpenStream *req, int *cuda_device) {
  server_t *srv = c->srv;
  int held = c->cuda_parked + cuda_orphans_of((int)c->pid);
  if (c->num_streams + held >= (int)srv->cfg.max_streams_per_client) {
    if (held)
      conn_send_error(c, LARDER_ELIMIT, 0, req->request_id,
                      "this client has %d streams open and %d closed CUDA streams whose device "
                      "memory it may still map (it holds their batches), the limit "
                      "(max_streams_per_client)",
                      c->num_streams, held);
    else
      conn_send_error(c, LARDER_ELIMIT, 0, req->request_id,
                      "this client has %d streams open, the limit (max_streams_per_client)",
                      c->num_streams);
    return -1;
  }
  /* larder per-client limits: opens in progress (each resolves listings
   * and footers, and holds a worker while it reads them). */
  if (c->pending_requests >= (int)srv->cfg.max_pending_per_client) {
    conn_send_error(c, LARDER_ELIMIT, 0, req->request_id,
                    "this client has %d requests in progress, the limit "
                    "(max_pending_per_client)",
                    c->pending_requests);
    return -1;
  }
  /* Local sources must be absolute: the daemon would resolve a relative
   * path against its own working directory, not the client's.  Tested by
   * daemon_open_checks. */
  for (size_t i = 0; i < req->n_sources; i++) {
    char why[400];
    if (req->sources[i] && req->sources[i][0] &&
        dataset_source_absolute(req->sources[i], why, sizeof(why)) != 0) {
      conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "%s", why);
      return -1;
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
        return -1;
      }
    }
  }
  if (req->batch_size == 0 || req->batch_size > STREAM_MAX_BATCH) {
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "batch_size %u is out of range",
                    req->batch_size);
    return -1;
  }
  if (req->world_size > 1u << 16) {
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "world_size %u is above %u",
                    req->world_size, 1u << 16);
    return -1;
  }
  if (req->world_size && req->rank >= req->world_size) {
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "rank %u is not below world_size %u",
                    req->rank, req->world_size);
    return -1;
  }
  if (req->memory_kind != LARDER__MEMORY_KIND__MEMORY_HOST &&
      req->memory_kind != LARDER__MEMORY_KIND__MEMORY_CUDA) {
    conn_send_error(c, LARDER_EUNSUPPORTED, 0, req->request_id,
                    "memory_kind %d: this daemon delivers batches in host or CUDA memory",
                    (int)req->memory_kind);
    return -1;
  }
  *cuda_device = req->cuda_device;
  if (req->memory_kind == LARDER__MEMORY_KIND__MEMORY_CUDA) {
    /* CUDA (cuda.h): the driver and the device, before any work.  The
     * trainer's device is found by its UUID: its ordinal may differ from
     * this process's (CUDA_VISIBLE_DEVICES). */
    char why[600];
    int rc = cuda_check(req->cuda_device, why, sizeof(why));
    if (req->cuda_device_uuid.len == 16 && (rc == 0 || rc == LARDER_EINVAL)) {
      *cuda_device = cuda_device_by_uuid(req->cuda_device_uuid.data);
      rc = *cuda_device >= 0 ? 0 : LARDER_EINVAL;
      if (rc)
        snprintf(why, sizeof(why),
                 "the trainer's CUDA device %d is none of the GPUs larderd sees (by UUID): "
                 "larderd and the trainer must see the same GPUs",
                 req->cuda_device);
    }
    if (rc) {
      conn_send_error(c, rc, 0, req->request_id, "larderd: %s", why);
      return -1;
    }
  }
  if (req->window > STREAM_MAX_WINDOW) {
    /* A larger window is refused, not cut to this silently: a client that
     * held more batches than the cut window would wait for ever.  Tested by
     * daemon_stream_options. */
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "window %u is above %u batches",
                    req->window, STREAM_MAX_WINDOW);
    return -1;
  }
  if (req->n_sources == 0 || req->n_sources > 1u << 20) {
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id, "a stream needs at least one source");
    return -1;
  }
  /* The job is a metrics label: short and plain. */
  if (req->job && !metrics_job_valid(req->job)) {
    conn_send_error(c, LARDER_EINVAL, 0, req->request_id,
                    "job: at most %d printable ASCII characters", METRICS_MAX_LABEL);
    return -1;
  }
  return 0;
}

/* The open request for req, a copy of what it asks with the daemon's
 * settings as they are now (a reload may change them while the open runs)
 * and the client's credentials; counted in c's pending requests until
 * free_open_req.  NULL once the client has been sent the error (out of
 * memory). */
static open_req_t *open_request_new(conn_t *c, const Larder__OpenStream *req, int cuda_device) {
  server_t *srv = c->srv;
  open_req_t *o = calloc(1, sizeof(*o));
  if (o == NULL || (o->job = strdup(req->job ? req->job : "")) == NULL) {
    free(o);
    conn_send_error(c, LARDER_ENOMEM, 0, req->request_id, "out of memory");
    return NULL;
  }
  o->srv = srv;
  o->ex.fd = -1;
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
    return NULL;
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
      return NULL;
    }
    o->dopts.allowed_roots = (const char *const *)o->roots;
    acl_peer_t peer;
    conn_peer(c, &peer);
    if (acl_peer_copy(&o->peer, &peer) != 0) {
      free_open_req(o);
      conn_send_error(c, LARDER_ENOMEM, 0, req->request_id, "out of memory");
      return NULL;
    }
    o->dopts.peer = &o->peer;
  }
  return o;
}

/* Checks the request, then resolves remote sources on the loop
 * (server_resolve) and opens the dataset on a worker (open_work), and
 * replies in open_done. */
void stream_open(conn_t *c, const Larder__OpenStream *req) {
  server_t *srv = c->srv;
  int cuda_device;
  if (open_check_request(c, req, &cuda_device) != 0) return;
  open_req_t *o = open_request_new(c, req, cuda_device);
  if (o == NULL) return;
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
