/*
 * units.c: the pool of decoded units in memory.
 *
 * A unit is loaded once however many streams need it: every stream (rank,
 * job) that asks for the same unit of the same object with the same columns
 * gets the same pool entry, and only the first ask starts a load.  A load
 * reads each column from the cache, or, when any is missing, decodes the
 * unit from its Parquet file.  Decoding continues into the following units
 * of the same row group while the cache admits them and does not hold them
 * yet, so a cold epoch decodes each row group's pages once, although the
 * shuffle asks for its units in random order.
 *
 * Units nobody references stay in memory on an LRU list until the pool
 * needs room (memory_limit); referenced units are never freed.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/crc32c.h"
#include "log.h"
#include "serve/units.h"
#include "serve/server.h"
#include "util.h"

#define DECODE_RUN_MAX 64 /* units one load may decode ahead into the cache */

static uint64_t unit_hash(uint64_t object_id, uint32_t rg, uint64_t row_start, uint32_t rows,
                          uint64_t columns_hash) {
  uint64_t k[5] = {object_id, rg, row_start, rows, columns_hash};
  return util_hash64(k, sizeof(k), 0x756e6974ull);
}

static uint64_t columns_hash_of(const dataset_t *ds) {
  return util_hash64(ds->column_hash, (size_t)ds->num_columns * 8, 0x636f6c73ull);
}

/*
 * The units table and the row-group buffers' table are keyed by what
 * clients open (any number of files and row groups), so both grow with
 * their entries (htab.h): the loop looks a unit up on every acquire and
 * read-ahead, and must never walk a long chain (4096 fixed buckets made
 * chains of 250 at a million units, and the loop stopped answering).
 */
void units_init(server_t *srv, void (*room)(server_t *srv)) {
  srv->units_room = room;
  memset(&srv->unit_table, 0, sizeof(srv->unit_table));
  memset(&srv->rgbuf_table, 0, sizeof(srv->rgbuf_table));
}

static void lru_remove(server_t *srv, unit_t *u) {
  if (u->lru_prev) u->lru_prev->lru_next = u->lru_next;
  else if (srv->lru_head == u) srv->lru_head = u->lru_next;
  if (u->lru_next) u->lru_next->lru_prev = u->lru_prev;
  else if (srv->lru_tail == u) srv->lru_tail = u->lru_prev;
  u->lru_prev = u->lru_next = NULL;
}

static void lru_push(server_t *srv, unit_t *u) {
  u->lru_prev = srv->lru_tail;
  u->lru_next = NULL;
  if (srv->lru_tail) srv->lru_tail->lru_next = u;
  else srv->lru_head = u;
  srv->lru_tail = u;
}

static void unit_free_data(unit_t *u) {
  for (int c = 0; c < u->num_columns; c++) {
    if (u->cached && u->cached[c]) store_value_free(u->cached[c]);
    if (u->blobs) free(u->blobs[c]);
  }
  free(u->cached);
  free(u->blobs);
  free(u->views);
  layout_rows_free(&u->rowblock);
  u->cached = NULL;
  u->blobs = NULL;
  u->views = NULL;
}

static void unit_destroy(server_t *srv, unit_t *u) {
  htab_remove(&srv->unit_table, &u->hnode);
  srv->unit_bytes -= u->bytes;
  STATS_SUB(&srv->stats, memory_bytes, u->bytes);
  unit_free_data(u);
  free(u->message);
  free(u->waiters);
  free(u);
}

void units_trim_rgbufs(server_t *srv);

/*
 * Idle decoded units go before idle row-group buffers.  A remote row group
 * that the cache does not hold is decoded unit by unit from its buffer, and
 * the shuffle spreads a row group's units over the whole epoch; an idle
 * unit, by contrast, is needed again only next epoch (and is in the cache
 * if the cache took it).  With buffers trimmed first, a memory pool smaller
 * than an epoch's decoded bytes would drop every buffer as soon as its unit
 * was decoded, and each row group would be fetched once per unit instead of
 * once (3.5 times the dataset's bytes per epoch in the test).  Tested by
 * remote_bounded_fetch.
 */
void units_trim(server_t *srv) {
  while (srv->unit_bytes > srv->cfg.memory_limit && srv->lru_head) {
    unit_t *u = srv->lru_head;
    lru_remove(srv, u);
    unit_destroy(srv, u);
  }
  units_trim_rgbufs(srv);
}

/* ------------------------------------------------------------------------ */
/* Row-group buffers: the fetched bytes of a remote row group                */

/*
 * A remote unit that is not cached decodes from its row group's projected
 * column chunks, fetched with range requests (chunks closer than the merge
 * gap share one request: fetch_merge_gap, or less where the link's measured
 * round trip reads fewer bytes, fetch_merge_gap_auto).  Every unit of every
 * stream that needs the same row group of the same object with the same
 * columns shares one buffer, so concurrent ranks fetch each byte once.
 * Buffers of other projections of the same row group lend their bytes: a
 * new buffer takes each column chunk that another buffer's requests cover
 * (fetched or still arriving) from that buffer, holding a reference on it,
 * and asks the network only for the chunks nobody has, so two jobs with
 * projections [id, y] and [id, img] fetch id once.  Buffers nobody uses
 * stay in memory (within memory_limit) for the row group's other units.
 */
enum { RB_FETCHING = 0, RB_READY = 1, RB_FAILED = 2 };

/* One range request.  A merged range longer than fetch_part_bytes is asked
 * for in parts, so that requests stay short: the fetch queue then reorders
 * within a fraction of a second when a trainer starts waiting for a row
 * group, instead of sharing the link with long read-ahead transfers. */
typedef struct rb_part {
  struct rgbuf *b;
  int range; /* index in ranges */
  uint64_t offset, length;
  fetch_req_t *req; /* while it runs */
  int done;         /* its callback ran (maybe inside fetch_get) */
  uint8_t *data;
} rb_part_t;

struct rgbuf {
  htab_node_t hnode; /* in srv->rgbuf_table; hnode.hash is its hash */
  uint64_t object_id;
  uint32_t rg;
  uint64_t columns_hash;
  int refs;
  int state;
  int error;
  char *message;
  int num_ranges;
  pq_range_t *ranges; /* the requests it made itself, merged across gaps */
  uint8_t **data;     /* per range, once every part has arrived */
  /* The projection's column chunks, sorted and disjoint, each served from
   * the buffer's own ranges or from a lender's (cdata: set once ready). */
  int num_chunks;
  pq_range_t *chunks;
  rgbuf_t **chunk_from; /* per chunk: the lender, or NULL for its own */
  const uint8_t **cdata;
  rgbuf_t **lenders; /* buffers it holds a reference on, each once */
  int num_lenders;
  rgbuf_t **borrowers; /* buffers waiting for this one to arrive */
  int num_borrowers, cap_borrowers;
  /* Read from the staging area instead of fetched: its own ranges lie in
   * the pieces of the file stage_fd, which the first decoding worker to
   * need them reads whole and checks (st_mu; st_state 1 once done, or a
   * negative code), its own chunks' cdata staying NULL.  st_bad: a worker
   * found the file damaged; the loop drops the entry (rb_destroy). */
  int stage_fd;
  int unlisted; /* taken out of rgbuf_table (rb_unlist) */
  stage_piece_t *st_pieces;
  int st_n;
  uint8_t **st_data;
  pthread_mutex_t st_mu;
  atomic_int st_state, st_bad;
  int stage_wanted;    /* to be staged once fetched: the cache will not keep it */
  int stage_tried;     /* offered to the staging area once already */
  uint64_t priority;   /* the row group's cache priority */
  uint64_t stage_rank; /* its priority in the staging area (rb_acquire) */
  rb_part_t *parts;    /* the requests: each range cut into parts */
  int num_parts;
  int pending;         /* parts not yet arrived */
  int ahead;           /* fetched for read-ahead; nobody waits yet */
  uint64_t mem_ahead;  /* bytes counted in srv->rgbuf_ahead_bytes: read
                              ahead for a row group the cache will not keep,
                              and not used yet */
  int held;            /* held (one reference) until every unit of the
                              row group has decoded from it, or a minute */
  uint32_t units_left; /* units of the row group not yet decoded */
  uint64_t held_ns;    /* when the hold began */
  uint64_t held_bytes; /* counted in srv->rgbuf_held_bytes */
  uint64_t charged;    /* bytes counted in srv->rgbuf_fetching_bytes */
  uint64_t bytes;
  uint64_t fetch_ns;
  uint64_t size; /* the object's version when the stream opened */
  char etag[128];
  char last_modified[64];
  char where[400]; /* the object's URL, redacted, for messages */
  unit_t **waiters;
  int num_waiters, cap_waiters;
  server_t *srv;
  rgbuf_t *lru_prev, *lru_next;
  rgbuf_t *held_prev, *held_next; /* in srv->rgbuf_held_head while held */
};

static int queue_load(server_t *srv, unit_t *u);
static int cached_already(store_t *st, const dataset_t *ds, uint32_t k);

static void rb_lru_remove(server_t *srv, rgbuf_t *b) {
  if (b->lru_prev) b->lru_prev->lru_next = b->lru_next;
  else if (srv->rgbuf_lru_head == b) srv->rgbuf_lru_head = b->lru_next;
  if (b->lru_next) b->lru_next->lru_prev = b->lru_prev;
  else if (srv->rgbuf_lru_tail == b) srv->rgbuf_lru_tail = b->lru_prev;
  b->lru_prev = b->lru_next = NULL;
}

/* The list of held buffers (rgbuf_t.held), so that expiring holds walks
 * them only, not every buffer. */
