/*
 * test-client.c: liblarder's own behaviour, each test one guarantee: fork
 * safety, a batch released twice, stall accounting in an event loop,
 * several streams waiting in frame mode, flush after the daemon died,
 * LOCAL_RANK for host memory, and the checks of what the daemon sends
 * (shared memory, descriptor ring, batch buffers, the LARGE_* types).
 *
 * The checks of the daemon's data need a daemon that sends bad data: a
 * fake one here (fake_*), a thread that answers the handshake and one
 * OpenStream with a schema, an arena and optionally a descriptor ring of
 * its making, after which the test sends Batch frames or publishes
 * descriptors itself.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"
#include "daemon-harness.h"

static void std_opts(larder_stream_options_t *o, uint32_t batch_size, uint64_t epochs) {
  dh_std_opts(o, dh_std_source(), 1, batch_size, 8, epochs, 1u << 20);
}

static const char *const frames_flags[] = {"--shm_ring=false", NULL};

/* ------------------------------------------------------------------------ */
/* fork()                                                                    */

/*
 * A parent holds its stream's whole window (one batch exported through
 * Arrow), forks, and the child releases them all (directly and through the
 * Arrow release callback), finds that the stream's calls fail with
 * LARDER_EINVAL, closes the client and exits.  The parent's batches are
 * intact, and it reads the whole epoch as a reference run does.  (Were
 * the child's releases to go into the parent's ring or onto its socket,
 * the daemon would free and reuse the parent's batches and fail its
 * stream when the parent released them.)  Through the ring and through
 * frames.
 */
TEST_IMPL(client_fork_releases) {
  for (int transport = 0; transport < 2; transport++) {
    dh_daemon d;
    dh_init(&d, transport ? "frames" : "ring", transport ? frames_flags : NULL);
    dh_start(&d);
    larder_stream_options_t o;
    std_opts(&o, 32, 1);
    o.window = 4;
    dh_run ref = {0};
    ASSERT_OK(dh_collect(d.socket, &o, 0, &ref));
    ASSERT_GT(ref.n, 8);
    larder_client_t *c;
    ASSERT_OK(larder_client_connect(d.socket, &c));
    larder_stream_t *s;
    ASSERT_OK(larder_stream_open(c, &o, &s));
    larder_batch_t *held[4];
    for (int i = 0; i < 4; i++) ASSERT_OK(larder_stream_next(s, 30000 * dh_slow(), &held[i]));
    struct ArrowSchema schema;
    struct ArrowArray array;
    ASSERT_OK(larder_batch_export(held[3], &schema, &array));

    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      for (int i = 0; i < 3; i++) larder_batch_release(held[i]);
      array.release(&array);
      schema.release(&schema);
      larder_batch_t *b;
      ASSERT_EQ(larder_stream_next(s, 100, &b), LARDER_EINVAL);
      ASSERT_STR_CONTAINS(larder_client_last_error(c), "forked child");
      ASSERT_EQ(larder_stream_flush(s), LARDER_EINVAL);
      larder_stream_t *s2;
      ASSERT_EQ(larder_stream_open(c, &o, &s2), LARDER_EINVAL);
      larder_client_close(c);
      _exit(0);
    }
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* Time for a daemon that heard of those releases to reuse the regions. */
    usleep(300000);
    for (int i = 0; i < 4; i++) ASSERT_UINT_EQ(dh_batch_hash(held[i]), ref.b[i].hash);
    for (int i = 0; i < 3; i++) larder_batch_release(held[i]);
    array.release(&array);
    schema.release(&schema);
    size_t k = 4;
    larder_batch_t *b;
    int rc;
    while ((rc = larder_stream_next(s, 30000 * dh_slow(), &b)) == 0) {
      ASSERT(k < ref.n);
      ASSERT_UINT_EQ(dh_batch_hash(b), ref.b[k].hash);
      k++;
      larder_batch_release(b);
    }
    if (rc != LARDER_EEOF) ASSERT_FAIL_("%s: %s", d.dir, larder_client_last_error(c));
    ASSERT_EQ(k, ref.n);
    ASSERT_OK(larder_stream_flush(s));
    larder_stream_close(s);
    larder_client_close(c);
    dh_run_free(&ref);
    dh_stop(&d);
  }
  return 0;
}

/*
 * A batch exported through Arrow and then also released directly (the
 * slip larder_batch_export warns of): the direct release is ignored, the
 * array's release releases that batch and no other, and the stream reads
 * its epoch as a reference run does.  (A direct release that recycled the
 * batch's struct for the next batch would let the array's release release
 * that one while the trainer held it; the trainer's own release of it
 * would be a second one, and the daemon would fail the stream.)
 */
/*
 * larder_batch_dlpack: each tensor holds the batch, after its owner's
 * release too, and the last of them gives the region back (with a window
 * of 2, the stream stands until then); pointers outside the batch's
 * memory, bad types and exported batches are refused.
 */
TEST_IMPL(client_dlpack_buffer_refs) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 32, 0);
  o.window = 2;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  larder_batch_t *b0, *b1, *b2, *b3;
  ASSERT_OK(larder_stream_next(s, 30000 * dh_slow(), &b0));
  const larder_array_t *id = larder_batch_column_by_name(b0, "id");
  ASSERT_NOT_NULL(id);
  int64_t n = larder_array_length(id);
  DLDataType i64 = {kDLInt, 64, 1};
  DLManagedTensor *t1, *t2, *bad;
  ASSERT_OK(larder_batch_dlpack(b0, larder_array_values(id), i64, 1, &n, &t1));
  ASSERT_OK(larder_batch_dlpack(b0, larder_array_values(id), i64, 1, &n, &t2));
  ASSERT(t1 != t2);
  ASSERT_EQ(t1->dl_tensor.device.device_type, kDLCPU);
  ASSERT_EQ(t1->dl_tensor.ndim, 1);
  ASSERT_EQ(t1->dl_tensor.shape[0], n);
  ASSERT(t1->dl_tensor.data == larder_array_values(id));
  int64_t first = ((const int64_t *)t1->dl_tensor.data)[0];
  /* Refused: memory past the arena, a type of no whole bytes, two lanes. */
  larder_batch_info_t info;
  ASSERT_GE(larder_batch_describe(b0, &info, NULL, 0), 1);
  int64_t whole = (int64_t)(info.arena_size / 8);
  ASSERT_EQ(larder_batch_dlpack(b0, info.arena + 8, i64, 1, &whole, &bad), LARDER_EINVAL);
  ASSERT_NULL(bad);
  ASSERT_EQ(larder_batch_dlpack(b0, &first, i64, 1, &n, &bad), LARDER_EINVAL);
  DLDataType odd = {kDLInt, 12, 1}, lanes = {kDLInt, 64, 2};
  ASSERT_EQ(larder_batch_dlpack(b0, larder_array_values(id), odd, 1, &n, &bad), LARDER_EINVAL);
  ASSERT_EQ(larder_batch_dlpack(b0, larder_array_values(id), lanes, 1, &n, &bad), LARDER_EINVAL);
  larder_batch_release(b0);
  ASSERT_OK(larder_stream_next(s, 30000 * dh_slow(), &b1));
  /* b0, held by its tensors, and b1 fill the window. */
  ASSERT_EQ(larder_stream_next(s, 300, &b2), LARDER_ETIMEDOUT);
  larder_batch_release(b1);
  ASSERT_OK(larder_stream_next(s, 30000 * dh_slow(), &b2));
  t1->deleter(t1);
  ASSERT_EQ(larder_stream_next(s, 300, &b3), LARDER_ETIMEDOUT);
  /* The tensor still reads b0's values: its region was not reused. */
  ASSERT_EQ(((const int64_t *)t2->dl_tensor.data)[0], first);
  t2->deleter(t2);
  ASSERT_OK(larder_stream_next(s, 30000 * dh_slow(), &b3));
  /* An exported batch belongs to its export: no more tensors from it. */
  struct ArrowSchema schema;
  struct ArrowArray array;
  ASSERT_OK(larder_batch_export(b2, &schema, &array));
  ASSERT_EQ(
      larder_batch_dlpack(b2, larder_array_values(larder_batch_column(b2, 0)), i64, 1, &n, &bad),
      LARDER_EINVAL);
  array.release(&array);
  schema.release(&schema);
  larder_batch_release(b3);
  larder_stream_close(s);
  larder_client_close(c);
  dh_stop(&d);
  return 0;
}

