/*
 * conn.c: one client connection: the handshake, frame parsing, dispatch,
 * and the write queue (which can carry a descriptor with a frame).
 *
 * Anything a client sends that breaks the protocol (a garbage handshake, a
 * frame over max_frame, bytes that do not decode, a message a client may not
 * send) gets one Error frame and closes that connection alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve/cuda.h"
#include "log.h"
#include "serve/admin.h"
#include "serve/conn.h"
#include "serve/stream.h"
#include "serve/server.h"
#include "util.h"

typedef struct write_req {
  uv_write_t req;
  uint8_t *buf;
  conn_t *conn;
} write_req_t;

/* A frame that carries descriptors.  It owns duplicates of them: the
 * stream whose arena and ring they are may end before the frame leaves. */
struct pending_fd {
  struct pending_fd *next;
  uint8_t *buf;
  size_t len, sent, cap;
  int fds[WIRE_MAX_FDS];
  int num_fds;
  uint32_t stream_id; /* of an OpenStreamReply; 0 for other frames */
};

/* The longest wait between two tries to pass a descriptor to a client
 * whose socket is full.  The first wait is 1 ms; each doubles. */
#define FD_RETRY_MAX_MS 100

static void pending_free(struct pending_fd *p) {
  for (int i = 0; i < p->num_fds; i++) close(p->fds[i]);
  free(p->buf);
  free(p);
}

/* A descriptor can only be passed with sendmsg when libuv has nothing
 * queued on the connection. */
static int writes_in_flight(conn_t *c) {
  return (int)uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) > 0;
}

/* Unlinks p, the first pending frame, keeping the counts. */
static struct pending_fd *pending_pop(conn_t *c) {
  struct pending_fd *p = c->pending;
  c->pending = p->next;
  if (c->pending == NULL) c->pending_tail = NULL;
  c->pending_bytes -= p->len - p->sent;
  if (p->num_fds > 0) c->pending_fd_frames--;
  return p;
}

static void on_close(uv_handle_t *h) {
  conn_t *c = h->data;
  server_t *srv = c->srv;
  if (c->prev) c->prev->next = c->next;
  else if (srv->conns == c) srv->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  while (c->pending) pending_free(pending_pop(c));
  free(c->rbuf);
  strbuf_free(&c->cork);
  free(c->groups); /* larder ACL: SO_PEERGROUPS */
  if (c->pidfd >= 0) close(c->pidfd);
  STATS_SUB(&srv->stats, clients, 1);
  free(c);
}

static void on_fd_timer(uv_timer_t *t);

/* Closes c now, or on the loop's next turn when a send is on the stack:
 * its caller may be a stream (stream_fail sends an Error, then closes the
 * stream) that closing the connection would free under it, and that goes
 * on to read the stream after a failed send.  Tested by
 * daemon_robust_unread_stream_replies. */
static void conn_fail(conn_t *c) {
  if (c->closing) return;
  if (c->sending == 0) {
    conn_close(c);
    return;
  }
  c->broken = 1;
  uv_read_stop((uv_stream_t *)&c->pipe);
  c->fd_timer_active = 1;
  uv_timer_start(&c->fd_timer, on_fd_timer, 0, 0);
}

static void on_timer_close(uv_handle_t *h) {
  conn_t *c = h->data;
  uv_close((uv_handle_t *)&c->pipe, on_close);
}

void conn_close(conn_t *c) {
  if (c->closing) return;
  c->closing = 1;
  while (c->streams) stream_close(c->streams);
  cuda_orphan(c->id);   /* CUDA regions kept while the trainer lives (cuda.h) */
  admin_conn_closed(c); /* its admin jobs (prefetch, cat) stop */
  uv_read_stop((uv_stream_t *)&c->pipe);
  uv_timer_stop(&c->fd_timer);
  uv_close((uv_handle_t *)&c->fd_timer, on_timer_close);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  (void)status;
  conn_t *c = req->data;
  free(req);
  conn_close(c);
}

