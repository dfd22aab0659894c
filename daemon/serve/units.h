/*
 * units.h: the pool of decoded units held in memory (prefix units_).
 *
 * A unit is a stretch of a row group's rows with the stream's column
 * projection.  units_acquire hands out references; a unit not in memory is
 * read from the cache or fetched and decoded on a worker, and whoever waits
 * for it registers a unit_waiter_t.  Idle READY units stay in memory, on an
 * LRU list, until memory_limit needs their room (units_trim).
 *
 * Conventions
 * -----------
 * - Threading: every function is the loop thread's unless it says
 *   otherwise.  A READY unit is immutable, and worker tasks may read it
 *   while they hold a reference taken on the loop; a LOADING unit belongs
 *   to its load.
 * - Ownership: references are counted (refs); a caller releases each one
 *   it acquired with units_release.  The pool frees a unit once it has no
 *   reference and is not worth keeping (FAILED, or trimmed).
 * - Errors: negative larder_errno_t; a load's failure stays in the unit
 *   (FAILED, with error and message) for its waiters to report.
 */
#ifndef LARDER_UNITS_H
#define LARDER_UNITS_H

#include <stddef.h>
#include <stdint.h>

#include "cache/store.h"
#include "htab.h"
#include "plan/dataset.h"
#include "serve/layout.h"
#include "work.h"

typedef struct server server_t;
typedef struct unit unit_t;
typedef struct unit_waiter unit_waiter_t;
typedef struct rgbuf rgbuf_t;

enum { UNIT_LOADING = 0, UNIT_READY = 1, UNIT_FAILED = 2 };

struct unit {
  /* Identity: the dataset's unit (object, row group, rows) and column set. */
  uint64_t hash;
  uint64_t object_id;
  uint32_t rg;
  uint64_t row_start;
  uint32_t rows;
  uint64_t columns_hash;

  int refs;
  int state;
  int error;
  char *message;  /* FAILED: why */
  dataset_t *ds;  /* held while loading */
  uint32_t index; /* in ds */
  int num_columns;
  store_value_t **cached; /* per column, when read from the cache */
  uint8_t **blobs;        /* per column, when decoded */
  layout_view_t *views;   /* per column, READY */
  layout_rows_t rowblock; /* the row block (layout.h), when the dataset has a
                             row plan */
  uint64_t bytes;         /* in memory, row block included */
  uint64_t data_bytes;    /* of its column blobs: what the cache holds */
  int from_cache;
  int readback;           /* from_cache, and decoded ahead for it: not a hit */
  int for_prefetch;       /* loaded for `larderctl prefetch` alone: its bytes
                             are not the trainers' hits or misses */
  int retry;              /* its row group was being decoded: try again */
  int need_fetch;         /* remote and not cached: its row group's bytes */
  int stage_retried;      /* loaded again after its staged copy was damaged */
  rgbuf_t *rgbuf;         /* the fetched bytes it decodes from */
  uint64_t rg_fetched;    /* the bytes of that row group's buffer (its
                             projected column chunks), once it has one */
  rgbuf_t *waiting_rgbuf; /* the row group fetch it waits for, or NULL */
  uint32_t run_units;     /* units its decode left no need to decode again
                             (itself, and those it put in the cache) */
  int ahead;              /* loaded for read-ahead: no stream waits yet */
  unit_t *retry_next;
  uint64_t fetch_ns, decode_ns, cache_read_ns;

  unit_waiter_t **waiters; /* whom to tell when it is READY or FAILED */
  int num_waiters, cap_waiters;
  htab_node_t hnode;           /* in srv->unit_table; hnode.hash is its hash */
  unit_t *lru_prev, *lru_next; /* idle list (refs == 0, READY) */
  work_t work;
  server_t *srv;
};

/* Returns the unit (refs + 1), starting its load if it is not in memory.
 * NULL when out of memory. */
