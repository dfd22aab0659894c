/*
 * remote.h: turning remote sources into objects with footers (prefix
 * remote_).
 *
 * Conventions
 * -----------
 * - Runs on the loop thread through the fetcher (fetch.h): S3 prefixes and
 *   globs are listed with ListObjectsV2, and every object's footer is read
 *   with a suffix Range request (a second, explicit range when the footer is
 *   larger than the first guess).  The object's identity (size, ETag,
 *   Last-Modified) comes from the same responses.
 * - The result feeds dataset_open (a worker), which then needs no network.
 * - Errors name the source and the cause; the callback runs exactly once.
 * - Dependencies: sits above the fetcher (fetch/fetch.h: transfers and
 *   listings) and fetch/version.h; neither calls into this module.
 */
#ifndef LARDER_REMOTE_H
#define LARDER_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "fetch/fetch.h"
#include "fetch/version.h"
#include "stats.h"

typedef struct remote_object {
  char *url;
  uint64_t size;
  char etag[128];
  char last_modified[64];
  uint8_t *footer; /* the FileMetaData bytes (no tail) */
  uint32_t footer_len;
} remote_object_t;

/* Whether a source names a remote object or prefix. */
int remote_is_url(const char *source);

typedef void (*remote_cb)(int status, const char *message, remote_object_t *objects, size_t count,
                          void *arg);

/*
 * The raw footers of remote objects, kept for the streams that open them
 * later (prefix remote_footers_).  Keyed by URL with the version's
 * validators (size, ETag, Last-Modified): a listing that names the same
 * version takes the footer with no request at all, and a single object is
 * revalidated with a conditional request (If-None-Match) that a current
 * copy answers with 304 and no bytes.  Footer reads of one URL by streams
 * opening at once (the ranks of a job) are one read, whose result every
 * one of them takes.  Bounded by a byte limit: the least recently used
 * footers go first.  Loop thread only.
 */
typedef struct remote_footers remote_footers_t;

/* An empty set that keeps at most limit bytes of footers (0: keeps none,
 * but still shares reads in flight); stats may be NULL.  Returns 0 or
 * LARDER_ENOMEM. */
int remote_footers_create(uint64_t limit, stats_global_t *stats, remote_footers_t **out);
/* Frees the set; no resolution may be under way. */
void remote_footers_free(remote_footers_t *fc);

/*
 * Kept across restarts: the set hands every footer it keeps to cb as a
 * record (rec, len bytes, the caller's to copy; its layout is this
 * module's), and every footer it lets go as rec NULL, so that the caller
 * can store and delete them; remote_footers_load puts a stored record back
 * into a new set.  A loaded footer is used as one read in this run: a
 * listing that names its version takes it, and a single object is
 * revalidated (If-None-Match), so a stale record costs one full read.
 * Loop thread (load: before any resolution).
 */
typedef void (*remote_footers_persist_cb)(void *arg, const char *url, const void *rec, size_t len);
void remote_footers_set_persist(remote_footers_t *fc, remote_footers_persist_cb cb, void *arg);
/* Returns 0 (kept, or the URL is in the set already), LARDER_ELIMIT (the
 * set is full: the rest need not be offered), LARDER_ECORRUPT (not a
 * record this module wrote), or LARDER_ENOMEM. */
int remote_footers_load(remote_footers_t *fc, const char *url, const void *rec, size_t len);

/*
 * Resolves the remote sources among sources[0..n) (local ones are skipped)
 * into objects sorted by URL, each with its footer, taken from footers (may
 * be NULL) where it holds the version.  footer_guess is the size of the
 * first suffix request.  Returns 0 (cb will run) or a negative
 * code (it will not).
 */
int remote_resolve(fetch_t *f, remote_footers_t *footers, const char *const *sources, size_t n,
                   uint32_t footer_guess, uint32_t max_footer, remote_cb cb, void *arg);

void remote_objects_free(remote_object_t *objects, size_t count);

/* Whether two observations of an object are the same version: version_same
 * (fetch/version.h), under the name the streams know it by.  Any thread. */
static inline int remote_same_version(uint64_t size_a, const char *etag_a, const char *lm_a,
                                      uint64_t size_b, const char *etag_b, const char *lm_b) {
  return version_same(size_a, etag_a, lm_a, size_b, etag_b, lm_b);
}

#endif /* LARDER_REMOTE_H */