static void rb_held_link(server_t *srv, rgbuf_t *b) {
  b->held_prev = NULL;
  b->held_next = srv->rgbuf_held_head;
  if (b->held_next) b->held_next->held_prev = b;
  srv->rgbuf_held_head = b;
}

static void rb_held_unlink(server_t *srv, rgbuf_t *b) {
  if (b->held_prev) b->held_prev->held_next = b->held_next;
  else if (srv->rgbuf_held_head == b) srv->rgbuf_held_head = b->held_next;
  if (b->held_next) b->held_next->held_prev = b->held_prev;
  b->held_prev = b->held_next = NULL;
}

static void rb_release(server_t *srv, rgbuf_t *b);

/* Takes b out of the table, so that no new unit or lender finds it; it
 * goes when its last reference does. */
static void rb_unlist(server_t *srv, rgbuf_t *b) {
  if (b->unlisted) return;
  htab_remove(&srv->rgbuf_table, &b->hnode);
  b->unlisted = 1;
}

static void rb_destroy(server_t *srv, rgbuf_t *b) {
  rb_unlist(srv, b);
  /* A borrower holds a reference on each lender, so no borrower is left;
   * a lender still arriving must forget b before b goes. */
  for (int i = 0; i < b->num_lenders; i++) {
    rgbuf_t *l = b->lenders[i];
    for (int k = 0; k < l->num_borrowers; k++)
      if (l->borrowers[k] == b) {
        l->borrowers[k] = l->borrowers[--l->num_borrowers];
        break;
      }
  }
  if (b->held) rb_held_unlink(srv, b);
  for (int i = 0; i < b->num_parts; i++) {
    if (b->parts[i].req) fetch_cancel(b->parts[i].req);
    free(b->parts[i].data);
  }
  for (int i = 0; i < b->num_ranges; i++)
    if (b->data) free(b->data[i]);
  srv->rgbuf_fetching_bytes -= b->charged;
  srv->rgbuf_ahead_bytes -= b->mem_ahead;
  if (b->state == RB_READY) {
    srv->unit_bytes -= b->bytes;
    STATS_SUB(&srv->stats, memory_bytes, b->bytes);
  }
  free(b->ranges);
  free(b->data);
  free(b->parts);
  free(b->waiters);
  free(b->message);
  free(b->chunks);
  free(b->chunk_from);
  free(b->cdata);
  free(b->borrowers);
  if (b->stage_fd >= 0) {
    close(b->stage_fd);
    if (atomic_load(&b->st_bad) && srv->stage) stage_drop(srv->stage, b->object_id, b->rg);
    for (int i = 0; b->st_data && i < b->st_n; i++) free(b->st_data[i]);
    pthread_mutex_destroy(&b->st_mu);
  }
  free(b->st_data);
  free(b->st_pieces);
  rgbuf_t **lenders = b->lenders;
  int nl = b->num_lenders;
  free(b);
  for (int i = 0; i < nl; i++) rb_release(srv, lenders[i]);
  free(lenders);
}

/* The bytes b holds once fetched: its ranges' lengths. */
static uint64_t rb_bytes(const rgbuf_t *b) {
  uint64_t n = 0;
  if (b->stage_fd >= 0) return 0; /* read from the staging area */
  for (int i = 0; i < b->num_ranges; i++) n += b->ranges[i].length;
  return n;
}

static void rb_stage(rgbuf_t *b);

static void rb_release(server_t *srv, rgbuf_t *b) {
  if (--b->refs > 0) return;
  if (b->state == RB_READY && b->stage_fd < 0 && b->units_left > 0 && !b->stage_tried &&
      srv->stage && !srv->shutting_down) {
    /* Idle with units of its row group still to decode, which the cache
     * did not take after all (a row group at the edge of what it keeps):
     * staged now, so that they do not fetch it again once it is trimmed.
     * The write holds a reference until it is done. */
    rb_stage(b);
    if (b->refs > 0) return;
  }
  if (b->state == RB_READY && b->stage_fd >= 0) {
    /* Nothing in memory to keep, but a descriptor: opening the entry
     * again costs less than holding descriptors for idle row groups. */
    rb_destroy(srv, b);
  } else if (b->state == RB_READY) {
    b->lru_prev = srv->rgbuf_lru_tail;
    if (srv->rgbuf_lru_tail) srv->rgbuf_lru_tail->lru_next = b;
    else srv->rgbuf_lru_head = b;
    srv->rgbuf_lru_tail = b;
    b->lru_next = NULL;
  } else if (b->state == RB_FAILED) {
    rb_destroy(srv, b);
  }
}

/* Joins each range's parts into one buffer, as the Parquet reader reads a
 * column chunk from one contiguous range. */
static void rb_assemble(rgbuf_t *b) {
  for (int r = 0; r < b->num_ranges && !b->error; r++)
    if (b->ranges[r].length == 0 && (b->data[r] = calloc(1, 1)) == NULL) b->error = LARDER_ENOMEM;
  for (int p = 0; p < b->num_parts && !b->error;) {
    int r = b->parts[p].range;
    int q = p;
    while (q < b->num_parts && b->parts[q].range == r) q++;
    if (q - p == 1) {
      b->data[r] = b->parts[p].data;
      b->parts[p].data = NULL;
    } else {
      b->data[r] = malloc(b->ranges[r].length ? b->ranges[r].length : 1);
      if (b->data[r] == NULL) {
        b->error = LARDER_ENOMEM;
        b->message = strdup("out of memory joining a row group's parts");
        break;
      }
      for (int i = p; i < q; i++) {
        memcpy(b->data[r] + (b->parts[i].offset - b->ranges[r].offset), b->parts[i].data,
               b->parts[i].length);
        free(b->parts[i].data);
        b->parts[i].data = NULL;
      }
    }
    p = q;
  }
}

/* The index of the range of r (n of them, sorted and disjoint) that holds
 * [off, off + len), or -1. */
static int range_index(const pq_range_t *r, int n, uint64_t off, uint64_t len) {
  int lo = 0, hi = n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (off < r[mid].offset) hi = mid - 1;
    else if (off >= r[mid].offset + r[mid].length) lo = mid + 1;
    else return len <= r[mid].offset + r[mid].length - off ? mid : -1;
  }
  return -1;
}

/* The index of b's own range that holds [off, off + len), or -1. */
static int rb_range_of(const rgbuf_t *b, uint64_t off, uint64_t len) {
  return range_index(b->ranges, b->num_ranges, off, len);
}

/* Points each chunk at its bytes, in b's own ranges or its lender's (ready
 * by now: b waited for it). */
static void rb_resolve(rgbuf_t *b) {
  static const uint8_t empty[1];
  for (int c = 0; c < b->num_chunks; c++) {
    const pq_range_t *k = &b->chunks[c];
    const rgbuf_t *src = b->chunk_from[c] ? b->chunk_from[c] : b;
    int r = k->length ? rb_range_of(src, k->offset, k->length) : -1;
    if (k->length == 0) {
      b->cdata[c] = empty;
    } else if (src == b && b->stage_fd >= 0 && r >= 0) {
      b->cdata[c] = NULL; /* read from the staging area (rb_read) */
    } else if (r < 0 || src->data == NULL || src->data[r] == NULL) {
      b->error = LARDER_EIO;
      b->message = strdup("a column chunk's bytes are missing from the row group's ranges");
      return;
    } else {
      b->cdata[c] = src->data[r] + (k->offset - src->ranges[r].offset);
    }
  }
}

/* Writing a fetched buffer to the staging area, on a worker. */
typedef struct stage_write_task {
  work_t work;
  rgbuf_t *b;
  stage_entry_t *e;
  int rc;
} stage_write_task_t;

static int stage_room(void *arg, uint64_t bytes) { return store_disk_room(arg, bytes); }

static void stage_write_work(work_t *w) {
  stage_write_task_t *t = w->data;
  server_t *srv = t->b->srv;
  t->rc = stage_write(srv->stage, t->e, (const uint8_t *const *)t->b->data,
                      srv->store ? stage_room : NULL, srv->store);
}

static void rb_unhold(rgbuf_t *b);

static void stage_write_done(work_t *w, int status) {
  stage_write_task_t *t = w->data;
  rgbuf_t *b = t->b;
  server_t *srv = b->srv;
  int rc = status ? LARDER_ESHUTDOWN : t->rc;
  stage_commit(srv->stage, t->e, rc);
  stage_stats_t st;
  stage_stats_get(srv->stage, &st);
  STATS_SET(&srv->stats, stage_bytes, st.bytes);
  if (rc == 0) {
    STATS_ADD(&srv->stats, stage_writes, 1);
    /* Its units read it from the disk now if it goes: no need to hold
     * the memory until the last of them, which the shuffle may put at
     * the end of the epoch. */
    rb_unhold(b);
  }
  free(t);
  rb_release(srv, b);
}

/* Offers a fetched buffer to the staging area; the write holds a
 * reference on it until done.  Loop thread. */
static void rb_stage(rgbuf_t *b) {
  server_t *srv = b->srv;
  b->stage_wanted = 0;
  b->stage_tried = 1;
  if (srv->stage == NULL || b->num_ranges == 0 || srv->shutting_down) return;
  stage_range_t *sr = malloc((size_t)b->num_ranges * sizeof(*sr));
  stage_write_task_t *t = calloc(1, sizeof(*t));
  stage_entry_t *e = NULL;
  if (sr && t) {
    for (int i = 0; i < b->num_ranges; i++)
      sr[i] = (stage_range_t){b->ranges[i].offset, b->ranges[i].length};
    e = stage_reserve(srv->stage, b->object_id, b->rg, b->stage_rank, sr, b->num_ranges);
  }
  free(sr);
  if (e == NULL) {
    free(t);
    return;
  }
  t->b = b;
  t->e = e;
  t->work.data = t;
  b->refs++;
  if (work_queue_background(srv->pool, &t->work, stage_write_work, stage_write_done) != 0) {
    stage_commit(srv->stage, e, LARDER_ENOMEM);
    free(t);
    b->refs--;
  }
}

