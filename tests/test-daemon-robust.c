/*
 * test-daemon-robust.c: hostile and failing clients.  Each test runs a
 * well-behaved client streaming in the background (its batches compared
 * byte for byte with a reference run) while the bad client misbehaves,
 * again and again; then it checks that only the bad client failed, with a
 * clear error, that the daemon's sockets, memfds and RSS came back to
 * their baseline, and that the daemon still exits 0 on SIGTERM with a log
 * free of sanitizer reports (a leak fails the ASan flavour).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon-harness.h"
#include "pqwrite.h"
#include "ring.h"

/* ------------------------------------------------------------------------ */
/* The fixture: a daemon, a reference run, a background client               */

typedef struct bg_client {
  pthread_t th;
  const char *socket;
  larder_stream_options_t o;
  const dh_run *ref;
  atomic_int stop;
  atomic_int runs;
  atomic_int failed;
  char err[1200];
} bg_client;

typedef struct fixture {
  dh_daemon d;
  char dir[1024];
  const char *src[1];
  larder_stream_options_t o;
  dh_run ref;
  int sockets0, fds0;
  long rss0;
  bg_client bg;
  uint64_t protocol_errors0, stream_errors0;
} fixture;

static void *bg_main(void *p) {
  bg_client *b = p;
  while (!b->stop || b->runs == 0) {
    dh_run r = {0};
    r.check_rows = 1;
    if (dh_collect(b->socket, &b->o, 0, &r) != 0) {
      snprintf(b->err, sizeof(b->err), "the good client failed: %s (%s)", r.err,
               larder_err_name(r.rc));
      b->failed = 1;
      dh_run_free(&r);
      return NULL;
    }
    int same = r.n == b->ref->n;
    for (size_t i = 0; same && i < r.n; i++) same = r.b[i].hash == b->ref->b[i].hash;
    dh_run_free(&r);
    if (!same) {
      snprintf(b->err, sizeof(b->err), "the good client's batches differ from the reference");
      b->failed = 1;
      return NULL;
    }
    b->runs++;
  }
  return NULL;
}

/* The daemon's socket count once it has stayed the same for 100 ms. */
static int quiet_sockets(pid_t pid) {
  int a = dh_fd_kind_count(pid, "socket:");
  for (int i = 0; i < 200; i++) {
    usleep(100000);
    int b = dh_fd_kind_count(pid, "socket:");
    if (a == b) return b;
    a = b;
  }
  return a;
}

static void fx_start(fixture *f, const char *const *flags, int background) {
  memset(f, 0, sizeof(*f));
  ASSERT_EQ(dh_std_dataset(f->dir, sizeof(f->dir)), DH_STD_ROWS);
  f->src[0] = f->dir;
  dh_opts(&f->o, f->src, 64, 31, 2);
  f->o.unit_rows = DH_STD_UNIT_ROWS;
  f->o.shuffle_window = 8;
  f->o.arena_bytes = 1u << 20;
  dh_init(&f->d, "d", flags);
  dh_start(&f->d);
  ASSERT_OK(dh_collect(f->d.socket, &f->o, 0, &f->ref));
  /* Baselines, once the reference client has gone. */
  /* The daemon's own sockets (the listener, and whatever its libraries
   * keep), once the reference client's connection is gone. */
  f->sockets0 = quiet_sockets(f->d.pid);
  ASSERT_EQ(dh_memfd_count(f->d.pid), 0);
  f->fds0 = dh_fd_count(f->d.pid);
  f->rss0 = dh_rss_kb(f->d.pid);
  f->protocol_errors0 = dh_stat(&f->d, "protocol_errors");
  f->stream_errors0 = dh_stat(&f->d, "stream_errors");
  if (background) {
    f->bg.socket = f->d.socket;
    f->bg.o = f->o;
    f->bg.ref = &f->ref;
    ASSERT_OK(pthread_create(&f->bg.th, NULL, bg_main, &f->bg));
  }
}

/* Waits until the daemon holds no more sockets and memfds than at the
 * start (plus `sockets` still-open ones), and fails otherwise. */
static void fx_expect_baseline(fixture *f, int sockets, int memfds) {
  double deadline = test_now_ms() + 10000.0 * dh_slow();
  int s, m;
  for (;;) {
    s = dh_fd_kind_count(f->d.pid, "socket:");
    m = dh_memfd_count(f->d.pid);
    if ((s <= f->sockets0 + sockets && m <= memfds) || test_now_ms() > deadline) break;
    usleep(5000);
  }
  if (s > f->sockets0 + sockets || m > memfds) {
    dh_print_log(&f->d);
    ASSERT_FAIL_("the daemon holds %d sockets (baseline %d + %d) and %d memfds (expected %d)", s,
                 f->sockets0, sockets, m, memfds);
  }
}

static void fx_finish(fixture *f, long rss_slack_kb) {
  if (f->bg.socket) {
    f->bg.stop = 1;
    pthread_join(f->bg.th, NULL);
    if (f->bg.failed) {
      dh_print_log(&f->d);
      ASSERT_FAIL_("%s", f->bg.err);
    }
    ASSERT_GE(f->bg.runs, 1);
  }
  ASSERT(dh_alive(&f->d));
  fx_expect_baseline(f, 0, 0);
  int fds = dh_fd_count(f->d.pid);
  /* RocksDB may open a file or two of its own meanwhile. */
  ASSERT_LE(fds, f->fds0 + 4);
  long rss = dh_rss_kb(f->d.pid);
  long slack = rss_slack_kb * dh_slow();
  if (!dh_asan() && rss > f->rss0 + slack)
    ASSERT_FAIL_("the daemon's RSS grew from %ld kB to %ld kB", f->rss0, rss);
  fprintf(stderr, "baseline: %d fds, %ld kB; now %d fds, %ld kB; good client ran %d times\n",
          f->fds0, f->rss0, fds, rss, f->bg.runs);
  dh_stop(&f->d);
  dh_run_free(&f->ref);
}

/* A raw connection that has said Hello. */
static int hello_conn(fixture *f) {
  int fd = dh_raw_connect(f->d.socket);
  Larder__Frame *r = dh_raw_hello(fd, WIRE_PROTOCOL_VERSION);
  ASSERT_NOT_NULL(r);
  ASSERT_EQ(r->msg_case, LARDER__FRAME__MSG_HELLO_REPLY);
  wire_free(r);
  return fd;
}

/* Sends bytes and expects one Error frame with code, then the end of the
 * connection. */
static void expect_error_close(fixture *f, int fd, const void *bytes, size_t len, int code,
                               const char *what) {
  if (len) ASSERT_OK(dh_raw_write(fd, bytes, len));
  int got = 0;
  int closed = dh_raw_wait_closed(fd, 10000 * dh_slow(), &got);
  if (!closed || got != code) {
    dh_print_log(&f->d);
    ASSERT_FAIL_("%s: closed %d, error %s (expected %s)", what, closed, larder_err_name(got),
                 larder_err_name(code));
  }
  close(fd);
}

static void put_len(uint8_t *p, uint32_t n) {
  p[0] = (uint8_t)n;
  p[1] = (uint8_t)(n >> 8);
  p[2] = (uint8_t)(n >> 16);
  p[3] = (uint8_t)(n >> 24);
}

/* ------------------------------------------------------------------------ */

/* Malformed frames: bytes that are no protobuf, an empty frame, a
 * truncated message, a frame of unknown fields only; before and after the
 * handshake. */
TEST_IMPL(daemon_robust_malformed_frame) {
  fixture f;
  fx_start(&f, NULL, 1);
  /* A valid OpenStream frame, to cut short. */
  char *srcs[1] = {f.dir};
  size_t olen;
  uint8_t *open_frame = dh_open_frame(3, srcs, 1, 64, &olen);
  int rounds = 12;
  for (int round = 0; round < rounds; round++) {
    int after_hello = round % 2;
    uint8_t buf[256];
    /* 1. Bytes that do not decode. */
    int fd = after_hello ? hello_conn(&f) : dh_raw_connect(f.d.socket);
    put_len(buf, 10);
    memset(buf + 4, 0xff, 10);
    expect_error_close(&f, fd, buf, 14, LARDER_EPROTO, "garbage protobuf");
    /* 2. An empty frame: no message set. */
    fd = after_hello ? hello_conn(&f) : dh_raw_connect(f.d.socket);
    put_len(buf, 0);
    expect_error_close(&f, fd, buf, 4, LARDER_EPROTO, "empty frame");
    /* 3. A truncated message: its length says so. */
    fd = after_hello ? hello_conn(&f) : dh_raw_connect(f.d.socket);
    uint8_t *cut = malloc(olen);
    memcpy(cut, open_frame, olen);
    put_len(cut, (uint32_t)(olen - 4 - 7));
    expect_error_close(&f, fd, cut, olen - 7, LARDER_EPROTO, "truncated message");
    free(cut);
    /* 4. Only an unknown field (number 99, varint). */
    fd = after_hello ? hello_conn(&f) : dh_raw_connect(f.d.socket);
    put_len(buf, 3);
    buf[4] = (uint8_t)((99 << 3) & 0x7f) | 0x80;
    buf[5] = (uint8_t)(99 >> 4);
    buf[6] = 1;
    expect_error_close(&f, fd, buf, 7, LARDER_EPROTO, "unknown field only");
    /* 5. Garbage right after a valid frame in the same write. */
    fd = after_hello ? hello_conn(&f) : dh_raw_connect(f.d.socket);
    uint8_t *two = malloc(olen + 14);
    if (after_hello) {
      memcpy(two, open_frame, olen);
      put_len(two + olen, 10);
      memset(two + olen + 4, 0xfe, 10);
      ASSERT_OK(dh_raw_write(fd, two, olen + 14));
      int code = 0;
      ASSERT(dh_raw_wait_closed(fd, 20000 * dh_slow(), &code));
      ASSERT_EQ(code, LARDER_EPROTO);
      close(fd);
    } else {
      close(fd);
    }
    free(two);
  }
  free(open_frame);
  /* Each bad connection counted, none of the good client's. */
  uint64_t pe = dh_stat(&f.d, "protocol_errors") - f.protocol_errors0;
  ASSERT_GE(pe, (uint64_t)rounds * 4);
  fx_finish(&f, 30000);
  return 0;
}

/* Length prefixes over max_frame (16 MiB): rejected before anything is
 * allocated for them; a large frame within the limit that never completes
 * costs nothing once its client goes. */
TEST_IMPL(daemon_robust_oversized_frame) {
  fixture f;
  fx_start(&f, NULL, 1);
  static const uint32_t lens[] = {0xffffffffu, (16u << 20) + 1, 0x7fffffffu, 0x80000000u};
  for (int round = 0; round < 5; round++) {
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
      uint8_t buf[4];
      put_len(buf, lens[i]);
      int fd = round % 2 ? hello_conn(&f) : dh_raw_connect(f.d.socket);
      expect_error_close(&f, fd, buf, 4, LARDER_EPROTO, "oversized length");
    }
  }
  /* 16 MiB announced, 2 MiB sent, then the client goes away. */
  for (int round = 0; round < 3; round++) {
    int fd = hello_conn(&f);
    uint8_t *buf = calloc(1, 2u << 20);
    put_len(buf, 16u << 20);
    ASSERT_OK(dh_raw_write(fd, buf, 2u << 20));
    free(buf);
    usleep(20000);
    close(fd);
  }
  char *json = dh_admin(&f.d, "stats");
  ASSERT_NOT_NULL(json);
  ASSERT_GE(dh_json_u64(json, "protocol_errors") - f.protocol_errors0, 20);
  free(json);
  fx_finish(&f, 60000);
  return 0;
}

/* A frame of max_frame bytes holding millions of empty strings, two bytes
 * each on the wire, takes protobuf-c 40 bytes each to decode: 620 MB for
 * one 16 MiB frame, which clients can send at once.  Decoding stops at 8
 * times the frame's size and 4 MiB, and the client gets a clear error. */
TEST_IMPL(daemon_robust_costly_frame) {
  fixture f;
  fx_start(&f, NULL, 1);
  size_t n = ((16u << 20) - 64) / 2;
  char **srcs = malloc(n * sizeof(char *));
  ASSERT_NOT_NULL(srcs);
  char empty[1] = "";
  for (size_t i = 0; i < n; i++) srcs[i] = empty;
  size_t len;
  uint8_t *frame = dh_open_frame(1, srcs, n, 64, &len);
  free(srcs);
  ASSERT_LE(len - WIRE_HEADER, 16u << 20);
  long peak0 = dh_peak_rss_kb(f.d.pid, 1);
  for (int round = 0; round < 3; round++) {
    int fd = hello_conn(&f);
    expect_error_close(&f, fd, frame, len, LARDER_EPROTO, "a frame of empty strings");
  }
  free(frame);
  long peak = dh_peak_rss_kb(f.d.pid, 0);
  fprintf(stderr, "peak RSS %ld kB before, %ld kB after\n", peak0, peak);
  /* The frame's 16 MiB buffer, and at most 8 times that decoding it. */
  if (!dh_asan() && peak0 > 0) ASSERT_LE(peak - peak0, 200L * 1024 * dh_slow());
  char *log = dh_read_log(&f.d);
  ASSERT_NOT_NULL(strstr(log, "would take more memory to decode than the daemon allows"));
  free(log);
  ASSERT_GE(dh_stat(&f.d, "protocol_errors") - f.protocol_errors0, 3);
  fx_finish(&f, 60000);
  return 0;
}

