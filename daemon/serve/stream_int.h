/*
 * stream_int.h: what the parts of a stream share (stream.c: lifecycle and
 * opening; stream_plan.c: pins, orders, read-ahead, revalidation and
 * planning; stream_deliver.c: assembly, sending, releases and the pump).
 * Internal to those three files: nothing else includes it.
 *
 * Conventions
 * -----------
 * - As stream.h: loop thread, except the worker tasks' run callbacks,
 *   which touch only their task and what the stream holds fixed while the
 *   task is in flight (its plan, dataset, and the cursor of that task).
 * - A stream is freed by stream_maybe_free once it is closed and no task
 *   or pump frame of its is left; every function here may be called with
 *   a stream that is not closed yet, unless it says otherwise.
 */
#ifndef LARDER_STREAM_INT_H
#define LARDER_STREAM_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "ring.h"
#include "serve/arena.h"
#include "serve/cuda.h"
#include "serve/layout.h"
#include "serve/stream.h"
#include "serve/units.h"
#include "plan/dataset.h"
#include "plan/shuffle.h"
#include "fetch/fetch.h"
#include "stats.h"
#include "work.h"

enum { PB_WAITING, PB_ASSEMBLING, PB_READY, PB_NOROOM };

typedef struct pbatch {
  struct pbatch *next;
  stream_t *s;
  uint64_t epoch, index, seq;
  int n; /* samples */
  shuffle_sample_t *samples;
  uint32_t *sample_slot; /* per sample: its unit's position in units */
  unit_t **sample_unit;  /* per sample, filled in by the assembly */
  unit_t **units;        /* distinct, each holding one reference */
  uint32_t *unit_index;  /* their indices in the stream's dataset */
  int num_units;
  int units_ready; /* units[0 .. units_ready) are READY (they stay) */
  int state;
  int error;
  char message[300];
  int64_t arena_off;
  uint64_t arena_len;
  /* When no gap held the batch whole: one region per column, each
   * released on its own (stream_room_free); NULL for one region at arena_off. */
  int64_t *parts;
  int num_parts;
  layout_node_t *nodes;
  int num_nodes;
  uint64_t assemble_ns;
  uint64_t release_mark; /* s->releases when its assembly started */
  /* CUDA streams: the batch's copy to the device (cuda.h), which the
   * assembly task starts and which may end before or after the task's
   * done callback.  PB_COPY_RUNNING is set by the worker before it starts
   * the copy; the loop then sets PB_COPY_AWAITED (the task ended first:
   * the copy's end finishes the assembly) or PB_COPY_DONE (the copy ended
   * first).  While a copy runs, it holds one of s->tasks. */
  int copy_state;
  work_t work;
} pbatch_t;

enum { PB_COPY_NONE, PB_COPY_RUNNING, PB_COPY_AWAITED, PB_COPY_DONE };

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
  size_t *unit_start; /* n + 1 */
  uint32_t *slots;    /* n * batch_size */
  int rc;
} plan_chunk_t;