TEST_IMPL(client_export_then_release) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 32, 1);
  o.window = 2;
  dh_run ref = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &ref));
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  larder_batch_t *first, *b;
  ASSERT_OK(larder_stream_next(s, 30000 * dh_slow(), &first));
  struct ArrowSchema schema;
  struct ArrowArray array;
  ASSERT_OK(larder_batch_export(first, &schema, &array));
  /* A second export is refused and touches nothing: the batch belongs to
   * the first array.  (Were it allowed, each array's release would
   * release the batch, the second one whichever batch reused its
   * struct.) */
  struct ArrowSchema schema2 = {0};
  struct ArrowArray array2 = {0};
  ASSERT_EQ(larder_batch_export(first, &schema2, &array2), LARDER_EINVAL);
  ASSERT_NULL(schema2.release);
  ASSERT_NULL(array2.release);
  larder_batch_release(first);
  ASSERT_OK(larder_stream_next(s, 30000 * dh_slow(), &b));
  ASSERT_UINT_EQ(dh_batch_hash(first), ref.b[0].hash);
  array.release(&array);
  schema.release(&schema);
  ASSERT_UINT_EQ(dh_batch_hash(b), ref.b[1].hash);
  larder_batch_release(b);
  size_t k = 2;
  int rc;
  while ((rc = larder_stream_next(s, 30000 * dh_slow(), &b)) == 0) {
    ASSERT(k < ref.n);
    ASSERT_UINT_EQ(dh_batch_hash(b), ref.b[k].hash);
    k++;
    larder_batch_release(b);
  }
  if (rc != LARDER_EEOF) ASSERT_FAIL_("%s", larder_client_last_error(c));
  ASSERT_EQ(k, ref.n);
  larder_stream_close(s);
  larder_client_close(c);
  dh_run_free(&ref);
  dh_stop(&d);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Stall accounting in an event loop                                         */

/* The next batch of s as an event loop gets it: larder_stream_next with a
 * zero timeout, and poll on the stream's descriptor while that times out.
 * Returns 0 with *out, or LARDER_EEOF. */
static int evloop_next(larder_stream_t *s, larder_batch_t **out) {
  double deadline = test_now_ms() + 60000.0 * dh_slow();
  for (;;) {
    int rc = larder_stream_next(s, 0, out);
    if (rc != LARDER_ETIMEDOUT) {
      ASSERT(rc == 0 || rc == LARDER_EEOF);
      return rc;
    }
    ASSERT(test_now_ms() < deadline);
    struct pollfd pf = {larder_stream_fd(s), POLLIN, 0};
    poll(&pf, 1, 1000);
  }
}

/*
 * An event-loop reader whose daemon stops for 600 ms (SIGSTOP): the time
 * it spends in poll after larder_stream_next returned LARDER_ETIMEDOUT is
 * waiting, in its own figures and in those the daemon learns with the
 * releases.  (Counted as compute, it would make such a reader, starved
 * of data, report almost no stall.)
 */
TEST_IMPL(client_evloop_stall) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 32, 0);
  o.window = 4;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  larder_batch_t *b;
  ASSERT_OK(evloop_next(s, &b));
  larder_batch_release(b);

  /* The daemon stops: what is out is read, then the loop waits. */
  ASSERT_OK(kill(d.pid, SIGSTOP));
  while (larder_stream_next(s, 0, &b) == 0) larder_batch_release(b);
  double stop_at = test_now_ms();
  for (double left; (left = stop_at + 600 - test_now_ms()) > 0;) {
    struct pollfd pf = {larder_stream_fd(s), POLLIN, 0};
    if (poll(&pf, 1, (int)left + 1) > 0)
      while (larder_stream_next(s, 0, &b) == 0) larder_batch_release(b);
  }
  ASSERT_OK(kill(d.pid, SIGCONT));
  for (int i = 0; i < 20; i++) {
    ASSERT_OK(evloop_next(s, &b));
    larder_batch_release(b);
  }
  uint64_t w, cp;
  larder_stream_stall(s, &w, &cp);
  fprintf(stderr, "wait %.1f ms, compute %.1f ms\n", (double)w / 1e6, (double)cp / 1e6);
  ASSERT_GE(w, 550000000ull);
  ASSERT_GT(w, cp);

  /* The daemon's figures: those the releases carried. */
  ASSERT_OK(larder_stream_flush(s));
  double deadline = test_now_ms() + 10000.0 * dh_slow();
  uint64_t dw = 0, dc = 0;
  for (;;) {
    char *json = dh_admin(&d, "stats");
    ASSERT_NOT_NULL(json);
    const char *st = dh_json_stream(json, (int)getpid(), 0);
    if (st == NULL) ASSERT_FAIL_("no stream of pid %d in %s", (int)getpid(), json);
    dw = dh_json_u64(st, "wait_ns");
    dc = dh_json_u64(st, "compute_ns");
    free(json);
    if ((dw == w && dc == cp) || test_now_ms() > deadline) break;
    usleep(5000);
  }
  ASSERT_UINT_EQ(dw, w);
  ASSERT_UINT_EQ(dc, cp);
  larder_stream_close(s);
  larder_client_close(c);
  dh_stop(&d);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Two streams in frame mode                                                 */

/*
 * Frame mode, two streams of one client: A holds its whole window and its
 * call times out, so the caller will wait on A's descriptor; calls for B
 * return batches until B holds its whole window too (so that nothing more
 * comes for B); then one of A's batches is released.  That release must
 * reach the daemon, so that A's descriptor becomes readable with A's next
 * batch.  (So the "caller waits" flag is per stream: were it the
 * client's, B's call would clear it, A's release would be held for
 * company, and the poll on A would never wake.)
 */