static void send_msg(int fd, Larder__Frame *fr) { ASSERT_OK(dh_raw_send(fd, fr)); }

/* Messages a client may not send (a Batch, replies, EndOfStream, Error, a
 * second Hello) close that connection with EPROTO. */
TEST_IMPL(daemon_robust_forbidden_message) {
  fixture f;
  fx_start(&f, NULL, 1);
  for (int round = 0; round < 5; round++) {
    for (int kind = 0; kind < 7; kind++) {
      int fd = hello_conn(&f);
      Larder__Frame fr = LARDER__FRAME__INIT;
      Larder__Batch b = LARDER__BATCH__INIT;
      Larder__HelloReply hr = LARDER__HELLO_REPLY__INIT;
      Larder__OpenStreamReply osr = LARDER__OPEN_STREAM_REPLY__INIT;
      Larder__EndOfStream eos = LARDER__END_OF_STREAM__INIT;
      Larder__Error er = LARDER__ERROR__INIT;
      Larder__AdminReply ar = LARDER__ADMIN_REPLY__INIT;
      Larder__Hello h = LARDER__HELLO__INIT;
      uint64_t layout[LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS] = {0};
      switch (kind) {
        case 0:
          /* A Batch pointing far outside any arena. */
          b.stream_id = 1;
          b.num_rows = 1u << 30;
          b.arena_offset = 1ull << 40;
          b.arena_length = 1ull << 40;
          layout[LARDER__ARRAY_FIELD__ARRAY_VALUES_OFFSET] = 1ull << 50;
          layout[LARDER__ARRAY_FIELD__ARRAY_VALUES_LENGTH] = 1ull << 50;
          b.n_layout = LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS;
          b.layout = layout;
          fr.msg_case = LARDER__FRAME__MSG_BATCH;
          fr.batch = &b;
          break;
        case 1:
          fr.msg_case = LARDER__FRAME__MSG_HELLO_REPLY;
          fr.hello_reply = &hr;
          break;
        case 2:
          fr.msg_case = LARDER__FRAME__MSG_OPEN_STREAM_REPLY;
          fr.open_stream_reply = &osr;
          break;
        case 3:
          eos.stream_id = 1;
          fr.msg_case = LARDER__FRAME__MSG_END_OF_STREAM;
          fr.end_of_stream = &eos;
          break;
        case 4:
          er.code = LARDER_EIO;
          er.message = (char *)"I am the daemon now";
          fr.msg_case = LARDER__FRAME__MSG_ERROR;
          fr.error = &er;
          break;
        case 5:
          fr.msg_case = LARDER__FRAME__MSG_ADMIN_REPLY;
          fr.admin_reply = &ar;
          break;
        default:
          h.protocol_version = WIRE_PROTOCOL_VERSION;
          fr.msg_case = LARDER__FRAME__MSG_HELLO;
          fr.hello = &h;
          break;
      }
      send_msg(fd, &fr);
      expect_error_close(&f, fd, NULL, 0, LARDER_EPROTO, "forbidden message");
    }
  }
  ASSERT_GE(dh_stat(&f.d, "protocol_errors") - f.protocol_errors0, 35);

  /* Frames that follow a fatal one in the same write are not acted on:
   * after a rejected Hello, a good Hello gets no HelloReply; after a
   * forbidden message, a second one does not cut the first Error short;
   * and an OpenStream behind a forbidden message opens nothing. */
  for (int round = 0; round < 10; round++) {
    Larder__Frame fr = LARDER__FRAME__INIT;
    Larder__Hello h = LARDER__HELLO__INIT;
    fr.msg_case = LARDER__FRAME__MSG_HELLO;
    fr.hello = &h;
    size_t l1, l2;
    h.protocol_version = 999;
    uint8_t *bad = wire_encode(&fr, &l1);
    h.protocol_version = WIRE_PROTOCOL_VERSION;
    uint8_t *good = wire_encode(&fr, &l2);
    uint8_t *both = malloc(l1 + l2);
    memcpy(both, bad, l1);
    memcpy(both + l1, good, l2);
    int fd = dh_raw_connect(f.d.socket);
    ASSERT_OK(dh_raw_write(fd, both, l1 + l2));
    int errors = 0, replies = 0;
    for (;;) {
      int rc;
      Larder__Frame *r = dh_raw_recv(fd, 10000 * dh_slow(), NULL, NULL, &rc);
      if (r == NULL) {
        ASSERT_EQ(rc, LARDER_ECLOSED);
        break;
      }
      if (r->msg_case == LARDER__FRAME__MSG_ERROR) {
        ASSERT_EQ(r->error->code, LARDER_EVERSION);
        errors++;
      }
      if (r->msg_case == LARDER__FRAME__MSG_HELLO_REPLY) replies++;
      wire_free(r);
    }
    close(fd);
    ASSERT_EQ(errors, 1);
    ASSERT_EQ(replies, 0);
    free(bad);
    free(good);
    free(both);

    /* [EndOfStream][EndOfStream][OpenStream] after a good Hello. */
    fd = hello_conn(&f);
    Larder__EndOfStream eos = LARDER__END_OF_STREAM__INIT;
    Larder__Frame fe = LARDER__FRAME__INIT;
    fe.msg_case = LARDER__FRAME__MSG_END_OF_STREAM;
    fe.end_of_stream = &eos;
    size_t le, lo;
    uint8_t *e = wire_encode(&fe, &le);
    char *srcs[1] = {f.dir};
    /* Batch size 0: answered at once with EINVAL, if it were read. */
    uint8_t *op = dh_open_frame(9, srcs, 1, 0, &lo);
    uint8_t *three = malloc(2 * le + lo);
    memcpy(three, e, le);
    memcpy(three + le, e, le);
    memcpy(three + 2 * le, op, lo);
    ASSERT_OK(dh_raw_write(fd, three, 2 * le + lo));
    errors = 0;
    int others = 0;
    for (;;) {
      int rc;
      Larder__Frame *r = dh_raw_recv(fd, 10000 * dh_slow(), NULL, NULL, &rc);
      if (r == NULL) break;
      if (r->msg_case == LARDER__FRAME__MSG_ERROR) errors++;
      else others++;
      wire_free(r);
    }
    close(fd);
    ASSERT_EQ(errors, 1);
    ASSERT_EQ(others, 0);
    free(e);
    free(op);
    free(three);
  }
  /* A client that does not read while it sends: its replies back up in
   * the daemon's write queue; a forbidden message and then an admin
   * request must still end with the Error frame, after the replies. */
  for (int round = 0; round < 3; round++) {
    int fd = hello_conn(&f);
    Larder__AdminRequest ar = LARDER__ADMIN_REQUEST__INIT;
    ar.command = (char *)"stats";
    ar.json = 1;
    Larder__Frame fa = LARDER__FRAME__INIT;
    fa.msg_case = LARDER__FRAME__MSG_ADMIN_REQUEST;
    fa.admin_request = &ar;
    for (int i = 0; i < 600; i++) {
      ar.request_id = (uint32_t)i + 1;
      send_msg(fd, &fa);
    }
    Larder__EndOfStream eos = LARDER__END_OF_STREAM__INIT;
    Larder__Frame fe = LARDER__FRAME__INIT;
    fe.msg_case = LARDER__FRAME__MSG_END_OF_STREAM;
    fe.end_of_stream = &eos;
    size_t le, la;
    uint8_t *e = wire_encode(&fe, &le);
    ar.request_id = 9999;
    uint8_t *a = wire_encode(&fa, &la);
    uint8_t *both = malloc(le + la);
    memcpy(both, e, le);
    memcpy(both + le, a, la);
    ASSERT_OK(dh_raw_write(fd, both, le + la));
    free(e);
    free(a);
    free(both);
    usleep(100000);
    int replies = 0, errors = 0, last_error = 0, end = 0;
    for (;;) {
      int rc;
      Larder__Frame *r = dh_raw_recv(fd, 10000 * dh_slow(), NULL, NULL, &rc);
      if (r == NULL) {
        end = rc;
        break;
      }
      last_error = r->msg_case == LARDER__FRAME__MSG_ERROR;
      if (last_error) {
        ASSERT_EQ(r->error->code, LARDER_EPROTO);
        errors++;
      } else {
        ASSERT_EQ(r->msg_case, LARDER__FRAME__MSG_ADMIN_REPLY);
        ASSERT(r->admin_reply->request_id != 9999);
        replies++;
      }
      wire_free(r);
    }
    close(fd);
    if (errors != 1 || !last_error) dh_print_log(&f.d);
    if (errors != 1 || !last_error)
      ASSERT_FAIL_("%d replies, then %d errors (the last frame %s an Error), then %s", replies,
                   errors, last_error ? "was" : "was not", larder_err_name(end));
    ASSERT_EQ(replies, 600);
  }
  fx_finish(&f, 30000);
  return 0;
}

/* Garbage instead of a handshake: random bytes, an HTTP request, a valid
 * frame other than Hello.  Random bytes whose first four happen to
 * announce a short frame leave the daemon waiting; closing frees it. */
TEST_IMPL(daemon_robust_garbage_handshake) {
  fixture f;
  fx_start(&f, NULL, 1);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  int errors = 0;
  for (int round = 0; round < 40; round++) {
    size_t n = 1 + (size_t)(round * 97 % 4096);
    uint8_t *buf = malloc(n);
    for (size_t i = 0; i < n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      buf[i] = (uint8_t)x;
    }
    if (round % 4 == 3 && n >= 4) buf[3] = 0; /* a plausible short length */
    int fd = dh_raw_connect(f.d.socket);
    ASSERT_OK(dh_raw_write(fd, buf, n));
    free(buf);
    int code = 0;
    if (dh_raw_wait_closed(fd, 100, &code)) {
      ASSERT_EQ(code, LARDER_EPROTO);
      errors++;
    }
    close(fd);
  }
  ASSERT_GT(errors, 10);
  static const char http[] = "GET / HTTP/1.1\r\nHost: larder\r\n\r\n";
  int fd = dh_raw_connect(f.d.socket);
  expect_error_close(&f, fd, http, sizeof(http) - 1, LARDER_EPROTO, "HTTP request");
  /* A valid frame, but not Hello, first. */
  fd = dh_raw_connect(f.d.socket);
  Larder__AdminRequest ar = LARDER__ADMIN_REQUEST__INIT;
  ar.command = (char *)"stats";
  Larder__Frame fr = LARDER__FRAME__INIT;
  fr.msg_case = LARDER__FRAME__MSG_ADMIN_REQUEST;
  fr.admin_request = &ar;
  send_msg(fd, &fr);
  expect_error_close(&f, fd, NULL, 0, LARDER_EPROTO, "AdminRequest before Hello");
  /* A client that connects and says nothing, then goes. */
  for (int i = 0; i < 10; i++) close(dh_raw_connect(f.d.socket));
  fx_finish(&f, 30000);
  return 0;
}

/* A Hello with another protocol version gets EVERSION and the connection
 * closes. */
TEST_IMPL(daemon_robust_wrong_version) {
  fixture f;
  fx_start(&f, NULL, 1);
  static const uint32_t versions[] = {0, 1, 3, 999, 0xffffffffu};
  for (int round = 0; round < 5; round++) {
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
      int fd = dh_raw_connect(f.d.socket);
      Larder__Hello h = LARDER__HELLO__INIT;
      h.protocol_version = versions[i];
      h.client_name = (char *)"future-client/9";
      Larder__Frame fr = LARDER__FRAME__INIT;
      fr.msg_case = LARDER__FRAME__MSG_HELLO;
      fr.hello = &h;
      send_msg(fd, &fr);
      expect_error_close(&f, fd, NULL, 0, LARDER_EVERSION, "wrong version");
    }
  }
  fx_finish(&f, 30000);
  return 0;
}

/* ------------------------------------------------------------------------ */

/* One good client alone, timed. */
static double timed_run(fixture *f, int epochs) {
  larder_stream_options_t o = f->o;
  o.epochs = (uint64_t)epochs;
  dh_run r = {0};
  double t0 = test_now_ms();
  ASSERT_OK(dh_collect(f->d.socket, &o, 0, &r));
  double t = test_now_ms() - t0;
  for (size_t i = 0; i < r.n && i < f->ref.n; i++) ASSERT_EQ(r.b[i].hash, f->ref.b[i].hash);
  dh_run_free(&r);
  return t;
}

