/*
 * s3.h: the S3 protocol, apart from the transfers that carry it (prefix
 * s3_; internal to daemon/fetch, used by fetch.c only).
 *
 * Conventions
 * -----------
 * - What is S3's own: an s3:// URL's HTTP address on the configured
 *   endpoint, SigV4 signing of a request (libcurl computes the signature
 *   from the credentials set here), the error code in an S3 error body,
 *   and ListObjectsV2: each page's query, the parsing of its XML answer,
 *   the continuation, and the checks that a listing progresses.
 * - Dependencies: libcurl, libexpat and fetch/fetch.h's types (the
 *   options, fetch_object_t); it calls no function of the fetcher.  The
 *   fetcher (fetch.c) calls it: the dependency is one-way.
 * - No I/O and no callbacks: every function works on what it is given and
 *   returns.  Threading: a signer or a listing belongs to its fetcher's
 *   loop thread; s3_http_url and s3_error_code may be called from any
 *   thread.
 * - Secrets: a signer owns copies of its credentials and overwrites them
 *   when it frees them; no message written here contains them.
 * - Errors: negative larder_errno_t, with a message where a buffer is
 *   given.
 */
#ifndef LARDER_FETCH_S3_H
#define LARDER_FETCH_S3_H

#include <curl/curl.h>
#include <stddef.h>
#include <stdint.h>

#include "fetch/fetch.h"

/* ------------------------------------------------------------------------ */
/* URLs and errors                                                           */

/* The HTTP(S) URL of s3://bucket/key on the endpoint that opts names
 * (s3_endpoint, s3_path_style, s3_region), with "?query" appended when
 * query is not NULL.  Returns a malloc'd string (the caller frees it), or
 * NULL when out of memory.  Any thread. */
char *s3_http_url(const fetch_options_t *opts, const char *url, const char *query);

/* Writes S3's <Code>...</Code> from an error body (len bytes at body; only
 * its first 4 KiB are searched) into code, or "" when there is none.  Any
 * thread. */
void s3_error_code(const uint8_t *body, uint64_t len, char *code, size_t size);

/* ------------------------------------------------------------------------ */
/* Signing                                                                   */

typedef struct s3_signer {
  char aws_sigv4[128]; /* libcurl's CURLOPT_AWS_SIGV4 for the region */
  char *cred[3];       /* access key, secret key, session token (owned) */
  char *userpwd;       /* "access:secret" for libcurl (owned) */
} s3_signer_t;

/* A signer for region (NULL or "": us-east-1) without credentials. */
void s3_signer_init(s3_signer_t *s, const char *region);
/* Replaces the credentials (each may be NULL: none), copying them.
 * Returns 0, or LARDER_ENOMEM with the old ones kept. */
int s3_signer_set(s3_signer_t *s, const char *access_key, const char *secret_key,
                  const char *session_token);
/* Frees the credentials, overwriting them first. */
void s3_signer_free(s3_signer_t *s);

/*
 * Makes the transfer e of url (its s3:// name, for messages) a SigV4-signed
 * S3 request: sets the signing options on e and appends the session token
 * and the payload-hash headers to *headers.  Returns 0; LARDER_EACCES
 * without credentials (msg says where they may come from); LARDER_ENOMEM.
 * On failure *headers stays a valid list for the caller to free.
 */
int s3_sign(const s3_signer_t *s, CURL *e, struct curl_slist **headers, const char *url, char *msg,
            size_t msglen);

/* ------------------------------------------------------------------------ */
/* ListObjectsV2                                                             */

/* The listing of one s3://bucket/prefix, page after page: the objects
 * listed so far and where the next page begins. */
typedef struct s3_listing s3_listing_t;

/* A listing of s3_prefix ("s3://bucket/prefix") that keeps the keys that
 * match pattern (fnmatch with FNM_PATHNAME; NULL: every .parquet key).
 * Returns 0, LARDER_EINVAL (not an s3:// URL) or LARDER_ENOMEM. */
int s3_listing_create(const char *s3_prefix, const char *pattern, s3_listing_t **out);
/* Frees the listing and the objects not taken. */
void s3_listing_free(s3_listing_t *ls);

/* Counts the next page and writes its request: the query (parameters in
 * the order S3 verifies them), and the bucket's URL ("s3://bucket/") that
 * the query goes to.  max_keys: the page size (0 or over 1000: 1000). */
void s3_listing_next_page(s3_listing_t *ls, uint32_t max_keys, char *query, size_t qsize,
                          char *bucket_url, size_t bsize);
/* What is listed, "s3://bucket/prefix", for messages: malloc'd (the caller
 * frees it), or NULL when out of memory. */
char *s3_listing_name(const s3_listing_t *ls);

/*
 * Takes the body of the page last asked for (len bytes at data).  where
 * names the page's request (redacted) in messages.  Returns 1 when more
 * pages follow (ask for the next), 0 when the listing is complete, or a
 * negative code with msg set: LARDER_ECORRUPT (not XML), LARDER_ENOMEM,
 * LARDER_EREMOTE (the listing does not progress: a key listed again or out
 * of order, a repeated continuation token, 100 empty pages in a row),
 * LARDER_ELIMIT (more than 100,000 pages).
 */
int s3_listing_page(s3_listing_t *ls, const char *data, size_t len, const char *where, char *msg,
                    size_t msglen);

/* The objects listed, sorted by URL; the caller owns each url and the
 * array (NULL when there is none).  The listing keeps none of them. */
fetch_object_t *s3_listing_take(s3_listing_t *ls, size_t *count);

#endif /* LARDER_FETCH_S3_H */
