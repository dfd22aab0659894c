/*
 * larder.c: liblarder's connection and streams, the client side of the
 * protocol: connecting, opening and closing streams, reading frames and
 * the descriptor ring, releasing batches.  How a batch's arrays are built
 * and checked is batch.c's, its exports export.c's (internal.h).
 *
 * A client is one connection.  Frames are read only by the thread that
 * calls larder_stream_next (or open/close), and dispatched to their stream's
 * queue; frames are sent under send_lock, so larder_batch_release may run on
 * any thread.  Batch data is never copied: a batch's arrays point into the
 * stream's arena, which stays mapped until the stream is closed and its last
 * batch released.  Where the daemon offers a descriptor ring (ring.h), the
 * reading thread takes descriptors from it and releases are written to it
 * under the stream's lock; frames then carry only Wake, errors and the end.
 * Each stream's larder_stream_fd is an epoll descriptor over the socket and
 * an eventfd of its own, which the reading thread signals when a call for
 * another stream reads something for this one (stream_signal).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static int ring_tell(larder_client_t *c, larder_stream_t *s);

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int set_err(larder_client_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int set_err(larder_client_t *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof(c->err), fmt, ap);
  va_end(ap);
  return code;
}

const char *larder_client_last_error(const larder_client_t *c) { return c ? c->err : ""; }

/*
 * fork().  A forked child inherits its parent's clients: their socket, the
 * streams' rings and arenas, and the batches the parent held.  A client
 * knows whether it belongs to this process; in a child, releases free
 * local memory only, and every call that would read or write the
 * connection fails.  Otherwise a child (a PyTorch DataLoader worker
 * started with fork) that released an inherited batch, directly or
 * through an exported Arrow array's release, would write the release into
 * the parent's ring or send it on the parent's socket: the daemon would
 * free the parent's batch and reuse its region under it, and fail the
 * parent's stream with LARDER_EPROTO when the parent released that batch
 * in turn.  Tested by client_fork_releases.
 *
 * The test is a count of forks, which a pthread_atfork handler raises in
 * each child, rather than getpid(): a release makes it, and a trainer that
 * keeps up makes no system call per batch.
 */
static atomic_uint fork_generation;
static pthread_once_t fork_watch_once = PTHREAD_ONCE_INIT;
static int fork_watch_rc;

static void fork_child(void) {
  atomic_fetch_add_explicit(&fork_generation, 1, memory_order_relaxed);
}

static void fork_watch(void) { fork_watch_rc = pthread_atfork(NULL, NULL, fork_child); }

/* Whether c was connected by another process: this is a forked child of
 * it.  Any thread. */
static int client_forked(const larder_client_t *c) {
  return atomic_load_explicit(&fork_generation, memory_order_relaxed) != c->fork_gen;
}

/* The error of a call that a forked child makes on its parent's client. */
static int forked_err(larder_client_t *c) {
  return set_err(c, LARDER_EINVAL,
                 "the client belongs to process %d; a forked child must connect its own",
                 (int)c->pid);
}

/* Sends len bytes; the caller holds send_lock.  A failure is remembered
 * in send_failed, for larder_stream_flush: the sends of releases happen
 * inside larder_batch_release, which cannot return it. */
static int send_all_locked(larder_client_t *c, const uint8_t *buf, size_t len) {
  size_t off = 0;
  while (off < len) {
    ssize_t n = send(c->fd, buf + off, len - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd p = {c->fd, POLLOUT, 0};
        poll(&p, 1, 1000);
        continue;
      }
      c->send_failed = 1;
      return LARDER_ECLOSED;
    }
    off += (size_t)n;
  }
  return 0;
}

/* Sends the held releases; the caller holds send_lock. */
static int flush_held_locked(larder_client_t *c) {
  if (c->held_len == 0) return 0;
  int rc = send_all_locked(c, c->held, c->held_len);
  c->held_len = 0;
  c->flushes++;
  return rc;
}

static int send_frame(larder_client_t *c, const Larder__Frame *f) {
  size_t len;
  uint8_t *buf = wire_encode(f, &len);
  if (buf == NULL) return LARDER_ENOMEM;
  pthread_mutex_lock(&c->send_lock);
  int rc = flush_held_locked(c);
  if (rc == 0) rc = send_all_locked(c, buf, len);
  pthread_mutex_unlock(&c->send_lock);
  free(buf);
  return rc;
}

/* Queues a Release frame of s, sending what is held when s holds its share
 * or a reader waits.  Any thread. */
static void hold_release(larder_client_t *c, larder_stream_t *s, const Larder__Frame *f) {
  size_t len;
  uint8_t *buf = wire_encode(f, &len);
  pthread_mutex_lock(&c->send_lock);
  if (buf == NULL) {
    /* Out of memory: what is held goes now; this release is lost, and the
     * stream's window shrinks by one batch. */
    flush_held_locked(c);
    pthread_mutex_unlock(&c->send_lock);
    return;
  }
  if (c->held_len + len > c->held_cap) {
    size_t cap = c->held_cap ? c->held_cap : 1024;
    while (cap < c->held_len + len) cap *= 2;
    uint8_t *p = realloc(c->held, cap);
    if (p == NULL) {
      /* Out of memory: send what is held, then this one directly. */
      flush_held_locked(c);
      send_all_locked(c, buf, len);
      pthread_mutex_unlock(&c->send_lock);
      free(buf);
      return;
    }
    c->held = p;
    c->held_cap = cap;
  }
  memcpy(c->held + c->held_len, buf, len);
  c->held_len += len;
  if (s->held_gen != c->flushes) {
    s->held_gen = c->flushes;
    s->held_releases = 0;
  }
  if (c->reader_waiting || s->caller_waits || ++s->held_releases >= s->hold_max)
    flush_held_locked(c);
  pthread_mutex_unlock(&c->send_lock);
  free(buf);
}

/* ------------------------------------------------------------------------ */
/* Receiving                                                                 */

static larder_stream_t *find_stream(larder_client_t *c, uint32_t id) {
  for (larder_stream_t *s = c->streams; s; s = s->next)
    if (s->id == id) return s;
  return NULL;
}

/* Queues f or wb on s; takes ownership of it. */
static void enqueue(larder_stream_t *s, Larder__Frame *f, wire_batch_t *wb) {
  queued_t *q = malloc(sizeof(*q));
  if (q == NULL) {
    wire_free(f);
    free(wb);
    s->error = LARDER_ENOMEM;
    s->failed_here = 1;
    return;
  }
  q->next = NULL;
  q->frame = f;
  q->batch = wb;
  if (s->q_tail) s->q_tail->next = q;
  else s->q_head = q;
  s->q_tail = q;
}

/* A call that reads something for another stream than `reader` (NULL:
 * none) signals that stream's eventfd, which its larder_stream_fd also
 * shows.  The socket is shared by the client's streams, and a call for
 * stream B (or an open) may read stream A's Wake frame or queue A's Batch
 * frames: the socket is then not readable while A has a batch ready, and
 * an event loop polling A's descriptor would block.  Tested by
 * daemon_client_patterns and daemon_evloop_streams.  The reading thread. */
static void stream_signal(larder_stream_t *s, const larder_stream_t *reader) {
  if (s == reader || s->signalled || s->efd < 0) return;
  uint64_t one = 1;
  if (write(s->efd, &one, sizeof(one)) == (ssize_t)sizeof(one)) s->signalled = 1;
}

/* Sends CloseStream for stream id.  The reading thread. */
static int send_close_stream(larder_client_t *c, uint32_t id, int device_memory_held);
static void fences_drain(larder_stream_t *s, int wait);

/* Releases of s waiting for their fences (lcuda.h).  Any thread. */
static int stream_fences(larder_stream_t *s) {
  pthread_mutex_lock(&s->lock);
  int n = lcuda_fence_count(s->cuda);
  pthread_mutex_unlock(&s->lock);
  return n;
}

/* The descriptors an OpenStreamReply carries: the arena's, then the ring's
 * and the CUDA region's when it announces them. */
static int reply_fds(const Larder__OpenStreamReply *r) {
  return 1 + (r->ring_bytes != 0) + (r->cuda_region_fd != 0);
}

/* Routes one frame, read by a call for `reader` (NULL: open or close).
 * Takes ownership of f. */