/*
 * Clients that open streams and never read: a raw one that never reads its
 * socket at all, and liblarder ones that hold their window of batches and
 * stop.  Others continue at full speed; the stalled ones cost nothing once
 * they go.
 */
TEST_IMPL(daemon_robust_stalled_client) {
  fixture f;
  fx_start(&f, NULL, 0);
  double alone = timed_run(&f, 4);
  alone = timed_run(&f, 4); /* warm */
  int raw[4];
  larder_client_t *lc[4];
  larder_stream_t *ls[4];
  larder_batch_t *held[4][2];
  for (int i = 0; i < 4; i++) {
    raw[i] = hello_conn(&f);
    larder_stream_options_t o = f.o;
    o.epochs = 0; /* unbounded */
    o.window = 8;
    o.seed = (uint64_t)i;
    Larder__OpenStream req = LARDER__OPEN_STREAM__INIT;
    req.request_id = 1;
    char *srcs[1] = {f.dir};
    req.n_sources = 1;
    req.sources = srcs;
    req.batch_size = 64;
    req.unit_rows = DH_STD_UNIT_ROWS;
    req.window = 8;
    req.arena_bytes = 1u << 20;
    req.world_size = 1;
    Larder__Frame fr = LARDER__FRAME__INIT;
    fr.msg_case = LARDER__FRAME__MSG_OPEN_STREAM;
    fr.open_stream = &req;
    send_msg(raw[i], &fr); /* and never read a byte */
    ASSERT_OK(larder_client_connect(f.d.socket, &lc[i]));
    /* Half of them with a window their arena cannot hold: the daemon
     * fills the arena and must then wait, not spin. */
    o.window = i % 2 ? 2 : 16;
    o.arena_bytes = i % 2 ? 1u << 20 : 16u << 10;
    ASSERT_OK(larder_stream_open(lc[i], &o, &ls[i]));
    for (int k = 0; k < 2; k++)
      ASSERT_OK(larder_stream_next(ls[i], 60000 * dh_slow(), &held[i][k]));
  }
  /* The stalled streams: the liblarder ones get nothing more. */
  larder_batch_t *none;
  ASSERT_EQ(larder_stream_next(ls[1], 300, &none), LARDER_ETIMEDOUT);
  /* With every stream stalled, the daemon idles. */
  double cpu0 = dh_cpu_ms(f.d.pid);
  usleep(1000000);
  double cpu = dh_cpu_ms(f.d.pid) - cpu0;
  fprintf(stderr, "daemon CPU while every stream is stalled: %.0f ms in 1 s\n", cpu);
  ASSERT_DOUBLE_LE(cpu, 100.0);
  double with = timed_run(&f, 4);
  fprintf(stderr, "a good client alone: %.0f ms; beside 8 stalled ones: %.0f ms\n", alone, with);
  ASSERT_DOUBLE_LE(with, alone * 3 + 500.0 * dh_slow());
  /* The stalled streams' memfds (the timed client's may linger a moment):
   * an arena per raw stream, an arena and a descriptor ring per liblarder
   * one. */
  fx_expect_baseline(&f, 8, 12);
  ASSERT_EQ(dh_memfd_count(f.d.pid), 12);
  for (int i = 0; i < 4; i++) {
    close(raw[i]);
    for (int k = 0; k < 2; k++) larder_batch_release(held[i][k]);
    larder_stream_close(ls[i]);
    larder_client_close(lc[i]);
  }
  fx_finish(&f, 60000);
  return 0;
}

/* dh_spawn_holder (seed step 1, no draining), once the child has opened
 * its streams and read its batches. */
static pid_t spawn_holder_ready(const char *socket, const larder_stream_options_t *o, int streams,
                                int reads, int hold) {
  int ready;
  pid_t pid = dh_spawn_holder(socket, o, streams, 1, reads, hold, 0, &ready);
  char x;
  if (read(ready, &x, 1) != 1) {
    int st;
    waitpid(pid, &st, 0);
    ASSERT_FAIL_("the client child exited early (status 0x%x)", st);
  }
  close(ready);
  return pid;
}

/*
 * A client SIGKILLed mid-epoch while it holds batches: its connection,
 * streams and arenas are freed; the daemon and the good client carry on.
 */
TEST_IMPL(daemon_robust_killed_client) {
  fixture f;
  fx_start(&f, NULL, 1);
  for (int round = 0; round < 6; round++) {
    larder_stream_options_t o = f.o;
    o.epochs = 0;
    o.window = 3;
    o.seed = (uint64_t)round * 2;
    /* Two streams, 2 + round * 5 batches each, holding the first two. */
    pid_t pid = spawn_holder_ready(f.d.socket, &o, 2, 2 + round * 5, 2);
    /* The child's two arenas and rings (and the good client's, maybe). */
    ASSERT_GE(dh_memfd_count(f.d.pid), 4);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    ASSERT(WIFSIGNALED(status));
    /* The child's memfds go; the good client holds at most an arena and
     * a ring. */
    fx_expect_baseline(&f, 1, 2);
  }
  fx_finish(&f, 60000);
  return 0;
}

/*
 * A client SIGKILLed right after opening a stream on a cold dataset of many
 * small units, with one worker: the loads its pins queued that no worker
 * had started are dropped (unit_loads_cancelled), not decoded for no one,
 * and the next client reads the whole dataset right (the dropped units
 * load again for it).
 */
TEST_IMPL(daemon_robust_killed_client_loads) {
  char dir[1024];
  ASSERT_EQ(dh_mid_dataset(dir, sizeof(dir)), DH_MID_ROWS);
  static const char *const fl[] = {"--workers=1", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  const char *src[1] = {dir};
  larder_stream_options_t o;
  dh_opts(&o, src, 64, 5, 1);
  o.unit_rows = 64; /* 960 units: one worker needs far longer than the kill */
  o.window = 2;
  pid_t pid = spawn_holder_ready(d.socket, &o, 1, 0, 0);
  /* Its pins queue the epoch's 960 loads at once; the first one done says
   * they are queued.  The kill lands while the worker is a unit or a few
   * into them. */
  double deadline = test_now_ms() + 30000.0 * dh_slow();
  while (dh_stat(&d, "units_decoded") + dh_stat(&d, "units_from_cache") == 0 &&
         test_now_ms() < deadline)
    usleep(1000);
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  ASSERT(WIFSIGNALED(status));
  for (int i = 0; i < 3000 && dh_stat(&d, "streams") != 0; i++) usleep(10000);
  ASSERT_EQ(dh_stat(&d, "streams"), 0);
  /* Every queued load ends either run or dropped, none both; the worker
   * finishes the unit it was on. */
  uint64_t cancelled = 0, loaded = 0;
  deadline = test_now_ms() + 30000.0 * dh_slow();
  do {
    cancelled = dh_stat(&d, "unit_loads_cancelled");
    loaded = dh_stat(&d, "units_decoded") + dh_stat(&d, "units_from_cache");
    if (cancelled + loaded >= 960) break;
    usleep(5000);
  } while (test_now_ms() < deadline);
  fprintf(stderr, "killed client: %llu loads dropped, %llu run\n", (unsigned long long)cancelled,
          (unsigned long long)loaded);
  ASSERT_EQ(cancelled + loaded, 960);
  /* The worker would need every one of the 960 loads done in the moment
   * between the first and the kill to leave nothing to drop. */
  ASSERT_GT(cancelled, 0);
  /* The next client: every row once, every column right. */
  dh_run r = {0};
  r.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r));
  int64_t rows = 0;
  for (size_t i = 0; i < r.n; i++) rows += r.b[i].rows;
  ASSERT_EQ(rows, r.batches_per_epoch * 64);
  ASSERT_GE(rows, DH_MID_ROWS);
  uint8_t *seen = calloc(DH_MID_ROWS, 1);
  ASSERT_NOT_NULL(seen);
  int64_t distinct = 0;
  for (size_t i = 0; i < r.n; i++)
    for (int64_t k = 0; k < r.b[i].rows; k++) {
      int64_t id = r.b[i].ids[k];
      ASSERT(id >= 0 && id < DH_MID_ROWS);
      if (!seen[id]) distinct++;
      seen[id] = 1;
    }
  ASSERT_EQ(distinct, DH_MID_ROWS);
  free(seen);
  dh_run_free(&r);
  ASSERT_EQ(dh_stat(&d, "stream_errors"), 0);
  ASSERT_EQ(dh_stat(&d, "unit_errors"), 0);
  dh_stop(&d);
  return 0;
}

/* A stream on a missing file (or an empty directory, or a glob matching
 * nothing) fails to open with ENOENT naming it; the same client then opens
 * a good stream. */
TEST_IMPL(daemon_robust_missing_file) {
  fixture f;
  fx_start(&f, NULL, 1);
  char missing[1200], emptydir[1200], glob[1200];
  snprintf(missing, sizeof(missing), "%s/no-such-file.parquet", test_tmpdir());
  snprintf(emptydir, sizeof(emptydir), "%s/empty", test_tmpdir());
  snprintf(glob, sizeof(glob), "%s/nothing-*.parquet", test_tmpdir());
  mkdir(emptydir, 0755);
  const char *cases[3] = {missing, emptydir, glob};
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(f.d.socket, &c));
  for (int round = 0; round < 5; round++) {
    for (int i = 0; i < 3; i++) {
      larder_stream_options_t o = f.o;
      const char *src[2] = {f.dir, cases[i]};
      o.sources = src;
      o.num_sources = 2;
      larder_stream_t *s;
      int rc = larder_stream_open(c, &o, &s);
      ASSERT_EQ(rc, LARDER_ENOENT);
      ASSERT_STR_CONTAINS(larder_client_last_error(c), cases[i]);
    }
  }
  /* An empty source is EINVAL. */
  {
    larder_stream_options_t o = f.o;
    const char *src[1] = {""};
    o.sources = src;
    larder_stream_t *s;
    ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EINVAL);
  }
  /* The same client is fine. */
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &f.o, &s));
  for (size_t k = 0; k < f.ref.n; k++) {
    larder_batch_t *b;
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    ASSERT_EQ(dh_batch_hash(b), f.ref.b[k].hash);
    larder_batch_release(b);
  }
  larder_batch_t *b;
  ASSERT_EQ(larder_stream_next(s, 60000 * dh_slow(), &b), LARDER_EEOF);
  larder_stream_close(s);
  larder_client_close(c);
  ASSERT_EQ(dh_stat(&f.d, "stream_errors"), f.stream_errors0);
  fx_finish(&f, 30000);
  return 0;
}

/*
 * A daemon out of file descriptors: each open that cannot make or pass its
 * shared memory fails with LARDER_ELIMIT saying so, and the client's
 * connection and its other streams carry on.  (Closing the connection when
 * the descriptors cannot be passed would free the new stream while the open
 * goes on to read it.)
 */
TEST_IMPL(daemon_robust_out_of_fds) {
  fixture f;
  fx_start(&f, NULL, 0);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(f.d.socket, &c));
  larder_stream_t *good;
  ASSERT_OK(larder_stream_open(c, &f.o, &good));
  struct rlimit old;
  ASSERT_OK(prlimit(f.d.pid, RLIMIT_NOFILE, NULL, &old));
  larder_stream_t *extra[32];
  int nextra = 0, failed = 0, unpassed = 0;
  /* Room for 0 to 15 more descriptors (more where the daemon's table has
   * holes): an open lists the directory, opens the files, makes the arena
   * and the ring, and takes two more for a moment to pass them, so each
   * step runs out in one round or another. */
  for (int round = 0; round < 32; round++) {
    struct rlimit lim = old;
    lim.rlim_cur = (rlim_t)dh_fd_count(f.d.pid) + (rlim_t)(round % 16);
    ASSERT_OK(prlimit(f.d.pid, RLIMIT_NOFILE, &lim, NULL));
    larder_stream_t *s;
    int rc = larder_stream_open(c, &f.o, &s);
    ASSERT_OK(prlimit(f.d.pid, RLIMIT_NOFILE, &old, NULL));
    if (rc == 0) {
      ASSERT(nextra < 32);
      extra[nextra++] = s;
      continue;
    }
    if (rc != LARDER_ELIMIT)
      ASSERT_FAIL_("round %d: %s: %s", round, larder_err_name(rc), larder_client_last_error(c));
    const char *why = larder_client_last_error(c);
    if (!strstr(why, "out of file descriptors") && !strstr(why, strerror(EMFILE)))
      ASSERT_FAIL_("round %d: an unclear error: %s", round, why);
    fprintf(stderr, "round %d: %s\n", round, why);
    unpassed += strstr(why, "cannot pass") != NULL;
    failed++;
  }
  fprintf(stderr, "%d opens failed out of descriptors, %d succeeded\n", failed, nextra);
  ASSERT_GE(failed, 2);
  ASSERT_GE(unpassed, 1);
  ASSERT(dh_alive(&f.d));
  /* The first stream and every one that opened serve the whole run. */
  for (int i = -1; i < nextra; i++) {
    larder_stream_t *s = i < 0 ? good : extra[i];
    size_t k = 0;
    larder_batch_t *b;
    int rc;
    while ((rc = larder_stream_next(s, 60000 * dh_slow(), &b)) == 0) {
      ASSERT(k < f.ref.n);
      ASSERT_EQ(dh_batch_hash(b), f.ref.b[k].hash);
      k++;
      larder_batch_release(b);
    }
    ASSERT_EQ(rc, LARDER_EEOF);
    ASSERT_EQ(k, f.ref.n);
    larder_stream_close(s);
  }
  larder_client_close(c);
  fx_finish(&f, 30000);
  return 0;
}

