/*
 * index.c: the store's in-memory index: entries, objects and names, the
 * heap and the recency list, admission and eviction (see index.h).
 *
 * Every function runs under the store's mutex and does no I/O: an entry
 * or object record that must leave the disk is queued in ix->pending, and
 * store.c carries the queue into its next RocksDB batch.
 */
#include "cache/index.h"

#include <stdlib.h>
#include <string.h>

#include "larder.h"

/* ------------------------------------------------------------------------ */
/* Hashing and the open-addressing map                                       */

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t index_hash_key(const uint8_t *p, size_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ ((uint64_t)n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ mix64(w)) * 0x9e3779b97f4a7c15ull;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ mix64(w)) * 0x9e3779b97f4a7c15ull;
  }
  return mix64(h);
}

typedef bool (*map_eq_fn)(const void *item, const void *key);

static int map_init(map_t *m, size_t cap) {
  size_t c = 16;
  while (c < cap) c <<= 1;
  m->slots = calloc(c, sizeof(map_slot_t));
  if (m->slots == NULL) return LARDER_ENOMEM;
  m->mask = c - 1;
  m->count = 0;
  return 0;
}

static void map_free(map_t *m) {
  free(m->slots);
  m->slots = NULL;
}

static long map_find(const map_t *m, uint64_t h, map_eq_fn eq, const void *key) {
  for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
    const map_slot_t *s = &m->slots[i];
    if (s->p == NULL) return -1;
    if (s->h == h && eq(s->p, key)) return (long)i;
  }
}

static void map_place(map_t *m, uint64_t h, void *p) {
  size_t i = h & m->mask;
  while (m->slots[i].p != NULL) i = (i + 1) & m->mask;
  m->slots[i].h = h;
  m->slots[i].p = p;
  m->count++;
}

static int map_insert(map_t *m, uint64_t h, void *p) {
  if ((m->count + 1) * 10 > (m->mask + 1) * 7) {
    size_t old_cap = m->mask + 1;
    map_slot_t *old = m->slots;
    map_slot_t *ns = calloc(old_cap * 2, sizeof(map_slot_t));
    if (ns == NULL) return LARDER_ENOMEM;
    m->slots = ns;
    m->mask = old_cap * 2 - 1;
    m->count = 0;
    for (size_t i = 0; i < old_cap; i++)
      if (old[i].p != NULL) map_place(m, old[i].h, old[i].p);
    free(old);
  }
  map_place(m, h, p);
  return 0;
}

/* Removes slot i, shifting later members of its probe run back so that no
 * tombstones are needed. */
static void map_remove_at(map_t *m, size_t i) {
  size_t j = i;
  for (;;) {
    j = (j + 1) & m->mask;
    if (m->slots[j].p == NULL) break;
    size_t k = m->slots[j].h & m->mask; /* j's home slot */
    /* j may move to i unless its home lies cyclically in (i, j]. */
    bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
    if (!stays) {
      m->slots[i] = m->slots[j];
      i = j;
    }
  }
  m->slots[i].p = NULL;
  m->count--;
}