/* Closes after the queued writes (an Error frame, say) have gone out: the
 * connection drains.  While it drains, frames the client sent after the
 * fatal one (in the same read) are not dispatched, so they open no streams
 * and no Hello is answered on a connection already rejected; and nothing
 * more is queued, since a frame queued after uv_shutdown fails with EPIPE,
 * which would close the connection at once and drop the Error frame still
 * in the write queue.  Tested by daemon_robust_forbidden_message. */
static int flush_cork(conn_t *c);

void conn_shutdown(conn_t *c) {
  if (c->closing || c->draining) return;
  /* What was sent before (the Error frame, say) goes out first. */
  flush_cork(c);
  if (c->closing) return;
  c->draining = 1;
  while (c->streams) stream_close(c->streams);
  admin_conn_closed(c);
  uv_read_stop((uv_stream_t *)&c->pipe);
  uv_shutdown_t *req = malloc(sizeof(*req));
  if (req == NULL || uv_shutdown(req, (uv_stream_t *)&c->pipe, on_shutdown) != 0) {
    free(req);
    conn_close(c);
    return;
  }
  req->data = c;
}

static void flush_pending(conn_t *c);
static void maybe_resume_reading(conn_t *c);

static void on_write(uv_write_t *req, int status) {
  write_req_t *w = (write_req_t *)req;
  conn_t *c = w->conn;
  free(w->buf);
  free(w);
  if (status < 0 && !c->closing) {
    conn_close(c);
    return;
  }
  if (c->pending && !c->closing) flush_pending(c);
  maybe_resume_reading(c);
}

static int queue_write(conn_t *c, uint8_t *buf, size_t len) {
  write_req_t *w = malloc(sizeof(*w));
  if (w == NULL) {
    free(buf);
    return LARDER_ENOMEM;
  }
  w->buf = buf;
  w->conn = c;
  uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
  if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, on_write) != 0) {
    free(buf);
    free(w);
    return LARDER_ECLOSED;
  }
  return 0;
}

static void on_fd_timer(uv_timer_t *t) {
  conn_t *c = t->data;
  c->fd_timer_active = 0;
  if (c->broken) {
    conn_close(c);
    return;
  }
  flush_pending(c);
}

/* Sends the pending frames in order; a frame with a descriptor goes with
 * sendmsg once libuv's queue is empty, so no bytes can overtake it. */
static void flush_pending(conn_t *c) {
  while (c->pending && !c->closing && !c->broken) {
    if (writes_in_flight(c)) return; /* on_write calls again */
    struct pending_fd *p = c->pending;
    if (p->num_fds == 0 || p->sent > 0) {
      pending_pop(c);
      uint8_t *rest = p->sent ? malloc(p->len - p->sent) : p->buf;
      if (rest == NULL) {
        pending_free(p);
        conn_fail(c);
        return;
      }
      if (p->sent) {
        memcpy(rest, p->buf + p->sent, p->len - p->sent);
        free(p->buf);
      }
      size_t len = p->len - p->sent;
      free(p);
      if (queue_write(c, rest, len) != 0) {
        conn_fail(c);
        return;
      }
      continue;
    }
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0) {
      conn_fail(c);
      return;
    }
    int64_t n = wire_sendmsg(fd, p->buf, p->len, p->fds, p->num_fds);
    if (n == -EAGAIN || n == -EWOULDBLOCK) {
      /* The client's socket is full.  Waits grow to FD_RETRY_MAX_MS, so a
       * client that never reads costs a wakeup now and then, not a
       * thousand a second. */
      if (!c->fd_timer_active) {
        uint32_t wait = c->fd_retry_ms ? c->fd_retry_ms : 1;
        c->fd_retry_ms = wait * 2 < FD_RETRY_MAX_MS ? wait * 2 : FD_RETRY_MAX_MS;
        c->fd_timer_active = 1;
        uv_timer_start(&c->fd_timer, on_fd_timer, wait, 0);
      }
      return;
    }
    if (n < 0) {
      conn_fail(c);
      return;
    }
    c->fd_retry_ms = 0;
    /* The descriptors went with the first byte: the peer holds its own
     * copies now.  A partial send leaves the rest to the branch above. */
    for (int i = 0; i < p->num_fds; i++) close(p->fds[i]);
    p->num_fds = 0;
    c->pending_fd_frames--;
    p->sent = (size_t)n;
    c->pending_bytes -= (uint64_t)n;
    if (p->sent == p->len) pending_free(pending_pop(c));
  }
}

