/*
 * cuda.c: device regions of CUDA streams (see cuda.h for the design).
 *
 * Invariants:
 * - ctx[d] is device d's primary context, retained once (under lock) and
 *   never released: worker threads' CUDA streams (tl_stream) live in it.
 * - device_bytes[d] is the sum of the sizes of the open regions on d.
 * - A region's arena pinning is undone before the arena is unmapped
 *   (stream.c closes the region first).
 * - A copy_t counts in copies_pending from cuda_region_copy's success until
 *   its done callback returned on the loop; the async handle that carries
 *   it there is closed only when none is pending (server.c's shutdown).
 */
#include "serve/cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lcuda.h"
#include "log.h"
#include "util.h"

static uint64_t device_bytes[LCUDA_MAX_DEVICES]; /* atomic adds */
static int devices_seen;                         /* under lock */

uint64_t cuda_device_bytes_of(int device) {
  if (device < 0 || device >= LCUDA_MAX_DEVICES) return 0;
  return __atomic_load_n(&device_bytes[device], __ATOMIC_RELAXED);
}

int cuda_devices_seen(void) { return __atomic_load_n(&devices_seen, __ATOMIC_RELAXED); }

int cuda_check(int device, char *err, size_t errlen) {
  return lcuda_check_device(device, err, errlen);
}

int cuda_device_by_uuid(const uint8_t *uuid) { return lcuda_device_by_uuid(uuid); }

/* Parks (cuda.h), loop thread only.  A park is listed from cuda_park
 * until it is unparked, or its process is found gone; busy while its
 * stream lives (the stream settles it), and freed by whichever of those
 * and settle comes last. */
struct cuda_park {
  struct cuda_park *next;
  uint64_t owner; /* the connection; 0 once it ended (an orphan) */
  uint32_t stream_id;
  cuda_region_t *r;
  uint64_t bytes; /* the region's device memory */
  uint32_t uid;   /* the trainer's */
  int pid;        /* the trainer's, in the daemon's PID namespace */
  int pidfd;      /* readable once it exited, or -1 (kill(pid, 0) then) */
  int busy;       /* its stream has not settled it yet */
  int unparked;   /* off the list: the region goes once settled */
};
static cuda_park_t *parked;

static int region_is_vmm(const cuda_region_t *r);
static uint64_t region_dev_bytes(const cuda_region_t *r);

int cuda_watch_pid(int pid) {
#ifdef SYS_pidfd_open
  if (pid > 0) {
    long fd = syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd >= 0) {
      (void)fcntl((int)fd, F_SETFD, FD_CLOEXEC);
      return (int)fd;
    }
  }
#endif
  return -1;
}

/* Whether p's process has exited (so it maps nothing). */
static int park_process_gone(const cuda_park_t *p) {
  if (p->pidfd >= 0) {
    struct pollfd pf = {p->pidfd, POLLIN, 0};
    return poll(&pf, 1, 0) > 0;
  }
  return p->pid <= 0 || (kill(p->pid, 0) != 0 && errno == ESRCH);
}

cuda_park_t *cuda_park(uint64_t owner, int pid, uint32_t uid, int pidfd, uint32_t stream_id,
                       cuda_region_t *r) {
  /* A descriptor's region: the trainer's mapping keeps the memory. */
  if (region_is_vmm(r)) return NULL;
  cuda_park_t *p = malloc(sizeof(*p));
  if (p == NULL) return NULL; /* freed with the stream, mapped or not */
  int fd = pidfd >= 0 ? fcntl(pidfd, F_DUPFD_CLOEXEC, 0) : -1;
  *p = (cuda_park_t){parked, owner, stream_id, r, region_dev_bytes(r), uid, pid, fd, 1, 0};
  parked = p;
  return p;
}

static cuda_closer_fn closer;
static void *closer_arg;

void cuda_set_closer(cuda_closer_fn fn, void *arg) {
  closer = fn;
  closer_arg = arg;
}

