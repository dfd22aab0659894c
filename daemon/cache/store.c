/*
 * store.c: the decoded-data cache on the node's SSD (see store.h).
 *
 * On-disk layout (one RocksDB database, default column family)
 * ------------------------------------------------------------
 * Keys start with a one-byte record type, so that each kind lives in its own
 * key range and the index can be loaded without touching any value:
 *
 *   'i' + key        index record of an entry (40 bytes, little-endian):
 *                    u32 magic "LRDI", u16 version, u16 flags, u64 value
 *                    size, u64 priority, u64 object id, i64 last use
 *   'm' + "format"   u32 format version of the whole cache
 *   'o' + u64 id(BE) object record: u32 magic "LRDO", u16 version, u16 flags,
 *                    u32 name length, u32 identity length, name, identity
 *   'v' + key        value record: a 32-byte header then the payload
 *   'f' + name       footer record (store_footer_put): u32 magic "LRDF",
 *                    u16 version, u16 flags, u32 CRC32C of the payload, u32
 *                    payload length, then the payload (the caller's)
 *
 * Value header (32 bytes, little-endian): u32 magic "LRDV", u16 format
 * version, u16 flags, u32 CRC32C of the payload, u32 CRC32C of the header
 * (bytes 0-11 and 16-31), u64 payload length, u64 reserved (0).  A read
 * checks the magic, the version, the header CRC, that the length matches
 * both the record and the index, and the payload CRC.  32 bytes keep the
 * payload as aligned as RocksDB's buffer (16 bytes for blobs and memtable
 * copies); store_value_data() is always at least 8-byte aligned (a value
 * RocksDB returns misaligned, which happens only for small values inlined
 * in an SST block, is copied).
 *
 * Every store_put is one WriteBatch holding the value and index records of
 * all its entries (plus pending deletes and the object record), so after a
 * kill -9 a unit is wholly present or wholly absent, and a value record
 * never exists without its index record or the other way round.
 *
 * RocksDB options: integrated blob files for values >= min_blob_size (no
 * blob compression: decoded data must read fast), LZ4 for SST blocks (index
 * records, blob references, small values), blob GC on, a bounded LRU block
 * cache holding index and filter blocks too, bounded memtables and WAL,
 * max_open_files 512, writes without the WAL unless sync_writes (a crash
 * loses whole units written since the last flush, never part of one; see
 * store_open), paranoid checks (the default), and an info
 * LOG with header lines only (see setup_rocksdb_options: with assertions
 * compiled in, as in Debian's build, RocksDB's logger aborts the process
 * when it logs twice on a full disk).
 *
 * In-memory index
 * ---------------
 * index.c keeps every entry and object in memory (maps, a max-heap by
 * priority, a recency list) and decides admission and eviction; see
 * index.h.  It never does I/O: what it evicts is queued in its list of
 * pending deletes, which this file writes to RocksDB.
 * - last_use changes only in memory on a hit.  It is written back (index
 *   records rewritten) at most every STORE_PERSIST_INTERVAL_S seconds by a
 *   get or put that finds the write lock free, and at close, for entries
 *   whose last use moved by at least the persist granularity
 *   (min(idle_evict_s / 8, 1 hour)).  It only drives idle eviction.
 *
 * Locks: `mu` guards the index and the statistics and is never held across
 * I/O.  `wmu` serialises RocksDB writes (puts, deletes, last-use updates) so
 * that a delete queued by an eviction and a later put of the same key reach
 * RocksDB in the order the index saw them.  `dblk`, a read-write lock,
 * guards the database handle: gets, writes and verify share it, the reopen
 * after a write error (below) takes it alone.  `vmu` runs one store_verify
 * at a time.  Order: vmu, then wmu, then dblk, then mu (a leaf).
 *
 * Eviction never does I/O: evicted keys go to a pending-delete list that the
 * next write (normally the put that follows the reservation) carries in its
 * batch.  A crash before that leaves the evicted entries on disk; store_open
 * evicts down to the capacity again.
 *
 * Admission
 * ---------
 * store_reserve (index_reserve) admits n entries of total size S at
 * priority p iff the space they need (used + reserved + S - capacity) can
 * be freed from idle entries and entries strictly worse than p; the check
 * is done without changing anything (a walk of the list's idle prefix and
 * a pruned walk of the heap), and only then are the victims evicted, worst
 * first.  So the store never holds more than the capacity at reservation
 * time; a put whose real sizes exceed the reserved ones can overshoot by at
 * most that unit, and the put then evicts worse entries to get back under.
 *
 * Disk full (and other write errors)
 * -----------------------------------
 * A write that RocksDB fails with "No space left on device" (from the WAL
 * write or from a background flush, after which RocksDB fails every write)
 * returns LARDER_ENOSPC; other write errors return LARDER_EIO.  Either way
 * the put's reservations are released, its keys are queued for deletion (a
 * batch can reach the WAL and still fail), and writes stop: admission is
 * off, deletes stay queued, reads go on.  This is not optional: RocksDB 7.8
 * keeps a WAL writer that saw an error even after it recovers, and every
 * later append fails or, with assertions compiled in (Debian's build),
 * aborts.  After STORE_ENOSPC_RETRY_S seconds the next store_reserve starts
 * a background thread that reopens the database (fresh WAL) if the disk
 * has room, under an exclusive lock that gets and verify share; admission
 * then resumes.  Values handed out earlier stay valid across the reopen
 * (blob reads and memtable copies own their bytes; block-cache pins keep
 * the store's cache, which outlives the database handle).
 *
 * Before the disk gets full, store_reserve also checks statvfs: it refuses
 * a unit unless the filesystem would keep max(1 GiB, 5%) free (at most 10%
 * of a small filesystem, at least twice what an open needs) plus one
 * memtable's worth for the flush.  admission_disabled reports either
 * condition, and store_stats what the refusing check found free and
 * wanted.  store_open refuses (LARDER_ENOSPC) a disk with less than 16 MiB
 * free.  Both reservations scale down on a small filesystem (scale_to_disk:
 * a memtable of at most 1/16 of it, an open needing at most 1/8 free), so
 * that a 32 MiB cache holds what fits.
 *
 * Test hooks (not in store.h; tests/test-store.c declares them)
 * -------------------------------------------------------------
 *   store_test_advance_clock(st, s)  moves this store's wall and monotonic
 *                                    clocks s seconds ahead (idle eviction,
 *                                    the ENOSPC retry timer)
 *   store_test_fail_writes(st, code) makes every later RocksDB write fail as
 *                                    if RocksDB had returned the error for
 *                                    code (LARDER_ENOSPC or LARDER_EIO);
 *                                    0 turns it off.  For hosts where a
 *                                    small filesystem cannot be mounted.
 *   store_test_crc32c_sw / _hw / _hw_available
 *                                    the two CRC32C implementations
 *                                    (crc32c.c).
 */
#include "cache/store.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>

#include <rocksdb/c.h>

#include "larder.h"
#include "cache/crc32c.h"
#include "cache/index.h"

/* Test hooks, defined here and declared by tests/test-store.c only. */
void store_test_advance_clock(store_t *st, int64_t seconds);
void store_test_fail_writes(store_t *st, int code);

#define STORE_FORMAT_VERSION 1
#define VALUE_MAGIC 0x5644524cu  /* "LRDV" */
#define INDEX_MAGIC 0x4944524cu  /* "LRDI" */
#define OBJECT_MAGIC 0x4f44524cu /* "LRDO" */
#define VALUE_HDR 32
#define INDEX_REC 40
#define OBJ_REC_HDR 16

#define PFX_INDEX 'i'
#define PFX_META 'm'
#define PFX_OBJECT 'o'
#define PFX_VALUE 'v'
#define PFX_FOOTER 'f'

#define GIB (1024ull * 1024 * 1024)
#define MIB (1024ull * 1024)
#define DEFAULT_MIN_BLOB 4096
#define DEFAULT_BLOCK_CACHE (32 * MIB)
#define DEFAULT_WRITE_BUFFER (64 * MIB)
#define DEFAULT_FLUSH_THREADS 2
#define DEFAULT_IDLE_S (7u * 24 * 3600)
#define MAX_OPEN_FILES 512
#define OPEN_MIN_FREE (16 * MIB)
#define STORE_PERSIST_INTERVAL_S 600
#define PERSIST_BATCH_MAX 65536
#define NAME_MAX_LEN 1023
#define IDENTITY_MAX_LEN 255

/* ------------------------------------------------------------------------ */
/* Little-endian and big-endian helpers                                      */

static void put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get_u32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static void put_be64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
}
static uint64_t get_be64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
  return v;
}

struct store {
  rocksdb_t *db;
  rocksdb_options_t *dbopts;
  rocksdb_block_based_table_options_t *bbto;
  rocksdb_cache_t *cache;
  rocksdb_readoptions_t *ro_get;
  rocksdb_readoptions_t *ro_scan;
  rocksdb_writeoptions_t *wo;
  char *dir;
  char *dbdir;
  uint64_t min_blob, write_buffer;
  int flush_threads;
  uint32_t idle_s;
  int64_t persist_granularity;

  pthread_mutex_t mu;  /* index, stats */
  pthread_mutex_t wmu; /* RocksDB writes */
  pthread_mutex_t vmu; /* one store_verify at a time */

  uint64_t capacity;
  store_index_t ix;     /* entries, objects, pending deletes (mu) */
  int64_t last_persist; /* monotonic seconds */

