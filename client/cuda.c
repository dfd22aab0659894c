/*
 * cuda.c: liblarder's CUDA side: the driver loader that larderd shares
 * (lcuda_load), the trainer's mapping of a stream's device region
 * (lcuda_map_*).  See lcuda.h.  (The exports of device batches, through
 * the Arrow C Device Data Interface and DLPack, are export.c's.)
 *
 * Invariants:
 * - The driver table, once loaded, is never unloaded: device pointers and
 *   contexts outlive any one stream.
 * - A mapping retains its device's primary context for as long as it is
 *   open, and makes it current only around its own calls (push/pop), so
 *   the caller's current context (PyTorch's) is never changed.
 * - A mapping is closed only by the process that opened it.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lcuda.h"

#ifdef LARDER_HAVE_CUDA_H

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static lcuda_api_t *loaded; /* under load_lock until set, then immutable */

const char *lcuda_strerror(const lcuda_api_t *api, CUresult r, char *buf, size_t len) {
  const char *name = NULL, *text = NULL;
  if (api && api->cuGetErrorName) (void)api->cuGetErrorName(r, &name);
  if (api && api->cuGetErrorString) (void)api->cuGetErrorString(r, &text);
  snprintf(buf, len, "%s (%s)", name ? name : "CUDA error", text ? text : "no description");
  if (name == NULL) snprintf(buf, len, "CUDA error %d", (int)r);
  return buf;
}

const lcuda_api_t *lcuda_load(char *err, size_t errlen) {
  pthread_mutex_lock(&load_lock);
  lcuda_api_t *api = loaded;
  pthread_mutex_unlock(&load_lock);
  if (api) return api;
  const char *path = getenv("LARDER_LIBCUDA");
  if (path == NULL || *path == '\0') path = "libcuda.so.1";
  api = calloc(1, sizeof(*api));
  if (api == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  snprintf(api->path, sizeof(api->path), "%s", path);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char *why = dlerror();
    snprintf(err, errlen,
             "CUDA device memory is unavailable: cannot load the CUDA driver %s (%s); "
             "install the NVIDIA driver or set LARDER_LIBCUDA",
             path, why ? why : "not found");
    free(api);
    return NULL;
  }
#define LCUDA_RESOLVE_(name)                                                     \
  if (ok) {                                                                      \
    *(void **)(&api->name) = dlsym(h, LCUDA_SYMBOL(name));                       \
    if (api->name == NULL) {                                                     \
      snprintf(err, errlen,                                                      \
               "CUDA device memory is unavailable: the CUDA driver %s lacks %s " \
               "(a driver older than the toolkit larder was built with?)",       \
               path, LCUDA_SYMBOL(name));                                        \
      ok = 0;                                                                    \
    }                                                                            \
  }
  int ok = 1;
  LCUDA_FUNCS(LCUDA_RESOLVE_)
#undef LCUDA_RESOLVE_
  CUresult r = CUDA_SUCCESS;
  if (ok && (r = api->cuInit(0)) != CUDA_SUCCESS) {
    char e[160];
    snprintf(err, errlen, "CUDA device memory is unavailable: cuInit with %s failed: %s", path,
             lcuda_strerror(api, r, e, sizeof(e)));
    ok = 0;
  }
  if (ok && (r = api->cuDeviceGetCount(&api->num_devices)) != CUDA_SUCCESS) {
    char e[160];
    snprintf(err, errlen, "CUDA device memory is unavailable: cuDeviceGetCount failed: %s",
             lcuda_strerror(api, r, e, sizeof(e)));
    ok = 0;
  }
  if (ok) (void)api->cuDriverGetVersion(&api->driver_version);
  if (!ok) {
    dlclose(h);
    free(api);
    return NULL;
  }
  /* The handle stays open for the process's life: the table points into
   * it.  Two threads that loaded at once keep the first table. */
  pthread_mutex_lock(&load_lock);
  if (loaded == NULL) {
    loaded = api;
    api = NULL;
  }
  lcuda_api_t *out = loaded;
  pthread_mutex_unlock(&load_lock);
  free(api);
  return out;
}

