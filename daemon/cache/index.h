/*
 * index.h: the store's in-memory index (prefix index_; internal to
 * daemon/cache, used by store.c only).
 *
 * Conventions
 * -----------
 * - What it holds: every entry of the cache (reserved, being written, or
 *   present) in a hash map by key; the present ones also in a max-heap by
 *   priority (worst on top) and in a recency list (oldest first); the
 *   objects the entries belong to, and the current identity of each name.
 *   It decides admission and eviction (store.h: by priority, idle entries
 *   first) and never does I/O: what it evicts goes to a list of pending
 *   deletes that store.c writes to RocksDB with its next batch.
 * - Threading: none of its own.  store.c holds its mutex `mu` around every
 *   call and every read of the fields below.
 * - Ownership: the index owns its entries and objects; pointers to them
 *   stay valid until the index drops them (index_drop_present,
 *   index_drop_reserved, an eviction) or is freed.  Keys are copied.
 * - Errors: LARDER_ENOMEM only; a failed call leaves the index as it was
 *   unless its comment says otherwise.
 * - Dependencies: libc and store.h's types (keys, statistics); it calls
 *   no other module.  store.c depends on it, never the other way.
 *
 * In-memory structure (see store.c for how it is persisted):
 * - entries: an open-addressing hash map (linear probing, backward-shift
 *   deletion) from key to entry_t.  An entry is RESERVED (index_reserve),
 *   WRITING (its store_put is in flight) or PRESENT.
 * - Present entries are also in the heap (each entry knows its position,
 *   so removal is O(log n)) and in the recency list.  Eviction takes idle
 *   entries (last use older than idle_s) from the front of the list first,
 *   then the worst priorities from the heap, a whole put (the columns of
 *   one unit) at a time.  Reserved and writing entries are in neither, so
 *   they are never evicted, and their bytes count toward the capacity.
 * - objects: a second map from object id; objects stay for the life of the
 *   index (so that a name recorded once survives its entries' eviction),
 *   except superseded identities, freed with their last entry.  Each keeps
 *   a list of its present entries.  A third map, names, holds the current
 *   identity of each name; an older identity's entries rank worst.
 * - Heap order ties: the entries of one put share a generation, and the
 *   heap orders equal priorities by it, so a put's entries leave together.
 */
#ifndef LARDER_CACHE_INDEX_H
#define LARDER_CACHE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/store.h"

enum { ST_RESERVED = 1, ST_WRITING = 2, ST_PRESENT = 3 };

#define HEAP_NONE UINT32_MAX

/* A growable byte buffer. */
typedef struct bytes {
  uint8_t *p;
  size_t len, cap;
} bytes_t;

/* Makes room for extra more bytes.  Returns 0 or LARDER_ENOMEM. */
int index_bytes_reserve(bytes_t *b, size_t extra);
/* Appends n bytes (p may be NULL when n is 0).  Returns 0 or
 * LARDER_ENOMEM (b unchanged). */
int index_bytes_append(bytes_t *b, const void *p, size_t n);

typedef struct map_slot {
  uint64_t h;
  void *p; /* NULL = empty */
} map_slot_t;

/* An open-addressing hash map of pointers; iterate over slots[0..mask]. */
typedef struct map {
  map_slot_t *slots;
  size_t mask; /* capacity - 1; capacity is a power of two */
  size_t count;
} map_t;

typedef struct object {
  uint64_t id;
  char *name; /* NULL until store_object_put names it */
  char *identity;
  uint64_t bytes;   /* value bytes of present entries */
  uint64_t entries; /* present entries */
  uint64_t refs;    /* present + reserved + writing entries */
  int64_t last_use;
  struct entry *present; /* its present entries, by entry_t.onext */
  int64_t refreshed;     /* when a registration last marked them used */
  bool on_disk;          /* its record is (or is about to be) in RocksDB */
  bool superseded;       /* another identity of its name came later */
} object_t;

typedef struct entry {
  uint64_t h;
  uint64_t size; /* reserved size, or the value size once present */
  uint64_t priority;
  uint64_t gen;   /* its put's generation, shared by the entries of one put
                     (0 for entries loaded at open) */
  uint64_t touch; /* recency sequence number */
  int64_t last_use;
  int64_t saved_use; /* last_use as in the index record */
  object_t *obj;
  struct entry *prev, *next;   /* recency list (present entries) */
  struct entry *oprev, *onext; /* its object's present entries */
  uint32_t heap_pos;
  uint8_t state;
  uint8_t mark; /* scratch for admission (cleared before the call returns) */
  uint8_t seen; /* store_verify found its value */
  uint8_t keylen;
  uint8_t key[];
} entry_t;

typedef struct store_index {
  uint32_t idle_s;                  /* entries unused this long are idle */
  int64_t persist_granularity;      /* seconds; also how often a registration
                                  marks an object's entries used */
  store_stats_t *stats;             /* the store's counters: evictions */
  uint64_t used, reserved, present; /* bytes present, bytes reserved (and
                                       writing), entries present */
  uint64_t live_objects;            /* objects with present entries */
  map_t entries;
  map_t objects;
  map_t names; /* name -> the object that last registered it */
  entry_t **heap;
  size_t heap_len, heap_cap;
  entry_t *lru_head, *lru_tail;
  uint64_t gen_counter, touch_counter, persisted_touch;
  /* Pending deletes, records of: 'e', length, key (an entry: its value and
   * index records) or 'o', 8, id big-endian (an object record). */
  bytes_t pending;
  uint32_t *scratch; /* heap-walk stack for admission */
  size_t scratch_cap;
} store_index_t;