static void park_free(cuda_park_t *p) {
  if (closer) closer(closer_arg, p->r);
  else cuda_region_close(p->r);
  if (p->pidfd >= 0) close(p->pidfd);
  free(p);
}

void cuda_park_settle(cuda_park_t *p) {
  p->busy = 0;
  if (p->unparked) park_free(p);
  else cuda_region_detach_host(p->r);
}

/* Takes p off the list (*pp is p) and frees it unless its stream still
 * holds it. */
static void unlist(cuda_park_t **pp) {
  cuda_park_t *p = *pp;
  *pp = p->next;
  p->unparked = 1;
  if (!p->busy) park_free(p);
}

int cuda_unpark(uint64_t owner, uint32_t stream_id) {
  for (cuda_park_t **pp = &parked; *pp; pp = &(*pp)->next)
    if ((*pp)->owner == owner && (*pp)->stream_id == stream_id) {
      unlist(pp);
      return 1;
    }
  return 0;
}

void cuda_orphan(uint64_t owner) {
  for (cuda_park_t *p = parked; p; p = p->next)
    if (p->owner == owner) p->owner = 0;
  cuda_reap();
}

void cuda_reap(void) {
  cuda_park_t **pp = &parked;
  while (*pp) {
    if ((*pp)->owner == 0 && park_process_gone(*pp)) unlist(pp);
    else pp = &(*pp)->next;
  }
}

int cuda_orphans_of(int pid) {
  int n = 0;
  for (const cuda_park_t *p = parked; p; p = p->next) n += p->owner == 0 && p->pid == pid;
  return n;
}

uint64_t cuda_parked_bytes(uint64_t owner, int pid) {
  uint64_t n = 0;
  for (const cuda_park_t *p = parked; p; p = p->next)
    if (p->owner ? p->owner == owner : p->pid == pid) n += p->bytes;
  return n;
}

uint64_t cuda_parked_bytes_of_uid(uint32_t uid) {
  uint64_t n = 0;
  for (const cuda_park_t *p = parked; p; p = p->next)
    if (p->uid == uid) n += p->bytes;
  return n;
}

/* Copies in flight: a copy_t each, from cuda_region_copy until its done
 * callback ran on the loop.  The driver's callback moves it to `finished`
 * (under finished_lock) and wakes the loop. */
typedef struct copy {
  struct copy *next;
  cuda_copy_cb done;
  void *arg;
  int device;
  int status; /* the driver's CUresult, 0 for success */
  uint64_t start_ns;
  stats_global_t *stats;
} copy_t;

static pthread_mutex_t finished_lock = PTHREAD_MUTEX_INITIALIZER;
static copy_t *finished; /* under finished_lock, newest first */
static uv_async_t finished_async;
static int loop_started;   /* written on the loop, read atomically by workers */
static int copies_pending; /* atomic */

int cuda_copies_pending(void) { return __atomic_load_n(&copies_pending, __ATOMIC_ACQUIRE); }

/* Reverses the list of finished copies (newest first) into the order the
 * driver finished them. */
static copy_t *oldest_first(copy_t *c) {
  copy_t *out = NULL;
  while (c) {
    copy_t *next = c->next;
    c->next = out;
    out = c;
    c = next;
  }
  return out;
}

static void report_copy(copy_t *c); /* the done callback, with the error's text */

static void on_finished(uv_async_t *a) {
  (void)a;
  pthread_mutex_lock(&finished_lock);
  copy_t *c = finished;
  finished = NULL;
  pthread_mutex_unlock(&finished_lock);
  c = oldest_first(c);
  while (c) {
    copy_t *next = c->next;
    report_copy(c);
    free(c);
    __atomic_sub_fetch(&copies_pending, 1, __ATOMIC_RELEASE);
    c = next;
  }
}

int cuda_loop_start(uv_loop_t *loop) {
  if (loop_started) return 0;
  int rc = uv_async_init(loop, &finished_async, on_finished);
  if (rc) return rc;
  /* Copies never keep the loop alive: the shutdown waits for them. */
  uv_unref((uv_handle_t *)&finished_async);
  __atomic_store_n(&loop_started, 1, __ATOMIC_RELEASE);
  return 0;
}