/*
 * Out of descriptors at accept: the daemon stops accepting (a warning, no
 * spinning), goes on serving the clients it has, and accepts the waiting
 * ones once descriptors are free again.  (Left to libuv, the accept is
 * retried for ever once its reserve descriptor is gone, so the loop spins,
 * serves nobody and logs each failure.)
 */
TEST_IMPL(daemon_robust_accept_out_of_fds) {
  fixture f;
  fx_start(&f, NULL, 0);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(f.d.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &f.o, &s));
  struct rlimit old, lim;
  ASSERT_OK(prlimit(f.d.pid, RLIMIT_NOFILE, NULL, &old));
  lim = old;
  lim.rlim_cur = 3; /* no descriptor can be made, not even libuv's reserve */
  ASSERT_OK(prlimit(f.d.pid, RLIMIT_NOFILE, &lim, NULL));
  int waiting[8];
  for (int i = 0; i < 8; i++) {
    waiting[i] = dh_raw_connect(f.d.socket); /* into the backlog */
    ASSERT(waiting[i] >= 0);
  }
  /* The connected client is served meanwhile (its units are in memory). */
  for (size_t k = 0; k < f.ref.n; k++) {
    larder_batch_t *b;
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    ASSERT_EQ(dh_batch_hash(b), f.ref.b[k].hash);
    larder_batch_release(b);
  }
  larder_batch_t *b;
  ASSERT_EQ(larder_stream_next(s, 60000 * dh_slow(), &b), LARDER_EEOF);
  larder_stream_close(s);
  usleep(300000);
  ASSERT_OK(prlimit(f.d.pid, RLIMIT_NOFILE, &old, NULL));
  /* The waiting clients are answered once descriptors are free. */
  for (int i = 0; i < 8; i++) {
    Larder__Frame *r = dh_raw_hello(waiting[i], WIRE_PROTOCOL_VERSION);
    ASSERT_NOT_NULL(r);
    ASSERT_EQ(r->msg_case, LARDER__FRAME__MSG_HELLO_REPLY);
    wire_free(r);
    close(waiting[i]);
  }
  /* The socket's path is still there for new clients (libuv unlinked a
   * path it bound when the listener closed). */
  larder_client_t *c2;
  ASSERT_OK(larder_client_connect(f.d.socket, &c2));
  larder_client_close(c2);
  /* A few warnings, not one per retry. */
  size_t len;
  char *log = (char *)test_read_file(f.d.log, &len);
  ASSERT_NOT_NULL(log);
  int warnings = 0;
  for (char *p = log; (p = strstr(p, "accept failed")) != NULL; p++) warnings++;
  free(log);
  fprintf(stderr, "%d accept warnings\n", warnings);
  ASSERT_GE(warnings, 1);
  ASSERT_LE(warnings, 10);
  larder_client_close(c);
  fx_finish(&f, 30000);
  return 0;
}

typedef struct churn {
  const char *socket;
  atomic_int stop;
  long connections;
} churn_t;

static uint64_t churn_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void *churn_main(void *p) {
  churn_t *ch = p;
  while (!ch->stop) {
    int fd = dh_raw_connect(ch->socket);
    if (fd < 0) continue;
    /* Half of them send the start of a frame before they hang up. */
    if (ch->connections & 1) (void)dh_raw_write(fd, "\x05\x00", 2);
    close(fd);
    ch->connections++;
  }
  return NULL;
}

/*
 * A client that connects and hangs up in a tight loop, saying nothing (or
 * half a frame).  libuv accepted for as long as connections kept coming,
 * and the hang-ups were never read: within seconds the dead connections
 * held max_clients and thousands of descriptors, and every other client
 * was refused.  Now the daemon's descriptors stay near their baseline,
 * every other client that connects meanwhile is answered, and the good
 * client's streams are unaffected.
 */
TEST_IMPL(daemon_robust_connect_churn) {
  fixture f;
  fx_start(&f, NULL, 1);
  churn_t ch = {f.d.socket, 0, 0};
  pthread_t th;
  ASSERT_OK(pthread_create(&th, NULL, churn_main, &ch));
  int most_fds = 0, answered = 0, refused = 0;
  char why[1024] = "";
  uint64_t end = churn_now_ms() + 3000;
  while (churn_now_ms() < end) {
    int fds = dh_fd_count(f.d.pid);
    if (fds > most_fds) most_fds = fds;
    larder_client_t *c;
    int rc = larder_client_connect(f.d.socket, &c);
    if (rc == 0) {
      answered++;
      larder_client_close(c);
    } else {
      refused++;
      snprintf(why, sizeof(why), "%s", larder_strerror(rc));
    }
    usleep(10000);
  }
  ch.stop = 1;
  pthread_join(th, NULL);
  fprintf(stderr,
          "%ld connections churned; %d clients answered, %d refused; at most %d fds "
          "(baseline %d)\n",
          ch.connections, answered, refused, most_fds, f.fds0);
  if (refused) ASSERT_FAIL_("%d of %d clients were refused: %s", refused, answered + refused, why);
  ASSERT_GE(ch.connections, 1000);
  ASSERT_LE(most_fds, f.fds0 + 300);
  /* The churned connections are gone once it stops. */
  ASSERT_LE(dh_wait_fds(f.d.pid, f.fds0 + 4, 10000 * dh_slow()), f.fds0 + 4);
  fx_finish(&f, 30000);
  return 0;
}

/* 4096 requests the daemon refuses at once with an Error frame (no
 * sources, batch size 0), back to back: *total bytes, each of *one_len. */
static uint8_t *refused_requests(size_t *total, size_t *one_len) {
  size_t len;
  uint8_t *one = dh_open_frame(7, NULL, 0, 0, &len);
  size_t per = 4096;
  uint8_t *many = malloc(per * len);
  ASSERT_NOT_NULL(many);
  for (size_t i = 0; i < per; i++) memcpy(many + i * len, one, len);
  free(one);
  *total = per * len;
  if (one_len) *one_len = len;
  return many;
}

/* Sends many (total bytes) round and round without blocking until the
 * daemon stops reading (no room for 500 ms) or 20 s pass.  Returns whether
 * it stopped; *sent counts the bytes sent. */
