/*
 * test-cuda.c: CUDA streams (memory_kind LARDER_MEMORY_CUDA) end to end,
 * against a real larderd.
 *
 * Without a GPU the driver is the test double of tests/cuda-fake/
 * (build/<flavour>/lib/fake-cuda/libcuda.so.1, found beside larderd, or
 * $LARDER_TEST_FAKE_CUDA), which both this process and larderd load
 * through LARDER_LIBCUDA.  tests/cuda-real.sh sets LARDER_TEST_CUDA_REAL=1
 * to run the same tests on the real driver: then device memory is read
 * back only with cuMemcpyDtoH, and the tests that need the double's knobs
 * (its memory limit, its device count, pinning refused) skip that part.
 * Device bytes are always read through the driver (cuMemcpyDtoH), never
 * dereferenced.
 */
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lcuda.h"
#include "daemon-harness.h"

#ifdef LARDER_HAVE_CUDA_H

static int real_gpu(void) {
  const char *v = getenv("LARDER_TEST_CUDA_REAL");
  return v && *v && strcmp(v, "0") != 0;
}

/* Points this process (and the daemons it starts) at the driver the
 * tests use.  Returns 0, or 1 when the double is not built (skip). */
static int use_driver(void) {
  if (real_gpu()) return 0; /* libcuda.so.1, or the LARDER_LIBCUDA given */
  char path[1200];
  const char *env = getenv("LARDER_TEST_FAKE_CUDA");
  if (env && *env) {
    snprintf(path, sizeof(path), "%s", env);
  } else {
    const char *bin = getenv("LARDERD_BIN");
    char dir[1024];
    snprintf(dir, sizeof(dir), "%s", bin && *bin ? bin : "build/release/bin/larderd");
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof(dir), ".");
    snprintf(path, sizeof(path), "%s/../lib/fake-cuda/libcuda.so.1", dir);
  }
  if (access(path, R_OK) != 0) {
    fprintf(stderr, "skipped: no CUDA test double at %s (make it)\n", path);
    return 1;
  }
  char abs[PATH_MAX];
  ASSERT_NOT_NULL(realpath(path, abs));
  ASSERT_OK(setenv("LARDER_LIBCUDA", abs, 1));
  return 0;
}

static const lcuda_api_t *api(void) {
  char err[512];
  const lcuda_api_t *a = lcuda_load(err, sizeof(err));
  if (a == NULL) ASSERT_FAIL_("cannot load the CUDA driver: %s", err);
  return a;
}

static int num_devices(void) { return api()->num_devices; }

#define CU_OK(call)                                                             \
  do {                                                                          \
    CUresult r_ = (call);                                                       \
    if (r_ != CUDA_SUCCESS) {                                                   \
      char e_[160];                                                             \
      ASSERT_FAIL_("%s: %s", #call, lcuda_strerror(api(), r_, e_, sizeof(e_))); \
    }                                                                           \
  } while (0)

/* Reads n bytes of device memory of device at src (cuMemcpyDtoH, in the
 * device's primary context). */
static void dtoh(int device, void *dst, const void *src, size_t n) {
  if (n == 0) return;
  const lcuda_api_t *a = api();
  CUdevice d;
  CUcontext c, popped;
  CU_OK(a->cuDeviceGet(&d, device));
  CU_OK(a->cuDevicePrimaryCtxRetain(&c, d));
  CU_OK(a->cuCtxPushCurrent(c));
  CU_OK(a->cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, n));
  CU_OK(a->cuCtxPopCurrent(&popped));
  CU_OK(a->cuDevicePrimaryCtxRelease(d));
}

/* Asserts that device buffer dev (n bytes) holds what host buffer host
 * does. */
static void expect_dev_bytes(int device, const void *dev, const void *host, size_t n,
                             const char *what) {
  if (n == 0) return;
  ASSERT_NOT_NULL(dev);
  ASSERT_NOT_NULL(host);
  ASSERT(dev != host);
  uint8_t *buf = malloc(n);
  ASSERT_NOT_NULL(buf);
  dtoh(device, buf, dev, n);
  if (memcmp(buf, host, n) != 0) ASSERT_FAIL_("%s: the device bytes differ from the host's", what);
  free(buf);
}

static uint64_t offset_bytes(const larder_array_t *a) {
  return (uint64_t)(larder_array_length(a) + 1) * (larder_array_large_offsets(a) ? 8u : 4u);
}

/* Asserts that array d of a CUDA batch on device holds array h of a host
 * batch: the same lengths and counts, and each buffer's bytes. */
static void expect_same_array(int device, const larder_array_t *h, const larder_array_t *d) {
  const char *name = larder_array_name(h);
  ASSERT_STR_EQ(larder_array_name(d), name);
  ASSERT_EQ(larder_array_type(d), larder_array_type(h));
  ASSERT_EQ(larder_array_length(d), larder_array_length(h));
  ASSERT_EQ(larder_array_null_count(d), larder_array_null_count(h));
  ASSERT_EQ(larder_array_memory_kind(h), LARDER_MEMORY_HOST);
  ASSERT_EQ(larder_array_memory_kind(d), LARDER_MEMORY_CUDA);
  int64_t len = larder_array_length(h);
  if (larder_array_validity(h))
    expect_dev_bytes(device, larder_array_validity(d), larder_array_validity(h),
                     (size_t)(len + 7) / 8, name);
  else ASSERT_NULL(larder_array_validity(d));
  if (larder_array_offsets(h))
    expect_dev_bytes(device, larder_array_offsets(d), larder_array_offsets(h),
                     (size_t)offset_bytes(h), name);
  if (larder_array_large_offsets(h))
    expect_dev_bytes(device, larder_array_large_offsets(d), larder_array_large_offsets(h),
                     (size_t)offset_bytes(h), name);
  ASSERT_UINT_EQ(larder_array_values_size(d), larder_array_values_size(h));
  expect_dev_bytes(device, larder_array_values(d), larder_array_values(h),
                   (size_t)larder_array_values_size(h), name);
  ASSERT_EQ(larder_array_num_children(d), larder_array_num_children(h));
  for (int i = 0; i < larder_array_num_children(h); i++)
    expect_same_array(device, larder_array_child(h, i), larder_array_child(d, i));
}

static void expect_same_batch(int device, const larder_batch_t *h, const larder_batch_t *d) {
  ASSERT_EQ(larder_batch_memory_kind(h), LARDER_MEMORY_HOST);
  ASSERT_EQ(larder_batch_device(h), -1);
  ASSERT_EQ(larder_batch_memory_kind(d), LARDER_MEMORY_CUDA);
  ASSERT_EQ(larder_batch_device(d), device);
  ASSERT_UINT_EQ(larder_batch_epoch(d), larder_batch_epoch(h));
  ASSERT_UINT_EQ(larder_batch_index(d), larder_batch_index(h));
  ASSERT_EQ(larder_batch_num_rows(d), larder_batch_num_rows(h));
  ASSERT_UINT_EQ(larder_batch_bytes(d), larder_batch_bytes(h));
  ASSERT_EQ(larder_batch_num_columns(d), larder_batch_num_columns(h));
  for (int i = 0; i < larder_batch_num_columns(h); i++)
    expect_same_array(device, larder_batch_column(h, i), larder_batch_column(d, i));
}

static void std_opts(larder_stream_options_t *o, uint32_t batch_size, uint64_t epochs) {
  dh_std_opts(o, dh_std_source(), 1, batch_size, 8, epochs, 1u << 20);
}

static void cuda_opts(larder_stream_options_t *o, uint32_t batch_size, uint64_t epochs, int dev) {
  std_opts(o, batch_size, epochs);
  o->memory_kind = LARDER_MEMORY_CUDA;
  o->cuda_device = dev;
}

/* Waits up to 20 s for the daemon's cuda_device_bytes to be want. */
static void wait_cuda_bytes(const dh_daemon *d, uint64_t want) {
  uint64_t v = 0;
  for (int i = 0; i < 400 * dh_slow(); i++) {
    v = dh_stat(d, "cuda_device_bytes");
    if (v == want) return;
    usleep(50000);
  }
  ASSERT_FAIL_("cuda_device_bytes is %llu, not %llu", (unsigned long long)v,
               (unsigned long long)want);
}

/* Forks a trainer that opens a stream with co on d and takes `batches`
 * batches, kills it holding them, and waits for the daemon to free its
 * region and stream.  Call it before this process starts CUDA or a client
 * thread: neither survives fork. */
static void trainer_killed(const dh_daemon *d, const larder_stream_options_t *co, int batches) {
  int ready[2];
  ASSERT_OK(pipe(ready));
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(ready[0]);
    larder_client_t *c;
    larder_stream_t *s;
    larder_batch_t *b;
    if (larder_client_connect(d->socket, &c) || larder_stream_open(c, co, &s)) _exit(2);
    for (int i = 0; i < batches; i++)
      if (larder_stream_next(s, 60000, &b)) _exit(3);
    if (write(ready[1], "x", 1) != 1) _exit(4);
    for (;;) pause();
  }
  close(ready[1]);
  char x;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  close(ready[0]);
  ASSERT_GE(dh_stat(d, "cuda_device_bytes"), co->arena_bytes);
  kill(pid, SIGKILL);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  wait_cuda_bytes(d, 0);
  ASSERT_EQ(dh_stat(d, "streams"), 0);
}

/* Reads a host stream and a CUDA stream with the same options side by
 * side, comparing every batch; returns the batches read. */
static uint64_t compare_streams(const char *socket, const larder_stream_options_t *host_o,
                                const larder_stream_options_t *cuda_o, const dh_daemon *d) {
  larder_client_t *hc, *cc;
  ASSERT_OK(larder_client_connect(socket, &hc));
  ASSERT_OK(larder_client_connect(socket, &cc));
  larder_stream_t *hs, *cs;
  ASSERT_OK(larder_stream_open(hc, host_o, &hs));
  int rc = larder_stream_open(cc, cuda_o, &cs);
  if (rc) ASSERT_FAIL_("CUDA open: %s: %s", larder_err_name(rc), larder_client_last_error(cc));
  ASSERT_UINT_EQ(larder_stream_batches_per_epoch(cs), larder_stream_batches_per_epoch(hs));
  uint64_t p1, p2, q1, q2;
  larder_stream_position(cs, &p1, &p2);
  larder_stream_position(hs, &q1, &q2);
  ASSERT_UINT_EQ(p1, q1);
  ASSERT_UINT_EQ(p2, q2);
  if (d) ASSERT_GE(dh_stat(d, "cuda_device_bytes"), cuda_o->arena_bytes);
  uint64_t n = 0;
  for (;;) {
    larder_batch_t *hb = NULL, *cb = NULL;
    int hr = larder_stream_next(hs, 60000 * dh_slow(), &hb);
    int cr = larder_stream_next(cs, 60000 * dh_slow(), &cb);
    if (cr && cr != LARDER_EEOF)
      ASSERT_FAIL_("CUDA next: %s: %s", larder_err_name(cr), larder_client_last_error(cc));
    ASSERT_EQ(cr, hr);
    if (hr == LARDER_EEOF) break;
    ASSERT_OK(hr);
    expect_same_batch(cuda_o->cuda_device, hb, cb);
    larder_batch_release(hb);
    larder_batch_release(cb);
    n++;
  }
  larder_stream_close(hs);
  larder_stream_close(cs);
  larder_client_close(hc);
  larder_client_close(cc);
  return n;
}