/* An empty index.  Returns 0 or LARDER_ENOMEM (then index_free it). */
int index_init(store_index_t *ix, uint32_t idle_s, int64_t persist_granularity,
               store_stats_t *stats);
/* Frees every entry, object and buffer. */
void index_free(store_index_t *ix);

/* The hash of a key's bytes (entries, and sets of keys). */
uint64_t index_hash_key(const uint8_t *p, size_t n);

/* ---- loading at open ----------------------------------------------------- */

/* Adds a present entry read from an index record.  Returns 0 or
 * LARDER_ENOMEM. */
int index_load_entry(store_index_t *ix, const uint8_t *key, uint8_t len, uint64_t size,
                     uint64_t priority, uint64_t object_id, int64_t last_use);
/* After loading: each name's current identity (the one used last; none
 * superseded on a tie), the recency list and the heap, and a pending
 * delete for each object record without entries.  Returns 0 or
 * LARDER_ENOMEM. */
int index_loaded(store_index_t *ix);

/* ---- entries and objects ------------------------------------------------- */

/* The entry of key (h its index_hash_key), or NULL. */
entry_t *index_entry_find(store_index_t *ix, const uint8_t *key, uint8_t len, uint64_t h);
/* The object of id, created (unnamed) if unknown; NULL when out of memory. */
object_t *index_obj_get(store_index_t *ix, uint64_t id);
/* Drops one reference to o: its record is queued for deletion with its
 * last entry, and a superseded object is freed then. */
void index_obj_unref(store_index_t *ix, object_t *o);
/* Gives o a new name and identity (both malloc'd, taken over) and makes it
 * the current identity of that name (index_name_register). */
void index_obj_rename(store_index_t *ix, object_t *o, char *name, char *identity, int64_t now);
/* Makes o the current identity of its name, superseding the one before,
 * and marks its entries used at now (at most once per persist
 * granularity). */
void index_name_register(store_index_t *ix, object_t *o, int64_t now);

/* Marks a present entry used at now (recency list, its object). */
void index_touch(store_index_t *ix, entry_t *e, int64_t now);
/* Drops a present entry and queues its deletion; e is freed. */
void index_drop_present(store_index_t *ix, entry_t *e);
/* index_drop_present, counted as an eviction. */
void index_evict_entry(store_index_t *ix, entry_t *e);
/* Drops a reserved (or writing) entry; e is freed. */
void index_drop_reserved(store_index_t *ix, entry_t *e);

/* Queues the deletion of an entry's records, or of an object's record.  A
 * record that finds no memory is dropped: at worst its bytes stay on disk
 * until the next open finds an over-full cache. */
void index_pending_entry(store_index_t *ix, const uint8_t *key, uint8_t len);
void index_pending_object(store_index_t *ix, uint64_t id);

/* The present entries for which pick(e, arg) holds, in a malloc'd array
 * (*n set); NULL when out of memory.  Collect first, drop afterwards: a
 * removal from the map moves other entries between slots. */
entry_t **index_collect(store_index_t *ix, bool (*pick)(const entry_t *, void *), void *arg,
                        size_t *n);

/* ---- admission and eviction ---------------------------------------------- */

/* Whether need bytes can be freed from idle entries and entries worse than
 * priority; changes nothing. */
bool index_can_free(store_index_t *ix, uint64_t need, uint64_t priority, int64_t now);
/* Evicts until used + reserved <= target: idle entries first, then the
 * worst priorities; unless any_priority, only entries of priority > floor
 * (strictly worse) go.  Reserved entries are never evicted. */
void index_evict_down(store_index_t *ix, uint64_t target, bool any_priority, uint64_t floor,
                      int64_t now);
/*
 * Admits n entries (keys[i] of sizes[i], total bytes in all, distinct keys)
 * of object_id at priority within capacity, evicting idle and worse
 * entries to make room, and reserves them.  Returns 1 (reserved), 0 (not
 * admitted: a key is already cached, or there is no room at this
 * priority) or LARDER_ENOMEM (nothing reserved).
 */
int index_reserve(store_index_t *ix, uint64_t capacity, uint64_t object_id, const store_key_t *keys,
                  const uint64_t *sizes, int n, uint64_t total, uint64_t priority, int64_t now);
/*
 * Claims the reservations of a put's n entries for object_id: es[i] gets
 * the entry of entries[i].key, now WRITING at priority, and *obj the
 * object.  Returns 0, LARDER_EINVAL (a key not reserved: nothing changed)
 * or LARDER_ENOMEM.
 */
int index_claim(store_index_t *ix, uint64_t object_id, uint64_t priority,
                const store_entry_t *entries, int n, entry_t **es, object_t **obj);
/* A claimed put was written: its entries become present with their real
 * sizes, used at now, one generation; counts the put, and evicts idle or
 * worse entries down to capacity (real sizes above the reserved ones). */
void index_commit(store_index_t *ix, entry_t **es, const store_entry_t *entries, int n, object_t *o,
                  uint64_t priority, uint64_t capacity, int64_t now);
/* A claimed put failed: its entries are dropped and their records queued
 * for deletion (the batch may have reached the disk all the same). */
void index_abort(store_index_t *ix, entry_t **es, int n);

#endif /* LARDER_CACHE_INDEX_H */