TEST_IMPL(client_frames_two_streams_wait) {
  dh_daemon d;
  dh_init(&d, "d", frames_flags);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 32, 0);
  o.window = 4;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *a, *b;
  ASSERT_OK(larder_stream_open(c, &o, &a));
  larder_stream_options_t ob = o;
  ob.seed = 99;
  ASSERT_OK(larder_stream_open(c, &ob, &b));
  larder_batch_t *held[4], *held_b[4], *x;
  for (int i = 0; i < 4; i++) ASSERT_OK(larder_stream_next(a, 30000 * dh_slow(), &held[i]));
  ASSERT_EQ(larder_stream_next(a, 0, &x), LARDER_ETIMEDOUT);
  for (int i = 0; i < 4; i++) ASSERT_OK(larder_stream_next(b, 30000 * dh_slow(), &held_b[i]));
  larder_batch_release(held[0]);
  struct pollfd pf = {larder_stream_fd(a), POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, 5000 * dh_slow()), 1);
  double deadline = test_now_ms() + 10000.0 * dh_slow();
  int rc;
  while ((rc = larder_stream_next(a, 0, &x)) == LARDER_ETIMEDOUT) {
    ASSERT(test_now_ms() < deadline);
    poll(&pf, 1, 100);
  }
  ASSERT_OK(rc);
  larder_batch_release(x);
  for (int i = 1; i < 4; i++) larder_batch_release(held[i]);
  for (int i = 0; i < 4; i++) larder_batch_release(held_b[i]);
  larder_stream_close(a);
  larder_stream_close(b);
  larder_client_close(c);
  dh_stop(&d);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Flush after the daemon died                                               */

/*
 * The daemon is killed while the client holds batches; releasing them and
 * flushing returns LARDER_ECLOSED, as do later flushes and calls: through
 * the ring, the Wake's failed send counts; through frames, so does the
 * failed send of a release sent at once, with a window under 4 or when it
 * filled half the window.  Through the ring and through frames, with
 * releases held, sent at once, and asked for.
 */
TEST_IMPL(client_flush_dead_daemon) {
  static const struct {
    uint32_t window;
    int releases;
  } cases[] = {{0, 1}, {2, 1}, {4, 2}, {32, 16}};
  for (int transport = 0; transport < 2; transport++) {
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
      dh_daemon d;
      dh_init(&d, transport ? "frames" : "ring", transport ? frames_flags : NULL);
      dh_start(&d);
      larder_stream_options_t o;
      std_opts(&o, 32, 0);
      if (cases[k].window) o.window = cases[k].window;
      larder_client_t *c;
      ASSERT_OK(larder_client_connect(d.socket, &c));
      larder_stream_t *s;
      ASSERT_OK(larder_stream_open(c, &o, &s));
      larder_batch_t *held[16], *b;
      for (int i = 0; i < cases[k].releases; i++)
        ASSERT_OK(larder_stream_next(s, 30000 * dh_slow(), &held[i]));
      ASSERT_OK(larder_stream_flush(s));
      dh_kill(&d);
      for (int i = 0; i < cases[k].releases; i++) larder_batch_release(held[i]);
      int rc = larder_stream_flush(s);
      if (rc != LARDER_ECLOSED)
        ASSERT_FAIL_("%s, window %u, %d releases: flush returned %s", transport ? "frames" : "ring",
                     o.window, cases[k].releases, larder_err_name(rc));
      ASSERT_EQ(larder_stream_flush(s), LARDER_ECLOSED);
      /* What the daemon sent before it died may still be read. */
      while ((rc = larder_stream_next(s, 1000, &b)) == 0) larder_batch_release(b);
      ASSERT_EQ(rc, LARDER_ECLOSED);
      larder_stream_close(s);
      larder_client_close(c);
    }
  }
  return 0;
}

/*
 * A call that fails because the daemon went says so in
 * larder_client_last_error, whatever an earlier call left there (such as
 * the message of an open that had failed before).
 */
TEST_IMPL(client_closed_message) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 32, 0);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s, *bad;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  larder_stream_options_t ob = o;
  const char *missing[1] = {"/nonexistent/larder-missing.parquet"};
  ob.sources = missing;
  ob.num_sources = 1;
  ASSERT(larder_stream_open(c, &ob, &bad) < 0);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "larder-missing.parquet");
  dh_kill(&d);
  larder_batch_t *b;
  int rc;
  while ((rc = larder_stream_next(s, 1000, &b)) == 0) larder_batch_release(b);
  ASSERT_EQ(rc, LARDER_ECLOSED);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "closed the connection");
  larder_stream_close(s);
  larder_client_close(c);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* LOCAL_RANK                                                                */

/*
 * LOCAL_RANK is read for the CUDA device only when CUDA memory is asked
 * for: with rank and world size given and host memory, a LOCAL_RANK that
 * is no number does not matter: the open succeeds rather than fail with
 * LARDER_EINVAL.  With CUDA memory it does fail, naming the variable.
 */
TEST_IMPL(client_local_rank_host) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  ASSERT_OK(setenv("LOCAL_RANK", "gpu0", 1));
  larder_stream_t *s;
  int rc = larder_stream_open(c, &o, &s);
  if (rc) ASSERT_FAIL_("open: %s", larder_client_last_error(c));
  larder_batch_t *b;
  ASSERT_OK(larder_stream_next(s, 30000 * dh_slow(), &b));
  larder_batch_release(b);
  larder_stream_close(s);
  o.memory_kind = 1;
  ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "LOCAL_RANK=\"gpu0\"");
  ASSERT_OK(unsetenv("LOCAL_RANK"));
  larder_client_close(c);
  dh_stop(&d);
  return 0;
}

/*
 * Rank and world size come from the first variable set of RANK,
 * SLURM_PROCID, LOCAL_RANK and of WORLD_SIZE, SLURM_NTASKS: the others are
 * not read, so a LOCAL_RANK of "gpu0" or a SLURM_NTASKS of "x" beside
 * RANK and WORLD_SIZE does not fail the open.  The one read must be a
 * number, and the error names it.
 */
TEST_IMPL(client_rank_env) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  o.rank = -1;
  o.world_size = -1;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  ASSERT_OK(setenv("RANK", "1", 1));
  ASSERT_OK(setenv("WORLD_SIZE", "2", 1));
  ASSERT_OK(setenv("SLURM_PROCID", "x", 1));
  ASSERT_OK(setenv("SLURM_NTASKS", "y", 1));
  ASSERT_OK(setenv("LOCAL_RANK", "gpu0", 1));
  larder_stream_t *s;
  int rc = larder_stream_open(c, &o, &s);
  if (rc) ASSERT_FAIL_("open: %s", larder_client_last_error(c));
  ASSERT_EQ(larder_stream_batches_per_epoch(s), (DH_STD_ROWS + 127) / 128);
  larder_stream_close(s);
  ASSERT_OK(unsetenv("RANK"));
  ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "SLURM_PROCID=\"x\"");
  ASSERT_OK(unsetenv("SLURM_PROCID"));
  ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "LOCAL_RANK=\"gpu0\"");
  ASSERT_OK(setenv("LOCAL_RANK", "1", 1));
  ASSERT_OK(unsetenv("WORLD_SIZE"));
  ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "SLURM_NTASKS=\"y\"");
  ASSERT_OK(setenv("SLURM_NTASKS", "2", 1));
  rc = larder_stream_open(c, &o, &s);
  if (rc) ASSERT_FAIL_("open: %s", larder_client_last_error(c));
  ASSERT_EQ(larder_stream_batches_per_epoch(s), (DH_STD_ROWS + 127) / 128);
  larder_stream_close(s);
  ASSERT_OK(unsetenv("SLURM_NTASKS"));
  ASSERT_OK(unsetenv("LOCAL_RANK"));
  larder_client_close(c);
  dh_stop(&d);
  return 0;
}

/*
 * A NULL column name (or source vector) fails the open with LARDER_EINVAL
 * and a message, and the client goes on.  (A NULL column would crash in
 * protobuf-c's packing; a Python caller passes one with a None in its
 * list.)
 */