static void route(larder_client_t *c, Larder__Frame *f, const larder_stream_t *reader) {
  uint32_t stream_id = 0, request_id = 0;
  switch (f->msg_case) {
    case LARDER__FRAME__MSG_BATCH: stream_id = f->batch->stream_id; break;
    case LARDER__FRAME__MSG_END_OF_STREAM: stream_id = f->end_of_stream->stream_id; break;
    case LARDER__FRAME__MSG_ERROR:
      stream_id = f->error->stream_id;
      request_id = f->error->request_id;
      break;
    case LARDER__FRAME__MSG_OPEN_STREAM_REPLY: request_id = f->open_stream_reply->request_id; break;
    case LARDER__FRAME__MSG_ADMIN_REPLY: request_id = f->admin_reply->request_id; break;
    case LARDER__FRAME__MSG_HELLO_REPLY: request_id = 0; break;
    case LARDER__FRAME__MSG_WAKE: {
      /* Its work is done: it ended a wait in pump, and the reader looks at
       * the rings next; unless this call reads for another stream, whose
       * descriptor must then show it. */
      larder_stream_t *s = find_stream(c, f->wake->stream_id);
      if (s) stream_signal(s, reader);
      wire_free(f);
      return;
    }
    default: break;
  }
  if (stream_id) {
    larder_stream_t *s = find_stream(c, stream_id);
    if (s) {
      enqueue(s, f, NULL);
      stream_signal(s, reader);
    } else {
      wire_free(f);
    }
    return;
  }
  if (f->msg_case == LARDER__FRAME__MSG_ERROR && request_id == 0 && c->waiting_request == 0) {
    /* A connection-level error: every stream ends with it. */
    snprintf(c->err, sizeof(c->err), "%s", f->error->message ? f->error->message : "");
    for (larder_stream_t *s = c->streams; s; s = s->next) {
      if (!s->error) s->error = f->error->code;
      stream_signal(s, reader);
    }
    c->broken = f->error->code < 0 ? f->error->code : LARDER_ECLOSED;
    wire_free(f);
    return;
  }
  if (c->reply == NULL &&
      (request_id == c->waiting_request || f->msg_case == LARDER__FRAME__MSG_HELLO_REPLY ||
       (f->msg_case == LARDER__FRAME__MSG_ERROR && request_id == 0))) {
    c->reply = f;
    /* Descriptors come in the order of their frames: the reply's follow
     * those of a reply routed before it (none: the open took them). */
    if (f->msg_case == LARDER__FRAME__MSG_OPEN_STREAM_REPLY) {
      int n = reply_fds(f->open_stream_reply);
      c->fds_claimed = n < c->num_fds ? n : c->num_fds;
    }
    return;
  }
  if (f->msg_case == LARDER__FRAME__MSG_OPEN_STREAM_REPLY) {
    /* The reply to an open that timed out, arriving later: its arena and
     * ring descriptors must not stay in c->fds, where the next open would
     * take them for its own, and the daemon must not keep the stream.  Its
     * descriptors follow those of the reply being waited for, if that came
     * first: close them, and close the stream there.  Tested by
     * daemon_open_late_reply. */
    int at = c->fds_claimed, n = reply_fds(f->open_stream_reply);
    if (n > c->num_fds - at) n = c->num_fds - at;
    for (int i = 0; i < n; i++) close(c->fds[at + i]);
    memmove(c->fds + at, c->fds + at + n, (size_t)(c->num_fds - at - n) * sizeof(int));
    c->num_fds -= n;
    if (f->open_stream_reply->stream_id) send_close_stream(c, f->open_stream_reply->stream_id, 0);
  }
  wire_free(f);
}

/* Reads what is available (waiting up to timeout_ms for something) and
 * routes complete frames.  Returns 0, LARDER_ETIMEDOUT, or LARDER_ECLOSED /
 * LARDER_EPROTO when the connection is gone. */
static int pump(larder_client_t *c, const larder_stream_t *reader, int timeout_ms) {
  if (c->broken) return c->broken < 0 ? c->broken : LARDER_ECLOSED;
  if (c->rcap - c->rlen < 65536) {
    size_t cap = c->rcap ? c->rcap * 2 : 131072;
    uint8_t *b = realloc(c->rbuf, cap);
    if (b == NULL) return LARDER_ENOMEM;
    c->rbuf = b;
    c->rcap = cap;
  }
  /* Read first and wait only when nothing is there: a trainer that keeps
   * up finds its next batches already in the socket, and saves a poll per
   * read. */
  int64_t n = wire_recvmsg(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, c->fds, 8, &c->num_fds, 1);
  if (n == -EAGAIN) {
    /* The daemon may be waiting for the releases held here. */
    pthread_mutex_lock(&c->send_lock);
    flush_held_locked(c);
    c->reader_waiting = timeout_ms != 0;
    pthread_mutex_unlock(&c->send_lock);
    if (timeout_ms == 0) return LARDER_ETIMEDOUT;
    struct pollfd p = {c->fd, POLLIN, 0};
    int r = poll(&p, 1, timeout_ms);
    pthread_mutex_lock(&c->send_lock);
    c->reader_waiting = 0;
    pthread_mutex_unlock(&c->send_lock);
    if (r < 0) return errno == EINTR ? 0 : LARDER_EIO;
    if (r == 0) return LARDER_ETIMEDOUT;
    n = wire_recvmsg(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, c->fds, 8, &c->num_fds, 1);
  }
  if (n == -EAGAIN || n == -EINTR) return 0;
  if (n <= 0) {
    c->broken = LARDER_ECLOSED;
    /* Replace any message already there, so that a call that failed
     * because the daemon has gone does not show an earlier call's error
     * (an open's "not a Parquet file").  Tested by client_closed_message. */
    set_err(c, 0, "the daemon closed the connection");
    for (larder_stream_t *s = c->streams; s; s = s->next)
      if (!s->error && !s->ended) s->error = LARDER_ECLOSED;
    return LARDER_ECLOSED;
  }
  c->rlen += (size_t)n;
  size_t off = 0;
  for (;;) {
    int64_t len = wire_frame_ready(c->rbuf + off, c->rlen - off, WIRE_MAX_FRAME);
    if (len < 0) {
      c->broken = LARDER_EPROTO;
      return set_err(c, LARDER_EPROTO, "the daemon sent an oversized frame");
    }
    if (len == 0) break;
    wire_batch_t *wb = wire_decode_batch(c->rbuf + off, (size_t)len);
    if (wb) {
      off += (size_t)len;
      larder_stream_t *s = wb->stream_id ? find_stream(c, wb->stream_id) : NULL;
      if (s) {
        enqueue(s, NULL, wb);
        stream_signal(s, reader);
      } else {
        free(wb);
      }
      continue;
    }
    Larder__Frame *f = wire_decode(c->rbuf + off, (size_t)len, 0, NULL);
    off += (size_t)len;
    if (f == NULL) {
      c->broken = LARDER_EPROTO;
      return set_err(c, LARDER_EPROTO, "the daemon sent a malformed frame");
    }
    route(c, f, reader);
  }
  memmove(c->rbuf, c->rbuf + off, c->rlen - off);
  c->rlen -= off;
  return 0;
}

/* Waits for the reply to request id (or HelloReply for 0). */
static Larder__Frame *wait_reply(larder_client_t *c, uint32_t id, int timeout_ms, int *rc) {
  c->waiting_request = id;
  uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
  while (c->reply == NULL) {
    uint64_t now = now_ns();
    if (now >= deadline) {
      *rc = set_err(c, LARDER_ETIMEDOUT, "the daemon did not answer in time");
      c->waiting_request = 0;
      return NULL;
    }
    int r = pump(c, NULL, (int)((deadline - now) / 1000000ull) + 1);
    if (r && r != LARDER_ETIMEDOUT) {
      *rc = r;
      c->waiting_request = 0;
      return NULL;
    }
  }
  Larder__Frame *f = c->reply;
  c->reply = NULL;
  c->waiting_request = 0;
  *rc = 0;
  return f;
}

/* ------------------------------------------------------------------------ */

static __thread char connect_err[1024];

const char *larder_connect_error(void) { return connect_err; }

/* Sets the calling thread's connect error from errno e at path. */
static void connect_failed(const char *path, int e) {
  const char *hint = e == ENOENT || e == ECONNREFUSED
                         ? " (is larderd running? $LARDER_SOCKET or the socket argument choose "
                           "another socket)"
                     : e == EACCES || e == EPERM
                         ? " (the socket admits its owner and group only: is this user in the "
                           "larder group?)"
                         : "";
  snprintf(connect_err, sizeof(connect_err), "cannot connect to larderd at %s: %s%s", path,
           strerror(e), hint);
}

int larder_client_connect(const char *socket_path, larder_client_t **out) {
  *out = NULL;
  connect_err[0] = '\0';
  if (socket_path == NULL) socket_path = getenv("LARDER_SOCKET");
  if (socket_path == NULL || socket_path[0] == '\0') socket_path = LARDER_DEFAULT_SOCKET;
  (void)pthread_once(&fork_watch_once, fork_watch);
  if (fork_watch_rc != 0) return LARDER_ENOMEM;
  larder_client_t *c = calloc(1, sizeof(*c));
  if (c == NULL) return LARDER_ENOMEM;
  atomic_init(&c->refs, 1);
  pthread_mutex_init(&c->send_lock, NULL);
  c->pid = getpid();
  c->fork_gen = atomic_load_explicit(&fork_generation, memory_order_relaxed);
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (strlen(socket_path) >= sizeof(addr.sun_path)) {
    snprintf(connect_err, sizeof(connect_err),
             "the socket path %.900s is longer than a Unix socket's %zu bytes", socket_path,
             sizeof(addr.sun_path) - 1);
    larder_client_close(c);
    return LARDER_EINVAL;
  }
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket_path);
  if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
    connect_failed(socket_path, errno);
    larder_client_close(c);
    return LARDER_ECONNECT;
  }
  Larder__Hello hello = LARDER__HELLO__INIT;
  hello.protocol_version = WIRE_PROTOCOL_VERSION;
  hello.client_name = (char *)"liblarder/0.1";
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_HELLO;
  f.hello = &hello;
  int rc = send_frame(c, &f);
  /* Read what the daemon sent even when the Hello's send failed: a daemon
   * refusing the connection (max_clients, shutting down) writes its Error
   * and closes at once, sometimes before the Hello goes out, and that Error
   * says why, where ECLOSED alone would not.  Tested by
   * daemon_reload_keeps_flags. */
  int send_rc = rc;
  Larder__Frame *r = wait_reply(c, 0, send_rc ? 2000 : 10000, &rc);
  if (r == NULL) {
    larder_client_close(c);
    if (send_rc && (rc == 0 || rc == LARDER_ETIMEDOUT)) rc = send_rc;
    rc = rc ? rc : LARDER_EPROTO;
    snprintf(connect_err, sizeof(connect_err), "larderd at %s did not complete the handshake: %s",
             socket_path, larder_strerror(rc));
    return rc;
  }
  if (r->msg_case == LARDER__FRAME__MSG_ERROR) {
    rc = r->error->code ? r->error->code : LARDER_EPROTO;
    snprintf(connect_err, sizeof(connect_err), "larderd at %s refused the connection: %s",
             socket_path,
             r->error->message && *r->error->message ? r->error->message : larder_strerror(rc));
    wire_free(r);
    larder_client_close(c);
    return rc;
  }
  wire_free(r);
  *out = c;
  return 0;
}