/*
 * A CUDA stream delivers, in device memory, the bytes a host stream with
 * the same options delivers in host memory: every buffer of every array of
 * every batch, over two epochs, with nulls, strings and lists; from a
 * resume position too; with the arena pinned or (pinning refused) not.
 * The device region counts in cuda_device_bytes while the stream is open
 * and no more once it is closed; the copies count in cuda_copies.
 */
TEST_IMPL(cuda_values_match) {
  if (use_driver()) return 0;
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t ho, co;
  std_opts(&ho, 100, 2);
  ho.window = 4;
  cuda_opts(&co, 100, 2, 0);
  co.window = 4;
  uint64_t n = compare_streams(d.socket, &ho, &co, &d);
  ASSERT_EQ(n, 2 * ((DH_STD_ROWS + 99) / 100));
  /* Every batch went to the device, in one copy or one per column, and
   * the stats count them. */
  ASSERT_GE(dh_stat(&d, "cuda_copies"), n);
  ASSERT_GE(dh_stat(&d, "cuda_copy_bytes"), n * 100);
  ASSERT(dh_stat(&d, "cuda_copy_ns") > 0);
  wait_cuda_bytes(&d, 0);
  /* Resume mid-epoch, from batch 37, on the other device where there is
   * one. */
  int dev = num_devices() > 1 ? 1 : 0;
  ho.start_batch = co.start_batch = 37;
  ho.epochs = co.epochs = 1;
  co.cuda_device = dev;
  n = compare_streams(d.socket, &ho, &co, &d);
  ASSERT_EQ(n, (DH_STD_ROWS + 99) / 100 - 37);
  wait_cuda_bytes(&d, 0);
  dh_stop(&d);
  if (!real_gpu()) {
    /* Pinning refused: copies from pageable memory, the same bytes. */
    ASSERT_OK(setenv("LARDER_FAKE_CUDA_NO_PIN", "1", 1));
    dh_start(&d);
    ho.start_batch = co.start_batch = 0;
    n = compare_streams(d.socket, &ho, &co, &d);
    ASSERT_EQ(n, (DH_STD_ROWS + 99) / 100);
    char *log = dh_read_log(&d);
    ASSERT_NOT_NULL(log);
    ASSERT_STR_CONTAINS(log, "cannot pin arenas");
    free(log);
    ASSERT_OK(unsetenv("LARDER_FAKE_CUDA_NO_PIN"));
    wait_cuda_bytes(&d, 0);
    dh_stop(&d);
  }
  return 0;
}

/*
 * A small arena, so that batches wrap around it and are split into one
 * region per column (the daemon's arena_alloc_parts): each part is copied
 * to the device, and the bytes still match the host stream's.  Batches go
 * as frames here (no descriptor ring), the other path to the trainer.
 */
TEST_IMPL(cuda_small_arena) {
  if (use_driver()) return 0;
  static const char *const frames_flags[] = {"--shm_ring=false", NULL};
  dh_daemon d;
  dh_init(&d, "d", frames_flags);
  dh_start(&d);
  larder_stream_options_t ho, co;
  std_opts(&ho, 300, 1);
  ho.arena_bytes = 96 << 10;
  ho.window = 3;
  cuda_opts(&co, 300, 1, 0);
  co.arena_bytes = ho.arena_bytes;
  co.window = 3;
  uint64_t n = compare_streams(d.socket, &ho, &co, &d);
  ASSERT_EQ(n, (DH_STD_ROWS + 299) / 300);
  wait_cuda_bytes(&d, 0);
  dh_stop(&d);
  return 0;
}

/*
 * The exports of a CUDA batch: Arrow's device array says CUDA, the device
 * and no sync event, with the buffers the accessors return (device
 * pointers whose bytes are the host stream's), and its release releases
 * the batch; DLPack makes a tensor per fixed-width column (NULL for the
 * others) on kDLCUDA, and the batch is released by the last deleter, not
 * before.  A second export of a batch is refused, a direct release of an
 * exported one ignored.
 */
TEST_IMPL(cuda_exports) {
  if (use_driver()) return 0;
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t ho, co;
  std_opts(&ho, 64, 1);
  ho.window = 1;
  cuda_opts(&co, 64, 1, 0);
  co.window = 1;
  larder_client_t *hc, *cc;
  ASSERT_OK(larder_client_connect(d.socket, &hc));
  ASSERT_OK(larder_client_connect(d.socket, &cc));
  larder_stream_t *hs, *cs;
  ASSERT_OK(larder_stream_open(hc, &ho, &hs));
  ASSERT_OK(larder_stream_open(cc, &co, &cs));
  int timeout = 60000 * dh_slow();

  /* Arrow, device flavour. */
  larder_batch_t *hb, *cb;
  ASSERT_OK(larder_stream_next(hs, timeout, &hb));
  ASSERT_OK(larder_stream_next(cs, timeout, &cb));
  struct ArrowSchema schema;
  struct ArrowDeviceArray arr;
  ASSERT_OK(larder_batch_export_device(cb, &schema, &arr));
  ASSERT_EQ(arr.device_type, ARROW_DEVICE_CUDA);
  ASSERT_EQ(arr.device_id, 0);
  ASSERT_NULL(arr.sync_event);
  ASSERT_EQ(arr.array.length, larder_batch_num_rows(hb));
  ASSERT_EQ(arr.array.n_children, larder_batch_num_columns(hb));
  for (int i = 0; i < larder_batch_num_columns(hb); i++) {
    const larder_array_t *ha = larder_batch_column(hb, i);
    const struct ArrowArray *c = arr.array.children[i];
    ASSERT_EQ(c->length, larder_array_length(ha));
    ASSERT_EQ(c->null_count, larder_array_null_count(ha));
    ASSERT_PTR_EQ(c->buffers[0], larder_array_validity(larder_batch_column(cb, i)));
    if (c->n_buffers == 2 && larder_array_offsets(ha) == NULL && c->n_children == 0)
      expect_dev_bytes(0, c->buffers[1], larder_array_values(ha),
                       (size_t)larder_array_values_size(ha), larder_array_name(ha));
    if (c->n_buffers == 3) {
      expect_dev_bytes(0, c->buffers[1], larder_array_offsets(ha), (size_t)offset_bytes(ha),
                       larder_array_name(ha));
      expect_dev_bytes(0, c->buffers[2], larder_array_values(ha),
                       (size_t)larder_array_values_size(ha), larder_array_name(ha));
    }
  }
  ASSERT_EQ(larder_batch_export_device(cb, &schema, &arr), LARDER_EINVAL);
  larder_batch_release(cb); /* ignored: the array owns it */
  larder_batch_t *none;
  ASSERT_EQ(larder_stream_next(cs, 300, &none), LARDER_ETIMEDOUT);
  schema.release(&schema);
  arr.array.release(&arr.array);
  larder_batch_release(hb);

  /* DLPack: the window of one batch shows when the batch is released. */
  ASSERT_OK(larder_stream_next(hs, timeout, &hb));
  ASSERT_OK(larder_stream_next(cs, timeout, &cb));
  int nc = larder_batch_num_columns(cb);
  DLManagedTensor *t[DH_NUM_COLS + 4];
  ASSERT_EQ(nc, DH_NUM_COLS);
  int made = larder_batch_export_dlpack(cb, t, nc);
  ASSERT_EQ(made, 4); /* id, label, x, opt; not name, tags */
  ASSERT_NULL(t[DH_COL_NAME]);
  ASSERT_NULL(t[DH_COL_TAGS]);
  int live = 0;
  for (int i = 0; i < nc; i++) {
    if (t[i] == NULL) continue;
    const larder_array_t *ha = larder_batch_column(hb, i);
    const DLTensor *x = &t[i]->dl_tensor;
    ASSERT_EQ(x->device.device_type, kDLCUDA);
    ASSERT_EQ(x->device.device_id, 0);
    ASSERT_EQ(x->ndim, 1);
    ASSERT_EQ(x->shape[0], larder_array_length(ha));
    ASSERT_NULL(x->strides);
    ASSERT_UINT_EQ(x->byte_offset, 0);
    ASSERT_PTR_EQ(x->data, larder_array_values(larder_batch_column(cb, i)));
    ASSERT_EQ(x->dtype.lanes, 1);
    ASSERT_EQ((uint64_t)x->dtype.bits / 8 * (uint64_t)x->shape[0], larder_array_values_size(ha));
    expect_dev_bytes(0, x->data, larder_array_values(ha), (size_t)larder_array_values_size(ha),
                     larder_array_name(ha));
    live++;
  }
  ASSERT_EQ(t[DH_COL_ID]->dl_tensor.dtype.code, kDLInt);
  ASSERT_EQ(t[DH_COL_ID]->dl_tensor.dtype.bits, 64);
  ASSERT_EQ(t[DH_COL_LABEL]->dl_tensor.dtype.bits, 32);
  ASSERT_EQ(t[DH_COL_X]->dl_tensor.dtype.code, kDLFloat);
  DLManagedTensor *again[DH_NUM_COLS];
  ASSERT_EQ(larder_batch_export_dlpack(cb, again, nc), LARDER_EINVAL);
  for (int i = 0; i < nc; i++) ASSERT_NULL(again[i]);
  ASSERT_EQ(larder_batch_export_device(cb, &schema, &arr), LARDER_EINVAL);
  larder_batch_release(cb); /* ignored */
  for (int i = 0; i < nc; i++) {
    if (t[i] == NULL) continue;
    ASSERT_EQ(larder_stream_next(cs, 200, &none), LARDER_ETIMEDOUT);
    t[i]->deleter(t[i]);
    live--;
  }
  ASSERT_EQ(live, 0);
  larder_batch_release(hb);
  /* The last deleter released it: the next batch comes. */
  ASSERT_OK(larder_stream_next(cs, timeout, &cb));
  ASSERT_OK(larder_stream_next(hs, timeout, &hb));
  expect_same_batch(0, hb, cb);
  larder_batch_release(hb);
  larder_batch_release(cb);
  /* Host batches export too, as host memory. */
  ASSERT_OK(larder_stream_next(hs, timeout, &hb));
  ASSERT_OK(larder_batch_export_device(hb, &schema, &arr));
  ASSERT_EQ(arr.device_type, ARROW_DEVICE_CPU);
  schema.release(&schema);
  arr.array.release(&arr.array);
  larder_stream_close(hs);
  larder_stream_close(cs);
  larder_client_close(hc);
  larder_client_close(cc);
  wait_cuda_bytes(&d, 0);
  dh_stop(&d);
  return 0;
}

