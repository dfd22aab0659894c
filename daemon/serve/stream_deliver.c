/*
 * stream_deliver.c: a stream's delivery (see stream.c for the whole): the
 * assembly of planned batches on workers, sending them, the client's
 * releases and the descriptor ring, and the pump that drives the stream
 * as far as it can go.
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
/* Assembly, on a worker thread                                              */

/* Samples a row-block prefetch runs ahead, and the most bytes of a row's
 * fixed part it fetches (the rest of a long one streams in behind them). */
#define ROW_AHEAD 20
#define ROW_PREFETCH_MAX 1024

/* What an assembly works with, on its worker, freed by assembly_free.  The
 * gathers' scratch (layout.h) is passed beside it: the sizing and the
 * filling of a column must share it. */
typedef struct assembly {
  const pq_field_t *schema;
  int nc;                     /* top-level columns */
  const layout_rowplan_t *rp; /* the dataset's row plan, or NULL */
  layout_pick_t *picks;       /* per sample: its unit's view and row */
  int64_t *sizes;             /* per column: its bytes in the batch */
  uint64_t total;             /* their sum */
  uint8_t *tmp;               /* row plan: the samples' fixed parts */
  int64_t *nulls_by_bit;      /* row plan: nulls per null bit */
  uint8_t *from_rows;         /* per column: split from tmp, not gathered */
  int *vslots;                /* row plan: the VAR and LIST slots split */
  uint8_t **vcursor;          /* where their values go (layout_rows_values) */
} assembly_t;

static void assembly_free(assembly_t *a) {
  free(a->from_rows);
  free(a->vslots);
  free(a->vcursor);
  free(a->tmp);
  free(a->nulls_by_bit);
  free(a->picks);
  free(a->sizes);
}

/* Copies each sample's fixed part out of its unit's row block into a->tmp,
 * counts the nulls, and marks the columns that can be split from there
 * (from_rows).  The inline values stay where they are until the fill
 * (layout_rows_values).  Returns 0 or LARDER_ENOMEM. */
static int assembly_copy_rows(pbatch_t *b, assembly_t *a) {
  const layout_rowplan_t *rp = a->rp;
  a->tmp = malloc((size_t)b->n * rp->stride + 1);
  a->nulls_by_bit = malloc((size_t)(rp->null_bytes ? rp->null_bytes : 1) * 8 * sizeof(int64_t));
  a->vslots = malloc((size_t)(rp->num_packed ? rp->num_packed : 1) * sizeof(int));
  a->vcursor = malloc((size_t)(rp->num_packed ? rp->num_packed : 1) * sizeof(uint8_t *));
  if (a->tmp == NULL || a->nulls_by_bit == NULL || a->vslots == NULL || a->vcursor == NULL)
    return LARDER_ENOMEM;
  uint8_t *tmp = a->tmp;
  /* A LIST slot comes from the rows only when every unit inlined it. */
  uint64_t lists = ~0ull;
  for (int i = 0; i < b->num_units; i++) lists &= b->units[i]->rowblock.inline_lists;
  for (int c = 0; c < a->nc; c++) {
    int p = rp->slot_of[c];
    a->from_rows[c] = p >= 0 && (rp->packed[p].kind != LAYOUT_SLOT_LIST || ((lists >> p) & 1));
  }
  size_t stride = rp->stride;
  for (int i = 0; i < b->n; i++) {
    /* Two steps ahead: a row's start, then (once that is in cache) the
     * row's lines, so each sample's misses overlap those of the next
     * ROW_AHEAD samples. */
    if (i + 2 * ROW_AHEAD < b->n) {
      const unit_t *u = b->sample_unit[i + 2 * ROW_AHEAD];
      if (u->rowblock.start)
        __builtin_prefetch(u->rowblock.start + b->samples[i + 2 * ROW_AHEAD].row);
    }
    if (i + ROW_AHEAD < b->n) {
      size_t len;
      const uint8_t *ahead = layout_rows_row(&b->sample_unit[i + ROW_AHEAD]->rowblock,
                                             b->samples[i + ROW_AHEAD].row, &len);
      /* The fixed part, which this loop copies.  Not the inline values:
       * the fill reads them a sample at a time with a prefetch of its own,
       * and a batch's worth fetched here would have left the cache by then
       * (bench/README.md has the measurement). */
      size_t lim = len < ROW_PREFETCH_MAX ? len : ROW_PREFETCH_MAX;
      size_t fixed = stride < lim ? stride : lim;
      for (size_t at = 0; at < fixed; at += 64) __builtin_prefetch(ahead + at);
      __builtin_prefetch(ahead + fixed - 1);
    }
    size_t len;
    const uint8_t *row = layout_rows_row(&b->sample_unit[i]->rowblock, b->samples[i].row, &len);
    memcpy(tmp + (size_t)i * stride, row, stride);
  }
  layout_rows_count_nulls(rp, tmp, b->n, a->nulls_by_bit);
  return 0;
}