void cuda_loop_stop(void) {
  if (!loop_started) return;
  __atomic_store_n(&loop_started, 0, __ATOMIC_RELEASE);
  uv_close((uv_handle_t *)&finished_async, NULL);
}

#ifdef LARDER_HAVE_CUDA_H

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext ctx[LCUDA_MAX_DEVICES]; /* under lock until set */

/* A worker's CUDA stream per device, made on its first copy there. */
static __thread CUstream tl_stream[LCUDA_MAX_DEVICES];

/* Device regions are allocated in whole 2 MiB pages (the driver's large
 * page): an allocation of its own, which the IPC handle maps from its
 * first byte, never a piece of a shared one. */
#define REGION_ALIGN ((uint64_t)2 << 20)

struct cuda_region {
  const lcuda_api_t *api;
  int device;
  CUcontext ctx;
  CUdeviceptr dev;
  int vmm;                          /* a VMM allocation, mapped at dev */
  CUmemGenericAllocationHandle mem; /* vmm: the allocation */
  uint8_t *host;
  uint64_t size;      /* the arena's, which copies stay within */
  uint64_t dev_bytes; /* allocated: size rounded up to REGION_ALIGN */
  int pinned;
  stats_global_t *stats;
};

/* The primary context of device (retained on first use), or NULL with err
 * set. */
static CUcontext primary_ctx(const lcuda_api_t *api, int device, char *err, size_t errlen) {
  pthread_mutex_lock(&lock);
  CUcontext c = ctx[device];
  if (c == NULL) {
    CUdevice d;
    CUresult r = api->cuDeviceGet(&d, device);
    /* Workers wait for their copies asleep (cuStreamSynchronize blocks on
     * the driver's interrupt) rather than spinning, the driver's choice
     * when a host has more cores than GPUs: a spinning worker takes a
     * core from the trainers beside it for every copy.  The trainers'
     * own contexts are theirs; this is the daemon's process only. */
    if (r == CUDA_SUCCESS) {
      CUresult fr = api->cuDevicePrimaryCtxSetFlags(d, CU_CTX_SCHED_BLOCKING_SYNC);
      if (fr != CUDA_SUCCESS) {
        char e[160];
        log_warn(
            "CUDA device %d: cannot make its waits blocking (%s); workers spin while "
            "copies run",
            device, lcuda_strerror(api, fr, e, sizeof(e)));
      }
      r = api->cuDevicePrimaryCtxRetain(&c, d);
    }
    if (r != CUDA_SUCCESS) {
      char e[160];
      snprintf(err, errlen, "CUDA device %d: cannot retain its primary context: %s", device,
               lcuda_strerror(api, r, e, sizeof(e)));
      c = NULL;
    } else {
      ctx[device] = c;
      if (device + 1 > devices_seen) __atomic_store_n(&devices_seen, device + 1, __ATOMIC_RELAXED);
    }
  }
  pthread_mutex_unlock(&lock);
  return c;
}

/* Makes r a VMM allocation of r->dev_bytes (rounded up to the device's
 * granularity), mapped at r->dev with access for its device, and exports
 * its descriptor into *fd.  Returns CUDA_SUCCESS, or the error of the call
 * *what names, with nothing left allocated.  r's context current. */