/* Writes the frames collected in the cork, in one write. */
static int flush_cork(conn_t *c) {
  if (c->cork.len == 0) return 0;
  size_t len;
  uint8_t *buf = (uint8_t *)strbuf_take(&c->cork, &len); /* queue_write's now */
  if (c->closing || c->draining || c->broken) {
    free(buf);
    return LARDER_ECLOSED;
  }
  int rc = queue_write(c, buf, len);
  if (rc) conn_fail(c);
  return rc;
}

void conn_flush_all(server_t *srv) {
  for (conn_t *c = srv->conns, *next; c; c = next) {
    next = c->next; /* a failed write closes c, which stays listed until
                       its close callback */
    if (c->cork.len) flush_cork(c);
  }
}

int conn_send(conn_t *c, const Larder__Frame *frame, int fd) {
  return conn_send_fds(c, frame, &fd, fd >= 0 ? 1 : 0);
}

static int send_fds(conn_t *c, const Larder__Frame *frame, const int *fds, int num_fds) {
  if (c->closing || c->draining || c->broken) return LARDER_ECLOSED;
  if (num_fds > WIRE_MAX_FDS) return LARDER_EINVAL;
  /* A client that leaves replies carrying shared memory unread (and keeps
   * asking for more) would hold a memfd per stream, and its memory, in the
   * queue: a bounded number, then the opens fail. */
  if (num_fds > 0 && c->pending_fd_frames >= CONN_MAX_PENDING_FD_FRAMES) return LARDER_EBUSY;
  size_t len;
  uint8_t *buf = wire_encode(frame, &len);
  if (buf == NULL) {
    conn_fail(c);
    return LARDER_ENOMEM;
  }
  /* Frames wait in the cork until the loop is about to sleep (or the end
   * of the read that produced them): the batches that several workers
   * finish in one iteration, and the answers to one read's releases, then
   * leave in one write, which the trainer reads in one call. */
  if (num_fds == 0 && c->pending == NULL) {
    int rc = strbuf_append(&c->cork, buf, len);
    free(buf);
    if (rc) conn_fail(c);
    return rc;
  }
  /* Nothing may overtake what the cork holds. */
  if (flush_cork(c)) {
    free(buf);
    return LARDER_ECLOSED;
  }
  if (num_fds == 0 && c->pending == NULL) {
    int rc = queue_write(c, buf, len);
    if (rc) conn_fail(c);
    return rc;
  }
  struct pending_fd *t = c->pending_tail;
  if (num_fds == 0 && t != NULL && t->num_fds == 0 && t->sent == 0) {
    /* Frames without descriptors behind one that waits join one buffer:
     * a client that reads nothing then costs its backlog in bytes, not a
     * list node per frame. */
    if (t->len + len > t->cap) {
      size_t cap = t->cap ? t->cap : t->len;
      while (cap < t->len + len) cap *= 2;
      uint8_t *nb = realloc(t->buf, cap);
      if (nb == NULL) {
        free(buf);
        conn_fail(c);
        return LARDER_ENOMEM;
      }
      t->buf = nb;
      t->cap = cap;
    }
    memcpy(t->buf + t->len, buf, len);
    t->len += len;
    c->pending_bytes += len;
    free(buf);
    return 0;
  }
  struct pending_fd *p = calloc(1, sizeof(*p));
  if (p == NULL) {
    free(buf);
    conn_fail(c);
    return LARDER_ENOMEM;
  }
  p->buf = buf;
  p->len = len;
  if (frame->msg_case == LARDER__FRAME__MSG_OPEN_STREAM_REPLY && frame->open_stream_reply)
    p->stream_id = frame->open_stream_reply->stream_id;
  for (int i = 0; i < num_fds; i++) {
    p->fds[i] = util_dup_cloexec(fds[i]);
    if (p->fds[i] < 0) {
      /* Nothing of this frame is queued: the caller can answer with an
       * error instead, and the connection stays open. */
      pending_free(p);
      return LARDER_ELIMIT;
    }
    p->num_fds = i + 1;
  }
  /* Appended at the tail, counted in the backlog: every frame sent after
   * one that waits for sendmsg waits here too.  Walked on every append and
   * not counted, the list would let a client that stopped reading with a
   * stream's reply queued make the daemon queue its replies without bound,
   * in quadratic time (seconds of a stalled loop for every other client).
   * Tested by daemon_robust_unread_stream_replies. */
  if (c->pending_tail) c->pending_tail->next = p;
  else c->pending = p;
  c->pending_tail = p;
  c->pending_bytes += len;
  if (p->num_fds > 0) c->pending_fd_frames++;
  flush_pending(c);
  return c->closing || c->broken ? LARDER_ECLOSED : 0;
}