int lcuda_check_device(int device, char *err, size_t errlen) {
  const lcuda_api_t *api = lcuda_load(err, errlen);
  if (api == NULL) return LARDER_EUNSUPPORTED;
  if (device < 0 || device >= api->num_devices || device >= LCUDA_MAX_DEVICES) {
    snprintf(err, errlen, "cuda_device %d: this host has %d CUDA device%s (0 .. %d)", device,
             api->num_devices, api->num_devices == 1 ? "" : "s", api->num_devices - 1);
    return LARDER_EINVAL;
  }
  return 0;
}

int lcuda_device_uuid(int device, uint8_t uuid[16], char *err, size_t errlen) {
  int rc = lcuda_check_device(device, err, errlen);
  if (rc) return rc;
  const lcuda_api_t *api = lcuda_load(err, errlen);
  CUdevice d;
  CUuuid u;
  CUresult r = api->cuDeviceGet(&d, device);
  if (r == CUDA_SUCCESS) r = api->cuDeviceGetUuid(&u, d);
  if (r != CUDA_SUCCESS) {
    char e[160];
    snprintf(err, errlen, "CUDA device %d: cannot read its UUID: %s", device,
             lcuda_strerror(api, r, e, sizeof(e)));
    return LARDER_EIO;
  }
  memcpy(uuid, u.bytes, 16);
  return 0;
}

int lcuda_device_by_uuid(const uint8_t uuid[16]) {
  char err[256];
  const lcuda_api_t *api = lcuda_load(err, sizeof(err));
  for (int i = 0; api && i < api->num_devices && i < LCUDA_MAX_DEVICES; i++) {
    uint8_t u[16];
    if (lcuda_device_uuid(i, u, err, sizeof(err)) == 0 && memcmp(u, uuid, 16) == 0) return i;
  }
  return -1;
}

struct lcuda_map {
  const lcuda_api_t *api;
  int device;
  pid_t pid;
  CUcontext ctx;
  CUdeviceptr base;
  uint64_t size;
  uint64_t mapped; /* VMM: the range reserved and mapped; 0 for legacy IPC */
  /* Fences (lcuda.h): a ring of fq_cap, fq_count of them from fq_head,
   * and the events of those taken, for the next ones. */
  struct {
    CUevent ev;
    uint64_t seq;
  } * fq;
  int fq_head, fq_count, fq_cap;
  CUevent *spare;
  int num_spare, cap_spare;
};

/* Maps the VMM allocation behind fd (region_bytes) at a range of this
 * process's own, with read and write access for device: sets m->base and
 * m->mapped.  The allocation's handle is released once mapped: the
 * mapping keeps the memory, as the daemon's release of its own does not
 * take it away.  Context current. */
static CUresult map_fd(lcuda_map_t *m, int fd, uint64_t region_bytes, const char **what) {
  const lcuda_api_t *api = m->api;
  CUmemGenericAllocationHandle h;
  *what = "cuMemImportFromShareableHandle";
  /* The driver takes a POSIX descriptor as the pointer's value. */
  void *os_handle = (void *)(uintptr_t)fd; /* NOLINT(performance-no-int-to-ptr) */
  CUresult r =
      api->cuMemImportFromShareableHandle(&h, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return r;
  CUdeviceptr base = 0;
  *what = "cuMemAddressReserve";
  r = api->cuMemAddressReserve(&base, (size_t)region_bytes, 0, 0, 0);
  if (r == CUDA_SUCCESS) {
    *what = "cuMemMap";
    r = api->cuMemMap(base, (size_t)region_bytes, 0, h, 0);
    if (r == CUDA_SUCCESS) {
      CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, m->device},
                             CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
      *what = "cuMemSetAccess";
      r = api->cuMemSetAccess(base, (size_t)region_bytes, &acc, 1);
      if (r != CUDA_SUCCESS) (void)api->cuMemUnmap(base, (size_t)region_bytes);
    }
    if (r != CUDA_SUCCESS) (void)api->cuMemAddressFree(base, (size_t)region_bytes);
  }
  (void)api->cuMemRelease(h);
  if (r == CUDA_SUCCESS) {
    m->base = base;
    m->mapped = region_bytes;
  }
  return r;
}

