/*
 * admin_int.h: what the parts of the admin module share (admin.c: dispatch,
 * replies, arguments, status, clients, ls, config, the job machinery,
 * evict and verify; admin_stats.c: rates and stats; admin_jobs.c: prefetch,
 * inspect and cat).  Internal to those files: nothing else includes it.
 *
 * Conventions
 * -----------
 * - Threading: the loop thread's, except a job's work_fn, which runs on a
 *   worker (admin_job_queue) and touches only its job.
 * - Ownership: the module's state (admin_state_t) hangs off srv->admin and
 *   is freed by admin_shutdown once no job is left.  A job belongs to the
 *   module's list from admin_job_new until admin_job_maybe_free finds it
 *   finished or cancelled with no callback to come (async == 0).
 * - Replies: admin_reply and admin_job_finish send the final reply of a
 *   request; c (or the job's connection) may be NULL when the client has
 *   gone, and nothing is sent then.
 * - Text is built in a strbuf_t (strbuf.h) with unchecked appends: its
 *   error sticks, and is checked once at the end.
 */
#ifndef LARDER_ADMIN_INT_H
#define LARDER_ADMIN_INT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "serve/admin.h"
#include "serve/conn.h"
#include "serve/server.h"
#include "strbuf.h"
#include "wire.h"
#include "work.h"

#define RATE_SAMPLES 6           /* one a second: rates over up to 5 s */
#define REPLY_CHUNK (1u << 20)   /* text per AdminReply frame */
#define CAT_CHUNK (1u << 20)     /* rows rendered per cat frame, about */
#define CAT_BACKLOG (8u << 20)   /* stop rendering while this much is queued */
#define PROGRESS_NS 250000000ull /* prefetch progress frames, at most */
#define PREFETCH_POLL_MS 20

/* ------------------------------------------------------------------------ */
/* The module's state: rate samples (admin_stats.c) and jobs                 */

enum {
  G_FETCH_BYTES,
  G_BATCH_BYTES,
  G_BATCHES,
  G_FETCH_NS,
  G_DECODE_NS,
  G_CACHE_NS,
  G_ASSEMBLE_NS,
  G_N
};

typedef struct gsample {
  uint64_t t;
  uint64_t v[G_N];
} gsample_t;

typedef struct ssample {
  uint64_t t, batches, bytes, wait, compute;
} ssample_t;

typedef struct srate {
  uint64_t conn_id;
  uint32_t stream;
  int seen;
  int n;
  ssample_t s[RATE_SAMPLES];
} srate_t;

typedef struct job job_t;

typedef struct admin_state {
  gsample_t g[RATE_SAMPLES];
  int ng;
  srate_t *rates; /* rates[0 .. num_sorted) by (conn_id, stream) */
  size_t num_rates, cap_rates, num_sorted;
  job_t *jobs;
} admin_state_t;

/* The module's state, made at its first use; NULL when out of memory. */
admin_state_t *admin_state(server_t *srv);

/* ------------------------------------------------------------------------ */
/* Jobs (admin.c)                                                            */

enum { JOB_EVICT, JOB_VERIFY, JOB_PREFETCH, JOB_REMOTE };

struct job {
  int kind;
  server_t *srv;
  uint64_t conn_id;
  uint32_t request_id;
  int json;
  int dry_run;
  int cancelled;
  int finished; /* the last reply went out (or cannot) */
  int async;    /* callbacks still to come */
  int freeing;
  job_t *next;
  work_t work;
  uv_timer_t timer;          /* prefetch polls, cat waits out a backlog */
  void (*cancel)(job_t *j);  /* stop what is in flight (the job is cancelled) */
  void (*destroy)(job_t *j); /* free what the kind owns */
  void (*work_fn)(job_t *j);
  void (*after_fn)(job_t *j);
};

/* Allocates a job of size bytes (a struct that starts with job_t) for
 * connection c, or replies with the limit it would exceed (NULL then). */
void *admin_job_new(conn_t *c, const Larder__AdminRequest *req, int kind, size_t size);
/* The job's connection, or NULL when it has gone or the job is cancelled. */
conn_t *admin_job_conn(job_t *j);
/* Sends the job's final reply (once) and frees it when nothing of it is in
 * flight. */