TEST_IMPL(client_open_null_vectors) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  larder_stream_options_t bad = o;
  static const char *const cols[] = {"id", NULL};
  bad.columns = cols;
  bad.num_columns = 2;
  ASSERT_EQ(larder_stream_open(c, &bad, &s), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "column 1 of 2 is NULL");
  bad = o;
  bad.sources = NULL;
  ASSERT_EQ(larder_stream_open(c, &bad, &s), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "at least one source");
  /* A NULL entry among the sources is an empty one, which the daemon
   * refuses by name. */
  static const char *const srcs[] = {NULL};
  bad = o;
  bad.sources = srcs;
  bad.num_sources = 1;
  ASSERT_EQ(larder_stream_open(c, &bad, &s), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "empty source");
  int rc = larder_stream_open(c, &o, &s);
  if (rc) ASSERT_FAIL_("open: %s", larder_client_last_error(c));
  larder_batch_t *b;
  ASSERT_OK(larder_stream_next(s, 30000 * dh_slow(), &b));
  larder_batch_release(b);
  larder_stream_close(s);
  larder_client_close(c);
  dh_stop(&d);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* A fake daemon                                                             */

#define FAKE_ARENA (64u << 10)
#define FAKE_WINDOW 8
#define FAKE_MAX_NODES 4
#define FAKE_LAYOUT (FAKE_MAX_NODES * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS)

/* The schemas: "std" is x int64 (nullable), s string, l list<int32>;
 * "large" is ls large_string, ll large_list<int32>; "map" is m
 * map<int32, int32> with a nullable key (as Parquet allows). */
typedef struct fake_schema {
  Larder__Field root, a, b, c, item;
  Larder__Field *root_children[3], *list_children[1], *entry_children[2];
  int num_nodes;
} fake_schema;

static void field_init(Larder__Field *f, const char *name, larder_type_t type) {
  larder__field__init(f);
  f->name = (char *)name;
  f->type = (uint32_t)type;
}

static void std_schema(fake_schema *fs) {
  field_init(&fs->root, "", LARDER_TYPE_STRUCT);
  field_init(&fs->a, "x", LARDER_TYPE_INT64);
  fs->a.nullable = 1;
  field_init(&fs->b, "s", LARDER_TYPE_STRING);
  field_init(&fs->c, "l", LARDER_TYPE_LIST);
  field_init(&fs->item, "item", LARDER_TYPE_INT32);
  fs->list_children[0] = &fs->item;
  fs->c.n_children = 1;
  fs->c.children = fs->list_children;
  fs->root_children[0] = &fs->a;
  fs->root_children[1] = &fs->b;
  fs->root_children[2] = &fs->c;
  fs->root.n_children = 3;
  fs->root.children = fs->root_children;
  fs->num_nodes = 4;
}

static void large_schema(fake_schema *fs) {
  field_init(&fs->root, "", LARDER_TYPE_STRUCT);
  field_init(&fs->a, "ls", LARDER_TYPE_LARGE_STRING);
  field_init(&fs->b, "ll", LARDER_TYPE_LARGE_LIST);
  field_init(&fs->item, "item", LARDER_TYPE_INT32);
  fs->list_children[0] = &fs->item;
  fs->b.n_children = 1;
  fs->b.children = fs->list_children;
  fs->root_children[0] = &fs->a;
  fs->root_children[1] = &fs->b;
  fs->root.n_children = 2;
  fs->root.children = fs->root_children;
  fs->num_nodes = 3;
}

static void map_schema(fake_schema *fs) {
  field_init(&fs->root, "", LARDER_TYPE_STRUCT);
  field_init(&fs->a, "m", LARDER_TYPE_MAP);
  fs->a.nullable = 1;
  field_init(&fs->b, "entries", LARDER_TYPE_STRUCT);
  field_init(&fs->c, "key", LARDER_TYPE_INT32);
  fs->c.nullable = 1;
  field_init(&fs->item, "value", LARDER_TYPE_INT32);
  fs->item.nullable = 1;
  fs->entry_children[0] = &fs->c;
  fs->entry_children[1] = &fs->item;
  fs->b.n_children = 2;
  fs->b.children = fs->entry_children;
  fs->list_children[0] = &fs->b;
  fs->a.n_children = 1;
  fs->a.children = fs->list_children;
  fs->root_children[0] = &fs->a;
  fs->root.n_children = 1;
  fs->root.children = fs->root_children;
  fs->num_nodes = 4;
}

/* A good batch of 4 rows of each schema, in the arena as fake_fill lays it
 * out: one line per node (length, null count, validity, offsets and
 * values as offset and length). */
static const uint64_t std_layout[FAKE_LAYOUT] = {
    4, 0, 0, 0, 0,   0,  0,   32, /* x: 10, 20, 30, 40 */
    4, 0, 0, 0, 64,  20, 128, 10, /* s: "a", "bb", "ccc", "dddd" */
    4, 0, 0, 0, 192, 20, 0,   0,  /* l: [], [1], [2, 3], [4, 5, 6] */
    6, 0, 0, 0, 0,   0,  256, 24, /* item */
};
static const uint64_t map_layout[FAKE_LAYOUT] = {
    4, 0, 0, 0, 192, 20, 0,   0,  /* m: {}, {1: 1}, {2: 2, 3: 3}, {4: 4, 5: 5, 6: 6} */
    6, 0, 0, 0, 0,   0,  0,   0,  /* entries */
    6, 0, 0, 0, 0,   0,  256, 24, /* key */
    6, 0, 0, 0, 0,   0,  256, 24, /* value */
};
static const uint64_t large_layout[FAKE_LAYOUT] = {
    4, 0, 0, 0, 512, 40, 128, 10, /* ls: as s */
    4, 0, 0, 0, 576, 40, 0,   0,  /* ll: as l */
    6, 0, 0, 0, 0,   0,  256, 24, /* item */
};

static void fake_fill(uint8_t *arena) {
  static const int64_t x[4] = {10, 20, 30, 40};
  static const int32_t offs[5] = {0, 1, 3, 6, 10}, loffs[5] = {0, 0, 1, 3, 6};
  static const int32_t items[6] = {1, 2, 3, 4, 5, 6};
  static const int64_t offs64[5] = {0, 1, 3, 6, 10}, loffs64[5] = {0, 0, 1, 3, 6};
  memcpy(arena, x, sizeof(x));
  memcpy(arena + 64, offs, sizeof(offs));
  memcpy(arena + 128, "abbcccdddd", 10);
  memcpy(arena + 192, loffs, sizeof(loffs));
  memcpy(arena + 256, items, sizeof(items));
  memcpy(arena + 512, offs64, sizeof(offs64));
  memcpy(arena + 576, loffs64, sizeof(loffs64));
}

typedef struct fake {
  char path[700];
  int lfd, cfd;
  pthread_t th;
  fake_schema *schema;
  int arena_fd;
  uint8_t *arena;
  uint64_t arena_reported; /* the arena size the reply states */
  int ring_fd;             /* -1: frames */
  ring_header_t *ring;
  uint64_t ring_size;
  ring_layout_t layout; /* the fake's own copy, as the daemon keeps one */
} fake_t;

/* A memfd of file_size bytes (sealed against shrinking and growing when
 * seal is set), mapped for size bytes. */