static int pour_until_blocked(int fd, const uint8_t *many, size_t total, uint64_t *sent) {
  double deadline = test_now_ms() + 20000.0 * dh_slow();
  int blocked = 0;
  size_t at = 0;
  *sent = 0;
  while (!blocked && test_now_ms() < deadline) {
    ssize_t n = send(fd, many + at, total - at, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      *sent += (uint64_t)n;
      at = (at + (size_t)n) % total;
      continue;
    }
    ASSERT(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
    struct pollfd p = {fd, POLLOUT, 0};
    blocked = poll(&p, 1, 500) == 0; /* the daemon stopped reading */
  }
  return blocked;
}

/*
 * A client that sends requests and never reads the answers: once its
 * unread answers pass a bound the daemon stops reading its requests, so
 * its sends block, the daemon's memory stays flat, and the other clients
 * carry on.  (Without the bound the write queue would grow by gigabytes in
 * seconds.)
 */
TEST_IMPL(daemon_robust_unread_replies) {
  fixture f;
  fx_start(&f, NULL, 1);
  int fd = hello_conn(&f);
  size_t total, len;
  uint8_t *many = refused_requests(&total, &len);
  long rss0 = dh_rss_kb(f.d.pid);
  uint64_t sent;
  int blocked = pour_until_blocked(fd, many, total, &sent);
  long rss = dh_rss_kb(f.d.pid);
  fprintf(stderr, "sent %llu bytes of requests (%llu requests); blocked %d; RSS %ld -> %ld kB\n",
          (unsigned long long)sent, (unsigned long long)(sent / len), blocked, rss0, rss);
  ASSERT(blocked);
  if (!dh_asan()) ASSERT_LE(rss - rss0, 128 * 1024);
  free(many);
  close(fd);
  fx_finish(&f, 150000);
  return 0;
}

/* Fills fd's socket with Error replies the client never reads: requests
 * the daemon refuses at once (no sources), sent until the daemon's write
 * queue holds some too. */
static void fill_with_errors(int fd) {
  size_t total;
  uint8_t *many = refused_requests(&total, NULL);
  for (int k = 0; k < 3; k++) ASSERT_OK(dh_raw_write(fd, many, total));
  free(many);
  usleep(300000);
}

static void send_close_stream(int fd, uint32_t stream_id) {
  Larder__CloseStream cs = LARDER__CLOSE_STREAM__INIT;
  cs.stream_id = stream_id;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_CLOSE_STREAM;
  f.close_stream = &cs;
  ASSERT_OK(dh_raw_send(fd, &f));
}

/*
 * A client that stops reading with a stream's reply (which carries its
 * shared memory) queued behind a full socket.  What holds (conn.c): the
 * bytes queued behind such a reply count in the backlog, or the daemon
 * would never stop reading the client's requests, and a list walked on
 * every append would stall its loop for seconds for every client; a
 * stream closed before its reply goes out takes the unsent reply (and its
 * memfd) with it, and a client has at most CONN_MAX_PENDING_FD_FRAMES such
 * replies waiting, or a client could pile up memfds and shared memory past
 * every limit; a send that fails does not close the connection under a
 * stream still using it (stream_fail); and the other clients carry on
 * throughout.
 */
TEST_IMPL(daemon_robust_unread_stream_replies) {
  fixture f;
  /* No background client: part 2 counts the streams this connection
   * opens.  The good client runs between the parts instead. */
  fx_start(&f, NULL, 0);
  char *src[1] = {f.dir};
  size_t olen;
  uint8_t *open = dh_open_frame(1, src, 1, 64, &olen);

  /* 1. Requests after a queued reply: the daemon stops reading them. */
  int fd = hello_conn(&f);
  fill_with_errors(fd);
  ASSERT_OK(dh_raw_write(fd, open, olen));
  usleep(300000);
  size_t total;
  uint8_t *many = refused_requests(&total, NULL);
  uint64_t sent;
  ASSERT(pour_until_blocked(fd, many, total, &sent));
  free(many);
  double t0 = test_now_ms();
  free(dh_admin(&f.d, "status"));
  double took = test_now_ms() - t0;
  fprintf(stderr, "the daemon stopped reading; another client's status took %.0f ms\n", took);
  ASSERT_LE(took, 500.0 * dh_slow());
  dh_run good = {0};
  good.check_rows = 1;
  ASSERT_OK(dh_collect(f.d.socket, &f.o, 0, &good));
  ASSERT_EQ(good.n, f.ref.n);
  dh_run_free(&good);
  close(fd);

  /* 2. Streams opened and closed with their replies unread. */
  fd = hello_conn(&f);
  fill_with_errors(fd);
  usleep(200000);
  int memfds0 = dh_memfd_count(f.d.pid);
  for (uint32_t id = 1; id <= 60; id++) {
    /* Closed once open (the id is the connection's next one). */
    uint64_t opened = dh_stat(&f.d, "streams_opened");
    ASSERT_OK(dh_raw_write(fd, open, olen));
    double until = test_now_ms() + 10000.0 * dh_slow();
    while (dh_stat(&f.d, "streams_opened") == opened && test_now_ms() < until) usleep(1000);
    send_close_stream(fd, id);
  }
  usleep(300000);
  int memfds = dh_memfd_count(f.d.pid);
  fprintf(stderr, "60 streams opened and closed unread: daemon memfds %d (%d before)\n", memfds,
          memfds0);
  ASSERT_LE(memfds, memfds0 + 4);
  /* And opens never closed: at most CONN_MAX_PENDING_FD_FRAMES replies wait
   * (each with an arena and a ring); the rest are refused. */
  for (uint32_t k = 0; k < 100; k++) ASSERT_OK(dh_raw_write(fd, open, olen));
  usleep(500000);
  memfds = dh_memfd_count(f.d.pid);
  fprintf(stderr, "100 opens unread: daemon memfds %d\n", memfds);
  ASSERT_LE(memfds, memfds0 + 4 * 64 + 4);
  close(fd);

  /* 3. A stream that fails while its connection is stuck, and the client
   * goes away at once. */
  for (int round = 0; round < 3; round++) {
    fd = hello_conn(&f);
    fill_with_errors(fd);
    ASSERT_OK(dh_raw_write(fd, open, olen));
    usleep(300000);
    Larder__Release r = LARDER__RELEASE__INIT;
    r.stream_id = 1;
    r.seq = 12345; /* never sent: fails the stream */
    Larder__Frame fr = LARDER__FRAME__INIT;
    fr.msg_case = LARDER__FRAME__MSG_RELEASE;
    fr.release = &r;
    ASSERT_OK(dh_raw_send(fd, &fr));
    close(fd);
    usleep(100000);
    ASSERT(dh_alive(&f.d));
  }
  free(open);
  fx_finish(&f, 150000);
  return 0;
}

/*
 * A client that begins a frame and never finishes it is disconnected after
 * frame_timeout, with an error saying why, and the memory the frame held
 * is freed.  (Otherwise it could hold up to max_frame bytes, and one of its
 * uid's connections, for ever.)  Other clients carry on.
 */
TEST_IMPL(daemon_robust_partial_frame) {
  static const char *const fl[] = {"--frame_timeout=1", NULL};
  fixture f;
  fx_start(&f, fl, 1);
  for (int round = 0; round < 3; round++) {
    int fd = hello_conn(&f);
    /* A length prefix of 1 MiB, then a part of the frame. */
    uint8_t part[4096];
    memset(part, 0, sizeof(part));
    part[2] = 0x10; /* little-endian 0x100000 */
    ASSERT_OK(dh_raw_write(fd, part, sizeof(part)));
    double t0 = test_now_ms();
    int code = 0;
    ASSERT(dh_raw_wait_closed(fd, (int)(10000 * dh_slow()), &code));
    double waited = test_now_ms() - t0;
    fprintf(stderr, "round %d: closed after %.0f ms with %s\n", round, waited,
            larder_err_name(code));
    ASSERT_EQ(code, LARDER_EPROTO);
    ASSERT_DOUBLE_GE(waited, 900.0);
    close(fd);
  }
  fx_finish(&f, 30000);
  return 0;
}

/*
 * Connections that never say Hello are closed after hello_timeout, with an
 * error saying why, and give their places back; until then they count
 * against their user's max_clients_per_uid, so that no user can hold more
 * than that many (four users with 256 each would hold all of a max_clients
 * of 1024).  Another user's client streams meanwhile.
 */
TEST_IMPL(daemon_robust_no_hello) {
  if (geteuid() != 0) {
    fprintf(stderr, "needs root, to connect as another user\n");
    return TEST_SKIP;
  }
  static const char *const fl[] = {"--hello_timeout=1", "--max_clients_per_uid=3",
                                   "--socket_mode=0666", NULL};
  fixture f;
  fx_start(&f, fl, 0);
  ASSERT_OK(chmod(test_tmpdir(), 0755));
  ASSERT_OK(chmod(f.d.dir, 0755));
  /* The user without a Hello is a child as nobody, forked before the good
   * client's thread starts (a fork copies only the calling thread). */
  int p[2];
  ASSERT_OK(pipe(p));
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    double t0 = test_now_ms();
    int h[3];
    for (int i = 0; i < 3; i++) h[i] = dh_raw_connect(f.d.socket);
    /* A fourth connection of the user is one too many, Hello or not. */
    int x = dh_raw_connect(f.d.socket), x_code = 0;
    int x_closed = dh_raw_wait_closed(x, 10000 * dh_slow(), &x_code);
    close(x);
    int codes[3] = {0, 0, 0}, closed = 0;
    double waited = 1e9;
    for (int i = 0; i < 3; i++) {
      closed += dh_raw_wait_closed(h[i], 10000 * dh_slow(), &codes[i]);
      double w = test_now_ms() - t0;
      if (w < waited) waited = w;
      close(h[i]);
    }
    /* Their places are free again. */
    int y = dh_raw_connect(f.d.socket);
    Larder__Frame *r = dh_raw_hello(y, WIRE_PROTOCOL_VERSION);
    int hello_ok = r != NULL && r->msg_case == LARDER__FRAME__MSG_HELLO_REPLY;
    wire_free(r);
    close(y);
    char out[200];
    snprintf(out, sizeof(out), "%d %d %d %d %d %d %d %.0f", x_closed, x_code, closed, codes[0],
             codes[1], codes[2], hello_ok, waited);
    if (write(p[1], out, strlen(out) + 1) < 0) _exit(3);
    _exit(0);
  }
  close(p[1]);
  f.bg.socket = f.d.socket;
  f.bg.o = f.o;
  f.bg.ref = &f.ref;
  ASSERT_OK(pthread_create(&f.bg.th, NULL, bg_main, &f.bg));
  char buf[200] = "";
  ssize_t n = read(p[0], buf, sizeof(buf) - 1);
  close(p[0]);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  if (n <= 0) {
    dh_print_log(&f.d);
    ASSERT_FAIL_("the client without a Hello died (status 0x%x)", st);
  }
  fprintf(stderr, "nobody's client: %s\n", buf);
  int x_closed, x_code, closed, c0, c1, c2, hello_ok;
  double waited;
  ASSERT_EQ(sscanf(buf, "%d %d %d %d %d %d %d %lf", &x_closed, &x_code, &closed, &c0, &c1, &c2,
                   &hello_ok, &waited),
            8);
  ASSERT_EQ(x_closed, 1);
  ASSERT_EQ(x_code, LARDER_ELIMIT);
  ASSERT_EQ(closed, 3);
  ASSERT_EQ(c0, LARDER_ETIMEDOUT);
  ASSERT_EQ(c1, LARDER_ETIMEDOUT);
  ASSERT_EQ(c2, LARDER_ETIMEDOUT);
  ASSERT_DOUBLE_GE(waited, 1000.0);
  ASSERT_EQ(hello_ok, 1);
  /* One line for the three, whenever the daemon's log reaches the file. */
  const char *line = "sent no Hello within hello_timeout (1 s; the last from uid 65534)";
  char *log = NULL;
  for (double end = test_now_ms() + 10000.0 * dh_slow();; usleep(10000)) {
    free(log);
    log = dh_read_log(&f.d);
    if ((log && strstr(log, line)) || test_now_ms() > end) break;
  }
  ASSERT_STR_CONTAINS(log, line);
  free(log);
  fx_finish(&f, 150000);
  return 0;
}

static void copy_file(const char *from, const char *to, size_t keep) {
  size_t len;
  uint8_t *p = test_read_file(from, &len);
  ASSERT_NOT_NULL(p);
  if (keep > len) keep = len;
  FILE *out = fopen(to, "wb");
  ASSERT_NOT_NULL(out);
  ASSERT_EQ(fwrite(p, 1, keep, out), keep);
  fclose(out);
  free(p);
}

/* Finishes pf and writes it to path. */
static void write_pqw_file(pqw_file *pf, const char *path) {
  size_t len;
  uint8_t *data = pqw_file_finish(pf, &len);
  FILE *out = fopen(path, "wb");
  ASSERT_NOT_NULL(out);
  ASSERT_EQ(fwrite(data, 1, len, out), len);
  fclose(out);
  free(data);
}

/* Writes a file of 3 rows of an INT64 column 'id' and a required column
 * `second` of physical type `physical`, whose row group claims
 * `claimed_rows` rows and whose column chunks claim `claimed_values`
 * values each (0: the 3 they hold). */
static void write_id_file_claiming(const char *path, const char *second, int physical,
                                   int64_t claimed_rows, int64_t claimed_values) {
  pqw_schema sch[3] = {pqw_root(2), pqw_leaf("id", PQ_INT64, PQ_REQUIRED),
                       pqw_leaf(second, physical, PQ_REQUIRED)};
  pqw_file pf;
  pqw_file_init(&pf, sch, 3);
  int64_t ids[3] = {1, 2, 3}, longs[3] = {4, 5, 6};
  int32_t ints[3] = {7, 8, 9};
  double doubles[3] = {0.5, 1.5, 2.5};
  pqw_values v[2];
  memset(v, 0, sizeof(v));
  v[0].physical = PQ_INT64, v[0].fixed = ids, v[0].count = 3;
  v[1].physical = physical, v[1].count = 3;
  v[1].fixed = physical == PQ_DOUBLE  ? (void *)doubles
               : physical == PQ_INT32 ? (void *)ints
                                      : (void *)longs;
  pqw_chunk_opts co;
  memset(&co, 0, sizeof(co));
  pqw_chunk ch[2];
  for (int i = 0; i < 2; i++) pqw_chunk_build(&ch[i], &v[i], NULL, &co);
  pqw_file_add_row_group(&pf, claimed_rows, ch, 2);
  for (int i = 0; i < 2; i++) pqw_chunk_free(&ch[i]);
  if (claimed_values)
    for (int i = 0; i < 2; i++) pf.rg[0].cols[i].num_values = claimed_values;
  write_pqw_file(&pf, path);
}

/* Writes a file of 10 rows of an optional INT32 column 'a' whose one
 * page claims 2^30 values: a single RLE run of nulls, a few bytes. */
static void write_huge_page_file(const char *path) {
  pqw_schema sch[2] = {pqw_root(1), pqw_leaf("a", PQ_INT32, PQ_OPTIONAL)};
  pqw_file pf;
  pqw_file_init(&pf, sch, 2);
  pqw_chunk c;
  pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
  pqw_buf body = {0}, lv = {0};
  pqw_uvarint(&lv, (uint64_t)1 << 31); /* an RLE run of 2^30 zeros */
  pqw_u8(&lv, 0);
  pqw_le32(&body, (uint32_t)lv.len);
  pqw_put(&body, lv.data, lv.len);
  pqw_page h;
  pqw_page_init(&h, PQ_PAGE_DATA);
  h.num_values = 1 << 30;
  h.encoding = PQ_ENC_PLAIN;
  pqw_chunk_page_raw(&c, &h, body.data, body.len, 0);
  pqw_file_add_row_group(&pf, 10, &c, 1);
  pqw_chunk_free(&c);
  pqw_buf_free(&body);
  pqw_buf_free(&lv);
  write_pqw_file(&pf, path);
}

/* The same, a truthful 3-row file. */
static void write_id_file(const char *path, const char *second, int physical) {
  write_id_file_claiming(path, second, physical, 3, 0);
}

/*
 * Sources with no rows: a file of zero rows (a schema, no row groups) read
 * alone fails the open with LARDER_EINVAL, saying the dataset has no rows;
 * beside a file with rows it adds nothing, and the stream serves the other
 * file's rows, every epoch.  Other clients carry on.
 */
TEST_IMPL(daemon_robust_empty_dataset) {
  fixture f;
  fx_start(&f, NULL, 1);
  char dir[1100], empty[1200], rows[1200];
  snprintf(dir, sizeof(dir), "%s/some-empty", test_tmpdir());
  ASSERT_OK(mkdir(dir, 0755));
  snprintf(empty, sizeof(empty), "%s/a-empty.parquet", dir);
  snprintf(rows, sizeof(rows), "%s/b-rows.parquet", dir);
  pqw_schema sch[3] = {pqw_root(2), pqw_leaf("id", PQ_INT64, PQ_REQUIRED),
                       pqw_leaf("x", PQ_INT64, PQ_REQUIRED)};
  pqw_file pf;
  pqw_file_init(&pf, sch, 3);
  write_pqw_file(&pf, empty);
  write_id_file(rows, "x", PQ_INT64);
  const char *alone[1] = {empty}, *both[1] = {dir};
  larder_stream_options_t o;
  dh_opts(&o, alone, 2, 1, 1);
  dh_run r = {0};
  ASSERT_EQ(dh_collect(f.d.socket, &o, 0, &r), LARDER_EINVAL);
  fprintf(stderr, "the open: %s\n", r.err);
  ASSERT_STR_CONTAINS(r.err, "has no rows");
  dh_run_free(&r);
  larder_stream_options_t ob;
  dh_opts(&ob, both, 1, 1, 2);
  dh_run rb = {0};
  ASSERT_OK(dh_collect(f.d.socket, &ob, 0, &rb));
  uint64_t served = 0;
  for (size_t i = 0; i < rb.n; i++) served += (uint64_t)rb.b[i].rows;
  ASSERT_EQ(served, 6); /* 3 rows, 2 epochs */
  dh_run_free(&rb);
  fx_finish(&f, 150000);
  return 0;
}

/*
 * A footer that claims 2^30 rows for a few bytes of data (each column chunk
 * holds 3 values): the open fails, naming the file and the column, before
 * anything is planned for a billion rows.  (Believing the count, the
 * daemon would make the whole dataset one shuffle window and allocate
 * gigabytes for its permutation: 4.4 GB of RSS against a memory_limit of
 * 64 MB.)  Columns that agree with a claim of 2^62 values, and a page that
 * claims 2^30, fail naming the file, the column and the row group, without
 * advising a unit_rows that could not help.  The daemon's memory stays flat
 * and other clients carry on.
 */
