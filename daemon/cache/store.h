/*
 * store.h: the decoded-data cache on the node's SSD (module prefix store_).
 *
 * Conventions
 * -----------
 * - Backing: one RocksDB database under <cache dir>/db, with integrated blob
 *   files for large values so that compaction never rewrites them.  The
 *   RocksDB C API's errptr strings are turned into larder_errno_t codes here
 *   and nowhere else.
 * - Threading: every function may be called from any thread.  RocksDB is
 *   thread-safe; the in-memory index (sizes, priorities, objects) is guarded
 *   by one mutex held only for index updates, never across I/O.
 * - Errors: negative larder_errno_t.  A failed write never leaves a partial
 *   entry behind.  ENOSPC turns admission off (store_stats says so) and
 *   keeps everything already cached; admission is retried after
 *   STORE_ENOSPC_RETRY_S seconds.
 * - Ownership: store_value_t handles returned by store_get belong to the
 *   caller, who releases them with store_value_free; they stay valid after
 *   the entry is evicted or the store deletes it.
 *
 * Entries
 * -------
 * An entry is one column of one unit of one object: a key chosen by the
 * caller (at most STORE_KEY_MAX bytes) and a value (the column's serialized
 * arrays).  Entries belong to an object (a file or URL with an identity:
 * size plus mtime or ETag), so that `ls` and `evict` work per object and a
 * changed object's entries can be dropped together.
 *
 * Each value is stored behind a header carrying a CRC32C of the value; the
 * checksum is verified on every read.  A mismatch deletes the entry and
 * returns LARDER_ECHECKSUM, so a corrupt entry is dropped and rebuilt by the
 * caller, never served.
 *
 * All entries of one store_put (the columns of a unit and their index
 * records) go in one atomic WriteBatch: after a kill -9 at any moment the
 * database reopens with each unit either wholly present or wholly absent.
 * Unless sync_writes is set, writes skip RocksDB's WAL (each value is then
 * written once, not twice); a crash loses the units written since the last
 * memtable flush, never part of one, and store_close flushes.
 *
 * Capacity and admission
 * ----------------------
 * The sum of the entries' value sizes never exceeds the capacity by more
 * than one unit.  Admission is decided before the caller decodes
 * (store_reserve), by priority: every entry carries a 64-bit priority (the
 * caller hashes the unit's identity; lower keeps better) and the store keeps
 * the entries with the best priorities, evicting worse ones to make room
 * and refusing an entry worse than everything it would have to evict.
 * Entries not read for idle_evict_s seconds are evicted before any other.
 * When store_object_put registers a new identity for a name already known
 * (a file rewritten or touched, an object replaced), the older identity's
 * entries rank below every other: served while they last, evicted first.
 *
 * Why not LRU: with an epoch-shuffled access pattern every unit is read once
 * per epoch, so LRU evicts each unit just before it is needed again and
 * serves almost nothing from a cache that holds half the data.  Keeping a
 * fixed, priority-chosen subset serves that subset every epoch: a cache
 * holding a fraction f of a job's bytes serves about f of each later epoch,
 * which is close to the best any policy can do when each unit is read
 * exactly once per epoch, and nothing cached is evicted before its use.
 */
#ifndef LARDER_STORE_H
#define LARDER_STORE_H

#include <stddef.h>
#include <stdint.h>

#define STORE_KEY_MAX 128
#define STORE_ENOSPC_RETRY_S 60

typedef struct store store_t;

typedef struct store_options {
  const char *dir;             /* cache directory; created if missing */
  uint64_t capacity_bytes;     /* value bytes kept at most (plus one unit) */
  uint64_t min_blob_size;      /* values at least this big go to blob files;
                               0 = 4096 */
  uint64_t block_cache_bytes;  /* RocksDB block cache; 0 = 32 MiB */
  uint64_t write_buffer_bytes; /* RocksDB memtable size; 0 = 64 MiB; at
                               most 1/16 of the filesystem (store.c) */
  int flush_threads;           /* memtables flushed at once; 0 = 2.  The store
                               keeps flush_threads + 2 memtables, so that
                               puts go on while that many flush */
  uint32_t idle_evict_s;       /* 0 = 7 days */
  int sync_writes;             /* fsync the WAL on every put (default off: a
                               process crash loses nothing, a power loss
                               only recent units, never consistency) */
  int skip_block_checksums;    /* reads skip RocksDB's block and blob
                               checksums (default off: they are checked).
                               Faster, but a damaged table block aborts the
                               process in a RocksDB built with assertions */
} store_options_t;