int conn_send_fds(conn_t *c, const Larder__Frame *frame, const int *fds, int num_fds) {
  c->sending++;
  int rc = send_fds(c, frame, fds, num_fds);
  c->sending--;
  return rc;
}

int conn_reply_unsent(const conn_t *c, uint32_t stream_id) {
  for (const struct pending_fd *p = c->pending; p; p = p->next)
    if (p->stream_id == stream_id && p->sent == 0 && p->num_fds > 0) return 1;
  return 0;
}

void conn_cancel_unsent(conn_t *c, uint32_t stream_id) {
  struct pending_fd **pp = &c->pending, *prev = NULL;
  while (*pp) {
    struct pending_fd *p = *pp;
    if (p->stream_id != stream_id || p->sent > 0 || p->num_fds == 0) {
      prev = p;
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    if (c->pending_tail == p) c->pending_tail = prev;
    c->pending_bytes -= p->len;
    c->pending_fd_frames--;
    pending_free(p);
  }
}

void conn_send_error(conn_t *c, int code, uint32_t stream_id, uint32_t request_id, const char *fmt,
                     ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  Larder__Error e = LARDER__ERROR__INIT;
  e.code = code;
  e.message = msg;
  e.stream_id = stream_id;
  e.request_id = request_id;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_ERROR;
  f.error = &e;
  conn_send(c, &f, -1);
}

static void protocol_error(conn_t *c, int code, const char *what) {
  STATS_ADD(&c->srv->stats, protocol_errors, 1);
  log_notice("client pid %d uid %u: %s; closing its connection", (int)c->pid, (unsigned)c->uid,
             what);
  conn_send_error(c, code, 0, 0, "%s", what);
  conn_shutdown(c);
}

/* ------------------------------------------------------------------------ */

static void dispatch(conn_t *c, Larder__Frame *f) {
  if (c->draining) return;
  if (!c->hello_done) {
    if (f->msg_case != LARDER__FRAME__MSG_HELLO) {
      protocol_error(c, LARDER_EPROTO, "protocol error: the first message must be Hello");
      return;
    }
    if (f->hello->protocol_version != WIRE_PROTOCOL_VERSION) {
      STATS_ADD(&c->srv->stats, protocol_errors, 1);
      conn_send_error(c, LARDER_EVERSION, 0, 0,
                      "protocol version %u is not supported (the daemon speaks %u)",
                      f->hello->protocol_version, WIRE_PROTOCOL_VERSION);
      conn_shutdown(c);
      return;
    }
    snprintf(c->name, sizeof(c->name), "%s", f->hello->client_name ? f->hello->client_name : "");
    /* The name goes to logs, JSON and an admin's terminal: printable ASCII
     * only (a client could send escape sequences or invalid UTF-8). */
    for (char *p = c->name; *p; p++)
      if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
    c->hello_done = 1;
    /* larderctl says so in its Hello: it is not a trainer from its first
     * frame on, before its admin request arrives. */
    if (strncmp(c->name, "larderctl/", 10) == 0) c->is_admin_conn = 1;
    Larder__HelloReply r = LARDER__HELLO_REPLY__INIT;
    r.protocol_version = WIRE_PROTOCOL_VERSION;
    r.server_version = (char *)LARDERD_VERSION;
    Larder__Frame out = LARDER__FRAME__INIT;
    out.msg_case = LARDER__FRAME__MSG_HELLO_REPLY;
    out.hello_reply = &r;
    conn_send(c, &out, -1);
    return;
  }
  switch (f->msg_case) {
    case LARDER__FRAME__MSG_OPEN_STREAM:
      if (c->srv->shutting_down) {
        conn_send_error(c, LARDER_ESHUTDOWN, 0, f->open_stream->request_id,
                        "the daemon is shutting down");
        return;
      }
      stream_open(c, f->open_stream);
      return;
    case LARDER__FRAME__MSG_RELEASE: {
      stream_t *s = stream_find(c, f->release->stream_id);
      /* A release for a stream that already ended is harmless: the stream
       * may have failed while the client was working on its batch. */
      if (s) stream_release(s, f->release);
      return;
    }
    case LARDER__FRAME__MSG_WAKE: {
      /* The client wrote releases in the stream's ring; like a release, a
       * wake for a stream that already ended is harmless. */
      stream_t *s = stream_find(c, f->wake->stream_id);
      if (s) stream_wake(s);
      return;
    }
    case LARDER__FRAME__MSG_CLOSE_STREAM: {
      stream_client_close(c, f->close_stream);
      conn_cancel_unsent(c, f->close_stream->stream_id);
      return;
    }
    case LARDER__FRAME__MSG_ADMIN_REQUEST: admin_handle(c, f->admin_request); return;
    default:
      protocol_error(c, LARDER_EPROTO, "protocol error: a client may not send this message");
      return;
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  conn_t *c = h->data;
  size_t want = c->rlen + 65536;
  if (want > c->rcap) {
    uint8_t *p = realloc(c->rbuf, want);
    if (p == NULL) {
      *buf = uv_buf_init(NULL, 0);
      return;
    }
    c->rbuf = p;
    c->rcap = want;
  }
  *buf = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)(c->rcap - c->rlen));
}

