/*
 * version.h: telling two observations of a remote object apart (prefix
 * version_).
 *
 * Conventions
 * -----------
 * - Pure functions of their arguments: no state, no I/O, any thread.
 * - Depends on nothing else in the daemon.  Both fetch.c (is an answer, or
 *   an object kept whole, of the version the caller knows?) and remote.c
 *   (is a footer kept of the version listed?) use it; fetch/remote.h
 *   offers it to the streams as remote_same_version.
 * - Strings: NULL or "" means absent.  A size of 0 means unknown.
 */
#ifndef LARDER_FETCH_VERSION_H
#define LARDER_FETCH_VERSION_H

#include <stdint.h>

/*
 * Whether two observations of an object are the same version: sizes (0:
 * unknown) must agree, then ETags are compared when both have one (a weak
 * ETag, W/"x", by its opaque value "x"), else Last-Modified when both have
 * one.  With neither validator on both sides only the size can tell, and
 * two versions of one size look the same (remote_resolve warns once per
 * object).  Returns 1 for the same version, 0 otherwise.  Any thread.
 */
int version_same(uint64_t size_a, const char *etag_a, const char *lm_a, uint64_t size_b,
                 const char *etag_b, const char *lm_b);

#endif /* LARDER_FETCH_VERSION_H */