unit_t *units_acquire(server_t *srv, dataset_t *ds, uint32_t index);
/*
 * Read-ahead of a remote unit's row group, for a unit that streams will
 * need later (stream_plan.c walks the coming batches).  Starts the fetch (queued
 * behind every fetch a trainer waits for) and holds nothing.  into_cache
 * (the cache will keep the row group): the row group is then decoded into
 * the cache, its units landing in the idle pool; else only its bytes are
 * kept, in memory, for the units' loads, within a quarter of memory_limit.
 * Returns 1 when it started a fetch, 0 when there is nothing to do (a local
 * file, cached already, in memory or being fetched, no cache, or the cache
 * would not keep it after all), or -1 when a budget is spent (bytes being
 * fetched reach fetch_inflight_bytes, or bytes read ahead into memory reach
 * memory_limit / 4): stop for now.  Loop thread.
 */
int units_read_ahead(server_t *srv, dataset_t *ds, uint32_t index, int into_cache);

/* The gap across which two column chunks of url are read with one request:
 * fetch_merge_gap, or less as the link measures (fetch_merge_gap_auto,
 * fetch_merge_gap in fetch.h).  Loop thread. */
uint64_t units_merge_gap(server_t *srv, const char *url);
/* Lets go of row groups read ahead into memory that no unit used within a
 * minute (their stream closed or moved on).  The tick calls it. */
void units_expire_read_ahead(server_t *srv);
/* What units_offer did (negative: store_put's error). */
enum {
  UNITS_OFFER_SKIPPED = 0, /* nothing offered: out of memory, or a column
                              the cache lacks has no data */
  UNITS_OFFER_HELD = 1,    /* the cache held every column already */
  UNITS_OFFER_WRITTEN = 2, /* the columns it lacked are written now */
  UNITS_OFFER_REFUSED = 3  /* store_reserve refused them (full, admission
                              off, or of lower priority) */
};
/*
 * Offers the serialized columns of unit k of ds to the cache: those st
 * does not hold yet (data[c], sizes[c] bytes, per column of ds; data[c]
 * may be NULL for a column st holds) are reserved and written together,
 * and a write that fails gives the reservation back.  Returns a
 * UNITS_OFFER_ value or store_put's negative code; reports nothing (the
 * caller logs what it must).  data stays the caller's.  Any thread (a
 * worker: it blocks on the cache).
 */
int units_offer(store_t *st, const dataset_t *ds, uint32_t k, const void *const *data,
                const size_t *sizes);
/* Drops a reference; idle READY units stay cached until memory is needed. */
void units_release(server_t *srv, unit_t *u);
/*
 * A waiter: whoever waits for units to load (a stream) embeds one, sets cb,
 * and registers it with units_wait, as a libuv handle carries its callback.
 * cb(w) runs on the loop when a unit w waits for leaves LOADING (READY or
 * FAILED), once per unit and registration; w is then no longer registered
 * with that unit.  cb may release units, and wait on others.  The waiter's
 * owner keeps it alive while it is registered (units_unwait takes it
 * back).
 */
typedef void (*unit_waiter_cb)(unit_waiter_t *w);
struct unit_waiter {
  unit_waiter_cb cb;
  void *data; /* the owner's */
};
/* Registers w to be told when u leaves LOADING; a waiter registered already
 * is not added twice.  Returns 0, or LARDER_ENOMEM (w is then not
 * registered).  Loop thread. */
int units_wait(unit_t *u, unit_waiter_t *w);
/* Takes w off u's waiters (nothing when it is not there).  Loop thread. */
void units_unwait(unit_t *u, unit_waiter_t *w);
/* Frees idle units until the pool fits memory_limit. */
void units_trim(server_t *srv);
/* Sets up the unit pool.  room(srv), on the loop, is told each time a fetch
 * read ahead has finished and so left room in the read-ahead budget (the
 * server passes stream_read_ahead_all); it is never called from within
 * itself.  Loop thread. */
void units_init(server_t *srv, void (*room)(server_t *srv));
/* Queues again the loads that waited for a row group (the tick calls it). */
void units_retry(server_t *srv);
void units_shutdown(server_t *srv);

#endif /* LARDER_UNITS_H */