/* cuda_close_holding on d, whose regions are legacy ones (parked) or, with
 * fd_handles, descriptors (freed on the daemon's side at once). */
static void close_holding(const dh_daemon *d, int fd_handles) {
  larder_stream_options_t ho, co;
  std_opts(&ho, 100, 1);
  cuda_opts(&co, 100, 1, 0);
  larder_client_t *hc, *cc;
  ASSERT_OK(larder_client_connect(d->socket, &hc));
  ASSERT_OK(larder_client_connect(d->socket, &cc));
  larder_stream_t *hs, *cs;
  ASSERT_OK(larder_stream_open(hc, &ho, &hs));
  ASSERT_OK(larder_stream_open(cc, &co, &cs));
  int timeout = 60000 * dh_slow();
  larder_batch_t *hb[2], *cb[2];
  for (int i = 0; i < 2; i++) {
    ASSERT_OK(larder_stream_next(hs, timeout, &hb[i]));
    ASSERT_OK(larder_stream_next(cs, timeout, &cb[i]));
  }
  DLManagedTensor *t[DH_NUM_COLS];
  ASSERT_EQ(larder_batch_export_dlpack(cb[1], t, DH_NUM_COLS), 4);
  uint64_t held = dh_stat(d, "cuda_device_bytes");
  ASSERT_GE(held, co.arena_bytes);
  larder_stream_close(cs);
  if (fd_handles) {
    wait_cuda_bytes(d, 0);
    held = 0;
  } else {
    usleep(300000);
    ASSERT_UINT_EQ(dh_stat(d, "cuda_device_bytes"), held);
  }
  ASSERT_EQ(dh_stat(d, "streams"), 1); /* the host stream's */
  expect_same_batch(0, hb[0], cb[0]);
  const larder_array_t *id = larder_batch_column(hb[1], DH_COL_ID);
  expect_dev_bytes(0, t[DH_COL_ID]->dl_tensor.data, larder_array_values(id),
                   (size_t)larder_array_values_size(id), "id");
  larder_batch_release(cb[0]);
  usleep(200000);
  ASSERT_UINT_EQ(dh_stat(d, "cuda_device_bytes"), held);
  for (int i = 0; i < DH_NUM_COLS; i++)
    if (t[i]) t[i]->deleter(t[i]);
  wait_cuda_bytes(d, 0);
  for (int i = 0; i < 2; i++) larder_batch_release(hb[i]);
  larder_stream_close(hs);
  larder_client_close(hc);
  larder_client_close(cc);
  /* The client's second CloseStream finds nothing more to free. */
  ASSERT_UINT_EQ(dh_stat(d, "cuda_device_bytes"), 0);
}

/*
 * A CUDA stream closed while the trainer holds its batches (one directly,
 * one as DLPack tensors): the batches stay valid on the device, as a host
 * stream's do, and the daemon keeps the region, which the driver forbids
 * freeing while this process maps it (the test double aborts larderd if
 * it does), until the last one is released; then it goes.
 */
TEST_IMPL(cuda_close_holding) {
  if (use_driver()) return 0;
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  close_holding(&d, 0);
  dh_stop(&d);
  return 0;
}

/* Opens n CUDA streams with co on c, takes a batch of each into b[] and
 * closes the streams: their regions stay parked while b[] is held. */
static void close_holding_batches(larder_client_t *c, const larder_stream_options_t *co,
                                  larder_batch_t **b, int n) {
  for (int i = 0; i < n; i++) {
    larder_stream_t *s;
    ASSERT_OK(larder_stream_open(c, co, &s));
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b[i]));
    larder_stream_close(s);
  }
}

/*
 * Closed CUDA streams whose batches the trainer still holds keep their
 * regions (legacy IPC), and count with the client's open streams against
 * max_streams_per_client: a client that closes streams holding a batch of
 * each cannot make the daemon keep regions without end.  The open past the
 * limit fails with LARDER_ELIMIT and says why; releasing a batch frees its
 * region and makes room.  With cuda_fd_handles nothing is kept, and the
 * limit counts open streams only.
 */
TEST_IMPL(cuda_held_regions_limit) {
  if (use_driver()) return 0;
  for (int fd_handles = 0; fd_handles < 2; fd_handles++) {
    static const char *const legacy[] = {"--max_streams_per_client=2", NULL};
    static const char *const fdh[] = {"--max_streams_per_client=2", "--cuda_fd_handles=true", NULL};
    dh_daemon d;
    dh_init(&d, "d", fd_handles ? fdh : legacy);
    dh_start(&d);
    larder_stream_options_t co;
    cuda_opts(&co, 100, 1, 0);
    co.arena_bytes = 1u << 20;
    larder_client_t *c;
    ASSERT_OK(larder_client_connect(d.socket, &c));
    larder_stream_t *s[3];
    larder_batch_t *b[2];
    close_holding_batches(c, &co, b, 2);
    if (!fd_handles) {
      ASSERT_UINT_EQ(dh_stat(&d, "cuda_device_bytes"), 4u << 20);
      ASSERT_EQ(larder_stream_open(c, &co, &s[2]), LARDER_ELIMIT);
      ASSERT_STR_CONTAINS(larder_client_last_error(c), "2 closed CUDA streams");
      ASSERT_STR_CONTAINS(larder_client_last_error(c), "max_streams_per_client");
      larder_batch_release(b[0]); /* its region goes: room for one */
      b[0] = NULL;
      wait_cuda_bytes(&d, 2u << 20);
    } else {
      wait_cuda_bytes(&d, 0);
    }
    ASSERT_OK(larder_stream_open(c, &co, &s[2]));
    larder_batch_t *x;
    ASSERT_OK(larder_stream_next(s[2], 60000 * dh_slow(), &x));
    larder_batch_release(x);
    larder_stream_close(s[2]);
    for (int i = 0; i < 2; i++)
      if (b[i]) larder_batch_release(b[i]);
    wait_cuda_bytes(&d, 0);
    larder_client_close(c);
    /* Both CloseStreams at once, while the stream's first batches are
     * being assembled (its tasks still run after the first): the second
     * unparks the region before the stream is freed, and the region goes
     * then, not with the connection. */
    for (int round = 0; round < 5; round++) {
      int fd = dh_raw_connect(d.socket);
      wire_free(dh_raw_hello(fd, WIRE_PROTOCOL_VERSION));
      int arena = -1;
      Larder__Frame *r = dh_raw_open(fd, 1, &co, &arena);
      ASSERT_NOT_NULL(r);
      ASSERT_EQ(r->msg_case, LARDER__FRAME__MSG_OPEN_STREAM_REPLY);
      uint32_t sid = r->open_stream_reply->stream_id;
      wire_free(r);
      if (arena >= 0) close(arena);
      uint8_t buf[256];
      size_t used = 0;
      for (int held = 1; held >= 0; held--) {
        Larder__CloseStream cs = LARDER__CLOSE_STREAM__INIT;
        cs.stream_id = sid;
        cs.device_memory_held = held;
        Larder__Frame cf = LARDER__FRAME__INIT;
        cf.msg_case = LARDER__FRAME__MSG_CLOSE_STREAM;
        cf.close_stream = &cs;
        size_t len;
        uint8_t *e = wire_encode(&cf, &len);
        ASSERT_NOT_NULL(e);
        ASSERT(used + len <= sizeof(buf));
        memcpy(buf + used, e, len);
        used += len;
        free(e);
      }
      ASSERT_OK(dh_raw_write(fd, buf, used));
      wait_cuda_bytes(&d, 0); /* the connection still open */
      close(fd);
    }
    dh_stop(&d);
  }
  return 0;
}

/*
 * The device memory of closed CUDA streams' regions that the trainer still
 * maps (legacy IPC, parked) counts with its arenas against
 * max_arena_bytes_per_client, and over a user's connections against
 * max_arena_bytes_per_uid: closing streams while holding a batch of each
 * cannot take more of a GPU than those allow.  Each 1 MiB arena's region
 * takes 2 MiB of device memory (REGION_ALIGN).  The open past a limit
 * fails with LARDER_ELIMIT and says why; releasing a batch frees its
 * region and makes room.
 */
TEST_IMPL(cuda_held_regions_bytes) {
  if (use_driver()) return 0;
  for (int per_uid = 0; per_uid < 2; per_uid++) {
    static const char *const client_fl[] = {"--max_arena_bytes_per_client=5M", NULL};
    static const char *const uid_fl[] = {"--max_arena_bytes_per_uid=5M", NULL};
    dh_daemon d;
    dh_init(&d, "d", per_uid ? uid_fl : client_fl);
    dh_start(&d);
    larder_stream_options_t co;
    cuda_opts(&co, 100, 1, 0);
    co.arena_bytes = 1u << 20;
    larder_client_t *c, *other;
    ASSERT_OK(larder_client_connect(d.socket, &c));
    ASSERT_OK(larder_client_connect(d.socket, &other));
    larder_client_t *asks = per_uid ? other : c;
    larder_stream_t *s2;
    larder_batch_t *b[2];
    close_holding_batches(c, &co, b, 2);
    ASSERT_UINT_EQ(dh_stat(&d, "cuda_device_bytes"), 4u << 20);
    ASSERT_EQ(larder_stream_open(asks, &co, &s2), LARDER_ELIMIT);
    ASSERT_STR_CONTAINS(larder_client_last_error(asks), "CUDA regions");
    ASSERT_STR_CONTAINS(larder_client_last_error(asks),
                        per_uid ? "max_arena_bytes_per_uid" : "max_arena_bytes_per_client");
    larder_batch_release(b[0]); /* its region goes: room for one more */
    wait_cuda_bytes(&d, 2u << 20);
    ASSERT_OK(larder_stream_open(asks, &co, &s2));
    larder_batch_t *x;
    ASSERT_OK(larder_stream_next(s2, 60000 * dh_slow(), &x));
    larder_batch_release(x);
    larder_stream_close(s2);
    larder_batch_release(b[1]);
    wait_cuda_bytes(&d, 0);
    larder_client_close(other);
    larder_client_close(c);
    dh_stop(&d);
  }
  return 0;
}

/* A CUDA stream's open on a thread of its own: its result, and when it
 * returned. */
typedef struct slow_open {
  const char *socket;
  larder_stream_options_t o;
  int rc;
  atomic_int done;
  larder_client_t *c;
  larder_stream_t *s;
} slow_open_t;

static void *slow_open_run(void *arg) {
  slow_open_t *so = arg;
  so->rc = larder_client_connect(so->socket, &so->c);
  if (so->rc == 0) so->rc = larder_stream_open(so->c, &so->o, &so->s);
  atomic_store(&so->done, 1);
  return NULL;
}

/* Closes the double's pin gate (LARDER_FAKE_CUDA_PIN_GATE): the next pin
 * or unpin waits, and makes `held`. */