static void map_remove_ptr(map_t *m, uint64_t h, const void *p) {
  for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
    if (m->slots[i].p == NULL) return;
    if (m->slots[i].p == p) {
      map_remove_at(m, i);
      return;
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Byte buffers and pending deletes                                          */

int index_bytes_reserve(bytes_t *b, size_t extra) {
  if (b->len + extra <= b->cap) return 0;
  size_t nc = b->cap ? b->cap * 2 : 1024;
  while (nc < b->len + extra) nc *= 2;
  uint8_t *np = realloc(b->p, nc);
  if (np == NULL) return LARDER_ENOMEM;
  b->p = np;
  b->cap = nc;
  return 0;
}

int index_bytes_append(bytes_t *b, const void *p, size_t n) {
  if (n == 0) return 0; /* p may be NULL */
  int rc = index_bytes_reserve(b, n);
  if (rc) return rc;
  memcpy(b->p + b->len, p, n);
  b->len += n;
  return 0;
}

static void put_be64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
}

/* Pending records: 'e' len key (an entry: delete 'v'+key and 'i'+key) or
 * 'o' 8 id (an object record).  A record that cannot be queued for lack of
 * memory is dropped: the entry is already gone from the index and at worst
 * its bytes stay on disk until the next open finds an over-full cache. */
void index_pending_entry(store_index_t *ix, const uint8_t *key, uint8_t len) {
  uint8_t hdr[2] = {'e', len};
  if (index_bytes_reserve(&ix->pending, 2u + len) == 0) {
    index_bytes_append(&ix->pending, hdr, 2);
    index_bytes_append(&ix->pending, key, len);
  }
}

void index_pending_object(store_index_t *ix, uint64_t id) {
  uint8_t rec[10] = {'o', 8};
  put_be64(rec + 2, id);
  index_bytes_append(&ix->pending, rec, sizeof(rec));
}

/* ------------------------------------------------------------------------ */
/* Objects                                                                   */

static bool obj_eq(const void *item, const void *key) {
  return ((const object_t *)item)->id == *(const uint64_t *)key;
}

static object_t *obj_find(store_index_t *ix, uint64_t id) {
  long i = map_find(&ix->objects, mix64(id), obj_eq, &id);
  return i < 0 ? NULL : ix->objects.slots[i].p;
}

object_t *index_obj_get(store_index_t *ix, uint64_t id) {
  object_t *o = obj_find(ix, id);
  if (o != NULL) return o;
  o = calloc(1, sizeof(*o));
  if (o == NULL) return NULL;
  o->id = id;
  if (map_insert(&ix->objects, mix64(id), o) != 0) {
    free(o);
    return NULL;
  }
  return o;
}

/* Frees o if nothing refers to it any more: no entry, and another identity
 * of its name registered since (the names map refers to that one).  Other
 * objects stay, so that a name outlives its entries' eviction; superseded
 * ones would otherwise pile up, one per file per rewrite, for the life of
 * the daemon. */
static void obj_free_if_done(store_index_t *ix, object_t *o) {
  if (o->refs != 0 || !o->superseded) return;
  map_remove_ptr(&ix->objects, mix64(o->id), o);
  free(o->name);
  free(o->identity);
  free(o);
}

void index_obj_unref(store_index_t *ix, object_t *o) {
  if (--o->refs == 0 && o->on_disk) {
    index_pending_object(ix, o->id);
    o->on_disk = false;
  }
  obj_free_if_done(ix, o);
}

static void obj_add_present(store_index_t *ix, entry_t *e, int64_t last_use) {
  object_t *o = e->obj;
  if (o->entries++ == 0) ix->live_objects++;
  o->bytes += e->size;
  if (last_use > o->last_use) o->last_use = last_use;
  e->oprev = NULL;
  e->onext = o->present;
  if (o->present) o->present->oprev = e;
  o->present = e;
}

static void obj_del_present(store_index_t *ix, entry_t *e) {
  object_t *o = e->obj;
  o->bytes -= e->size;
  if (--o->entries == 0) ix->live_objects--;
  if (e->oprev) e->oprev->onext = e->onext;
  else o->present = e->onext;
  if (e->onext) e->onext->oprev = e->oprev;
  e->oprev = e->onext = NULL;
}

/* ------------------------------------------------------------------------ */
/* Entries: heap, recency list, map                                          */

typedef struct keyref {
  const uint8_t *p;
  uint8_t len;
} keyref_t;

static bool entry_eq(const void *item, const void *key) {
  const entry_t *e = item;
  const keyref_t *k = key;
  return e->keylen == k->len && memcmp(e->key, k->p, k->len) == 0;
}

entry_t *index_entry_find(store_index_t *ix, const uint8_t *key, uint8_t len, uint64_t h) {
  keyref_t k = {key, len};
  long i = map_find(&ix->entries, h, entry_eq, &k);
  return i < 0 ? NULL : ix->entries.slots[i].p;
}

/* The heap's order: worse priority first, and among equal priorities
 * (every unit of a row group shares one) the later put first, so that the
 * entries of one put (the columns of one unit) are adjacent in it and
 * evict_down can take them together. */
static bool heap_worse(const entry_t *a, const entry_t *b) {
  return a->priority != b->priority ? a->priority > b->priority : a->gen > b->gen;
}

static void heap_set(store_index_t *ix, size_t i, entry_t *e) {
  ix->heap[i] = e;
  e->heap_pos = (uint32_t)i;
}

static void heap_up(store_index_t *ix, size_t i) {
  entry_t *e = ix->heap[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!heap_worse(e, ix->heap[parent])) break;
    heap_set(ix, i, ix->heap[parent]);
    i = parent;
  }
  heap_set(ix, i, e);
}

