/*
 * awscreds.h: AWS credentials as fleets have them (prefix awscreds_).
 *
 * The chain, in the order of AWS's own SDKs (the first source that yields
 * a key pair wins; the daemon's explicit s3_access_key / s3_secret_key come
 * before all of it and never reach this module):
 *   env           AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
 *   web_identity  AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN
 *                 (+ AWS_ROLE_SESSION_NAME): STS AssumeRoleWithWebIdentity,
 *                 an unsigned POST to the STS endpoint (the sts_endpoint
 *                 option, else $AWS_ENDPOINT_URL_STS, else the region's)
 *   profile       the profile (option, else $AWS_PROFILE, else "default") in
 *                 $AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), then
 *                 in $AWS_CONFIG_FILE (~/.aws/config, "[profile x]" or
 *                 "[default]"); keys in the credentials file win
 *   process       that profile's credential_process (when it has no keys),
 *                 run with /bin/sh -c (the command is the file owner's;
 *                 nothing of ours is spliced into it), its stdout read as
 *                 JSON (Version 1), its stderr left to the daemon's log
 *   assume_role   a profile with role_arn: STS AssumeRole (SigV4-signed
 *                 for "sts" by libcurl, at the STS endpoint above) with the
 *                 credentials of its source_profile (itself when it holds
 *                 keys; a role profile in turn, up to 8 deep, so loops
 *                 end), or of its credential_source (Environment,
 *                 Ec2InstanceMetadata, EcsContainer); role_session_name,
 *                 external_id and duration_seconds go with it.  With
 *                 web_identity_token_file instead, AssumeRoleWithWebIdentity
 *                 of the profile's role.  mfa_serial is refused (nobody can
 *                 type the code); SSO profiles work through credential_process
 *                 (`aws configure export-credentials --format process`)
 *   container     AWS_CONTAINER_CREDENTIALS_FULL_URI, else
 *                 http://169.254.170.2 + AWS_CONTAINER_CREDENTIALS_RELATIVE_URI,
 *                 with AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE)
 *   imds          IMDSv2 at $AWS_EC2_METADATA_SERVICE_ENDPOINT (default
 *                 http://169.254.169.254), unless AWS_EC2_METADATA_DISABLED
 *                 is true.  Tried only when every source above gave nothing.
 *                 IMDSv1 (the same GETs without a token) stands in when the
 *                 token PUT gets no token, as botocore does: an answer of
 *                 403, 404, 405 or 5xx (older services, proxies), or a
 *                 connection that answers nothing in time (a container past
 *                 the PUT's hop limit: its answer never arrives, while a
 *                 GET's does).  A 400 (a malformed request: no service we
 *                 know) and a connection that cannot be made (no service
 *                 here; botocore's IMDSv1 try would fail the same way) mean
 *                 no instance credentials, without a second try; so does
 *                 AWS_EC2_METADATA_V1_DISABLED=true, and an IMDSv1 answer
 *                 other than 200 (an instance that requires IMDSv2).
 * A source applies when its variables (or its profile) are there; one that
 * applies and fails (STS refuses the token, the process exits non-zero)
 * ends the walk with its error, so that another identity never stands in
 * for a misconfigured one.
 *
 * Conventions
 * -----------
 * - Ownership: an awscreds_value_t owns its three strings (malloc'd) and
 *   awscreds_value_clear wipes them before freeing.  Secrets never reach a
 *   message, the log or the stats: errors name the source, the endpoint
 *   (without query) and the HTTP status or the server's error code only.
 * - Threads: awscreds_resolve blocks (files, a child process, HTTP with
 *   timeouts) and may run on any thread; it reads the environment but
 *   never writes it.  The refresher (awscreds_start) runs awscreds_resolve
 *   on a thread of its own and hands every new value to the loop thread
 *   through a uv_async_t: the callback always runs on the loop thread.
 *   Every other function of the refresher is called on the loop thread.
 *   One refresher runs per loop (awscreds_start registers it there, and
 *   awscreds_stop takes it off), so that a module on that loop which has
 *   no handle of it, the fetcher, can report refused credentials to it
 *   (awscreds_refused).
 * - Refresh: a value with an expiration is resolved again refresh_margin_s
 *   before it expires, or at half its lifetime when that is shorter, so
 *   that a refresh never races the expiry.  A refresh that fails keeps the
 *   value in force (it may still be valid) and is tried again with backoff
 *   (1 s doubling to 60 s, but one try at 15 s before the expiry at the
 *   latest);
 *   each failure counts credentials_refresh_errors and logs a warning.
 * - Errors: functions return 0 or a negative larder_errno_t, with a
 *   message in err when one is given.
 */
