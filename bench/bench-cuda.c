/*
 * bench-cuda.c: the CUDA handoff on a GPU host (make bench-cuda, or
 * bench/bench-cuda.sh from a bundle).  One run prints:
 *
 *   - per GPU, the host-to-device bandwidth of a plain cuMemcpyHtoD from
 *     pinned memory (the physical limit), from pageable memory and from a
 *     registered memfd (the arenas' kind of memory), beside
 *     the batch bytes per second larder delivers into that GPU's memory
 *     (a CUDA stream read by a trainer that only releases), alone and with
 *     every GPU fed at once;
 *   - the ideal shuffled gather of the dataset's rows from memory on as
 *     many threads as the daemon has workers (bench-util.h): the most any
 *     assembly of shuffled batches on this host's CPUs could deliver, and
 *     so the ceiling of both the host and the CUDA path;
 *   - the daemon's CPU time per batch on the CUDA path beside the host
 *     path's (all its threads, from /proc/PID/stat, over the warm epochs);
 *   - the stall of a trainer on a CUDA stream whose step (a sleep) is just
 *     over that cost, beside the same trainer on a host stream.
 *
 *   bench-cuda all SOCKET SOURCE DAEMON_PID [--batch-size N] [--epochs N]
 *                  [--window N] [--arena-bytes N] [--copy-mib N] [--workers N]
 *   bench-cuda copy [--copy-mib N]
 *
 * The driver is the one liblarder loads (libcuda.so.1, or $LARDER_LIBCUDA:
 * with the test double the figures mean nothing, but the run checks the
 * script).  Every driver call is checked and its error printed with
 * cuGetErrorString.
 */
#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench-util.h"
#include "lcuda.h"

#ifdef LARDER_HAVE_CUDA_H

static const lcuda_api_t *cu;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define CHECK(call)                                         \
  do {                                                      \
    CUresult r_ = (call);                                   \
    if (r_ != CUDA_SUCCESS) {                               \
      char e_[200];                                         \
      fprintf(stderr, "bench-cuda: %s failed: %s\n", #call, \
              lcuda_strerror(cu, r_, e_, sizeof(e_)));      \
      exit(1);                                              \
    }                                                       \
  } while (0)

/* The daemon's CPU time so far, all threads, in ns: the sum of its
 * threads' schedstat run times (nanoseconds), else user + system time
 * from /proc/PID/stat (clock ticks, too coarse for short runs).  Threads
 * that exited are counted by neither; the daemon's live for its life. */
static uint64_t daemon_cpu_ns(int pid) {
  char path[300], buf[4096];
  snprintf(path, sizeof(path), "/proc/%d/task", pid);
  DIR *dir = opendir(path);
  uint64_t sum = 0;
  int seen = 0;
  struct dirent *e;
  while (dir && (e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof(path), "/proc/%d/task/%.32s/schedstat", pid, e->d_name);
    FILE *f = fopen(path, "r");
    unsigned long long run = 0;
    if (f && fscanf(f, "%llu", &run) == 1) {
      sum += run;
      seen++;
    }
    if (f) fclose(f);
  }
  if (dir) closedir(dir);
  if (seen) return sum;
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (p == NULL) return 0;
  unsigned long long ut = 0, st = 0;
  /* Fields after the name: state(3) ... utime(14) stime(15). */
  if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return 0;
  return (ut + st) * 1000000000ull / (uint64_t)sysconf(_SC_CLK_TCK);
}

typedef struct copy_result {
  double pinned_gbps, pageable_gbps, arena_gbps;
  char name[128];
} copy_result;

/* cuMemcpyHtoD of `bytes`, pinned (cuMemAllocHost), pageable, then from
 * memory of the arenas' kind (a memfd mapped shared, registered with
 * cuMemHostRegister as larderd does), on device dev. */