static void client_unref(larder_client_t *c);

void larder_client_close(larder_client_t *c) {
  if (c == NULL) return;
  /* A forked child shares the parent's socket: closing the streams there
   * must not send CloseStream for them (see larder_stream_close).  Each
   * close unlinks its stream from c->streams, whose client is c, so the
   * loop never sees a freed one (the analyzer cannot tell). */
  /* NOLINTNEXTLINE(clang-analyzer-unix.Malloc) */
  while (c->streams) larder_stream_close(c->streams);
  client_unref(c);
}

/* Frees c: its socket closes, and with it the daemon's side of the
 * connection. */
static void client_free(larder_client_t *c) {
  if (c->fd >= 0) close(c->fd);
  for (int i = 0; i < c->num_fds; i++) close(c->fds[i]);
  wire_free(c->reply);
  free(c->rbuf);
  free(c->held);
  pthread_mutex_destroy(&c->send_lock);
  free(c);
}

/* Drops one of c's references; the last frees it.  Any thread. */
static void client_unref(larder_client_t *c) {
  if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1) client_free(c);
}

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */

void larder_stream_options_init(larder_stream_options_t *o) {
  memset(o, 0, sizeof(*o));
  o->batch_size = 256;
  o->shuffle = 1;
  o->epochs = 1;
  o->rank = -1;
  o->world_size = -1;
  o->local_world_size = -1;
  /* Thirty-two: the window is what carries a trainer over the moments the
   * daemon falls behind (a worker or the loop preempted, a vCPU taken by
   * the host), and a window of 4 or 8 batches covers well under a
   * millisecond of a short step.  Measured on 2 cores at about twice the
   * daemon's cost (bench-serve): median stall 0.80% with 8, 0.54% with
   * 16 (worst epoch 4.5%), 0.31% with 32 (worst 0.64%).  It costs no
   * memory of its own: the arena (arena_bytes) bounds the bytes of the
   * batches held and assembled ahead, whatever the count. */
  o->window = LARDER_DEFAULT_WINDOW;
  o->cuda_device = -1;
}

/* Whether the environment variable name is set and not empty. */
static int env_set(const char *name) {
  const char *v = getenv(name);
  return v != NULL && *v != '\0';
}

/* Reads the environment variable name into *out (def when it is unset or
 * empty).  A value that is not a number ("abc", "2x") or out of range
 * ("99999999") is an error, not the default: otherwise a misconfigured job
 * would run every rank as rank 0 of 1.  Tested by daemon_open_checks.
 * Returns 0, or LARDER_EINVAL with the variable and its value in the
 * client's error. */
static int env_int(larder_client_t *c, const char *name, int def, int min, int *out) {
  const char *v = getenv(name);
  *out = def;
  if (v == NULL || *v == '\0') return 0;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *v < '0' || *v > '9' || *end != '\0' || x < min || x >= (1 << 24))
    return set_err(c, LARDER_EINVAL, "%s=\"%s\" is not a number from %d to %d", name, v, min,
                   (1 << 24) - 1);
  *out = (int)x;
  return 0;
}

/* Sets *out to a malloc'd copy of src made absolute against this
 * process's working directory, as the daemon would resolve a relative
 * path against its own (tested by daemon_open_checks); URLs
 * (anything with "://", as the daemon tells them apart) and absolute paths
 * are copied unchanged.  Where the result is a glob (it has one of *?[),
 * the directory's own wildcard characters are escaped so that glob reads
 * them literally.  Returns 0, LARDER_ENOMEM or LARDER_EINVAL (no working
 * directory), with the client's error set. */
static int absolute_source(larder_client_t *c, const char *src, char **out) {
  *out = NULL;
  if (src[0] == '/' || src[0] == '\0' || strstr(src, "://") != NULL) {
    *out = strdup(src);
    return *out ? 0 : set_err(c, LARDER_ENOMEM, "out of memory");
  }
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == NULL)
    return set_err(c, LARDER_EINVAL,
                   "%s: a relative path, and the working directory is unknown: %s", src,
                   strerror(errno));
  while (src[0] == '.' && src[1] == '/') {
    src += 2;
    while (*src == '/') src++;
  }
  int glob = strpbrk(cwd, "*?[") != NULL || strpbrk(src, "*?[") != NULL;
  size_t n = strlen(cwd), m = strlen(src);
  char *r = malloc(2 * n + m + 2);
  if (r == NULL) return set_err(c, LARDER_ENOMEM, "out of memory");
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (glob && strchr("*?[]\\", cwd[i])) r[k++] = '\\';
    r[k++] = cwd[i];
  }
  if (k == 0 || r[k - 1] != '/') r[k++] = '/';
  memcpy(r + k, src, m + 1);
  *out = r;
  return 0;
}

/* Checks that fd, a memfd the daemon sent, holds at least size bytes and
 * is sealed against shrinking, as the daemon seals its arenas and rings
 * (daemon/serve/arena.c): the arena is mapped with the size the daemon reports,
 * and a memfd shorter than that, or one shrunk later, would make reading a
 * batch fault (SIGBUS).  Tested by client_fake_shm_checks.  Returns 0 or
 * LARDER_EPROTO with the client's error set.  The thread that opens. */
static int check_shm(larder_client_t *c, int fd, uint64_t size, const char *what) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < 0 || (uint64_t)st.st_size < size)
    return set_err(c, LARDER_EPROTO, "the %s is smaller than the daemon says", what);
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return set_err(c, LARDER_EPROTO, "the %s is not sealed against shrinking", what);
  return 0;
}

/* See internal.h.  The copy is checked as the daemon works from its own
 * ring_layout_t.  Tested by client_fake_ring_rewritten, and by fuzz-ring. */
int llib_ring_snapshot(larder_stream_t *s, ring_header_t *h, uint64_t size, uint32_t num_layout) {
  ring_layout_t *l = &s->ring_layout;
  if (size < sizeof(ring_header_t)) return 0;
  ring_layout_init(l, h);
  s->ring_num_layout = num_layout;
  return h->magic == RING_MAGIC && h->num_layout == num_layout && l->slots > 0 &&
         l->slots <= LARDER_MAX_WINDOW && l->slot_bytes == ring_slot_bytes(num_layout) &&
         l->releases_offset == sizeof(ring_header_t) &&
         l->descs_offset == sizeof(ring_header_t) + l->slots * sizeof(ring_release_t) &&
         ring_bytes((uint32_t)l->slots, num_layout) <= size;
}

/* Checks the options an open was given, before anything is sent: a window
 * above LARDER_MAX_WINDOW, a NULL column, out-of-range ranks and sizes, a
 * batch size of 0, and RANK, WORLD_SIZE or LOCAL_WORLD_SIZE set but empty
 * where the options leave them to the environment.  Returns 0, or
 * LARDER_EINVAL with the client's error naming the field.  The thread that
 * opens. */
static int open_check_options(larder_client_t *c, const larder_stream_options_t *opts) {
  /* Refuse a window above LARDER_MAX_WINDOW: the daemon caps a stream's
   * window there silently, while this side sizes its wakeups and held
   * releases from the window asked for, so a client holding more than the
   * cap would wait forever.  Tested by daemon_open_checks. */
  if (opts->window > LARDER_MAX_WINDOW)
    return set_err(c, LARDER_EINVAL, "window %u exceeds the most a stream may hold, %d batches",
                   opts->window, LARDER_MAX_WINDOW);
  /* A NULL entry in the columns is refused here, as protobuf-c's packing
   * would crash on it.  (A NULL source entry is an empty source, which the
   * daemon refuses by name.)  Tested by client_open_null_vectors. */
  for (size_t i = 0; opts->columns && i < opts->num_columns; i++)
    if (opts->columns[i] == NULL)
      return set_err(c, LARDER_EINVAL, "column %zu of %zu is NULL", i, opts->num_columns);
  /* Out-of-range settings fail here, naming the field, instead of turning
   * into a default: 0 is not "ask the environment" (-1 is). */
  if (opts->world_size == 0 || opts->world_size < -1)
    return set_err(c, LARDER_EINVAL,
                   "world_size %d: give the number of ranks, or -1 for $WORLD_SIZE",
                   (int)opts->world_size);
  if (opts->rank < -1)
    return set_err(c, LARDER_EINVAL, "rank %d: give this rank (from 0), or -1 for $RANK",
                   (int)opts->rank);
  if (opts->rank >= 0 && opts->world_size > 0 && opts->rank >= opts->world_size)
    return set_err(c, LARDER_EINVAL, "rank %d is not below world_size %d", (int)opts->rank,
                   (int)opts->world_size);
  if (opts->local_world_size == 0 || opts->local_world_size < -1)
    return set_err(c, LARDER_EINVAL,
                   "local_world_size %d: give the ranks per node, or -1 for $LOCAL_WORLD_SIZE",
                   (int)opts->local_world_size);
  if (opts->batch_size == 0)
    return set_err(c, LARDER_EINVAL, "batch_size 0: a batch needs at least one row");
  /* A variable that is set but empty is a launcher's mistake, not a
   * request for the default. */
  static const char *const must_not_be_empty[] = {"RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"};
  for (size_t i = 0; i < sizeof(must_not_be_empty) / sizeof(must_not_be_empty[0]); i++) {
    const char *v = getenv(must_not_be_empty[i]);
    int used = i == 0 ? opts->rank < 0 : i == 1 ? opts->world_size < 0 : opts->local_world_size < 0;
    if (used && v && *v == '\0')
      return set_err(c, LARDER_EINVAL, "%s is set but empty: unset it, or give a number",
                     must_not_be_empty[i]);
  }
  return 0;
}