  store_stats_t stats;
  bool writes_off;              /* a write failed: no more until the reopen */
  int writes_off_code;          /* what later writes return meanwhile */
  int64_t retry_at;             /* monotonic seconds: when to reopen */
  bool low_space;               /* the last statvfs check refused */
  uint64_t open_free;           /* free bytes open_db needs (scaled to the disk) */
  uint64_t low_avail, low_need; /* the refusing check's free bytes, and
                                   what it wanted free (statistics) */
  bool reopen_running;          /* a reopen thread is at work (mu) */
  bool reopen_started;          /* reopen_tid must be joined */
  pthread_t reopen_tid;
  pthread_rwlock_t dblk; /* st->db: shared by users, exclusive to reopen */

  _Atomic int64_t clock_offset;
  _Atomic int fail_writes;
};

/* ------------------------------------------------------------------------ */
/* Clocks                                                                    */

static int64_t wall_now(store_t *st) {
  return (int64_t)time(NULL) + atomic_load(&st->clock_offset);
}

static int64_t mono_now(store_t *st) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec + atomic_load(&st->clock_offset);
}

void store_test_advance_clock(store_t *st, int64_t seconds) {
  atomic_fetch_add(&st->clock_offset, seconds);
}

void store_test_fail_writes(store_t *st, int code) { atomic_store(&st->fail_writes, code); }

/* ------------------------------------------------------------------------ */
/* RocksDB errors: converted here, once                                      */

static int rdb_code(const char *msg) {
  if (msg == NULL) return 0;
  if (strstr(msg, "No space left") != NULL || strstr(msg, "NoSpace") != NULL) return LARDER_ENOSPC;
  if (strncmp(msg, "Corruption", 10) == 0) return LARDER_ECORRUPT;
  if (strstr(msg, "lock") != NULL && (strstr(msg, "Resource temporarily unavailable") != NULL ||
                                      strstr(msg, "No locks available") != NULL))
    return LARDER_EBUSY;
  if (strstr(msg, "Permission denied") != NULL) return LARDER_EACCES;
  if (strncmp(msg, "Invalid argument", 16) == 0) return LARDER_EINVAL;
  if (strncmp(msg, "Not implemented", 15) == 0) return LARDER_EUNSUPPORTED;
  return LARDER_EIO;
}

/* Turns *errp into a code, copying the message to msg, and frees it. */
static int rdb_take(char **errp, char *msg, size_t msglen) {
  if (*errp == NULL) return 0;
  int code = rdb_code(*errp);
  if (msg != NULL && msglen > 0) snprintf(msg, msglen, "%s", *errp);
  rocksdb_free(*errp);
  *errp = NULL;
  return code;
}

static void set_err(char *err, size_t errlen, const char *fmt, const char *a, const char *b) {
  if (err != NULL && errlen > 0) snprintf(err, errlen, fmt, a, b);
}

/* Writes a batch (wmu held).  A failed write turns writes (and so
 * admission) off until the database is reopened: RocksDB 7.8 keeps using a
 * WAL writer that saw an error after its own recovery, and every later
 * append to it fails ("Writer has previous error") or, with assertions
 * compiled in, aborts.  Reopening gives it a fresh WAL. */
static int db_write(store_t *st, rocksdb_writebatch_t *b) {
  pthread_mutex_lock(&st->mu);
  int off = st->writes_off ? st->writes_off_code : 0;
  pthread_mutex_unlock(&st->mu);
  if (off != 0) return off;
  char *e = NULL;
  int inj = atomic_load(&st->fail_writes);
  int code;
  if (inj != 0) {
    /* The test hook: the message RocksDB would give, through the same
     * conversion. */
    code = rdb_code(inj == LARDER_ENOSPC ? "IO error: No space left on device (injected)"
                                         : "IO error: injected write failure");
  } else {
    pthread_rwlock_rdlock(&st->dblk);
    if (st->db != NULL) rocksdb_write(st->db, st->wo, b, &e);
    else e = NULL;
    code = st->db == NULL ? LARDER_EIO : rdb_take(&e, NULL, 0);
    pthread_rwlock_unlock(&st->dblk);
    if (code == 0) return 0;
  }
  pthread_mutex_lock(&st->mu);
  st->stats.write_errors++;
  st->writes_off = true;
  st->writes_off_code = code;
  st->retry_at = mono_now(st) + STORE_ENOSPC_RETRY_S;
  pthread_mutex_unlock(&st->mu);
  return code;
}

/*
 * A set of the keys of one reservation or put, for the checks that compare
 * every key of a unit with every other (no two equal) or with every pending
 * delete (a put supersedes the deletes of its own keys).  A unit of a file
 * with 100k columns is one put of 100k keys: comparing pairs cost 34 s of a
 * worker per unit, so the set is a hash table and each check is linear.
 * The keys stay the caller's: they lie stride bytes apart from first (a
 * store_key_t array, or the keys inside a store_entry_t array).
 */
typedef struct keyset {
  const store_key_t *first;
  size_t stride;
  int n;
  uint32_t *slot; /* key index + 1, 0 = empty; NULL when n is small */
  size_t mask;
} keyset_t;

#define KEYSET_LINEAR 16 /* up to this many keys a scan beats a table */

static const store_key_t *keyset_at(const keyset_t *ks, int i) {
  return (const store_key_t *)((const char *)ks->first + (size_t)i * ks->stride);
}

static bool key_is(const store_key_t *k, const uint8_t *bytes, size_t len) {
  return k->len == len && memcmp(k->bytes, bytes, len) == 0;
}

/* Looks key up among the first `upto` keys of ks (all of them once built). */
static bool keyset_has_upto(const keyset_t *ks, const uint8_t *bytes, size_t len, int upto) {
  if (ks->slot == NULL) {
    for (int i = 0; i < upto; i++)
      if (key_is(keyset_at(ks, i), bytes, len)) return true;
    return false;
  }
  for (size_t at = index_hash_key(bytes, len) & ks->mask; ks->slot[at] != 0;
       at = (at + 1) & ks->mask)
    if (key_is(keyset_at(ks, (int)ks->slot[at] - 1), bytes, len)) return true;
  return false;
}

static bool keyset_has(const keyset_t *ks, const uint8_t *bytes, size_t len) {
  return keyset_has_upto(ks, bytes, len, ks->n);
}

static void keyset_free(keyset_t *ks) {
  free(ks->slot);
  ks->slot = NULL;
}

/* Builds the set of n keys (n >= 0, each len <= STORE_KEY_MAX, checked by
 * the caller).  Returns 0; LARDER_EINVAL when two keys are equal;
 * LARDER_ENOMEM.  On failure nothing is left to free.  The table is at most
 * half full, so a probe run stays short whatever the keys.  Any thread. */
static int keyset_build(keyset_t *ks, const store_key_t *first, size_t stride, int n) {
  *ks = (keyset_t){first, stride, n, NULL, 0};
  if (n <= KEYSET_LINEAR) {
    for (int i = 1; i < n; i++) {
      const store_key_t *k = keyset_at(ks, i);
      if (keyset_has_upto(ks, k->bytes, k->len, i)) return LARDER_EINVAL;
    }
    return 0;
  }
  size_t cap = 64;
  while (cap < (size_t)n * 2) cap <<= 1;
  ks->slot = calloc(cap, sizeof(*ks->slot));
  if (ks->slot == NULL) return LARDER_ENOMEM;
  ks->mask = cap - 1;
  for (int i = 0; i < n; i++) {
    const store_key_t *k = keyset_at(ks, i);
    size_t at = index_hash_key(k->bytes, k->len) & ks->mask;
    for (; ks->slot[at] != 0; at = (at + 1) & ks->mask) {
      if (key_is(keyset_at(ks, (int)ks->slot[at] - 1), k->bytes, k->len)) {
        keyset_free(ks);
        return LARDER_EINVAL;
      }
    }
    ks->slot[at] = (uint32_t)i + 1;
  }
  return 0;
}

/* Builds RocksDB keys. */
static size_t make_key(uint8_t *out, char pfx, const uint8_t *key, size_t len) {
  out[0] = (uint8_t)pfx;
  memcpy(out + 1, key, len);
  return len + 1;
}

static size_t make_obj_key(uint8_t *out, uint64_t id) {
  out[0] = PFX_OBJECT;
  put_be64(out + 1, id);
  return 9;
}

/* Adds the deletes of pending records to b, skipping those superseded by
 * the keys of this put (skip_keys, or NULL) and objects in skip_obj. */