static void rb_done(rgbuf_t *b) {
  server_t *srv = b->srv;
  srv->rgbuf_fetching_bytes -= b->charged;
  int freed = b->charged > 0;
  b->charged = 0;
  if (!b->error) rb_assemble(b);
  if (!b->error) rb_resolve(b);
  if (b->error) {
    b->bytes = 0;
    for (int i = 0; i < b->num_parts; i++) {
      free(b->parts[i].data);
      b->parts[i].data = NULL;
    }
  }
  b->state = b->error ? RB_FAILED : RB_READY;
  if (b->state == RB_READY) {
    srv->unit_bytes += b->bytes;
    STATS_ADD(&srv->stats, memory_bytes, b->bytes);
  }
  /* Each waiting unit holds a reference; hand the buffer on or fail it.
   * Hold one more meanwhile: the last waiter's release must not free the
   * buffer under this loop, and one read ahead with no waiter at all
   * becomes idle (or, failed, goes away) through the release below. */
  b->refs++;
  /* Borrowers waiting for its bytes: one lender fewer to wait for each
   * (failed with it when it failed).  The list is taken first: a borrower
   * that fails and goes away unlinks itself from it. */
  int nb = b->num_borrowers;
  rgbuf_t **bs = b->borrowers;
  b->borrowers = NULL;
  b->num_borrowers = b->cap_borrowers = 0;
  for (int i = 0; i < nb; i++) {
    rgbuf_t *x = bs[i];
    if (b->state == RB_FAILED && !x->error) {
      x->error = b->error;
      x->message = strdup(b->message ? b->message : larder_strerror(b->error));
    }
    if (--x->pending == 0) rb_done(x);
  }
  free(bs);
  int n = b->num_waiters;
  unit_t **ws = b->waiters;
  b->waiters = NULL;
  b->num_waiters = b->cap_waiters = 0;
  for (int i = 0; i < n; i++) {
    unit_t *u = ws[i];
    u->waiting_rgbuf = NULL;
    if (b->state == RB_FAILED) {
      u->error = b->error;
      free(u->message);
      u->message = strdup(b->message ? b->message : larder_strerror(b->error));
      u->fetch_ns = b->fetch_ns;
      u->rgbuf = NULL;
      rb_release(srv, b);
      /* The load runs once more only to report the failure (load_work
       * returns at once on an error), through load_done. */
      u->need_fetch = 0;
      u->retry = 0;
      queue_load(srv, u);
    } else {
      u->rgbuf = b;
      u->rg_fetched = rb_bytes(b);
      u->fetch_ns = b->fetch_ns;
      if (queue_load(srv, u) != 0) {
        u->rgbuf = NULL;
        rb_release(srv, b);
      }
    }
  }
  free(ws);
  if (b->state == RB_READY && b->stage_wanted) rb_stage(b);
  rb_release(srv, b);
  /* Room in the read-ahead budget: the streams may ask for more. */
  if (freed && !srv->in_read_ahead) {
    srv->in_read_ahead = 1;
    if (srv->units_room) srv->units_room(srv);
    srv->in_read_ahead = 0;
  }
}

/* A part's callback.  fetch_get may call it before it returns (a part
 * served from a whole-object download, a shutdown), so the part is found
 * through arg, never through the request pointer. */
static void on_range(fetch_req_t *req, const fetch_result_t *res, void *arg) {
  rb_part_t *part = arg;
  rgbuf_t *b = part->b;
  int i = (int)(part - b->parts);
  {
    part->req = NULL;
    part->done = 1;
    if (res->status) {
      if (!b->error) {
        b->error = res->status;
        b->message = strdup(res->message ? res->message : larder_strerror(res->status));
      }
    } else if (!remote_same_version(b->size, b->etag, b->last_modified, res->object_size, res->etag,
                                    res->last_modified)) {
      /* The object changed after the stream opened: never decode a mix.
       * Size, ETag and Last-Modified are all compared: on a server without
       * ETags, a replaced object would otherwise be decoded as old footer
       * and new pages.  Tested by remote_hostile_no_etag. */
      if (!b->error) {
        b->error = LARDER_EIO;
        char m[1024];
        snprintf(m, sizeof(m),
                 "%.400s changed since the stream opened or the prefetch began (size %llu, ETag "
                 "%.100s, Last-Modified %.60s; now %llu, %.100s, %.60s); reopen the stream, or "
                 "run the prefetch again",
                 b->where, (unsigned long long)b->size, b->etag[0] ? b->etag : "none",
                 b->last_modified[0] ? b->last_modified : "none",
                 (unsigned long long)res->object_size, res->etag[0] ? res->etag : "none",
                 res->last_modified[0] ? res->last_modified : "none");
        b->message = strdup(m);
      }
    } else {
      uint64_t len;
      b->parts[i].data = fetch_req_steal(req, &len);
      b->bytes += len;
      if (res->fetch_ns > b->fetch_ns) b->fetch_ns = res->fetch_ns;
      if (len != b->parts[i].length && !b->error) {
        /* fetch.c checks lengths; this guards the join below all the same. */
        b->error = LARDER_EIO;
        b->message = strdup("a range request returned a different length than asked");
      }
    }
  }
  fetch_req_free(req);
  if (--b->pending == 0) rb_done(b);
}

/* Moves a read-ahead buffer's queued requests ahead of other read-ahead:
 * a trainer now waits for it. */
static void rb_unhold(rgbuf_t *b) {
  server_t *srv = b->srv;
  srv->rgbuf_ahead_bytes -= b->mem_ahead;
  b->mem_ahead = 0;
  if (!b->held) return;
  b->held = 0;
  rb_held_unlink(srv, b);
  srv->rgbuf_held_bytes -= b->held_bytes;
  b->held_bytes = 0;
  rb_release(srv, b);
}

/* Moves b's requests, and those of the lenders it waits for, ahead of
 * read-ahead.  Lenders were made before their borrowers, so this ends. */
static void rb_promote_fetch(rgbuf_t *b) {
  for (int i = 0; i < b->num_lenders; i++)
    if (b->lenders[i]->state == RB_FETCHING) rb_promote_fetch(b->lenders[i]);
  if (!b->ahead) return;
  b->ahead = 0;
  for (int i = 0; i < b->num_parts; i++)
    if (b->parts[i].req) fetch_promote(b->parts[i].req);
}

static void rb_promote(rgbuf_t *b) {
  /* Used now: no longer read-ahead waiting for its first use. */
  b->srv->rgbuf_ahead_bytes -= b->mem_ahead;
  b->mem_ahead = 0;
  rb_promote_fetch(b);
}

/* The buffer of unit_index's row group, or NULL. */
static rgbuf_t *rb_find(server_t *srv, const dataset_t *ds, uint32_t unit_index, uint64_t *hash) {
  const dataset_unit_t *du = &ds->units[unit_index];
  const dataset_file_t *f = &ds->files[du->file];
  uint64_t ch = columns_hash_of(ds);
  /* Keyed by the row group only: its buffers for every projection share
   * a chain, where a new one looks for lenders. */
  uint64_t key[2] = {f->object_id, du->rg};
  uint64_t h = util_hash64(key, sizeof(key), 0x726762ull);
  if (hash) *hash = h;
  for (htab_node_t *n = htab_chain(&srv->rgbuf_table, h); n; n = n->next) {
    rgbuf_t *b = HTAB_ENTRY(n, rgbuf_t, hnode);
    if (n->hash == h && b->object_id == f->object_id && b->rg == du->rg && b->columns_hash == ch)
      return b;
  }
  return NULL;
}

uint64_t units_merge_gap(server_t *srv, const char *url) {
  if (!srv->cfg.fetch_merge_gap_auto || srv->fetch == NULL) return srv->cfg.fetch_merge_gap;
  return fetch_merge_gap(srv->fetch, url, srv->cfg.fetch_merge_gap);
}

/* A buffer of the same row group (another projection's), arriving or
 * ready, whose own requests cover chunk c; ready ones first.  NULL when
 * none does.  The chain holds one buffer per projection in use. */
static rgbuf_t *rb_lender(server_t *srv, uint64_t h, const rgbuf_t *b, const pq_range_t *c) {
  rgbuf_t *best = NULL;
  for (htab_node_t *n = htab_chain(&srv->rgbuf_table, h); n; n = n->next) {
    rgbuf_t *x = HTAB_ENTRY(n, rgbuf_t, hnode);
    if (x == b || n->hash != h || x->object_id != b->object_id || x->rg != b->rg ||
        x->state == RB_FAILED || x->error || x->data == NULL || x->stage_fd >= 0)
      continue;
    if (rb_range_of(x, c->offset, c->length) < 0) continue;
    if (best == NULL || (x->state == RB_READY && best->state != RB_READY)) best = x;
  }
  return best;
}