static void heap_down(store_index_t *ix, size_t i) {
  entry_t *e = ix->heap[i];
  for (;;) {
    size_t l = 2 * i + 1, best = i;
    const entry_t *b = e;
    if (l < ix->heap_len && heap_worse(ix->heap[l], b)) {
      best = l;
      b = ix->heap[l];
    }
    if (l + 1 < ix->heap_len && heap_worse(ix->heap[l + 1], b)) best = l + 1;
    if (best == i) break;
    heap_set(ix, i, ix->heap[best]);
    i = best;
  }
  heap_set(ix, i, e);
}

static int heap_push(store_index_t *ix, entry_t *e) {
  if (ix->heap_len == ix->heap_cap) {
    size_t nc = ix->heap_cap ? ix->heap_cap * 2 : 1024;
    entry_t **nh = realloc(ix->heap, nc * sizeof(entry_t *));
    if (nh == NULL) return LARDER_ENOMEM;
    ix->heap = nh;
    ix->heap_cap = nc;
  }
  heap_set(ix, ix->heap_len++, e);
  heap_up(ix, ix->heap_len - 1);
  return 0;
}

static void heap_remove(store_index_t *ix, entry_t *e) {
  size_t i = e->heap_pos;
  if (i == HEAP_NONE) return;
  e->heap_pos = HEAP_NONE;
  entry_t *last = ix->heap[--ix->heap_len];
  if (last == e) return;
  heap_set(ix, i, last);
  heap_up(ix, i);
  heap_down(ix, last->heap_pos);
}

static void lru_unlink(store_index_t *ix, entry_t *e) {
  if (e->prev) e->prev->next = e->next;
  else ix->lru_head = e->next;
  if (e->next) e->next->prev = e->prev;
  else ix->lru_tail = e->prev;
  e->prev = e->next = NULL;
}

static void lru_append(store_index_t *ix, entry_t *e) {
  e->prev = ix->lru_tail;
  e->next = NULL;
  if (ix->lru_tail) ix->lru_tail->next = e;
  else ix->lru_head = e;
  ix->lru_tail = e;
}

void index_touch(store_index_t *ix, entry_t *e, int64_t now) {
  if (now > e->last_use) e->last_use = now;
  e->touch = ++ix->touch_counter;
  if (e->obj->last_use < e->last_use) e->obj->last_use = e->last_use;
  if (ix->lru_tail != e) {
    lru_unlink(ix, e);
    lru_append(ix, e);
  }
}

/* ------------------------------------------------------------------------ */
/* Identities of one name                                                    */

static bool name_eq(const void *item, const void *key) {
  const object_t *o = item;
  return o->name != NULL && strcmp(o->name, key) == 0;
}

static uint64_t name_hash(const char *name) {
  return index_hash_key((const uint8_t *)name, strlen(name));
}

/* Ranks o's entries below every other: o is an older identity of a name
 * whose newer one was registered since (a file rewritten, or only touched:
 * its ctime is part of its identity; an object replaced).  Only a stream
 * that opened on the old identity reads them again, so they are served
 * while they last and are the first to go when room is needed, instead of
 * keeping their share of the cache at their random priorities until they
 * go idle, days later. */
static void obj_supersede(store_index_t *ix, object_t *o) {
  o->superseded = true;
  for (entry_t *e = o->present; e != NULL; e = e->onext) {
    if (e->priority == UINT64_MAX) continue;
    bool in_heap = e->heap_pos != HEAP_NONE;
    if (in_heap) heap_remove(ix, e);
    e->priority = UINT64_MAX;
    /* Cannot fail: heap_remove left room. */
    if (in_heap) (void)heap_push(ix, e);
  }
}