static CUresult vmm_open(cuda_region_t *r, int *fd, const char **what) {
  const lcuda_api_t *api = r->api;
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = r->device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  *what = "cuMemGetAllocationGranularity";
  CUresult cr =
      api->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (cr != CUDA_SUCCESS) return cr;
  if (gran == 0 || gran > REGION_ALIGN * 512) return CUDA_ERROR_INVALID_VALUE;
  uint64_t bytes = (r->dev_bytes + gran - 1) / gran * gran;
  *what = "cuMemCreate";
  cr = api->cuMemCreate(&r->mem, (size_t)bytes, &prop, 0);
  if (cr != CUDA_SUCCESS) return cr;
  CUdeviceptr p = 0;
  int reserved = 0, mapped = 0;
  *what = "cuMemAddressReserve";
  cr = api->cuMemAddressReserve(&p, (size_t)bytes, 0, 0, 0);
  if (cr == CUDA_SUCCESS) {
    reserved = 1;
    *what = "cuMemMap";
    cr = api->cuMemMap(p, (size_t)bytes, 0, r->mem, 0);
  }
  if (cr == CUDA_SUCCESS) {
    mapped = 1;
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, r->device},
                           CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    *what = "cuMemSetAccess";
    cr = api->cuMemSetAccess(p, (size_t)bytes, &acc, 1);
  }
  int h = -1;
  if (cr == CUDA_SUCCESS) {
    *what = "cuMemExportToShareableHandle";
    cr = api->cuMemExportToShareableHandle(&h, r->mem, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  }
  /* The descriptor opens the trainer's batches: no child the daemon
   * starts (credential_process) may inherit it. */
  if (cr == CUDA_SUCCESS && fcntl(h, F_SETFD, FD_CLOEXEC) != 0) {
    *what = "fcntl(FD_CLOEXEC) of the exported descriptor";
    close(h);
    cr = CUDA_ERROR_OPERATING_SYSTEM;
  }
  if (cr != CUDA_SUCCESS) {
    if (mapped) (void)api->cuMemUnmap(p, (size_t)bytes);
    if (reserved) (void)api->cuMemAddressFree(p, (size_t)bytes);
    (void)api->cuMemRelease(r->mem);
    return cr;
  }
  r->vmm = 1;
  r->dev = p;
  r->dev_bytes = bytes;
  *fd = h;
  return CUDA_SUCCESS;
}

static int region_is_vmm(const cuda_region_t *r) { return r->vmm; }

static uint64_t region_dev_bytes(const cuda_region_t *r) { return r->dev_bytes; }

/* Whether device supports VMM allocations exported as POSIX descriptors
 * (asked once per device; warns once when it does not: its regions are
 * then legacy ones).  Any thread. */
static int vmm_supported(const lcuda_api_t *api, int device) {
  static signed char known[LCUDA_MAX_DEVICES]; /* under lock: 0 unknown, 1 yes, -1 no */
  pthread_mutex_lock(&lock);
  if (known[device] == 0) {
    CUdevice d;
    int vmm = 0, fd = 0;
    CUresult cr = api->cuDeviceGet(&d, device);
    if (cr == CUDA_SUCCESS)
      cr = api->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                     d);
    if (cr == CUDA_SUCCESS)
      cr = api->cuDeviceGetAttribute(
          &fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, d);
    known[device] = cr == CUDA_SUCCESS && vmm && fd ? 1 : -1;
    if (known[device] < 0)
      log_warn(
          "CUDA device %d: no virtual memory management with POSIX descriptor handles "
          "(cuda_fd_handles); its streams use legacy IPC handles",
          device);
  }
  int yes = known[device] > 0;
  pthread_mutex_unlock(&lock);
  return yes;
}