static uint8_t *fake_memfd(uint64_t size, uint64_t file_size, int seal, int *fd) {
  *fd = memfd_create("larder-fake", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT(*fd >= 0);
  ASSERT_OK(ftruncate(*fd, (off_t)file_size));
  if (seal) ASSERT_OK(fcntl(*fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW));
  void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  ASSERT(m != MAP_FAILED);
  return m;
}

/* A fake daemon serving schema, with a sealed arena holding fake_fill's
 * batch and no ring; the test changes what it likes before fake_open. */
static void fake_init(fake_t *f, fake_schema *schema) {
  static int n;
  memset(f, 0, sizeof(*f));
  snprintf(f->path, sizeof(f->path), "%s/fake-%d.sock", test_tmpdir(), n++);
  f->schema = schema;
  f->cfd = -1;
  f->ring_fd = -1;
  f->arena = fake_memfd(FAKE_ARENA, FAKE_ARENA, 1, &f->arena_fd);
  f->arena_reported = FAKE_ARENA;
  fake_fill(f->arena);
  f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(f->lfd >= 0);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  ASSERT_LT(strlen(f->path), sizeof(addr.sun_path));
  memcpy(addr.sun_path, f->path, strlen(f->path) + 1);
  ASSERT_OK(bind(f->lfd, (struct sockaddr *)&addr, sizeof(addr)));
  ASSERT_OK(listen(f->lfd, 4));
}

/* Gives f a descriptor ring of FAKE_WINDOW slots, sealed when seal is
 * set. */
static void fake_ring(fake_t *f, int seal) {
  uint32_t num_layout = (uint32_t)f->schema->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS;
  f->ring_size = (ring_bytes(FAKE_WINDOW, num_layout) + 4095) & ~(uint64_t)4095;
  f->ring = (ring_header_t *)(void *)fake_memfd(f->ring_size, f->ring_size, seal, &f->ring_fd);
  memset(f->ring, 0, f->ring_size);
  ring_init(f->ring, FAKE_WINDOW, num_layout);
  ring_layout_init(&f->layout, f->ring);
}

/* The fake's side of the handshake and the open. */
static void *fake_main(void *arg) {
  fake_t *f = arg;
  f->cfd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
  ASSERT(f->cfd >= 0);
  int rc;
  Larder__Frame *in = dh_raw_recv(f->cfd, 10000, NULL, NULL, &rc);
  ASSERT_NOT_NULL(in);
  ASSERT_EQ(in->msg_case, LARDER__FRAME__MSG_HELLO);
  wire_free(in);
  Larder__HelloReply hr = LARDER__HELLO_REPLY__INIT;
  hr.protocol_version = WIRE_PROTOCOL_VERSION;
  hr.server_version = (char *)"fake";
  Larder__Frame out = LARDER__FRAME__INIT;
  out.msg_case = LARDER__FRAME__MSG_HELLO_REPLY;
  out.hello_reply = &hr;
  ASSERT_OK(dh_raw_send(f->cfd, &out));
  in = dh_raw_recv(f->cfd, 10000, NULL, NULL, &rc);
  ASSERT_NOT_NULL(in);
  ASSERT_EQ(in->msg_case, LARDER__FRAME__MSG_OPEN_STREAM);
  Larder__OpenStreamReply rep = LARDER__OPEN_STREAM_REPLY__INIT;
  rep.request_id = in->open_stream->request_id;
  wire_free(in);
  rep.stream_id = 1;
  rep.schema = &f->schema->root;
  rep.batches_per_epoch = 100;
  rep.num_samples = 400;
  rep.arena_bytes = f->arena_reported;
  rep.ring_bytes = f->ring_fd >= 0 ? f->ring_size : 0;
  Larder__Frame of = LARDER__FRAME__INIT;
  of.msg_case = LARDER__FRAME__MSG_OPEN_STREAM_REPLY;
  of.open_stream_reply = &rep;
  size_t len;
  uint8_t *buf = wire_encode(&of, &len);
  ASSERT_NOT_NULL(buf);
  int fds[2] = {f->arena_fd, f->ring_fd};
  int64_t n = wire_sendmsg(f->cfd, buf, len, fds, f->ring_fd >= 0 ? 2 : 1);
  ASSERT_GT(n, 0);
  ASSERT_OK(dh_raw_write(f->cfd, buf + n, len - (size_t)n));
  free(buf);
  return NULL;
}

/* Connects a client to the fake and opens a stream (window FAKE_WINDOW).
 * Returns the open's result; *c is connected either way. */
static int fake_open(fake_t *f, larder_client_t **c, larder_stream_t **s) {
  ASSERT_OK(pthread_create(&f->th, NULL, fake_main, f));
  ASSERT_OK(larder_client_connect(f->path, c));
  static const char *const src[] = {"/fake"};
  larder_stream_options_t o;
  dh_opts(&o, src, 4, 0, 1);
  o.window = FAKE_WINDOW;
  int rc = larder_stream_open(*c, &o, s);
  ASSERT_OK(pthread_join(f->th, NULL));
  return rc;
}

/* Sends a Batch frame of seq with layout. */
static void fake_send_batch(fake_t *f, uint64_t seq, const uint64_t *layout) {
  Larder__Batch b = LARDER__BATCH__INIT;
  b.stream_id = 1;
  b.seq = seq;
  b.index = seq;
  b.num_rows = 4;
  b.arena_length = 1024;
  b.n_layout = (size_t)f->schema->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS;
  b.layout = (uint64_t *)layout;
  Larder__Frame fr = LARDER__FRAME__INIT;
  fr.msg_case = LARDER__FRAME__MSG_BATCH;
  fr.batch = &b;
  ASSERT_OK(dh_raw_send(f->cfd, &fr));
}

/* Publishes descriptor seq with layout in the ring, at the place the
 * fake's own layout says. */
static void fake_publish(fake_t *f, uint64_t seq, const uint64_t *layout) {
  ring_desc_t *d = ring_layout_desc(&f->layout, seq);
  d->seq = seq;
  d->epoch = 0;
  d->index = seq;
  d->num_rows = 4;
  d->arena_offset = 0;
  d->arena_length = 1024;
  memcpy(d->layout, layout,
         (size_t)f->schema->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS * sizeof(uint64_t));
  atomic_store_explicit(&f->ring->published, seq + 1, memory_order_release);
}

/* Reads frames from the client until a CloseStream (1) or the end (0). */
static int fake_saw_close(fake_t *f) {
  for (;;) {
    int rc;
    Larder__Frame *in = dh_raw_recv(f->cfd, 5000, NULL, NULL, &rc);
    if (in == NULL) return 0;
    int close = in->msg_case == LARDER__FRAME__MSG_CLOSE_STREAM;
    wire_free(in);
    if (close) return 1;
  }
}

static void fake_free(fake_t *f) {
  if (f->cfd >= 0) close(f->cfd);
  close(f->lfd);
  unlink(f->path);
  munmap(f->arena, FAKE_ARENA);
  close(f->arena_fd);
  if (f->ring_fd >= 0) {
    munmap(f->ring, f->ring_size);
    close(f->ring_fd);
  }
}

/* Checks fake_fill's batch of the std schema. */
static void expect_std_batch(const larder_batch_t *b) {
  ASSERT_EQ(larder_batch_num_rows(b), 4);
  const larder_array_t *x = larder_batch_column(b, 0), *s = larder_batch_column(b, 1),
                       *l = larder_batch_column(b, 2);
  ASSERT_EQ(((const int64_t *)larder_array_values(x))[3], 40);
  ASSERT_EQ(larder_array_offsets(s)[4], 10);
  ASSERT_MEM_EQ(larder_array_values(s), "abbcccdddd", 10);
  ASSERT_EQ(larder_array_offsets(l)[4], 6);
  ASSERT_EQ(((const int32_t *)larder_array_values(larder_array_child(l, 0)))[5], 6);
}

/* ------------------------------------------------------------------------ */
/* Checks of what the daemon sends                                           */

/*
 * Batches whose buffers lie inside the arena but are too small for their
 * arrays fail the stream with LARDER_EPROTO, and so does every later call,
 * even with a good batch behind the bad one; closing the stream tells the
 * daemon.  (Such buffers, passed, would fault when read; and a malformed
 * batch consumes its window slot, so a stream going on after it would run
 * one batch short.)  A good batch passes.
 */
TEST_IMPL(client_fake_bad_buffers) {
  static const struct {
    const char *what;
    int node, field;
    uint64_t value;
  } bad[] = {
      {"values short for the length", 0, LARDER__ARRAY_FIELD__ARRAY_LENGTH, 1000000},
      {"nulls without validity", 0, LARDER__ARRAY_FIELD__ARRAY_NULL_COUNT, 1},
      {"offsets short", 1, LARDER__ARRAY_FIELD__ARRAY_OFFSETS_LENGTH, 8},
      {"offsets misaligned", 1, LARDER__ARRAY_FIELD__ARRAY_OFFSETS_OFFSET, 66},
      {"int64 values misaligned", 0, LARDER__ARRAY_FIELD__ARRAY_VALUES_OFFSET, 4},
      {"list elements misaligned", 3, LARDER__ARRAY_FIELD__ARRAY_VALUES_OFFSET, 258},
      {"last offset past the values", 1, LARDER__ARRAY_FIELD__ARRAY_VALUES_LENGTH, 5},
      {"last offset past the child", 3, LARDER__ARRAY_FIELD__ARRAY_LENGTH, 2},
      {"list offsets short", 2, LARDER__ARRAY_FIELD__ARRAY_OFFSETS_LENGTH, 16},
      {"negative length", 0, LARDER__ARRAY_FIELD__ARRAY_LENGTH, UINT64_MAX},
      {"negative null count", 1, LARDER__ARRAY_FIELD__ARRAY_NULL_COUNT, UINT64_MAX},
      {"more nulls than slots", 3, LARDER__ARRAY_FIELD__ARRAY_NULL_COUNT, 7},
      {"values past the arena", 3, LARDER__ARRAY_FIELD__ARRAY_VALUES_OFFSET, UINT64_MAX - 8},
  };
  fake_schema fs;
  std_schema(&fs);
  /* Case -1: the good batch. */
  for (int i = -1; i < (int)(sizeof(bad) / sizeof(bad[0])); i++) {
    fake_t f;
    fake_init(&f, &fs);
    larder_client_t *c;
    larder_stream_t *s;
    ASSERT_OK(fake_open(&f, &c, &s));
    uint64_t layout[FAKE_LAYOUT];
    memcpy(layout, std_layout, sizeof(layout));
    if (i >= 0)
      layout[bad[i].node * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS + bad[i].field] = bad[i].value;
    fake_send_batch(&f, 0, layout);
    fake_send_batch(&f, 1, std_layout);
    larder_batch_t *b;
    int rc = larder_stream_next(s, 5000, &b);
    if (i < 0) {
      ASSERT_OK(rc);
      expect_std_batch(b);
      larder_batch_release(b);
      ASSERT_OK(larder_stream_next(s, 5000, &b));
      larder_batch_release(b);
    } else {
      if (rc != LARDER_EPROTO) ASSERT_FAIL_("%s: %d", bad[i].what, rc);
      ASSERT_STR_CONTAINS(larder_client_last_error(c), "malformed batch");
      rc = larder_stream_next(s, 1000, &b);
      if (rc != LARDER_EPROTO) ASSERT_FAIL_("%s, the next call: %d", bad[i].what, rc);
      ASSERT_EQ(larder_stream_flush(s), LARDER_EPROTO);
    }
    larder_stream_close(s);
    ASSERT(fake_saw_close(&f));
    larder_client_close(c);
    fake_free(&f);
  }
  return 0;
}

/*
 * The same through the descriptor ring: a malformed descriptor fails the
 * stream for good, though good ones follow it in the ring: the next call
 * does not take the next descriptor as if nothing had happened.
 */
TEST_IMPL(client_fake_bad_descriptor) {
  fake_schema fs;
  std_schema(&fs);
  fake_t f;
  fake_init(&f, &fs);
  fake_ring(&f, 1);
  larder_client_t *c;
  larder_stream_t *s;
  ASSERT_OK(fake_open(&f, &c, &s));
  uint64_t layout[FAKE_LAYOUT];
  memcpy(layout, std_layout, sizeof(layout));
  layout[LARDER__ARRAY_FIELD__ARRAY_VALUES_OFFSET] = FAKE_ARENA - 8;
  fake_publish(&f, 0, std_layout);
  fake_publish(&f, 1, layout);
  fake_publish(&f, 2, std_layout);
  larder_batch_t *b;
  ASSERT_OK(larder_stream_next(s, 5000, &b));
  expect_std_batch(b);
  larder_batch_release(b);
  ASSERT_EQ(larder_stream_next(s, 5000, &b), LARDER_EPROTO);
  ASSERT_EQ(larder_stream_next(s, 5000, &b), LARDER_EPROTO);
  ASSERT_EQ(larder_stream_flush(s), LARDER_EPROTO);
  larder_stream_close(s);
  ASSERT(fake_saw_close(&f));
  larder_client_close(c);
  fake_free(&f);
  return 0;
}

/*
 * Shared memory the client would fault on is refused at the open with
 * LARDER_EPROTO: an arena shorter than the reply says, an arena and a ring
 * not sealed against shrinking.  (The arena is mapped with the size the
 * daemon states, and reading past the file's end would raise SIGBUS.)
 */
TEST_IMPL(client_fake_shm_checks) {
  fake_schema fs;
  std_schema(&fs);
  for (int i = 0; i < 3; i++) {
    fake_t f;
    fake_init(&f, &fs);
    const char *want = "smaller";
    if (i == 0) {
      munmap(f.arena, FAKE_ARENA);
      close(f.arena_fd);
      f.arena = fake_memfd(FAKE_ARENA, 4096, 1, &f.arena_fd);
    } else if (i == 1) {
      munmap(f.arena, FAKE_ARENA);
      close(f.arena_fd);
      f.arena = fake_memfd(FAKE_ARENA, FAKE_ARENA, 0, &f.arena_fd);
      want = "not sealed";
    } else {
      fake_ring(&f, 0);
      want = "not sealed";
    }
    larder_client_t *c;
    larder_stream_t *s;
    int rc = fake_open(&f, &c, &s);
    if (rc != LARDER_EPROTO) ASSERT_FAIL_("case %d: the open returned %d", i, rc);
    ASSERT_STR_CONTAINS(larder_client_last_error(c), want);
    larder_client_close(c);
    fake_free(&f);
  }
  return 0;
}

/*
 * The daemon rewrites the ring's header after the open (slots 0, the
 * offsets far outside): the client works from the layout it checked at
 * the open, takes the descriptor and writes the release where the ring
 * was laid out.  (Re-reading the header on every take would divide by
 * zero or read outside the ring.)
 */
TEST_IMPL(client_fake_ring_rewritten) {
  fake_schema fs;
  std_schema(&fs);
  fake_t f;
  fake_init(&f, &fs);
  fake_ring(&f, 1);
  larder_client_t *c;
  larder_stream_t *s;
  ASSERT_OK(fake_open(&f, &c, &s));
  f.ring->slots = 0;
  f.ring->descs_offset = 1ull << 40;
  f.ring->releases_offset = 1ull << 40;
  f.ring->slot_bytes = 7;
  fake_publish(&f, 0, std_layout);
  larder_batch_t *b;
  int rc = larder_stream_next(s, 5000, &b);
  if (rc) ASSERT_FAIL_("next: %s", larder_client_last_error(c));
  expect_std_batch(b);
  larder_batch_release(b);
  ASSERT_EQ(atomic_load(&f.ring->released), 1);
  ASSERT_EQ(ring_layout_release(&f.layout, 0)->seq, 0);
  larder_stream_close(s);
  larder_client_close(c);
  fake_free(&f);
  return 0;
}

/*
 * LARGE_STRING and LARGE_LIST, which the daemon does not send yet: their
 * int64 offsets come through larder_array_large_offsets (and not as int32
 * through larder_array_offsets), are checked against their buffers, and
 * the Arrow export puts them in the right buffers: a LARGE_LIST's second
 * Arrow buffer is its offsets, not its absent values.
 */
/*
 * A map exports with its entries and keys non-nullable, as Arrow requires,
 * whatever the Parquet key column said; its values keep their flag.  A
 * batch with a null key cannot be an Arrow map: its export fails with
 * LARDER_EUNSUPPORTED and leaves the batch to the caller, whose accessors
 * still read it.  (A nullable key would be refused by importers.)
 */
TEST_IMPL(client_fake_map_keys) {
  fake_schema fs;
  map_schema(&fs);
  fake_t f;
  fake_init(&f, &fs);
  /* Entry 0's key is null in the second batch. */
  f.arena[320] = 0x3e;
  larder_client_t *c;
  larder_stream_t *s;
  ASSERT_OK(fake_open(&f, &c, &s));
  fake_send_batch(&f, 0, map_layout);
  uint64_t null_key[FAKE_LAYOUT];
  memcpy(null_key, map_layout, sizeof(null_key));
  null_key[2 * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS + LARDER__ARRAY_FIELD__ARRAY_NULL_COUNT] = 1;
  null_key[2 * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS + LARDER__ARRAY_FIELD__ARRAY_VALIDITY_OFFSET] =
      320;
  null_key[2 * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS + LARDER__ARRAY_FIELD__ARRAY_VALIDITY_LENGTH] =
      1;
  fake_send_batch(&f, 1, null_key);
  larder_batch_t *b;
  int rc = larder_stream_next(s, 5000, &b);
  if (rc) ASSERT_FAIL_("next: %s", larder_client_last_error(c));
  struct ArrowSchema schema;
  struct ArrowArray array;
  ASSERT_OK(larder_batch_export(b, &schema, &array));
  const struct ArrowSchema *m = schema.children[0];
  ASSERT_STR_EQ(m->format, "+m");
  ASSERT(m->flags & ARROW_FLAG_NULLABLE);
  ASSERT_EQ(m->children[0]->flags & ARROW_FLAG_NULLABLE, 0);
  ASSERT_EQ(m->children[0]->children[0]->flags & ARROW_FLAG_NULLABLE, 0);
  ASSERT(m->children[0]->children[1]->flags & ARROW_FLAG_NULLABLE);
  array.release(&array);
  schema.release(&schema);
  rc = larder_stream_next(s, 5000, &b);
  if (rc) ASSERT_FAIL_("next: %s", larder_client_last_error(c));
  struct ArrowSchema schema2 = {0};
  struct ArrowArray array2 = {0};
  ASSERT_EQ(larder_batch_export(b, &schema2, &array2), LARDER_EUNSUPPORTED);
  ASSERT_NULL(schema2.release);
  ASSERT_NULL(array2.release);
  const larder_array_t *key =
      larder_array_child(larder_array_child(larder_batch_column(b, 0), 0), 0);
  ASSERT_EQ(larder_array_null_count(key), 1);
  ASSERT_EQ(larder_array_validity(key)[0] & 1, 0);
  larder_batch_release(b);
  larder_stream_close(s);
  larder_client_close(c);
  fake_free(&f);
  return 0;
}

TEST_IMPL(client_fake_large_types) {
  fake_schema fs;
  large_schema(&fs);
  for (int round = 0; round < 2; round++) {
    fake_t f;
    fake_init(&f, &fs);
    larder_client_t *c;
    larder_stream_t *s;
    ASSERT_OK(fake_open(&f, &c, &s));
    larder_batch_t *b;
    if (round == 1) {
      /* Offsets sized as int32 ones. */
      uint64_t layout[FAKE_LAYOUT];
      memcpy(layout, large_layout, sizeof(layout));
      layout[LARDER__ARRAY_FIELD__ARRAY_OFFSETS_LENGTH] = 20;
      fake_send_batch(&f, 0, layout);
      ASSERT_EQ(larder_stream_next(s, 5000, &b), LARDER_EPROTO);
      larder_stream_close(s);
      larder_client_close(c);
      fake_free(&f);
      continue;
    }
    fake_send_batch(&f, 0, large_layout);
    int rc = larder_stream_next(s, 5000, &b);
    if (rc) ASSERT_FAIL_("next: %s", larder_client_last_error(c));
    const larder_array_t *ls = larder_batch_column(b, 0), *ll = larder_batch_column(b, 1);
    ASSERT_NULL(larder_array_offsets(ls));
    ASSERT_NULL(larder_array_offsets(ll));
    ASSERT_EQ(larder_array_large_offsets(ls)[4], 10);
    ASSERT_EQ(larder_array_large_offsets(ll)[4], 6);
    ASSERT_MEM_EQ(larder_array_values(ls), "abbcccdddd", 10);
    struct ArrowSchema schema;
    struct ArrowArray array;
    ASSERT_OK(larder_batch_export(b, &schema, &array));
    ASSERT_STR_EQ(schema.children[0]->format, "U");
    ASSERT_STR_EQ(schema.children[1]->format, "+L");
    ASSERT_EQ(array.children[0]->n_buffers, 3);
    ASSERT_PTR_EQ(array.children[0]->buffers[1], larder_array_large_offsets(ls));
    ASSERT_PTR_EQ(array.children[0]->buffers[2], larder_array_values(ls));
    ASSERT_EQ(array.children[1]->n_buffers, 2);
    ASSERT_PTR_EQ(array.children[1]->buffers[1], larder_array_large_offsets(ll));
    ASSERT_EQ(((const int64_t *)array.children[1]->buffers[1])[4], 6);
    array.release(&array);
    schema.release(&schema);
    larder_stream_close(s);
    larder_client_close(c);
    fake_free(&f);
  }
  return 0;
}

/*
 * Settings out of range fail at open with LARDER_EINVAL naming the field,
 * instead of becoming a default: world_size 0 or below -1, rank below -1
 * or not below world_size, local_world_size 0, a RANK or WORLD_SIZE set
 * but empty.  A failed connect says why in larder_connect_error, with the
 * socket's path and the system's error.
 */
TEST_IMPL(client_option_ranges) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  ASSERT_STR_EQ(larder_connect_error(), "");
  static const struct {
    int32_t rank, world, local;
    const char *needle;
  } bad[] = {{0, 0, -1, "world_size 0"},      {0, -2, -1, "world_size -2"},
             {-2, 2, -1, "rank -2"},          {2, 2, -1, "rank 2 is not below world_size 2"},
             {0, 1, 0, "local_world_size 0"}, {0, 1, -3, "local_world_size -3"}};
  larder_stream_t *s;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    larder_stream_options_t o;
    std_opts(&o, 64, 1);
    o.rank = bad[i].rank;
    o.world_size = bad[i].world;
    o.local_world_size = bad[i].local;
    ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EINVAL);
    ASSERT_STR_CONTAINS(larder_client_last_error(c), bad[i].needle);
  }
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  o.rank = -1;
  o.world_size = 1;
  ASSERT_OK(setenv("RANK", "", 1));
  ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "RANK is set but empty");
  ASSERT_OK(unsetenv("RANK"));
  o.rank = 0;
  o.world_size = -1;
  ASSERT_OK(setenv("WORLD_SIZE", "", 1));
  ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "WORLD_SIZE is set but empty");
  ASSERT_OK(unsetenv("WORLD_SIZE"));
  /* The same options with their fields in range open. */
  ASSERT_OK(larder_stream_open(c, &o, &s));
  larder_stream_close(s);
  larder_client_close(c);

  char missing[1024];
  snprintf(missing, sizeof(missing), "%s/no-daemon.sock", test_tmpdir());
  larder_client_t *none;
  ASSERT_EQ(larder_client_connect(missing, &none), LARDER_ECONNECT);
  ASSERT_STR_CONTAINS(larder_connect_error(), missing);
  ASSERT_STR_CONTAINS(larder_connect_error(), strerror(ENOENT));
  dh_stop(&d);
  return 0;
}

