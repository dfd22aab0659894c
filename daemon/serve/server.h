/*
 * server.h: larderd's shared state and the interfaces between its loop-side
 * modules: server (listening, signals, lifecycle), conn (one client
 * connection), stream (one stream of batches) and units (the pool of decoded
 * units in memory).
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
#include <sys/types.h>
#include <uv.h>

#include "larder.h"
#include "wire.h"
#include "acl.h"
#include "serve/arena.h"
#include "config.h"
#include "plan/dataset.h"
#include "fetch/fetch.h"
#include "htab.h"
#include "serve/layout.h"
#include "plan/shuffle.h"
#include "stats.h"
#include "strbuf.h"
#include "cache/store.h"
#include "work.h"

typedef struct server server_t;
typedef struct conn conn_t;
typedef struct stream stream_t;
typedef struct unit unit_t;
typedef struct unit_waiter unit_waiter_t;
typedef struct rgbuf rgbuf_t;

#define LARDERD_VERSION "0.1.0"
/* The most batches a stream's client may hold (OpenStream.window). */
#define STREAM_MAX_WINDOW 1024u
/* The most rows a batch may have (OpenStream.batch_size). */
#define STREAM_MAX_BATCH (1u << 20)
/* The most node partitions a stream may ask for (OpenStream.partitions). */
#define STREAM_MAX_PARTITIONS 65536u

/* ------------------------------------------------------------------------ */
/* Units: decoded units held in memory (units.c)                             */

enum { UNIT_LOADING = 0, UNIT_READY = 1, UNIT_FAILED = 2 };

struct unit {
  /* Identity: the dataset's unit (object, row group, rows) and column set. */
  uint64_t hash;
  uint64_t object_id;
  uint32_t rg;
  uint64_t row_start;
  uint32_t rows;
  uint64_t columns_hash;

  int refs;
  int state;
  int error;
  char *message;          /* FAILED: why */
  dataset_t *ds;          /* held while loading */
  uint32_t index;         /* in ds */
  int num_columns;
  store_value_t **cached; /* per column, when read from the cache */
  uint8_t **blobs;        /* per column, when decoded */
  layout_view_t *views;   /* per column, READY */
  layout_rows_t rowblock; /* the row block (layout.h), when the dataset has a
                             row plan */
  uint64_t bytes;          /* in memory, row block included */
  uint64_t data_bytes;     /* of its column blobs: what the cache holds */
  int from_cache;
  int for_prefetch;       /* loaded for `larderctl prefetch` alone: its bytes
                             are not the trainers' hits or misses */
  int retry;              /* its row group was being decoded: try again */
  int need_fetch;         /* remote and not cached: its row group's bytes */
  rgbuf_t *rgbuf;         /* the fetched bytes it decodes from */
  rgbuf_t *waiting_rgbuf; /* the row group fetch it waits for, or NULL */
  uint32_t run_units;     /* units its decode left no need to decode again
                             (itself, and those it put in the cache) */
  int ahead;              /* loaded for read-ahead: no stream waits yet */
  unit_t *retry_next;
  uint64_t fetch_ns, decode_ns, cache_read_ns;

  unit_waiter_t **waiters; /* whom to tell when it is READY or FAILED */
  int num_waiters, cap_waiters;
  htab_node_t hnode;      /* in srv->unit_table; hnode.hash is its hash */
  unit_t *lru_prev, *lru_next; /* idle list (refs == 0, READY) */
  work_t work;
  server_t *srv;
};

/* Returns the unit (refs + 1), starting its load if it is not in memory.
 * NULL when out of memory. */
unit_t *units_acquire(server_t *srv, dataset_t *ds, uint32_t index);
/*
 * Read-ahead of a remote unit's row group, for a unit that streams will
 * need later (stream.c walks the coming batches).  Starts the fetch (queued
 * behind every fetch a trainer waits for) and holds nothing.  into_cache
 * (the cache will keep the row group): the row group is then decoded into
 * the cache, its units landing in the idle pool; else only its bytes are
 * kept, in memory, for the units' loads, within a quarter of memory_limit.
 * Returns 1 when it started a fetch, 0 when there is nothing to do (a local
 * file, cached already, in memory or being fetched, no cache, or the cache
 * would not keep it after all), or -1 when a budget is spent (bytes being
 * fetched reach fetch_inflight_bytes, or bytes read ahead into memory reach
 * memory_limit / 4): stop for now.  Loop thread.
 */
int units_read_ahead(server_t *srv, dataset_t *ds, uint32_t index, int into_cache);
/* Lets go of row groups read ahead into memory that no unit used within a
 * minute (their stream closed or moved on).  The tick calls it. */