/* Where an open's stream sits in the job, as the options say or else the
 * environment, and the UUID of its CUDA device (CUDA streams only). */
typedef struct open_params {
  int rank, world, cuda, local;
  uint8_t cuda_uuid[16];
} open_params_t;

/* Fills *p from the options (checked by open_check_options) and, where
 * they leave a value to it, the environment; for a CUDA stream, checks
 * that the driver and device are there (before the daemon allocates
 * device memory for the stream) and reads the device's UUID.  Returns 0,
 * LARDER_EINVAL (a variable that is no number, an unknown memory kind),
 * or lcuda_device_uuid's error, with the client's error set.  The thread
 * that opens. */
static int open_resolve(larder_client_t *c, const larder_stream_options_t *opts, open_params_t *p) {
  int rank = opts->rank, world = opts->world_size, cuda = opts->cuda_device, rc = 0;
  /* Only the first variable set counts, and only it is parsed, so that a
   * LOCAL_RANK or SLURM_NTASKS that is no number does not fail the open
   * where RANK and WORLD_SIZE say all.  Tested by client_rank_env. */
  if (rank < 0)
    rc = env_int(c,
                 env_set("RANK")           ? "RANK"
                 : env_set("SLURM_PROCID") ? "SLURM_PROCID"
                                           : "LOCAL_RANK",
                 0, 0, &rank);
  if (rc == 0 && world <= 0)
    rc = env_int(c, env_set("WORLD_SIZE") ? "WORLD_SIZE" : "SLURM_NTASKS", 1, 1, &world);
  /* Only CUDA memory has a device, so LOCAL_RANK is parsed for it only: a
   * job that sets rank and world size itself, beside a LOCAL_RANK that is
   * no number ("gpu0"), can open a host stream.  Tested by
   * client_local_rank_host. */
  if (rc == 0 && cuda < 0) {
    if (opts->memory_kind == LARDER__MEMORY_KIND__MEMORY_CUDA)
      rc = env_int(c, "LOCAL_RANK", 0, 0, &cuda);
    else cuda = 0;
  }
  /* Ranks per node: torchrun's, else Slurm's, else one node. */
  int local = opts->local_world_size;
  if (rc == 0 && local < 0)
    rc = env_int(c, env_set("LOCAL_WORLD_SIZE") ? "LOCAL_WORLD_SIZE" : "SLURM_NTASKS_PER_NODE", 0,
                 1, &local);
  /* CUDA (client/cuda.c): the driver must be there before the daemon
   * allocates device memory for the stream. */
  if (rc == 0 && opts->memory_kind != LARDER_MEMORY_HOST && opts->memory_kind != LARDER_MEMORY_CUDA)
    rc = set_err(c, LARDER_EINVAL,
                 "memory_kind %d is neither LARDER_MEMORY_HOST nor LARDER_MEMORY_CUDA",
                 opts->memory_kind);
  if (rc == 0 && opts->memory_kind == LARDER_MEMORY_CUDA)
    rc = lcuda_device_uuid(cuda, p->cuda_uuid, c->err, sizeof(c->err));
  p->rank = rank;
  p->world = world;
  p->cuda = cuda;
  p->local = local;
  return rc;
}

/* Sends the OpenStream request for opts and p, with relative sources made
 * absolute, and sets *request_id to its id.  Returns 0, or LARDER_ENOMEM,
 * LARDER_EINVAL (absolute_source) or the send's error, with the client's
 * error set.  The thread that opens. */
static int open_send(larder_client_t *c, const larder_stream_options_t *opts, open_params_t *p,
                     uint32_t *request_id) {
  Larder__OpenStream req = LARDER__OPEN_STREAM__INIT;
  req.partitions = opts->partitions;
  req.local_world_size = (uint32_t)p->local;
  const char *job = opts->job ? opts->job : getenv("LARDER_JOB");
  req.job = (char *)(job ? job : ""); /* packing only reads it */
  req.request_id = ++c->next_request_id;
  *request_id = req.request_id;
  char **sources = calloc(opts->num_sources, sizeof(char *));
  if (sources == NULL) return set_err(c, LARDER_ENOMEM, "out of memory");
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < opts->num_sources; i++)
    rc = absolute_source(c, opts->sources[i] ? opts->sources[i] : "", &sources[i]);
  if (rc) {
    for (size_t i = 0; i < opts->num_sources; i++) free(sources[i]);
    free(sources);
    return rc;
  }
  req.n_sources = opts->num_sources;
  req.sources = sources;
  /* protobuf-c's generated fields are not const, but packing only reads
   * them: casting the caller's const vector is safe. */
  req.n_columns = opts->columns ? opts->num_columns : 0;
  req.columns = (char **)opts->columns;
  req.batch_size = opts->batch_size;
  req.seed = opts->seed;
  req.shuffle = opts->shuffle;
  req.shuffle_window = opts->shuffle_window;
  req.unit_rows = opts->unit_rows;
  req.epochs = opts->epochs;
  req.rank = (uint32_t)p->rank;
  req.world_size = (uint32_t)p->world;
  req.drop_last = opts->drop_last;
  req.start_epoch = opts->start_epoch;
  req.start_batch = opts->start_batch;
  req.window = opts->window;
  req.arena_bytes = opts->arena_bytes;
  req.memory_kind = (Larder__MemoryKind)opts->memory_kind;
  req.cuda_device = p->cuda;
  req.cuda_fd_ok = 1; /* lcuda_map_open maps a VMM allocation's descriptor */
  if (opts->memory_kind == LARDER_MEMORY_CUDA) {
    req.cuda_device_uuid.data = p->cuda_uuid;
    req.cuda_device_uuid.len = sizeof(p->cuda_uuid);
  }
  req.ring = 1;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_OPEN_STREAM;
  f.open_stream = &req;
  rc = send_frame(c, &f);
  for (size_t i = 0; i < opts->num_sources; i++) free(sources[i]);
  free(sources);
  if (rc) return set_err(c, rc, "cannot send to the daemon");
  return 0;
}

/* What an open keeps of the daemon's OpenStreamReply beyond the reply
 * itself: the shared memory's descriptors (the open's to close) and the
 * ring's size, and a CUDA stream's device handle. */
typedef struct open_reply {
  int afd, rfd, cfd; /* the arena; the ring, or -1; the CUDA region, or -1 */
  uint64_t ring_size;
  int want_cuda;
  int cuda_reply_ok; /* a host stream, or a CUDA one whose reply carries its device memory */
  uint8_t cuda_handle[LCUDA_IPC_HANDLE_BYTES];
  size_t cuda_handle_len;
  uint64_t cuda_region_bytes;
} open_reply_t;

/* Claims the descriptors that came with the reply r (the arena, then the
 * ring when the daemon offers one, then the CUDA region when it passes
 * one) and checks that r is an OpenStreamReply with a schema and the
 * descriptors it announces.
 * Returns 0 with *o filled in (r still the caller's), or an error (the
 * daemon's, or LARDER_EPROTO) with the client's error set, r freed and
 * the descriptors closed.  The thread that opens. */
static int open_take_reply(larder_client_t *c, const larder_stream_options_t *opts,
                           Larder__Frame *r, open_reply_t *o) {
  int claimed = c->fds_claimed, rc = 0;
  int got[WIRE_MAX_FDS] = {-1, -1, -1};
  for (int i = 0; i < claimed && i < WIRE_MAX_FDS; i++) got[i] = c->fds[i];
  memmove(c->fds, c->fds + claimed, (size_t)(c->num_fds - claimed) * sizeof(int));
  c->num_fds -= claimed;
  c->fds_claimed = 0;
  const Larder__OpenStreamReply *rep =
      r->msg_case == LARDER__FRAME__MSG_OPEN_STREAM_REPLY ? r->open_stream_reply : NULL;
  int afd = got[0], rfd = -1, cfd = -1;
  if (rep) {
    int at = 1;
    if (rep->ring_bytes) rfd = got[at++];
    if (rep->cuda_region_fd) cfd = got[at];
  }
  if (r->msg_case == LARDER__FRAME__MSG_ERROR) {
    rc = r->error->code < 0 ? r->error->code : LARDER_EPROTO;
    set_err(c, rc, "%s", r->error->message ? r->error->message : larder_strerror(rc));
  } else if (rep == NULL || rep->schema == NULL) {
    rc = LARDER_EPROTO;
    set_err(c, rc, "unexpected reply to OpenStream");
  } else if (afd < 0) {
    rc = set_err(c, LARDER_EPROTO, "the daemon sent no shared-memory arena");
  } else if (rep->ring_bytes && rfd < 0) {
    rc = set_err(c, LARDER_EPROTO, "the daemon sent no descriptor ring");
  } else if (rep->cuda_region_fd && cfd < 0) {
    rc = set_err(c, LARDER_EPROTO, "the daemon sent no descriptor of the CUDA region");
  }
  if (rc) {
    for (int i = 0; i < WIRE_MAX_FDS; i++)
      if (got[i] >= 0) close(got[i]);
    wire_free(r);
    return rc;
  }
  o->afd = afd;
  o->rfd = rfd;
  o->cfd = cfd;
  o->ring_size = rep->ring_bytes;
  /* CUDA: the handle or the descriptor of the device region, kept until
   * the arena is mapped. */
  o->want_cuda = opts->memory_kind == LARDER_MEMORY_CUDA;
  o->cuda_handle_len = rep->cuda_ipc_handle.len;
  o->cuda_region_bytes = rep->cuda_region_bytes;
  o->cuda_reply_ok = !o->want_cuda || (rep->memory_kind == LARDER__MEMORY_KIND__MEMORY_CUDA &&
                                       (cfd >= 0 || o->cuda_handle_len == sizeof(o->cuda_handle)));
  if (o->want_cuda && o->cuda_reply_ok && cfd < 0)
    memcpy(o->cuda_handle, rep->cuda_ipc_handle.data, sizeof(o->cuda_handle));
  return 0;
}