/*
 * larder_batch_describe lists every array of a batch in slot order with
 * the accessors' buffers: the std schema's three columns and the list's
 * child (with parent and child indexes), the map schema's nesting two
 * levels deep, a count-only call, a short array filled no further than
 * its size, and the errors.
 */
TEST_IMPL(client_batch_describe) {
  fake_schema fs;
  std_schema(&fs);
  fake_t f;
  fake_init(&f, &fs);
  larder_client_t *c;
  larder_stream_t *s;
  ASSERT_OK(fake_open(&f, &c, &s));
  fake_send_batch(&f, 0, std_layout);
  larder_batch_t *b;
  int rc = larder_stream_next(s, 5000, &b);
  if (rc) ASSERT_FAIL_("next: %s", larder_client_last_error(c));
  ASSERT_EQ(larder_batch_describe(b, NULL, NULL, 0), 4);
  larder_batch_info_t info;
  larder_array_info_t a[6];
  memset(a, 0xa5, sizeof(a));
  ASSERT_EQ(larder_batch_describe(b, &info, a, 6), 4);
  ASSERT_EQ(info.num_rows, 4);
  ASSERT_EQ(info.epoch, larder_batch_epoch(b));
  ASSERT_EQ(info.index, larder_batch_index(b));
  ASSERT_EQ(info.bytes, larder_batch_bytes(b));
  ASSERT_EQ(info.num_columns, 3);
  ASSERT_EQ(info.num_arrays, 4);
  ASSERT(info.arena != NULL && info.arena_size >= 1024);
  ASSERT((const uint8_t *)a[0].values >= info.arena);
  ASSERT((const uint8_t *)a[0].values + a[0].values_size <= info.arena + info.arena_size);
  for (int i = 0; i < 3; i++) {
    const larder_array_t *col = larder_batch_column(b, i);
    ASSERT_EQ(a[i].type, (int64_t)larder_array_type(col));
    ASSERT_EQ(a[i].length, larder_array_length(col));
    ASSERT_EQ(a[i].null_count, larder_array_null_count(col));
    ASSERT_PTR_EQ(a[i].validity, larder_array_validity(col));
    ASSERT_PTR_EQ(a[i].values, larder_array_values(col));
    ASSERT_EQ(a[i].values_size, larder_array_values_size(col));
    ASSERT_EQ(a[i].parent, -1);
  }
  ASSERT_EQ(a[0].type, LARDER_TYPE_INT64);
  ASSERT_EQ(a[0].byte_width, 8);
  ASSERT_EQ(a[0].offset_width, 0);
  ASSERT_NULL(a[0].offsets);
  ASSERT_EQ(a[0].first_child, -1);
  ASSERT_EQ(((const int64_t *)a[0].values)[3], 40);
  ASSERT_EQ(a[1].type, LARDER_TYPE_STRING);
  ASSERT_EQ(a[1].byte_width, 0);
  ASSERT_EQ(a[1].offset_width, 4);
  ASSERT_PTR_EQ(a[1].offsets, larder_array_offsets(larder_batch_column(b, 1)));
  ASSERT_EQ(a[2].type, LARDER_TYPE_LIST);
  ASSERT_EQ(a[2].offset_width, 4);
  ASSERT_EQ(a[2].num_children, 1);
  ASSERT_EQ(a[2].first_child, 3);
  ASSERT_EQ(((const int32_t *)a[2].offsets)[4], 6);
  const larder_array_t *item = larder_array_child(larder_batch_column(b, 2), 0);
  ASSERT_EQ(a[3].type, LARDER_TYPE_INT32);
  ASSERT_EQ(a[3].byte_width, 4);
  ASSERT_EQ(a[3].parent, 2);
  ASSERT_EQ(a[3].length, 6);
  ASSERT_PTR_EQ(a[3].values, larder_array_values(item));
  /* A short array: entries past max_arrays are left alone. */
  larder_array_info_t two[3];
  memset(two, 0x5a, sizeof(two));
  ASSERT_EQ(larder_batch_describe(b, NULL, two, 2), 4);
  ASSERT_PTR_EQ(two[1].values, a[1].values);
  ASSERT_EQ(two[2].type, (int64_t)0x5a5a5a5a5a5a5a5aull);
  ASSERT_EQ(larder_batch_describe(NULL, &info, a, 6), LARDER_EINVAL);
  ASSERT_EQ(larder_batch_describe(b, &info, a, -1), LARDER_EINVAL);
  ASSERT_EQ(larder_batch_describe(b, &info, NULL, 2), LARDER_EINVAL);
  larder_batch_release(b);
  larder_stream_close(s);
  larder_client_close(c);
  fake_free(&f);

  map_schema(&fs);
  fake_init(&f, &fs);
  ASSERT_OK(fake_open(&f, &c, &s));
  fake_send_batch(&f, 0, map_layout);
  rc = larder_stream_next(s, 5000, &b);
  if (rc) ASSERT_FAIL_("next: %s", larder_client_last_error(c));
  ASSERT_EQ(larder_batch_describe(b, &info, a, 6), 4);
  ASSERT_EQ(info.num_columns, 1);
  ASSERT_EQ(a[0].type, LARDER_TYPE_MAP);
  ASSERT_EQ(a[0].first_child, 1);
  ASSERT_EQ(a[1].type, LARDER_TYPE_STRUCT);
  ASSERT_EQ(a[1].parent, 0);
  ASSERT_EQ(a[1].num_children, 2);
  ASSERT_EQ(a[1].first_child, 2);
  ASSERT_EQ(a[2].parent, 1);
  ASSERT_EQ(a[3].parent, 1);
  ASSERT_EQ(a[3].length, 6);
  larder_batch_release(b);
  larder_stream_close(s);
  larder_client_close(c);
  fake_free(&f);
  return 0;
}
