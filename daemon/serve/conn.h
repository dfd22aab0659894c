/*
 * conn.h: one client connection (prefix conn_): the handshake, framing,
 * corked writes, descriptor passing and the backlog of unsent frames.
 *
 * Conventions
 * -----------
 * - Threading: the loop thread's.
 * - Ownership: the server owns its connections (server_t.conns); a
 *   connection's memory is freed in its pipe's close callback and nowhere
 *   else, after its streams have closed.  Sends never close the connection
 *   under their caller: a failed send marks it broken, and it closes on the
 *   loop's next turn.
 * - Errors: negative larder_errno_t; conn_send_error reports one to the
 *   client as an Error frame.
 */
#ifndef LARDER_CONN_H
#define LARDER_CONN_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "acl.h"
#include "strbuf.h"
#include "wire.h"

typedef struct server server_t;
typedef struct conn conn_t;
typedef struct stream stream_t;

struct conn {
  uv_pipe_t pipe;
  server_t *srv;
  uint64_t id;
  pid_t pid;
  uid_t uid;
  gid_t gid;
  int hello_done;
  int closing;
  int draining;              /* conn_shutdown: nothing more is read or sent */
  int read_paused;           /* conn.c: its replies wait unread (backlog) */
  uint64_t partial_since_ns; /* conn.c: when the unfinished frame began */
  char name[64];
  uint8_t *rbuf;
  size_t rlen, rcap;
  stream_t *streams; /* this connection's streams */
  int num_streams;
  int cuda_parked; /* CUDA regions kept for it (cuda.h): they count with its
                      streams against max_streams_per_client */
  int pidfd;       /* its process, watched from its first CUDA stream on
                      (cuda_watch_pid), or -1 */
  uint32_t next_stream_id;
  /* Frames waiting for the write queue to drain before a descriptor can be
   * passed with sendmsg, and every frame after them (conn.c). */
  struct pending_fd *pending, *pending_tail;
  uint64_t pending_bytes; /* their unsent bytes: part of the backlog */
  int pending_fd_frames;  /* those still holding descriptors */
  int sending;            /* depth of conn_send_fds calls on the stack */
  int broken;             /* a send failed: closed on the next loop turn */
  uint32_t fd_retry_ms;   /* the next wait for a descriptor's sendmsg */
  /* Frames sent and not yet written: written together at the end of the
   * read that produced them, or before the loop sleeps (conn_flush_all). */
  strbuf_t cork;
  uv_timer_t fd_timer;
  int fd_timer_active;
  conn_t *next, *prev;
  uint64_t connected_ns;
  /* Access control and per-client limits (acl.h, stream.c, admin.c). */
  gid_t *groups; /* supplementary groups, from SO_PEERGROUPS */
  int num_groups;
  uint64_t arena_bytes; /* arenas of its open streams */
  int pending_requests; /* stream opens and admin jobs in progress */
  int is_admin_conn;    /* larderctl's Hello, or has sent an admin request */
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
/* Whether stream_id's OpenStreamReply (with its descriptors) still waits,
 * not a byte of it sent: the client has none of its shared memory. */
int conn_reply_unsent(const conn_t *c, uint32_t stream_id);
void conn_send_error(conn_t *c, int code, uint32_t stream_id, uint32_t request_id, const char *fmt,
                     ...) __attribute__((format(printf, 5, 6)));
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

#endif /* LARDER_CONN_H */