/* Makes the stream the reply r (checked by open_take_reply) describes,
 * with its schema copied and planned, and frees r.  Sets *out to it, or to
 * NULL when it could not be allocated (LARDER_ENOMEM).  Returns 0, or
 * llib_field_copy's error, or LARDER_ENOMEM for the plan (with the
 * client's error set); a stream made is the caller's to close whatever
 * this returns.  The thread that opens. */
static int stream_from_reply(larder_client_t *c, const larder_stream_options_t *opts,
                             Larder__Frame *r, larder_stream_t **out) {
  const Larder__OpenStreamReply *rep = r->open_stream_reply;
  larder_stream_t *s = calloc(1, sizeof(*s));
  *out = s;
  if (s == NULL) {
    wire_free(r);
    return LARDER_ENOMEM;
  }
  pthread_mutex_init(&s->lock, NULL);
  s->client = c;
  s->efd = s->epfd = -1;
  s->cuda_device = -1;
  s->id = rep->stream_id;
  s->refs = 1;
  s->batches_per_epoch = rep->batches_per_epoch;
  s->num_samples = rep->num_samples;
  s->partitions = rep->partitions ? rep->partitions : 1;
  s->partitions_first = rep->partitions_first;
  s->partitions_last = rep->partitions ? rep->partitions_last : 1;
  snprintf(s->note, sizeof(s->note), "%s", rep->note ? rep->note : "");
  s->arena_size = rep->arena_bytes;
  s->pos_epoch = opts->start_epoch;
  s->pos_batch = opts->start_batch;
  /* Before the first batch, the position is the start asked for,
   * normalised as the daemon does: (0, 500) with 420 batches an epoch is
   * (1, 80), where the daemon starts.  Tested by daemon_open_checks. */
  if (s->batches_per_epoch && s->pos_batch >= s->batches_per_epoch) {
    s->pos_epoch += s->pos_batch / s->batches_per_epoch;
    s->pos_batch %= s->batches_per_epoch;
  }
  /* The daemon's window: what the options ask, the default when they
   * leave it 0. */
  uint32_t window = opts->window ? opts->window : LARDER_DEFAULT_WINDOW;
  s->hold_max = window >= 4 ? (int)(window / 2) : 1;
  s->window = window;
  s->ring_wake_batches = 1;
  int rc = llib_field_copy(&s->schema, rep->schema, 0);
  wire_free(r);
  if (rc == 0) {
    s->num_nodes = llib_field_count(&s->schema) - 1;
    rc = llib_plan_stream(s);
    if (rc) set_err(c, rc, "out of memory for the stream's schema");
  }
  return rc;
}

/* Checks and maps the stream's arena (read-only) and ring (read-write:
 * the client writes its releases there) from the descriptors in o, which
 * the caller closes afterwards, and snapshots the ring's layout.  Returns
 * 0, or LARDER_EPROTO (check_shm, a malformed ring) or LARDER_ENOMEM (a
 * mapping failed) with the client's error set; what was mapped is
 * unmapped by closing the stream.  The thread that opens. */
static int stream_map_shared(larder_client_t *c, larder_stream_t *s, const open_reply_t *o) {
  int rc = check_shm(c, o->afd, s->arena_size, "arena");
  if (rc == 0) {
    void *m = mmap(NULL, s->arena_size, PROT_READ, MAP_SHARED, o->afd, 0);
    if (m == MAP_FAILED)
      rc = set_err(c, LARDER_ENOMEM, "cannot map the arena: %s", strerror(errno));
    else s->arena = m;
  }
  if (rc == 0 && o->rfd >= 0) rc = check_shm(c, o->rfd, o->ring_size, "descriptor ring");
  if (rc == 0 && o->rfd >= 0) {
    void *m = mmap(NULL, o->ring_size, PROT_READ | PROT_WRITE, MAP_SHARED, o->rfd, 0);
    if (m == MAP_FAILED) {
      rc = set_err(c, LARDER_ENOMEM, "cannot map the descriptor ring: %s", strerror(errno));
    } else {
      s->ring = m;
      s->ring_size = o->ring_size;
      if (!llib_ring_snapshot(s, s->ring, o->ring_size,
                              (uint32_t)s->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS))
        rc = set_err(c, LARDER_EPROTO, "the daemon sent a malformed descriptor ring");
    }
  }
  return rc;
}

/* Makes s's larder_stream_fd: an epoll descriptor over the client's socket
 * and an eventfd of the stream's own (see stream_signal).  Returns 0 or
 * LARDER_ENOMEM with the client's error set; what was made is closed by
 * closing the stream.  The thread that opens. */
static int stream_make_fd(larder_client_t *c, larder_stream_t *s) {
  int rc = 0;
  s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  s->epfd = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN};
  ev.data.fd = c->fd;
  if (s->efd < 0 || s->epfd < 0 || epoll_ctl(s->epfd, EPOLL_CTL_ADD, c->fd, &ev) != 0)
    rc = set_err(c, LARDER_ENOMEM, "cannot make the stream's descriptor: %s", strerror(errno));
  ev.data.fd = s->efd;
  if (rc == 0 && epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->efd, &ev) != 0)
    rc = set_err(c, LARDER_ENOMEM, "cannot make the stream's descriptor: %s", strerror(errno));
  return rc;
}

/*
 * The steps, each of which fails the open with the client's error set:
 * check the options, resolve the rank and device, send OpenStream, wait
 * for its reply and take the descriptors that came with it, make the
 * stream from the reply, map its shared memory, open a CUDA stream's
 * device region, make its descriptor.  A stream once made is linked into
 * the client and, on a later step's failure, closed as any stream is
 * (which tells the daemon), so that nothing it holds leaks.
 */
int larder_stream_open(larder_client_t *c, const larder_stream_options_t *opts,
                       larder_stream_t **out) {
  *out = NULL;
  if (c == NULL || opts == NULL || opts->num_sources == 0 || opts->sources == NULL)
    return c ? set_err(c, LARDER_EINVAL, "a stream needs at least one source") : LARDER_EINVAL;
  if (client_forked(c)) return forked_err(c);
  int rc = open_check_options(c, opts);
  if (rc) return rc;
  open_params_t p;
  rc = open_resolve(c, opts, &p);
  if (rc) return rc;
  uint32_t request_id;
  rc = open_send(c, opts, &p, &request_id);
  if (rc) return rc;
  /* Opening resolves globs and reads footers: allow it a while.  (The
   * tests shorten it to see what a late reply does.) */
  const char *t = getenv("LARDER_TEST_OPEN_TIMEOUT_MS");
  int open_timeout_ms = t && *t ? atoi(t) : 600000;
  Larder__Frame *r = wait_reply(c, request_id, open_timeout_ms, &rc);
  if (r == NULL) return rc;
  open_reply_t o;
  rc = open_take_reply(c, opts, r, &o);
  if (rc) return rc;
  larder_stream_t *s;
  rc = stream_from_reply(c, opts, r, &s);
  if (s == NULL) {
    close(o.afd);
    if (o.rfd >= 0) close(o.rfd);
    if (o.cfd >= 0) close(o.cfd);
    return rc;
  }
  if (rc == 0) rc = stream_map_shared(c, s, &o);
  close(o.afd);
  if (o.rfd >= 0) close(o.rfd);
  if (rc == 0 && o.want_cuda && !o.cuda_reply_ok)
    rc = set_err(c, LARDER_EPROTO, "the daemon answered a CUDA stream without its device memory");
  if (rc == 0 && o.want_cuda) {
    rc = lcuda_map_open(p.cuda, o.cuda_handle, o.cuda_handle_len, o.cfd, o.cuda_region_bytes,
                        s->arena_size, &s->cuda, c->err, sizeof(c->err));
    s->cuda_device = p.cuda;
  }
  if (o.cfd >= 0) close(o.cfd);
  if (rc == 0) rc = stream_make_fd(c, s);
  s->next = c->streams;
  c->streams = s;
  if (rc) {
    larder_stream_close(s);
    return rc;
  }
  *out = s;
  return 0;
}
int larder_stream_fd(const larder_stream_t *s) { return s->epfd; }

void larder_stream_position(const larder_stream_t *s, uint64_t *epoch, uint64_t *batch) {
  *epoch = s->pos_epoch;
  *batch = s->pos_batch;
}

uint64_t larder_stream_batches_per_epoch(const larder_stream_t *s) { return s->batches_per_epoch; }

void larder_stream_partitions(const larder_stream_t *s, uint32_t *partitions, uint32_t *first,
                              uint32_t *last) {
  if (partitions) *partitions = s->partitions;
  if (first) *first = s->partitions_first;
  if (last) *last = s->partitions_last;
}

const char *larder_stream_note(const larder_stream_t *s) { return s->note; }
uint64_t larder_stream_num_samples(const larder_stream_t *s) { return s->num_samples; }
int larder_stream_num_columns(const larder_stream_t *s) { return s->schema.num_children; }

const char *larder_stream_column_name(const larder_stream_t *s, int i) {
  return i >= 0 && i < s->schema.num_children ? s->schema.children[i].name : NULL;
}