/* Points a->picks at column c of each sample. */
static void assembly_pick(pbatch_t *b, assembly_t *a, int c) {
  for (int i = 0; i < b->n; i++) {
    a->picks[i].view = &b->sample_unit[i]->views[c];
    a->picks[i].row = b->samples[i].row;
  }
}

/* The bytes of each column in the batch (a->sizes) and their sum
 * (a->total).  Returns 0, or -1 with b->error and b->message set. */
static int assembly_size(pbatch_t *b, assembly_t *a, layout_scratch_t **scratch) {
  const pq_field_t *schema = a->schema;
  const layout_rowplan_t *rp = a->rp;
  int64_t *sizes = a->sizes;
  a->total = 0;
  for (int c = 0; c < a->nc; c++) {
    if (rp && a->from_rows[c]) { /* from_rows is set only with a row plan */
      sizes[c] = layout_rows_column(rp, rp->slot_of[c], a->tmp, b->n, a->nulls_by_bit, 1, NULL,
                                    NULL, NULL, NULL);
      if (sizes[c] < 0) {
        b->error = (int)sizes[c];
        snprintf(b->message, sizeof(b->message), "column '%s': %s", schema->children[c].name,
                 "more than 2 GiB of values in one batch");
        return -1;
      }
      a->total += (uint64_t)sizes[c];
      continue;
    }
    assembly_pick(b, a, c);
    sizes[c] = layout_gather_size(&schema->children[c], a->picks, b->n, scratch);
    if (sizes[c] < 0) {
      b->error = (int)sizes[c];
      snprintf(b->message, sizeof(b->message), "column '%s': %s", schema->children[c].name,
               sizes[c] == LARDER_ELIMIT ? "more than 2 GiB of values in one batch"
                                         : larder_strerror((int)sizes[c]));
      return -1;
    }
    a->total += (uint64_t)sizes[c];
  }
  return 0;
}

/* Takes the batch's room in the arena: one region, or one per column
 * (b->parts) when no gap holds it whole.  Returns its offset (the lowest
 * part's), or -1 with b->error set (LARDER_EAGAIN: no room yet; else with
 * b->message). */
static int64_t assembly_place(pbatch_t *b, assembly_t *a) {
  stream_t *s = b->s;
  int nc = a->nc;
  int64_t off = arena_alloc(s->arena, a->total);
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
      return -1;
    }
    for (int c = 0; c < nc; c++) lens[c] = (uint64_t)a->sizes[c];
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
    return -1;
  }
  if (off < 0) {
    b->error = (int)off;
    snprintf(b->message, sizeof(b->message),
             "a batch of %llu bytes does not fit the stream's %llu-byte arena; open the "
             "stream with a larger arena_bytes or a smaller batch_size",
             (unsigned long long)a->total, (unsigned long long)arena_size(s->arena));
    return -1;
  }
  return off;
}

/* Writes the columns into the batch's room at off (or its parts), and
 * their arrays' descriptors into b->nodes.  Returns 0, or -1 with b->error
 * and b->message set. */
static int assembly_fill(pbatch_t *b, assembly_t *a, layout_scratch_t **scratch, int64_t off) {
  stream_t *s = b->s;
  const pq_field_t *schema = a->schema;
  const layout_rowplan_t *rp = a->rp;
  uint8_t *base = arena_base(s->arena);
  uint8_t *dst = base + off;
  int node = 0, nv = 0;
  for (int c = 0; c < a->nc; c++) {
    if (b->parts) dst = base + b->parts[c];
    if (rp && a->from_rows[c]) { /* from_rows is set only with a row plan */
      int p = rp->slot_of[c];
      int var = rp->packed[p].kind == LAYOUT_SLOT_VAR || rp->packed[p].kind == LAYOUT_SLOT_LIST;
      if (var) a->vslots[nv] = p;
      layout_rows_column(rp, p, a->tmp, b->n, a->nulls_by_bit, 0, base, dst, b->nodes + node,
                         var ? &a->vcursor[nv] : NULL);
      nv += var;
      dst += a->sizes[c];
      node += layout_rows_num_nodes(rp, rp->slot_of[c]);
      continue;
    }
    assembly_pick(b, a, c);
    int rc =
        layout_gather(&schema->children[c], a->picks, b->n, scratch, base, dst, b->nodes + node);
    if (rc) {
      b->error = rc;
      snprintf(b->message, sizeof(b->message), "column '%s': %s", schema->children[c].name,
               larder_strerror(rc));
      return -1;
    }
    dst += a->sizes[c];
    node += layout_num_nodes(&schema->children[c]);
  }
  if (nv) layout_rows_values(rp, a->vslots, a->vcursor, nv, a->tmp, b->n);
  return 0;
}