TEST_IMPL(daemon_robust_huge_row_count) {
  static const char *const fl[] = {"--max_chunk_decoded_bytes=64M", NULL};
  fixture f;
  fx_start(&f, fl, 1);
  char path[1200];
  snprintf(path, sizeof(path), "%s/liar.parquet", test_tmpdir());
  write_id_file_claiming(path, "x", PQ_INT64, 1ll << 30, 0);
  long rss0 = dh_rss_kb(f.d.pid);
  const char *src[1] = {path};
  larder_stream_options_t o;
  dh_opts(&o, src, 64, 1, 1);
  for (int round = 0; round < 3; round++) {
    dh_run r = {0};
    ASSERT_EQ(dh_collect(f.d.socket, &o, 0, &r), LARDER_ECORRUPT);
    if (round == 0) fprintf(stderr, "the open: %s\n", r.err);
    ASSERT_STR_CONTAINS(r.err, "liar.parquet");
    ASSERT_STR_CONTAINS(r.err, "claims 1073741824 rows");
    dh_run_free(&r);
  }
  /* Columns that agree with the lie, 2^62 values in a few bytes: the open
   * fails naming the file, the column and the row group, and does not
   * advise a unit_rows that no setting could satisfy. */
  char huge[1200];
  snprintf(huge, sizeof(huge), "%s/liar62.parquet", test_tmpdir());
  write_id_file_claiming(huge, "x", PQ_INT64, 1ll << 62, 1ll << 62);
  const char *hsrc[1] = {huge};
  larder_stream_options_t ho;
  dh_opts(&ho, hsrc, 64, 1, 1);
  dh_run hr = {0};
  int hrc = dh_collect(f.d.socket, &ho, 0, &hr);
  fprintf(stderr, "the open of 2^62 values: %s\n", hr.err);
  ASSERT_EQ(hrc, LARDER_ECORRUPT);
  ASSERT_STR_CONTAINS(hr.err, "liar62.parquet");
  ASSERT_STR_CONTAINS(hr.err, "column 'id'");
  ASSERT_STR_CONTAINS(hr.err, "row group 0");
  ASSERT_STR_CONTAINS(hr.err, "4611686018427387904 values");
  ASSERT(strstr(hr.err, "unit_rows") == NULL);
  dh_run_free(&hr);
  /* A page that claims 2^30 nulls in a few bytes: its levels alone pass
   * max_chunk_decoded_bytes, so the unit fails naming the file, the column
   * and the row group, without advice about smaller units. */
  char pg[1200];
  snprintf(pg, sizeof(pg), "%s/liar-page.parquet", test_tmpdir());
  write_huge_page_file(pg);
  const char *psrc[1] = {pg};
  larder_stream_options_t po;
  dh_opts(&po, psrc, 4, 1, 1);
  dh_run pr = {0};
  int prc = dh_collect(f.d.socket, &po, 0, &pr);
  fprintf(stderr, "the stream of a page of 2^30 values: %s\n", pr.err);
  ASSERT_EQ(prc, LARDER_ELIMIT);
  ASSERT_STR_CONTAINS(pr.err, "liar-page.parquet: column 'a', row group 0: ");
  ASSERT_STR_CONTAINS(pr.err, "max_chunk_decoded_bytes");
  ASSERT(strstr(pr.err, "unit_rows") == NULL);
  dh_run_free(&pr);
  long rss = dh_rss_kb(f.d.pid);
  fprintf(stderr, "daemon RSS %ld -> %ld kB\n", rss0, rss);
  ASSERT_LE(rss - rss0, 64 * 1024 * dh_slow());
  fx_finish(&f, 150000);
  return 0;
}

/*
 * Corrupt and truncated Parquet files: a truncated file and a file that is
 * no Parquet at all fail the open naming the file; a file whose footer is
 * fine but whose pages are damaged fails the stream when it gets there,
 * with an error naming the file (the page CRCs catch it), and never serves
 * the damaged rows.
 */
TEST_IMPL(daemon_robust_corrupt_file) {
  fixture f;
  fx_start(&f, NULL, 1);
  char dir[1200];
  snprintf(dir, sizeof(dir), "%s/bad", test_tmpdir());
  ASSERT_OK(test_system("mkdir -p '%s' && cp '%s'/part-001.parquet '%s'/part-003.parquet '%s'/",
                        dir, f.dir, f.dir, dir));
  char good0[1200], trunc[1200], notpq[1200], damaged[1300];
  snprintf(good0, sizeof(good0), "%s/part-000.parquet", f.dir);
  snprintf(trunc, sizeof(trunc), "%s/truncated.parquet", test_tmpdir());
  snprintf(notpq, sizeof(notpq), "%s/text.parquet", test_tmpdir());
  snprintf(damaged, sizeof(damaged), "%s/part-002.parquet", dir);
  struct stat st;
  ASSERT_OK(stat(good0, &st));
  copy_file(good0, trunc, (size_t)st.st_size / 2);
  FILE *t = fopen(notpq, "w");
  fputs("id,label\n1,2\n", t);
  fclose(t);
  /* Damage the middle of the pages of one file of the dataset. */
  copy_file(good0, damaged, (size_t)st.st_size);
  {
    size_t len;
    uint8_t *p = test_read_file(damaged, &len);
    for (size_t i = len / 4; i < len / 4 + 64; i++) p[i] ^= 0x5a;
    for (size_t i = len / 2; i < len / 2 + 64; i++) p[i] ^= 0xa5;
    FILE *out = fopen(damaged, "wb");
    ASSERT_EQ(fwrite(p, 1, len, out), len);
    fclose(out);
    free(p);
  }
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(f.d.socket, &c));
  for (int round = 0; round < 3; round++) {
    const char *bad[2] = {trunc, notpq};
    for (int i = 0; i < 2; i++) {
      larder_stream_options_t o = f.o;
      const char *src[2] = {f.dir, bad[i]};
      o.sources = src;
      o.num_sources = 2;
      larder_stream_t *s;
      int rc = larder_stream_open(c, &o, &s);
      ASSERT(rc < 0);
      ASSERT_STR_CONTAINS(larder_client_last_error(c), bad[i]);
    }
    /* The damaged file: the open succeeds (its footer is intact); the
     * stream fails when it reaches the damaged pages. */
    larder_stream_options_t o = f.o;
    const char *src[1] = {dir};
    o.sources = src;
    o.epochs = 1;
    o.seed = (uint64_t)round;
    larder_stream_t *s;
    ASSERT_OK(larder_stream_open(c, &o, &s));
    int rc;
    larder_batch_t *b;
    uint64_t n = 0;
    while ((rc = larder_stream_next(s, 60000 * dh_slow(), &b)) == 0) {
      /* What it serves before that is right. */
      for (int64_t i = 0; i < larder_batch_num_rows(b); i++) dh_expect_row(b, i, 0);
      larder_batch_release(b);
      n++;
    }
    ASSERT(rc != LARDER_EEOF && rc != LARDER_ETIMEDOUT);
    ASSERT_STR_CONTAINS(larder_client_last_error(c), "part-002.parquet");
    fprintf(stderr, "damaged file: %s after %" PRIu64 " batches: %s\n", larder_err_name(rc), n,
            larder_client_last_error(c));
    larder_stream_close(s);
  }
  /* Files whose columns differ cannot make one dataset: the error names
   * the odd file and the column, whether a type differs or one file has a
   * column more. */
  {
    char odd[1200], wide[1200];
    snprintf(odd, sizeof(odd), "%s/odd.parquet", test_tmpdir());
    snprintf(wide, sizeof(wide), "%s/wide.parquet", test_tmpdir());
    write_id_file(odd, "label", PQ_DOUBLE);
    write_id_file(wide, "label", PQ_INT32);
    static const char *const cols[] = {"id", "label"};
    larder_stream_options_t o = f.o;
    const char *src[2] = {f.dir, odd};
    o.sources = src;
    o.num_sources = 2;
    o.columns = cols;
    o.num_columns = 2;
    larder_stream_t *s;
    int rc = larder_stream_open(c, &o, &s);
    ASSERT(rc < 0);
    ASSERT_STR_CONTAINS(larder_client_last_error(c), "odd.parquet");
    ASSERT_STR_CONTAINS(larder_client_last_error(c), "column 'label' is ");
    ASSERT_STR_CONTAINS(larder_client_last_error(c), "float64");
    /* All columns: the fixture's files have no 'extra'. */
    write_id_file(wide, "extra", PQ_INT64);
    src[1] = wide;
    o.columns = NULL;
    o.num_columns = 0;
    rc = larder_stream_open(c, &o, &s);
    ASSERT(rc < 0);
    fprintf(stderr, "columns differ: %s\n", larder_client_last_error(c));
    ASSERT_STR_CONTAINS(larder_client_last_error(c), "wide.parquet");
    ASSERT_STR_CONTAINS(larder_client_last_error(c), "'extra'");
    ASSERT_STR_CONTAINS(larder_client_last_error(c), "must share the projected schema");
  }
  /* The client still works. */
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &f.o, &s));
  larder_batch_t *b;
  ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
  ASSERT_EQ(dh_batch_hash(b), f.ref.b[0].hash);
  larder_batch_release(b);
  larder_stream_close(s);
  larder_client_close(c);
  fx_finish(&f, 30000);
  return 0;
}

/* Reads frames until a Batch comes; returns it (the caller frees). */
static Larder__Frame *next_batch_frame(int fd) {
  for (;;) {
    int rc;
    Larder__Frame *fr = dh_raw_recv(fd, 30000 * dh_slow(), NULL, NULL, &rc);
    ASSERT_NOT_NULL(fr);
    if (fr->msg_case == LARDER__FRAME__MSG_BATCH) return fr;
    wire_free(fr);
  }
}

static void send_release(int fd, uint32_t stream, uint64_t seq) {
  Larder__Release rel = LARDER__RELEASE__INIT;
  rel.stream_id = stream;
  rel.seq = seq;
  Larder__Frame fr = LARDER__FRAME__INIT;
  fr.msg_case = LARDER__FRAME__MSG_RELEASE;
  fr.release = &rel;
  send_msg(fd, &fr);
}

/* An admin request on the connection still gets its answer. */
static void expect_conn_works(int fd) {
  Larder__AdminRequest ar = LARDER__ADMIN_REQUEST__INIT;
  ar.request_id = 42;
  ar.command = (char *)"stats";
  ar.json = 1;
  Larder__Frame fr = LARDER__FRAME__INIT;
  fr.msg_case = LARDER__FRAME__MSG_ADMIN_REQUEST;
  fr.admin_request = &ar;
  send_msg(fd, &fr);
  for (;;) {
    int rc;
    Larder__Frame *r = dh_raw_recv(fd, 30000 * dh_slow(), NULL, NULL, &rc);
    if (r == NULL) ASSERT_FAIL_("the connection ended (%s)", larder_err_name(rc));
    int done = r->msg_case == LARDER__FRAME__MSG_ADMIN_REPLY && r->admin_reply->request_id == 42;
    wire_free(r);
    if (done) return;
  }
}

/*
 * Releases of batches never sent (a future seq, a seq released twice)
 * fail that stream with EPROTO; releases for streams the connection does
 * not own (another connection's, or none) are ignored; the connection
 * itself keeps working.
 */
TEST_IMPL(daemon_robust_bad_release) {
  fixture f;
  fx_start(&f, NULL, 1);
  for (int round = 0; round < 5; round++) {
    int fd = hello_conn(&f);
    int arena = -1;
    Larder__Frame *r = dh_raw_open(fd, 1, &f.o, &arena);
    ASSERT_NOT_NULL(r);
    ASSERT_EQ(r->msg_case, LARDER__FRAME__MSG_OPEN_STREAM_REPLY);
    uint32_t sid = r->open_stream_reply->stream_id;
    wire_free(r);
    ASSERT(arena >= 0);
    close(arena);
    Larder__Frame *b = next_batch_frame(fd);
    ASSERT_EQ(b->batch->seq, 0);
    wire_free(b);
    /* Another stream id: ignored. */
    send_release(fd, sid + 100, 0);
    if (round % 2 == 0) {
      send_release(fd, sid, 0);
      send_release(fd, sid, 0); /* twice */
    } else {
      send_release(fd, sid, 12345); /* never sent */
    }
    /* One Error for the stream, and the connection stays. */
    for (;;) {
      int rc;
      Larder__Frame *e = dh_raw_recv(fd, 30000 * dh_slow(), NULL, NULL, &rc);
      ASSERT_NOT_NULL(e);
      if (e->msg_case == LARDER__FRAME__MSG_ERROR) {
        ASSERT_EQ(e->error->code, LARDER_EPROTO);
        ASSERT_EQ(e->error->stream_id, sid);
        ASSERT_STR_CONTAINS(e->error->message, "release");
        wire_free(e);
        break;
      }
      wire_free(e);
    }
    expect_conn_works(fd);
    /* The stream is gone: more releases for it are harmless. */
    send_release(fd, sid, 1);
    expect_conn_works(fd);
    /* Releases aimed at the good client's stream (id 1 on its own
     * connection) from this connection touch nothing. */
    send_release(fd, 1, 0);
    send_release(fd, 1, 1);
    expect_conn_works(fd);
    close(fd);
  }
  fx_finish(&f, 30000);
  return 0;
}