int cuda_region_open(int device, uint8_t *host, uint64_t size, stats_global_t *stats,
                     cuda_region_t **out, cuda_export_t *ex, char *err, size_t errlen) {
  *out = NULL;
  ex->fd = -1;
  int rc = lcuda_check_device(device, err, errlen);
  if (rc) return rc;
  const lcuda_api_t *api = lcuda_load(err, errlen);
  CUcontext c = primary_ctx(api, device, err, errlen);
  if (c == NULL) return LARDER_EIO;
  cuda_region_t *r = calloc(1, sizeof(*r));
  if (r == NULL) {
    snprintf(err, errlen, "out of memory");
    return LARDER_ENOMEM;
  }
  r->api = api;
  r->device = device;
  r->ctx = c;
  r->host = host;
  r->size = size;
  r->dev_bytes = (size + REGION_ALIGN - 1) / REGION_ALIGN * REGION_ALIGN;
  r->stats = stats;
  char e[160];
  /* The calling thread makes the context current for these calls only:
   * the next region, or copy, may be on another device. */
  CUresult cr = api->cuCtxSetCurrent(c);
  int legacy = 1;
  const char *what = "cuMemAlloc";
  if (cr == CUDA_SUCCESS && ex->fd_wanted) {
    legacy = !vmm_supported(api, device);
    if (!legacy) cr = vmm_open(r, &ex->fd, &what);
  }
  if (cr == CUDA_SUCCESS && legacy) cr = api->cuMemAlloc(&r->dev, (size_t)r->dev_bytes);
  if (cr != CUDA_SUCCESS) {
    /* A device that offers descriptors and fails to make one fails the
     * open: the operator asked for them, not for a legacy token. */
    rc = cr == CUDA_ERROR_OUT_OF_MEMORY ? LARDER_ENOMEM : LARDER_EIO;
    snprintf(err, errlen,
             "CUDA device %d: cannot allocate the stream's %llu bytes of device memory (%s): "
             "%s%s",
             device, (unsigned long long)r->dev_bytes, what, lcuda_strerror(api, cr, e, sizeof(e)),
             rc == LARDER_ENOMEM ? "; open the stream with a smaller arena_bytes" : "");
    (void)api->cuCtxSetCurrent(NULL);
    free(r);
    return rc;
  }
  if (legacy) {
    CUipcMemHandle h;
    cr = api->cuIpcGetMemHandle(&h, r->dev);
    if (cr != CUDA_SUCCESS) {
      snprintf(err, errlen, "CUDA device %d: cannot export device memory (cuIpcGetMemHandle): %s",
               device, lcuda_strerror(api, cr, e, sizeof(e)));
      (void)api->cuMemFree(r->dev);
      (void)api->cuCtxSetCurrent(NULL);
      free(r);
      return LARDER_EIO;
    }
    memcpy(ex->handle, &h, CUDA_IPC_HANDLE_BYTES);
  }
  ex->region_bytes = r->dev_bytes;
  cr = api->cuMemHostRegister(host, (size_t)size, CU_MEMHOSTREGISTER_PORTABLE);
  r->pinned = cr == CUDA_SUCCESS;
  if (!r->pinned) {
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
      log_warn(
          "CUDA streams: cannot pin arenas (cuMemHostRegister: %s); copies to the GPU go "
          "from pageable memory, slower (raise LimitMEMLOCK / ulimit -l)",
          lcuda_strerror(api, cr, e, sizeof(e)));
  }
  (void)api->cuCtxSetCurrent(NULL);
  __atomic_add_fetch(&device_bytes[device], r->dev_bytes, __ATOMIC_RELAXED);
  STATS_ADD(stats, cuda_device_bytes, r->dev_bytes);
  log_info("CUDA region of %llu bytes on device %d (arena %s, %s)",
           (unsigned long long)r->dev_bytes, device, r->pinned ? "pinned" : "pageable",
           r->vmm ? "exported as a descriptor" : "legacy IPC");
  *out = r;
  return 0;
}

/* The driver's callback, on a thread of its own once the copies before it
 * on the stream ended: hands the copy to the loop.  No CUDA call here. */
static void CUDA_CB copy_finished(CUstream st, CUresult status, void *arg) {
  (void)st;
  copy_t *c = arg;
  c->status = (int)status;
  STATS_ADD(c->stats, cuda_copy_ns, util_now_ns() - c->start_ns);
  pthread_mutex_lock(&finished_lock);
  c->next = finished;
  finished = c;
  /* Under the lock: the loop reports the copy (and may count the last one
   * done, and close the handle at shutdown) only after the send
   * returned.  It does not block. */
  uv_async_send(&finished_async);
  pthread_mutex_unlock(&finished_lock);
}