int lcuda_map_open(int device, const uint8_t *handle, size_t handle_len, int fd,
                   uint64_t region_bytes, uint64_t size, lcuda_map_t **out, char *err,
                   size_t errlen) {
  *out = NULL;
  int rc = lcuda_check_device(device, err, errlen);
  if (rc) return rc;
  const lcuda_api_t *api = lcuda_load(err, errlen);
  if (fd < 0 && (handle_len != sizeof(CUipcMemHandle) || handle_len != LCUDA_IPC_HANDLE_BYTES)) {
    snprintf(err, errlen, "the daemon sent a CUDA IPC handle of %zu bytes, not %d", handle_len,
             LCUDA_IPC_HANDLE_BYTES);
    return LARDER_EPROTO;
  }
  if (fd >= 0 && (region_bytes < size || region_bytes > ((uint64_t)1 << 48))) {
    snprintf(err, errlen, "the daemon sent a CUDA region of %llu bytes for an arena of %llu",
             (unsigned long long)region_bytes, (unsigned long long)size);
    return LARDER_EPROTO;
  }
  lcuda_map_t *m = calloc(1, sizeof(*m));
  if (m == NULL) {
    snprintf(err, errlen, "out of memory");
    return LARDER_ENOMEM;
  }
  m->api = api;
  m->device = device;
  m->pid = getpid();
  m->size = size;
  char e[160];
  CUdevice dev;
  CUresult r = api->cuDeviceGet(&dev, device);
  if (r == CUDA_SUCCESS) r = api->cuDevicePrimaryCtxRetain(&m->ctx, dev);
  if (r != CUDA_SUCCESS) {
    snprintf(err, errlen, "CUDA device %d: cannot retain its primary context: %s", device,
             lcuda_strerror(api, r, e, sizeof(e)));
    free(m);
    return LARDER_EIO;
  }
  const char *what = "cuIpcOpenMemHandle";
  r = api->cuCtxPushCurrent(m->ctx);
  if (r == CUDA_SUCCESS) {
    if (fd >= 0) {
      r = map_fd(m, fd, region_bytes, &what);
    } else {
      CUipcMemHandle h;
      memcpy(&h, handle, sizeof(h));
      r = api->cuIpcOpenMemHandle(&m->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      /* Every batch's pointers are offsets into it: it must hold the
       * arena. */
      CUdeviceptr start = 0;
      size_t bytes = 0;
      if (r == CUDA_SUCCESS) {
        what = "cuMemGetAddressRange";
        r = api->cuMemGetAddressRange(&start, &bytes, m->base);
        if (r == CUDA_SUCCESS && (start != m->base || bytes < size)) {
          (void)api->cuIpcCloseMemHandle(m->base);
          CUcontext popped;
          (void)api->cuCtxPopCurrent(&popped);
          snprintf(err, errlen,
                   "CUDA device %d: the daemon's device region holds %zu bytes, not the "
                   "arena's %llu",
                   device, bytes, (unsigned long long)size);
          (void)api->cuDevicePrimaryCtxRelease(dev);
          free(m);
          return LARDER_EPROTO;
        }
        if (r != CUDA_SUCCESS) (void)api->cuIpcCloseMemHandle(m->base);
      }
    }
    CUcontext popped;
    (void)api->cuCtxPopCurrent(&popped);
  }
  if (r != CUDA_SUCCESS) {
    rc = r == CUDA_ERROR_OUT_OF_MEMORY ? LARDER_ENOMEM : LARDER_EIO;
    if (fd >= 0)
      snprintf(err, errlen,
               "CUDA device %d: cannot map the daemon's device memory from its descriptor "
               "(%s): %s; the trainer needs a driver with virtual memory management and "
               "POSIX file descriptor handles, or a daemon with cuda_fd_handles = false",
               device, what, lcuda_strerror(api, r, e, sizeof(e)));
    else
      snprintf(err, errlen,
               "CUDA device %d: cannot open the daemon's device memory (%s): "
               "%s; the daemon and the trainer must see the same GPUs, and the driver must "
               "allow CUDA IPC between them (some refuse it across PID namespaces; a daemon "
               "with cuda_fd_handles = true passes a descriptor instead)",
               device, what, lcuda_strerror(api, r, e, sizeof(e)));
    (void)api->cuDevicePrimaryCtxRelease(dev);
    free(m);
    return rc;
  }
  *out = m;
  return 0;
}

uint64_t lcuda_map_base(const lcuda_map_t *m) { return (uint64_t)m->base; }

/* A fence that could not be recorded: waits for all the work of the
 * mapping's context, on every stream (whatever of that context may read
 * the batch), and returns rc (the caller releases at once). */
static int fence_instead(lcuda_map_t *m, int rc) {
  const lcuda_api_t *api = m->api;
  if (api->cuCtxPushCurrent(m->ctx) == CUDA_SUCCESS) {
    (void)api->cuCtxSynchronize();
    CUcontext popped;
    (void)api->cuCtxPopCurrent(&popped);
  }
  return rc;
}

int lcuda_fence_push(lcuda_map_t *m, void *stream, uint64_t seq) {
  if (m->pid != getpid()) return LARDER_EINVAL;
  if (m->fq_count == m->fq_cap) {
    int cap = m->fq_cap ? 2 * m->fq_cap : 16;
    __typeof__(m->fq) q = malloc((size_t)cap * sizeof(*q));
    if (q == NULL) return fence_instead(m, LARDER_ENOMEM);
    for (int i = 0; i < m->fq_count; i++) q[i] = m->fq[(m->fq_head + i) % m->fq_cap];
    free(m->fq);
    m->fq = q;
    m->fq_head = 0;
    m->fq_cap = cap;
  }
  if (m->num_spare + m->fq_count + 1 > m->cap_spare) {
    /* Room to keep every event, in use or not, once taken: pop never
     * fails for want of it. */
    int cap = m->cap_spare ? 2 * m->cap_spare : 16;
    CUevent *e = realloc(m->spare, (size_t)cap * sizeof(CUevent));
    if (e == NULL) return fence_instead(m, LARDER_ENOMEM);
    m->spare = e;
    m->cap_spare = cap;
  }
  const lcuda_api_t *api = m->api;
  CUevent ev = m->num_spare ? m->spare[--m->num_spare] : NULL;
  CUresult r = api->cuCtxPushCurrent(m->ctx);
  if (r != CUDA_SUCCESS) {
    if (ev) m->spare[m->num_spare++] = ev;
    return LARDER_EIO;
  }
  if (ev == NULL) r = api->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
  if (r == CUDA_SUCCESS) r = api->cuEventRecord(ev, stream ? (CUstream)stream : CU_STREAM_LEGACY);
  /* A stream the driver refuses (one of another device's context): the
   * context's work is waited for. */
  if (r != CUDA_SUCCESS) (void)api->cuCtxSynchronize();
  CUcontext popped;
  (void)api->cuCtxPopCurrent(&popped);
  if (r != CUDA_SUCCESS) {
    if (ev) m->spare[m->num_spare++] = ev;
    return LARDER_EIO;
  }
  int at = (m->fq_head + m->fq_count) % m->fq_cap;
  m->fq[at].ev = ev;
  m->fq[at].seq = seq;
  m->fq_count++;
  return 0;
}

int lcuda_fence_pop(lcuda_map_t *m, uint64_t *seq) {
  if (m->fq_count == 0 || m->pid != getpid()) return 0;
  const lcuda_api_t *api = m->api;
  CUevent ev = m->fq[m->fq_head].ev;
  CUresult r = api->cuCtxPushCurrent(m->ctx);
  if (r == CUDA_SUCCESS) {
    r = api->cuEventQuery(ev);
    CUcontext popped;
    (void)api->cuCtxPopCurrent(&popped);
  }
  if (r == CUDA_ERROR_NOT_READY) return 0;
  *seq = m->fq[m->fq_head].seq;
  m->fq_head = (m->fq_head + 1) % m->fq_cap;
  m->fq_count--;
  m->spare[m->num_spare++] = ev; /* room made by its push */
  return 1;
}

int lcuda_fence_count(const lcuda_map_t *m) { return m ? m->fq_count : 0; }

void *lcuda_fence_oldest(const lcuda_map_t *m) {
  return m && m->fq_count && m->pid == getpid() ? (void *)m->fq[m->fq_head].ev : NULL;
}

void lcuda_fence_wait(const lcuda_map_t *m, void *ev) {
  const lcuda_api_t *api = m->api;
  if (ev == NULL || api->cuCtxPushCurrent(m->ctx) != CUDA_SUCCESS) return;
  (void)api->cuEventSynchronize((CUevent)ev);
  CUcontext popped;
  (void)api->cuCtxPopCurrent(&popped);
}

void lcuda_map_close(lcuda_map_t *m) {
  if (m == NULL) return;
  if (m->pid == getpid()) {
    const lcuda_api_t *api = m->api;
    if (api->cuCtxPushCurrent(m->ctx) == CUDA_SUCCESS) {
      for (int i = 0; i < m->fq_count; i++)
        (void)api->cuEventDestroy(m->fq[(m->fq_head + i) % m->fq_cap].ev);
      for (int i = 0; i < m->num_spare; i++) (void)api->cuEventDestroy(m->spare[i]);
      if (m->mapped) {
        (void)api->cuMemUnmap(m->base, (size_t)m->mapped);
        (void)api->cuMemAddressFree(m->base, (size_t)m->mapped);
      } else {
        (void)api->cuIpcCloseMemHandle(m->base);
      }
      CUcontext popped;
      (void)api->cuCtxPopCurrent(&popped);
    }
    CUdevice dev;
    if (api->cuDeviceGet(&dev, m->device) == CUDA_SUCCESS)
      (void)api->cuDevicePrimaryCtxRelease(dev);
  }
  free(m->fq);
  free(m->spare);
  free(m);
}

#else /* !LARDER_HAVE_CUDA_H */

const lcuda_api_t *lcuda_load(char *err, size_t errlen) {
  snprintf(err, errlen,
           "CUDA device memory is unavailable: liblarder was built without the CUDA toolkit's "
           "cuda.h (set CUDA_HOME when building)");
  return NULL;
}

int lcuda_check_device(int device, char *err, size_t errlen) {
  (void)device;
  (void)lcuda_load(err, errlen);
  return LARDER_EUNSUPPORTED;
}

int lcuda_map_open(int device, const uint8_t *handle, size_t handle_len, int fd,
                   uint64_t region_bytes, uint64_t size, lcuda_map_t **out, char *err,
                   size_t errlen) {
  (void)handle;
  (void)handle_len;
  (void)fd;
  (void)region_bytes;
  (void)size;
  *out = NULL;
  return lcuda_check_device(device, err, errlen);
}

uint64_t lcuda_map_base(const lcuda_map_t *m) {
  (void)m;
  return 0;
}

int lcuda_device_uuid(int device, uint8_t uuid[16], char *err, size_t errlen) {
  (void)uuid;
  return lcuda_check_device(device, err, errlen);
}

int lcuda_device_by_uuid(const uint8_t uuid[16]) {
  (void)uuid;
  return -1;
}

int lcuda_fence_push(lcuda_map_t *m, void *stream, uint64_t seq) {
  (void)m;
  (void)stream;
  (void)seq;
  return LARDER_EINVAL;
}

int lcuda_fence_pop(lcuda_map_t *m, uint64_t *seq) {
  (void)m;
  (void)seq;
  return 0;
}

int lcuda_fence_count(const lcuda_map_t *m) {
  (void)m;
  return 0;
}

void *lcuda_fence_oldest(const lcuda_map_t *m) {
  (void)m;
  return NULL;
}

void lcuda_fence_wait(const lcuda_map_t *m, void *ev) {
  (void)m;
  (void)ev;
}

void lcuda_map_close(lcuda_map_t *m) { (void)m; }

#endif /* LARDER_HAVE_CUDA_H */
