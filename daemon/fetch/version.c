/*
 * version.c: telling two observations of a remote object apart (see
 * version.h).
 */
#include "fetch/version.h"

#include <string.h>

/* The opaque part of an ETag: W/"x" and "x" name the same version (a
 * server or proxy may weaken an ETag, e.g. when it compresses). */
static const char *etag_opaque(const char *e) { return e[0] == 'W' && e[1] == '/' ? e + 2 : e; }

int version_same(uint64_t size_a, const char *etag_a, const char *lm_a, uint64_t size_b,
                 const char *etag_b, const char *lm_b) {
  if (size_a && size_b && size_a != size_b) return 0;
  if (etag_a && etag_a[0] && etag_b && etag_b[0])
    return strcmp(etag_opaque(etag_a), etag_opaque(etag_b)) == 0;
  /* Without an ETag, Last-Modified is compared too, not the size alone: an
   * object replaced by one of the same size on a server that sends
   * Last-Modified alone would otherwise be decoded as a mix of both
   * versions.  Tested by remote_hostile_no_etag. */
  if (lm_a && lm_a[0] && lm_b && lm_b[0]) return strcmp(lm_a, lm_b) == 0;
  return 1;
}