static void report_copy(copy_t *c) {
  if (c->status == CUDA_SUCCESS) {
    c->done(c->arg, 0, "");
    return;
  }
  char e[160], msg[300];
  char lerr[200];
  const lcuda_api_t *api = lcuda_load(lerr, sizeof(lerr));
  snprintf(msg, sizeof(msg), "CUDA device %d: copying a batch to the GPU failed: %s", c->device,
           api ? lcuda_strerror(api, (CUresult)c->status, e, sizeof(e)) : "(no driver)");
  c->done(c->arg, LARDER_EIO, msg);
}

int cuda_region_copy(cuda_region_t *r, const uint64_t *offs, const uint64_t *lens, int n,
                     cuda_copy_cb done, void *arg, char *err, size_t errlen) {
  if (!__atomic_load_n(&loop_started, __ATOMIC_ACQUIRE)) {
    snprintf(err, errlen, "CUDA copies: no loop to report them to (cuda_loop_start)");
    return LARDER_EIO;
  }
  uint64_t total = 0;
  for (int i = 0; i < n; i++) {
    if (offs[i] > r->size || lens[i] > r->size - offs[i]) {
      snprintf(err, errlen, "CUDA copy of [%llu, +%llu) outside the %llu-byte region",
               (unsigned long long)offs[i], (unsigned long long)lens[i],
               (unsigned long long)r->size);
      return LARDER_EIO;
    }
    total += lens[i];
  }
  copy_t *c = calloc(1, sizeof(*c));
  if (c == NULL) {
    snprintf(err, errlen, "out of memory");
    return LARDER_ENOMEM;
  }
  *c = (copy_t){NULL, done, arg, r->device, 0, util_now_ns(), r->stats};
  const lcuda_api_t *api = r->api;
  char e[160];
  const char *what = "cuCtxSetCurrent";
  CUresult cr = api->cuCtxSetCurrent(r->ctx);
  CUstream *st = &tl_stream[r->device];
  if (cr == CUDA_SUCCESS && *st == NULL) {
    what = "cuStreamCreate";
    cr = api->cuStreamCreate(st, CU_STREAM_NON_BLOCKING);
    if (cr != CUDA_SUCCESS) *st = NULL;
  }
  int started = 0;
  for (int i = 0; i < n && cr == CUDA_SUCCESS; i++) {
    if (lens[i] == 0) continue;
    what = "cuMemcpyHtoDAsync";
    cr = api->cuMemcpyHtoDAsync(r->dev + offs[i], r->host + offs[i], (size_t)lens[i], *st);
    if (cr == CUDA_SUCCESS) started = 1;
  }
  if (cr == CUDA_SUCCESS) {
    what = "cuStreamAddCallback";
    __atomic_add_fetch(&copies_pending, 1, __ATOMIC_RELAXED);
    cr = api->cuStreamAddCallback(*st, copy_finished, c, 0);
    if (cr == CUDA_SUCCESS) {
      STATS_ADD(r->stats, cuda_copies, 1);
      STATS_ADD(r->stats, cuda_copy_bytes, total);
      return 0;
    }
    __atomic_sub_fetch(&copies_pending, 1, __ATOMIC_RELAXED);
  }
  /* Copies already started read the arena, whose room the caller frees on
   * this error: they end first (asleep: the context blocks). */
  if (started) (void)api->cuStreamSynchronize(*st);
  free(c);
  snprintf(err, errlen, "CUDA device %d: copying a batch to the GPU failed (%s): %s", r->device,
           what, lcuda_strerror(api, cr, e, sizeof(e)));
  return LARDER_EIO;
}

int cuda_region_pinned(const cuda_region_t *r) { return r->pinned; }
int cuda_region_device(const cuda_region_t *r) { return r->device; }