static void close_gate(const char *gate, const char *held) {
  (void)unlink(held);
  FILE *f = fopen(gate, "w");
  ASSERT_NOT_NULL(f);
  fclose(f);
}

/* Waits (20 s at most) for a driver call to wait at the gate (`held`),
 * then reads 20 batches of a host stream with ho, and asks larderctl. */
static void host_while_held(const dh_daemon *d, const char *held,
                            const larder_stream_options_t *ho) {
  for (int i = 0; access(held, F_OK) != 0; i++) {
    ASSERT(i < 2000 * dh_slow());
    usleep(10000);
  }
  dh_run run = {0};
  ASSERT_OK(dh_collect(d->socket, ho, 20, &run));
  ASSERT_EQ(run.n, 20);
  dh_run_free(&run);
  ASSERT_GE(dh_stat(d, "batches"), 20);
}

/*
 * A CUDA stream's region is opened on a worker, not on the loop: while
 * the driver takes its time (the double holds cuMemHostRegister, pinning
 * the arena, until the test lets go; a real driver takes up to a second
 * for a large arena, and longer for a device's first context), other
 * trainers' host streams open and deliver, and larderctl answers.  Then
 * the CUDA stream opens and delivers the host stream's bytes.  Its region
 * is freed on a worker too, parked or not: while the double holds
 * cuMemHostUnregister, host streams deliver.
 */