static rgbuf_t *rb_acquire(server_t *srv, dataset_t *ds, uint32_t unit_index, int ahead, int hold) {
  const dataset_unit_t *du = &ds->units[unit_index];
  const dataset_file_t *f = &ds->files[du->file];
  uint64_t ch = columns_hash_of(ds);
  uint64_t h;
  rgbuf_t *found = rb_find(srv, ds, unit_index, &h);
  if (found) {
    if (found->refs == 0 && found->state == RB_READY) rb_lru_remove(srv, found);
    found->refs++;
    if (!ahead) rb_promote(found);
    return found;
  }
  rgbuf_t *b = calloc(1, sizeof(*b));
  if (b == NULL) return NULL;
  b->stage_fd = -1;
  if (htab_insert(&srv->rgbuf_table, &b->hnode, h) != 0) {
    free(b);
    return NULL;
  }
  b->priority = du->priority;
  b->object_id = f->object_id;
  b->rg = du->rg;
  b->columns_hash = ch;
  b->refs = 1;
  b->srv = srv;
  b->size = f->size;
  snprintf(b->etag, sizeof(b->etag), "%s", f->etag);
  snprintf(b->last_modified, sizeof(b->last_modified), "%s", f->last_modified);
  fetch_redact(f->path, b->where, sizeof(b->where));
  pq_range_t *chunks = NULL;
  pq_error err = {0, ""};
  int n = pq_projection_ranges(f->pq, f->proj, (int)du->rg, &chunks, &err);
  if (n < 0 || srv->fetch == NULL) {
    b->error = n < 0 ? n : LARDER_EUNSUPPORTED;
    b->message = strdup(n < 0 ? err.msg : "remote sources are not configured");
    b->state = RB_FAILED;
    free(chunks);
    return b;
  }
  b->chunks = chunks;
  b->num_chunks = n;
  size_t nn = (size_t)(n > 0 ? n : 1);
  b->chunk_from = calloc(nn, sizeof(rgbuf_t *));
  b->cdata = calloc(nn, sizeof(uint8_t *));
  b->lenders = calloc(nn, sizeof(rgbuf_t *));
  pq_range_t *ranges = malloc(nn * sizeof(pq_range_t));
  if (b->chunk_from == NULL || b->cdata == NULL || b->lenders == NULL || ranges == NULL) {
    free(ranges);
    b->error = LARDER_ENOMEM;
    b->message = strdup("out of memory");
    b->state = RB_FAILED;
    return b;
  }
  b->ranges = ranges;
  /* Chunks another buffer's requests cover are borrowed; the others are
   * merged across gaps below the merge gap into requests of b's own, but
   * never across a borrowed chunk, which would fetch its bytes again. */
  uint64_t gap = units_merge_gap(srv, f->path);
  int m = 0, joinable = 0;
  for (int i = 0; i < n; i++) {
    if (chunks[i].length == 0) continue;
    rgbuf_t *l = rb_lender(srv, h, b, &chunks[i]);
    if (l) {
      b->chunk_from[i] = l;
      int k = 0;
      while (k < b->num_lenders && b->lenders[k] != l) k++;
      if (k == b->num_lenders) b->lenders[b->num_lenders++] = l;
      joinable = 0;
      continue;
    }
    if (joinable && chunks[i].offset <= ranges[m - 1].offset + ranges[m - 1].length + gap) {
      uint64_t end = chunks[i].offset + chunks[i].length;
      if (end > ranges[m - 1].offset + ranges[m - 1].length)
        ranges[m - 1].length = end - ranges[m - 1].offset;
    } else {
      ranges[m++] = chunks[i];
    }
    joinable = 1;
  }
  b->num_ranges = m;
  /* Staged by an earlier fetch of these ranges: read from the disk. */
  if (srv->stage && m > 0) {
    stage_range_t *sr = malloc((size_t)m * sizeof(*sr));
    if (sr) {
      for (int i = 0; i < m; i++) sr[i] = (stage_range_t){ranges[i].offset, ranges[i].length};
      stage_piece_t *pieces = NULL;
      int np = 0;
      int fd = stage_lookup(srv->stage, b->object_id, b->rg, sr, m, &pieces, &np);
      free(sr);
      if (fd >= 0) {
        b->st_data = calloc((size_t)np, sizeof(uint8_t *));
        if (b->st_data == NULL) {
          close(fd);
          free(pieces);
        } else {
          b->stage_fd = fd;
          b->st_pieces = pieces;
          b->st_n = np;
          pthread_mutex_init(&b->st_mu, NULL);
          STATS_ADD(&srv->stats, stage_reads, 1);
        }
      }
    }
  }
  uint64_t part = srv->cfg.fetch_part_bytes ? srv->cfg.fetch_part_bytes : UINT64_MAX;
  /* Parts are counted without (length + part - 1) / part, which wraps to
   * 0 for a part of 0 (no splitting: UINT64_MAX) or of 2^63 and more, and
   * would undercount the parts the loop below writes.  Tested by
   * remote_part_sizes. */
  uint64_t parts = 0;
  for (int i = 0; i < m && b->stage_fd < 0; i++)
    parts += ranges[i].length / part + (ranges[i].length % part != 0);
  if (parts > INT_MAX / 2) parts = 0; /* refused below, as out of memory */
  int np = (int)parts;
  b->data = calloc((size_t)(m > 0 ? m : 1), sizeof(uint8_t *));
  b->parts = calloc((size_t)(np > 0 ? np : 1), sizeof(rb_part_t));
  if (b->data == NULL || b->parts == NULL || (np == 0 && m > 0 && b->stage_fd < 0)) {
    b->num_lenders = 0; /* no reference taken yet */
    b->error = LARDER_ENOMEM;
    b->message = strdup("out of memory");
    b->state = RB_FAILED;
    return b;
  }
  /* References on the lenders, and a place among the borrowers of each
   * one still arriving (b is done when they and its own parts are). */
  int lenders_pending = 0;
  for (int i = 0; i < b->num_lenders; i++) {
    rgbuf_t *l = b->lenders[i];
    if (l == NULL) continue; /* never: the first num_lenders are set */
    if (l->refs == 0 && l->state == RB_READY) rb_lru_remove(srv, l);
    l->refs++;
    if (l->state != RB_FETCHING) continue;
    if (l->num_borrowers == l->cap_borrowers) {
      int cap = l->cap_borrowers ? l->cap_borrowers * 2 : 4;
      rgbuf_t **nb = realloc(l->borrowers, (size_t)cap * sizeof(rgbuf_t *));
      if (nb == NULL) {
        if (!b->error) {
          b->error = LARDER_ENOMEM;
          b->message = strdup("out of memory");
        }
        continue;
      }
      l->borrowers = nb;
      l->cap_borrowers = cap;
    }
    l->borrowers[l->num_borrowers++] = b;
    lenders_pending++;
    if (!ahead) rb_promote_fetch(l);
  }
  for (int i = 0; i < n; i++)
    if (b->chunk_from[i]) STATS_ADD(&srv->stats, fetch_chunks_shared, 1);
  for (int i = 0; i < m && b->stage_fd < 0; i++)
    for (uint64_t off = 0; off < ranges[i].length;) {
      uint64_t len = ranges[i].length - off < part ? ranges[i].length - off : part;
      b->parts[b->num_parts++] = (rb_part_t){b, i, ranges[i].offset + off, len, NULL, 0, NULL};
      off += len;
    }
  b->state = RB_FETCHING;
  b->ahead = ahead;
  b->pending = b->num_parts + lenders_pending;
  for (int i = 0; i < b->num_parts; i++) b->charged += b->parts[i].length;
  srv->rgbuf_fetching_bytes += b->charged;
  /* A buffer read ahead for a row group that the cache will not keep is
   * held until each unit of the row group has decoded from it (they share
   * a window or two, as the shuffle keeps them together): trimming it
   * before its first use, or between two of its units, would fetch it
   * again within the epoch.  Holds take at most a quarter of memory_limit
   * (units_read_ahead stops there). */
  /* A row group's units are adjacent in ds->units (dataset.c makes them
   * in order), so this walks the row group's units only: the file's would
   * cost the loop O(units of the file) per row group, quadratic in a file
   * of many small row groups. */
  uint32_t first = unit_index;
  while (first > f->first_unit && ds->units[first - 1].rg == du->rg) first--;
  uint64_t rg_bytes = 0;
  for (uint32_t k = first; k < f->first_unit + f->num_units && ds->units[k].rg == du->rg; k++) {
    b->units_left += !(srv->store && cached_already(srv->store, ds, k));
    rg_bytes += ds->units[k].est_bytes;
  }
  /* Staged once fetched when the cache may not keep the row group: read
   * ahead for such a row group (hold), one whose priority is below what
   * half the cache keeps of the dataset (known before the cache fills, so
   * that a first epoch's demand fetches are staged too, and the edge of
   * what the cache keeps with them), or one the cache would turn away
   * now. */
  b->stage_wanted = srv->stage && b->stage_fd < 0 && b->units_left > 0 &&
                    (hold || du->priority > ds->stage_priority ||
                     (srv->store && !store_would_admit(srv->store, rg_bytes, du->priority)));
  /* In the staging area, the row groups the cache does not keep go before
   * those it keeps, staged only against an eviction (the top bit), each
   * kind in the cache's order. */
  b->stage_rank = ((uint64_t)(du->priority <= ds->resident_priority) << 63) | (du->priority >> 1);
  if (hold) {
    b->held = 1;
    rb_held_link(srv, b);
    b->held_ns = util_now_ns();
    b->held_bytes = b->charged;
    srv->rgbuf_held_bytes += b->held_bytes;
    b->refs++;
  }
  if (b->pending == 0) {
    rb_done(b);
    return b;
  }
  /* Hold a reference while asking: a part that completes inside fetch_get
   * must not see the buffer finish before every part has been asked for. */
  b->pending++;
  for (int i = 0; i < b->num_parts; i++) {
    rb_part_t *pt = &b->parts[i];
    fetch_range_t r = {.offset = pt->offset,
                       .length = pt->length,
                       .ahead = ahead,
                       .object_size = f->size,
                       .etag = f->etag,
                       .last_modified = f->last_modified};
    fetch_req_t *req = fetch_get(srv->fetch, f->path, &r, on_range, pt);
    if (req == NULL) {
      if (!b->error) {
        b->error = LARDER_ENOMEM;
        b->message = strdup("out of memory");
      }
      pt->done = 1;
      b->pending--;
    } else if (!pt->done) {
      pt->req = req;
    }
  }
  if (--b->pending == 0) rb_done(b);
  return b;
}