void store_options_init(store_options_t *opts);

/* The flush threads for a daemon of `workers` workers when the
 * configuration leaves cache_flush_threads at 0: a quarter of them, at
 * least 2 and at most 8.  Any thread. */
int store_default_flush_threads(int workers);

/*
 * Opens (creating if needed) the cache in opts->dir and loads its index.
 * Returns 0 or a negative code with a message in err (errlen bytes).  A
 * database that RocksDB cannot open is reported, not deleted:
 * LARDER_ECORRUPT when its files are damaged or missing (larderd then
 * discards it).  Any thread.
 */
int store_open(const store_options_t *opts, store_t **out, char *err, size_t errlen);
void store_close(store_t *st);

/* Changes the capacity at run time (SIGHUP), evicting down to it. */
void store_set_capacity(store_t *st, uint64_t capacity_bytes);

/* ------------------------------------------------------------------------ */

typedef struct store_key {
  uint8_t len;
  uint8_t bytes[STORE_KEY_MAX];
} store_key_t;

/* An object: the file or URL that entries were decoded from. */
typedef struct store_object {
  uint64_t id;          /* caller's hash of name + identity */
  const char *name;     /* path or URL (no credentials) */
  const char *identity; /* "size=...;mtime=...;ino=...;ctime=..." or
                           "size=...;etag=..." */
} store_object_t;

/* Records an object (idempotent).  Returns 0 or a negative code. */
int store_object_put(store_t *st, const store_object_t *obj);

typedef struct store_value store_value_t;

/*
 * Looks key up.  On a hit, *out holds the verified value bytes.  Returns 0,
 * LARDER_ENOENT on a miss, LARDER_ECHECKSUM when the stored bytes were
 * corrupt (the entry is deleted), or LARDER_EIO.  Counts the hit or miss.
 */
int store_get(store_t *st, const store_key_t *key, store_value_t **out);
/* Whether key is cached, from the in-memory index alone (no I/O). */
int store_contains(store_t *st, const store_key_t *key);
const uint8_t *store_value_data(const store_value_t *v);
size_t store_value_size(const store_value_t *v);
void store_value_free(store_value_t *v);
/* Drops key's entry, whose value its reader could not use although its
 * checksum held (a serving layout of another version), so that the caller
 * decodes and offers it again; the read counts as a miss, not a hit.  The
 * deletion is queued as an eviction's is.  Any thread. */
void store_discard(store_t *st, const store_key_t *key);

/*
 * Decides whether n entries (the columns of one unit, with their value
 * sizes) of the given priority may be admitted, evicting worse entries to
 * make room.  On admission the bytes are reserved until store_put or
 * store_unreserve and 1 is returned; 0 means not admitted (the caller
 * serves the unit without caching it).  Never blocks on I/O: evicted
 * entries are deleted in the background or by the next store call.
 */
int store_reserve(store_t *st, uint64_t object_id, const store_key_t *keys, const uint64_t *sizes,
                  int n, uint64_t priority);
void store_unreserve(store_t *st, const store_key_t *keys, int n);
/* Whether store_reserve would now admit `bytes` at this priority (room, or
 * idle or worse entries to evict), without reserving or evicting anything.
 * Any thread. */
int store_would_admit(store_t *st, uint64_t bytes, uint64_t priority);
/* Whether the cache's disk has room for `bytes` more besides the reserve
 * the cache keeps free (what admission checks), for files written beside
 * the cache (stage.h).  Calls statvfs.  Any thread. */
int store_disk_room(store_t *st, uint64_t bytes);

typedef struct store_entry {
  store_key_t key;
  const void *data;
  size_t size;
} store_entry_t;