TEST_IMPL(cuda_open_off_loop) {
  if (use_driver()) return 0;
  char gate[600], held[640];
  snprintf(gate, sizeof(gate), "%s/pin-gate", test_tmpdir());
  snprintf(held, sizeof(held), "%s.held", gate);
  close_gate(gate, held);
  ASSERT_OK(setenv("LARDER_FAKE_CUDA_PIN_GATE", gate, 1));
  /* One worker waits at the gate, another serves the host streams. */
  static const char *const fl[] = {"--workers=2", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  ASSERT_OK(unsetenv("LARDER_FAKE_CUDA_PIN_GATE"));
  slow_open_t so = {.socket = d.socket};
  cuda_opts(&so.o, 100, 1, 0);
  pthread_t t;
  ASSERT_OK(pthread_create(&t, NULL, slow_open_run, &so));
  /* The daemon is inside cuMemHostRegister for the CUDA stream. */
  larder_stream_options_t ho;
  std_opts(&ho, 100, 1);
  host_while_held(&d, held, &ho);
  ASSERT_EQ(atomic_load(&so.done), 0);
  ASSERT_OK(unlink(gate));
  ASSERT_OK(pthread_join(t, NULL));
  ASSERT_OK(so.rc);
  larder_batch_t *b;
  ASSERT_OK(larder_stream_next(so.s, 60000 * dh_slow(), &b));
  larder_client_t *hc;
  ASSERT_OK(larder_client_connect(d.socket, &hc));
  larder_stream_t *hs;
  ASSERT_OK(larder_stream_open(hc, &ho, &hs));
  larder_batch_t *hb;
  ASSERT_OK(larder_stream_next(hs, 60000 * dh_slow(), &hb));
  expect_same_batch(0, hb, b);
  larder_batch_release(hb);
  larder_batch_release(b);
  larder_stream_close(hs);
  larder_client_close(hc);
  /* Its close: the region goes on a worker too, whose unpinning the
   * double holds while host streams deliver. */
  close_gate(gate, held);
  larder_stream_close(so.s);
  host_while_held(&d, held, &ho);
  ASSERT_UINT_EQ(dh_stat(&d, "cuda_device_bytes"), 2u << 20);
  ASSERT_OK(unlink(gate));
  wait_cuda_bytes(&d, 0);
  /* Closed while the trainer holds a batch: the region is parked, and
   * the arena is unpinned on a worker too. */
  ASSERT_OK(larder_stream_open(so.c, &so.o, &so.s));
  ASSERT_OK(larder_stream_next(so.s, 60000 * dh_slow(), &b));
  close_gate(gate, held);
  larder_stream_close(so.s);
  host_while_held(&d, held, &ho);
  ASSERT_OK(unlink(gate));
  larder_batch_release(b); /* lets the parked region go */
  wait_cuda_bytes(&d, 0);
  larder_client_close(so.c);
  dh_stop(&d);
  return 0;
}

/*
 * A client that opens CUDA streams and never reads the replies: one whose
 * stream fails while its reply waits gets the error instead of the reply;
 * past CONN_MAX_PENDING_FD_FRAMES (64) replies waiting behind its full
 * socket, opens are refused with LARDER_EBUSY, and their regions, whose
 * handles never left the daemon, are freed at once, neither kept for the
 * client nor counted against its streams; the rest go with the
 * connection.
 */
TEST_IMPL(cuda_open_replies_unread) {
  if (use_driver()) return 0;
  static const char *const fl[] = {"--max_streams_per_client=100", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  larder_stream_options_t co;
  cuda_opts(&co, 100, 1, 0);
  Larder__OpenStream req = LARDER__OPEN_STREAM__INIT;
  req.n_sources = co.num_sources;
  req.sources = (char **)(uintptr_t)co.sources;
  req.epochs = co.epochs;
  req.world_size = 1;
  req.memory_kind = LARDER__MEMORY_KIND__MEMORY_CUDA;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_OPEN_STREAM;
  f.open_stream = &req;
  for (int part = 0; part < 2; part++) {
    int fd = dh_raw_connect(d.socket);
    wire_free(dh_raw_hello(fd, WIRE_PROTOCOL_VERSION));
    /* Refused requests, whose errors fill the socket to the client. */
    size_t len;
    uint8_t *bad = dh_open_frame(7, NULL, 0, 0, &len);
    for (int k = 0; k < 3 * 4096; k++) ASSERT_OK(dh_raw_write(fd, bad, len));
    free(bad);
    usleep(300000);
    if (part == 0) {
      /* A stream that fails at its first batch (larger than its arena)
       * while its reply waits unread: the reply is withdrawn, so that no
       * handle of a region freed now reaches the client, whose open gets
       * the stream's error instead. */
      req.request_id = 2;
      req.batch_size = 4000;
      req.arena_bytes = 64u << 10;
      uint64_t errors = dh_stat(&d, "stream_errors");
      ASSERT_OK(dh_raw_send(fd, &f));
      double until = test_now_ms() + 10000.0 * dh_slow();
      while (dh_stat(&d, "stream_errors") == errors && test_now_ms() < until) usleep(1000);
      ASSERT_UINT_EQ(dh_stat(&d, "stream_errors"), errors + 1);
      wait_cuda_bytes(&d, 0);
      /* The client reads at last: the error, and no reply. */
      int seen = 0;
      for (;;) {
        int fds[8], nfds = 0, rc = 0;
        Larder__Frame *r = dh_raw_recv(fd, 2000 * dh_slow(), fds, &nfds, &rc);
        for (int i = 0; i < nfds; i++) close(fds[i]);
        if (r == NULL) break;
        ASSERT(r->msg_case != LARDER__FRAME__MSG_OPEN_STREAM_REPLY);
        if (r->msg_case == LARDER__FRAME__MSG_ERROR && r->error->request_id == 2) {
          ASSERT_STR_CONTAINS(r->error->message, "arena");
          seen++;
        }
        wire_free(r);
      }
      ASSERT_EQ(seen, 1);
      close(fd);
      continue;
    }
    req.request_id = 1;
    req.batch_size = co.batch_size;
    req.arena_bytes = 1u << 20;
    /* One at a time: opens in progress at once are limited too. */
    for (int k = 0; k < 70; k++) {
      uint64_t opened = dh_stat(&d, "streams_opened");
      ASSERT_OK(dh_raw_send(fd, &f));
      double deadline = test_now_ms() + 10000.0 * dh_slow();
      while (dh_stat(&d, "streams_opened") == opened && test_now_ms() < deadline) usleep(1000);
      ASSERT_UINT_EQ(dh_stat(&d, "streams_opened"), opened + 1);
    }
    ASSERT_UINT_EQ(dh_stat(&d, "streams"), 64);
    wait_cuda_bytes(&d, 64u * (2u << 20));
    close(fd);
    wait_cuda_bytes(&d, 0);
  }
  dh_stop(&d);
  return 0;
}

/* The GPU of the double, busy until a thread of the test makes it idle:
 * events recorded while the file $LARDER_FAKE_CUDA_GPU_BUSY names exists
 * pass once it is gone. */
typedef struct busy_gpu {
  char path[700];
  int delay_ms;
  double idle_at; /* test_now_ms() when it was removed */
  pthread_t thread;
} busy_gpu;

static void gpu_busy(busy_gpu *g) {
  snprintf(g->path, sizeof(g->path), "%s/gpu-busy", test_tmpdir());
  FILE *f = fopen(g->path, "w");
  ASSERT_NOT_NULL(f);
  fclose(f);
  ASSERT_OK(setenv("LARDER_FAKE_CUDA_GPU_BUSY", g->path, 1));
}

static void *gpu_idle_later(void *arg) {
  busy_gpu *g = arg;
  usleep((useconds_t)g->delay_ms * 1000);
  g->idle_at = test_now_ms(); /* read after the join */
  unlink(g->path);
  return NULL;
}

static void *release_batch(void *b) {
  larder_batch_release(b);
  return NULL;
}

/* Makes the GPU idle delay_ms from now, on a thread of its own. */
static void gpu_idle_in(busy_gpu *g, int delay_ms) {
  g->delay_ms = delay_ms;
  g->idle_at = 0;
  ASSERT_OK(pthread_create(&g->thread, NULL, gpu_idle_later, g));
}

/* Joins the thread, and asserts that it made the GPU idle before `then`
 * (a test_now_ms() taken after what had to wait for it). */
static void expect_waited_for_gpu(busy_gpu *g, double then, const char *what) {
  ASSERT_OK(pthread_join(g->thread, NULL));
  double idle = g->idle_at;
  if (idle == 0 || then < idle)
    ASSERT_FAIL_("%s returned before the GPU's work ended (%.1f ms before)", what, idle - then);
}

/*
 * A CUDA batch's release waits for the GPU work queued before it (the
 * double's busy GPU stands in for kernels still reading the batch), so the
 * daemon never copies another batch over memory the GPU still reads.
 * With a window of 2 and both batches held: one released directly, and
 * one through DLPack (as PyTorch frees a tensor once its kernels are
 * queued), while the GPU is busy: the daemon hears of neither, and the
 * next batch comes only once the GPU is done (larder_stream_next waits for
 * it rather than for the daemon).  larder_stream_close waits for the
 * releases it holds back too, and a batch held past the close unmaps the
 * region only after its GPU work, after which the daemon frees it.  The
 * bytes stay the host stream's throughout.
 */
TEST_IMPL(cuda_release_fenced) {
  if (use_driver()) return 0;
  if (real_gpu()) {
    fprintf(stderr, "skipped: needs the test double's busy GPU\n");
    return 0;
  }
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t ho, co;
  std_opts(&ho, 100, 1);
  ho.window = 2;
  cuda_opts(&co, 100, 1, 0);
  co.window = 2;
  larder_client_t *hc, *cc;
  ASSERT_OK(larder_client_connect(d.socket, &hc));
  ASSERT_OK(larder_client_connect(d.socket, &cc));
  larder_stream_t *hs, *cs;
  ASSERT_OK(larder_stream_open(hc, &ho, &hs));
  ASSERT_OK(larder_stream_open(cc, &co, &cs));
  int timeout = 60000 * dh_slow();
  larder_batch_t *hb[4], *cb[4];
  for (int i = 0; i < 2; i++) {
    ASSERT_OK(larder_stream_next(hs, timeout, &hb[i]));
    ASSERT_OK(larder_stream_next(cs, timeout, &cb[i]));
    expect_same_batch(0, hb[i], cb[i]);
  }
  busy_gpu g;
  gpu_busy(&g);
  /* Released directly. */
  larder_batch_release(cb[0]);
  larder_batch_release(hb[0]);
  ASSERT_OK(larder_stream_flush(cs));
  gpu_idle_in(&g, 300);
  ASSERT_OK(larder_stream_next(cs, timeout, &cb[2]));
  expect_waited_for_gpu(&g, test_now_ms(), "the next batch");
  ASSERT_OK(larder_stream_next(hs, timeout, &hb[2]));
  expect_same_batch(0, hb[2], cb[2]);
  /* Through DLPack. */
  gpu_busy(&g);
  DLManagedTensor *t[DH_NUM_COLS];
  ASSERT_EQ(larder_batch_export_dlpack(cb[1], t, DH_NUM_COLS), 4);
  for (int i = 0; i < DH_NUM_COLS; i++)
    if (t[i]) t[i]->deleter(t[i]);
  larder_batch_release(hb[1]);
  gpu_idle_in(&g, 300);
  ASSERT_OK(larder_stream_next(cs, timeout, &cb[3]));
  expect_waited_for_gpu(&g, test_now_ms(), "the next batch after DLPack's release");
  ASSERT_OK(larder_stream_next(hs, timeout, &hb[3]));
  expect_same_batch(0, hb[3], cb[3]);
  /* An event loop: the reader got LARDER_ETIMEDOUT and waits on the
   * stream's descriptor, and another thread releases a batch while the
   * GPU is busy: that release waits for the GPU itself (no later call of
   * the reader's would send it), and the descriptor wakes the reader. */
  larder_batch_t *none;
  ASSERT_EQ(larder_stream_next(cs, 0, &none), LARDER_ETIMEDOUT);
  gpu_busy(&g);
  pthread_t releaser;
  ASSERT_OK(pthread_create(&releaser, NULL, release_batch, cb[3]));
  gpu_idle_in(&g, 300);
  struct pollfd pf = {larder_stream_fd(cs), POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, 60000 * dh_slow()), 1);
  expect_waited_for_gpu(&g, test_now_ms(), "the descriptor");
  ASSERT_OK(pthread_join(releaser, NULL));
  int rc;
  double until = test_now_ms() + 60000.0 * dh_slow();
  while ((rc = larder_stream_next(cs, 0, &cb[3])) == LARDER_ETIMEDOUT && test_now_ms() < until) {
    pf.revents = 0;
    (void)poll(&pf, 1, 100);
  }
  ASSERT_OK(rc);
  larder_batch_release(hb[3]);
  ASSERT_OK(larder_stream_next(hs, timeout, &hb[3]));
  expect_same_batch(0, hb[3], cb[3]);
  /* A CUDA stream the driver refuses (here a handle of none): the release
   * waits for all of the context's work instead, on the releasing
   * thread, and the next batch comes after it. */
  larder_stream_set_cuda_stream(cs, (void *)(uintptr_t)0x7000);
  gpu_busy(&g);
  ASSERT_OK(pthread_create(&releaser, NULL, release_batch, cb[2]));
  gpu_idle_in(&g, 300);
  ASSERT_OK(pthread_join(releaser, NULL));
  expect_waited_for_gpu(&g, test_now_ms(), "a release fenced on a stream refused");
  ASSERT_OK(larder_stream_next(cs, timeout, &cb[2]));
  larder_batch_release(hb[2]);
  ASSERT_OK(larder_stream_next(hs, timeout, &hb[2]));
  expect_same_batch(0, hb[2], cb[2]);
  larder_stream_set_cuda_stream(cs, NULL);
  /* The close waits for the releases held back. */
  gpu_busy(&g);
  larder_batch_release(cb[2]);
  gpu_idle_in(&g, 300);
  larder_batch_t *kept = cb[3];
  /* A batch held past the close: the close itself waits for cb[2]'s
   * fence, the last release for its own. */
  larder_stream_close(cs);
  expect_waited_for_gpu(&g, test_now_ms(), "larder_stream_close");
  ASSERT_GE(dh_stat(&d, "cuda_device_bytes"), co.arena_bytes);
  gpu_busy(&g);
  gpu_idle_in(&g, 300);
  larder_batch_release(kept);
  expect_waited_for_gpu(&g, test_now_ms(), "the last release after the close");
  wait_cuda_bytes(&d, 0);
  ASSERT_OK(unsetenv("LARDER_FAKE_CUDA_GPU_BUSY"));
  for (int i = 2; i < 4; i++) larder_batch_release(hb[i]);
  larder_stream_close(hs);
  larder_client_close(hc);
  larder_client_close(cc);
  dh_stop(&d);
  return 0;
}

/*
 * liblarder maps a daemon's legacy region only if it holds the whole
 * arena: every batch pointer is an offset into it, so a smaller one (a
 * daemon's bug) would hand out device pointers past its end.  Made here
 * with the double, which lets a process open its own handle.
 */
TEST_IMPL(cuda_region_too_small) {
  if (use_driver()) return 0;
  if (real_gpu()) {
    fprintf(stderr, "skipped: the real driver does not open a process's own handle\n");
    return 0;
  }
  const lcuda_api_t *a = api();
  CUdevice dev;
  CUcontext ctx, popped;
  CU_OK(a->cuDeviceGet(&dev, 0));
  CU_OK(a->cuDevicePrimaryCtxRetain(&ctx, dev));
  CU_OK(a->cuCtxPushCurrent(ctx));
  CUdeviceptr p;
  CU_OK(a->cuMemAlloc(&p, 2u << 20));
  CUipcMemHandle h;
  CU_OK(a->cuIpcGetMemHandle(&h, p));
  CU_OK(a->cuCtxPopCurrent(&popped));
  char err[512];
  lcuda_map_t *m = NULL;
  ASSERT_EQ(
      lcuda_map_open(0, (const uint8_t *)&h, sizeof(h), -1, 0, 4u << 20, &m, err, sizeof(err)),
      LARDER_EPROTO);
  ASSERT_NULL(m);
  ASSERT_STR_CONTAINS(err, "holds 2097152 bytes, not the arena's 4194304");
  ASSERT_OK(
      lcuda_map_open(0, (const uint8_t *)&h, sizeof(h), -1, 0, 2u << 20, &m, err, sizeof(err)));
  lcuda_map_close(m);
  CU_OK(a->cuCtxPushCurrent(ctx));
  CU_OK(a->cuMemFree(p));
  CU_OK(a->cuCtxPopCurrent(&popped));
  CU_OK(a->cuDevicePrimaryCtxRelease(dev));
  return 0;
}

/*
 * The client closed while a CUDA batch (and a DLPack tensor of it) is
 * still held: the connection stays open, and the daemon keeps the device
 * region, until the last of them goes; then the region is freed and the
 * connection closes.  (Closed at once, the daemon would free device
 * memory the trainer still maps, which the driver double refuses.)
 */
TEST_IMPL(cuda_client_closed_holding) {
  if (use_driver()) return 0;
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t co;
  cuda_opts(&co, 100, 1, 0);
  larder_client_t *cc;
  ASSERT_OK(larder_client_connect(d.socket, &cc));
  larder_stream_t *cs;
  ASSERT_OK(larder_stream_open(cc, &co, &cs));
  larder_batch_t *b;
  ASSERT_OK(larder_stream_next(cs, 60000 * dh_slow(), &b));
  const larder_array_t *id = larder_batch_column(b, DH_COL_ID);
  int64_t n = larder_array_length(id);
  DLDataType i64 = {kDLInt, 64, 1};
  DLManagedTensor *t;
  ASSERT_OK(larder_batch_dlpack(b, larder_array_values(id), i64, 1, &n, &t));
  ASSERT_EQ(t->dl_tensor.device.device_type, kDLCUDA);
  uint64_t held = dh_stat(&d, "cuda_device_bytes");
  ASSERT_GE(held, co.arena_bytes);
  larder_stream_close(cs);
  larder_client_close(cc);
  larder_batch_release(b);
  usleep(300000);
  ASSERT_UINT_EQ(dh_stat(&d, "cuda_device_bytes"), held);
  ASSERT_EQ(dh_stat(&d, "clients"), 2); /* it, and the stats request */
  t->deleter(t);
  wait_cuda_bytes(&d, 0);
  double deadline = test_now_ms() + 30000.0 * dh_slow();
  while (dh_stat(&d, "clients") != 1 && test_now_ms() < deadline) usleep(10000);
  ASSERT_EQ(dh_stat(&d, "clients"), 1);
  dh_stop(&d);
  return 0;
}

/*
 * A trainer killed mid-epoch, holding batches of a CUDA stream: the daemon
 * frees its device region (cuda_device_bytes back to 0) and serves the
 * next trainer.
 */
TEST_IMPL(cuda_trainer_killed) {
  if (use_driver()) return 0;
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t co;
  cuda_opts(&co, 100, 1, 0);
  co.window = 8;
  trainer_killed(&d, &co, 5);
  /* The daemon serves the next trainer, on the same device. */
  larder_stream_options_t ho;
  std_opts(&ho, 100, 1);
  ho.window = 8;
  compare_streams(d.socket, &ho, &co, &d);
  wait_cuda_bytes(&d, 0);
  dh_stop(&d);
  return 0;
}

static int other_user(const char *const *flags, const char *export);
static void out_of_device_memory(const dh_daemon *d, int device);
static int open_err(const char *socket, const larder_stream_options_t *o, char *err, size_t len);
static void expect_host_works(const char *socket);

/*
 * cuda_fd_handles = true: each region is a VMM allocation whose descriptor
 * travels with the arena's (cuda.h).  A trainer killed mid-epoch leaves
 * nothing behind; a trainer of another user maps the region of a root
 * daemon (root only: the descriptor, unlike the double's legacy handle,
 * needs no /proc access); the bytes are the host stream's, on either
 * device.  A stream closed while its trainer holds batches frees the
 * daemon's side at once (cuda_device_bytes back to 0, nothing parked), and
 * the batches held keep their bytes: the trainer's mapping keeps the
 * memory.  Out of device memory is LARDER_ENOMEM; on a device without VMM
 * the daemon falls back to legacy handles, with a warning, and the bytes
 * are the same.
 */
TEST_IMPL(cuda_fd_handles) {
  if (use_driver()) return 0;
  static const char *const fl[] = {"--cuda_fd_handles=true", "--socket_mode=0666", NULL};
  dh_daemon d;
  dh_init(&d, "d", fl);
  dh_start(&d);
  larder_stream_options_t ho, co;
  /* A trainer killed mid-epoch, holding batches: first, while this
   * process has not started CUDA, which does not survive fork. */
  cuda_opts(&co, 100, 1, 0);
  co.window = 8;
  trainer_killed(&d, &co, 3);
  /* A trainer running as nobody (a daemon of its own). */
  int rc = other_user(fl, "exported as a descriptor");
  if (rc != 0 && rc != TEST_SKIP) return rc;
  std_opts(&ho, 100, 1);
  ho.window = 4;
  cuda_opts(&co, 100, 1, num_devices() > 1 ? 1 : 0);
  co.window = 4;
  ASSERT_EQ(compare_streams(d.socket, &ho, &co, &d), (DH_STD_ROWS + 99) / 100);
  wait_cuda_bytes(&d, 0);
  char *log = dh_read_log(&d);
  ASSERT_NOT_NULL(log);
  ASSERT_STR_CONTAINS(log, "exported as a descriptor");
  ASSERT(strstr(log, "legacy IPC") == NULL);
  free(log);

  /* Closed while held: the daemon's side goes at once. */
  close_holding(&d, 1);

  dh_stop(&d);

  if (!real_gpu()) {
    ASSERT_OK(setenv("LARDER_FAKE_CUDA_MEM", "5000000", 1));
    dh_start(&d);
    out_of_device_memory(&d, 0);
    ASSERT_OK(unsetenv("LARDER_FAKE_CUDA_MEM"));
    dh_stop(&d);
    /* A granularity of 4 MiB: a 1 MiB arena takes a 4 MiB region, which
     * the trainer maps whole; the same bytes. */
    ASSERT_OK(setenv("LARDER_FAKE_CUDA_GRANULARITY", "4194304", 1));
    dh_start(&d);
    co.arena_bytes = ho.arena_bytes = 1u << 20;
    ASSERT_EQ(compare_streams(d.socket, &ho, &co, &d), (DH_STD_ROWS + 99) / 100);
    wait_cuda_bytes(&d, 0);
    log = dh_read_log(&d);
    ASSERT_NOT_NULL(log);
    ASSERT_STR_CONTAINS(log, "CUDA region of 4194304 bytes");
    free(log);
    ASSERT_OK(unsetenv("LARDER_FAKE_CUDA_GRANULARITY"));
    dh_stop(&d);
    /* The device offers descriptors but fails to make one: the open fails,
     * saying which call, rather than hand out a legacy handle; host
     * streams carry on. */
    ASSERT_OK(setenv("LARDER_FAKE_CUDA_FAIL_EXPORT", "1", 1));
    dh_start(&d);
    char err[1024];
    ASSERT_EQ(open_err(d.socket, &co, err, sizeof(err)), LARDER_EIO);
    ASSERT_STR_CONTAINS(err, "cuMemExportToShareableHandle");
    ASSERT_STR_CONTAINS(err, "CUDA_ERROR_UNKNOWN");
    expect_host_works(d.socket);
    ASSERT_UINT_EQ(dh_stat(&d, "cuda_device_bytes"), 0);
    ASSERT_OK(unsetenv("LARDER_FAKE_CUDA_FAIL_EXPORT"));
    dh_stop(&d);
    /* No VMM on the device: legacy handles, with a warning; the same
     * bytes. */
    ASSERT_OK(setenv("LARDER_FAKE_CUDA_NO_VMM", "1", 1));
    dh_start(&d);
    ASSERT_EQ(compare_streams(d.socket, &ho, &co, &d), (DH_STD_ROWS + 99) / 100);
    wait_cuda_bytes(&d, 0);
    log = dh_read_log(&d);
    ASSERT_NOT_NULL(log);
    char *at = strstr(log, "==== start 4 ====");
    ASSERT_NOT_NULL(at);
    ASSERT_STR_CONTAINS(at, "no virtual memory management with POSIX descriptor handles");
    ASSERT_STR_CONTAINS(at, "legacy IPC");
    ASSERT(strstr(at, "exported as a descriptor") == NULL);
    free(log);
    ASSERT_OK(unsetenv("LARDER_FAKE_CUDA_NO_VMM"));
    dh_stop(&d);
  }
  return 0;
}

/*
 * A trainer of another user than larderd's (the deployment: larderd runs
 * as its own user, trainers as theirs) opens a CUDA stream and finds on
 * the device the bytes a host stream gives the same user.  Root only: the
 * trainer is a child that becomes nobody before it touches CUDA.  The
 * test double's IPC opens the exporter's descriptor through /proc, which
 * another user may not, so this runs on a GPU (tests/cuda-real.sh), where
 * it checks the real driver's legacy IPC between two users.
 */
TEST_IMPL(cuda_other_user) {
  if (use_driver()) return 0;
  if (!real_gpu()) {
    fprintf(stderr, "skipped: the test double's IPC is one user's; run on a GPU\n");
    return TEST_SKIP;
  }
  static const char *const fl[] = {"--socket_mode=0666", NULL};
  return other_user(fl, "legacy IPC");
}

/* cuda_other_user's trainer, running as nobody, with larderd's flags and
 * the region's export the daemon's log names: returns 0 or TEST_SKIP (not
 * root). */
static int other_user(const char *const *flags, const char *export) {
  if (geteuid() != 0) {
    fprintf(stderr, "skipped: switches users: run as root\n");
    return TEST_SKIP;
  }
  /* The dataset where nobody can read it. */
  char data[700], from[1200], to[800];
  snprintf(data, sizeof(data), "%s/open", test_tmpdir());
  ASSERT_OK(chmod(test_tmpdir(), 0755));
  ASSERT_OK(mkdir(data, 0755));
  for (int i = 0;; i++) {
    snprintf(from, sizeof(from), "%s/part-%03d.parquet", dh_std_source()[0], i);
    if (access(from, R_OK) != 0) break;
    snprintf(to, sizeof(to), "%s/part-%03d.parquet", data, i);
    test_copy_file(from, to);
    ASSERT_OK(chmod(to, 0644));
  }
  dh_daemon d;
  dh_init(&d, "u", flags);
  ASSERT_OK(chmod(d.dir, 0755));
  dh_start(&d);
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    gid_t none[1] = {65534};
    if (setgroups(1, none) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(126);
    const char *src[1] = {data};
    larder_stream_options_t ho, co;
    dh_std_opts(&ho, src, 1, 100, 8, 1, 1u << 20);
    co = ho;
    co.memory_kind = LARDER_MEMORY_CUDA;
    co.cuda_device = 0;
    uint64_t n = compare_streams(d.socket, &ho, &co, NULL);
    _exit(n == (DH_STD_ROWS + 99) / 100 ? 0 : 5);
  }
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    ASSERT_FAIL_("the trainer running as nobody failed (status 0x%x): its assertion is above", st);
  wait_cuda_bytes(&d, 0);
  char *log = dh_read_log(&d);
  ASSERT_NOT_NULL(log);
  ASSERT_STR_CONTAINS(log, export);
  free(log);
  dh_stop(&d);
  return 0;
}

/*
 * Two trainers on two devices at once: each gets its own region on its
 * own device (per-device figures in stats), the right bytes, and both
 * regions go when they close.
 */
TEST_IMPL(cuda_two_devices) {
  if (use_driver()) return 0;
  if (num_devices() < 2) {
    fprintf(stderr, "skipped: one CUDA device\n");
    return 0;
  }
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t ho, c0, c1;
  std_opts(&ho, 128, 1);
  cuda_opts(&c0, 128, 1, 0);
  cuda_opts(&c1, 128, 1, 1);
  c1.arena_bytes = 2u << 20;
  larder_client_t *hc, *a, *b;
  ASSERT_OK(larder_client_connect(d.socket, &hc));
  ASSERT_OK(larder_client_connect(d.socket, &a));
  ASSERT_OK(larder_client_connect(d.socket, &b));
  larder_stream_t *hs, *s0, *s1;
  ASSERT_OK(larder_stream_open(hc, &ho, &hs));
  ASSERT_OK(larder_stream_open(a, &c0, &s0));
  ASSERT_OK(larder_stream_open(b, &c1, &s1));
  char *json = dh_admin(&d, "stats");
  ASSERT_NOT_NULL(json);
  char want[128];
  /* Regions are whole 2 MiB pages. */
  ASSERT_UINT_EQ(c0.arena_bytes, 1u << 20);
  snprintf(want, sizeof(want), "{\"device\":0,\"bytes\":%llu}", 2ull << 20);
  ASSERT_STR_CONTAINS(json, want);
  snprintf(want, sizeof(want), "{\"device\":1,\"bytes\":%llu}", (unsigned long long)c1.arena_bytes);
  ASSERT_STR_CONTAINS(json, want);
  ASSERT_UINT_EQ(dh_json_u64(json, "cuda_device_bytes"), 4ull << 20);
  free(json);
  {
    /* larderctl stats: a line per device. */
    const char *ctl = getenv("LARDERCTL_BIN");
    char cmd[1400], text[8192];
    snprintf(cmd, sizeof(cmd), "'%s' --socket '%s' stats", ctl ? ctl : "larderctl", d.socket);
    FILE *p = popen(cmd, "r");
    ASSERT_NOT_NULL(p);
    size_t n = fread(text, 1, sizeof(text) - 1, p);
    text[n] = '\0';
    ASSERT_OK(pclose(p));
    ASSERT_STR_CONTAINS(text, "(cuda_device_bytes)");
    ASSERT_STR_CONTAINS(text, "device 1");
  }
  int timeout = 60000 * dh_slow();
  for (;;) {
    larder_batch_t *hb, *b0, *b1;
    int r = larder_stream_next(hs, timeout, &hb);
    ASSERT_EQ(larder_stream_next(s0, timeout, &b0), r);
    ASSERT_EQ(larder_stream_next(s1, timeout, &b1), r);
    if (r == LARDER_EEOF) break;
    ASSERT_OK(r);
    expect_same_batch(0, hb, b0);
    expect_same_batch(1, hb, b1);
    larder_batch_release(hb);
    larder_batch_release(b0);
    larder_batch_release(b1);
  }
  larder_stream_close(s0);
  larder_client_close(a);
  /* Device 0's region goes, device 1's stays. */
  wait_cuda_bytes(&d, c1.arena_bytes);
  larder_stream_close(s1);
  larder_client_close(b);
  larder_stream_close(hs);
  larder_client_close(hc);
  wait_cuda_bytes(&d, 0);
  json = dh_admin(&d, "stats");
  ASSERT_NOT_NULL(json);
  ASSERT_STR_CONTAINS(json, "{\"device\":1,\"bytes\":0}");
  free(json);
  dh_stop(&d);
  return 0;
}

static int open_err(const char *socket, const larder_stream_options_t *o, char *err, size_t len);

/*
 * A trainer whose CUDA_VISIBLE_DEVICES renumbers the GPUs (the double's
 * LARDER_FAKE_CUDA_VISIBLE): its device 0 is larderd's device 1, found by
 * UUID; the region lands there, and the bytes match.  A trainer's device
 * that larderd does not see at all is refused with LARDER_EINVAL.
 */
TEST_IMPL(cuda_visible_devices) {
  if (use_driver()) return 0;
  if (real_gpu()) {
    fprintf(stderr, "skipped: needs the test double's LARDER_FAKE_CUDA_VISIBLE\n");
    return 0;
  }
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  ASSERT_OK(setenv("LARDER_FAKE_CUDA_VISIBLE", "1", 1));
  ASSERT_EQ(num_devices(), 1);
  larder_stream_options_t ho, co;
  std_opts(&ho, 100, 1);
  cuda_opts(&co, 100, 1, 0);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &co, &s));
  char *json = dh_admin(&d, "stats");
  ASSERT_NOT_NULL(json);
  ASSERT_STR_CONTAINS(json, "{\"device\":0,\"bytes\":0},{\"device\":1,\"bytes\":2097152}");
  free(json);
  larder_stream_close(s);
  larder_client_close(c);
  wait_cuda_bytes(&d, 0);
  ASSERT_EQ(compare_streams(d.socket, &ho, &co, &d), (DH_STD_ROWS + 99) / 100);
  wait_cuda_bytes(&d, 0);
  dh_stop(&d);
  /* A daemon that sees one GPU, a trainer its other. */
  ASSERT_OK(setenv("LARDER_FAKE_CUDA_DEVICES", "1", 1));
  ASSERT_OK(unsetenv("LARDER_FAKE_CUDA_VISIBLE"));
  dh_start(&d);
  ASSERT_OK(setenv("LARDER_FAKE_CUDA_DEVICES", "2", 1));
  ASSERT_OK(setenv("LARDER_FAKE_CUDA_VISIBLE", "1", 1));
  char err[1024];
  ASSERT_EQ(open_err(d.socket, &co, err, sizeof(err)), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(err, "none of the GPUs larderd sees");
  ASSERT_EQ(dh_stat(&d, "cuda_device_bytes"), 0);
  dh_stop(&d);
  return 0;
}