larder_type_t larder_stream_column_type(const larder_stream_t *s, int i) {
  return i >= 0 && i < s->schema.num_children ? s->schema.children[i].type : LARDER_TYPE_NULL;
}

void larder_stream_stall(const larder_stream_t *s, uint64_t *wait_ns, uint64_t *compute_ns) {
  *wait_ns = s->wait_ns;
  *compute_ns = s->compute_ns;
}

/* Frees s once nothing refers to it. */
static void stream_free(larder_stream_t *s) {
  if (s->spare) {
    free(s->spare->nodes);
    free(s->spare);
  }
  if (s->arena) munmap(s->arena, s->arena_size);
  if (s->ring) munmap(s->ring, s->ring_size);
  lcuda_map_close(s->cuda);
  /* A CUDA stream closed while batches held its region: now unmapped,
   * the daemon may free it (see larder_stream_close). */
  if (s->cuda && s->cuda_client && !client_forked(s->cuda_client) && !s->cuda_client->broken)
    (void)send_close_stream(s->cuda_client, s->id, 0);
  if (s->cuda_client) client_unref(s->cuda_client);
  llib_field_free(&s->schema);
  free(s->plan);
  free(s->deep);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

void larder_stream_set_cuda_stream(larder_stream_t *s, void *cuda_stream) {
  pthread_mutex_lock(&s->lock);
  s->cuda_stream = cuda_stream;
  pthread_mutex_unlock(&s->lock);
}

int larder_stream_flush(larder_stream_t *s) {
  larder_client_t *c = s->client;
  if (c == NULL || c->broken) return LARDER_ECLOSED;
  if (client_forked(c)) return forked_err(c);
  if (s->cuda) fences_drain(s, 0);
  /* A stream the daemon ended with an error (LARDER_ESHUTDOWN, ...)
   * returns that error, as the header says: its releases reach nothing.
   * Tested by daemon_open_checks. */
  if (s->error) return s->error;
  /* The Wake's send failing fails the flush: a flush through the ring
   * must not return 0 after the daemon died.  A send that fails means the
   * connection is gone: later calls say so too.  Tested by
   * client_flush_dead_daemon. */
  int rc = s->ring ? ring_tell(c, s) : 0;
  pthread_mutex_lock(&c->send_lock);
  int hrc = flush_held_locked(c);
  /* A release whose frame (or Wake) went out at once, inside
   * larder_batch_release, and failed leaves nothing held (frames with a
   * window under 4, or the release that filled half a window): send_failed
   * remembers it, so that flush does not return 0 after the daemon died.
   * Tested by client_flush_dead_daemon. */
  if (hrc == 0 && c->send_failed) hrc = LARDER_ECLOSED;
  pthread_mutex_unlock(&c->send_lock);
  if (rc == 0) rc = hrc;
  if (rc == LARDER_ECLOSED) {
    c->broken = LARDER_ECLOSED;
    set_err(c, rc, "cannot send to the daemon: the connection is gone");
  }
  return rc;
}

static int send_close_stream(larder_client_t *c, uint32_t id, int device_memory_held) {
  Larder__CloseStream cs = LARDER__CLOSE_STREAM__INIT;
  cs.stream_id = id;
  cs.device_memory_held = device_memory_held;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_CLOSE_STREAM;
  f.close_stream = &cs;
  return send_frame(c, &f);
}

void larder_stream_close(larder_stream_t *s) {
  if (s == NULL || s->closed) return;
  larder_client_t *c = s->client;
  s->closed = 1;
  larder_stream_t **pp = &c->streams;
  while (*pp && *pp != s) pp = &(*pp)->next;
  if (*pp) *pp = s->next;
  /* A stream read to its end is closed on the daemon's side too, which
   * keeps it (and its arena) until told: otherwise a client opening a
   * stream per epoch on one connection would run into
   * max_streams_per_client.  Only a stream the daemon ended with an error
   * is gone there already (one that failed here is not).  A forked child
   * (the header forbids using a client there, but it may close one) must
   * not close the parent's stream on the shared socket.  Tested by
   * daemon_many_streams and daemon_reload_keeps_flags. */
  /* CUDA (lcuda.h): the daemon must not free device memory this process
   * still maps.  With no batch held, the mapping closes before CloseStream
   * goes, which then goes for a stream the daemon ended too (it kept the
   * region: daemon/serve/cuda.h).  With batches held, CloseStream says so, and
   * the last release closes the mapping and sends a second one
   * (stream_free), through cuda_client: the client outlives its batches. */
  int cuda_unmapped = 0, cuda_held = 0;
  if (s->cuda && !client_forked(c)) {
    /* Releases waiting for the GPU's work go first: the close waits for
     * that work, as the region cannot go before it ends (lcuda.h). */
    fences_drain(s, 1);
    pthread_mutex_lock(&s->lock);
    cuda_held = s->refs > 1;
    /* Broken or not: a release on another thread may be sending through c
     * (stream_free sends nothing on a broken one). */
    if (cuda_held) {
      s->cuda_client = c;
      atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&s->lock);
    if (!cuda_held) {
      lcuda_map_close(s->cuda);
      s->cuda = NULL;
      cuda_unmapped = 1;
    }
  }
  if (!c->broken && (!s->error || s->failed_here || cuda_unmapped) && !client_forked(c))
    send_close_stream(c, s->id, cuda_held);
  while (s->q_head) {
    queued_t *q = s->q_head;
    s->q_head = q->next;
    wire_free(q->frame);
    free(q->batch);
    free(q);
  }
  s->q_tail = NULL;
  if (s->epfd >= 0) close(s->epfd);
  if (s->efd >= 0) close(s->efd);
  s->epfd = s->efd = -1;
  /* Releases on other threads read s->client under s->lock, in a section
   * they take anyway, so it is written under the lock here too.  Tested by
   * daemon_close_release_threads (under TSan). */
  pthread_mutex_lock(&s->lock);
  s->client = NULL;
  pthread_mutex_unlock(&s->lock);
  /* A release on another thread may have fenced after the drain above,
   * seeing the stream open: its fence must not wait for a reader that is
   * gone. */
  if (s->cuda) fences_drain(s, 1);
  pthread_mutex_lock(&s->lock);
  int left = --s->refs;
  pthread_mutex_unlock(&s->lock);
  if (left == 0) stream_free(s);
}

/* Sends a Wake frame for s: the daemon reads its ring.  Returns 0,
 * LARDER_ECLOSED or LARDER_ENOMEM.  Any thread. */
static int send_wake(larder_client_t *c, larder_stream_t *s) {
  Larder__Wake wk = LARDER__WAKE__INIT;
  wk.stream_id = s->id;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_WAKE;
  f.wake = &wk;
  return send_frame(c, &f);
}

/* Tells the daemon of the releases in s's ring it has not been told of, if
 * any.  Returns 0 or the error of the Wake's send.  Any thread. */
static int ring_tell(larder_client_t *c, larder_stream_t *s) {
  pthread_mutex_lock(&s->lock);
  int tell = s->ring_released != s->ring_told;
  s->ring_told = s->ring_released;
  pthread_mutex_unlock(&s->lock);
  return tell ? send_wake(c, s) : 0;
}

/* See internal.h.  Tested by fuzz-ring. */
int llib_ring_take(larder_stream_t *s, wire_batch_t *view) {
  ring_header_t *h = s->ring;
  const ring_layout_t *l = &s->ring_layout;
  uint64_t published = atomic_load_explicit(&h->published, memory_order_acquire);
  if (published == s->ring_consumed) return 0;
  if (published - s->ring_consumed > l->slots) return LARDER_EPROTO;
  const ring_desc_t *d = ring_layout_desc(l, s->ring_consumed++);
  *view =
      (wire_batch_t){s->id,           d->seq,          d->epoch,           d->index, d->num_rows,
                     d->arena_offset, d->arena_length, s->ring_num_layout, d->layout};
  if (atomic_load_explicit(&h->wake_client_at, memory_order_relaxed))
    atomic_store_explicit(&h->wake_client_at, 0, memory_order_relaxed);
  /* The daemon wrote the next descriptor from another core, so reading it
   * misses the cache line by line (a kilobyte for a dozen columns).  When
   * it is published already, start those loads now: they complete while
   * the trainer computes, and the next call finds the lines in its cache. */
  if (published != s->ring_consumed) {
    const char *next = (const char *)(const void *)ring_layout_desc(l, s->ring_consumed);
    for (uint64_t at = 0; at < l->slot_bytes; at += 64) __builtin_prefetch(next + at);
  }
  return 1;
}

/* Says in s's ring that the reading thread is about to sleep on the socket,
 * so the daemon sends a Wake with its next descriptor, and tells the daemon
 * of releases it has not read.  Returns 1 when a descriptor arrived
 * meanwhile (do not sleep).  The reading thread. */
static int ring_prepare_sleep(larder_client_t *c, larder_stream_t *s) {
  ring_header_t *h = s->ring;
  atomic_store_explicit(&h->consumed, s->ring_consumed, memory_order_relaxed);
  /* The daemon answers each value of wake_client_at once (it may answer
   * early, with fewer descriptors out): ring_sleep_target never asks again
   * a value the daemon may have answered. */
  uint64_t at = ring_sleep_target(&s->ring_sleeps, s->ring_consumed, s->ring_wake_batches);
  /* Release: `consumed` above is visible to a daemon that sees this value
   * (it loads it with acquire). */
  atomic_store_explicit(&h->wake_client_at, at, memory_order_release);
  /* Pairs with the daemon's fence between publishing and looking at
   * wake_client_at (ring.h): one of the two sees the other's write. */
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&h->published, memory_order_relaxed) != s->ring_consumed) {
    atomic_store_explicit(&h->wake_client_at, 0, memory_order_relaxed);
    return 1;
  }
  /* The daemon reads the ring whenever it works on the stream; when it
   * cannot (it waits for room), it says so with wake_at, and a Wake makes
   * it read now.  A trainer faster than the daemon then wakes its loop once
   * per batch less. */
  pthread_mutex_lock(&s->lock);
  s->ring_reader_asleep = 1;
  int tell =
      atomic_load_explicit(&h->wake_at, memory_order_relaxed) && s->ring_released != s->ring_told;
  if (tell) s->ring_told = s->ring_released;
  pthread_mutex_unlock(&s->lock);
  if (tell) (void)send_wake(c, s);
  return 0;
}