static int rb_wait(rgbuf_t *b, unit_t *u) {
  if (b->num_waiters == b->cap_waiters) {
    int cap = b->cap_waiters ? b->cap_waiters * 2 : 4;
    unit_t **w = realloc(b->waiters, (size_t)cap * sizeof(unit_t *));
    if (w == NULL) return LARDER_ENOMEM;
    b->waiters = w;
    b->cap_waiters = cap;
  }
  b->waiters[b->num_waiters++] = u;
  return 0;
}

void units_trim_rgbufs(server_t *srv) {
  while (srv->unit_bytes > srv->cfg.memory_limit && srv->rgbuf_lru_head) {
    rgbuf_t *b = srv->rgbuf_lru_head;
    rb_lru_remove(srv, b);
    rb_destroy(srv, b);
  }
}

/* A pq_source over a row-group buffer: reads are served from the fetched
 * ranges, which cover every byte the projection's reader asks for. */
static const uint8_t *rb_map(const pq_source *src, uint64_t off, size_t len) {
  const rgbuf_t *b = src->ctx;
  int c = range_index(b->chunks, b->num_chunks, off, len);
  if (c < 0 || b->cdata[c] == NULL) return NULL;
  return b->cdata[c] + (off - b->chunks[c].offset);
}

/* Reads b's staged pieces whole and checks their CRC32C, once, whichever
 * worker needs them first.  Returns 0 or a negative code (kept: every
 * later read fails alike, and the loop drops the entry).  A worker. */
static int rb_stage_load(rgbuf_t *b) {
  int st = atomic_load_explicit(&b->st_state, memory_order_acquire);
  if (st) return st < 0 ? st : 0;
  pthread_mutex_lock(&b->st_mu);
  st = atomic_load_explicit(&b->st_state, memory_order_relaxed);
  if (st == 0) {
    int rc = 0;
    for (int i = 0; i < b->st_n && rc == 0; i++) {
      const stage_piece_t *p = &b->st_pieces[i];
      uint8_t *d = malloc(p->length ? (size_t)p->length : 1);
      if (d == NULL) {
        rc = LARDER_ENOMEM;
        break;
      }
      b->st_data[i] = d;
      for (uint64_t done = 0; done < p->length && rc == 0;) {
        ssize_t n =
            pread(b->stage_fd, d + done, (size_t)(p->length - done), (off_t)(p->file_off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) rc = LARDER_EIO;
        else done += (uint64_t)n;
      }
      if (rc == 0 && cache_crc32c(0, d, (size_t)p->length) != p->crc) rc = LARDER_ECORRUPT;
    }
    if (rc && rc != LARDER_ENOMEM) {
      atomic_store(&b->st_bad, 1);
      log_warn(
          "the staged copy of row group %u of %s is damaged (%s): dropped, and fetched "
          "again by the next stream that needs it",
          b->rg, b->where, larder_strerror(rc));
    }
    st = rc ? rc : 1;
    atomic_store_explicit(&b->st_state, st, memory_order_release);
  }
  pthread_mutex_unlock(&b->st_mu);
  return st < 0 ? st : 0;
}

/* Reads from memory, or from the staging area's file (rgbuf_t.stage_fd);
 * a worker thread. */
static int rb_read(const pq_source *src, uint64_t off, size_t len, void *buf) {
  rgbuf_t *b = src->ctx;
  const uint8_t *p = rb_map(src, off, len);
  if (p) {
    memcpy(buf, p, len);
    return 0;
  }
  if (b->stage_fd < 0) return LARDER_ECORRUPT;
  int rc = rb_stage_load(b);
  if (rc) return rc;
  int lo = 0, hi = b->st_n - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    const stage_piece_t *r = &b->st_pieces[mid];
    if (off < r->offset) hi = mid - 1;
    else if (off >= r->offset + r->length) lo = mid + 1;
    else if (len > r->offset + r->length - off) break;
    else {
      memcpy(buf, b->st_data[mid] + (off - r->offset), len);
      return 0;
    }
  }
  return LARDER_ECORRUPT;
}

/* ------------------------------------------------------------------------ */
/* Loading, on a worker thread                                               */

static int unit_fail(unit_t *u, int code, const char *msg) {
  u->error = code;
  free(u->message);
  u->message = strdup(msg);
  return code;
}

/* Whether every column of unit k is already in the cache. */
static int cached_already(store_t *st, const dataset_t *ds, uint32_t k) {
  for (int c = 0; c < ds->num_columns; c++) {
    store_key_t key;
    dataset_column_key(ds, k, c, &key);
    if (!store_contains(st, &key)) return 0;
  }
  return 1;
}

/* Set while the cache refuses everything for want of disk space, so that
 * the log says so once, not once per unit (workers race for it). */
static int disk_full_warned;

/* Called when the cache refused a unit: warns once when the reason is a
 * full disk (ENOSPC, or less free space than the cache keeps) or failing
 * writes.  The units are still served, decoded from their sources. */
static void note_refusal(server_t *srv) {
  store_stats_t st;
  store_stats_get(srv->store, &st);
  if (!st.admission_disabled || __atomic_exchange_n(&disk_full_warned, 1, __ATOMIC_RELAXED)) return;
  char why[200];
  if (st.disk_needed_bytes > 0) {
    /* Not full: fuller than the cache lets it get.  Say by how much. */
    char have[32], want[32];
    util_human_bytes(have, sizeof(have), (double)st.disk_free_bytes);
    util_human_bytes(want, sizeof(want), (double)st.disk_needed_bytes);
    snprintf(why, sizeof(why),
             "too little space on the device: %s free, and a unit needs %s free (itself, "
             "the space the cache keeps free, and a memtable's flush)",
             have, want);
  } else {
    snprintf(why, sizeof(why), "%s",
             st.write_error == LARDER_ENOSPC
                 ? "no space left on the device"
                 : "writes fail (is the directory still there, writable, on a healthy disk?)");
  }
  log_warn(
      "cache in %s: %s: admission is off, new data is served from its sources without "
      "being cached; what is cached stays readable",
      srv->cfg.cache_dir, why);
}

/* Called when the cache admitted a unit: a full disk is over. */
static void note_admission(void) {
  if (__atomic_load_n(&disk_full_warned, __ATOMIC_RELAXED) &&
      __atomic_exchange_n(&disk_full_warned, 0, __ATOMIC_RELAXED))
    log_notice("cache admission resumed: the disk has room again");
}

int units_offer(store_t *st, const dataset_t *ds, uint32_t k, const void *const *data,
                const size_t *sizes) {
  int nc = ds->num_columns;
  int result = UNITS_OFFER_SKIPPED;
  store_entry_t *entries = malloc((size_t)(nc ? nc : 1) * sizeof(*entries));
  store_key_t *keys = malloc((size_t)(nc ? nc : 1) * sizeof(*keys));
  uint64_t *usizes = malloc((size_t)(nc ? nc : 1) * sizeof(*usizes));
  if (entries == NULL || keys == NULL || usizes == NULL) goto out;
  /* Offer only the columns the cache lacks.  Columns are cached per
   * column, and another job's projection may have cached some of them
   * already; offering those too would make store_reserve refuse the whole
   * unit (it never admits a key it holds), so a job whose projection
   * overlapped a cached one would never get its own columns cached and
   * would decode every epoch.  Tested by daemon_cache_shared_columns. */
  int n = 0;
  for (int c = 0; c < nc; c++) {
    store_key_t key;
    dataset_column_key(ds, k, c, &key);
    if (store_contains(st, &key)) continue;
    if (data[c] == NULL) goto out;
    keys[n] = key;
    usizes[n] = sizes[c];
    entries[n].key = key;
    entries[n].data = data[c];
    entries[n].size = sizes[c];
    n++;
  }
  if (n == 0) {
    result = UNITS_OFFER_HELD;
    goto out;
  }
  const dataset_unit_t *du = &ds->units[k];
  uint64_t object_id = ds->files[du->file].object_id;
  /* store_reserve returns 1, 0, or a negative code; a negative code
   * (EINVAL, ENOMEM) means nothing was reserved either. */
  if (store_reserve(st, object_id, keys, usizes, n, du->priority) <= 0) {
    result = UNITS_OFFER_REFUSED;
    goto out;
  }
  int rc = store_put(st, object_id, du->priority, entries, n);
  if (rc) {
    store_unreserve(st, keys, n);
    result = rc;
    goto out;
  }
  result = UNITS_OFFER_WRITTEN;
out:
  free(entries);
  free(keys);
  free(usizes);
  return result;
}

/* Offers the serialized columns of unit k to the cache (units_offer), and
 * reports what came of it: a refusal or a failed write in the log (once
 * for a full disk), an admission after a full disk too.  *admitted: whether
 * the cache holds every column now. */
static void offer_to_cache(server_t *srv, const dataset_t *ds, uint32_t k, uint8_t **blobs,
                           const size_t *sizes, int *admitted) {
  *admitted = 0;
  if (srv->store == NULL) return;
  int r = units_offer(srv->store, ds, k, (const void *const *)blobs, sizes);
  if (r == UNITS_OFFER_REFUSED || r == LARDER_ENOSPC) {
    note_refusal(srv);
  } else if (r < 0) {
    log_warn("cache write of %s failed: %s", ds->files[ds->units[k].file].name, larder_strerror(r));
  } else if (r == UNITS_OFFER_WRITTEN) {
    note_admission();
  }
  *admitted = r == UNITS_OFFER_HELD || r == UNITS_OFFER_WRITTEN;
}