/* Bytes of replies a client has not read yet. */
static uint64_t backlog(conn_t *c) {
  return (uint64_t)uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) + c->cork.len +
         c->pending_bytes;
}

/* The most a client may leave unread before the daemon stops reading its
 * requests.  Without it, a client that sent requests and never read the
 * answers (errors, admin replies) would grow the daemon's write queue
 * without bound, gigabytes in seconds.  Tested by
 * daemon_robust_stalled_client. */
static uint64_t backlog_max(const conn_t *c) {
  uint64_t m = 2 * (uint64_t)c->srv->cfg.max_frame;
  return m > (8u << 20) ? m : (8u << 20);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);
static void process_frames(conn_t *c);

/* After a write: reads again once the client has taken half its backlog. */
static void maybe_resume_reading(conn_t *c) {
  if (!c->read_paused || c->closing || c->draining || c->broken || backlog(c) > backlog_max(c) / 2)
    return;
  c->read_paused = 0;
  process_frames(c);
  if (!c->read_paused && !c->closing && !c->draining)
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  conn_t *c = st->data;
  if (nread < 0) {
    /* EOF or an error: the client went away (perhaps killed mid-batch).
     * Its streams end and their arenas and units are freed. */
    conn_close(c);
    return;
  }
  c->rlen += (size_t)nread;
  process_frames(c);
}

/* Handles the complete frames read, until the client's unread replies
 * pass backlog_max. */