static void pending_to_batch(const bytes_t *pend, rocksdb_writebatch_t *b,
                             const keyset_t *skip_keys, uint64_t skip_obj, bool skip_obj_valid) {
  uint8_t k[1 + STORE_KEY_MAX];
  for (size_t off = 0; off + 2 <= pend->len;) {
    uint8_t type = pend->p[off];
    uint8_t len = pend->p[off + 1];
    const uint8_t *key = pend->p + off + 2;
    off += 2u + len;
    if (type == 'e') {
      if (skip_keys && keyset_has(skip_keys, key, len)) continue;
      size_t kl = make_key(k, PFX_VALUE, key, len);
      rocksdb_writebatch_delete(b, (const char *)k, kl);
      k[0] = PFX_INDEX;
      rocksdb_writebatch_delete(b, (const char *)k, kl);
    } else {
      uint64_t id = get_be64(key);
      if (skip_obj_valid && id == skip_obj) continue;
      size_t kl = make_obj_key(k, id);
      rocksdb_writebatch_delete(b, (const char *)k, kl);
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Record encoding                                                           */

static void encode_value_header(uint8_t *h, uint32_t crc, uint64_t len) {
  memset(h, 0, VALUE_HDR);
  put_u32(h, VALUE_MAGIC);
  put_u16(h + 4, STORE_FORMAT_VERSION);
  put_u16(h + 6, 0);
  put_u32(h + 8, crc);
  put_u64(h + 16, len);
  uint32_t hc = cache_crc32c(0, h, 12);
  hc = cache_crc32c(hc, h + 16, 16);
  put_u32(h + 12, hc);
}

/* 0 when v (vlen bytes) is a sound value record of expect bytes (or of any
 * size when expect is UINT64_MAX); LARDER_ECHECKSUM otherwise. */
static int check_value(const uint8_t *v, size_t vlen, uint64_t expect) {
  if (vlen < VALUE_HDR) return LARDER_ECHECKSUM;
  if (get_u32(v) != VALUE_MAGIC || get_u16(v + 4) != STORE_FORMAT_VERSION) return LARDER_ECHECKSUM;
  uint32_t hc = cache_crc32c(0, v, 12);
  hc = cache_crc32c(hc, v + 16, 16);
  if (hc != get_u32(v + 12)) return LARDER_ECHECKSUM;
  uint64_t len = get_u64(v + 16);
  if (len != vlen - VALUE_HDR) return LARDER_ECHECKSUM;
  if (expect != UINT64_MAX && len != expect) return LARDER_ECHECKSUM;
  if (cache_crc32c(0, v + VALUE_HDR, len) != get_u32(v + 8)) return LARDER_ECHECKSUM;
  return 0;
}

static void encode_index(uint8_t *r, uint64_t size, uint64_t priority, uint64_t object_id,
                         int64_t last_use) {
  put_u32(r, INDEX_MAGIC);
  put_u16(r + 4, STORE_FORMAT_VERSION);
  put_u16(r + 6, 0);
  put_u64(r + 8, size);
  put_u64(r + 16, priority);
  put_u64(r + 24, object_id);
  put_u64(r + 32, (uint64_t)last_use);
}

/* Appends an object record's value to b (for a put). */
static int encode_object(bytes_t *b, const object_t *o) {
  size_t nl = strlen(o->name), il = strlen(o->identity);
  uint8_t h[OBJ_REC_HDR];
  put_u32(h, OBJECT_MAGIC);
  put_u16(h + 4, STORE_FORMAT_VERSION);
  put_u16(h + 6, 0);
  put_u32(h + 8, (uint32_t)nl);
  put_u32(h + 12, (uint32_t)il);
  int rc = index_bytes_append(b, h, sizeof(h));
  if (!rc) rc = index_bytes_append(b, o->name, nl);
  if (!rc) rc = index_bytes_append(b, o->identity, il);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Options and open                                                          */

void store_options_init(store_options_t *opts) { memset(opts, 0, sizeof(*opts)); }

int store_default_flush_threads(int workers) {
  int n = workers / 4;
  return n < 2 ? 2 : n > 8 ? 8 : n;
}

static int mkdir_p(const char *path) {
  char buf[4096];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof(buf)) return -1;
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] == '/' || buf[i] == '\0') {
      char c = buf[i];
      buf[i] = '\0';
      if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
      buf[i] = c;
    }
  }
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return -1;
  return 0;
}

static void store_free(store_t *st) {
  if (st->db) {
    /* The WAL is off: flush so that a clean shutdown keeps everything. */
    rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
    char *err = NULL;
    rocksdb_flushoptions_set_wait(fo, 1);
    rocksdb_flush(st->db, fo, &err);
    free(err);
    rocksdb_flushoptions_destroy(fo);
    rocksdb_close(st->db);
  }
  if (st->ro_get) rocksdb_readoptions_destroy(st->ro_get);
  if (st->ro_scan) rocksdb_readoptions_destroy(st->ro_scan);
  if (st->wo) rocksdb_writeoptions_destroy(st->wo);
  if (st->dbopts) rocksdb_options_destroy(st->dbopts);
  if (st->bbto) rocksdb_block_based_options_destroy(st->bbto);
  if (st->cache) rocksdb_cache_destroy(st->cache);
  index_free(&st->ix);
  free(st->dir);
  free(st->dbdir);
  pthread_mutex_destroy(&st->mu);
  pthread_mutex_destroy(&st->wmu);
  pthread_mutex_destroy(&st->vmu);
  pthread_rwlock_destroy(&st->dblk);
  free(st);
}

static void setup_rocksdb_options(store_t *st) {
  rocksdb_options_t *o = rocksdb_options_create();
  st->dbopts = o;
  rocksdb_options_set_create_if_missing(o, 1);
  /* Values: integrated blob files, uncompressed, garbage-collected. */
  rocksdb_options_set_enable_blob_files(o, 1);
  rocksdb_options_set_min_blob_size(o, st->min_blob);
  rocksdb_options_set_blob_file_size(o, 128 * MIB);
  rocksdb_options_set_blob_compression_type(o, rocksdb_no_compression);
  rocksdb_options_set_enable_blob_gc(o, 1);
  rocksdb_options_set_blob_gc_age_cutoff(o, 0.25);
  /* Small records in SSTs: LZ4. */
  rocksdb_options_set_compression(o, rocksdb_lz4_compression);
  rocksdb_options_set_bottommost_compression(o, rocksdb_lz4_compression);
  /* Deleted entries leave tombstones; compact files full of them so that
   * their blob files become garbage sooner. */
  rocksdb_options_add_compact_on_deletion_collector_factory(o, 4096, 2048);
  /* Memory and write rate: bounded memtables (and block cache, below),
   * several memtables flushed at once.  A cold epoch puts decoded units as
   * fast as every worker decodes them; with RocksDB's one flush thread and
   * two memtables, puts stopped whenever both were full, and one thread's
   * flush rate (0.5-0.8 GB/s of values on the development VM) capped how
   * fast any number of cores filled the cache. */
  int memtables = st->flush_threads + 2;
  rocksdb_options_set_write_buffer_size(o, st->write_buffer);
  rocksdb_options_set_max_write_buffer_number(o, memtables);
  rocksdb_options_set_db_write_buffer_size(o, (size_t)memtables * st->write_buffer);
  rocksdb_options_set_max_total_wal_size(o, (uint64_t)(memtables + 2) * st->write_buffer);
  st->bbto = rocksdb_block_based_options_create();
  rocksdb_block_based_options_set_block_cache(st->bbto, st->cache);
  rocksdb_block_based_options_set_cache_index_and_filter_blocks(st->bbto, 1);
  rocksdb_block_based_options_set_filter_policy(st->bbto,
                                                rocksdb_filterpolicy_create_bloom_full(10));
  rocksdb_options_set_block_based_table_factory(o, st->bbto);
  rocksdb_options_set_max_open_files(o, MAX_OPEN_FILES);
  rocksdb_options_set_max_background_flushes(o, st->flush_threads);
  rocksdb_options_set_max_background_compactions(o, 3);
  /* The info LOG gets header lines only (written at open; store_open
   * refuses a nearly full disk first): Debian's librocksdb keeps its
   * assertions, and RocksDB's file logger appends again after a failed
   * append, which asserts in WritableFileWriter
   * ("sync_without_flush_called_") and aborts the daemon as soon as the
   * cache disk fills up and RocksDB logs the error. */
  rocksdb_options_set_info_log_level(o, 5 /* HEADER_LEVEL */);
  rocksdb_options_set_keep_log_file_num(o, 4);
  rocksdb_options_set_max_log_file_size(o, MIB);
  rocksdb_options_set_stats_dump_period_sec(o, 0);
}

/* Reads the format record, writing it on a new cache. */
static int check_format(store_t *st, char *err, size_t errlen) {
  static const char mkey[] = "mformat";
  char *e = NULL;
  size_t vlen = 0;
  char *v = rocksdb_get(st->db, st->ro_scan, mkey, sizeof(mkey) - 1, &vlen, &e);
  int rc = rdb_take(&e, err, errlen);
  if (rc) return rc;
  if (v != NULL) {
    uint32_t ver = vlen == 4 ? get_u32((const uint8_t *)v) : 0;
    rocksdb_free(v);
    if (ver != STORE_FORMAT_VERSION) {
      if (err && errlen)
        snprintf(err, errlen, "cache format %u is not %d", ver, STORE_FORMAT_VERSION);
      return LARDER_EUNSUPPORTED;
    }
    return 0;
  }
  uint8_t ver[4];
  put_u32(ver, STORE_FORMAT_VERSION);
  rocksdb_put(st->db, st->wo, mkey, sizeof(mkey) - 1, (const char *)ver, 4, &e);
  return rdb_take(&e, err, errlen);
}

/* Iterates [lo, hi) calling fn for each record; returns 0 or a code. */
static int scan_range(store_t *st, char lo, char hi,
                      int (*fn)(store_t *st, const uint8_t *k, size_t kl, const uint8_t *v,
                                size_t vl),
                      char *err, size_t errlen) {
  char lower[1] = {lo}, upper[1] = {hi};
  rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
  if (ro == NULL) return LARDER_ENOMEM;
  rocksdb_readoptions_set_iterate_lower_bound(ro, lower, 1);
  rocksdb_readoptions_set_iterate_upper_bound(ro, upper, 1);
  rocksdb_readoptions_set_fill_cache(ro, 0);
  rocksdb_iterator_t *it = rocksdb_create_iterator(st->db, ro);
  int rc = 0;
  for (rocksdb_iter_seek(it, lower, 1); rocksdb_iter_valid(it) && rc == 0; rocksdb_iter_next(it)) {
    size_t kl = 0, vl = 0;
    const char *k = rocksdb_iter_key(it, &kl);
    const char *v = rocksdb_iter_value(it, &vl);
    rc = fn(st, (const uint8_t *)k, kl, (const uint8_t *)v, vl);
  }
  if (rc == 0) {
    char *e = NULL;
    rocksdb_iter_get_error(it, &e);
    rc = rdb_take(&e, err, errlen);
  }
  rocksdb_iter_destroy(it);
  rocksdb_readoptions_destroy(ro);
  return rc;
}

