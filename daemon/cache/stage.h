/*
 * stage.h: the staging area (prefix stage_): fetched, still compressed
 * byte ranges of remote row groups that the cache does not keep, in files
 * on the cache disk, so that such a row group is fetched once and its
 * units, which the shuffle spreads over the whole epoch, are decoded from
 * the disk instead of each fetching the row group again.
 *
 * Conventions
 * -----------
 * - One entry per (object version, row group): the ranges one buffer
 *   fetched (units.c), in one file under DIR (cache_dir/stage), written
 *   whole before the entry is visible.  The area starts empty: files left
 *   by an earlier run are deleted at stage_open.
 * - Bounded by a capacity in bytes, with the cache's fixed priority
 *   (lower keeps): a new entry evicts entries of worse priority, or that
 *   nobody read for idle_s seconds, and is refused when it would have to
 *   evict better ones.  The set kept is then the same every epoch, so a
 *   row group either stays staged or is fetched each epoch, never
 *   fetched to be evicted before its next use.
 * - Threading: every function is the loop thread's, except stage_write,
 *   which runs on a worker on an entry the loop reserved and does not
 *   touch until stage_commit.
 * - Reading: stage_lookup opens an entry's file and gives the pieces that
 *   hold the ranges asked for; the caller reads each piece whole with
 *   pread (on a worker), checks its CRC32C and closes the descriptor.  An
 *   entry evicted meanwhile is unlinked, not truncated, so an open
 *   descriptor reads it whole.  Nothing is mapped: a disk error is a read
 *   error, never a SIGBUS, and a damaged file a checksum error; either
 *   way the caller drops the entry (stage_drop).
 * - Errors: negative larder_errno_t; a failed write drops its entry.
 */
#ifndef LARDER_STAGE_H
#define LARDER_STAGE_H

#include <stddef.h>
#include <stdint.h>

typedef struct stage stage_t;
typedef struct stage_entry stage_entry_t;

typedef struct stage_range {
  uint64_t offset, length; /* in the remote object */
} stage_range_t;

/* One range of an entry as stored: where its bytes lie in the file and
 * their CRC32C (cache_crc32c), to check when read. */
typedef struct stage_piece {
  uint64_t offset, length; /* in the remote object */
  uint64_t file_off;
  uint32_t crc;
} stage_piece_t;

/* What the area holds and did (larderctl stats). */
typedef struct stage_stats {
  uint64_t bytes;   /* in visible entries and entries being written */
  uint64_t entries; /* visible */
  uint64_t hits;    /* stage_lookup calls that found an entry */
  uint64_t written; /* entries written */
  uint64_t evicted; /* entries evicted */
  uint64_t refused; /* stage_reserve calls refused for priority or size */
  uint64_t failed;  /* writes that failed (a full disk) */
} stage_stats_t;

/*
 * Opens the area in dir (created with mode 0700 when missing, its
 * leftover files deleted) with capacity bytes; entries nobody read for
 * idle_s seconds go first.  Returns 0 and *out, or a negative code (the
 * daemon then runs without one).  Loop thread.
 */
int stage_open(const char *dir, uint64_t capacity, uint32_t idle_s, stage_t **out);
/* Frees the area's memory and closes its directory; files being written
 * must have been committed.  The files stay until the next stage_open. */
void stage_close(stage_t *s);
/* A new capacity (a reload); entries beyond it are evicted, worst first. */
void stage_set_capacity(stage_t *s, uint64_t capacity);

/*
 * Reserves an entry for the n ranges (sorted, disjoint) of row group rg
 * of object object_id at priority: evicts what it must, and returns the
 * entry, to be written by stage_write and then passed to stage_commit.
 * NULL when refused (larger than the capacity, better entries in the
 * way, an entry of that row group already there, or out of memory).
 */
stage_entry_t *stage_reserve(stage_t *s, uint64_t object_id, uint32_t rg, uint64_t priority,
                             const stage_range_t *ranges, int n);
/* Writes data[i], the bytes of range i, to e's file, after checking that
 * the disk keeps room_check's reserve (NULL: no check; the callback
 * returns nonzero when `bytes` more fit).  Returns 0 or a negative code.
 * A worker thread. */
int stage_write(const stage_t *s, stage_entry_t *e, const uint8_t *const *data,
                int (*room_check)(void *arg, uint64_t bytes), void *room_arg);
/* Makes e visible when rc is 0, else deletes it.  Loop thread. */
void stage_commit(stage_t *s, stage_entry_t *e, int rc);

/*
 * Opens the entry of (object_id, rg) when its ranges hold all n ranges
 * asked for (sorted): sets *pieces (allocated; the caller frees it) to the
 * entry's ranges that hold them, each once, sorted, and *npieces, and
 * returns a descriptor (O_RDONLY, close-on-exec) that the caller closes.
 * LARDER_EINVAL when there is no such entry or it lacks a range; LARDER_EIO
 * when its file cannot be opened (the entry is dropped); LARDER_ENOMEM.
 */
int stage_lookup(stage_t *s, uint64_t object_id, uint32_t rg, const stage_range_t *ranges, int n,
                 stage_piece_t **pieces, int *npieces);
/* Drops the entry of (object_id, rg), if any (a read found it damaged). */
void stage_drop(stage_t *s, uint64_t object_id, uint32_t rg);

/* Whether (object_id, rg) has an entry written and visible. */
int stage_contains(const stage_t *s, uint64_t object_id, uint32_t rg);

void stage_stats_get(const stage_t *s, stage_stats_t *out);

#endif /* LARDER_STAGE_H */