static int open_err(const char *socket, const larder_stream_options_t *o, char *err, size_t len) {
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(socket, &c));
  larder_stream_t *s = NULL;
  int rc = larder_stream_open(c, o, &s);
  snprintf(err, len, "%s", larder_client_last_error(c));
  if (rc == 0) larder_stream_close(s);
  larder_client_close(c);
  return rc;
}

/* A host stream reads its first batches: the daemon still serves them. */
static void expect_host_works(const char *socket) {
  larder_stream_options_t o;
  std_opts(&o, 100, 1);
  dh_run run = {0};
  ASSERT_OK(dh_collect(socket, &o, 5, &run));
  ASSERT_EQ(run.n, 5);
  dh_run_free(&run);
}

/*
 * A trainer in a PID namespace of its own (a container or pod without the
 * host's PID namespace) beside larderd: on a GPU, whether the real
 * driver's legacy IPC maps the region there, which decides whether such
 * trainers can use CUDA streams.  It either gets the same bytes as a host
 * stream, or fails its open with the error that names the requirement,
 * and the test prints which (tests/cuda-real.sh shows it); host streams
 * work either way.  The trainer has its own mount namespace and /proc, as
 * in a container.  Root only (unshare).  The double's IPC goes through
 * /proc and proves nothing here.
 */