/*
 * Writes n entries of one object atomically, with their checksums and index
 * records.  They must have been reserved.  Returns 0; LARDER_ENOSPC (the
 * disk is full: nothing was written, admission is now off); LARDER_EIO.
 */
int store_put(store_t *st, uint64_t object_id, uint64_t priority, const store_entry_t *entries,
              int n);

/* ------------------------------------------------------------------------ */
/* Administration (larderctl ls / evict / verify)                            */

typedef struct store_object_info {
  uint64_t id;
  char name[1024];
  char identity[256];
  uint64_t bytes; /* value bytes cached */
  uint64_t entries;
  int64_t last_use; /* unix seconds */
} store_object_info_t;

/* Calls fn for each object with cached entries.  Returns the count. */
int store_list_objects(store_t *st, void (*fn)(const store_object_info_t *info, void *arg),
                       void *arg);

/*
 * Evicts every entry of objects whose name starts with prefix (NULL or ""
 * = all), or of one object when object_id != 0.  With dry_run nothing is
 * deleted.  Reports what was (or would be) freed.  Returns 0 or a code.
 */
int store_evict(store_t *st, const char *prefix, uint64_t object_id, int dry_run, uint64_t *entries,
                uint64_t *bytes);

/*
 * Reads every value, checks its checksum and deletes the bad ones.  Returns
 * 0, or the code of what stopped the scan (LARDER_ECORRUPT for a table
 * block RocksDB found damaged, which names its file in err), with what it
 * had checked by then.  Any thread.
 */
int store_verify(store_t *st, uint64_t *checked, uint64_t *bad, char *err, size_t errlen);

/* ------------------------------------------------------------------------ */
/* Footer records                                                            */

/*
 * Small records kept beside the entries, by name: the raw footers of remote
 * objects (fetch/remote.h encodes them), so that a restarted daemon does
 * not fetch them again.  They are not entries: capacity, admission, ls,
 * evict and verify leave them alone, and their owner bounds them (it
 * deletes what it no longer keeps).  Each record carries a CRC32C; one that
 * does not check out is skipped by the scan.  Written without the WAL, as
 * entries are: a crash may lose the latest.  Any thread.
 */
#define STORE_FOOTER_MAX ((size_t)64 << 20)
/* Writes (or replaces) name's record: len bytes of rec, at most
 * STORE_FOOTER_MAX.  Returns 0, LARDER_EINVAL (an empty or over-long name),
 * LARDER_ENOMEM, or the write's error (LARDER_ENOSPC, LARDER_EIO: writes
 * are off then, as for entries). */
int store_footer_put(store_t *st, const char *name, const void *rec, size_t len);
/* Deletes name's record, if any.  Returns 0 or a write's error. */
int store_footer_delete(store_t *st, const char *name);
/* Calls fn for every record that checks out, in name order; fn returns 0
 * to go on, or a negative code that stops the scan and is returned.
 * Returns the number of records given to fn, or a negative code. */
int store_footer_scan(store_t *st,
                      int (*fn)(void *arg, const char *name, const void *rec, size_t len),
                      void *arg);

typedef struct store_stats {
  uint64_t capacity_bytes, used_bytes, reserved_bytes, entries, objects;
  uint64_t hits, misses, hit_bytes;
  uint64_t puts, put_bytes, evictions, evicted_bytes, rejected;
  uint64_t checksum_failures, write_errors;
  int admission_disabled; /* the disk filled up, or writes failed; see store.c */
  int write_error;        /* why writes stopped: LARDER_ENOSPC, LARDER_EIO, or 0 */
  /* While the disk has too little room (admission off, writes not failed):
   * its free bytes at the last check, and the free bytes the cache wanted
   * then (the unit, its reserve, a memtable's flush); else 0. */
  uint64_t disk_free_bytes, disk_needed_bytes;
} store_stats_t;

void store_stats_get(store_t *st, store_stats_t *out);

/* CRC32C (Castagnoli) of len bytes, continuing from crc (0 to start).  Uses
 * the SSE4.2 instruction when the CPU has it. */
uint32_t store_crc32c(uint32_t crc, const void *data, size_t len);

#endif /* LARDER_STORE_H */