static void process_frames(conn_t *c) {
  size_t off = 0;
  /* A client that returns several batches at once gets the batches that
   * replace them in one write (conn_send corks them; flush_cork below), which
   * it reads in one call, instead of a write (and a read) per batch. */
  while (!c->closing && !c->draining && !c->broken) {
    if (backlog(c) > backlog_max(c)) {
      flush_cork(c);
      if (c->closing) return;
      if (!c->read_paused) {
        c->read_paused = 1;
        uv_read_stop((uv_stream_t *)&c->pipe);
      }
      break;
    }
    int64_t n = wire_frame_ready(c->rbuf + off, c->rlen - off, (uint32_t)c->srv->cfg.max_frame);
    if (n < 0) {
      flush_cork(c);
      protocol_error(c, LARDER_EPROTO, "protocol error: frame longer than max_frame");
      return;
    }
    if (n == 0) break;
    int too_costly;
    Larder__Frame *f = wire_decode(c->rbuf + off, (size_t)n, WIRE_DECODE_BUDGET(n), &too_costly);
    off += (size_t)n;
    if (f == NULL || f->msg_case == LARDER__FRAME__MSG__NOT_SET) {
      wire_free(f);
      flush_cork(c);
      char what[200];
      if (too_costly)
        snprintf(what, sizeof(what),
                 "protocol error: a frame of %lld bytes would take more memory to decode than "
                 "the daemon allows one of its size (8 times, and 4 MiB)",
                 (long long)n);
      else snprintf(what, sizeof(what), "protocol error: malformed message");
      protocol_error(c, LARDER_EPROTO, what);
      /* The decoder's many small blocks, freed, would stay in the heap
       * (over a hundred MiB for a 16 MiB frame): give them back when they
       * were many.  Trimming costs about what decoding them did, so a
       * client that sends such frames again and again gains nothing by it
       * (a small one, refused within the fixed 4 MiB, is not worth it). */
      if (too_costly && n >= (1 << 20)) malloc_trim(0);
      return;
    }
    dispatch(c, f);
    wire_free(f);
  }
  flush_cork(c);
  if (off > 0 && !c->closing) {
    memmove(c->rbuf, c->rbuf + off, c->rlen - off);
    c->rlen -= off;
  }
  /* A large frame grew the buffer; an idle connection keeps only what the
   * next read needs.  (Each connection that once sent a frame of up to
   * max_frame bytes held that much until it closed: max_clients times
   * max_frame in all.) */
  if (c->rcap > (1u << 20) && c->rlen <= (1u << 16) && !c->closing) {
    uint8_t *p = realloc(c->rbuf, c->rlen + 65536);
    if (p) {
      c->rbuf = p;
      c->rcap = c->rlen + 65536;
    }
  }
  if (c->rlen == 0) c->partial_since_ns = 0;
  else if (off > 0 || c->partial_since_ns == 0) c->partial_since_ns = util_now_ns();
}

/*
 * Two clocks bound what a connection may hold without making progress:
 * - frame_timeout: a frame begun and never finished holds up to max_frame
 *   bytes of the daemon's memory (tests: daemon_robust_partial_frame);
 * - hello_timeout: a connection that never completes its handshake holds
 *   a place in max_clients and in its user's max_clients_per_uid (tests:
 *   daemon_robust_no_hello): four users with 256 such connections each
 *   would lock everyone else out of a daemon of max_clients 1024.
 * The tick runs this every second, so a limit of N seconds closes after
 * N to N + 1.  Connections closed for want of a Hello are logged as one
 * line per tick: a client opening hundreds of them must not flood the log.
 */