TEST_IMPL(cuda_pid_namespace) {
  if (use_driver()) return 0;
  if (!real_gpu()) {
    fprintf(stderr, "skipped: a question for the real driver; run on a GPU\n");
    return TEST_SKIP;
  }
  if (geteuid() != 0) {
    fprintf(stderr, "skipped: unshare(CLONE_NEWPID) needs root\n");
    return TEST_SKIP;
  }
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  int res[2];
  ASSERT_OK(pipe(res));
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(res[0]);
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) _exit(126);
    pid_t inner = fork(); /* pid 1 of the new namespace */
    if (inner < 0) _exit(125);
    if (inner == 0) {
      /* Its own /proc, as a container has: the driver reads it, and the
       * host's would name other processes. */
      if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
          mount("proc", "/proc", "proc", 0, NULL) != 0)
        _exit(123);
      larder_stream_options_t ho, co;
      std_opts(&ho, 100, 1);
      cuda_opts(&co, 100, 1, 0);
      larder_client_t *c;
      larder_stream_t *s;
      char msg[400] = "";
      int rc = larder_client_connect(d.socket, &c);
      if (rc == 0) {
        rc = larder_stream_open(c, &co, &s);
        if (rc)
          snprintf(msg, sizeof(msg), "%s: %s", larder_err_name(rc), larder_client_last_error(c));
        else larder_stream_close(s);
        larder_client_close(c);
      }
      if (write(res[1], msg, strlen(msg) + 1) < 0) _exit(3);
      if (rc) _exit(4);
      /* Opened: the bytes must be the host stream's. */
      uint64_t n = compare_streams(d.socket, &ho, &co, NULL);
      _exit(n == (DH_STD_ROWS + 99) / 100 ? 0 : 5);
    }
    int st;
    if (waitpid(inner, &st, 0) != inner) _exit(124);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  close(res[1]);
  char msg[400] = "";
  ssize_t got = read(res[0], msg, sizeof(msg) - 1);
  if (got > 0) msg[got] = '\0';
  close(res[0]);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT(WIFEXITED(st));
  if (WEXITSTATUS(st) == 123) {
    fprintf(stderr, "skipped: cannot mount a /proc of the new PID namespace\n");
    dh_stop(&d);
    return TEST_SKIP;
  }
  if (WEXITSTATUS(st) == 4) {
    /* Refused: a clear error that names the requirement. */
    fprintf(stderr, "cuda_pid_namespace: legacy CUDA IPC is refused across PID namespaces: %s\n",
            msg);
    ASSERT_STR_CONTAINS(msg, "allow CUDA IPC between them");
  } else {
    ASSERT_EQ(WEXITSTATUS(st), 0);
    fprintf(stderr, "cuda_pid_namespace: legacy CUDA IPC works across PID namespaces\n");
  }
  wait_cuda_bytes(&d, 0);
  expect_host_works(d.socket);
  dh_stop(&d);
  return 0;
}

/*
 * A copy to the device that fails (the double passes an error to the
 * driver callbacks after the first few): the trainer's next call fails
 * with the driver's error, the batches before it were whole, the device
 * region goes once the trainer closes the stream, and host streams and the
 * next CUDA stream (once copies succeed again, in a new daemon) work.
 */
TEST_IMPL(cuda_copy_fails) {
  if (use_driver()) return 0;
  if (real_gpu()) {
    fprintf(stderr, "skipped: needs the test double's failing copies\n");
    return TEST_SKIP;
  }
  ASSERT_OK(setenv("LARDER_FAKE_CUDA_FAIL_CALLBACKS", "3", 1));
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  ASSERT_OK(unsetenv("LARDER_FAKE_CUDA_FAIL_CALLBACKS"));
  larder_stream_options_t co;
  cuda_opts(&co, 100, 1, 0);
  co.window = 1;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &co, &s));
  int rc = 0, n = 0;
  for (;;) {
    larder_batch_t *b;
    rc = larder_stream_next(s, 60000 * dh_slow(), &b);
    if (rc) break;
    larder_batch_release(b);
    n++;
  }
  ASSERT_EQ(rc, LARDER_EIO);
  ASSERT_LE(n, 3);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "copying a batch to the GPU failed");
  larder_stream_close(s);
  larder_client_close(c);
  wait_cuda_bytes(&d, 0);
  expect_host_works(d.socket);
  dh_stop(&d);
  dh_start(&d);
  larder_stream_options_t ho;
  std_opts(&ho, 100, 1);
  ASSERT_EQ(compare_streams(d.socket, &ho, &co, &d), (DH_STD_ROWS + 99) / 100);
  wait_cuda_bytes(&d, 0);
  dh_stop(&d);
  return 0;
}

/* On d, whose device memory the double limits to 5,000,000 bytes per
 * device ($LARDER_FAKE_CUDA_MEM): a stream of an 8 MiB arena on device is
 * refused with LARDER_ENOMEM, saying which device and what to change, and
 * host streams work on; two of 1 MiB fit (regions of 2 MiB each), a third
 * does not; their regions go when they close. */
static void out_of_device_memory(const dh_daemon *d, int device) {
  char err[1024], want[32];
  larder_stream_options_t o;
  cuda_opts(&o, 100, 1, device);
  o.arena_bytes = 8u << 20;
  ASSERT_EQ(open_err(d->socket, &o, err, sizeof(err)), LARDER_ENOMEM);
  snprintf(want, sizeof(want), "CUDA device %d", device);
  ASSERT_STR_CONTAINS(err, want);
  ASSERT_STR_CONTAINS(err, "arena_bytes");
  expect_host_works(d->socket);
  ASSERT_EQ(dh_stat(d, "cuda_device_bytes"), 0);
  o.arena_bytes = 1u << 20;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d->socket, &c));
  larder_stream_t *s[3];
  ASSERT_OK(larder_stream_open(c, &o, &s[0]));
  ASSERT_OK(larder_stream_open(c, &o, &s[1]));
  ASSERT_EQ(larder_stream_open(c, &o, &s[2]), LARDER_ENOMEM);
  ASSERT_UINT_EQ(dh_stat(d, "cuda_device_bytes"), 4u << 20);
  larder_stream_close(s[0]);
  larder_stream_close(s[1]);
  larder_client_close(c);
  wait_cuda_bytes(d, 0);
}

/* On raw connection fd (after Hello): opens a CUDA stream with o, reads
 * its reply, and fails the stream with a release of a batch it never had
 * (the daemon's EPROTO).  Returns the stream's id, or 0.  No CUDA call:
 * forked children use it. */
