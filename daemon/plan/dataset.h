/*
 * dataset.h: what a stream reads (prefix dataset_).
 *
 * Conventions
 * -----------
 * - A dataset is the sorted list of objects that a stream's sources name
 *   (paths, globs, directories; remote URLs in remote.c), each with its
 *   identity (size, mtime, inode and ctime, or size and ETag), its parsed footer and the
 *   stream's column projection, and the units cut from its row groups.
 * - Footers come from the daemon's footer table (footers.h) when the options
 *   name one: the datasets of several streams over the same files then hold
 *   one parse of each, counted within footer_memory.
 * - Units: each row group is cut into ceil(rows / n) units of nearly equal
 *   size, where n = min(unit_rows, unit_bytes / estimated bytes per row),
 *   the estimate coming from the footer's uncompressed sizes of all the
 *   row group's columns, projected or not (jobs projecting different
 *   columns then cut the same units and share cached columns).  Everything
 *   that decides the cut comes from the footers and the settings, so units
 *   (and with them the batch order) are a pure function of the dataset and
 *   the settings, whatever the projection.
 * - Local files are resolved and opened once, at dataset_open, with the
 *   credentials of the client it is opened for, and read through those
 *   descriptors from then on (dataset_file_fd).
 * - dataset_open blocks (stat, glob, footer reads): call it from a worker
 *   thread.  A dataset is immutable once built and may be shared by
 *   threads; it is reference-counted by its users on the loop thread.
 * - Errors: negative larder_errno_t with a message naming the source or the
 *   file.
 */
#ifndef LARDER_DATASET_H
#define LARDER_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "acl.h"
#include "plan/clustered.h"
#include "plan/footers.h"
#include "serve/layout.h"
#include "parquet/parquet.h"
#include "fetch/remote.h"
#include "plan/shuffle.h"
#include "cache/store.h"

typedef struct dataset_file {
  char *path; /* as opened (absolute path or URL) */
  char *name; /* for messages: the path, or the URL without
                              credentials or query (fetch_redact) */
  uint64_t size;
  int64_t mtime_ns; /* local files */
  int64_t ctime_ns;
  uint64_t ino;
  uint64_t dev;
  int fd;               /* local files without a footer table: the
                              descriptor opened at resolution (else -1;
                              see dataset_file_fd) */
  uint64_t footer_hash; /* local files: dataset_footer_hash at open */
  char identity[160];   /* "size=N;mtime=T;ino=I;ctime=C" or "size=N;etag=E" */
  uint64_t object_id;   /* hash of path and identity */
  const pq_file *pq;    /* the parsed footer: footer's, or owned_pq */
  footer_t *footer;     /* its entry in the footer table, or NULL */
  pq_file *owned_pq;    /* without a footer table: this dataset's own */
  pq_projection *proj;
  uint32_t first_unit, num_units;
  uint32_t first_rg;      /* index of its row group 0 in dataset.rg_busy */
  int remote;             /* path is a URL */
  char etag[128];         /* remote: the ETag its footer came with */
  char last_modified[64]; /* remote: its Last-Modified, "" when none */
} dataset_file_t;

typedef struct dataset_unit {
  uint32_t file;
  uint32_t rg;
  uint64_t row_start; /* within the row group */
  uint32_t rows;
  uint64_t est_bytes; /* decoded bytes, estimated from the footer */
  uint64_t priority;  /* cache priority: a hash of its row group's
                              identity, shared by the row group's units */
} dataset_unit_t;

typedef struct dataset_options {
  uint32_t unit_rows;
  uint64_t unit_bytes;
  pq_options pq;
  /* Local paths must resolve inside one of these roots (NULL-terminated;
   * NULL = anywhere).  Symlinks and ".." are resolved first, and each file
   * is then opened below its root without following links, so that a path
   * changed after its resolution cannot lead outside. */
  const char *const *allowed_roots;
  /* The client the dataset is opened for: local sources are resolved and
   * opened with its credentials (cred.h).  NULL: the daemon's own. */
  const acl_peer_t *peer;
  /* The remote sources, already resolved (remote.h). */
  const remote_object_t *remote;
  size_t num_remote;
  /* The daemon's footer table, which parses each file's footer once for
   * every dataset that reads it, and the most bytes its entries may take
   * (footer_memory); NULL: the dataset parses its own, unbounded. */
  footers_t *footers;
  uint64_t footer_limit;
} dataset_options_t;