void conn_expire_partial(server_t *srv) {
  uint64_t now = util_now_ns(), limit = srv->cfg.frame_timeout * 1000000000ull;
  uint64_t hello_limit = srv->cfg.hello_timeout * 1000000000ull;
  uint64_t no_hello = 0;
  uid_t last_uid = 0;
  for (conn_t *c = srv->conns; c; c = c->next) {
    if (c->closing || c->draining) continue;
    if (hello_limit && !c->hello_done && now - c->connected_ns > hello_limit) {
      STATS_ADD(&srv->stats, protocol_errors, 1);
      conn_send_error(c, LARDER_ETIMEDOUT, 0, 0,
                      "protocol error: no Hello within hello_timeout (%llu s) of connecting",
                      (unsigned long long)srv->cfg.hello_timeout);
      conn_shutdown(c);
      no_hello++;
      last_uid = c->uid;
      continue;
    }
    if (limit == 0 || c->read_paused || c->partial_since_ns == 0) continue;
    if (now - c->partial_since_ns <= limit) continue;
    char what[160];
    snprintf(what, sizeof(what), "protocol error: a frame begun %llu s ago is still unfinished",
             (unsigned long long)((now - c->partial_since_ns) / 1000000000ull));
    protocol_error(c, LARDER_EPROTO, what);
  }
  if (no_hello)
    log_notice(
        "closed %llu connection%s that sent no Hello within hello_timeout (%llu s; the "
        "last from uid %u)",
        (unsigned long long)no_hello, no_hello == 1 ? "" : "s",
        (unsigned long long)srv->cfg.hello_timeout, (unsigned)last_uid);
}

void conn_accept(server_t *srv, uv_stream_t *listener) {
  conn_t *c = calloc(1, sizeof(*c));
  if (c == NULL) return;
  c->srv = srv;
  c->pidfd = -1;
  c->id = ++srv->next_conn_id;
  c->connected_ns = util_now_ns();
  uv_pipe_init(srv->loop, &c->pipe, 0);
  c->pipe.data = c;
  uv_timer_init(srv->loop, &c->fd_timer);
  c->fd_timer.data = c;
  c->next = srv->conns;
  if (srv->conns) srv->conns->prev = c;
  srv->conns = c;
  STATS_ADD(&srv->stats, clients, 1);
  if (uv_accept(listener, (uv_stream_t *)&c->pipe) != 0) {
    conn_close(c);
    return;
  }
  uv_os_fd_t fd;
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0 &&
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    c->pid = cred.pid;
    c->uid = cred.uid;
    c->gid = cred.gid;
    /* larder ACL: the peer's supplementary groups, for group= allow rules
     * and admin_group (as the kernel saw them at connect time). */
    gid_t groups[256];
    socklen_t glen = sizeof(groups);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) == 0 && glen > 0) {
      c->groups = malloc(glen);
      if (c->groups) {
        memcpy(c->groups, groups, glen);
        c->num_groups = (int)(glen / sizeof(gid_t));
      }
    }
  } else {
    /* Without credentials nothing can be checked: treat it as nobody. */
    c->uid = c->gid = (uid_t)-2;
  }
  /* larder per-client limits: connections per user.  Every open connection
   * counts, those still waiting for their Hello included: otherwise a user
   * could hold any number of them (each until hello_timeout). */
  uint64_t same_uid = 0;
  for (conn_t *o = srv->conns; o; o = o->next)
    if (o->uid == c->uid && !o->closing && !o->draining) same_uid++;
  if (srv->cfg.max_clients_per_uid && same_uid > srv->cfg.max_clients_per_uid &&
      !srv->shutting_down) {
    conn_send_error(c, LARDER_ELIMIT, 0, 0,
                    "too many connections from uid %u (max_clients_per_uid %llu)", (unsigned)c->uid,
                    (unsigned long long)srv->cfg.max_clients_per_uid);
    conn_shutdown(c);
    return;
  }
  if (STATS_GET(&srv->stats, clients) > srv->cfg.max_clients || srv->shutting_down) {
    conn_send_error(
        c, srv->shutting_down ? LARDER_ESHUTDOWN : LARDER_ELIMIT, 0, 0,
        srv->shutting_down ? "the daemon is shutting down" : "too many clients (max_clients)");
    conn_shutdown(c);
    return;
  }
  uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}