/* Makes o the current identity of its name, superseding the one before,
 * and marks its entries used: a dataset that names o was just opened, so
 * they are about to be read.  Otherwise a job that resumes after a pause
 * longer than idle_evict_s would find all its entries idle, and the misses
 * of its first epoch would evict its own best entries before it reads
 * them.  At most once per persist granularity, so that a dataset opened
 * often costs a walk of its entries rarely. */
void index_name_register(store_index_t *ix, object_t *o, int64_t now) {
  if (o->present != NULL && now - o->refreshed >= ix->persist_granularity) {
    for (entry_t *e = o->present; e != NULL; e = e->onext) index_touch(ix, e, now);
    o->refreshed = now;
  }
  if (o->name == NULL) return;
  uint64_t h = name_hash(o->name);
  long i = map_find(&ix->names, h, name_eq, o->name);
  if (i >= 0) {
    object_t *cur = ix->names.slots[i].p;
    if (cur == o) return;
    ix->names.slots[i].p = o; /* the same name, so the same slot */
    obj_supersede(ix, cur);
    if (cur->refs == 0 && cur->on_disk) { /* a record without entries */
      index_pending_object(ix, cur->id);
      cur->on_disk = false;
    }
    obj_free_if_done(ix, cur);
  } else if (map_insert(&ix->names, h, o) != 0) {
    /* No memory for the map: o's next identity will not supersede it. */
  }
  o->superseded = false;
}

void index_obj_rename(store_index_t *ix, object_t *o, char *name, char *identity, int64_t now) {
  if (o->name != NULL) map_remove_ptr(&ix->names, name_hash(o->name), o);
  free(o->name);
  free(o->identity);
  o->name = name;
  o->identity = identity;
  index_name_register(ix, o, now);
}

/* At open: of the identities of a name found on disk, the one used last is
 * taken for the current one until a dataset registers one; on a tie none
 * is superseded (the wrong one would lose its place). */