void units_expire_read_ahead(server_t *srv);
/* What units_offer did (negative: store_put's error). */
enum {
  UNITS_OFFER_SKIPPED = 0, /* nothing offered: out of memory, or a column
                              the cache lacks has no data */
  UNITS_OFFER_HELD = 1,    /* the cache held every column already */
  UNITS_OFFER_WRITTEN = 2, /* the columns it lacked are written now */
  UNITS_OFFER_REFUSED = 3  /* store_reserve refused them (full, admission
                              off, or of lower priority) */
};
/*
 * Offers the serialized columns of unit k of ds to the cache: those st
 * does not hold yet (data[c], sizes[c] bytes, per column of ds; data[c]
 * may be NULL for a column st holds) are reserved and written together,
 * and a write that fails gives the reservation back.  Returns a
 * UNITS_OFFER_ value or store_put's negative code; reports nothing (the
 * caller logs what it must).  data stays the caller's.  Any thread (a
 * worker: it blocks on the cache).
 */
int units_offer(store_t *st, const dataset_t *ds, uint32_t k, const void *const *data,
                const size_t *sizes);
/* Drops a reference; idle READY units stay cached until memory is needed. */
void units_release(server_t *srv, unit_t *u);
/*
 * A waiter: whoever waits for units to load (a stream) embeds one, sets cb,
 * and registers it with units_wait, as a libuv handle carries its callback.
 * cb(w) runs on the loop when a unit w waits for leaves LOADING (READY or
 * FAILED), once per unit and registration; w is then no longer registered
 * with that unit.  cb may release units, and wait on others.  The waiter's
 * owner keeps it alive while it is registered (units_unwait takes it
 * back).
 */
typedef void (*unit_waiter_cb)(unit_waiter_t *w);
struct unit_waiter {
  unit_waiter_cb cb;
  void *data;             /* the owner's */
};
/* Registers w to be told when u leaves LOADING; a waiter registered already
 * is not added twice.  Returns 0, or LARDER_ENOMEM (w is then not
 * registered).  Loop thread. */
int units_wait(unit_t *u, unit_waiter_t *w);
/* Takes w off u's waiters (nothing when it is not there).  Loop thread. */
void units_unwait(unit_t *u, unit_waiter_t *w);
/* Frees idle units until the pool fits memory_limit. */
void units_trim(server_t *srv);
/* Sets up the unit pool.  room(srv), on the loop, is told each time a fetch
 * read ahead has finished and so left room in the read-ahead budget (the
 * server passes stream_read_ahead_all); it is never called from within
 * itself.  Loop thread. */
void units_init(server_t *srv, void (*room)(server_t *srv));
/* Queues again the loads that waited for a row group (the tick calls it). */
void units_retry(server_t *srv);
void units_shutdown(server_t *srv);

/* ------------------------------------------------------------------------ */
/* Streams (stream.c)                                                        */

/* Opens a stream for conn from an OpenStream request: resolves the dataset
 * on a worker, then replies (OpenStreamReply with the arena, or Error). */
void stream_open(conn_t *c, const Larder__OpenStream *req);
void stream_release(stream_t *s, const Larder__Release *rel);
/* A Wake frame came: the client wrote releases in the stream's ring. */
void stream_wake(stream_t *s);
/* Ends a stream: the client asked, or its connection went away. */
void stream_close(stream_t *s);
/* The client's CloseStream: closes its stream, or frees what the daemon
 * kept of a stream ended before (a CUDA region, cuda.h). */
