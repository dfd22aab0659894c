/*
 * admin.h: larderctl's requests (prefix admin_): stats, config, reload,
 * ls, evict, verify, prefetch and cat, and the rates that stats and the
 * metrics show.
 *
 * Conventions
 * -----------
 * - Threading: the loop thread's.  Jobs that block (evict, verify,
 *   prefetch offers) run their work on workers and answer from the loop.
 * - Ownership: jobs belong to the connection that started them and end
 *   with it (admin_conn_closed) or with the daemon (admin_shutdown).
 * - Errors: negative larder_errno_t, answered to the client as an Error
 *   frame or a reply with a nonzero status.
 */
#ifndef LARDER_ADMIN_H
#define LARDER_ADMIN_H

#include "wire.h"

typedef struct server server_t;
typedef struct conn conn_t;
typedef struct stream stream_t;

/* Answers one AdminRequest (larderctl). */
void admin_handle(conn_t *c, const Larder__AdminRequest *req);
/* The connection is closing: its jobs (prefetch, cat) stop. */
void admin_conn_closed(conn_t *c);
/* Every second (the tick): samples for the rates in stats. */
void admin_tick(server_t *srv);
/* Shutdown: ends every job and frees admin.c's state. */
void admin_shutdown(server_t *srv);

/* Rates over the last few seconds, for stats and metrics (admin_stats.c):
 * the daemon's and each stream's over one window, from one sample of the
 * tick (or the daemon's start) to now. */
typedef struct admin_rates {
  double window_s; /* seconds the rates cover */
  int workers;     /* worker threads, of which the worker stages take a share */
  double fetch_bytes_per_s, batch_bytes_per_s, batches_per_s;
  double fetch_ns, decode_ns, cache_read_ns, assemble_ns; /* in the window */
  double wait_ns, compute_ns;                             /* all streams */
} admin_rates_t;
void admin_global_rates(server_t *srv, admin_rates_t *out);
/* One stream's batches/s, bytes/s and stall fraction over the window of
 * admin_global_rates (a stream opened within it counts from its open, 0
 * then), so that one stream alone has the daemon's batches/s. */
void admin_stream_rates(server_t *srv, const conn_t *c, const stream_t *s, double *batches_per_s,
                        double *bytes_per_s, double *stall);

#endif /* LARDER_ADMIN_H */