#ifndef LARDER_AWSCREDS_H
#define LARDER_AWSCREDS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "stats.h"

typedef struct awscreds_value {
  char *access_key, *secret_key, *session_token; /* owned; token may be NULL */
  int64_t expiration;                            /* unix seconds; 0: never */
  char source[16];                               /* "env", "imds", ... */
} awscreds_value_t;

typedef struct awscreds_options {
  const char *profile;       /* NULL or "": $AWS_PROFILE, else "default" */
  const char *region;        /* for the default STS endpoint */
  const char *sts_endpoint;  /* NULL or "": $AWS_ENDPOINT_URL_STS, else AWS */
  uint32_t refresh_margin_s; /* refresh this long before expiry (0: 300) */
  uint32_t timeout_s;        /* per HTTP request and per process (0: 10) */
} awscreds_options_t;

/* Wipes and frees the strings (the struct itself is the caller's). */
void awscreds_value_clear(awscreds_value_t *v);

/* Walks the chain once.  Returns 0 with *out filled, LARDER_ENOENT when no
 * source has credentials (err says so), or another code when a source that
 * applies failed (err names it); *out is empty then. */
int awscreds_resolve(const awscreds_options_t *o, awscreds_value_t *out, char *err, size_t errlen);

/* Parses an ISO 8601 UTC time ("2026-11-28T04:00:00Z", fraction allowed)
 * into unix seconds; 0 when it is not one. */
int64_t awscreds_parse_time(const char *s);

/* ------------------------------------------------------------------------ */
/* The refresher                                                             */

typedef struct awscreds awscreds_t;

/* Runs on the loop thread with each value the refresher resolves (a
 * refresh, or a first success after failures); v and its strings are
 * valid during the call only. */
typedef void (*awscreds_cb)(const awscreds_value_t *v, void *arg);

/*
 * Starts the refresher on loop.  initial (may be NULL: none) is the value
 * in force; with an expiration it is refreshed before it expires, without
 * one nothing is resolved until awscreds_refresh_now.  resolve_now walks
 * the chain at once (and retries with backoff until it succeeds): for a
 * start whose own walk failed.  The options' strings are copied.  stats
 * may be NULL.  Returns 0 or LARDER_ENOMEM / LARDER_EIO.
 */
int awscreds_start(uv_loop_t *loop, const awscreds_options_t *o, const awscreds_value_t *initial,
                   int resolve_now, stats_global_t *stats, awscreds_cb cb, void *arg,
                   awscreds_t **out);

/* Resolves the chain again now (SIGHUP), off the loop; the value reaches
 * cb when it is ready. */
void awscreds_refresh_now(awscreds_t *a);

/* The source and expiration of the value in force (source "" when none),
 * for the stats; non-secret. */
void awscreds_describe(awscreds_t *a, char *source, size_t size, int64_t *expiration);

/* Stops the thread (a request in progress is aborted; the done callbacks
 * of awscreds_refused still waiting are dropped uncalled), closes the
 * handle and frees a once the loop has closed it.  cb is never called
 * after. */
void awscreds_stop(awscreds_t *a);

/* ------------------------------------------------------------------------ */
/* Credentials a server refused                                              */

/* The end of the walk that awscreds_refused asked for: status 0 when it
 * yielded a value (already handed to the refresher's cb, so in force now;
 * it may be the very one refused), else the walk's error (LARDER_ENOENT:
 * no source has credentials any more).  Loop thread. */
typedef void (*awscreds_refused_cb)(int status, void *arg);

/*
 * Reports that a server refused the credentials in force before their
 * stated expiration (S3's ExpiredToken: clock skew, a revoked session) to
 * the refresher a: it walks the chain again at once, as
 * awscreds_refresh_now does, and done(status, arg) runs once on the loop
 * thread when a walk that began after this call has ended, after cb has
 * had its value.  Returns 0; LARDER_ENOENT when a is NULL (the
 * credentials are the configuration's: nothing renews them), done never
 * called; LARDER_ENOMEM.  A refresher stopped first (a reload) never
 * calls done: the caller bounds its wait itself.  Loop thread.
 */
int awscreds_refused(awscreds_t *a, awscreds_refused_cb done, void *arg);

/* Drops every done of arg still waiting on a (arg is going away); a may
 * be NULL.  Loop thread. */
void awscreds_refused_cancel(awscreds_t *a, void *arg);

#endif /* LARDER_AWSCREDS_H */