static char *strndup_or_empty(const uint8_t *p, size_t n) {
  char *s = malloc(n + 1);
  if (s == NULL) return NULL;
  if (n) memcpy(s, p, n);
  s[n] = '\0';
  return s;
}

static int load_object(store_t *st, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl) {
  bool ok = kl == 9 && vl >= OBJ_REC_HDR && get_u32(v) == OBJECT_MAGIC;
  uint32_t nl = ok ? get_u32(v + 8) : 0, il = ok ? get_u32(v + 12) : 0;
  ok = ok && (uint64_t)OBJ_REC_HDR + nl + il == vl && nl <= NAME_MAX_LEN && il <= IDENTITY_MAX_LEN;
  if (!ok) {
    /* A record we cannot read: drop it (entries keep an unnamed object). */
    if (kl == 9) index_pending_object(&st->ix, get_be64(k + 1));
    return 0;
  }
  object_t *o = index_obj_get(&st->ix, get_be64(k + 1));
  if (o == NULL) return LARDER_ENOMEM;
  free(o->name);
  free(o->identity);
  o->name = strndup_or_empty(v + OBJ_REC_HDR, nl);
  o->identity = strndup_or_empty(v + OBJ_REC_HDR + nl, il);
  if (o->name == NULL || o->identity == NULL) return LARDER_ENOMEM;
  o->on_disk = true;
  return 0;
}

static int load_index(store_t *st, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl) {
  if (kl < 1 || kl - 1 > STORE_KEY_MAX) return 0;
  const uint8_t *key = k + 1;
  uint8_t len = (uint8_t)(kl - 1);
  if (vl != INDEX_REC || get_u32(v) != INDEX_MAGIC || get_u16(v + 4) != STORE_FORMAT_VERSION) {
    index_pending_entry(&st->ix, key, len); /* unreadable: drop value and index */
    return 0;
  }
  return index_load_entry(&st->ix, key, len, get_u64(v + 8), get_u64(v + 16), get_u64(v + 24),
                          (int64_t)get_u64(v + 32));
}

static int flush_pending(store_t *st);

/*
 * Scales the space the cache reserves to its filesystem, so that a small
 * one (a 32 MiB tmpfs) caches what fits instead of nothing: a memtable of
 * at most a sixteenth of the disk (at least 1 MiB), since its flush needs
 * that much free, and an open that needs at most an eighth of the disk
 * free (at least 1 MiB, at most OPEN_MIN_FREE).  With the 64 MiB memtable
 * and 32 MiB reserve meant for real disks, a 32 MiB cache never admitted a
 * unit while 28 MiB were free.  A filesystem it cannot measure keeps the
 * defaults.  store_open, before the RocksDB options are made.
 */
static void scale_to_disk(store_t *st) {
  st->open_free = OPEN_MIN_FREE;
  struct statvfs sv;
  if (statvfs(st->dir, &sv) != 0) return;
  uint64_t total = (uint64_t)sv.f_blocks * sv.f_frsize;
  if (total == 0) return;
  uint64_t mt = total / 16 > MIB ? total / 16 : MIB;
  if (st->write_buffer > mt) st->write_buffer = mt;
  uint64_t of = total / 8 > MIB ? total / 8 : MIB;
  if (of < st->open_free) st->open_free = of;
}

static bool free_space_below(const char *dir, uint64_t bytes) {
  struct statvfs sv;
  return statvfs(dir, &sv) == 0 && (uint64_t)sv.f_bavail * sv.f_frsize < bytes;
}

/* Opens st->db (dblk held exclusively, or during store_open). */
static int open_db(store_t *st, char *err, size_t errlen) {
  /* RocksDB writes its LOG header, a MANIFEST and a WAL at open; on a full
   * disk its logger would abort the process (see setup_rocksdb_options). */
  if (free_space_below(st->dir, st->open_free)) {
    char need[64];
    snprintf(need, sizeof(need), " (the cache needs %llu KiB free to open)",
             (unsigned long long)(st->open_free / 1024));
    set_err(err, errlen, "%s: no space left on device%s", st->dir, need);
    return LARDER_ENOSPC;
  }
  char *e = NULL;
  st->db = rocksdb_open(st->dbopts, st->dbdir, &e);
  /* A file the database's own records name but the directory lacks (a
   * MANIFEST that CURRENT names, a table file) is corruption, whatever
   * error RocksDB calls it: the caller may discard such a cache. */
  int missing = e != NULL && strstr(e, "No such file or directory") != NULL;
  int rc = rdb_take(&e, err, errlen);
  if (rc == LARDER_EIO && missing) rc = LARDER_ECORRUPT;
  if (rc == 0 && st->db == NULL) rc = LARDER_EIO;
  if (rc != 0 && st->db != NULL) {
    rocksdb_close(st->db);
    st->db = NULL;
  }
  return rc;
}

/* The reopen after a failed write (see db_write).  The index stays: the
 * database holds what it said before the failure, plus at most the failed
 * put, whose keys were queued for deletion. */
static void *reopen_main(void *arg) {
  store_t *st = arg;
  pthread_mutex_lock(&st->wmu);
  int rc = LARDER_ENOSPC;
  /* Keep the old handle serving reads while there is no room to open. */
  if (!free_space_below(st->dir, st->open_free + st->write_buffer)) {
    pthread_rwlock_wrlock(&st->dblk);
    if (st->db != NULL) rocksdb_close(st->db);
    st->db = NULL;
    rc = open_db(st, NULL, 0);
    pthread_rwlock_unlock(&st->dblk);
  }
  pthread_mutex_lock(&st->mu);
  if (rc == 0) st->writes_off = false;
  pthread_mutex_unlock(&st->mu);
  if (rc == 0) flush_pending(st);
  pthread_mutex_lock(&st->mu);
  st->reopen_running = false;
  pthread_mutex_unlock(&st->mu);
  pthread_mutex_unlock(&st->wmu);
  return NULL;
}

/* Starts reopen_main (reopen_running was set by the caller). */
static void start_reopen(store_t *st) {
  if (st->reopen_started) pthread_join(st->reopen_tid, NULL);
  st->reopen_started = false;
  if (pthread_create(&st->reopen_tid, NULL, reopen_main, st) == 0) {
    st->reopen_started = true;
  } else {
    pthread_mutex_lock(&st->mu);
    st->reopen_running = false;
    pthread_mutex_unlock(&st->mu);
  }
}