void admin_job_finish(job_t *j, int code, const char *text);
void admin_job_fail(job_t *j, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Frees j once it is finished or cancelled and no callback of its is to
 * come. */
void admin_job_maybe_free(job_t *j);
/* Runs work(j) on a worker thread, then after(j) on the loop unless the
 * job was cancelled meanwhile (then it is freed).  Returns 0 or
 * LARDER_ENOMEM (nothing queued). */
int admin_job_queue(job_t *j, void (*work)(job_t *j), void (*after)(job_t *j));
/* The admin jobs running (prefetch, verify, evict, remote reads), and how
 * many of them are prefetches. */
int admin_jobs_running(server_t *srv, int *prefetches);

/* ------------------------------------------------------------------------ */
/* Replies and text (admin.c)                                                */

/* One AdminReply frame of len bytes of text; more: others follow. */
void admin_reply_frame(conn_t *c, uint32_t request_id, int code, const char *text, size_t len,
                       int more);
/* The final reply, cut into frames of about REPLY_CHUNK bytes (never
 * inside a UTF-8 sequence) so that no frame exceeds the client's limit. */
void admin_reply(conn_t *c, uint32_t request_id, int code, const char *text);
void admin_reply_error(conn_t *c, uint32_t request_id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A JSON string literal (UTF-8 passes through; control characters are
 * escaped). */
void admin_sb_json(strbuf_t *b, const char *s);
/* A finite JSON number (NaN and infinities become 0). */
void admin_sb_num(strbuf_t *b, double v);
/* Human forms, written into buf (size bytes), which they return: bytes as
 * util_human_bytes, seconds as "2h 03m", "5m 07s", "12s", "0.4s", counts as
 * "1,234,567", and s shortened to width columns with "..." in the
 * middle. */
const char *admin_fmt_bytes(char *buf, size_t size, double v);
const char *admin_fmt_dur(char *buf, size_t size, double s);
const char *admin_fmt_count(char *buf, size_t size, uint64_t v);
const char *admin_fmt_fit(char *buf, size_t size, const char *s, size_t width);

/* ------------------------------------------------------------------------ */
/* Request arguments (admin.c)                                               */

/* The value of --name=value, or NULL. */
const char *admin_opt_value(const Larder__AdminRequest *req, const char *name);
/* Whether --name is given. */
int admin_opt_flag(const Larder__AdminRequest *req, const char *name);
/* The words that are not options, at most max, into out; returns how many. */
size_t admin_positional(const Larder__AdminRequest *req, const char **out, size_t max);
/* A decimal number; returns 0, or -1 when s is not one. */
int admin_parse_u64(const char *s, uint64_t *out);
/* "a,b.c" into a malloc'd vector of malloc'd strings (*n of them), freed
 * with admin_free_list; NULL for none or out of memory. */
char **admin_split_list(const char *spec, size_t *n);
void admin_free_list(char **v, size_t n);

/* ------------------------------------------------------------------------ */
/* Visibility (admin.c)                                                      */

/* Whether the peer of self may see everyone's clients, streams and
 * objects: root, the daemon's user or admin_group (acl_is_admin). */
int admin_sees_all(const conn_t *self);
/* Whether a listing for self (all: admin_sees_all) may show connection c
 * and its streams: an admin's may, anyone else's only for c of the same
 * uid. */
int admin_visible_to(const conn_t *self, int all, const conn_t *c);
/* Connections that are trainers (not larderctl). */
uint64_t admin_count_trainers(server_t *srv);

/* ------------------------------------------------------------------------ */
/* Commands in the other files                                               */

void admin_cmd_stats(conn_t *c, const Larder__AdminRequest *req);    /* admin_stats.c */
void admin_cmd_prefetch(conn_t *c, const Larder__AdminRequest *req); /* admin_jobs.c */
void admin_cmd_inspect(conn_t *c, const Larder__AdminRequest *req);  /* admin_jobs.c */
void admin_cmd_cat(conn_t *c, const Larder__AdminRequest *req);      /* admin_jobs.c */

#endif /* LARDER_ADMIN_INT_H */