/* Waits until the daemon has published n descriptors in the ring. */
static void wait_published(ring_header_t *h, uint64_t n) {
  double deadline = test_now_ms() + 30000.0 * dh_slow();
  while (atomic_load(&h->published) < n) {
    if (test_now_ms() > deadline)
      ASSERT_FAIL_("the ring has %llu descriptors, not %llu",
                   (unsigned long long)atomic_load(&h->published), (unsigned long long)n);
    usleep(1000);
  }
}

/* Writes a release entry as liblarder does. */
/* Writes a release entry where the daemon made the ring's entries (the
 * layout as it was passed: round 4 rewrites the header's copy). */
static ring_layout_t passed_layout;

static void ring_put_release(ring_header_t *h, uint64_t *released, uint64_t seq) {
  ring_release_t *e = ring_layout_release(&passed_layout, *released);
  e->seq = seq;
  e->wait_ns = 1000;
  e->compute_ns = 1000;
  atomic_store(&h->released, ++*released);
}

static void send_wake(int fd, uint32_t stream) {
  Larder__Wake wk = LARDER__WAKE__INIT;
  wk.stream_id = stream;
  Larder__Frame fr = LARDER__FRAME__INIT;
  fr.msg_case = LARDER__FRAME__MSG_WAKE;
  fr.wake = &wk;
  send_msg(fd, &fr);
}

/* Reads frames until one of kind msg_case for the stream; returns it. */
static Larder__Frame *expect_frame(int fd, Larder__Frame__MsgCase msg_case, uint32_t stream) {
  for (;;) {
    int rc;
    Larder__Frame *e = dh_raw_recv(fd, 30000 * dh_slow(), NULL, NULL, &rc);
    if (e == NULL)
      ASSERT_FAIL_("no frame of kind %d came (%s)", (int)msg_case, larder_err_name(rc));
    if (e->msg_case == msg_case &&
        (msg_case != LARDER__FRAME__MSG_ERROR || e->error->stream_id == stream) &&
        (msg_case != LARDER__FRAME__MSG_WAKE || e->wake->stream_id == stream))
      return e;
    wire_free(e);
  }
}

/*
 * A client that writes nonsense into its stream's descriptor ring (see
 * client/ring.h) fails that stream with EPROTO: a release of a batch it
 * does not hold, one released twice, a count of more releases than batches
 * it holds, the whole ring overwritten with 0xff.  The connection, the
 * daemon and a good client carry on, and no memfd is left behind.  Also
 * checked: the ring protocol itself, spoken by hand (descriptors within
 * the window, wake_at, a Wake frame to a client that said it sleeps), and
 * that neither memfd can be shrunk nor the arena mapped writable.
 */
TEST_IMPL(daemon_robust_bad_ring) {
  fixture f;
  fx_start(&f, NULL, 1);
  larder_stream_options_t o = f.o;
  o.window = 2;
  for (int round = 0; round < 5; round++) {
    int fd = hello_conn(&f);
    int arena = -1, rfd = -1;
    Larder__Frame *r = dh_raw_open_ring(fd, 1, &o, &arena, &rfd);
    ASSERT_NOT_NULL(r);
    ASSERT_EQ(r->msg_case, LARDER__FRAME__MSG_OPEN_STREAM_REPLY);
    uint32_t sid = r->open_stream_reply->stream_id;
    uint64_t ring_bytes = r->open_stream_reply->ring_bytes;
    uint64_t arena_bytes = r->open_stream_reply->arena_bytes;
    wire_free(r);
    ASSERT(arena >= 0);
    ASSERT(rfd >= 0);
    ASSERT_GT(ring_bytes, 0);
    /* Sealed: the client cannot make the daemon fault, nor write batches. */
    ASSERT(mmap(NULL, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, arena, 0) == MAP_FAILED);
    ASSERT_NE(ftruncate(arena, 0), 0);
    ASSERT_NE(ftruncate(rfd, 0), 0);
    ring_header_t *h = mmap(NULL, ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, rfd, 0);
    ASSERT(h != MAP_FAILED);
    ASSERT(ring_valid(h, ring_bytes, h->num_layout));
    ASSERT_EQ(h->slots, 2);
    ring_layout_init(&passed_layout, h);
    /* The window's two batches come through the ring, and no more: the
     * daemon waits for a release, and says so. */
    wait_published(h, 2);
    for (uint64_t i = 0; i < 2; i++) {
      const ring_desc_t *d = ring_desc(h, i);
      ASSERT_EQ(d->seq, i);
      ASSERT_GT(d->num_rows, 0);
      ASSERT_LE(d->arena_offset + d->arena_length, arena_bytes);
    }
    /* A fresh ring counts as asleep (an event loop may poll the socket
     * before its first call): the first descriptors came with a Wake. */
    wire_free(expect_frame(fd, LARDER__FRAME__MSG_WAKE, sid));
    atomic_store(&h->wake_client_at, 0);
    usleep(50000);
    ASSERT_EQ(atomic_load(&h->published), 2);
    ASSERT_EQ(atomic_load(&h->wake_at), 1);
    uint64_t released = 0;
    const char *why = "release";
    switch (round) {
      case 0:
        /* A good release, as liblarder makes it while asleep waiting for
         * the third descriptor: it comes, and a Wake frame with it. */
        atomic_store(&h->consumed, 2);
        atomic_store(&h->wake_client_at, 3);
        ring_put_release(h, &released, 0);
        send_wake(fd, sid);
        wait_published(h, 3);
        ASSERT_EQ(ring_desc(h, 2)->seq, 2);
        wire_free(expect_frame(fd, LARDER__FRAME__MSG_WAKE, sid));
        /* Then the same batch released again. */
        ring_put_release(h, &released, 0);
        break;
      case 1:
        ring_put_release(h, &released, 12345); /* never sent */
        break;
      case 2:
        atomic_store(&h->released, 1000); /* more than it holds */
        why = "ring claims";
        break;
      case 3:
        /* The layout in the header rewritten: the daemon goes by its own
         * copy, so a good release still brings the next descriptor where it
         * belongs.  (Were it to read the layout back, slots 0 or an offset
         * past the ring would make it divide by zero or write outside the
         * ring.) */
        h->slots = 0;
        h->slot_bytes = 1u << 30;
        h->releases_offset = 1ull << 40;
        h->descs_offset = 1ull << 40;
        atomic_store(&h->consumed, 2);
        atomic_store(&h->wake_client_at, 3);
        ring_put_release(h, &released, 0);
        send_wake(fd, sid);
        wait_published(h, 3);
        ASSERT_EQ(ring_layout_desc(&passed_layout, 2)->seq, 2);
        wire_free(expect_frame(fd, LARDER__FRAME__MSG_WAKE, sid));
        ring_put_release(h, &released, 12345); /* never sent */
        break;
      default:
        memset((void *)h, 0xff, ring_bytes);
        why = "ring claims";
        break;
    }
    send_wake(fd, sid);
    Larder__Frame *e = expect_frame(fd, LARDER__FRAME__MSG_ERROR, sid);
    ASSERT_EQ(e->error->code, LARDER_EPROTO);
    ASSERT_STR_CONTAINS(e->error->message, why);
    wire_free(e);
    expect_conn_works(fd);
    /* The stream is gone: more wakes for it are harmless. */
    send_wake(fd, sid);
    expect_conn_works(fd);
    munmap(h, ring_bytes);
    close(rfd);
    close(arena);
    close(fd);
  }
  fx_finish(&f, 30000);
  return 0;
}

/* ------------------------------------------------------------------------ */

typedef struct term_client {
  pthread_t th;
  const char *socket;
  larder_stream_options_t o;
  int hold;           /* keep every batch (window of them) */
  atomic_int started; /* batches received */
  int rc;
  char err[1024];
} term_client;

static void *term_main(void *p) {
  term_client *t = p;
  larder_client_t *c;
  t->rc = larder_client_connect(t->socket, &c);
  if (t->rc) return NULL;
  larder_stream_t *s;
  t->rc = larder_stream_open(c, &t->o, &s);
  if (t->rc) {
    larder_client_close(c);
    return NULL;
  }
  larder_batch_t *held[16];
  int nh = 0;
  for (;;) {
    larder_batch_t *b;
    int rc = larder_stream_next(s, 60000 * dh_slow(), &b);
    if (rc) {
      t->rc = rc;
      snprintf(t->err, sizeof(t->err), "%s", larder_client_last_error(c));
      break;
    }
    for (int64_t i = 0; i < larder_batch_num_rows(b); i += 7) dh_expect_row(b, i, 0);
    t->started++;
    if (t->hold && nh < 16) held[nh++] = b;
    else larder_batch_release(b);
  }
  /* Batches held across the shutdown are still readable. */
  for (int i = 0; i < nh; i++) {
    dh_expect_row(held[i], 0, 0);
    larder_batch_release(held[i]);
  }
  larder_stream_close(s);
  larder_client_close(c);
  return NULL;
}

/*
 * SIGTERM with streams open: every streaming client gets LARDER_ESHUTDOWN
 * with a clear message (batches it holds stay readable), an idle client
 * and a stalled raw one do not hold the shutdown up, the daemon exits 0,
 * and the cache reopens cleanly and serves the same bytes.
 */
