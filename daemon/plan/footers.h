/*
 * footers.h: the parsed Parquet footers of the files that open datasets
 * read, one per version of a file however many streams read it (prefix
 * footers_).
 *
 * Conventions
 * -----------
 * - An entry is a pq_file parsed from one version of one file.  Its key is
 *   the file's path, its identity (dataset.c's: size, mtime, inode and
 *   ctime, or size and ETag) and the pq_options it was parsed with.  The
 *   ranks of a job, and jobs that project different columns of the same
 *   files, share it; a file that changed gets an entry of its own, and the
 *   old one goes with the last dataset that holds it.
 * - Ownership: entries are reference-counted by the datasets that hold
 *   them; the last footers_release frees the parse.  Nothing is kept once
 *   no dataset holds it.
 * - Memory: the entries' bytes (pq_file_memory and the entry) are counted
 *   in the stats footer_bytes and footer_files, and bounded by the limit
 *   that each acquire passes (the setting footer_memory): an acquire that
 *   would take the total past it fails with LARDER_ELIMIT.  Parses that run
 *   at once may pass it by their own sizes.
 * - Threads: every function may be called from any thread.  A mutex guards
 *   the table; a parse runs outside it, and an acquire of a footer that
 *   another thread is parsing waits for that parse instead of making its
 *   own.
 * - Errors: negative larder_errno_t, with a message in the caller's err.
 */
#ifndef LARDER_FOOTERS_H
#define LARDER_FOOTERS_H

#include <stddef.h>
#include <stdint.h>

#include "parquet/parquet.h"
#include "stats.h"

typedef struct footers footers_t;
typedef struct footer footer_t;

/*
 * Parses the footer of the file that an acquire names, for footers_acquire:
 * sets *out to a pq_file that the table owns from then on, and *hash to
 * the footer's hash (dataset_footer_hash; 0 where there is none).  Returns
 * 0, or a negative code with a message in err (and *out NULL).  Runs on the
 * acquiring thread, outside the table's lock.
 */
typedef int (*footers_parse_cb)(void *arg, pq_file **out, uint64_t *hash, char *err, size_t errlen);

/* Makes an empty table whose gauges and counters go to stats (which may be
 * NULL, and must outlive it).  Returns 0 or LARDER_ENOMEM.  Any thread. */
int footers_create(stats_global_t *stats, footers_t **out);
/* Frees the table and any entry still in it (none should be: each belongs
 * to a dataset).  No other call may run on it meanwhile. */
void footers_destroy(footers_t *f);

/*
 * Sets *out to the entry of path's version `identity` parsed with opts,
 * holding one reference for the caller: the one in the table, or one that
 * parse makes now (with arg).  fd is the caller's descriptor of that
 * version of a local file (-1: remote), which a new entry keeps a duplicate
 * of (footers_fd); identity must then tell inodes apart (device and inode
 * number), so that an entry found is the same file as fd.  limit is the
 * most bytes all entries may take together (0 = no limit).  Returns 0; the
 * code parse returned; LARDER_ELIMIT when fd cannot be duplicated; or
 * LARDER_ELIMIT when this file's footer would take the entries past limit,
 * with a message naming footer_memory; or LARDER_ENOMEM.  Any thread; it
 * blocks for the parse, or for another thread's parse of the same footer.
 */
int footers_acquire(footers_t *f, const char *path, const char *identity, const pq_options *opts,
                    int fd, uint64_t limit, footers_parse_cb parse, void *arg, footer_t **out,
                    char *err, size_t errlen);
/* Drops the caller's reference to e; the last one frees it.  Any thread. */
void footers_release(footers_t *f, footer_t *e);

/* The entry's parse, valid while the caller holds its reference. */
const pq_file *footers_file(const footer_t *e);
/* The footer hash its parse returned. */
uint64_t footers_hash(const footer_t *e);
/* A descriptor of the file version the entry was parsed from (a duplicate
 * of the fd its first acquire passed, kept while the entry lives), or -1
 * for remote objects.  Loads read through it and never open the file by
 * its path again.  Valid while the caller holds its reference. */
int footers_fd(const footer_t *e);

/*
 * Returns 1, once, when entries of 64 MiB or more were freed since it last
 * did: glibc keeps the freed heap of many small parses, and a malloc_trim
 * is then worth a worker's time.  Otherwise 0.  Any thread.
 */
int footers_trim_due(footers_t *f);

#endif /* LARDER_FOOTERS_H */