/* Ends s with an error found here (a malformed batch, out of memory):
 * every later call returns it, and close tells the daemon.  Such a batch
 * has consumed its descriptor but is never released, so a stream going on
 * after it would run one batch short of its window, and after `window` of
 * them stall for good.  Tested by client_fake_bad_buffers.  Returns code.
 * The reading thread. */
static int stream_fail(larder_client_t *c, larder_stream_t *s, int code, const char *why) {
  s->error = code;
  s->failed_here = 1;
  return set_err(c, code, "stream %u: %s", s->id, why);
}

/* One call of larder_stream_next: when it began, the trainer's own time
 * before it (compute) or the time its caller waited on the descriptor
 * since the last call (waited), and the released batch it may reuse. */
typedef struct next_call {
  uint64_t start, compute, waited;
  larder_batch_t *spare;
} next_call_t;

/* Begins a call on s: it no longer has a caller waiting on its descriptor,
 * its eventfd is cleared (whatever another call read for s is in its
 * queue or ring now, which this call looks at before it returns
 * LARDER_ETIMEDOUT), the time since the last call is counted, and s's
 * spare batch moves to the call.  The reading thread. */
static void next_begin(larder_client_t *c, larder_stream_t *s, next_call_t *n) {
  n->start = now_ns();
  /* CUDA: releases whose GPU work has ended go to the daemon now. */
  if (s->cuda) fences_drain(s, 0);
  /* One locked section here and one at the end: each is an atomic
   * read-modify-write on the trainer's path. */
  if (s->caller_waits) {
    pthread_mutex_lock(&c->send_lock);
    s->caller_waits = 0;
    pthread_mutex_unlock(&c->send_lock);
  }
  if (s->signalled) {
    uint64_t count;
    if (read(s->efd, &count, sizeof(count)) < 0) {
      /* Nothing to do: the count is cleared or was never there. */
    }
    s->signalled = 0;
  }
  pthread_mutex_lock(&s->lock);
  s->ring_reader_asleep = 0;
  /* After a LARDER_ETIMEDOUT the caller was waiting for a batch, so the
   * time since that call is waiting, not the caller's own work: an event
   * loop waiting on larder_stream_fd for a daemon that cannot keep up must
   * report its stall.  Tested by client_evloop_stall. */
  n->compute = n->waited = 0;
  if (s->last_return_ns) {
    if (s->last_timed_out) {
      n->waited = n->start - s->last_return_ns;
    } else {
      n->compute = n->start - s->last_return_ns;
      s->compute_ns += n->compute;
      s->report_compute += n->compute;
    }
  }
  /* A step's batch reuses the last released one: two allocations fewer
   * on the trainer's path. */
  n->spare = s->spare;
  s->spare = NULL;
  pthread_mutex_unlock(&s->lock);
}

/* Makes the batch that descriptor b describes (llib_batch_make, which
 * checks it against the arena) and moves s's position past it.  Returns 0
 * with *out set, or the error with which s failed here (a malformed batch,
 * out of memory).  The reading thread. */
static int next_deliver(larder_client_t *c, larder_stream_t *s, const wire_batch_t *b,
                        larder_batch_t **spare, larder_batch_t **out) {
  larder_batch_t *batch;
  int rc = llib_batch_make(s, b, spare, &batch);
  if (rc)
    return stream_fail(
        c, s, rc,
        rc == LARDER_ENOMEM ? "out of memory for a batch" : "the daemon sent a malformed batch");
  s->pos_epoch = batch->epoch;
  s->pos_batch = batch->index + 1;
  if (s->batches_per_epoch && s->pos_batch >= s->batches_per_epoch) {
    s->pos_epoch++;
    s->pos_batch = 0;
  }
  *out = batch;
  return 0;
}

/* Takes what s has for this call without waiting: the next descriptor of
 * its ring, else the next frame of its queue, skipping queued frames that
 * are neither a batch, an error nor the end.  Returns 1 when the call ends
 * with *rc: 0 with *out set to a checked batch, LARDER_EEOF, the daemon's
 * error, or an error found here (a stream that failed here takes nothing
 * more, whatever follows); 0 when there was nothing to take.  The reading
 * thread. */
static int next_take(larder_client_t *c, larder_stream_t *s, larder_batch_t **spare,
                     larder_batch_t **out, int *rc) {
  for (;;) {
    if (s->failed_here) {
      *rc = s->error;
      return 1;
    }
    wire_batch_t view;
    int from_ring = s->ring ? llib_ring_take(s, &view) : 0;
    if (from_ring < 0) {
      *rc = stream_fail(c, s, LARDER_EPROTO, "the daemon overran the descriptor ring");
      return 1;
    }
    if (from_ring) {
      *rc = next_deliver(c, s, &view, spare, out);
      return 1;
    }
    queued_t *q = s->q_head;
    if (q == NULL) return 0;
    Larder__Frame *f = q->frame;
    wire_batch_t *fast = q->batch;
    s->q_head = q->next;
    if (s->q_head == NULL) s->q_tail = NULL;
    free(q);
    if (fast) {
      *rc = next_deliver(c, s, fast, spare, out);
      free(fast);
      return 1;
    }
    if (f->msg_case == LARDER__FRAME__MSG_END_OF_STREAM) {
      s->ended = 1;
      wire_free(f);
      *rc = LARDER_EEOF;
      return 1;
    }
    if (f->msg_case == LARDER__FRAME__MSG_ERROR) {
      s->error = f->error->code < 0 ? f->error->code : LARDER_EPROTO;
      set_err(c, s->error, "%s", f->error->message ? f->error->message : larder_strerror(s->error));
      wire_free(f);
      *rc = s->error;
      return 1;
    }
    if (f->msg_case != LARDER__FRAME__MSG_BATCH) {
      wire_free(f);
      continue;
    }
    /* A batch protobuf-c decoded (a form wire_decode_batch leaves to
     * it). */
    const Larder__Batch *pb = f->batch;
    view = (wire_batch_t){pb->stream_id,    pb->seq,          pb->epoch,    pb->index, pb->num_rows,
                          pb->arena_offset, pb->arena_length, pb->n_layout, pb->layout};
    *rc = next_deliver(c, s, &view, spare, out);
    wire_free(f);
    return 1;
  }
}

/* Waits for something for s until deadline, after next_take found
 * nothing.  Returns 1 when the call ends with *rc: the stream's error,
 * LARDER_EEOF, LARDER_ETIMEDOUT, or the connection's error; 0 when the
 * caller should look again.  Past the deadline it still reads what the
 * socket holds once (*polled), and before it reports LARDER_ETIMEDOUT it
 * asks the daemon for a Wake with the next descriptor.  The reading
 * thread. */
static int next_wait(larder_client_t *c, larder_stream_t *s, uint64_t deadline, int *polled,
                     int *rc) {
  if (s->error) {
    *rc = s->error;
    return 1;
  }
  if (s->ended) {
    *rc = LARDER_EEOF;
    return 1;
  }
  /* CUDA: with no batch to take, the daemon may be waiting for releases
   * that wait for the GPU (lcuda.h): wait for the GPU rather than for a
   * daemon that cannot go on, then look again. */
  if (s->cuda && stream_fences(s)) {
    fences_drain(s, 1);
    return 0;
  }
  uint64_t now = now_ns();
  if (now >= deadline) {
    /* Read what is there once, without waiting, before giving up, even
     * with a zero timeout: the documented event loop (wait on
     * larder_stream_fd, then call with a zero timeout) must get a batch
     * rather than spin on a readable descriptor.  Tested by
     * daemon_client_patterns. */
    if (!*polled) {
      *polled = 1;
      int r = pump(c, s, 0);
      if (r && r != LARDER_ETIMEDOUT) {
        *rc = s->error ? s->error : r;
        return 1;
      }
      return 0;
    }
    /* The caller will wait on larder_stream_fd: the daemon must send a
     * Wake with the next descriptor. */
    if (s->ring && ring_prepare_sleep(c, s)) return 0;
    *rc = LARDER_ETIMEDOUT;
    return 1;
  }
  int wait_ms = deadline == UINT64_MAX ? 1000 : (int)((deadline - now + 999999) / 1000000ull);
  if (s->ring && ring_prepare_sleep(c, s)) return 0;
  int r = pump(c, s, wait_ms);
  if (s->ring) {
    atomic_store_explicit(&s->ring->wake_client_at, 0, memory_order_relaxed);
    pthread_mutex_lock(&s->lock);
    s->ring_reader_asleep = 0;
    pthread_mutex_unlock(&s->lock);
    /* A wait that timed out tells the daemon of the releases anyway: a
     * safety net, should it ever need them without saying so in
     * wake_at. */
    if (r == LARDER_ETIMEDOUT) (void)ring_tell(c, s);
  }
  if (r && r != LARDER_ETIMEDOUT) {
    *rc = s->error ? s->error : r;
    return 1;
  }
  return 0;
}

