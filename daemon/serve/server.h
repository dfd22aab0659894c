/*
 * server.h: larderd's shared state and its lifecycle (prefix server_):
 * listening, signals, the tick, reload and shutdown.  The loop-side
 * modules it ties together have their own headers: conn.h (one client
 * connection), stream.h (one stream of batches), units.h (the pool of
 * decoded units in memory) and admin.h (larderctl's requests).
 *
 * Conventions
 * -----------
 * - One libuv loop owns the sockets and every structure declared here.
 *   Work that blocks or burns CPU (footers, decoding, cache reads and writes,
 *   batch assembly) runs on the worker threads through work_queue (work.h);
 *   its done callback, back on the loop, is the only place where results
 *   are published.  Worker code touches only what its task owns, immutable
 *   structures (datasets, READY units) and thread-safe modules (store,
 *   arena, stats).
 * - Handle memory is freed in the handle's close callback and nowhere else.
 * - Errors: negative larder_errno_t.  A failure of one stream or one client
 *   is reported to that client and ends only that stream or connection.
 */
#ifndef LARDER_SERVER_H
#define LARDER_SERVER_H

#include <stdint.h>
#include <uv.h>

#include "acl.h"
#include "cache/stage.h"
#include "cache/store.h"
#include "config.h"
#include "fetch/fetch.h"
#include "fetch/remote.h"
#include "htab.h"
#include "plan/footers.h"
#include "stats.h"
#include "work.h"

typedef struct server server_t;
typedef struct conn conn_t;
typedef struct unit unit_t;
typedef struct rgbuf rgbuf_t;

#define LARDERD_VERSION "0.1.0"

struct server {
  uv_loop_t *loop;
  config_t cfg;
  char *config_path;
  store_t *store;
  stage_t *stage;     /* fetched row groups the cache does not keep (stage.h), or NULL */
  footers_t *footers; /* parsed footers shared by datasets (footers.h) */
  remote_footers_t *remote_footers; /* raw remote footers kept (remote.h) */
  /* Why store is NULL: the cache could not be opened at startup. */
  char cache_error[512];
  work_t trim_work; /* a malloc_trim after many footers were freed */
  int trim_queued;
  stats_global_t stats;
  uint64_t started_ns;
  int64_t started_unix;
  int workers;
  work_pool_t *pool; /* the worker threads (work.h) */
  /* server_trainer_report: trainers' wait and compute since boost_from_ns,
   * whether the workers run boosted, and whether the system refused. */
  uint64_t boost_wait_ns, boost_compute_ns, boost_from_ns;
  int boost_on, boost_refused;
  /* The cache's checksum failures last logged, and when (note_cache_faults). */
  uint64_t checksum_failures_logged, checksum_logged_ns;

  uv_pipe_t listener;
  /* Out of descriptors (server.c): a second descriptor of the listening
   * socket, kept while the listener is closed to stop accepting, and the
   * timer that opens it again. */
  int listen_spare;
  int accept_paused; /* 1: listener closing or closed; 2: closed */
  uv_timer_t relisten;
  /* The shuffle windows of the open streams (stream.c, window_reserve):
   * one entry per distinct shuffle, shared by the streams (ranks) that
   * draw the same units, and the bytes they hold together. */
  struct window_resv {
    uint64_t key, bytes;
    int refs;
  } * resv;
  int num_resv, cap_resv;
  uint64_t resv_bytes;
  /* Connections accepted in this turn of the loop, and whether one waits
   * for the next turn (server.c, ACCEPT_BURST). */
  int accepts_this_turn;
  int accept_deferred;
  uv_signal_t sig_term, sig_int, sig_hup;
  uv_timer_t tick;
  uv_prepare_t flush; /* writes corked frames before the loop sleeps,
                             and starts the next burst of accepts */
  int shutting_down;
  uint64_t shutdown_ns; /* when SIGTERM came (server.c's grace period) */
  int listening;

  conn_t *conns;
  uint64_t next_conn_id;