/* Decodes units [start, ...) of u's row group: u's own columns are kept in
 * u; the others go to the cache while it admits them and does not hold
 * them yet. */
static int decode_run(server_t *srv, unit_t *u, uint32_t start) {
  dataset_t *ds = u->ds;
  const dataset_unit_t *du = &ds->units[start];
  const dataset_file_t *f = &ds->files[du->file];
  int nc = ds->num_columns;
  char msg[600];
  pq_source src;
  pq_error err = {0, ""};
  int rc;
  if (f->remote) {
    memset(&src, 0, sizeof(src));
    src.fd = -1;
    src.read = rb_read;
    src.map = rb_map;
    src.ctx = u->rgbuf;
    src.size = f->size;
    snprintf(src.name, sizeof(src.name), "%s", f->name);
  } else {
    rc = pq_source_open_fd(&src, dataset_file_fd(f), f->path, &err);
    if (rc) return unit_fail(u, rc, err.msg);
    struct stat st;
    int same = fstat((int)src.fd, &st) == 0 && (uint64_t)st.st_size == f->size &&
               (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec == f->mtime_ns &&
               (uint64_t)st.st_ino == f->ino;
    /* A change of the ctime alone (chmod, chown, a new hard link such as
     * rsync --link-dest makes) must not end every stream reading the
     * file.  A rewrite with its size and mtime put back changes the ctime
     * too, so the ctime alone cannot tell them apart: the footer can, its
     * statistics and offsets being the content's.  The same footer lets
     * the stream go on.  Tested by daemon_cache_chmod_file. */
    uint64_t footer;
    if (same && (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec != f->ctime_ns)
      same = dataset_footer_hash(&src, pq_file_meta(f->pq)->footer_length, &footer) == 0 &&
             footer == f->footer_hash;
    if (!same) {
      pq_source_close_file(&src);
      /* Units are shared by streams and `larderctl prefetch`: the message
       * fits both, so a prefetch is not told to reopen a stream. */
      snprintf(msg, sizeof(msg),
               "%s: the file changed since the stream opened or the prefetch began; reopen the "
               "stream, or run the prefetch again",
               f->path);
      return unit_fail(u, LARDER_EIO, msg);
    }
  }
  pq_options opts;
  pq_options_init(&opts);
  opts.verify_crc = srv->cfg.verify_crc;
  opts.max_chunk_decoded_bytes = srv->cfg.max_chunk_decoded_bytes;
  pq_reader *r = NULL;
  pq_batch_t batch;
  pq_batch_init(&batch);
  uint8_t **blobs = calloc((size_t)(nc ? nc : 1), sizeof(*blobs));
  size_t *sizes = calloc((size_t)(nc ? nc : 1), sizeof(*sizes));
  if (blobs == NULL || sizes == NULL) {
    free(blobs);
    free(sizes);
    if (!f->remote) pq_source_close_file(&src);
    return unit_fail(u, LARDER_ENOMEM, "out of memory decoding a unit");
  }
  rc = pq_reader_open(f->pq, &src, f->proj, (int)du->rg, &opts, &r, &err);
  if (rc == 0 && du->row_start > 0) {
    int64_t s = pq_reader_skip(r, (int64_t)du->row_start, &err);
    if (s < 0) rc = (int)s;
  }
  uint32_t end = f->first_unit + f->num_units, at = start;
  for (uint32_t k = start; rc == 0 && k < end && ds->units[k].rg == du->rg; k++) {
    at = k;
    if (k > u->index &&
        (k - u->index >= DECODE_RUN_MAX || srv->store == NULL || cached_already(srv->store, ds, k)))
      break;
    int64_t got = pq_reader_next(r, ds->units[k].rows, &batch, &err);
    if (got < 0) {
      rc = (int)got;
      break;
    }
    if (got != ds->units[k].rows) {
      rc = pq_error_set(&err, LARDER_ECORRUPT, "%s: row group %u has fewer rows than declared",
                        f->name, du->rg);
      break;
    }
    memset(blobs, 0, (size_t)nc * sizeof(*blobs));
    for (int c = 0; c < nc && rc == 0; c++) {
      rc = layout_serialize(&batch.columns[c], &blobs[c], &sizes[c]);
      if (rc)
        pq_error_set(&err, rc, "%s: column '%s', row group %u: out of memory serializing a unit",
                     f->name, ds->schema->children[c].name, du->rg);
    }
    int admitted = 0;
    /* Flagged before the cache holds it: a load of unit k that finds it
     * there the moment it lands reads it back (decode work of this epoch),
     * not a hit.  Put back as it was if the cache refuses it. */
    uint8_t was = 0;
    if (rc == 0 && k != u->index)
      was = __atomic_exchange_n(&ds->decoded_ahead[k], 1, __ATOMIC_RELAXED);
    if (rc == 0) offer_to_cache(srv, ds, k, blobs, sizes, &admitted);
    if (rc == 0 && !admitted && k != u->index)
      __atomic_store_n(&ds->decoded_ahead[k], was, __ATOMIC_RELAXED);
    if (rc == 0 && (admitted || k == u->index)) u->run_units++;
    if (rc == 0 && k == u->index) {
      for (int c = 0; c < nc; c++) {
        u->blobs[c] = blobs[c];
        u->bytes += sizes[c];
        blobs[c] = NULL;
      }
    }
    for (int c = 0; c < nc; c++) free(blobs[c]);
    /* Decoding ahead only pays when the cache keeps what it decodes. */
    if (k >= u->index && !admitted) break;
  }
  free(blobs);
  free(sizes);
  pq_batch_free(&batch);
  pq_reader_close(r);
  if (!f->remote) pq_source_close_file(&src);
  /* A unit decoded only for the cache, before or after u, must not fail
   * u's load with its own error.  The reader's ceiling on decoded bytes
   * counts a whole run through a row group, so units of large values that
   * each decode well can fail once a run has read enough of them.  A unit
   * after u just ends the run; one before u makes u start a run of its own
   * (each unit then meets its own errors when it is loaded). */
  if (rc && at > u->index) rc = 0;
  if (rc && at < u->index) return decode_run(srv, u, u->index);
  /* Smaller units help a ceiling passed by a run of reads, not one page
   * that alone claims more values than the ceiling allows. */
  if (rc == LARDER_ELIMIT && !err.whole_page) {
    char hint[sizeof(err.msg) + 200];
    snprintf(hint, sizeof(hint),
             "%s (unit of rows %llu-%llu of row group %u, decoded at once: a stream opened "
             "with a smaller unit_rows cuts smaller units)",
             err.msg[0] ? err.msg : larder_strerror(rc),
             (unsigned long long)ds->units[u->index].row_start,
             (unsigned long long)(ds->units[u->index].row_start + ds->units[u->index].rows - 1),
             ds->units[u->index].rg);
    return unit_fail(u, rc, hint);
  }
  if (rc) return unit_fail(u, rc, err.msg[0] ? err.msg : larder_strerror(rc));
  return 0;
}

static void build_rows(unit_t *u) {
  const layout_rowplan_t *plan = u->ds->rowplan;
  if (plan == NULL || u->error) return;
  if (layout_rows_build(plan, u->views, (int64_t)u->rows, &u->rowblock) != 0) {
    unit_fail(u, LARDER_ENOMEM, "out of memory building a unit's row block");
    return;
  }
  u->data_bytes = u->bytes;
  u->bytes += u->rowblock.bytes;
}

/*
 * Reads every column of u from the cache.  Returns 1 with u served from it;
 * 0 when some column is not there or could not be read (u then holds no
 * value and is decoded).  The index is asked first, so a unit that is half
 * cached (another job's projection cached some of its columns) reads
 * nothing and counts no hit for what it does not use.  A value whose
 * checksum held but whose layout this build cannot read (a serving layout
 * of another version) is dropped from the cache, so that the decode that
 * follows rebuilds it; a read error (LARDER_EIO) leaves the entry, which a
 * later read may find whole again, and the unit is decoded meanwhile.
 */
static int read_cached(server_t *srv, unit_t *u) {
  dataset_t *ds = u->ds;
  int nc = ds->num_columns;
  if (srv->store == NULL || !cached_already(srv->store, ds, u->index)) return 0;
  char why[256];
  uint64_t t0 = util_now_ns();
  int all = 1;
  /* After a failed read the unit's other columns are read too, each stale
   * one dropped: one left in the cache would never be offered again
   * (offer_to_cache offers only what the cache lacks), and the unit would
   * be decoded in every epoch. */
  for (int c = 0; c < nc; c++) {
    store_key_t key;
    dataset_column_key(ds, u->index, c, &key);
    int rc = store_get(srv->store, &key, &u->cached[c]);
    if (rc == 0 && layout_view(store_value_data(u->cached[c]), store_value_size(u->cached[c]),
                               &ds->schema->children[c], &u->views[c], why, sizeof(why)) != 0) {
      /* Discard the entry, not just the value: if the entry stayed, the
       * unit would be decoded, and the decode's shortcut for a unit cached
       * meanwhile (load_work) would find it cached and read it again,
       * recursing until the stack overflowed: a crash on every load of the
       * unit, and on every restart.  Tested by daemon_cache_bad_entries. */
      store_value_free(u->cached[c]);
      u->cached[c] = NULL;
      store_discard(srv->store, &key);
      rc = LARDER_ECORRUPT;
    }
    if (rc != 0) all = 0;
  }
  u->cache_read_ns += util_now_ns() - t0;
  if (!all) {
    for (int c = 0; c < nc; c++) {
      if (u->cached[c]) store_value_free(u->cached[c]);
      u->cached[c] = NULL;
    }
    return 0;
  }
  for (int c = 0; c < nc; c++) u->bytes += store_value_size(u->cached[c]);
  u->from_cache = 1;
  u->readback = __atomic_exchange_n(&ds->decoded_ahead[u->index], 0, __ATOMIC_RELAXED);
  return 1;
}

static void load_work(work_t *w) {
  unit_t *u = w->data;
  if (u->error) return; /* only here to report a failed fetch */
  /* Atomic: cancel_load reads it on the loop meanwhile (see there). */
  __atomic_store_n(&u->retry, 0, __ATOMIC_RELAXED);
  u->need_fetch = 0;
  server_t *srv = u->srv;
  dataset_t *ds = u->ds;
  int nc = ds->num_columns;
  char why[256];
  if (read_cached(srv, u)) {
    u->rg_fetched = 0; /* nothing fetched for this load */
    build_rows(u);
    return;
  }
  const dataset_unit_t *du = &ds->units[u->index];
  if (u->error) return; /* its row group's fetch failed */
  if (ds->files[du->file].remote && u->rgbuf == NULL) {
    /* The bytes must be fetched first, on the loop (load_done does it). */
    u->need_fetch = 1;
    return;
  }
  /* One decode per row group at a time: another worker may be decoding this
   * unit's row group right now, and will have cached it when it is done. */
  int *busy = &ds->rg_busy[ds->files[du->file].first_rg + du->rg];
  if (__atomic_exchange_n(busy, 1, __ATOMIC_ACQUIRE) != 0) {
    __atomic_store_n(&u->retry, 1, __ATOMIC_RELAXED);
    return;
  }
  /* The decode that just finished may have cached it: read it instead (at
   * most once: a unit the index holds but that cannot be read is decoded). */
  if (read_cached(srv, u)) {
    __atomic_store_n(busy, 0, __ATOMIC_RELEASE);
    build_rows(u);
    return;
  }
  /* On a cold cache with room, start at the row group's first unit that is
   * not cached: the pages are decoded once and every unit of the row group
   * lands in the cache, in whatever order the shuffle asks for them. */
  uint32_t start = u->index;
  if (srv->store) {
    uint32_t first = ds->files[du->file].first_unit;
    uint32_t k0 = u->index;
    while (k0 > first && ds->units[k0 - 1].rg == du->rg) k0--;
    while (k0 < u->index && cached_already(srv->store, ds, k0)) k0++;
    uint64_t need = 0;
    for (uint32_t k = k0; k < ds->num_units && ds->units[k].rg == du->rg; k++)
      need += ds->units[k].est_bytes;
    store_stats_t st;
    store_stats_get(srv->store, &st);
    if (!st.admission_disabled && st.used_bytes + st.reserved_bytes + need <= st.capacity_bytes)
      start = k0;
  }
  uint64_t t1 = util_now_ns();
  int drc = decode_run(srv, u, start);
  __atomic_store_n(busy, 0, __ATOMIC_RELEASE);
  if (drc != 0) return;
  u->decode_ns = util_now_ns() - t1;
  for (int c = 0; c < nc; c++) {
    size_t size = (size_t)((const layout_blob_header_t *)(const void *)u->blobs[c])->total_size;
    if (layout_view(u->blobs[c], size, &ds->schema->children[c], &u->views[c], why, sizeof(why)) !=
        0) {
      unit_fail(u, LARDER_ECORRUPT, why);
      return;
    }
  }
  build_rows(u);
}

static int queue_load(server_t *srv, unit_t *u);

void units_retry(server_t *srv) {
  unit_t *list = srv->retry_head;
  srv->retry_head = NULL;
  while (list) {
    unit_t *u = list;
    list = u->retry_next;
    u->retry_next = NULL;
    if (queue_load(srv, u) != 0) {
      u->retry_next = srv->retry_head;
      srv->retry_head = u;
    }
  }
}

static void load_done(work_t *w, int status) {
  unit_t *u = w->data;
  server_t *srv = u->srv;
  srv->loads_in_flight--;
  if (u->retry && status != UV_ECANCELED && !srv->shutting_down) {
    /* Its row group is being decoded by another load, which will cache
     * it; wait for that load to finish. */
    u->retry_next = srv->retry_head;
    srv->retry_head = u;
    return;
  }
  if (srv->retry_head) units_retry(srv);
  if (u->need_fetch && status != UV_ECANCELED && !srv->shutting_down) {
    rgbuf_t *b = rb_acquire(srv, u->ds, u->index, u->ahead, 0);
    if (b && b->state == RB_FETCHING) u->waiting_rgbuf = b;
    if (b == NULL) {
      unit_fail(u, LARDER_ENOMEM, "out of memory");
    } else if (b->state == RB_FETCHING) {
      if (rb_wait(b, u) == 0) return; /* rb_done queues the load again */
      rb_release(srv, b);
      unit_fail(u, LARDER_ENOMEM, "out of memory");
    } else if (b->state == RB_FAILED) {
      unit_fail(u, b->error, b->message ? b->message : larder_strerror(b->error));
      rb_release(srv, b);
    } else {
      u->rgbuf = b;
      u->rg_fetched = rb_bytes(b);
      u->fetch_ns = 0;
      if (queue_load(srv, u) == 0) return;
      u->rgbuf = NULL;
      rb_release(srv, b);
      unit_fail(u, LARDER_ENOMEM, "cannot queue the load");
    }
  }
  if (u->error && u->rgbuf && u->rgbuf->stage_fd >= 0 && atomic_load(&u->rgbuf->st_bad) &&
      !u->stage_retried && status != UV_ECANCELED && !srv->shutting_down) {
    /* Its row group's staged copy is damaged (rb_stage_load said so in the
     * log): drop it, and load the unit again, which fetches the row group
     * from its source.  A fault of the disk under the staging area costs
     * a fetch, not the stream. */
    rgbuf_t *b = u->rgbuf;
    u->rgbuf = NULL;
    rb_unlist(srv, b);
    if (srv->stage) stage_drop(srv->stage, b->object_id, b->rg);
    rb_release(srv, b);
    /* The failed decode kept nothing in u (decode_run keeps a unit's
     * columns only when it decoded whole); its arrays stay for the next. */
    u->run_units = 0;
    u->error = 0;
    free(u->message);
    u->message = NULL;
    u->stage_retried = 1;
    if (queue_load(srv, u) == 0) return;
    unit_fail(u, LARDER_ENOMEM, "cannot queue the load");
  }
  if (u->rgbuf) {
    rgbuf_t *b = u->rgbuf;
    u->rgbuf = NULL;
    if (!u->error) {
      b->units_left -= u->run_units < b->units_left ? u->run_units : b->units_left;
      if (b->units_left == 0) rb_unhold(b); /* u's reference keeps it */
    }
    rb_release(srv, b);
  }
  if (status == UV_ECANCELED && u->error == 0)
    unit_fail(u, LARDER_ESHUTDOWN, "daemon is shutting down");
  if (u->error) {
    u->state = UNIT_FAILED;
    STATS_ADD(&srv->stats, unit_errors, 1);
    unit_free_data(u);
    u->bytes = 0;
    log_warn("unit load failed: %s", u->message ? u->message : larder_strerror(u->error));
  } else {
    u->state = UNIT_READY;
    srv->unit_bytes += u->bytes;
    STATS_ADD(&srv->stats, memory_bytes, u->bytes);
    /* The hit ratio is the trainers': a load for a prefetch alone warms the
     * cache and serves nobody (counted apart). */
    uint64_t db = u->data_bytes ? u->data_bytes : u->bytes;
    if (u->for_prefetch) STATS_ADD(&srv->stats, prefetch_loaded_bytes, db);
    if (u->from_cache) {
      STATS_ADD(&srv->stats, units_from_cache, 1);
      if (!u->for_prefetch) STATS_ADD(&srv->stats, cache_hit_bytes, u->readback ? 0 : db);
      if (!u->for_prefetch && u->readback) STATS_ADD(&srv->stats, cache_readback_bytes, db);
      STATS_ADD(&srv->stats, cache_read_ns, u->cache_read_ns);
    } else {
      STATS_ADD(&srv->stats, units_decoded, 1);
      if (!u->for_prefetch) STATS_ADD(&srv->stats, cache_miss_bytes, db);
      STATS_ADD(&srv->stats, decode_ns, u->decode_ns);
      STATS_ADD(&srv->stats, cache_read_ns, u->cache_read_ns);
    }
  }
  dataset_t *ds = u->ds;
  u->ds = NULL;
  if (--ds->refs == 0) dataset_free(ds);
  /* Tell the waiting streams; they may release the unit while we iterate,
   * so hold a reference. */
  u->refs++;
  int n = u->num_waiters;
  unit_waiter_t **ws = u->waiters;
  u->waiters = NULL;
  u->num_waiters = u->cap_waiters = 0;
  for (int i = 0; i < n; i++) ws[i]->cb(ws[i]);
  free(ws);
  units_release(srv, u);
}

unit_t *units_acquire(server_t *srv, dataset_t *ds, uint32_t index) {
  const dataset_unit_t *du = &ds->units[index];
  uint64_t oid = ds->files[du->file].object_id;
  uint64_t ch = columns_hash_of(ds);
  uint64_t h = unit_hash(oid, du->rg, du->row_start, du->rows, ch);
  for (htab_node_t *n = htab_chain(&srv->unit_table, h); n; n = n->next) {
    unit_t *u = HTAB_ENTRY(n, unit_t, hnode);
    if (n->hash == h && u->object_id == oid && u->rg == du->rg && u->row_start == du->row_start &&
        u->rows == du->rows && u->columns_hash == ch) {
      if (u->state == UNIT_FAILED && u->refs == 0) {
        /* A failure is not cached: try again for the next ask. */
        unit_destroy(srv, u);
        break;
      }
      if (u->refs == 0) lru_remove(srv, u);
      if (u->state == UNIT_LOADING) STATS_ADD(&srv->stats, unit_shared, 1);
      u->refs++;
      u->for_prefetch = 0; /* a stream's too: its load counts as theirs */
      if (u->ahead && !srv->acquiring_ahead) {
        /* A stream needs what read-ahead started: its fetch goes first. */
        u->ahead = 0;
        if (u->waiting_rgbuf) rb_promote(u->waiting_rgbuf);
      }
      return u;
    }
  }
  unit_t *u = calloc(1, sizeof(*u));
  if (u == NULL) return NULL;
  u->cached = calloc((size_t)ds->num_columns + 1, sizeof(store_value_t *));
  u->blobs = calloc((size_t)ds->num_columns + 1, sizeof(uint8_t *));
  u->views = calloc((size_t)ds->num_columns + 1, sizeof(layout_view_t));
  if (u->cached == NULL || u->blobs == NULL || u->views == NULL) {
    unit_free_data(u);
    free(u);
    return NULL;
  }
  u->object_id = oid;
  u->rg = du->rg;
  u->row_start = du->row_start;
  u->rows = du->rows;
  u->columns_hash = ch;
  u->num_columns = ds->num_columns;
  u->refs = 1;
  u->state = UNIT_LOADING;
  u->ahead = srv->acquiring_ahead;
  u->ds = ds;
  ds->refs++;
  u->index = index;
  u->srv = srv;
  /* Its load, and any retry of it, is the work of the stream that first
   * asked for it (work.h, Fairness). */
  u->work.owner = srv->acquiring_owner;
  if (htab_insert(&srv->unit_table, &u->hnode, h) != 0) {
    ds->refs--;
    unit_free_data(u);
    free(u);
    return NULL;
  }
  if (queue_load(srv, u) != 0) {
    unit_fail(u, LARDER_ENOMEM, "cannot queue the load");
    u->state = UNIT_FAILED;
    u->ds = NULL;
    ds->refs--;
  }
  return u;
}

/* Whether unit index is in the pool (in any state). */
static int unit_in_pool(server_t *srv, const dataset_t *ds, uint32_t index) {
  const dataset_unit_t *du = &ds->units[index];
  uint64_t oid = ds->files[du->file].object_id;
  uint64_t ch = columns_hash_of(ds);
  uint64_t h = unit_hash(oid, du->rg, du->row_start, du->rows, ch);
  for (htab_node_t *n = htab_chain(&srv->unit_table, h); n; n = n->next) {
    const unit_t *u = HTAB_ENTRY(n, unit_t, hnode);
    if (n->hash == h && u->object_id == oid && u->rg == du->rg && u->row_start == du->row_start &&
        u->rows == du->rows && u->columns_hash == ch)
      return u->state != UNIT_FAILED;
  }
  return 0;
}

int units_read_ahead(server_t *srv, dataset_t *ds, uint32_t index, int into_cache) {
  const dataset_unit_t *du = &ds->units[index];
  const dataset_file_t *f = &ds->files[du->file];
  if (!f->remote || srv->store == NULL || srv->fetch == NULL || srv->shutting_down) return 0;
  if (rb_find(srv, ds, index, NULL) != NULL || unit_in_pool(srv, ds, index) ||
      cached_already(srv->store, ds, index))
    return 0;
  if (srv->rgbuf_fetching_bytes >= srv->cfg.fetch_inflight_bytes) return -1;
  if (!into_cache) {
    /* A row group the cache will not keep is fetched every epoch: fetch
     * its bytes (not decoded) a little ahead, within a quarter of
     * memory_limit, so that its units decode without waiting when their
     * batches come. */
    /* A staged row group is read from the disk when its units load. */
    if (srv->stage && stage_contains(srv->stage, f->object_id, du->rg)) return 0;
    if (srv->rgbuf_held_bytes >= srv->cfg.memory_limit / 4) return -1;
    rgbuf_t *b = rb_acquire(srv, ds, index, 1, 1);
    if (b == NULL) return 0;
    /* Its hold (rb_acquire) keeps it until its units have decoded from it,
     * or a minute (units_expire_read_ahead). */
    if (b->state == RB_FETCHING) {
      b->mem_ahead = b->charged;
      srv->rgbuf_ahead_bytes += b->mem_ahead;
    }
    rb_release(srv, b);
    return 1;
  }
  /* Into the cache goes only what it will keep: a row group it would turn
   * away (or keep by evicting something still to be read) takes the path
   * above instead, so that it is fetched once per epoch, not twice. */
  uint64_t need = 0;
  for (uint32_t k = f->first_unit; k < f->first_unit + f->num_units; k++)
    if (ds->units[k].rg == du->rg) need += ds->units[k].est_bytes;
  if (!store_would_admit(srv->store, need, du->priority)) return 0;
  srv->acquiring_ahead = 1;
  unit_t *u = units_acquire(srv, ds, index);
  srv->acquiring_ahead = 0;
  if (u == NULL) return 0;
  units_release(srv, u);
  return 1;
}

static int queue_load(server_t *srv, unit_t *u) {
  u->work.data = u;
  srv->loads_in_flight++;
  if (work_queue(srv->pool, &u->work, load_work, load_done) != 0) {
    srv->loads_in_flight--;
    return LARDER_ENOMEM;
  }
  return 0;
}

/*
 * Takes back the load of a unit that no stream wants any more if no worker
 * has started it (a trainer killed mid-epoch leaves a window's loads
 * queued, which would otherwise delay every other stream's loads and
 * batches while the workers decode for no one).  Not a read-ahead load,
 * which is meant to run with no stream holding its unit, nor one that
 * decodes from fetched bytes: the row group's buffer counts its units down
 * as they decode, and would be held until it expired.  Else the unit stays
 * as it is.
 */
static void cancel_load(server_t *srv, unit_t *u) {
  /* A worker running this load writes `retry` while this reads it: the
   * value read then does not matter, as work_cancel refuses a started
   * item, but the accesses are atomic so that the read is a defined one
   * (TSan, daemon_robust_chaos). */
  if (u->ahead || u->rgbuf != NULL || __atomic_load_n(&u->retry, __ATOMIC_RELAXED) ||
      work_cancel(srv->pool, &u->work) != 0)
    return;
  srv->loads_in_flight--;
  STATS_ADD(&srv->stats, unit_loads_cancelled, 1);
  if (u->ds && --u->ds->refs == 0) dataset_free(u->ds);
  u->ds = NULL;
  unit_destroy(srv, u);
}

void units_release(server_t *srv, unit_t *u) {
  if (--u->refs > 0) return;
  if (u->state == UNIT_READY) {
    lru_push(srv, u);
    units_trim(srv);
  } else if (u->state == UNIT_FAILED) {
    unit_destroy(srv, u);
  } else if (u->state == UNIT_LOADING) {
    /* One whose load has started, or is waiting for its row group's
     * fetch, finishes it, and load_done drops it then. */
    cancel_load(srv, u);
  }
}

int units_wait(unit_t *u, unit_waiter_t *w) {
  for (int i = 0; i < u->num_waiters; i++)
    if (u->waiters[i] == w) return 0;
  if (u->num_waiters == u->cap_waiters) {
    int cap = u->cap_waiters ? u->cap_waiters * 2 : 4;
    unit_waiter_t **ws = realloc(u->waiters, (size_t)cap * sizeof(unit_waiter_t *));
    if (ws == NULL) return LARDER_ENOMEM;
    u->waiters = ws;
    u->cap_waiters = cap;
  }
  u->waiters[u->num_waiters++] = w;
  return 0;
}

void units_unwait(unit_t *u, unit_waiter_t *w) {
  for (int i = 0; i < u->num_waiters; i++)
    if (u->waiters[i] == w) {
      u->waiters[i] = u->waiters[--u->num_waiters];
      return;
    }
}

/* Ends the holds of read-ahead buffers older than max_age_ns (all of them
 * for 0). */
static void rb_unhold_all(server_t *srv, uint64_t max_age_ns) {
  uint64_t now = util_now_ns();
  rgbuf_t *b = srv->rgbuf_held_head;
  while (b) {
    /* rb_unhold unlinks b from this list and may destroy it (a failed
     * one): step first.  It releases b alone, so next stays valid. */
    rgbuf_t *next = b->held_next;
    if (max_age_ns == 0 || now - b->held_ns > max_age_ns) rb_unhold(b);
    b = next;
  }
}

void units_expire_read_ahead(server_t *srv) { rb_unhold_all(srv, 60ull * 1000000000ull); }

void units_shutdown(server_t *srv) {
  rb_unhold_all(srv, 0);
  /* Loads that waited for a row group when the loop stopped. */
  while (srv->retry_head) {
    unit_t *u = srv->retry_head;
    srv->retry_head = u->retry_next;
    if (u->ds && --u->ds->refs == 0) dataset_free(u->ds);
    u->ds = NULL;
    unit_destroy(srv, u);
  }
  while (srv->lru_head) {
    unit_t *u = srv->lru_head;
    lru_remove(srv, u);
    unit_destroy(srv, u);
  }
  htab_free(&srv->unit_table);
  while (srv->rgbuf_lru_head) {
    rgbuf_t *b = srv->rgbuf_lru_head;
    rb_lru_remove(srv, b);
    rb_destroy(srv, b);
  }
  htab_free(&srv->rgbuf_table);
}