typedef struct dataset {
  int refs;
  uint64_t key; /* hash of the sources, columns and settings */
  uint32_t num_files;
  dataset_file_t *files;
  uint32_t num_units;
  dataset_unit_t *units;
  uint64_t total_rows;
  uint64_t est_bytes;
  const pq_field_t *schema; /* the projection of the first file */
  int num_columns;
  uint64_t *column_hash;     /* layout_field_hash of each column */
  layout_rowplan_t *rowplan; /* row blocks of the small columns, or NULL */
  /* Per row group: set while a worker decodes it, so that two loads never
   * decode the same pages (atomic; the only mutable part of a dataset). */
  int *rg_busy;
  /* Per unit, 1 while it sits in the cache because a worker decoded it
   * with another unit of its row group and nobody has read it since: its
   * first read is decode work done ahead, not a hit (units.c). */
  uint8_t *decoded_ahead;
  /* The worst cache priority the cache keeps of this dataset, and that of
   * half of it, as its streams' read-ahead last computed them
   * (stream_plan.c; UINT64_MAX until then, or when the cache holds it all):
   * a row group of a worse priority than stage_priority is staged once
   * fetched, ahead of the others if also worse than resident_priority
   * (units.c).  The loop thread's. */
  uint64_t resident_priority, stage_priority;
  uint32_t num_rgs;
  footers_t *footers; /* where its files' footers came from, or NULL */
  /* Whether its row groups may stay together in the shuffle, and why
   * (clustered.h): what shuffle_row_groups = auto does with it. */
  clustered_verdict_t order;
} dataset_t;

/*
 * Whether a source a client sent can be resolved: a URL, or an absolute
 * local path (a relative one would resolve against the daemon's working
 * directory, not the client's; liblarder and larderctl send absolute
 * paths).  Returns 0, or LARDER_EINVAL with the reason in err.  Any thread.
 */
int dataset_source_absolute(const char *src, char *err, size_t errlen);

/*
 * Resolves sources (n of them) into a dataset with the given columns (ncols
 * dotted paths; 0 = all).  Every file must have the projected columns with
 * the same types.  Returns 0 or a negative code with a message in err.
 */
int dataset_open(const char *const *sources, size_t n, const char *const *columns, size_t ncols,
                 const dataset_options_t *opts, dataset_t **out, char *err, size_t errlen);
void dataset_free(dataset_t *ds);

/* Records ds's files in the cache's object index (their names, URLs
 * redacted with fetch_redact, and identities: what `larderctl ls` and
 * `evict` show and match).  Nothing when store is NULL; a failed write is
 * left to the store's own reporting.  Any thread (a worker, after
 * dataset_open). */
void dataset_register_objects(store_t *store, const dataset_t *ds);

/* What stats, clients and metrics show of a dataset named by n sources:
 * its first source (a URL without credentials or query string:
 * fetch_redact) and " (+N more)" when there are more; "" for none.
 * Returns a malloc'd string the caller frees, or NULL when out of memory.
 * Any thread. */
char *dataset_sources_label(char *const *sources, size_t n);

/* The descriptor through which a local file of a dataset is read (opened
 * when the dataset was, with its client's credentials, and kept while the
 * dataset lives; shared through the footer table), or -1 for a remote
 * object.  Nothing reads a dataset's local files by their path: a path may
 * name another file by now.  The caller must not close it.  Any thread. */
int dataset_file_fd(const dataset_file_t *f);

/* The cache key of column c of unit u. */
void dataset_column_key(const dataset_t *ds, uint32_t u, int c, store_key_t *key);

/* The shuffle window in units for a window of window_bytes decoded bytes
 * (deterministic: from the footer estimates), at least 1. */
/* Makes the shuffle plan of a stream over ds: each row group's units form
 * one block when row_group_blocks (shuffle.h), else every unit stands alone;
 * row_group_blocks < 0 (shuffle_row_groups = auto) takes ds->order.together.
 * Returns 0 or a shuffle_plan_create error.  Any thread. */
int dataset_shuffle_plan(const dataset_t *ds, const shuffle_params_t *params, int row_group_blocks,
                         shuffle_plan_t **out);

/* The most rows one shuffle window may hold: its permutation takes 4 bytes
 * a row, outside memory_limit, and a stream keeps up to a few windows'.
 * 2^25 rows is 128 MiB; windows of millions of rows already mix as well as
 * the whole dataset would. */
#define DATASET_MAX_WINDOW_ROWS (1ull << 25)
/* The most units a dataset may have: 2^24 units of 4096 rows are 2^36 rows;
 * their records take about 40 bytes each. */
#define DATASET_MAX_UNITS (1ull << 24)
/* The default shuffle window of ds in units: about window_bytes of decoded
 * rows (by the footers' estimate), at least 1, at most the dataset and
 * DATASET_MAX_WINDOW_ROWS rows.  Any thread. */
uint32_t dataset_window_units(const dataset_t *ds, uint64_t window_bytes);
/* The rows a window of `units` units holds on average. */
uint64_t dataset_window_rows(const dataset_t *ds, uint64_t units);

/* A hash of the last footer_length + 8 bytes of the local file open as src
 * (its footer and tail) into *out.  A unit's decode compares it with the
 * one taken at open when only the file's ctime changed (chmod, chown, a
 * new hard link): the same footer says the content stayed, and the stream
 * goes on.  Returns 0, LARDER_EIO, LARDER_ECORRUPT (the file shrank) or
 * LARDER_ENOMEM.  Any thread. */
int dataset_footer_hash(const pq_source *src, uint32_t footer_length, uint64_t *out);

#endif /* LARDER_DATASET_H */
