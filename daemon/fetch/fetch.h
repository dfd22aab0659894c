/*
 * fetch.h: remote objects over HTTP(S) and S3 (prefix fetch_).
 *
 * Conventions
 * -----------
 * - One fetcher per daemon, driven by libcurl's multi interface inside the
 *   libuv loop (CURLMOPT_SOCKETFUNCTION with one uv_poll_t per socket,
 *   CURLMOPT_TIMERFUNCTION with one uv_timer_t): no thread per request and
 *   no blocking call on the loop.  Every function here is called on the
 *   loop thread, and every callback runs there.
 * - A request fetches one byte range of one object into memory it owns.
 *   Requests queue in the order they are made and start as the limits allow
 *   (requests in flight per host, bytes in flight), so the order in which
 *   the daemon asks is the order in which bytes arrive: asking in the order
 *   batches will consume them makes the prefetch clairvoyant.
 * - Failures: HTTP 5xx, 429 and S3 SlowDown, connection resets, timeouts,
 *   low-speed stalls and short reads are retried with exponential backoff
 *   and jitter, up to max_retries.  403, 404, 416 and signature errors are
 *   final, but for S3's refusals of expired or revoked credentials
 *   (ExpiredToken, TokenRefreshRequired, InvalidToken,
 *   ExpiredTokenException): the refresher is asked to walk the chain again
 *   at once (awscreds_refused), and the request is retried, within
 *   max_retries, once new credentials are in force (fetch_set_credentials);
 *   it fails with LARDER_EACCES when the walk gives the same ones (counted
 *   in credentials_refresh_errors) or none, or when no refresher runs.  Every ranged response's Content-Range is checked against what
 *   was asked: bytes for another range are never delivered.  A server that
 *   ignores Range (200 with the whole object) is read once: the object is
 *   kept whole and later ranges are cut from it (up to max_whole_bytes of
 *   such objects, least recently used dropped first).  A fresh request for
 *   such an object asks the server again, conditionally when the object
 *   has a validator (If-None-Match / If-Modified-Since; a 304 is served
 *   from the copy kept).
 * - Every body is capped at what was asked: a range's length, a suffix's
 *   length, for a whole object the smaller of its known size and
 *   max_whole_bytes (a larger one fails with LARDER_ELIMIT, not retried);
 *   a listing page at FETCH_LIST_BODY_MAX; an error
 *   body at FETCH_ERROR_BODY_MAX (kept for its message, the rest ignored).
 *   A body beyond its cap fails the request (retried where another answer
 *   may differ), so memory stays bounded whatever a server sends.
 * - A whole object (200) answering a range of an object whose size or
 *   validators are known (fetch_range_t.object_size, etag, last_modified)
 *   and disagree with them is an error for that request (retried) and is
 *   never kept: a maintenance page must not stand for the object.
 * - Retry-After (seconds or an HTTP date) lengthens a backoff, up to
 *   retry_max_ms.
 * - Errors are negative larder_errno_t with a message that names the URL,
 *   the status and the cause, and never contains credentials.  CURLcode and
 *   HTTP statuses are converted here, once.
 * - Dependencies: the fetcher depends on fetch/s3.h (internal: S3's URLs,
 *   signing and listing pages), fetch/version.h (is an answer of the
 *   version the caller knows?) and fetch/awscreds.h (to report refused
 *   credentials to the refresher its owner names, fetch_options_t.creds),
 *   and on no module above it: remote.c and the streams call it, and it
 *   tells them about results through callbacks only.
 */
#ifndef LARDER_FETCH_H
#define LARDER_FETCH_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "stats.h"

typedef struct fetch fetch_t;
typedef struct fetch_req fetch_req_t;

typedef struct fetch_options {
  uint32_t max_inflight_per_host; /* concurrent requests to one host */
  /* Size each host's concurrency from its measured link, up to
   * max_inflight_per_host (see fetch_host_concurrency in stats.h): as many
   * requests as keep the link busy, and no more.  0: always the maximum. */
  int inflight_auto;
  uint64_t max_inflight_bytes; /* bytes of ranges in flight, all hosts */
  uint32_t max_retries;
  uint32_t retry_base_ms; /* first backoff; doubles, with jitter */
  uint32_t retry_max_ms;
  uint32_t connect_timeout_s;
  uint32_t low_speed_bytes;  /* a transfer slower than this ... */
  uint32_t low_speed_time_s; /* ... for this long is a stall, retried */
  uint64_t max_whole_bytes;  /* objects kept whole (Range ignored), LRU */
  int tls_verify;
  const char *ca_file; /* NULL: the system's */
  /* S3 */
  const char *s3_region;
  const char *s3_endpoint;   /* "http://host:port"; NULL: AWS */
  int s3_path_style;         /* bucket in the path, not the host name */
  uint32_t s3_list_max_keys; /* ListObjectsV2 page size (1..1000) */
  const char *s3_access_key;
  const char *s3_secret_key;
  const char *s3_session_token;
  /* Where the credential refresher in force is kept (its owner replaces it
   * on a reload): read on the loop thread when S3 refuses the credentials
   * as expired, to have them renewed (awscreds_refused).  NULL, or NULL
   * there: nothing renews them. */
  struct awscreds *const *creds;
  stats_global_t *stats; /* fetch_* counters, may be NULL */
} fetch_options_t;

void fetch_options_init(fetch_options_t *opts);

/* Replaces the S3 credentials (each may be NULL: none), copying them: the
 * fetcher owns its credentials from fetch_create on, and a request signs
 * each attempt with those in force when it starts (SIGHUP rotates a session
 * token without a restart; awscreds.h's refresher puts fresh temporary
 * ones in force: requests in flight keep what they were signed with).
 * Returns 0, or LARDER_ENOMEM with the old ones kept.  Loop thread. */