static uint32_t raw_open_and_fail(int fd, const larder_stream_options_t *o) {
  int arena = -1;
  Larder__Frame *r = dh_raw_open(fd, 1, o, &arena);
  if (arena >= 0) close(arena);
  if (r == NULL || r->msg_case != LARDER__FRAME__MSG_OPEN_STREAM_REPLY ||
      r->open_stream_reply->memory_kind != LARDER__MEMORY_KIND__MEMORY_CUDA ||
      r->open_stream_reply->cuda_ipc_handle.len != LCUDA_IPC_HANDLE_BYTES) {
    if (r) wire_free(r);
    return 0;
  }
  uint32_t sid = r->open_stream_reply->stream_id;
  wire_free(r);
  Larder__Release rel = LARDER__RELEASE__INIT;
  rel.stream_id = sid;
  rel.seq = 12345;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_RELEASE;
  f.release = &rel;
  if (dh_raw_send(fd, &f) != 0) return 0;
  for (;;) {
    int rc;
    Larder__Frame *e = dh_raw_recv(fd, 30000 * dh_slow(), NULL, NULL, &rc);
    if (e == NULL) return 0;
    int err = e->msg_case == LARDER__FRAME__MSG_ERROR;
    int ok = err && e->error->code == LARDER_EPROTO && e->error->message &&
             strstr(e->error->message, "release") != NULL;
    wire_free(e);
    if (err) return ok ? sid : 0;
  }
}

/*
 * The errors: a device that does not exist (EINVAL naming it, from
 * liblarder and, asked directly, from larderd); device memory exhausted
 * (ENOMEM naming the device, the host streams unaffected, a smaller
 * arena then fits); releases of batches never sent (the existing protocol
 * error); a stream the daemon ends keeps its region until the trainer
 * closes it (or its connection ends), as the driver requires.
 */
TEST_IMPL(cuda_errors) {
  if (use_driver()) return 0;
  int nd = num_devices();
  if (!real_gpu()) ASSERT_OK(setenv("LARDER_FAKE_CUDA_MEM", "5000000", 1));
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  char err[1024], want[64];
  larder_stream_options_t o;
  cuda_opts(&o, 100, 1, nd);
  ASSERT_EQ(open_err(d.socket, &o, err, sizeof(err)), LARDER_EINVAL);
  snprintf(want, sizeof(want), "cuda_device %d", nd);
  ASSERT_STR_CONTAINS(err, want);
  {
    /* Past the client's check, the daemon's own. */
    int fd = dh_raw_connect(d.socket);
    Larder__Frame *r = dh_raw_hello(fd, WIRE_PROTOCOL_VERSION);
    ASSERT_NOT_NULL(r);
    wire_free(r);
    int arena = -1;
    r = dh_raw_open(fd, 1, &o, &arena);
    ASSERT_NOT_NULL(r);
    ASSERT_EQ(r->msg_case, LARDER__FRAME__MSG_ERROR);
    ASSERT_EQ(r->error->code, LARDER_EINVAL);
    ASSERT_STR_CONTAINS(r->error->message, want);
    ASSERT_EQ(arena, -1);
    wire_free(r);
    close(fd);
  }
  if (!real_gpu()) out_of_device_memory(&d, 1);
  {
    /* A release of a batch never sent: the stream's protocol error.  The
     * daemon ended the stream on a live connection, whose trainer may
     * still map the region: it is kept until the client's CloseStream. */
    cuda_opts(&o, 100, 1, 0);
    int fd = dh_raw_connect(d.socket);
    wire_free(dh_raw_hello(fd, WIRE_PROTOCOL_VERSION));
    uint32_t sid = raw_open_and_fail(fd, &o);
    ASSERT(sid != 0);
    usleep(200000);
    ASSERT_EQ(dh_stat(&d, "streams"), 0);
    uint64_t held = dh_stat(&d, "cuda_device_bytes");
    ASSERT_GE(held, o.arena_bytes);
    Larder__CloseStream cs = LARDER__CLOSE_STREAM__INIT;
    cs.stream_id = sid;
    Larder__Frame cf = LARDER__FRAME__INIT;
    cf.msg_case = LARDER__FRAME__MSG_CLOSE_STREAM;
    cf.close_stream = &cs;
    ASSERT_OK(dh_raw_send(fd, &cf));
    wait_cuda_bytes(&d, 0);
    close(fd);
  }
  for (int how = 1; how <= 2; how++) {
    /* The connection ends with the stream's region unreleased, while the
     * trainer lives: it closes the connection (1), or the daemon does, for
     * a protocol error (2: a frame longer than max_frame).  The region
     * stays while that process may map it, the daemon carries on, and the
     * region goes once the process exits. */
    cuda_opts(&o, 100, 1, 0);
    int ready[2], go[2];
    ASSERT_OK(pipe(ready));
    ASSERT_OK(pipe(go));
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      close(ready[0]);
      close(go[1]);
      int fd = dh_raw_connect(d.socket);
      wire_free(dh_raw_hello(fd, WIRE_PROTOCOL_VERSION));
      if (raw_open_and_fail(fd, &o) == 0) _exit(2);
      if (how == 2) {
        static const uint8_t too_long[4] = {0xff, 0xff, 0xff, 0x7f};
        if (dh_raw_write(fd, too_long, sizeof(too_long)) != 0) _exit(3);
        int code = 0;
        if (!dh_raw_wait_closed(fd, 30000, &code)) _exit(4);
      }
      close(fd);
      char x = 'x';
      if (write(ready[1], &x, 1) != 1 || read(go[0], &x, 1) != 1) _exit(5);
      _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    char x;
    ASSERT_EQ(read(ready[0], &x, 1), 1);
    usleep(1500000); /* past a tick, which would reap a region of a process gone */
    ASSERT(dh_alive(&d));
    ASSERT_GE(dh_stat(&d, "cuda_device_bytes"), o.arena_bytes);
    ASSERT_EQ(write(go[1], "x", 1), 1);
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(ready[0]);
    close(go[1]);
    wait_cuda_bytes(&d, 0);
  }
  {
    /* Through liblarder: the daemon ends a CUDA stream (a batch larger
     * than its arena); the region stays while the trainer may map it, and
     * goes when the trainer closes the stream, on a connection that lives
     * on. */
    cuda_opts(&o, 4000, 1, 0);
    o.arena_bytes = 64 << 10;
    larder_client_t *c;
    ASSERT_OK(larder_client_connect(d.socket, &c));
    larder_stream_t *s;
    ASSERT_OK(larder_stream_open(c, &o, &s));
    larder_batch_t *b;
    int rc = larder_stream_next(s, 60000 * dh_slow(), &b);
    ASSERT(rc < 0 && rc != LARDER_ETIMEDOUT && rc != LARDER_EEOF);
    ASSERT_STR_CONTAINS(larder_client_last_error(c), "arena");
    usleep(200000);
    ASSERT_GE(dh_stat(&d, "cuda_device_bytes"), o.arena_bytes);
    larder_stream_close(s);
    wait_cuda_bytes(&d, 0);
    larder_stream_options_t ho;
    std_opts(&ho, 100, 1);
    ASSERT_OK(larder_stream_open(c, &ho, &s));
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    larder_batch_release(b);
    larder_stream_close(s);
    larder_client_close(c);
  }
  expect_host_works(d.socket);
  {
    /* SIGTERM while a trainer holds a batch: the daemon exits cleanly
     * without freeing the region the trainer maps (the double aborts a
     * daemon that does), and the trainer's batch stays readable. */
    cuda_opts(&o, 100, 1, 0);
    larder_stream_options_t ho;
    std_opts(&ho, 100, 1);
    larder_client_t *c, *hc;
    ASSERT_OK(larder_client_connect(d.socket, &c));
    ASSERT_OK(larder_client_connect(d.socket, &hc));
    larder_stream_t *s, *hs;
    ASSERT_OK(larder_stream_open(c, &o, &s));
    ASSERT_OK(larder_stream_open(hc, &ho, &hs));
    larder_batch_t *b, *hb;
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    ASSERT_OK(larder_stream_next(hs, 60000 * dh_slow(), &hb));
    dh_stop(&d);
    expect_same_batch(0, hb, b);
    larder_batch_release(b);
    larder_batch_release(hb);
    larder_stream_close(s);
    larder_stream_close(hs);
    larder_client_close(c);
    larder_client_close(hc);
  }
  return 0;
}

/*
 * Without a driver: a CUDA stream fails with LARDER_EUNSUPPORTED and a
 * message that says what is missing, from liblarder (no driver here) and
 * from larderd (no driver there, one here); host streams work either way.
 */
TEST_IMPL(cuda_no_driver) {
  if (use_driver()) return 0;
  const char *good = getenv("LARDER_LIBCUDA");
  char good_path[PATH_MAX] = "";
  if (good) snprintf(good_path, sizeof(good_path), "%s", good);
  /* The daemon without one. */
  ASSERT_OK(setenv("LARDER_LIBCUDA", "/nonexistent/libcuda.so.1", 1));
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  char err[1024];
  larder_stream_options_t o;
  cuda_opts(&o, 100, 1, 0);
  /* Nor this process (it tries again: a failed load is not kept). */
  ASSERT_EQ(open_err(d.socket, &o, err, sizeof(err)), LARDER_EUNSUPPORTED);
  ASSERT_STR_CONTAINS(err, "cannot load the CUDA driver /nonexistent/libcuda.so.1");
  ASSERT_STR_CONTAINS(err, "memory");
  expect_host_works(d.socket);
  /* This process with one, the daemon without. */
  if (good_path[0]) ASSERT_OK(setenv("LARDER_LIBCUDA", good_path, 1));
  else ASSERT_OK(unsetenv("LARDER_LIBCUDA"));
  ASSERT_EQ(open_err(d.socket, &o, err, sizeof(err)), LARDER_EUNSUPPORTED);
  ASSERT_STR_CONTAINS(err, "larderd: CUDA device memory is unavailable");
  expect_host_works(d.socket);
  /* An unknown memory kind. */
  o.memory_kind = 7;
  ASSERT_EQ(open_err(d.socket, &o, err, sizeof(err)), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(err, "memory_kind 7");
  dh_stop(&d);
  return 0;
}

#else /* !LARDER_HAVE_CUDA_H */

/* Built without cuda.h: CUDA streams are refused; only that is checked. */
TEST_IMPL(cuda_values_match) {
  fprintf(stderr, "skipped: built without the CUDA toolkit's cuda.h\n");
  return 0;
}
TEST_IMPL(cuda_small_arena) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_exports) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_trainer_killed) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_fd_handles) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_held_regions_limit) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_held_regions_bytes) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_open_off_loop) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_open_replies_unread) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_release_fenced) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_region_too_small) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_close_holding) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_client_closed_holding) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_two_devices) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_other_user) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_copy_fails) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_pid_namespace) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_visible_devices) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_errors) { return run_test_cuda_values_match(); }
TEST_IMPL(cuda_no_driver) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t o;
  larder_stream_options_init(&o);
  static char dir[1024];
  static const char *src[1];
  ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
  src[0] = dir;
  dh_opts(&o, src, 100, 8, 1);
  o.memory_kind = LARDER_MEMORY_CUDA;
  o.cuda_device = 0;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EUNSUPPORTED);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "cuda.h");
  larder_client_close(c);
  dh_stop(&d);
  return 0;
}

#endif /* LARDER_HAVE_CUDA_H */