static void copy_done(void *arg, int status, const char *err);

/* CUDA: starts copying the batch's bytes to the same offsets of the device
 * region; the loop publishes the batch once copy_done says they are there
 * (cuda.h).  Returns 0 (copy_done will run), or the error, with b->message
 * set (no copy runs). */
static int assembly_copy_cuda(pbatch_t *b, assembly_t *a, int64_t off) {
  stream_t *s = b->s;
  /* b is the loop's once the copy started (copy_done may run at once):
   * nothing of it is read after. */
  int split = b->parts != NULL;
  int n = split ? a->nc : 1;
  uint64_t one_off = (uint64_t)off, one_len = a->total;
  uint64_t *offs = &one_off, *lens = &one_len;
  if (split) {
    offs = malloc((size_t)n * sizeof(uint64_t));
    lens = malloc((size_t)n * sizeof(uint64_t));
    if (offs == NULL || lens == NULL) {
      free(offs);
      free(lens);
      snprintf(b->message, sizeof(b->message), "out of memory");
      return LARDER_ENOMEM;
    }
    for (int c = 0; c < n; c++) {
      offs[c] = (uint64_t)b->parts[c];
      lens[c] = (uint64_t)a->sizes[c];
    }
  }
  /* Set before the copy starts: its end may reach the loop before this
   * task returns. */
  b->copy_state = PB_COPY_RUNNING;
  int rc = cuda_region_copy(s->cuda, offs, lens, n, copy_done, b, b->message, sizeof(b->message));
  if (rc) b->copy_state = PB_COPY_NONE;
  if (split) {
    free(offs);
    free(lens);
  }
  return rc;
}

/* Assembles batch b on a worker: sizes its columns, takes its room in the
 * arena, and writes them there from its units (READY, held by b).  On
 * failure b->error (and b->message) say why, and the batch holds no room. */
static void assemble_work(work_t *w) {
  pbatch_t *b = w->data;
  stream_t *s = b->s;
  uint64_t t0 = util_now_ns();
  assembly_t a = {0};
  layout_scratch_t *scratch = NULL;
  a.schema = s->ds->schema;
  a.nc = a.schema->num_children;
  a.rp = s->ds->rowplan;
  a.picks = malloc((size_t)b->n * sizeof(layout_pick_t));
  a.sizes = malloc((size_t)(a.nc ? a.nc : 1) * sizeof(int64_t));
  for (int i = 0; i < b->n; i++) b->sample_unit[i] = b->units[b->sample_slot[i]];
  if (a.picks == NULL || a.sizes == NULL) {
    b->error = LARDER_ENOMEM;
    goto out;
  }
  /* The packed columns come from the units' row blocks: copy each sample's
   * fixed part once, split the fixed parts into columns, then copy each
   * sample's inline values (layout_rows_values). */
  a.from_rows = calloc((size_t)(a.nc ? a.nc : 1), 1);
  if (a.from_rows == NULL) {
    b->error = LARDER_ENOMEM;
    goto out;
  }
  if (a.rp && assembly_copy_rows(b, &a) != 0) {
    b->error = LARDER_ENOMEM;
    goto out;
  }
  if (assembly_size(b, &a, &scratch) != 0) goto out;
  int64_t off = assembly_place(b, &a);
  if (off < 0) goto out;
  b->arena_off = off;
  b->arena_len = a.total;
  int rc = assembly_fill(b, &a, &scratch, off) != 0 ? b->error : 0;
  if (rc == 0 && s->cuda) {
    rc = assembly_copy_cuda(b, &a, off);
    if (rc) b->error = rc;
  }
  if (rc) {
    stream_room_free(s, off, b->parts, b->num_parts);
    free(b->parts);
    b->parts = NULL;
  }
out:
  layout_scratch_free(scratch);
  assembly_free(&a);
  b->assemble_ns = util_now_ns() - t0;
}

static void assembly_end(pbatch_t *b);