int fetch_set_credentials(fetch_t *f, const char *access_key, const char *secret_key,
                          const char *session_token);

/* Changes the limits at run time (SIGHUP); the hosts' adaptive limits are
 * kept, within the new maximum. */
void fetch_set_limits(fetch_t *f, uint32_t per_host, int inflight_auto, uint64_t bytes,
                      uint32_t retries, uint32_t retry_base_ms);

/* Creates the fetcher on loop.  Returns 0 or LARDER_ENOMEM / LARDER_EIO. */
int fetch_create(uv_loop_t *loop, const fetch_options_t *opts, fetch_t **out);
/* Ends every request now, listings included (callbacks run with
 * LARDER_ESHUTDOWN), and every later one at once, so that shutdown never
 * waits for a server; fetch_destroy then frees the fetcher. */
void fetch_shutdown(fetch_t *f);
/* Cancels everything (callbacks run with LARDER_ESHUTDOWN) and frees the
 * fetcher once its handles are closed; done(arg) is called then. */
void fetch_destroy(fetch_t *f, void (*done)(void *arg), void *arg);

/* What a finished request hands back. */
typedef struct fetch_result {
  int status;          /* 0 or a negative code */
  const char *message; /* the error, when status < 0 */
  uint8_t *data;       /* the bytes (owned by the request) */
  uint64_t length;
  uint64_t object_size; /* from Content-Range or Content-Length */
  char etag[128];
  char last_modified[64];
  int whole_object;  /* the server ignored Range */
  int not_modified;  /* a 304 to fetch_range_t.revalidate_*: the
                             caller's copy is current (no bytes) */
  uint64_t fetch_ns; /* time from start to completion, retries included */
  int attempts;
} fetch_result_t;

typedef void (*fetch_cb)(fetch_req_t *req, const fetch_result_t *res, void *arg);

/* A byte range; suffix > 0 asks for the last `suffix` bytes instead.
 * fresh: ask the server even when the object is kept whole (revalidation);
 * a whole object in the answer replaces the one kept.
 * ahead marks read-ahead: such requests wait in the queue behind every
 * request that a trainer is waiting for (fetch_promote moves one forward). */
typedef struct fetch_range {
  uint64_t offset, length;
  uint64_t suffix;
  int fresh;
  int ahead;
  /* What the caller knows of the object (0 / NULL: nothing; the strings
   * are copied): a whole-object answer that disagrees is refused. */
  uint64_t object_size;
  const char *etag;
  const char *last_modified;
  /* The caller keeps a copy of this version of the object's range (a
   * footer): with fresh, the request is conditional on it (If-None-Match,
   * else If-Modified-Since), and a 304 completes with not_modified set and
   * no bytes.  NULL / "": not conditional.  Copied. */
  const char *revalidate_etag;
  const char *revalidate_last_modified;
} fetch_range_t;

#define FETCH_LIST_BODY_MAX ((uint64_t)64 << 20)
#define FETCH_ERROR_BODY_MAX ((uint64_t)64 << 10)
/* A header line longer than this fails the request (retried). */
#define FETCH_HEADER_LINE_MAX 16384

/*
 * Queues a GET of range (NULL: the whole object) of url (http://, https://
 * or s3://).  cb runs once, on the loop thread, with the result, and never
 * from inside fetch_get; the request and its data live until
 * fetch_req_free.  Returns the request or
 * NULL when out of memory.
 */
fetch_req_t *fetch_get(fetch_t *f, const char *url, const fetch_range_t *range, fetch_cb cb,
                       void *arg);

/*
 * The widest gap between two byte ranges of url's host worth reading with
 * one request instead of two: the bytes one request's body brings in the
 * time a request waits for its first byte, as measured on the host's
 * recent ranged answers (so a gap costs less than a request's round trip),
 * at most ceiling; ceiling itself until the host has been measured.  Sets
 * the fetch_merge_gap_bytes gauge.  Loop thread.
 */
uint64_t fetch_merge_gap(fetch_t *f, const char *url, uint64_t ceiling);

/* Makes a queued read-ahead request an ordinary one: a trainer now waits
 * for it.  Does nothing to a request that is running or done.  Loop
 * thread. */
void fetch_promote(fetch_req_t *req);

/* Detaches the callback of a request that is no longer wanted (it still
 * completes, or is dropped from the queue) and frees it once it is done. */
void fetch_cancel(fetch_req_t *req);
/* Frees a finished request and its data. */
void fetch_req_free(fetch_req_t *req);
/* Takes the data out of a finished request (the caller frees it). */
uint8_t *fetch_req_steal(fetch_req_t *req, uint64_t *length);

/* ------------------------------------------------------------------------ */
/* S3 listing                                                                */

typedef struct fetch_object {
  char *url; /* s3://bucket/key */
  uint64_t size;
  char etag[128];
} fetch_object_t;

typedef void (*fetch_list_cb)(int status, const char *message, fetch_object_t *objects,
                              size_t count, void *arg);

/*
 * Lists s3://bucket/prefix with ListObjectsV2, following continuation
 * tokens, keeping keys that match pattern (fnmatch; NULL = all).  cb gets
 * the objects sorted by URL (the caller frees each url and the array).
 */
int fetch_list(fetch_t *f, const char *s3_prefix, const char *pattern, fetch_list_cb cb, void *arg);

/* Writes url without credentials or query secrets into buf. */
void fetch_redact(const char *url, char *buf, size_t size);

#endif /* LARDER_FETCH_H */