int store_open(const store_options_t *opts, store_t **out, char *err, size_t errlen) {
  if (err && errlen) err[0] = '\0';
  if (out == NULL) return LARDER_EINVAL;
  *out = NULL;
  if (opts == NULL || opts->dir == NULL || opts->dir[0] == '\0') {
    set_err(err, errlen, "%s%s", "store: no cache directory", "");
    return LARDER_EINVAL;
  }
  if (mkdir_p(opts->dir) != 0) {
    int saved = errno;
    set_err(err, errlen, "cannot create %s: %s", opts->dir, strerror(saved));
    return saved == EACCES ? LARDER_EACCES : LARDER_EIO;
  }
  store_t *st = calloc(1, sizeof(*st));
  if (st == NULL) return LARDER_ENOMEM;
  pthread_mutex_init(&st->mu, NULL);
  pthread_mutex_init(&st->wmu, NULL);
  pthread_mutex_init(&st->vmu, NULL);
  pthread_rwlockattr_t rwa;
  pthread_rwlockattr_init(&rwa);
  /* A reopen must not wait behind a steady stream of reads. */
  pthread_rwlockattr_setkind_np(&rwa, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&st->dblk, &rwa);
  pthread_rwlockattr_destroy(&rwa);
  atomic_init(&st->clock_offset, 0);
  atomic_init(&st->fail_writes, 0);
  size_t dl = strlen(opts->dir);
  st->dir = strdup(opts->dir);
  st->dbdir = malloc(dl + 4);
  if (st->dir == NULL || st->dbdir == NULL) {
    store_free(st);
    return LARDER_ENOMEM;
  }
  snprintf(st->dbdir, dl + 4, "%s/db", opts->dir);
  st->capacity = opts->capacity_bytes;
  st->min_blob = opts->min_blob_size ? opts->min_blob_size : DEFAULT_MIN_BLOB;
  st->write_buffer = opts->write_buffer_bytes ? opts->write_buffer_bytes : DEFAULT_WRITE_BUFFER;
  scale_to_disk(st);
  st->flush_threads = opts->flush_threads > 0 ? opts->flush_threads : DEFAULT_FLUSH_THREADS;
  st->idle_s = opts->idle_evict_s ? opts->idle_evict_s : DEFAULT_IDLE_S;
  st->persist_granularity = st->idle_s / 8 < 3600 ? st->idle_s / 8 : 3600;
  if (st->persist_granularity < 1) st->persist_granularity = 1;
  int rc = index_init(&st->ix, st->idle_s, st->persist_granularity, &st->stats);
  if (rc) {
    store_free(st);
    return rc;
  }
  st->cache = rocksdb_cache_create_lru(opts->block_cache_bytes ? opts->block_cache_bytes
                                                               : DEFAULT_BLOCK_CACHE);
  setup_rocksdb_options(st);
  /* Reads keep RocksDB's own block and blob checksums (its default),
   * although the value header's CRC32C covers each payload end to end:
   * without them a damaged table block is decompressed as it comes, and
   * Debian's RocksDB, built with assertions, aborts the whole daemon on the
   * garbage compression type ("CompressionTypeSupported: Assertion `false'").
   * The checksum, checked first, turns that into a Corruption status.
   * Tested by store_verify_damaged_table. */
  st->ro_get = rocksdb_readoptions_create();
  /* Debian's RocksDB computes CRC32C in software: checking the blob
   * records costs epochs served from the cache about 30% on 2 cores
   * (1.1-1.9 GB/s against 1.8-2.8).  cache_verify_blocks=false trades the
   * safety above for that. */
  if (opts->skip_block_checksums) rocksdb_readoptions_set_verify_checksums(st->ro_get, 0);
  st->ro_scan = rocksdb_readoptions_create();
  st->wo = rocksdb_writeoptions_create();
  rocksdb_writeoptions_set_sync(st->wo, opts->sync_writes ? 1 : 0);
  /* Without a WAL every value is written once (to its blob file at flush)
   * instead of twice.  A crash then loses the units written since the last
   * memtable flush, whole, like any unit that was never cached; it cannot
   * leave a partial one, because a WriteBatch reaches the memtable
   * atomically and flushes are atomic.  store_close flushes. */
  if (!opts->sync_writes) rocksdb_writeoptions_disable_WAL(st->wo, 1);

  rc = open_db(st, err, errlen);
  if (rc == 0) rc = check_format(st, err, errlen);
  if (rc == 0) rc = scan_range(st, PFX_OBJECT, PFX_OBJECT + 1, load_object, err, errlen);
  if (rc == 0) rc = scan_range(st, PFX_INDEX, PFX_INDEX + 1, load_index, err, errlen);
  if (rc == 0) rc = index_loaded(&st->ix);
  if (rc != 0) {
    if (err && errlen && err[0] == '\0')
      snprintf(err, errlen, "store: cannot open %s: %s", st->dbdir, larder_strerror(rc));
    store_free(st);
    return rc;
  }
  /* An over-full cache (the capacity shrank, or evictions were lost to a
   * crash) is evicted down. */
  st->last_persist = mono_now(st);
  index_evict_down(&st->ix, st->capacity, true, 0, wall_now(st));
  pthread_mutex_lock(&st->wmu);
  flush_pending(st); /* best effort: a full disk keeps them pending */
  pthread_mutex_unlock(&st->wmu);
  *out = st;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Writing back: pending deletes and last use                                */

/* Writes the pending deletes (wmu held).  On failure they stay pending. */
static int flush_pending(store_t *st) {
  pthread_mutex_lock(&st->mu);
  if (st->ix.pending.len == 0) {
    pthread_mutex_unlock(&st->mu);
    return 0;
  }
  bytes_t taken = st->ix.pending;
  memset(&st->ix.pending, 0, sizeof(st->ix.pending));
  pthread_mutex_unlock(&st->mu);
  rocksdb_writebatch_t *b = rocksdb_writebatch_create();
  pending_to_batch(&taken, b, NULL, 0, false);
  int rc = db_write(st, b);
  rocksdb_writebatch_destroy(b);
  pthread_mutex_lock(&st->mu);
  if (rc != 0) index_bytes_append(&st->ix.pending, taken.p, taken.len);
  pthread_mutex_unlock(&st->mu);
  free(taken.p);
  return rc;
}

/* Rewrites the index records of entries whose last use moved by at least
 * the granularity (wmu held).  all: at close, until nothing is left. */
static void persist_last_use(store_t *st, bool all) {
  for (;;) {
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    int n = 0;
    bool complete = true;
    pthread_mutex_lock(&st->mu);
    uint64_t counter = st->ix.touch_counter;
    for (entry_t *e = st->ix.lru_tail; e != NULL && e->touch > st->ix.persisted_touch;
         e = e->prev) {
      if (e->last_use - e->saved_use < st->persist_granularity) continue;
      if (n == PERSIST_BATCH_MAX) {
        complete = false;
        break;
      }
      uint8_t k[1 + STORE_KEY_MAX], r[INDEX_REC];
      size_t kl = make_key(k, PFX_INDEX, e->key, e->keylen);
      encode_index(r, e->size, e->priority, e->obj->id, e->last_use);
      rocksdb_writebatch_put(b, (const char *)k, kl, (const char *)r, sizeof(r));
      e->saved_use = e->last_use;
      n++;
    }
    if (complete) st->ix.persisted_touch = counter;
    st->last_persist = mono_now(st);
    pthread_mutex_unlock(&st->mu);
    int rc = n ? db_write(st, b) : 0;
    rocksdb_writebatch_destroy(b);
    if (rc != 0 || complete || !all) return;
  }
}

static bool persist_due(store_t *st) {
  return mono_now(st) - st->last_persist >= STORE_PERSIST_INTERVAL_S &&
         st->ix.touch_counter != st->ix.persisted_touch;
}

void store_close(store_t *st) {
  if (st == NULL) return;
  if (st->reopen_started) pthread_join(st->reopen_tid, NULL);
  st->reopen_started = false;
  pthread_mutex_lock(&st->wmu);
  persist_last_use(st, true);
  flush_pending(st);
  pthread_mutex_unlock(&st->wmu);
  store_free(st);
}

/* ------------------------------------------------------------------------ */
/* Capacity                                                                  */

void store_set_capacity(store_t *st, uint64_t capacity_bytes) {
  if (st == NULL) return;
  pthread_mutex_lock(&st->mu);
  st->capacity = capacity_bytes;
  index_evict_down(&st->ix, capacity_bytes, true, 0, wall_now(st));
  pthread_mutex_unlock(&st->mu);
  pthread_mutex_lock(&st->wmu);
  flush_pending(st);
  pthread_mutex_unlock(&st->wmu);
}

/* Whether the disk has room for need more bytes of values and what the
 * cache keeps free besides: max(1 GiB, 5%) but at most 10% of the disk,
 * never under twice what a reopen needs, plus one memtable for its flush.
 * Records what it found for store_stats.  Takes mu. */
static bool disk_has_room(store_t *st, uint64_t need) {
  struct statvfs sv;
  if (statvfs(st->dbdir, &sv) != 0) return true; /* unknown: let RocksDB say */
  uint64_t total = (uint64_t)sv.f_blocks * sv.f_frsize;
  uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
  uint64_t keep = total / 20 > GIB ? total / 20 : GIB;
  if (keep > total / 10) keep = total / 10;
  /* Never so little that the cache could not be opened again. */
  if (keep < 2 * st->open_free) keep = 2 * st->open_free;
  bool room = avail >= need + keep + st->write_buffer;
  pthread_mutex_lock(&st->mu);
  st->low_avail = avail;
  st->low_need = need + keep + st->write_buffer;
  pthread_mutex_unlock(&st->mu);
  return room;
}

int store_disk_room(store_t *st, uint64_t bytes) { return disk_has_room(st, bytes); }

/* ------------------------------------------------------------------------ */
/* Objects                                                                   */

int store_object_put(store_t *st, const store_object_t *obj) {
  if (st == NULL || obj == NULL || obj->name == NULL || obj->identity == NULL) return LARDER_EINVAL;
  size_t nl = strlen(obj->name), il = strlen(obj->identity);
  if (nl > NAME_MAX_LEN || il > IDENTITY_MAX_LEN) return LARDER_EINVAL;
  pthread_mutex_lock(&st->wmu);
  pthread_mutex_lock(&st->mu);
  object_t *o = index_obj_get(&st->ix, obj->id);
  if (o == NULL) {
    pthread_mutex_unlock(&st->mu);
    pthread_mutex_unlock(&st->wmu);
    return LARDER_ENOMEM;
  }
  bool same =
      o->name != NULL && strcmp(o->name, obj->name) == 0 && strcmp(o->identity, obj->identity) == 0;
  if (same && (o->on_disk || o->refs == 0)) {
    /* Known; a record is written with its first entry. */
    index_name_register(&st->ix, o, wall_now(st));
    pthread_mutex_unlock(&st->mu);
    pthread_mutex_unlock(&st->wmu);
    return 0;
  }
  char *name = strdup(obj->name), *ident = strdup(obj->identity);
  if (name == NULL || ident == NULL) {
    free(name);
    free(ident);
    pthread_mutex_unlock(&st->mu);
    pthread_mutex_unlock(&st->wmu);
    return LARDER_ENOMEM;
  }
  index_obj_rename(&st->ix, o, name, ident, wall_now(st));
  int rc = 0;
  if (o->refs > 0) {
    /* It has entries: write its record now, with the pending deletes. */
    bytes_t rec = {0};
    rc = encode_object(&rec, o);
    bytes_t taken = st->ix.pending;
    memset(&st->ix.pending, 0, sizeof(st->ix.pending));
    bool was_on_disk = o->on_disk;
    o->on_disk = true;
    pthread_mutex_unlock(&st->mu);
    if (rc == 0) {
      rocksdb_writebatch_t *b = rocksdb_writebatch_create();
      pending_to_batch(&taken, b, NULL, obj->id, true);
      uint8_t k[9];
      make_obj_key(k, obj->id);
      rocksdb_writebatch_put(b, (const char *)k, sizeof(k), (const char *)rec.p, rec.len);
      rc = db_write(st, b);
      rocksdb_writebatch_destroy(b);
    }
    pthread_mutex_lock(&st->mu);
    if (rc != 0) {
      index_bytes_append(&st->ix.pending, taken.p, taken.len);
      o->on_disk = was_on_disk;
    }
    free(taken.p);
    free(rec.p);
  }
  pthread_mutex_unlock(&st->mu);
  pthread_mutex_unlock(&st->wmu);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Reads                                                                     */

int store_contains(store_t *st, const store_key_t *key) {
  if (st == NULL || key == NULL || key->len > STORE_KEY_MAX) return 0;
  uint64_t h = index_hash_key(key->bytes, key->len);
  pthread_mutex_lock(&st->mu);
  const entry_t *e = index_entry_find(&st->ix, key->bytes, key->len, h);
  int present = e != NULL && e->state == ST_PRESENT;
  pthread_mutex_unlock(&st->mu);
  return present;
}

struct store_value {
  rocksdb_pinnableslice_t *ps; /* NULL when copied */
  uint8_t *copy;
  const uint8_t *data;
  size_t size;
};

const uint8_t *store_value_data(const store_value_t *v) { return v->data; }
size_t store_value_size(const store_value_t *v) { return v->size; }

void store_value_free(store_value_t *v) {
  if (v == NULL) return;
  if (v->ps) rocksdb_pinnableslice_destroy(v->ps);
  free(v->copy);
  free(v);
}

/* Drops the entry for key if it is still generation gen (a failed read). */
static bool drop_if_gen(store_t *st, const store_key_t *key, uint64_t h, uint64_t gen,
                        bool corrupt) {
  bool dropped = false;
  pthread_mutex_lock(&st->mu);
  entry_t *e = index_entry_find(&st->ix, key->bytes, key->len, h);
  if (e != NULL && e->state == ST_PRESENT && e->gen == gen) {
    if (corrupt) st->stats.checksum_failures++;
    index_drop_present(&st->ix, e);
    dropped = true;
  }
  pthread_mutex_unlock(&st->mu);
  return dropped;
}

/* Takes back a hit counted for a read that served nothing (mu held). */
static void unhit_locked(store_t *st, uint64_t size) {
  st->stats.hits--;
  st->stats.hit_bytes -= size;
  st->stats.misses++;
}

static void unhit(store_t *st, uint64_t size) {
  pthread_mutex_lock(&st->mu);
  unhit_locked(st, size);
  pthread_mutex_unlock(&st->mu);
}

void store_discard(store_t *st, const store_key_t *key) {
  if (st == NULL || key == NULL || key->len > STORE_KEY_MAX) return;
  uint64_t h = index_hash_key(key->bytes, key->len);
  pthread_mutex_lock(&st->mu);
  entry_t *e = index_entry_find(&st->ix, key->bytes, key->len, h);
  if (e != NULL && e->state == ST_PRESENT) {
    if (st->stats.hits > 0 && st->stats.hit_bytes >= e->size) unhit_locked(st, e->size);
    index_drop_present(&st->ix, e);
  }
  pthread_mutex_unlock(&st->mu);
}

int store_get(store_t *st, const store_key_t *key, store_value_t **out) {
  if (out) *out = NULL;
  if (st == NULL || key == NULL || out == NULL || key->len > STORE_KEY_MAX) return LARDER_EINVAL;
  uint64_t h = index_hash_key(key->bytes, key->len);
  pthread_mutex_lock(&st->mu);
  entry_t *e = index_entry_find(&st->ix, key->bytes, key->len, h);
  if (e == NULL || e->state != ST_PRESENT) {
    st->stats.misses++;
    pthread_mutex_unlock(&st->mu);
    return LARDER_ENOENT;
  }
  index_touch(&st->ix, e, wall_now(st));
  uint64_t gen = e->gen, size = e->size;
  st->stats.hits++; /* undone below if the read fails */
  st->stats.hit_bytes += size;
  bool persist = persist_due(st);
  pthread_mutex_unlock(&st->mu);

  uint8_t k[1 + STORE_KEY_MAX];
  size_t kl = make_key(k, PFX_VALUE, key->bytes, key->len);
  char *err = NULL;
  rocksdb_pinnableslice_t *ps = NULL;
  int rc = LARDER_EIO; /* no database: a reopen failed */
  pthread_rwlock_rdlock(&st->dblk);
  if (st->db != NULL) {
    ps = rocksdb_get_pinned(st->db, st->ro_get, (const char *)k, kl, &err);
    rc = rdb_take(&err, NULL, 0);
  }
  pthread_rwlock_unlock(&st->dblk);
  if (rc == 0 && ps == NULL) {
    /* The index had it and RocksDB does not: forget it. */
    drop_if_gen(st, key, h, gen, false);
    rc = LARDER_ENOENT;
  }
  size_t vlen = 0;
  const uint8_t *v = NULL;
  if (rc == 0) {
    v = (const uint8_t *)rocksdb_pinnableslice_value(ps, &vlen);
    rc = check_value(v, vlen, size);
  } else if (rc == LARDER_ECORRUPT) {
    rc = LARDER_ECHECKSUM; /* RocksDB found the stored bytes corrupt */
  }
  /* A value replaced while we read it is a miss, not a corrupt entry. */
  if (rc == LARDER_ECHECKSUM && !drop_if_gen(st, key, h, gen, true)) rc = LARDER_ENOENT;
  store_value_t *val = NULL;
  if (rc == 0) {
    val = calloc(1, sizeof(*val));
    if (val == NULL) rc = LARDER_ENOMEM;
  }
  if (rc == 0) {
    const uint8_t *payload = v + VALUE_HDR;
    val->size = (size_t)size;
    if (((uintptr_t)payload & 7) != 0) {
      /* Small values inlined in SST blocks may be misaligned: copy. */
      val->copy = malloc(size ? (size_t)size : 1);
      if (val->copy == NULL) {
        free(val);
        val = NULL;
        rc = LARDER_ENOMEM;
      } else {
        if (size) memcpy(val->copy, payload, (size_t)size);
        val->data = val->copy;
        rocksdb_pinnableslice_destroy(ps);
        ps = NULL;
      }
    } else {
      val->ps = ps;
      val->data = payload;
      ps = NULL;
    }
  }
  if (ps) rocksdb_pinnableslice_destroy(ps);
  if (rc != 0) {
    unhit(st, size);
    if (rc == LARDER_ECHECKSUM || rc == LARDER_ENOENT) {
      pthread_mutex_lock(&st->wmu);
      flush_pending(st);
      pthread_mutex_unlock(&st->wmu);
    }
    return rc;
  }
  if (persist && pthread_mutex_trylock(&st->wmu) == 0) {
    persist_last_use(st, false);
    pthread_mutex_unlock(&st->wmu);
  }
  *out = val;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Admission                                                                 */

int store_reserve(store_t *st, uint64_t object_id, const store_key_t *keys, const uint64_t *sizes,
                  int n, uint64_t priority) {
  if (st == NULL || keys == NULL || sizes == NULL || n <= 0) return LARDER_EINVAL;
  uint64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (keys[i].len > STORE_KEY_MAX || sizes[i] > UINT64_MAX / 4 - total) return LARDER_EINVAL;
    total += sizes[i];
  }
  keyset_t ks;
  int dup = keyset_build(&ks, keys, sizeof(keys[0]), n);
  keyset_free(&ks);
  if (dup != 0) return dup;
  int64_t mnow = mono_now(st);
  pthread_mutex_lock(&st->mu);
  if (st->writes_off) {
    /* After the retry time, reopen the database in the background. */
    bool start = mnow >= st->retry_at && !st->reopen_running;
    if (start) {
      st->reopen_running = true;
      st->retry_at = mnow + STORE_ENOSPC_RETRY_S;
    }
    st->stats.rejected++;
    pthread_mutex_unlock(&st->mu);
    if (start) start_reopen(st);
    return 0;
  }
  pthread_mutex_unlock(&st->mu);

  bool room = disk_has_room(st, total);
  int64_t now = wall_now(st);
  pthread_mutex_lock(&st->mu);
  st->low_space = !room;
  int rc =
      room ? index_reserve(&st->ix, st->capacity, object_id, keys, sizes, n, total, priority, now)
           : 0;
  if (rc == 0) st->stats.rejected++;
  pthread_mutex_unlock(&st->mu);
  return rc;
}

int store_would_admit(store_t *st, uint64_t bytes, uint64_t priority) {
  if (st == NULL) return 0;
  int64_t now = wall_now(st);
  pthread_mutex_lock(&st->mu);
  int admit = !st->writes_off && !st->low_space && bytes <= st->capacity;
  if (admit && st->ix.used + st->ix.reserved + bytes > st->capacity)
    admit = index_can_free(&st->ix, st->ix.used + st->ix.reserved + bytes - st->capacity, priority,
                           now);
  pthread_mutex_unlock(&st->mu);
  return admit;
}

void store_unreserve(store_t *st, const store_key_t *keys, int n) {
  if (st == NULL || keys == NULL) return;
  pthread_mutex_lock(&st->mu);
  for (int i = 0; i < n; i++) {
    if (keys[i].len > STORE_KEY_MAX) continue;
    uint64_t h = index_hash_key(keys[i].bytes, keys[i].len);
    entry_t *e = index_entry_find(&st->ix, keys[i].bytes, keys[i].len, h);
    if (e != NULL && e->state == ST_RESERVED) index_drop_reserved(&st->ix, e);
  }
  pthread_mutex_unlock(&st->mu);
}

/* ------------------------------------------------------------------------ */
/* Writes                                                                    */

/* Encodes the value header (with the payload's checksum) of each of a
 * put's n entries into hdrs[i * VALUE_HDR].  Holds no lock: checksumming is
 * the costly part of a put. */
static void put_headers(const store_entry_t *entries, int n, uint8_t *hdrs) {
  for (int i = 0; i < n; i++) {
    uint32_t crc = cache_crc32c(0, entries[i].data, entries[i].size);
    encode_value_header(hdrs + (size_t)i * VALUE_HDR, crc, entries[i].size);
  }
}

/* A put's batch: each entry's value record (its header from hdrs, then its
 * payload) and its index record (encoded into recs[i * INDEX_REC], last
 * use now).  RocksDB copies keys and values into the batch here. */
static rocksdb_writebatch_t *put_batch(const store_entry_t *entries, int n, const uint8_t *hdrs,
                                       uint8_t *recs, uint64_t priority, uint64_t object_id,
                                       int64_t now) {
  rocksdb_writebatch_t *b = rocksdb_writebatch_create();
  for (int i = 0; i < n; i++) {
    uint8_t k[1 + STORE_KEY_MAX];
    size_t kl = make_key(k, PFX_VALUE, entries[i].key.bytes, entries[i].key.len);
    const char *keyp = (const char *)k;
    const char *vparts[2] = {(const char *)hdrs + (size_t)i * VALUE_HDR,
                             entries[i].size ? entries[i].data : ""};
    size_t vsizes[2] = {VALUE_HDR, entries[i].size};
    rocksdb_writebatch_putv(b, 1, &keyp, &kl, 2, vparts, vsizes);
    uint8_t *r = recs + (size_t)i * INDEX_REC;
    encode_index(r, entries[i].size, priority, object_id, now);
    k[0] = PFX_INDEX;
    rocksdb_writebatch_put(b, (const char *)k, kl, (const char *)r, INDEX_REC);
  }
  return b;
}

/* Takes the pending deletes (into *taken) for a put of o's entries, and
 * o's record (into *orec) when it is named and not yet on disk, marking it
 * on disk.  Returns whether the record is to be written.  wmu held, so
 * that the batch reaches RocksDB in the order the index queued its
 * deletes; takes mu. */
static bool put_take_pending(store_t *st, object_t *o, bytes_t *taken, bytes_t *orec) {
  pthread_mutex_lock(&st->mu);
  *taken = st->ix.pending;
  memset(&st->ix.pending, 0, sizeof(st->ix.pending));
  bool write_obj = o->name != NULL && !o->on_disk;
  if (write_obj && encode_object(orec, o) != 0) write_obj = false;
  if (write_obj) o->on_disk = true;
  pthread_mutex_unlock(&st->mu);
  return write_obj;
}

/* Adds to b the taken deletes, but for the keys of this put (ks) and for
 * object_id when its record (orec) goes in too. */
static void put_add_pending(rocksdb_writebatch_t *b, const bytes_t *taken, const keyset_t *ks,
                            uint64_t object_id, bool write_obj, const bytes_t *orec) {
  pending_to_batch(taken, b, ks, object_id, write_obj);
  if (write_obj) {
    uint8_t k[9];
    make_obj_key(k, object_id);
    rocksdb_writebatch_put(b, (const char *)k, sizeof(k), (const char *)orec->p, orec->len);
  }
}

/* A put's batch failed (mu held): the deletes it carried are queued again,
 * o's record counts as unwritten, and its entries are dropped. */
static void put_undo_locked(store_t *st, entry_t **es, int n, object_t *o, const bytes_t *taken,
                            bool write_obj) {
  index_bytes_append(&st->ix.pending, taken->p, taken->len);
  if (write_obj) o->on_disk = false;
  index_abort(&st->ix, es, n);
}

int store_put(store_t *st, uint64_t object_id, uint64_t priority, const store_entry_t *entries,
              int n) {
  if (st == NULL || entries == NULL || n <= 0) return LARDER_EINVAL;
  for (int i = 0; i < n; i++) {
    if (entries[i].key.len > STORE_KEY_MAX || (entries[i].data == NULL && entries[i].size > 0))
      return LARDER_EINVAL;
  }
  /* Kept until the batch is built: it also finds the pending deletes that
   * this put supersedes. */
  keyset_t ks;
  int dup = keyset_build(&ks, &entries[0].key, sizeof(entries[0]), n);
  if (dup != 0) return dup;
  entry_t **es = calloc((size_t)n, sizeof(entry_t *));
  uint8_t *hdrs = malloc((size_t)n * (VALUE_HDR + INDEX_REC));
  if (es == NULL || hdrs == NULL) {
    free(es);
    free(hdrs);
    keyset_free(&ks);
    return LARDER_ENOMEM;
  }
  put_headers(entries, n, hdrs);
  /* Claim the reservations. */
  object_t *o = NULL;
  pthread_mutex_lock(&st->mu);
  int rc = index_claim(&st->ix, object_id, priority, entries, n, es, &o);
  pthread_mutex_unlock(&st->mu);
  if (rc != 0) {
    free(es);
    free(hdrs);
    keyset_free(&ks);
    return rc;
  }

  int64_t now = wall_now(st);
  rocksdb_writebatch_t *b =
      put_batch(entries, n, hdrs, hdrs + (size_t)n * VALUE_HDR, priority, object_id, now);
  pthread_mutex_lock(&st->wmu);
  bytes_t taken, orec = {0};
  bool write_obj = put_take_pending(st, o, &taken, &orec);
  put_add_pending(b, &taken, &ks, object_id, write_obj, &orec);
  keyset_free(&ks);
  rc = db_write(st, b);
  rocksdb_writebatch_destroy(b);

  pthread_mutex_lock(&st->mu);
  if (rc == 0) index_commit(&st->ix, es, entries, n, o, priority, st->capacity, now);
  else put_undo_locked(st, es, n, o, &taken, write_obj);
  bool more = st->ix.pending.len > 0 && rc == 0;
  bool persist = rc == 0 && persist_due(st);
  pthread_mutex_unlock(&st->mu);
  if (more) flush_pending(st);
  if (persist) persist_last_use(st, false);
  pthread_mutex_unlock(&st->wmu);
  free(taken.p);
  free(orec.p);
  free(es);
  free(hdrs);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Administration                                                            */

int store_list_objects(store_t *st, void (*fn)(const store_object_info_t *info, void *arg),
                       void *arg) {
  if (st == NULL) return LARDER_EINVAL;
  pthread_mutex_lock(&st->mu);
  size_t n = st->ix.live_objects;
  store_object_info_t *v = n ? calloc(n, sizeof(*v)) : NULL;
  if (n && v == NULL) {
    pthread_mutex_unlock(&st->mu);
    return LARDER_ENOMEM;
  }
  size_t j = 0;
  for (size_t i = 0; i <= st->ix.objects.mask && j < n; i++) {
    const object_t *o = st->ix.objects.slots[i].p;
    if (o == NULL || o->entries == 0) continue;
    store_object_info_t *info = &v[j++];
    info->id = o->id;
    snprintf(info->name, sizeof(info->name), "%s", o->name ? o->name : "");
    snprintf(info->identity, sizeof(info->identity), "%s", o->identity ? o->identity : "");
    info->bytes = o->bytes;
    info->entries = o->entries;
    info->last_use = o->last_use;
  }
  pthread_mutex_unlock(&st->mu);
  if (fn)
    for (size_t i = 0; i < j; i++) fn(&v[i], arg);
  free(v);
  return (int)j;
}

static bool name_matches(const object_t *o, const char *prefix, uint64_t object_id) {
  if (object_id != 0) return o->id == object_id;
  if (prefix == NULL || prefix[0] == '\0') return true;
  return o->name != NULL && strncmp(o->name, prefix, strlen(prefix)) == 0;
}

typedef struct evict_sel {
  const char *prefix;
  uint64_t object_id;
} evict_sel_t;

static bool pick_evict(const entry_t *e, void *arg) {
  const evict_sel_t *sel = arg;
  return name_matches(e->obj, sel->prefix, sel->object_id);
}

int store_evict(store_t *st, const char *prefix, uint64_t object_id, int dry_run, uint64_t *entries,
                uint64_t *bytes) {
  if (entries) *entries = 0;
  if (bytes) *bytes = 0;
  if (st == NULL) return LARDER_EINVAL;
  evict_sel_t sel = {prefix, object_id};
  uint64_t nb = 0;
  size_t ne = 0;
  pthread_mutex_lock(&st->mu);
  entry_t **v = index_collect(&st->ix, pick_evict, &sel, &ne);
  if (v == NULL) {
    pthread_mutex_unlock(&st->mu);
    return LARDER_ENOMEM;
  }
  for (size_t i = 0; i < ne; i++) {
    nb += v[i]->size;
    if (!dry_run) index_evict_entry(&st->ix, v[i]);
  }
  pthread_mutex_unlock(&st->mu);
  free(v);
  int rc = 0;
  if (!dry_run) {
    pthread_mutex_lock(&st->wmu);
    rc = flush_pending(st);
    pthread_mutex_unlock(&st->wmu);
  }
  if (entries) *entries = ne;
  if (bytes) *bytes = nb;
  return rc;
}

/* Present before the scan began and not seen by it. */
static bool pick_missing(const entry_t *e, void *arg) {
  return !e->seen && e->gen <= *(const uint64_t *)arg;
}

int store_verify(store_t *st, uint64_t *checked, uint64_t *bad, char *errbuf, size_t errlen) {
  if (errbuf && errlen) errbuf[0] = '\0';
  if (checked) *checked = 0;
  if (bad) *bad = 0;
  if (st == NULL) return LARDER_EINVAL;
  uint64_t nchecked = 0, nbad = 0;
  pthread_mutex_lock(&st->vmu);
  pthread_mutex_lock(&st->mu);
  /* Entries put after this are not in the iterator's snapshot. */
  uint64_t snap_gen = st->ix.gen_counter;
  pthread_mutex_unlock(&st->mu);

  char lower[1] = {PFX_VALUE}, upper[1] = {PFX_VALUE + 1};
  rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
  rocksdb_readoptions_set_iterate_lower_bound(ro, lower, 1);
  rocksdb_readoptions_set_iterate_upper_bound(ro, upper, 1);
  rocksdb_readoptions_set_fill_cache(ro, 0);
  pthread_rwlock_rdlock(&st->dblk);
  if (st->db == NULL) {
    pthread_rwlock_unlock(&st->dblk);
    rocksdb_readoptions_destroy(ro);
    pthread_mutex_unlock(&st->vmu);
    return LARDER_EIO;
  }
  rocksdb_iterator_t *it = rocksdb_create_iterator(st->db, ro);
  for (rocksdb_iter_seek(it, lower, 1); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
    size_t kl = 0, vl = 0;
    const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &kl);
    const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vl);
    if (kl < 1 || kl - 1 > STORE_KEY_MAX) continue;
    bool sound = check_value(v, vl, UINT64_MAX) == 0;
    const uint8_t *key = k + 1;
    uint8_t len = (uint8_t)(kl - 1);
    uint64_t h = index_hash_key(key, len);
    pthread_mutex_lock(&st->mu);
    entry_t *e = index_entry_find(&st->ix, key, len, h);
    if (e == NULL) {
      /* Evicted since the scan began, or an orphan: deleting is safe, a
       * later put of this key supersedes the delete. */
      index_pending_entry(&st->ix, key, len);
    } else if (e->state == ST_PRESENT && e->gen <= snap_gen) {
      nchecked++;
      e->seen = 1;
      if (!sound || get_u64(v + 16) != e->size) {
        nbad++;
        st->stats.checksum_failures++;
        index_drop_present(&st->ix, e);
      }
    }
    pthread_mutex_unlock(&st->mu);
  }
  char *err = NULL;
  rocksdb_iter_get_error(it, &err);
  /* A damaged table block ends the scan with RocksDB's message, which
   * names the file, rather than no more than "corrupt or malformed data". */
  int rc = rdb_take(&err, errbuf, errlen);
  rocksdb_iter_destroy(it);
  pthread_rwlock_unlock(&st->dblk);
  rocksdb_readoptions_destroy(ro);

  /* Index entries whose value was not there (only after a full scan). */
  pthread_mutex_lock(&st->mu);
  size_t nm = 0;
  entry_t **miss = rc == 0 ? index_collect(&st->ix, pick_missing, &snap_gen, &nm) : NULL;
  if (rc == 0 && miss == NULL) rc = LARDER_ENOMEM;
  /* index_collect leaves nm at 0 when it returns NULL. */
  for (size_t i = 0; miss != NULL && i < nm; i++) {
    nchecked++;
    nbad++;
    index_drop_present(&st->ix, miss[i]);
  }
  free(miss);
  for (size_t i = 0; i <= st->ix.entries.mask; i++) {
    entry_t *e = st->ix.entries.slots[i].p;
    if (e != NULL) e->seen = 0;
  }
  pthread_mutex_unlock(&st->mu);
  pthread_mutex_lock(&st->wmu);
  int frc = flush_pending(st);
  pthread_mutex_unlock(&st->wmu);
  pthread_mutex_unlock(&st->vmu);
  if (checked) *checked = nchecked;
  if (bad) *bad = nbad;
  return rc ? rc : frc;
}

/* ------------------------------------------------------------------------ */
/* Footer records                                                            */

#define FOOTER_MAGIC 0x4644524cu /* "LRDF" little-endian */
#define FOOTER_VERSION 1
#define FOOTER_HDR 16

/* 'f' + name in a new buffer (*kl its length), or NULL. */
static uint8_t *footer_key(const char *name, size_t *kl) {
  size_t nl = strlen(name);
  uint8_t *k = malloc(nl + 2); /* with the name's terminator, not part of the key */
  if (k == NULL) return NULL;
  k[0] = PFX_FOOTER;
  memcpy(k + 1, name, nl + 1);
  *kl = nl + 1;
  return k;
}

static int footer_write(store_t *st, const char *name, const void *rec, size_t len, bool del) {
  if (st == NULL || name == NULL || name[0] == '\0' || strlen(name) > NAME_MAX_LEN ||
      (!del && rec == NULL && len) || len > STORE_FOOTER_MAX)
    return LARDER_EINVAL;
  size_t kl = 0;
  uint8_t *k = footer_key(name, &kl);
  uint8_t *v = del ? NULL : malloc(FOOTER_HDR + len);
  rocksdb_writebatch_t *b = rocksdb_writebatch_create();
  if (k == NULL || (!del && v == NULL) || b == NULL) {
    free(k);
    free(v);
    if (b) rocksdb_writebatch_destroy(b);
    return LARDER_ENOMEM;
  }
  if (del) {
    rocksdb_writebatch_delete(b, (const char *)k, kl);
  } else {
    put_u32(v, FOOTER_MAGIC);
    put_u16(v + 4, FOOTER_VERSION);
    put_u16(v + 6, 0);
    put_u32(v + 8, store_crc32c(0, rec, len));
    put_u32(v + 12, (uint32_t)len);
    if (len) memcpy(v + FOOTER_HDR, rec, len);
    rocksdb_writebatch_put(b, (const char *)k, kl, (const char *)v, FOOTER_HDR + len);
  }
  pthread_mutex_lock(&st->wmu);
  int rc = db_write(st, b);
  pthread_mutex_unlock(&st->wmu);
  rocksdb_writebatch_destroy(b);
  free(k);
  free(v);
  return rc;
}

int store_footer_put(store_t *st, const char *name, const void *rec, size_t len) {
  return footer_write(st, name, rec, len, false);
}

int store_footer_delete(store_t *st, const char *name) {
  return footer_write(st, name, NULL, 0, true);
}

int store_footer_scan(store_t *st,
                      int (*fn)(void *arg, const char *name, const void *rec, size_t len),
                      void *arg) {
  if (st == NULL || fn == NULL) return LARDER_EINVAL;
  char lower[1] = {PFX_FOOTER}, upper[1] = {PFX_FOOTER + 1};
  rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
  if (ro == NULL) return LARDER_ENOMEM;
  rocksdb_readoptions_set_iterate_lower_bound(ro, lower, 1);
  rocksdb_readoptions_set_iterate_upper_bound(ro, upper, 1);
  rocksdb_readoptions_set_fill_cache(ro, 0);
  pthread_rwlock_rdlock(&st->dblk);
  int rc = 0, n = 0;
  if (st->db == NULL) rc = LARDER_EIO;
  rocksdb_iterator_t *it = rc ? NULL : rocksdb_create_iterator(st->db, ro);
  char name[NAME_MAX_LEN + 1];
  for (rocksdb_iter_seek(it, lower, 1); it && rocksdb_iter_valid(it) && rc == 0;
       rocksdb_iter_next(it)) {
    size_t kl = 0, vl = 0;
    const uint8_t *k = (const uint8_t *)rocksdb_iter_key(it, &kl);
    const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vl);
    /* A record that does not check out is skipped: the caller fetches
     * that footer again, and its next put replaces the record. */
    if (kl < 2 || kl - 1 > NAME_MAX_LEN || vl < FOOTER_HDR || get_u32(v) != FOOTER_MAGIC ||
        get_u16(v + 4) != FOOTER_VERSION || get_u32(v + 12) != vl - FOOTER_HDR ||
        store_crc32c(0, v + FOOTER_HDR, vl - FOOTER_HDR) != get_u32(v + 8))
      continue;
    memcpy(name, k + 1, kl - 1);
    name[kl - 1] = '\0';
    rc = fn(arg, name, v + FOOTER_HDR, vl - FOOTER_HDR);
    if (rc == 0) n++;
  }
  if (it && rc == 0) {
    char *e = NULL;
    rocksdb_iter_get_error(it, &e);
    rc = rdb_take(&e, NULL, 0);
  }
  if (it) rocksdb_iter_destroy(it);
  pthread_rwlock_unlock(&st->dblk);
  rocksdb_readoptions_destroy(ro);
  return rc < 0 ? rc : n;
}

void store_stats_get(store_t *st, store_stats_t *out) {
  if (out == NULL) return;
  memset(out, 0, sizeof(*out));
  if (st == NULL) return;
  pthread_mutex_lock(&st->mu);
  *out = st->stats;
  out->capacity_bytes = st->capacity;
  out->used_bytes = st->ix.used;
  out->reserved_bytes = st->ix.reserved;
  out->entries = st->ix.present;
  out->objects = st->ix.live_objects;
  out->admission_disabled = st->writes_off || st->low_space;
  out->disk_free_bytes = st->low_space ? st->low_avail : 0;
  out->disk_needed_bytes = st->low_space ? st->low_need : 0;
  out->write_error = st->writes_off ? st->writes_off_code : st->low_space ? LARDER_ENOSPC : 0;
  pthread_mutex_unlock(&st->mu);
}

/* The checksum store.h offers: crc32c.c's. */
uint32_t store_crc32c(uint32_t crc, const void *data, size_t len) {
  return cache_crc32c(crc, data, len);
}