TEST_IMPL(daemon_robust_sigterm_streams) {
  fixture f;
  fx_start(&f, NULL, 0);
  term_client t[4];
  memset(t, 0, sizeof(t));
  for (int i = 0; i < 4; i++) {
    t[i].socket = f.d.socket;
    t[i].o = f.o;
    t[i].o.epochs = 0; /* unbounded */
    t[i].o.seed = (uint64_t)i;
    t[i].o.window = 4;
    t[i].hold = i == 3;
    ASSERT_OK(pthread_create(&t[i].th, NULL, term_main, &t[i]));
  }
  larder_client_t *idle;
  ASSERT_OK(larder_client_connect(f.d.socket, &idle));
  /* A client that asks and never reads: its answers fill its socket and
   * back up in the daemon, which must not wait for them forever. */
  int deaf = hello_conn(&f);
  {
    Larder__AdminRequest ar = LARDER__ADMIN_REQUEST__INIT;
    ar.command = (char *)"stats";
    ar.json = 1;
    Larder__Frame fa = LARDER__FRAME__INIT;
    fa.msg_case = LARDER__FRAME__MSG_ADMIN_REQUEST;
    fa.admin_request = &ar;
    for (int i = 0; i < 600; i++) {
      ar.request_id = (uint32_t)i + 1;
      send_msg(deaf, &fa);
    }
  }
  int raw = hello_conn(&f);
  {
    int arena;
    Larder__Frame *r = dh_raw_open(raw, 1, &f.o, &arena);
    ASSERT_NOT_NULL(r);
    wire_free(r);
    if (arena >= 0) close(arena);
  }
  double deadline = test_now_ms() + 30000.0 * dh_slow();
  for (int i = 0; i < 4; i++)
    while (t[i].started < 4 && test_now_ms() < deadline) usleep(2000);
  for (int i = 0; i < 4; i++) ASSERT_GE(t[i].started, 4);
  dh_stop(&f.d); /* SIGTERM: exit 0, clean log */
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i].th, NULL);
    if (t[i].rc != LARDER_ESHUTDOWN)
      ASSERT_FAIL_("client %d ended with %s: %s", i, larder_err_name(t[i].rc), t[i].err);
    ASSERT_STR_CONTAINS(t[i].err, "shutting down");
  }
  larder_client_close(idle);
  close(raw);
  close(deaf);
  /* The cache reopens cleanly and serves the same bytes. */
  dh_start(&f.d);
  dh_run r = {0};
  ASSERT_OK(dh_collect(f.d.socket, &f.o, 0, &r));
  dh_expect_same(&f.ref, &r);
  dh_run_free(&r);
  char *json = dh_admin(&f.d, "stats");
  ASSERT_EQ(dh_json_u64(json, "units_decoded"), 0);
  ASSERT_EQ(dh_json_u64(json, "cache.checksum_failures"), 0);
  free(json);
  /* A new connection during shutdown is refused cleanly, too: connect
   * right after the signal. */
  larder_client_t *late = NULL;
  kill(f.d.pid, SIGTERM);
  int rc = larder_client_connect(f.d.socket, &late);
  ASSERT(rc == 0 || rc == LARDER_ECONNECT || rc == LARDER_ESHUTDOWN || rc == LARDER_ECLOSED);
  if (rc == 0) larder_client_close(late);
  int status = dh_stop_status(&f.d, 30000 * dh_slow());
  ASSERT(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  dh_check_log(&f.d);
  dh_run_free(&f.ref);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Chaos                                                                     */

#define CHAOS_JOBS 3

typedef struct chaos_ctx {
  const char *socket;
  const char *dir;
  larder_stream_options_t o[CHAOS_JOBS];
  dh_run ref[CHAOS_JOBS];
  double deadline;
} chaos_ctx;

typedef struct chaos_thread {
  pthread_t th;
  chaos_ctx *cx;
  int id;
  uint64_t rng;
  int ops[9];
  int failed;
  char err[1200];
} chaos_thread;

static uint64_t rnd(chaos_thread *t, uint64_t n) {
  t->rng ^= t->rng << 13, t->rng ^= t->rng >> 7, t->rng ^= t->rng << 17;
  return n ? t->rng % n : 0;
}

#define CHAOS_CHECK(t, cond, ...)                        \
  do {                                                   \
    if (!(cond)) {                                       \
      snprintf((t)->err, sizeof((t)->err), __VA_ARGS__); \
      (t)->failed = 1;                                   \
      return;                                            \
    }                                                    \
  } while (0)

/* Opens job j from batch `from` on client c (or a new client) and checks
 * up to `count` batches; abandons the stream in one of several ways. */
static void chaos_partial(chaos_thread *t, int j, uint64_t from, uint64_t count, int style) {
  const dh_run *ref = &t->cx->ref[j];
  larder_stream_options_t o = t->cx->o[j];
  o.start_epoch = from / ref->batches_per_epoch;
  o.start_batch = from % ref->batches_per_epoch;
  larder_client_t *c;
  int rc = larder_client_connect(t->cx->socket, &c);
  CHAOS_CHECK(t, rc == 0, "connect: %s", larder_strerror(rc));
  larder_stream_t *s;
  rc = larder_stream_open(c, &o, &s);
  CHAOS_CHECK(t, rc == 0, "open: %s", larder_client_last_error(c));
  larder_batch_t *held[2] = {NULL, NULL};
  uint64_t k = 0;
  for (; k < count; k++) {
    larder_batch_t *b;
    rc = larder_stream_next(s, 60000 * dh_slow(), &b);
    if (rc == LARDER_EEOF) break;
    CHAOS_CHECK(t, rc == 0, "job %d from %" PRIu64 ": batch %" PRIu64 ": %s", j, from, k,
                larder_client_last_error(c));
    CHAOS_CHECK(t, from + k < ref->n && dh_batch_hash(b) == ref->b[from + k].hash,
                "job %d from %" PRIu64 ": batch %" PRIu64 " differs", j, from, k);
    /* Hold up to two (fewer than the window, or the next never comes). */
    if (style == 2 && k < 2 && k + 1 < o.window) held[k] = b;
    else larder_batch_release(b);
  }
  if (k == count || rc == LARDER_EEOF)
    CHAOS_CHECK(t, rc != LARDER_EEOF || from + k == ref->n, "job %d: early end at %" PRIu64, j,
                from + k);
  switch (style) {
    case 0: /* the polite way */
      larder_stream_close(s);
      larder_client_close(c);
      break;
    case 1: /* the client goes without closing its stream */ larder_client_close(c); break;
    case 2: /* close while holding batches, release them afterwards */
      larder_stream_close(s);
      for (int i = 0; i < 2; i++)
        if (held[i]) larder_batch_release(held[i]);
      larder_client_close(c);
      break;
    default: /* close the stream, then a new one on the same client */
      larder_stream_close(s);
      rc = larder_stream_open(c, &t->cx->o[j], &s);
      CHAOS_CHECK(t, rc == 0, "reopen: %s", larder_client_last_error(c));
      larder_stream_close(s);
      larder_client_close(c);
      break;
  }
}

static void chaos_two_streams(chaos_thread *t) {
  int a = (int)rnd(t, CHAOS_JOBS), b = (a + 1) % CHAOS_JOBS;
  larder_client_t *c;
  int rc = larder_client_connect(t->cx->socket, &c);
  CHAOS_CHECK(t, rc == 0, "connect");
  larder_stream_t *s[2];
  rc = larder_stream_open(c, &t->cx->o[a], &s[0]);
  CHAOS_CHECK(t, rc == 0, "open: %s", larder_client_last_error(c));
  rc = larder_stream_open(c, &t->cx->o[b], &s[1]);
  CHAOS_CHECK(t, rc == 0, "open: %s", larder_client_last_error(c));
  const dh_run *ref[2] = {&t->cx->ref[a], &t->cx->ref[b]};
  size_t pos[2] = {0, 0};
  int live = 2, done[2] = {0, 0};
  while (live) {
    for (int i = 0; i < 2; i++) {
      if (done[i]) continue;
      larder_batch_t *bt;
      rc = larder_stream_next(s[i], 60000 * dh_slow(), &bt);
      if (rc == LARDER_EEOF) {
        CHAOS_CHECK(t, pos[i] == ref[i]->n, "two streams: early end");
        done[i] = 1;
        live--;
        continue;
      }
      CHAOS_CHECK(t, rc == 0, "two streams: %s", larder_client_last_error(c));
      CHAOS_CHECK(t, pos[i] < ref[i]->n && dh_batch_hash(bt) == ref[i]->b[pos[i]].hash,
                  "two streams: batch %zu differs", pos[i]);
      pos[i]++;
      larder_batch_release(bt);
    }
  }
  larder_stream_close(s[0]);
  larder_stream_close(s[1]);
  larder_client_close(c);
}

static void *chaos_main(void *p) {
  chaos_thread *t = p;
  /* LARDER_CHAOS_OPS: a bit mask of the operations to run (debugging). */
  const char *mask_env = getenv("LARDER_CHAOS_OPS");
  unsigned mask = mask_env ? (unsigned)strtoul(mask_env, NULL, 0) : 0x1ffu;
  while (!t->failed && test_now_ms() < t->cx->deadline) {
    int op = (int)rnd(t, 9);
    if (!(mask & (1u << op))) continue;
    int j = (int)rnd(t, CHAOS_JOBS);
    const dh_run *ref = &t->cx->ref[j];
    t->ops[op]++;
    switch (op) {
      case 0: /* a whole job */ chaos_partial(t, j, 0, ref->n + 1, 0); break;
      case 1: /* a bit of a job, abandoned in some way */
      case 2: chaos_partial(t, j, 0, rnd(t, 40), (int)rnd(t, 4)); break;
      case 3: /* resume somewhere, read on */
        chaos_partial(t, j, rnd(t, ref->n), 30 + rnd(t, 60), (int)rnd(t, 4));
        break;
      case 4: chaos_two_streams(t); break;
      case 5: { /* open and close at once, before anything is ready */
        larder_client_t *c;
        if (larder_client_connect(t->cx->socket, &c) == 0) {
          larder_stream_t *s;
          if (larder_stream_open(c, &t->cx->o[j], &s) == 0 && rnd(t, 2)) larder_stream_close(s);
          larder_client_close(c);
        }
        break;
      }
      case 6: { /* garbage */
        int fd = dh_raw_connect(t->cx->socket);
        uint8_t junk[64];
        for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (uint8_t)rnd(t, 256);
        dh_raw_write(fd, junk, 1 + rnd(t, sizeof(junk)));
        close(fd);
        break;
      }
      case 8: { /* a client killed while it streams and holds batches */
        int ready;
        pid_t pid = dh_spawn_holder(t->cx->socket, &t->cx->o[j], 1, 0, 1, 1, t->cx->o[j].window > 1,
                                    &ready);
        char ch;
        if (read(ready, &ch, 1) == 1) usleep((useconds_t)rnd(t, 3000));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(ready);
        break;
      }
      default: { /* a missing file */
        larder_client_t *c;
        if (larder_client_connect(t->cx->socket, &c) == 0) {
          larder_stream_options_t o = t->cx->o[j];
          const char *src[1] = {"/nonexistent/larder/chaos.parquet"};
          o.sources = src;
          larder_stream_t *s;
          int rc = larder_stream_open(c, &o, &s);
          larder_client_close(c);
          if (rc != LARDER_ENOENT) {
            snprintf(t->err, sizeof(t->err), "missing file: %s", larder_err_name(rc));
            t->failed = 1;
          }
        }
        break;
      }
    }
  }
  return NULL;
}

/*
 * Chaos: several threads, each its own clients, run whole jobs, partial
 * jobs abandoned in every way (closing, vanishing, holding batches),
 * resumed jobs, two streams on one client, instant open-and-close,
 * garbage and missing files, all at once against a daemon with a small
 * memory pool and a cache of half the data, so units are evicted,
 * reloaded, cached and refused all the time.  Every batch served must be
 * the reference's, and afterwards the daemon holds nothing of theirs.
 */
TEST_IMPL(daemon_robust_chaos) {
  char dir[1024];
  ASSERT_EQ(dh_mid_dataset(dir, sizeof(dir)), DH_MID_ROWS);
  const char *src[1] = {dir};
  chaos_ctx cx;
  memset(&cx, 0, sizeof(cx));
  cx.dir = dir;
  for (int j = 0; j < CHAOS_JOBS; j++) {
    dh_opts(&cx.o[j], src, 128 + 64 * (uint32_t)j, 100 + (uint64_t)j, 2);
    cx.o[j].unit_rows = 512;
    cx.o[j].shuffle_window = 6 + (uint32_t)j * 5;
    cx.o[j].arena_bytes = j == 1 ? 256u << 10 : 4u << 20;
    cx.o[j].window = 1 + (uint32_t)j * 3;
    cx.o[j].rank = j == 2 ? 1 : 0;
    cx.o[j].world_size = j == 2 ? 2 : 1;
  }
  /* References from a quiet daemon with default settings. */
  {
    dh_daemon r;
    dh_init(&r, "ref", NULL);
    dh_start(&r);
    for (int j = 0; j < CHAOS_JOBS; j++) ASSERT_OK(dh_collect(r.socket, &cx.o[j], 0, &cx.ref[j]));
    char *json = dh_admin(&r, "stats");
    uint64_t total = dh_json_u64(json, "cache.used_bytes");
    free(json);
    dh_stop(&r);
    /* The chaos daemon: half the cache, a small memory pool: room for the
     * three jobs' windows, which streams are admitted against (about 1.4
     * MiB by the footers, with row blocks), and far less than the units
     * they pin and pass through. */
    char cap[64];
    snprintf(cap, sizeof(cap), "--cache_capacity=%llu", (unsigned long long)total / 2);
    const char *const fl[] = {"--workers=3", "--memory_limit=2M", "--prefetch_batches=4", cap,
                              NULL};
    fixture f;
    memset(&f, 0, sizeof(f));
    dh_init(&f.d, "d", fl);
    dh_start(&f.d);
    cx.socket = f.d.socket;
    f.sockets0 = quiet_sockets(f.d.pid);
    f.fds0 = dh_fd_count(f.d.pid);
    cx.deadline = test_now_ms() + 4000.0 * dh_slow();
    chaos_thread th[5];
    memset(th, 0, sizeof(th));
    for (int i = 0; i < 5; i++) {
      th[i].cx = &cx;
      th[i].id = i;
      th[i].rng = 0x243f6a8885a308d3ull * (uint64_t)(i + 1);
      ASSERT_OK(pthread_create(&th[i].th, NULL, chaos_main, &th[i]));
    }
    for (int i = 0; i < 5; i++) pthread_join(th[i].th, NULL);
    int ops[9] = {0};
    for (int i = 0; i < 5; i++) {
      if (th[i].failed) {
        dh_print_log(&f.d);
        ASSERT_FAIL_("chaos thread %d: %s", i, th[i].err);
      }
      for (int k = 0; k < 9; k++) ops[k] += th[i].ops[k];
    }
    fprintf(stderr,
            "chaos: %d whole, %d partial, %d resumed, %d two-stream, %d open-close, "
            "%d garbage, %d missing, %d killed\n",
            ops[0], ops[1] + ops[2], ops[3], ops[4], ops[5], ops[6], ops[7], ops[8]);
    ASSERT(dh_alive(&f.d));
    fx_expect_baseline(&f, 0, 0);
    /* And it still serves every job exactly. */
    for (int j = 0; j < CHAOS_JOBS; j++) {
      dh_run r2 = {0};
      r2.check_rows = j == 0;
      ASSERT_OK(dh_collect(f.d.socket, &cx.o[j], 0, &r2));
      dh_expect_same(&cx.ref[j], &r2);
      dh_run_free(&r2);
    }
    char *js = dh_admin(&f.d, "stats");
    ASSERT_EQ(dh_json_u64(js, "unit_errors"), 0);
    ASSERT_EQ(dh_json_u64(js, "streams"), 0);
    ASSERT_EQ(dh_json_u64(js, "cache.checksum_failures"), 0);
    free(js);
    dh_stop(&f.d);
  }
  for (int j = 0; j < CHAOS_JOBS; j++) dh_run_free(&cx.ref[j]);
  return 0;
}