  /* units.c */
  htab_t unit_table; /* units by hash; grows with them (htab.h) */
  unit_t *lru_head, *lru_tail;
  uint64_t unit_bytes;
  int loads_in_flight;
  unit_t *retry_head;                /* loads waiting for their row group's decode */
  void (*units_room)(server_t *srv); /* units_init's room callback */

  /* Remote sources (fetch.c, remote.c; row-group buffers in units.c). */
  fetch_t *fetch;
  struct awscreds *awscreds; /* the credential refresher, NULL with explicit keys */
  int socket_activated;      /* the listening socket came from systemd */
  htab_t rgbuf_table;        /* row-group buffers by hash (htab.h) */
  rgbuf_t *rgbuf_held_head;  /* buffers held for their row group's units */
  rgbuf_t *rgbuf_lru_head, *rgbuf_lru_tail;
  uint64_t rgbuf_fetching_bytes; /* asked for and not yet arrived */
  uint64_t rgbuf_ahead_bytes;    /* read ahead into memory, not used yet */
  uint64_t rgbuf_held_bytes;     /* held until their units have decoded */
  int acquiring_ahead;           /* units_acquire is called by units_read_ahead */
  uint64_t acquiring_owner;      /* the work owner (work.h) of the loads that
                               units_acquire starts: the stream's */
  int in_read_ahead;             /* units_room is running */
  int resolves_in_flight;        /* server_resolve calls whose callback has not
                             run (worker tasks: work_pool_pending) */

  /* Access control (acl.h): rebuilt from cfg at start and on reload. */
  acl_t *acl;
  void *admin;   /* admin.c: rate samples, jobs (admin_int.h) */
  void *metrics; /* metrics.c: the HTTP endpoint, the textfile */
  /* main.c: called once the socket listens (pid file, --daemonize). */
  void (*on_ready)(server_t *srv);
};

/* Runs the daemon until SIGTERM or SIGINT.  Returns the exit status. */
int server_run(server_t *srv);

/* Rebuilds srv->acl from srv->cfg (allow lines, admin_group).  Returns 0 or a
 * code with a message (the old rules are then kept). */
int server_apply_access(server_t *srv, char *err, size_t errlen);
/* Reloads the configuration (SIGHUP, larderctl reload); writes what
 * happened into summary, and the keys that changed and those that changed
 * but need a restart, as "a, b" lists, into changed and restart (either
 * may be NULL).  Returns 0 or a negative code (the file is broken: the
 * current configuration stays). */
int server_reload(server_t *srv, char *summary, size_t len, char *changed, size_t changed_len,
                  char *restart, size_t restart_len);

/*
 * Takes a trainer's report of the time it waited for batches and the time
 * it computed between them (sent with each release).  The workers run
 * worker_nice nicer than the loop so that trainers, when they compute, get
 * the cores first; but a trainer that waits has nothing to compute, and
 * then the workers are what it waits on.  So while trainers spend more
 * than 25% of their time waiting (over at least 100 ms), the workers run
 * at the loop's niceness, and below 10% (or after a second without
 * reports) they drop back.  Measured on 2 cores, with a trainer that waits
 * on every batch: preemption by every wakeup of the loop and the trainer
 * cost the workers about a third of their rate.  The thresholds are high
 * because boosted workers delay a computing trainer's wakeups: with 5% and
 * 1%, a trainer that computed 1.4-1.6 times the daemon's cost per batch,
 * boosted by the first batches of its stream, stayed boosted at 2.8-3.5%
 * stall, against under 1% unboosted.  Loop thread.
 */
void server_trainer_report(server_t *srv, uint64_t wait_ns, uint64_t compute_ns);

/* remote_resolve (remote.h) with the server's fetcher, footer set and
 * footer_guess, counted until cb has run so that shutdown waits for it as
 * it waits for worker tasks.  Returns 0 (cb will run, on the loop) or a
 * negative code (it will not: LARDER_ENOMEM, or remote_resolve's).  Loop
 * thread. */
int server_resolve(server_t *srv, const char *const *sources, size_t n, remote_cb cb, void *arg);

#endif /* LARDER_SERVER_H */