static void assemble_done(work_t *w, int status) {
  pbatch_t *b = w->data;
  stream_t *s = b->s;
  if (status == UV_ECANCELED && b->error == 0) b->error = LARDER_ESHUTDOWN;
  STATS_ADD(&s->srv->stats, assemble_ns, b->assemble_ns);
  STATS_ADD(&s->st, assemble_ns, b->assemble_ns);
  if (b->copy_state == PB_COPY_RUNNING) {
    /* The copy to the device goes on: its end finishes the assembly, and
     * holds this task's place in s->tasks until then. */
    b->copy_state = PB_COPY_AWAITED;
    return;
  }
  b->copy_state = PB_COPY_NONE;
  s->tasks--;
  assembly_end(b);
}

/* The copies of a CUDA batch ended (loop thread). */
static void copy_done(void *arg, int status, const char *err) {
  pbatch_t *b = arg;
  stream_t *s = b->s;
  if (status && b->error == 0) {
    /* Its room is free again, and the stream fails (assembly_end). */
    b->error = status;
    snprintf(b->message, sizeof(b->message), "%s", err);
    stream_room_free(s, b->arena_off, b->parts, b->num_parts);
    free(b->parts);
    b->parts = NULL;
    b->num_parts = 0;
  }
  if (b->copy_state == PB_COPY_RUNNING) {
    b->copy_state = PB_COPY_DONE; /* assemble_done finishes it */
    return;
  }
  b->copy_state = PB_COPY_NONE;
  s->tasks--;
  assembly_end(b);
}

/* What an assembly's end does to its batch and stream, once the task and
 * any copy to the device are over (loop thread; s->tasks no longer
 * counts it). */
static void assembly_end(pbatch_t *b) {
  stream_t *s = b->s;
  if (s->closed) {
    if (b->error == 0) stream_room_free(s, b->arena_off, b->parts, b->num_parts);
    pbatch_t **pp = &s->q_head;
    while (*pp && *pp != b) pp = &(*pp)->next;
    if (*pp) *pp = b->next;
    stream_pbatch_free(s, b);
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
  /* The batch keeps its units until it is sent (stream_pbatch_free): the pump may
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
    if (u->from_cache && u->readback) STATS_ADD(&s->st, cache_readback_bytes, db);
    else if (u->from_cache) STATS_ADD(&s->st, cache_hit_bytes, db);
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
  if (work_queue_quiet(s->srv->pool, &b->work, assemble_work, assemble_done, &s->window_full) !=
      0) {
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
    uint64_t *layout =
        malloc((size_t)b->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS * sizeof(uint64_t));
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
  s->sent[s->num_sent++] =
      (sent_t){b->seq, b->arena_off, b->parts, b->num_parts, (uint64_t)b->n, bytes};
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
    stream_room_free(s, s->sent[i].arena_off, s->sent[i].parts, s->sent[i].num_parts);
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
    stream_fail(s, LARDER_EPROTO, "the ring claims %llu releases, but the client holds %d batches",
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

/* ------------------------------------------------------------------------ */

static void pump_once(stream_t *s);

/* Runs the stream as far as it can go.  A send that fails closes the
 * connection, and with it the stream: it is freed once the pump returns,
 * not under it, since the pump goes on to read it after the send (as when
 * a connection's client vanishes as a batch goes out). */
void stream_pump(stream_t *s) {
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
  stream_advance_pins(s);
  stream_advance_read_ahead(s);
  while (!s->exhausted && s->validating == 0 && s->stale_msg == NULL &&
         s->q_len < (int)s->prefetch &&
         (s->q_len == 0 || (uint64_t)(s->q_len + 1) * s->params.batch_size <= PLAN_MAX_SAMPLES)) {
    int rc = stream_plan_one(s);
    if (rc == LARDER_EAGAIN) break;
    if (rc) {
      stream_fail(s, rc, "cannot plan the next batch: %s", larder_strerror(rc));
      return;
    }
  }
  /* Start assembling every planned batch whose units are all in memory.
   * Waiting on a unit that is still loading re-runs this pump when the load
   * ends. */
  stream_promote_orders(s);
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
    stream_pbatch_free(s, b);
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
        stream_room_free(s, b->arena_off, b->parts, b->num_parts);
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
    stream_fail_stale(s);
    return;
  }
  if (s->exhausted && s->q_head == NULL && !s->end_sent) send_end(s);
}

void stream_release(stream_t *s, const Larder__Release *rel) {
  if (release_one(s, rel->seq, rel->wait_ns, rel->compute_ns) == 0) stream_pump(s);
}
