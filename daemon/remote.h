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
 */
#ifndef LARDER_REMOTE_H
#define LARDER_REMOTE_H

#include <stddef.h>
#include <stdint.h>

#include "fetch.h"

typedef struct remote_object {
  char *url;
  uint64_t size;
  char etag[128];
  char last_modified[64];
  uint8_t *footer;      /* the FileMetaData bytes (no tail) */
  uint32_t footer_len;
} remote_object_t;

/* Whether a source names a remote object or prefix. */
int remote_is_url(const char *source);

typedef void (*remote_cb)(int status, const char *message, remote_object_t *objects,
                          size_t count, void *arg);

/*
 * Resolves the remote sources among sources[0..n) (local ones are skipped)
 * into objects sorted by URL, each with its footer.  footer_guess is the
 * size of the first suffix request.  Returns 0 (cb will run) or a negative
 * code (it will not).
 */
int remote_resolve(fetch_t *f, const char *const *sources, size_t n, uint32_t footer_guess,
                   uint32_t max_footer, remote_cb cb, void *arg);

void remote_objects_free(remote_object_t *objects, size_t count);

/*
 * Whether two observations of an object are the same version: sizes (0:
 * unknown) must agree, then ETags are compared when both have one (a weak
 * ETag, W/"x", by its opaque value "x"), else Last-Modified when both have
 * one.  With neither validator on both sides only the size can tell, and
 * two versions of one size look the same (remote_resolve warns once per
 * object).  NULL or "" means absent.
 */
int remote_same_version(uint64_t size_a, const char *etag_a, const char *lm_a, uint64_t size_b,
                        const char *etag_b, const char *lm_b);

#endif /* LARDER_REMOTE_H */