/* The units of batches [first, last) of an epoch, found on a worker. */
typedef struct pin_task {
  work_t work;
  stream_t *s;
  uint64_t epoch, first, last;
  uint32_t *idx;
  int n;
  int next; /* idx[next ..] are not pinned yet */
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
  uint64_t resv_key; /* its window's reservation (window_reserve), or 0 */
  uint32_t id;
  uint32_t request_id;
  stream_t *next_in_conn;
  int closed;
  int end_sent;
  int tasks;      /* worker tasks in flight */
  int pumping;    /* stream_pump frames on the stack */
  uint64_t owner; /* its tasks' work owner (work.h): its dataset's
                               key, which the ranks of a job share, so they
                               share the workers as one; held
                               (work_pool_hold_owner) while nonzero, from
                               the open's reply to stream_destroy */

  unit_waiter_t waiter; /* told when a unit it waits for has loaded
                               (units_wait); data is the stream */
  dataset_t *ds;
  shuffle_plan_t *plan;
  shuffle_params_t params;
  uint32_t part_first, part_last; /* the partitions of its rank's node */
  char note[768];                 /* told the client at open; "" when nothing */
  int rg_together;                /* its plan keeps row groups together */
  int rg_auto;                    /* ... as shuffle_row_groups = auto chose */
  uint64_t epochs;                /* 0 = unbounded */
  uint64_t batches_per_epoch;
  int num_nodes; /* arrays per batch */

  /* Planning: the samples of the coming batches are computed on a worker,
   * a chunk at a time (see plan_task_work), into cur and next. */
  shuffle_epoch_t *plan_ep; /* cursor of the planning tasks */
  uint64_t plan_ep_epoch;
  uint64_t plan_epoch, plan_batch;
  plan_chunk_t *cur, *next; /* next: computed, or being computed (plan_busy) */
  int plan_busy;
  int exhausted; /* every batch planned */

  shuffle_epoch_t *pin_ep; /* cursor of the pin tasks */
  uint64_t pin_ep_epoch;
  int pin_busy;              /* a pin task is in flight */
  int client_closed;         /* CUDA: see `cuda` below */
  shuffle_epoch_t *order_ep; /* cursor of the order tasks */
  uint64_t order_ep_epoch;
  order_task_t *order_task; /* the order task in flight, if any */
  int order_wanted;         /* the span below wants its orders made */
  uint64_t order_epoch, order_first, order_last;
  uint64_t pin_epoch, pin_batch;
  uint64_t pin_span; /* batches pinned ahead */
  pin_t *pins;       /* the span being pinned now */
  int num_pins, cap_pins;
  pin_t *old_pins; /* the span before it, kept until the next one */
  int num_old_pins, cap_old_pins;
  unit_t **pinned;     /* by unit index: a pinned unit, or NULL */
  uint32_t *plan_slot; /* by unit index: scratch of the planning task
                               (one at a time per stream) */
  uint64_t *counted;   /* by unit index: epoch + 1 its stage times were
                               added to this stream's stats */

  arena_t *arena;
  uint32_t window, prefetch;
  pbatch_t *q_head, *q_tail;
  int q_len;
  uint64_t next_seq;
  sent_t *sent;
  int num_sent, cap_sent;
  uint64_t releases; /* Release frames processed (see PB_NOROOM) */
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
  uint64_t ring_published;    /* descriptors written */
  uint64_t ring_drained;      /* release entries read */
  uint64_t ring_wake_at;      /* what the ring's wake_at says */
  uint64_t ring_client_woken; /* the wake_client_at a Wake answered */
  int ring_fd;                /* (beside `remote`, which fills its padding) */

  /* Read-ahead of remote row groups into the cache, beyond the pins: a
   * cursor of its own over the coming batches, and the units of the last
   * stretch it listed that it has not offered yet. */
  int remote;              /* the dataset has remote files */
  uint64_t *rg_prio;       /* its row groups' cache priorities, ascending */
  uint64_t *rg_prio_bytes; /* bytes of the row groups up to each, summed */
  uint32_t num_rg_prio;
  shuffle_epoch_t *ra_ep;
  uint64_t ra_epoch, ra_batch;
  uint32_t *ra_units;
  int ra_n, ra_i;

  stats_stream_t st;
  char *label;           /* larder admin: its sources, for stats */
  char *job;             /* the trainer's job name (metrics_job_valid) */
  uint64_t requested_ns; /* the OpenStream's arrival */
  uint64_t opened_ns;
  int validating;        /* revalidation requests outstanding */
  int metrics_group;     /* its (job, dataset) in the metrics */
  uint64_t validated_ns; /* last revalidation */
  char *stale_msg;       /* a remote object changed: the error the stream
                               ends with once the epoch before is sent */
  uint8_t *stale;        /* by file: changed (cached data to drop) */
  /* CUDA streams (cuda.h): the device region mirroring the arena; every
   * batch's bytes are copied there before it is published.  cuda_park:
   * set when the stream closed while its live connection may still map
   * the region (the daemon ended it, or the client closed it holding
   * batches), which is then parked, not freed; client_closed: the
   * client's CloseStream closed it (it unmapped). */
  cuda_region_t *cuda;
  cuda_park_t *cuda_park;
};

/* Samples planned ahead of a stream at most (or one batch, if larger):
 * each costs about 28 bytes until its batch is sent.  Without this cap, a
 * stream of batches of 2^24 rows planned 32 of them at once, and held
 * prefetch_batches more: gigabytes per stream.  A chunk takes a quarter.
 * Tested by daemon_stream_options. */
#define PLAN_MAX_SAMPLES (1u << 20)

/* The position of batch (epoch, batch) counted from the first batch of
 * epoch 0. */
uint64_t stream_linear(const stream_t *s, uint64_t epoch, uint64_t batch);

/* stream.c: lifecycle. */
/* Frees s if it is closed and nothing of its is in flight or on the
 * stack. */
void stream_maybe_free(stream_t *s);
/* Gives a batch's arena room back: the region at off, or its parts. */
void stream_room_free(stream_t *s, int64_t off, const int64_t *parts, int num_parts);
/* Frees a planned batch: its unit references and waits go with it. */
void stream_pbatch_free(stream_t *s, pbatch_t *b);
void stream_plan_chunk_free(plan_chunk_t *c);
/* Moves the current pins to the old generation, releasing the old one: the
 * span the planner is in stays pinned while the next one loads. */
void stream_rotate_pins(stream_t *s);

/* stream_plan.c: look ahead. */
/* Ends order task t without running it again (not queued, not running). */
void stream_drop_orders(stream_t *s, order_task_t *t);
/* Queues the stream's order task again as foreground work if it still
 * waits in the background queue when the planner has come within a quarter
 * span of it (see stream_plan.c). */
void stream_promote_orders(stream_t *s);
/* Starts the pin task of the next span once the planner is within half a
 * span of the pins' position (none while one runs, past the last epoch,
 * or once an object changed).  Out of memory, it starts none. */
void stream_advance_pins(stream_t *s);
/* Reads the coming remote row groups ahead into the cache
 * (units_read_ahead), until a budget is spent (see stream_plan.c). */
void stream_advance_read_ahead(stream_t *s);
/* Ends a stream whose remote objects changed, once every batch of the
 * epoch before the change is sent: their cached units are of the old
 * version, so they are dropped now. */
void stream_fail_stale(stream_t *s);
/* Plans the batch at (plan_epoch, plan_batch).  Returns 0, LARDER_EAGAIN
 * while its samples are still being computed (the task's end pumps the
 * stream again), or a negative code. */
int stream_plan_one(stream_t *s);

/* stream_deliver.c: delivery. */
/* Runs the stream as far as it can go (see stream_deliver.c). */
void stream_pump(stream_t *s);

#endif /* LARDER_STREAM_INT_H */