void cuda_region_detach_host(cuda_region_t *r) {
  const lcuda_api_t *api = r->api;
  char e[160];
  CUresult cr = api->cuCtxSetCurrent(r->ctx);
  if (cr == CUDA_SUCCESS && r->pinned) cr = api->cuMemHostUnregister(r->host);
  if (cr != CUDA_SUCCESS)
    log_warn("CUDA device %d: unpinning a stream's arena failed: %s", r->device,
             lcuda_strerror(api, cr, e, sizeof(e)));
  (void)api->cuCtxSetCurrent(NULL);
  r->pinned = 0;
  r->host = NULL;
  r->size = 0; /* copies fail: nothing lies within */
}

void cuda_region_close(cuda_region_t *r) {
  if (r == NULL) return;
  const lcuda_api_t *api = r->api;
  /* Each step is tried whatever the one before did: an arena that stays
   * pinned does not keep the device memory too. */
  const char *what[4] = {"cuCtxSetCurrent", NULL, NULL, NULL};
  CUresult cr[4] = {api->cuCtxSetCurrent(r->ctx), CUDA_SUCCESS, CUDA_SUCCESS, CUDA_SUCCESS};
  if (cr[0] == CUDA_SUCCESS) {
    if (r->pinned) {
      what[1] = "cuMemHostUnregister";
      cr[1] = api->cuMemHostUnregister(r->host);
    }
    if (r->vmm) {
      /* The trainer's mapping, if any, keeps the memory until it unmaps. */
      what[2] = "cuMemUnmap";
      cr[2] = api->cuMemUnmap(r->dev, (size_t)r->dev_bytes);
      if (cr[2] == CUDA_SUCCESS) {
        what[2] = "cuMemAddressFree";
        cr[2] = api->cuMemAddressFree(r->dev, (size_t)r->dev_bytes);
      }
      what[3] = "cuMemRelease";
      cr[3] = api->cuMemRelease(r->mem);
    } else {
      what[2] = "cuMemFree";
      cr[2] = api->cuMemFree(r->dev);
    }
  }
  for (int i = 0; i < 4; i++) {
    char e[160];
    if (cr[i] != CUDA_SUCCESS)
      log_warn("CUDA device %d: freeing a stream's region of %llu bytes: %s failed: %s", r->device,
               (unsigned long long)r->dev_bytes, what[i], lcuda_strerror(api, cr[i], e, sizeof(e)));
  }
  (void)api->cuCtxSetCurrent(NULL);
  __atomic_sub_fetch(&device_bytes[r->device], r->dev_bytes, __ATOMIC_RELAXED);
  STATS_SUB(r->stats, cuda_device_bytes, r->dev_bytes);
  free(r);
}

#else /* !LARDER_HAVE_CUDA_H */

struct cuda_region {
  int device;
};

static int region_is_vmm(const cuda_region_t *r) {
  (void)r;
  return 0;
}

static uint64_t region_dev_bytes(const cuda_region_t *r) {
  (void)r;
  return 0;
}

int cuda_region_open(int device, uint8_t *host, uint64_t size, stats_global_t *stats,
                     cuda_region_t **out, cuda_export_t *ex, char *err, size_t errlen) {
  (void)host;
  (void)size;
  (void)stats;
  ex->fd = -1;
  *out = NULL;
  return cuda_check(device, err, errlen);
}

static void report_copy(copy_t *c) { c->done(c->arg, LARDER_EIO, "built without CUDA"); }

int cuda_region_copy(cuda_region_t *r, const uint64_t *offs, const uint64_t *lens, int n,
                     cuda_copy_cb done, void *arg, char *err, size_t errlen) {
  (void)r;
  (void)offs;
  (void)lens;
  (void)n;
  (void)done;
  (void)arg;
  snprintf(err, errlen, "built without CUDA");
  return LARDER_EIO;
}

int cuda_region_pinned(const cuda_region_t *r) {
  (void)r;
  return 0;
}
int cuda_region_device(const cuda_region_t *r) { return r->device; }
void cuda_region_detach_host(cuda_region_t *r) { (void)r; }
void cuda_region_close(cuda_region_t *r) { (void)r; }

#endif /* LARDER_HAVE_CUDA_H */