static void measure_copy(int dev, size_t bytes, copy_result *out) {
  CUdevice d;
  CUcontext ctx, popped;
  CHECK(cu->cuDeviceGet(&d, dev));
  CHECK(cu->cuDeviceGetName(out->name, (int)sizeof(out->name), d));
  CHECK(cu->cuDevicePrimaryCtxRetain(&ctx, d));
  CHECK(cu->cuCtxPushCurrent(ctx));
  CUdeviceptr dst;
  void *pinned;
  CHECK(cu->cuMemAlloc(&dst, bytes));
  CHECK(cu->cuMemAllocHost(&pinned, bytes));
  void *pageable = malloc(bytes);
  if (pageable == NULL) exit(1);
  int fd = memfd_create("bench-cuda-arena", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) exit(1);
  void *arena = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (arena == MAP_FAILED) exit(1);
  close(fd);
  memset(pinned, 1, bytes);
  memset(pageable, 1, bytes);
  memset(arena, 1, bytes);
  CHECK(cu->cuMemHostRegister(arena, bytes, CU_MEMHOSTREGISTER_PORTABLE));
  for (int kind = 0; kind < 3; kind++) {
    void *src = kind == 0 ? pinned : kind == 1 ? pageable : arena;
    CHECK(cu->cuMemcpyHtoD(dst, src, bytes)); /* warm-up */
    int iters = 10;
    double t0 = now_s();
    for (int i = 0; i < iters; i++) CHECK(cu->cuMemcpyHtoD(dst, src, bytes));
    CHECK(cu->cuCtxSynchronize());
    double gbps = (double)bytes * iters / (now_s() - t0) / 1e9;
    if (kind == 0) out->pinned_gbps = gbps;
    else if (kind == 1) out->pageable_gbps = gbps;
    else out->arena_gbps = gbps;
  }
  CHECK(cu->cuMemHostUnregister(arena));
  munmap(arena, bytes);
  free(pageable);
  CHECK(cu->cuMemFreeHost(pinned));
  CHECK(cu->cuMemFree(dst));
  CHECK(cu->cuCtxPopCurrent(&popped));
  CHECK(cu->cuDevicePrimaryCtxRelease(d));
}

typedef struct run_args {
  const char *socket, *source;
  int memory_kind, device;
  uint32_t batch_size, window;
  uint64_t epochs, arena_bytes, seed;
  uint64_t compute_us;
  int daemon_pid;
  /* Results over the epochs after the first: the daemon's CPU time in
   * them (all its threads), and the open's wall time (the daemon's region
   * and pinning, the trainer's IPC mapping). */
  uint64_t batches, bytes;
  double seconds, stall, cpu_ns, open_s;
  int rc;
  char err[512];
} run_args;

static void *run_stream(void *arg) {
  run_args *a = arg;
  larder_client_t *c;
  a->rc = larder_client_connect(a->socket, &c);
  if (a->rc) {
    snprintf(a->err, sizeof(a->err), "connect: %s", larder_strerror(a->rc));
    return NULL;
  }
  larder_stream_options_t o;
  larder_stream_options_init(&o);
  const char *src[1] = {a->source};
  o.sources = src;
  o.num_sources = 1;
  o.batch_size = a->batch_size;
  o.epochs = a->epochs;
  o.seed = a->seed;
  o.rank = 0;
  o.world_size = 1;
  o.window = a->window;
  o.arena_bytes = a->arena_bytes;
  o.memory_kind = a->memory_kind;
  o.cuda_device = a->device;
  larder_stream_t *s;
  double o0 = now_s();
  a->rc = larder_stream_open(c, &o, &s);
  a->open_s = now_s() - o0;
  if (a->rc) {
    snprintf(a->err, sizeof(a->err), "open: %s: %s", larder_err_name(a->rc),
             larder_client_last_error(c));
    larder_client_close(c);
    return NULL;
  }
  uint64_t first_epoch = UINT64_MAX;
  double t0 = 0;
  uint64_t w0 = 0, c0 = 0, cpu0 = 0;
  for (;;) {
    larder_batch_t *b;
    int rc = larder_stream_next(s, 600000, &b);
    if (rc == LARDER_EEOF) break;
    if (rc) {
      a->rc = rc;
      snprintf(a->err, sizeof(a->err), "next: %s: %s", larder_err_name(rc),
               larder_client_last_error(c));
      break;
    }
    if (first_epoch == UINT64_MAX) first_epoch = larder_batch_epoch(b);
    if (larder_batch_epoch(b) > first_epoch) {
      if (t0 == 0) {
        t0 = now_s();
        larder_stream_stall(s, &w0, &c0);
        if (a->daemon_pid) cpu0 = daemon_cpu_ns(a->daemon_pid);
      }
      a->batches++;
      a->bytes += larder_batch_bytes(b);
    }
    larder_batch_release(b);
    if (a->compute_us) {
      struct timespec ts = {(time_t)(a->compute_us / 1000000),
                            (long)(a->compute_us % 1000000) * 1000};
      nanosleep(&ts, NULL);
    }
  }
  a->seconds = t0 ? now_s() - t0 : 0;
  if (a->daemon_pid && t0) a->cpu_ns = (double)(daemon_cpu_ns(a->daemon_pid) - cpu0);
  uint64_t w1, c1;
  larder_stream_stall(s, &w1, &c1);
  double wait = (double)(w1 - w0), comp = (double)(c1 - c0);
  a->stall = wait + comp > 0 ? wait / (wait + comp) : 0;
  larder_stream_close(s);
  larder_client_close(c);
  return NULL;
}