/* Ends a call that returns rc (with a batch when got is set): counts its
 * wait, chooses how many descriptors a sleep waits for, takes the batch's
 * reference on s, and gives the spare back when no batch used it.  After
 * LARDER_ETIMEDOUT the caller may wait on the descriptor, so the releases
 * held until then, or made by other threads meanwhile, go to the daemon
 * now: an event loop whose releases were held for a batch would stand in
 * poll, the daemon's window full.  The reading thread. */
static void next_end(larder_client_t *c, larder_stream_t *s, next_call_t *n, int rc, int got) {
  if (rc == LARDER_ETIMEDOUT) {
    pthread_mutex_lock(&c->send_lock);
    s->caller_waits = 1;
    flush_held_locked(c);
    pthread_mutex_unlock(&c->send_lock);
  }
  uint64_t end = now_ns();
  larder_batch_t *spare = n->spare;
  pthread_mutex_lock(&s->lock);
  s->wait_ns += end - n->start + n->waited;
  s->report_wait += end - n->start + n->waited;
  ring_pace_add(&s->pace, end - n->start + n->waited, n->compute);
  s->ring_wake_batches = ring_pace_sleep_batches(&s->pace, s->window);
  if (got) s->refs++;
  /* Unused (no batch came): back for the next call. */
  if (spare && s->spare == NULL) {
    s->spare = spare;
    spare = NULL;
  }
  pthread_mutex_unlock(&s->lock);
  if (spare) {
    free(spare->nodes);
    free(spare);
  }
  s->last_return_ns = end;
  s->last_timed_out = rc == LARDER_ETIMEDOUT;
}

/* Takes (next_take) and waits (next_wait) in turn until the call ends. */
int larder_stream_next(larder_stream_t *s, int timeout_ms, larder_batch_t **out) {
  *out = NULL;
  larder_client_t *c = s->client;
  if (c == NULL) return LARDER_ECLOSED;
  if (client_forked(c)) return forked_err(c);
  next_call_t n;
  next_begin(c, s, &n);
  uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : n.start + (uint64_t)timeout_ms * 1000000ull;
  int rc = 0, polled = 0;
  for (;;) {
    if (next_take(c, s, &n.spare, out, &rc)) break;
    if (next_wait(c, s, deadline, &polled, &rc)) break;
  }
  next_end(c, s, &n, rc, *out != NULL);
  return rc;
}

/* What a release of batch seq of s tells the daemon: its entry in the
 * ring (and *wake when the daemon must be woken for it), or the Release
 * frame to send (*frame, with rel filled in); nothing when c is NULL (the
 * stream closed, the connection broken, or a forked child).  s->lock
 * held. */
static void release_locked(larder_stream_t *s, larder_client_t *c, uint64_t seq, int *wake,
                           int *frame, Larder__Release *rel) {
  *wake = *frame = 0;
  if (c && s->ring) {
    ring_release_t *e = ring_layout_release(&s->ring_layout, s->ring_released);
    e->seq = seq;
    e->wait_ns = s->report_wait;
    e->compute_ns = s->report_compute;
    s->report_wait = s->report_compute = 0;
    atomic_store_explicit(&s->ring->released, ++s->ring_released, memory_order_release);
    /* Pairs with the daemon's fence between setting wake_at and looking at
     * `released` (ring.h). */
    atomic_thread_fence(memory_order_seq_cst);
    uint64_t wake_at = atomic_load_explicit(&s->ring->wake_at, memory_order_relaxed);
    /* The daemon asked to hear once `released` reaches wake_at; and when
     * the reader sleeps, it waits for any release (a trainer whose
     * consumer thread releases each batch as the next one arrives: the
     * reader told the daemon before it slept, this release comes after,
     * short of wake_at, and the stream would otherwise stand until the
     * reader's one-second wait ran out). */
    int asked = wake_at && s->ring_released >= wake_at && wake_at != s->ring_woken_at;
    *wake = asked || (wake_at && s->ring_reader_asleep && s->ring_released != s->ring_told);
    if (asked) s->ring_woken_at = wake_at;
    if (*wake) s->ring_told = s->ring_released;
  } else if (c) {
    rel->stream_id = s->id;
    rel->seq = seq;
    rel->wait_ns = s->report_wait;
    rel->compute_ns = s->report_compute;
    s->report_wait = s->report_compute = 0;
    *frame = 1;
  }
}

/* The client a release of s goes through: NULL when the stream closed,
 * the connection broke, or in a forked child (whose ring and socket are
 * the parent's: the release frees this process's memory only, see
 * client_forked).  s->lock held. */
static larder_client_t *release_client(const larder_stream_t *s) {
  larder_client_t *c = s->client;
  if (c && atomic_load_explicit(&c->broken, memory_order_relaxed)) c = NULL;
  if (c && client_forked(c)) c = NULL;
  return c;
}

/* Sends what release_locked decided, then drops the batch's reference on
 * s (left: the references it left when nothing was to be sent, which
 * dropped it already).  Returns whether s is still there. */
static int release_send(larder_stream_t *s, larder_client_t *c, int wake, int frame,
                        Larder__Release *rel, int left) {
  /* The batch's reference keeps s, and so c (the caller closes the client
   * only after its last release), alive until the frame is sent: it is
   * dropped after that.  A stream closed meanwhile gets the frame after
   * its CloseStream, which the daemon ignores as it ignores releases of a
   * stream that ended. */
  if (wake) (void)send_wake(c, s);
  if (frame) {
    Larder__Frame f = LARDER__FRAME__INIT;
    f.msg_case = LARDER__FRAME__MSG_RELEASE;
    f.release = rel;
    hold_release(c, s, &f);
  }
  if (wake || frame) {
    pthread_mutex_lock(&s->lock);
    left = --s->refs;
    pthread_mutex_unlock(&s->lock);
  }
  if (left == 0) stream_free(s);
  return left != 0;
}

/* Releases the batches of s whose fences have passed (lcuda.h), oldest
 * first; with wait, all of them, waiting for the GPU (without s->lock: the
 * other threads' releases go on meanwhile).  The caller holds a reference
 * to s, which outlives the call.  Any thread. */
static void fences_drain(larder_stream_t *s, int wait) {
  for (;;) {
    int wake, frame;
    Larder__Release rel = LARDER__RELEASE__INIT;
    uint64_t seq;
    pthread_mutex_lock(&s->lock);
    lcuda_map_t *m = s->cuda;
    if (m == NULL || !lcuda_fence_pop(m, &seq)) {
      void *ev = wait ? lcuda_fence_oldest(m) : NULL;
      pthread_mutex_unlock(&s->lock);
      if (ev == NULL) return;
      lcuda_fence_wait(m, ev);
      continue;
    }
    larder_client_t *c = release_client(s);
    release_locked(s, c, seq, &wake, &frame, &rel);
    int left = wake || frame ? 1 : --s->refs;
    pthread_mutex_unlock(&s->lock);
    /* Never frees s (the caller's reference), which the analyzer cannot
     * tell. */
    if (!release_send(s, c, wake, frame, &rel, left)) return;
  }
}

/* Whether the reading thread of s waits for something (a batch, in
 * larder_stream_next, or, after LARDER_ETIMEDOUT, on larder_stream_fd):
 * then a release it may be waiting for cannot wait for a later call.
 * Any thread. */
static int reader_waits(larder_stream_t *s, larder_client_t *c) {
  pthread_mutex_lock(&s->lock);
  int waits = s->ring_reader_asleep;
  pthread_mutex_unlock(&s->lock);
  if (c && !waits) {
    pthread_mutex_lock(&c->send_lock);
    waits = s->caller_waits || c->reader_waiting;
    pthread_mutex_unlock(&c->send_lock);
  }
  return waits;
}

/* See internal.h. */
void llib_batch_release(larder_batch_t *b, int recycle) {
  larder_stream_t *s = b->stream;
  /* One locked section: the stream's client (larder_stream_close clears
   * it under the lock), the release's entry and counters, the spare batch
   * and the reference.  The frame, when one goes, is sent after it. */
  int wake = 0, frame = 0, fenced = 0;
  Larder__Release rel = LARDER__RELEASE__INIT;
  pthread_mutex_lock(&s->lock);
  larder_client_t *c = release_client(s);
  /* CUDA: the release waits for the GPU work queued so far, which may
   * still read the batch (lcuda.h); the fence keeps the batch's reference
   * on s until then.  After the stream's close the region goes with its
   * last batch: the fence is waited for here. */
  if (s->cuda) fenced = lcuda_fence_push(s->cuda, s->cuda_stream, b->seq) == 0;
  if (!fenced) release_locked(s, c, b->seq, &wake, &frame, &rel);
  if (recycle && s->spare == NULL) {
    s->spare = b;
    b = NULL;
  }
  /* Fenced: the fence holds the batch's reference, and this call pins s
   * for the drain (which may hand the fence's reference to the daemon, or
   * to another thread's drain, before it returns). */
  if (fenced) s->refs++;
  int left = fenced || wake || frame ? 1 : --s->refs;
  int closed = s->client == NULL;
  pthread_mutex_unlock(&s->lock);
  if (b) {
    free(b->nodes);
    free(b);
  }
  if (!fenced) {
    (void)release_send(s, c, wake, frame, &rel, left);
    return;
  }
  /* The GPU's work ends before the release goes, which the reader's next
   * call sends (next_begin drains what passed: no query here, of an event
   * that has just been recorded), unless the reader waits now (or the
   * stream closed): then it goes from here, once the GPU is done. */
  if (closed || reader_waits(s, c)) fences_drain(s, 1);
  pthread_mutex_lock(&s->lock);
  /* The pin kept s through the drain (the analyzer cannot tell). */
  /* NOLINTNEXTLINE(clang-analyzer-unix.Malloc) */
  left = --s->refs;
  pthread_mutex_unlock(&s->lock);
  if (left == 0) stream_free(s);
}