void stream_client_close(conn_t *c, const Larder__CloseStream *cs);
/* Ends a stream with an error sent to its client. */
void stream_fail(stream_t *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
uint32_t stream_id(const stream_t *s);
/* Lets every stream's read-ahead go on (a fetch finished: the server
 * registers it with units_init).  Loop thread. */
void stream_read_ahead_all(server_t *srv);
/* The stream of connection c with this id, or NULL. */
stream_t *stream_find(conn_t *c, uint32_t id);
/* For the admin stats: the stream's counters, and the next stream of its
 * connection (NULL at the end). */
const stats_stream_t *stream_stats(const stream_t *s);
stream_t *stream_next_in_conn(const stream_t *s);

/* For the admin commands and metrics: what a stream reads. */
typedef struct stream_info {
  uint32_t id;
  uint32_t rank, world_size;
  const char *dataset;        /* dataset_sources_label of its sources */
  uint64_t num_files, num_units, total_rows;
  uint64_t batches_per_epoch, epochs;
  uint64_t arena_bytes;
  uint32_t window;            /* batches its client may hold */
  uint32_t partitions;        /* P (1: none) */
  uint32_t part_first, part_last; /* its node's partitions */
  uint64_t opened_ns;
  const dataset_t *ds;        /* its files; NULL while the open resolves */
  const char *job;            /* as the trainer named it ("" when none) */
  int metrics_group;          /* metrics_group's number (0: none) */
} stream_info_t;
void stream_info(const stream_t *s, stream_info_t *out);

/* ------------------------------------------------------------------------ */
/* Connections (conn.c)                                                      */

struct conn {
  uv_pipe_t pipe;
  server_t *srv;
  uint64_t id;
  pid_t pid;
  uid_t uid;
  gid_t gid;
  int hello_done;
  int closing;
  int draining;           /* conn_shutdown: nothing more is read or sent */
  int read_paused;        /* conn.c: its replies wait unread (backlog) */
  uint64_t partial_since_ns; /* conn.c: when the unfinished frame began */
  char name[64];
  uint8_t *rbuf;
  size_t rlen, rcap;
  stream_t *streams;      /* this connection's streams */
  int num_streams;
  uint32_t next_stream_id;
  /* Frames waiting for the write queue to drain before a descriptor can be
   * passed with sendmsg, and every frame after them (conn.c). */
  struct pending_fd *pending, *pending_tail;
  uint64_t pending_bytes;  /* their unsent bytes: part of the backlog */
  int pending_fd_frames;   /* those still holding descriptors */
  int sending;             /* depth of conn_send_fds calls on the stack */
  int broken;              /* a send failed: closed on the next loop turn */
  uint32_t fd_retry_ms;    /* the next wait for a descriptor's sendmsg */
  /* Frames sent and not yet written: written together at the end of the
   * read that produced them, or before the loop sleeps (conn_flush_all). */
  strbuf_t cork;
  uv_timer_t fd_timer;
  int fd_timer_active;
  conn_t *next, *prev;
  uint64_t connected_ns;
  /* Access control and per-client limits (acl.h, stream.c, admin.c). */
  gid_t *groups;          /* supplementary groups, from SO_PEERGROUPS */
  int num_groups;
  uint64_t arena_bytes;   /* arenas of its open streams */
  int pending_requests;   /* stream opens and admin jobs in progress */
  int is_admin_conn;      /* has sent an admin request */
};

/* The peer's credentials as the ACL sees them. */
static inline void conn_peer(const conn_t *c, acl_peer_t *p) {
  p->uid = c->uid;
  p->gid = c->gid;
  p->groups = c->groups;
  p->num_groups = c->num_groups;
}

void conn_accept(server_t *srv, uv_stream_t *listener);
/* Queues a frame; with fd >= 0 the descriptor travels with its first byte.
 * Returns 0 or a negative code (the connection is then closing).  Never
 * closes the connection itself: a send that fails marks it broken, and it
 * closes on the loop's next turn, so that no caller's stream or connection
 * is freed under it. */
int conn_send(conn_t *c, const Larder__Frame *frame, int fd);
/* The same with num_fds (at most WIRE_MAX_FDS) descriptors, which the
 * connection duplicates: the caller keeps its own.  Returns, with nothing
 * queued and the connection open, LARDER_ELIMIT when it cannot duplicate
 * them (out of descriptors) and LARDER_EBUSY when the client has left
 * CONN_MAX_PENDING_FD_FRAMES such frames unread. */
int conn_send_fds(conn_t *c, const Larder__Frame *frame, const int *fds, int num_fds);
#define CONN_MAX_PENDING_FD_FRAMES 64
/* Drops the unsent frames of stream_id that still hold descriptors (its
 * OpenStreamReply): the client closed a stream whose reply it never read,
 * and the shared memory must not outlive the stream in the queue. */
void conn_cancel_unsent(conn_t *c, uint32_t stream_id);
void conn_send_error(conn_t *c, int code, uint32_t stream_id, uint32_t request_id,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void conn_close(conn_t *c);
/* Writes every connection's corked frames.  The loop calls it before it
 * sleeps and after it hands over finished tasks. */
void conn_flush_all(server_t *srv);
/* Closes the connections that began a frame more than frame_timeout
 * seconds ago and have not finished it, and those that have not completed
 * their handshake within hello_timeout seconds of connecting.  The loop's
 * tick calls it, every second. */
void conn_expire_partial(server_t *srv);
/* Closes once the frames already queued have been written. */
void conn_shutdown(conn_t *c);

/* ------------------------------------------------------------------------ */
/* The server (server.c)                                                     */

struct server {
  uv_loop_t *loop;
  config_t cfg;
  char *config_path;
  store_t *store;
  footers_t *footers;     /* parsed footers shared by datasets (footers.h) */
  remote_footers_t *remote_footers; /* raw remote footers kept (remote.h) */
  /* Why store is NULL: the cache could not be opened at startup. */
  char cache_error[512];
  work_t trim_work;       /* a malloc_trim after many footers were freed */
  int trim_queued;
  stats_global_t stats;
  uint64_t started_ns;
  int64_t started_unix;
  int workers;
  work_pool_t *pool;      /* the worker threads (work.h) */
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
  int accept_paused;      /* 1: listener closing or closed; 2: closed */
  uv_timer_t relisten;
  /* The shuffle windows of the open streams (stream.c, window_reserve):
   * one entry per distinct shuffle, shared by the streams (ranks) that
   * draw the same units, and the bytes they hold together. */
  struct window_resv {
    uint64_t key, bytes;
    int refs;
  } *resv;
  int num_resv, cap_resv;
  uint64_t resv_bytes;
  /* Connections accepted in this turn of the loop, and whether one waits
   * for the next turn (server.c, ACCEPT_BURST). */
  int accepts_this_turn;
  int accept_deferred;
  uv_signal_t sig_term, sig_int, sig_hup;
  uv_timer_t tick;
  uv_prepare_t flush;     /* writes corked frames before the loop sleeps,
                             and starts the next burst of accepts */
  int shutting_down;
  uint64_t shutdown_ns;   /* when SIGTERM came (server.c's grace period) */
  int listening;

  conn_t *conns;
  uint64_t next_conn_id;

  /* units.c */
  htab_t unit_table;       /* units by hash; grows with them (htab.h) */
  unit_t *lru_head, *lru_tail;
  uint64_t unit_bytes;
  int loads_in_flight;
  unit_t *retry_head;     /* loads waiting for their row group's decode */

  /* Remote sources (fetch.c, remote.c; row-group buffers in units.c). */
  fetch_t *fetch;
  struct awscreds *awscreds; /* the credential refresher, NULL with explicit keys */
  int socket_activated;    /* the listening socket came from systemd */
  htab_t rgbuf_table;      /* row-group buffers by hash (htab.h) */
  rgbuf_t *rgbuf_held_head; /* buffers held for their row group's units */
  rgbuf_t *rgbuf_lru_head, *rgbuf_lru_tail;
  uint64_t rgbuf_fetching_bytes; /* asked for and not yet arrived */
  uint64_t rgbuf_ahead_bytes;    /* read ahead into memory, not used yet */
  uint64_t rgbuf_held_bytes;     /* held until their units have decoded */
  int acquiring_ahead;    /* units_acquire is called by units_read_ahead */
  uint64_t acquiring_owner; /* the work owner (work.h) of the loads that
                               units_acquire starts: the stream's */
  int in_read_ahead;      /* units_room is running */
  void (*units_room)(server_t *srv); /* units_init's room callback */
  int resolves_in_flight; /* server_resolve calls whose callback has not
                             run (worker tasks: work_pool_pending) */

  /* Access control (acl.h): rebuilt from cfg at start and on reload. */
  acl_t *acl;
  void *admin;            /* admin.c: rate samples, prefetch jobs */
  void *metrics;          /* metrics.c: the HTTP endpoint, the textfile */
  /* main.c: called once the socket listens (pid file, --daemonize). */
  void (*on_ready)(server_t *srv);
};

/* ------------------------------------------------------------------------ */
/* Administration (admin.c)                                                  */

/* Answers one AdminRequest (larderctl). */
void admin_handle(conn_t *c, const Larder__AdminRequest *req);
/* The connection is closing: its jobs (prefetch, cat) stop. */
void admin_conn_closed(conn_t *c);
/* Every second (the tick): samples for the rates in stats. */
void admin_tick(server_t *srv);
/* Shutdown: ends every job and frees admin.c's state. */
void admin_shutdown(server_t *srv);

/* Rates over the last few seconds, for stats and metrics (admin.c). */
typedef struct admin_rates {
  double window_s;        /* seconds the rates cover (0: no sample yet) */
  double fetch_bytes_per_s, batch_bytes_per_s, batches_per_s;
  double fetch_ns, decode_ns, cache_read_ns, assemble_ns; /* in the window */
  double wait_ns, compute_ns;                            /* all streams */
} admin_rates_t;
void admin_global_rates(server_t *srv, admin_rates_t *out);
/* One stream's batches/s, bytes/s and stall fraction over the window. */
void admin_stream_rates(server_t *srv, const conn_t *c, const stream_t *s, double *batches_per_s,
                        double *bytes_per_s, double *stall);

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