static void run_or_die(run_args *a) {
  run_stream(a);
  if (a->rc) {
    fprintf(stderr, "bench-cuda: %s stream: %s\n", a->memory_kind ? "CUDA" : "host", a->err);
    exit(1);
  }
}

/* Runs a and returns the daemon's CPU ns per batch over its warm epochs
 * (the first, cold, and the open are not counted: the open's cost is
 * a->open_s, once per stream). */
static double cost_per_batch(run_args *a, int daemon_pid) {
  a->daemon_pid = daemon_pid;
  run_or_die(a);
  return a->batches ? a->cpu_ns / (double)a->batches : 0;
}

static int arg_u64(int argc, char **argv, const char *name, uint64_t def, uint64_t *out) {
  *out = def;
  for (int i = 0; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) *out = strtoull(argv[i + 1], NULL, 10);
  return 0;
}

int main(int argc, char **argv) {
  char err[512];
  if (argc < 2 || (strcmp(argv[1], "all") != 0 && strcmp(argv[1], "copy") != 0) ||
      (strcmp(argv[1], "all") == 0 && argc < 5)) {
    fprintf(stderr,
            "usage: bench-cuda all SOCKET SOURCE DAEMON_PID [--batch-size N] [--epochs N] "
            "[--window N] [--arena-bytes N] [--copy-mib N] [--workers N] | copy [--copy-mib N]\n");
    return 2;
  }
  cu = lcuda_load(err, sizeof(err));
  if (cu == NULL) {
    fprintf(stderr, "bench-cuda: %s\n", err);
    return 1;
  }
  uint64_t copy_mib, batch, epochs, window, arena, workers;
  arg_u64(argc, argv, "--copy-mib", 256, &copy_mib);
  arg_u64(argc, argv, "--batch-size", 8192, &batch);
  arg_u64(argc, argv, "--epochs", 4, &epochs);
  arg_u64(argc, argv, "--window", 32, &window);
  arg_u64(argc, argv, "--arena-bytes", 0, &arena);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  arg_u64(argc, argv, "--workers", online > 0 ? (uint64_t)online : 1, &workers);
  if (epochs < 2) epochs = 2;
  int nd = cu->num_devices;
  printf("bench-cuda: driver %s (version %d), %d GPU%s\n", cu->path, cu->driver_version, nd,
         nd == 1 ? "" : "s");
  copy_result *cr = calloc((size_t)nd, sizeof(*cr));
  if (cr == NULL) return 1;
  for (int d = 0; d < nd; d++) {
    measure_copy(d, (size_t)copy_mib << 20, &cr[d]);
    printf("  GPU %d %s: cuMemcpyHtoD of %" PRIu64
           " MiB: pinned %.2f GB/s, pageable %.2f GB/s, a registered memfd (an arena's "
           "memory) %.2f GB/s\n",
           d, cr[d].name, copy_mib, cr[d].pinned_gbps, cr[d].pageable_gbps, cr[d].arena_gbps);
  }
  fflush(stdout);
  if (strcmp(argv[1], "copy") == 0) return 0;
  const char *sock = argv[2], *source = argv[3];
  int pid = atoi(argv[4]);
  run_args base = {0};
  base.socket = sock;
  base.source = source;
  base.batch_size = (uint32_t)batch;
  base.window = (uint32_t)window;
  base.epochs = epochs;
  base.arena_bytes = arena;
  base.seed = 1;
  /* Warm the cache (and the daemon's memory) with one host epoch. */
  run_args warm = base;
  warm.epochs = 2;
  run_or_die(&warm);

  run_args host = base;
  double host_cost = cost_per_batch(&host, pid);
  double host_gbps = host.seconds > 0 ? (double)host.bytes / host.seconds / 1e9 : 0;
  printf("  host stream: %.2f GB/s of batches (%" PRIu64
         " of %.0f KiB in %.2f s), daemon CPU %.1f us "
         "per batch; open %.1f ms\n",
         host_gbps, host.batches,
         host.batches ? (double)host.bytes / (double)host.batches / 1024 : 0, host.seconds,
         host_cost / 1e3, host.open_s * 1e3);
  /* The ceiling of any CPU assembly here: rows of the dataset's mean size
   * gathered at random from a shuffle window's worth of memory (512 MiB,
   * the default shuffle_window_bytes) on as many threads as workers. */
  uint64_t row_bytes = host.batches ? host.bytes / (host.batches * batch) : 0;
  double gather = row_bytes ? bench_gather_gbps(row_bytes, 512u << 20, batch, (int)workers) : 0;
  printf("  the ideal shuffled gather of %" PRIu64 "-byte rows on %" PRIu64
         " threads (the daemon's workers): %.2f GB/s, %.0f%% of GPU 0's pinned cuMemcpyHtoD; "
         "the host stream reaches %.0f%% of it\n",
         row_bytes, workers, gather, cr[0].pinned_gbps > 0 ? 100 * gather / cr[0].pinned_gbps : 0,
         gather > 0 ? 100 * host_gbps / gather : 0);
  fflush(stdout);
  double cuda_cost = 0;
  for (int d = 0; d < nd; d++) {
    run_args a = base;
    a.memory_kind = LARDER_MEMORY_CUDA;
    a.device = d;
    double cost = cost_per_batch(&a, pid);
    if (d == 0) cuda_cost = cost;
    double gbps = a.seconds > 0 ? (double)a.bytes / a.seconds / 1e9 : 0;
    printf(
        "  CUDA stream, GPU %d alone: %.2f GB/s into device memory (%.0f%% of pinned "
        "cuMemcpyHtoD, %.2f x the host stream), daemon CPU %.1f us per batch (host path %.1f); "
        "open %.1f ms (host %.1f)\n",
        d, gbps, cr[d].pinned_gbps > 0 ? 100 * gbps / cr[d].pinned_gbps : 0,
        host_gbps > 0 ? gbps / host_gbps : 0, cost / 1e3, host_cost / 1e3, a.open_s * 1e3,
        host.open_s * 1e3);
    fflush(stdout);
  }
  if (nd > 1) {
    run_args *as = calloc((size_t)nd, sizeof(*as));
    pthread_t *th = calloc((size_t)nd, sizeof(*th));
    if (as == NULL || th == NULL) return 1;
    for (int d = 0; d < nd; d++) {
      as[d] = base;
      as[d].memory_kind = LARDER_MEMORY_CUDA;
      as[d].device = d;
      as[d].seed = 100 + (uint64_t)d;
      pthread_create(&th[d], NULL, run_stream, &as[d]);
    }
    double total = 0;
    for (int d = 0; d < nd; d++) pthread_join(th[d], NULL);
    for (int d = 0; d < nd; d++) {
      if (as[d].rc) {
        fprintf(stderr, "bench-cuda: GPU %d: %s\n", d, as[d].err);
        return 1;
      }
      double gbps = as[d].seconds > 0 ? (double)as[d].bytes / as[d].seconds / 1e9 : 0;
      total += gbps;
      printf(
          "  CUDA streams on all %d GPUs at once: GPU %d %.2f GB/s (%.0f%% of its pinned "
          "cuMemcpyHtoD)\n",
          nd, d, gbps, cr[d].pinned_gbps > 0 ? 100 * gbps / cr[d].pinned_gbps : 0);
    }
    printf("  CUDA streams on all %d GPUs at once: %.2f GB/s in all\n", nd, total);
    free(as);
    free(th);
  }
  /* A trainer whose step is just over the daemon's cost per batch. */
  uint64_t step_us = (uint64_t)(cuda_cost * 1.1 / 1e3) + 1;
  run_args st = base;
  st.memory_kind = LARDER_MEMORY_CUDA;
  st.device = 0;
  st.seed = 7;
  st.compute_us = step_us;
  run_or_die(&st);
  run_args sh = base;
  sh.seed = 7;
  sh.compute_us = step_us;
  run_or_die(&sh);
  printf("  trainer stepping %" PRIu64
         " us (1.1 x the CUDA path's daemon CPU per batch): stall "
         "%.2f%% on a CUDA stream (GPU 0), %.2f%% on a host stream (goal < 1%%)\n",
         step_us, 100 * st.stall, 100 * sh.stall);
  free(cr);
  return 0;
}

#else /* !LARDER_HAVE_CUDA_H */

int main(void) {
  fprintf(stderr, "bench-cuda: built without the CUDA toolkit's cuda.h (set CUDA_HOME)\n");
  return 1;
}

#endif /* LARDER_HAVE_CUDA_H */