static void names_at_open(store_index_t *ix) {
  for (size_t j = 0; j <= ix->objects.mask; j++) {
    object_t *o = ix->objects.slots[j].p;
    if (o == NULL || o->name == NULL) continue;
    uint64_t h = name_hash(o->name);
    long i = map_find(&ix->names, h, name_eq, o->name);
    if (i < 0) {
      if (map_insert(&ix->names, h, o) != 0) return;
      continue;
    }
    object_t *cur = ix->names.slots[i].p;
    if (o->last_use > cur->last_use) {
      ix->names.slots[i].p = o;
      obj_supersede(ix, cur);
    } else if (o->last_use < cur->last_use) {
      obj_supersede(ix, o);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Eviction                                                                  */

static bool is_idle(const store_index_t *ix, const entry_t *e, int64_t now) {
  return now - e->last_use >= (int64_t)ix->idle_s;
}

/* Drops a present entry from the index and queues its deletion. */
void index_drop_present(store_index_t *ix, entry_t *e) {
  heap_remove(ix, e);
  lru_unlink(ix, e);
  map_remove_ptr(&ix->entries, e->h, e);
  ix->used -= e->size;
  ix->present--;
  obj_del_present(ix, e);
  index_pending_entry(ix, e->key, e->keylen);
  index_obj_unref(ix, e->obj);
  free(e);
}

void index_evict_entry(store_index_t *ix, entry_t *e) {
  ix->stats->evictions++;
  ix->stats->evicted_bytes += e->size;
  index_drop_present(ix, e);
}

/* Evicts e and the other entries of the put that wrote it, all on top of
 * the heap (heap_worse).  A unit is read from the cache only when every
 * column it needs is there (units.c), so the columns left behind by an
 * eviction that stopped halfway through a unit would take room and never
 * serve a read, and the unit, refused again as the worst, would stay half
 * cached.  Entries loaded at open (generation 0) do not know their put and
 * go one by one. */
static void evict_put(store_index_t *ix, entry_t *e) {
  uint64_t priority = e->priority, gen = e->gen;
  index_evict_entry(ix, e);
  while (gen != 0 && ix->heap_len > 0 && ix->heap[0]->priority == priority &&
         ix->heap[0]->gen == gen)
    index_evict_entry(ix, ix->heap[0]);
}

/* Drops a reserved (or writing) entry. */
void index_drop_reserved(store_index_t *ix, entry_t *e) {
  map_remove_ptr(&ix->entries, e->h, e);
  ix->reserved -= e->size;
  index_obj_unref(ix, e->obj);
  free(e);
}

/* Evicts until used + reserved <= target: idle entries first, then the
 * worst priorities; unless any_priority, only entries of priority > floor
 * (strictly worse) go.  Reserved entries are never evicted. */
void index_evict_down(store_index_t *ix, uint64_t target, bool any_priority, uint64_t floor,
                      int64_t now) {
  while (ix->used + ix->reserved > target && ix->lru_head != NULL && is_idle(ix, ix->lru_head, now))
    index_evict_entry(ix, ix->lru_head);
  while (ix->used + ix->reserved > target && ix->heap_len > 0) {
    entry_t *top = ix->heap[0];
    if (!any_priority && top->priority <= floor) break;
    evict_put(ix, top);
  }
}

/* ------------------------------------------------------------------------ */
/* Life: init, load, free                                                    */

static void free_all_entries(store_index_t *ix) {
  if (ix->entries.slots == NULL) return;
  for (size_t i = 0; i <= ix->entries.mask; i++) free(ix->entries.slots[i].p);
  map_free(&ix->entries);
}

static void free_all_objects(store_index_t *ix) {
  if (ix->objects.slots == NULL) return;
  for (size_t i = 0; i <= ix->objects.mask; i++) {
    object_t *o = ix->objects.slots[i].p;
    if (o == NULL) continue;
    free(o->name);
    free(o->identity);
    free(o);
  }
  map_free(&ix->objects);
  map_free(&ix->names);
}

int index_init(store_index_t *ix, uint32_t idle_s, int64_t persist_granularity,
               store_stats_t *stats) {
  memset(ix, 0, sizeof(*ix));
  ix->idle_s = idle_s;
  ix->persist_granularity = persist_granularity;
  ix->stats = stats;
  int rc = map_init(&ix->entries, 1024);
  if (!rc) rc = map_init(&ix->objects, 64);
  if (!rc) rc = map_init(&ix->names, 64);
  return rc;
}

void index_free(store_index_t *ix) {
  free_all_entries(ix);
  free_all_objects(ix);
  free(ix->heap);
  free(ix->pending.p);
  free(ix->scratch);
}

int index_load_entry(store_index_t *ix, const uint8_t *key, uint8_t len, uint64_t size,
                     uint64_t priority, uint64_t object_id, int64_t last_use) {
  entry_t *e = calloc(1, sizeof(*e) + len);
  if (e == NULL) return LARDER_ENOMEM;
  e->keylen = len;
  memcpy(e->key, key, len);
  e->h = index_hash_key(key, len);
  e->size = size;
  e->priority = priority;
  e->last_use = e->saved_use = last_use;
  e->heap_pos = HEAP_NONE;
  e->state = ST_PRESENT;
  e->obj = index_obj_get(ix, object_id);
  if (e->obj == NULL || map_insert(&ix->entries, e->h, e) != 0) {
    free(e);
    return LARDER_ENOMEM;
  }
  e->obj->refs++;
  obj_add_present(ix, e, e->last_use);
  ix->used += e->size;
  ix->present++;
  return 0;
}

static int cmp_last_use(const void *a, const void *b) {
  const entry_t *x = *(entry_t *const *)a, *y = *(entry_t *const *)b;
  return (x->last_use > y->last_use) - (x->last_use < y->last_use);
}

/* After loading: the recency list sorted by last use, and the heap. */
static int build_order(store_index_t *ix) {
  size_t n = ix->entries.count;
  if (n == 0) return 0;
  entry_t **v = malloc(n * sizeof(entry_t *));
  if (v == NULL) return LARDER_ENOMEM;
  size_t j = 0;
  for (size_t i = 0; i <= ix->entries.mask; i++)
    if (ix->entries.slots[i].p) v[j++] = ix->entries.slots[i].p;
  qsort(v, n, sizeof(entry_t *), cmp_last_use);
  for (size_t i = 0; i < n; i++) lru_append(ix, v[i]);
  free(ix->heap);
  ix->heap = v; /* reuse the array as the heap, then heapify */
  ix->heap_cap = n;
  ix->heap_len = n;
  for (size_t i = 0; i < n; i++) v[i]->heap_pos = (uint32_t)i;
  for (size_t i = n / 2; i-- > 0;) heap_down(ix, i);
  return 0;
}

int index_loaded(store_index_t *ix) {
  names_at_open(ix);
  int rc = build_order(ix);
  if (rc != 0) return rc;
  /* Objects without entries lose their records. */
  for (size_t i = 0; i <= ix->objects.mask; i++) {
    object_t *o = ix->objects.slots[i].p;
    if (o != NULL && o->refs == 0 && o->on_disk) {
      index_pending_object(ix, o->id);
      o->on_disk = false;
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Admission                                                                 */

static int scratch_push(store_index_t *ix, size_t *len, uint32_t v) {
  if (*len == ix->scratch_cap) {
    size_t nc = ix->scratch_cap ? ix->scratch_cap * 2 : 256;
    uint32_t *ns = realloc(ix->scratch, nc * sizeof(*ns));
    if (ns == NULL) return LARDER_ENOMEM;
    ix->scratch = ns;
    ix->scratch_cap = nc;
  }
  ix->scratch[(*len)++] = v;
  return 0;
}

/* Whether `need` bytes can be freed from idle entries and entries worse
 * than priority; changes nothing. */
bool index_can_free(store_index_t *ix, uint64_t need, uint64_t priority, int64_t now) {
  uint64_t avail = 0;
  size_t marked = 0;
  for (entry_t *e = ix->lru_head; e && avail < need && is_idle(ix, e, now); e = e->next) {
    avail += e->size;
    e->mark = 1;
    marked++;
  }
  /* Heap entries worse than priority form a subtree at the root. */
  size_t sp = 0;
  if (avail < need && ix->heap_len > 0 && scratch_push(ix, &sp, 0) != 0) sp = 0;
  while (sp > 0 && avail < need) {
    uint32_t i = ix->scratch[--sp];
    entry_t *e = ix->heap[i];
    if (e->priority <= priority) continue;
    if (!e->mark) avail += e->size;
    size_t l = 2 * (size_t)i + 1;
    if (l < ix->heap_len && scratch_push(ix, &sp, (uint32_t)l) != 0) break;
    if (l + 1 < ix->heap_len && scratch_push(ix, &sp, (uint32_t)(l + 1)) != 0) break;
  }
  entry_t *e = ix->lru_head;
  for (size_t i = 0; i < marked; i++, e = e->next) e->mark = 0;
  return avail >= need;
}

/* The present entries for which pick(e, arg) holds, in a malloc'd array
 * (*n set).  Collected first and dropped afterwards, because a
 * removal from the map moves other entries between slots. */
entry_t **index_collect(store_index_t *ix, bool (*pick)(const entry_t *, void *), void *arg,
                        size_t *n) {
  *n = 0;
  entry_t **v = malloc((ix->entries.count ? ix->entries.count : 1) * sizeof(entry_t *));
  if (v == NULL) return NULL;
  for (size_t i = 0; i <= ix->entries.mask; i++) {
    entry_t *e = ix->entries.slots[i].p;
    if (e != NULL && e->state == ST_PRESENT && pick(e, arg)) v[(*n)++] = e;
  }
  return v;
}

/* ------------------------------------------------------------------------ */
/* Writes: reservations claimed, committed or abandoned                      */

int index_reserve(store_index_t *ix, uint64_t capacity, uint64_t object_id, const store_key_t *keys,
                  const uint64_t *sizes, int n, uint64_t total, uint64_t priority, int64_t now) {
  bool admit = total <= capacity;
  for (int i = 0; i < n && admit; i++)
    if (index_entry_find(ix, keys[i].bytes, keys[i].len,
                         index_hash_key(keys[i].bytes, keys[i].len)) != NULL)
      admit = false;
  if (admit && ix->used + ix->reserved + total > capacity) {
    uint64_t need = ix->used + ix->reserved + total - capacity;
    admit = index_can_free(ix, need, priority, now);
    if (admit) index_evict_down(ix, capacity - total, false, priority, now);
    admit = ix->used + ix->reserved + total <= capacity;
  }
  object_t *o = admit ? index_obj_get(ix, object_id) : NULL;
  if (admit && o == NULL) return LARDER_ENOMEM;
  int made = 0;
  int rc = admit ? 1 : 0;
  for (int i = 0; i < n && admit; i++) {
    const store_key_t *k = &keys[i];
    entry_t *e = calloc(1, sizeof(*e) + k->len);
    uint64_t h = index_hash_key(k->bytes, k->len);
    if (e != NULL) {
      e->keylen = k->len;
      memcpy(e->key, k->bytes, k->len);
      e->h = h;
      e->size = sizes[i];
      e->priority = priority;
      e->heap_pos = HEAP_NONE;
      e->state = ST_RESERVED;
      e->obj = o;
    }
    if (e == NULL || map_insert(&ix->entries, h, e) != 0) {
      free(e);
      rc = LARDER_ENOMEM;
      break;
    }
    o->refs++;
    ix->reserved += e->size;
    made++;
  }
  if (rc < 0) {
    /* Undo the reservations made so far. */
    for (int i = 0; i < made; i++) {
      entry_t *e = index_entry_find(ix, keys[i].bytes, keys[i].len,
                                    index_hash_key(keys[i].bytes, keys[i].len));
      if (e) index_drop_reserved(ix, e);
    }
  }
  return rc;
}

int index_claim(store_index_t *ix, uint64_t object_id, uint64_t priority,
                const store_entry_t *entries, int n, entry_t **es, object_t **obj) {
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const store_key_t *k = &entries[i].key;
    es[i] = index_entry_find(ix, k->bytes, k->len, index_hash_key(k->bytes, k->len));
    if (es[i] == NULL || es[i]->state != ST_RESERVED) rc = LARDER_EINVAL;
  }
  object_t *o = rc == 0 ? index_obj_get(ix, object_id) : NULL;
  if (rc == 0 && o == NULL) rc = LARDER_ENOMEM;
  if (rc == 0) {
    for (int i = 0; i < n; i++) {
      entry_t *e = es[i];
      e->state = ST_WRITING;
      e->priority = priority;
      if (e->obj != o) { /* reserved under another object id */
        o->refs++;
        index_obj_unref(ix, e->obj);
        e->obj = o;
      }
    }
  }
  *obj = o;
  return rc;
}

void index_commit(store_index_t *ix, entry_t **es, const store_entry_t *entries, int n, object_t *o,
                  uint64_t priority, uint64_t capacity, int64_t now) {
  uint64_t total = 0;
  uint64_t gen = ++ix->gen_counter;
  for (int i = 0; i < n; i++) {
    entry_t *e = es[i];
    ix->reserved -= e->size;
    e->size = entries[i].size;
    e->last_use = e->saved_use = now;
    e->gen = gen;
    e->touch = ++ix->touch_counter;
    e->state = ST_PRESENT;
    ix->used += e->size;
    ix->present++;
    total += e->size;
    obj_add_present(ix, e, now);
    lru_append(ix, e);
    if (heap_push(ix, e) != 0) {
      /* No memory for the heap: forget the entry (deleted later). */
      ix->used -= e->size;
      ix->present--;
      obj_del_present(ix, e);
      lru_unlink(ix, e);
      map_remove_ptr(&ix->entries, e->h, e);
      index_pending_entry(ix, e->key, e->keylen);
      index_obj_unref(ix, o);
      free(e);
    }
  }
  ix->stats->puts++;
  ix->stats->put_bytes += total;
  /* Real sizes above the reserved ones: get back under the capacity,
   * evicting only idle or worse entries (overshoot <= this unit). */
  index_evict_down(ix, capacity, false, priority, now);
}

void index_abort(store_index_t *ix, entry_t **es, int n) {
  /* A batch can reach the WAL and still report an error (a failed sync):
   * make sure no value outlives its failed put.  A later put of the same
   * key supersedes these deletes. */
  for (int i = 0; i < n; i++) {
    index_pending_entry(ix, es[i]->key, es[i]->keylen);
    index_drop_reserved(ix, es[i]);
  }
}
