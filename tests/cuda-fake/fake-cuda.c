/*
 * fake-cuda.c: a TEST DOUBLE of the CUDA driver API (libcuda.so.1), the
 * subset larderd and liblarder use, for the tests on hosts without a GPU.
 * It is not CUDA: nothing runs on a GPU.  The Makefile builds it into
 * build/$(V)/lib/fake-cuda/libcuda.so.1; the tests point LARDER_LIBCUDA
 * at it, the path both larderd and liblarder dlopen.
 *
 * - Devices: $LARDER_FAKE_CUDA_DEVICES of them (default 2; 0 makes cuInit
 *   fail with CUDA_ERROR_NO_DEVICE).  $LARDER_FAKE_CUDA_VISIBLE, a list of
 *   them ("1" or "1,0"), renumbers them for this process as
 *   CUDA_VISIBLE_DEVICES does; cuDeviceGetUuid tells them apart.
 * - "Device memory" is shared memory: cuMemAlloc makes a memfd and maps
 *   it; the CUdeviceptr is the mapping's address in the calling process.
 *   Allocations past $LARDER_FAKE_CUDA_MEM bytes per device (default
 *   1 GiB) fail with CUDA_ERROR_OUT_OF_MEMORY.
 * - IPC: a handle holds a magic, the exporter's pid, the memfd's number,
 *   the size and the device; cuIpcOpenMemHandle maps /proc/<pid>/fd/<fd>
 *   (so, like the real one, it needs the exporter alive).  Each allocation
 *   has a page of importer slots, shared the same way, where an open
 *   records its process and a close clears it: cuMemFree of memory that a
 *   live process still has open, undefined behaviour in CUDA, aborts the
 *   exporter with a message (a dead or zombie importer does not count).
 * - Copies are memcpy, checked to stay inside a known mapping; streams and
 *   synchronization are no-ops, except that cuStreamSynchronize fails
 *   (CUDA_ERROR_NOT_PERMITTED) in a primary context whose flags
 *   (cuDevicePrimaryCtxSetFlags) do not say CU_CTX_SCHED_BLOCKING_SYNC:
 *   larderd's workers must sleep while a copy runs.  cuMemHostRegister
 *   succeeds unless $LARDER_FAKE_CUDA_NO_PIN is set; it and
 *   cuMemHostUnregister wait while the file $LARDER_FAKE_CUDA_PIN_GATE
 *   names exists (a slow pin, as of a large arena on a real GPU), having
 *   made the file "<that name>.held".  cuStreamAddCallback
 *   calls back from a thread of its own (see it for failing copies).
 * - VMM (cuMemCreate and the calls around it): an allocation is a memfd
 *   (named after its device), its handle a counted reference to it; a
 *   POSIX descriptor handle is a dup of the memfd, which the importer maps
 *   as it is.  cuMemAddressReserve reserves address space (PROT_NONE),
 *   cuMemMap maps the memfd over it, and copies reach a mapping only after
 *   cuMemSetAccess.  The memory is freed when the handles and mappings of
 *   every process are gone (the kernel's reference to the memfd), as in
 *   CUDA: an exporter may release what an importer still maps; but only
 *   the creating process's allocations count against
 *   $LARDER_FAKE_CUDA_MEM, and only until it lets go of them (an
 *   importer's mapping is not counted, where a GPU would still hold the
 *   memory).  The granularity is 2 MiB, or $LARDER_FAKE_CUDA_GRANULARITY
 *   bytes (a multiple of 2 MiB).  With $LARDER_FAKE_CUDA_NO_VMM set,
 *   cuDeviceGetAttribute says the devices have neither VMM nor POSIX
 *   descriptor handles, and cuMemCreate fails with
 *   CUDA_ERROR_NOT_SUPPORTED; with $LARDER_FAKE_CUDA_FAIL_EXPORT set,
 *   cuMemExportToShareableHandle fails with CUDA_ERROR_UNKNOWN.
 * - Events: recorded on a stream of the current context's device or a
 *   special one (legacy, per-thread; any other handle is refused with
 *   CUDA_ERROR_INVALID_HANDLE), and passed at once, unless the file
 *   $LARDER_FAKE_CUDA_GPU_BUSY names exists: then an event recorded while
 *   it does stays pending (the GPU still runs the work queued before it)
 *   until the file is removed, and cuEventSynchronize and
 *   cuCtxSynchronize wait for that.
 * - A context must be current for allocations and IPC (as in CUDA).
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define FAKE_MAGIC 0x31554346454b4146ull /* "FAKECFU1" */
#define FAKE_MAX_DEVICES 64

typedef struct fake_handle {
  uint64_t magic;
  int32_t pid, fd;
  uint64_t size;
  int32_t device;
  int32_t importers_fd; /* the page of importer slots */
} fake_handle;

#define FAKE_SLOTS 64
typedef struct importers {
  int32_t pid[FAKE_SLOTS]; /* 0: free */
} importers;

struct CUctx_st {
  int device;
};

typedef struct vmm_alloc {
  int fd; /* the memfd */
  size_t size;
  int device;
  int created; /* by cuMemCreate here (counts in used[]), not imported */
  int exportable;
  int refs; /* its handle, until cuMemRelease, and each cuMemMap */
} vmm_alloc;

enum { MAP_ALLOC = 0, MAP_IPC = 1, MAP_VMM = 2 };

typedef struct mapping {
  struct mapping *next;
  uintptr_t base;
  size_t size;
  int fd; /* allocations: the memfd; imports: -1 */
  int device;
  int imported;   /* MAP_* */
  vmm_alloc *vmm; /* MAP_VMM: what it maps */
  int no_access;  /* MAP_VMM before cuMemSetAccess */
  int ifd;        /* allocations: the importers page's memfd */
  importers *imp; /* the importers page, mapped */
  int slot;       /* imports: the slot it took, or -1 */
} mapping;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mapping *maps;
static size_t used[FAKE_MAX_DEVICES];
static struct CUctx_st ctxs[FAKE_MAX_DEVICES];
static int ctx_refs[FAKE_MAX_DEVICES];
static unsigned ctx_flags[FAKE_MAX_DEVICES]; /* cuDevicePrimaryCtxSetFlags */
static int initialized;
static __thread struct CUctx_st *current;
static __thread struct CUctx_st *ctx_stack[16];
static __thread int ctx_depth;
static char stream_token[FAKE_MAX_DEVICES];

static int physical_devices(void) {
  const char *v = getenv("LARDER_FAKE_CUDA_DEVICES");
  int n = v && *v ? atoi(v) : 2;
  if (n < 0) n = 0;
  if (n > FAKE_MAX_DEVICES) n = FAKE_MAX_DEVICES;
  return n;
}

/* This process's ordinal i as a physical device, or -1; the count of
 * ordinals when i < 0. */
static int visible(int i) {
  const char *v = getenv("LARDER_FAKE_CUDA_VISIBLE");
  int n = physical_devices();
  if (v == NULL || *v == '\0') return i < 0 ? n : (i < n ? i : -1);
  int k = 0;
  for (const char *p = v; *p;) {
    char *end;
    long d = strtol(p, &end, 10);
    if (end == p || d < 0 || d >= n) break;
    if (k == i) return (int)d;
    k++;
    p = *end == ',' ? end + 1 : end;
    if (*end != ',') break;
  }
  return i < 0 ? k : -1;
}

static int num_devices(void) { return visible(-1); }

static size_t mem_limit(void) {
  const char *v = getenv("LARDER_FAKE_CUDA_MEM");
  return v && *v ? (size_t)strtoull(v, NULL, 10) : (size_t)1 << 30;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
  switch (error) {
    case CUDA_SUCCESS: *pStr = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *pStr = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *pStr = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *pStr = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_NO_DEVICE: *pStr = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_DEVICE: *pStr = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *pStr = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_NOT_PERMITTED: *pStr = "CUDA_ERROR_NOT_PERMITTED"; break;
    case CUDA_ERROR_INVALID_HANDLE: *pStr = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *pStr = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case CUDA_ERROR_UNKNOWN: *pStr = "CUDA_ERROR_UNKNOWN"; break;
    case CUDA_ERROR_NOT_READY: *pStr = "CUDA_ERROR_NOT_READY"; break;
    case CUDA_ERROR_NOT_FOUND: *pStr = "CUDA_ERROR_NOT_FOUND"; break;
    default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
  switch (error) {
    case CUDA_SUCCESS: *pStr = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *pStr = "invalid argument (fake CUDA)"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *pStr = "out of memory (fake CUDA: LARDER_FAKE_CUDA_MEM)"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *pStr = "initialization error (fake CUDA)"; break;
    case CUDA_ERROR_NO_DEVICE: *pStr = "no CUDA-capable device is detected (fake CUDA)"; break;
    case CUDA_ERROR_INVALID_DEVICE: *pStr = "invalid device ordinal (fake CUDA)"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *pStr = "invalid device context (fake CUDA)"; break;
    case CUDA_ERROR_NOT_PERMITTED: *pStr = "operation not permitted (fake CUDA)"; break;
    case CUDA_ERROR_INVALID_HANDLE: *pStr = "invalid resource handle (fake CUDA)"; break;
    case CUDA_ERROR_NOT_SUPPORTED:
      *pStr = "operation not supported (fake CUDA: LARDER_FAKE_CUDA_NO_VMM)";
      break;
    case CUDA_ERROR_UNKNOWN:
      *pStr = "unknown error (fake CUDA: a failure it was told to make)";
      break;
    default: *pStr = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (num_devices() == 0) return CUDA_ERROR_NO_DEVICE;
  __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

#define NEED_INIT() \
  if (!__atomic_load_n(&initialized, __ATOMIC_ACQUIRE)) return CUDA_ERROR_NOT_INITIALIZED

CUresult CUDAAPI cuDriverGetVersion(int *v) {
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) {
  NEED_INIT();
  *count = num_devices();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  NEED_INIT();
  if (ordinal < 0 || ordinal >= num_devices()) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
  NEED_INIT();
  if (dev < 0 || dev >= num_devices()) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "larder fake CUDA device %d (test double)", visible(dev));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
  NEED_INIT();
  if (dev < 0 || dev >= num_devices()) return CUDA_ERROR_INVALID_DEVICE;
  memset(uuid->bytes, 0, sizeof(uuid->bytes));
  snprintf(uuid->bytes, sizeof(uuid->bytes), "fake-gpu-%d", visible(dev));
  return CUDA_SUCCESS;
}

/* Contexts and memory are per physical device. */
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice ordinal) {
  NEED_INIT();
  if (ordinal < 0 || ordinal >= num_devices()) return CUDA_ERROR_INVALID_DEVICE;
  int dev = visible(ordinal);
  pthread_mutex_lock(&lock);
  ctxs[dev].device = dev;
  ctx_refs[dev]++;
  pthread_mutex_unlock(&lock);
  *pctx = &ctxs[dev];
  return CUDA_SUCCESS;
}

/* The flags are kept, not acted on: nothing here waits. */
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice ordinal, unsigned int flags) {
  NEED_INIT();
  if (ordinal < 0 || ordinal >= num_devices()) return CUDA_ERROR_INVALID_DEVICE;
  if (flags & ~(unsigned)(CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX))
    return CUDA_ERROR_INVALID_VALUE;
  if ((flags & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_MASK) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  ctx_flags[visible(ordinal)] = flags;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice ordinal) {
  NEED_INIT();
  if (ordinal < 0 || ordinal >= num_devices()) return CUDA_ERROR_INVALID_DEVICE;
  int dev = visible(ordinal);
  pthread_mutex_lock(&lock);
  int bad = ctx_refs[dev] <= 0;
  if (!bad) ctx_refs[dev]--;
  pthread_mutex_unlock(&lock);
  return bad ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  NEED_INIT();
  current = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
  NEED_INIT();
  if (ctx == NULL || ctx_depth == 16) return CUDA_ERROR_INVALID_VALUE;
  ctx_stack[ctx_depth++] = current;
  current = ctx;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) {
  NEED_INIT();
  if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = current;
  current = ctx_stack[--ctx_depth];
  return CUDA_SUCCESS;
}

static int gpu_busy(void);

CUresult CUDAAPI cuCtxSynchronize(void) {
  NEED_INIT();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  while (gpu_busy()) usleep(1000); /* the work queued so far */
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total) {
  NEED_INIT();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  size_t u = used[current->device], lim = mem_limit();
  pthread_mutex_unlock(&lock);
  *free_bytes = u < lim ? lim - u : 0;
  *total = lim;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
  NEED_INIT();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  int dev = current->device;
  pthread_mutex_lock(&lock);
  if (used[dev] + bytesize > mem_limit()) {
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  used[dev] += bytesize;
  pthread_mutex_unlock(&lock);
  mapping *m = calloc(1, sizeof(*m));
  int fd = memfd_create("larder-fake-cuda-device-memory", MFD_CLOEXEC);
  void *p = MAP_FAILED;
  if (m && fd >= 0 && ftruncate(fd, (off_t)bytesize) == 0)
    p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    if (fd >= 0) close(fd);
    free(m);
    pthread_mutex_lock(&lock);
    used[dev] -= bytesize;
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  m->base = (uintptr_t)p;
  m->size = bytesize;
  m->fd = fd;
  m->device = dev;
  m->slot = -1;
  m->ifd = memfd_create("larder-fake-cuda-importers", MFD_CLOEXEC);
  void *ip = MAP_FAILED;
  if (m->ifd >= 0 && ftruncate(m->ifd, sizeof(importers)) == 0)
    ip = mmap(NULL, sizeof(importers), PROT_READ | PROT_WRITE, MAP_SHARED, m->ifd, 0);
  if (ip == MAP_FAILED) {
    if (m->ifd >= 0) close(m->ifd);
    munmap(p, bytesize);
    close(fd);
    free(m);
    pthread_mutex_lock(&lock);
    used[dev] -= bytesize;
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  m->imp = ip;
  pthread_mutex_lock(&lock);
  m->next = maps;
  maps = m;
  pthread_mutex_unlock(&lock);
  *dptr = (CUdeviceptr)m->base;
  return CUDA_SUCCESS;
}

/* Whether process pid still maps the file of inode ino: it has the region
 * open.  A process being killed gives up its memory before its sockets, so
 * a daemon that sees the trainer's connection close finds it unmapped
 * already, as the real driver finds the context gone. */
static int still_maps(int pid, unsigned long ino) {
  char path[64], line[512];
  snprintf(path, sizeof(path), "/proc/%d/maps", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  int found = 0;
  while (!found && fgets(line, sizeof(line), f)) {
    unsigned long inode = 0;
    if (sscanf(line, "%*s %*s %*s %*s %lu", &inode) == 1 && inode == ino) found = 1;
  }
  fclose(f);
  return found;
}

/* Unlinks and returns the mapping that starts at base (imported or not),
 * or NULL. */
static mapping *take_mapping(uintptr_t base, int imported) {
  pthread_mutex_lock(&lock);
  mapping **pp = &maps;
  while (*pp && ((*pp)->base != base || (*pp)->imported != imported)) pp = &(*pp)->next;
  mapping *m = *pp;
  if (m) *pp = m->next;
  if (m && !imported) used[m->device] -= m->size;
  pthread_mutex_unlock(&lock);
  return m;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
  NEED_INIT();
  mapping *m = take_mapping((uintptr_t)dptr, 0);
  if (m == NULL) return CUDA_ERROR_INVALID_VALUE;
  struct stat st;
  unsigned long ino = fstat(m->fd, &st) == 0 ? (unsigned long)st.st_ino : 0;
  for (int i = 0; i < FAKE_SLOTS; i++) {
    int pid = __atomic_load_n(&m->imp->pid[i], __ATOMIC_ACQUIRE);
    if (pid && still_maps(pid, ino)) {
      fprintf(stderr,
              "fake CUDA: cuMemFree of device memory that process %d still has open "
              "(cuIpcOpenMemHandle without cuIpcCloseMemHandle): undefined behaviour in CUDA\n",
              pid);
      abort();
    }
  }
  munmap(m->imp, sizeof(importers));
  close(m->ifd);
  munmap((void *)m->base, m->size);
  close(m->fd);
  free(m);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAllocHost(void **pp, size_t bytesize) {
  NEED_INIT();
  *pp = malloc(bytesize ? bytesize : 1);
  return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuMemFreeHost(void *p) {
  free(p);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
  NEED_INIT();
  fake_handle h = {FAKE_MAGIC, (int32_t)getpid(), -1, 0, 0, -1};
  pthread_mutex_lock(&lock);
  for (mapping *m = maps; m; m = m->next)
    if (!m->imported && m->base == (uintptr_t)dptr) {
      h.fd = m->fd;
      h.size = m->size;
      h.device = m->device;
      h.importers_fd = m->ifd;
    }
  pthread_mutex_unlock(&lock);
  if (h.fd < 0) return CUDA_ERROR_INVALID_VALUE;
  memset(pHandle, 0, sizeof(*pHandle));
  memcpy(pHandle->reserved, &h, sizeof(h));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
  NEED_INIT();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
  fake_handle h;
  memcpy(&h, handle.reserved, sizeof(h));
  if (h.magic != FAKE_MAGIC || h.size == 0) return CUDA_ERROR_INVALID_HANDLE;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  void *p = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.importers_fd);
  int ifd = open(path, O_RDWR | O_CLOEXEC);
  void *ip = ifd >= 0 ? mmap(NULL, sizeof(importers), PROT_READ | PROT_WRITE, MAP_SHARED, ifd, 0)
                      : MAP_FAILED;
  if (ifd >= 0) close(ifd);
  mapping *m = ip != MAP_FAILED ? calloc(1, sizeof(*m)) : NULL;
  if (m == NULL) {
    if (ip != MAP_FAILED) munmap(ip, sizeof(importers));
    munmap(p, h.size);
    return ip == MAP_FAILED ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_OUT_OF_MEMORY;
  }
  m->imp = ip;
  m->slot = -1;
  for (int i = 0; i < FAKE_SLOTS && m->slot < 0; i++) {
    int32_t zero = 0;
    if (__atomic_compare_exchange_n(&m->imp->pid[i], &zero, (int32_t)getpid(), 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      m->slot = i;
  }
  m->base = (uintptr_t)p;
  m->size = h.size;
  m->fd = -1;
  m->device = h.device;
  m->imported = 1;
  pthread_mutex_lock(&lock);
  m->next = maps;
  maps = m;
  pthread_mutex_unlock(&lock);
  *pdptr = (CUdeviceptr)m->base;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  NEED_INIT();
  mapping *m = take_mapping((uintptr_t)dptr, 1);
  if (m == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (m->slot >= 0) __atomic_store_n(&m->imp->pid[m->slot], 0, __ATOMIC_RELEASE);
  munmap(m->imp, sizeof(importers));
  munmap((void *)m->base, m->size);
  free(m);
  return CUDA_SUCCESS;
}

/* Pinning or unpinning a large arena takes the real driver a long time:
 * a test holds the call here while the file $LARDER_FAKE_CUDA_PIN_GATE
 * names exists, having made "<that name>.held" to say a call waits. */
static void pin_gate(void) {
  const char *gate = getenv("LARDER_FAKE_CUDA_PIN_GATE");
  if (gate == NULL || *gate == '\0' || access(gate, F_OK) != 0) return;
  char held[4096];
  snprintf(held, sizeof(held), "%s.held", gate);
  int fd = open(held, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) close(fd);
  while (access(gate, F_OK) == 0) usleep(1000);
}

CUresult CUDAAPI cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags) {
  NEED_INIT();
  (void)Flags;
  if (p == NULL || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  pin_gate();
  const char *v = getenv("LARDER_FAKE_CUDA_NO_PIN");
  return v && *v ? CUDA_ERROR_NOT_PERMITTED : CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostUnregister(void *p) {
  NEED_INIT();
  if (p == NULL) return CUDA_ERROR_INVALID_VALUE;
  pin_gate();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  NEED_INIT();
  (void)Flags;
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *phStream = (CUstream)(void *)&stream_token[current->device];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream) {
  NEED_INIT();
  return hStream ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* A rule of the double, not of CUDA: only a context set to block
 * (CU_CTX_SCHED_BLOCKING_SYNC) may wait on a stream, so every test checks
 * that larderd's workers sleep, never spin, while their copies run. */
CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  NEED_INIT();
  (void)hStream;
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  unsigned flags = ctx_flags[current->device];
  pthread_mutex_unlock(&lock);
  return (flags & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_BLOCKING_SYNC ? CUDA_SUCCESS
                                                                   : CUDA_ERROR_NOT_PERMITTED;
}

/* cuStreamAddCallback: the callback runs on a thread of its own, as the
 * driver's do, after the copies before it (here done already).  With
 * $LARDER_FAKE_CUDA_FAIL_CALLBACKS=N, every callback after the first N of
 * the process is passed CUDA_ERROR_UNKNOWN, as after a copy that failed. */
typedef struct fake_callback {
  CUstream stream;
  CUstreamCallback fn;
  void *arg;
  CUresult status;
} fake_callback;

static void *run_callback(void *p) {
  fake_callback *c = p;
  c->fn(c->stream, c->status, c->arg);
  free(c);
  return NULL;
}

static long callbacks_made;

CUresult CUDAAPI cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData,
                                     unsigned int flags) {
  NEED_INIT();
  if (hStream == NULL || callback == NULL || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  fake_callback *c = malloc(sizeof(*c));
  if (c == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  const char *v = getenv("LARDER_FAKE_CUDA_FAIL_CALLBACKS");
  long n = __atomic_fetch_add(&callbacks_made, 1, __ATOMIC_RELAXED);
  *c = (fake_callback){hStream, callback, userData,
                       v && *v && n >= atol(v) ? CUDA_ERROR_UNKNOWN : CUDA_SUCCESS};
  pthread_attr_t attr;
  pthread_t t;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&t, &attr, run_callback, c);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    free(c);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

/* Whether [p, p + n) lies in one known mapping of this process. */
static int device_range(uintptr_t p, size_t n) {
  int ok = 0;
  pthread_mutex_lock(&lock);
  for (mapping *m = maps; m && !ok; m = m->next)
    ok = !m->no_access && p >= m->base && n <= m->size && p - m->base <= m->size - n;
  pthread_mutex_unlock(&lock);
  return ok;
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
  NEED_INIT();
  if (!device_range((uintptr_t)dst, n)) return CUDA_ERROR_INVALID_VALUE;
  memcpy((void *)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream hStream) {
  (void)hStream;
  return cuMemcpyHtoD(dst, src, n);
}

CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  NEED_INIT();
  if (!device_range((uintptr_t)src, n)) return CUDA_ERROR_INVALID_VALUE;
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* VMM                                                                       */

#define VMM_NAME "larder-fake-cuda-vmm-dev"

static size_t fake_granularity(void) {
  const char *v = getenv("LARDER_FAKE_CUDA_GRANULARITY");
  size_t g = v && *v ? (size_t)strtoull(v, NULL, 10) : 0;
  return g && g % ((size_t)2 << 20) == 0 ? g : (size_t)2 << 20;
}
#define FAKE_GRANULARITY fake_granularity()

static int env_set(const char *name) {
  const char *v = getenv(name);
  return v && *v;
}

/* Only what larderd asks: VMM and POSIX descriptor handles. */
CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  NEED_INIT();
  if (dev < 0 || dev >= num_devices()) return CUDA_ERROR_INVALID_DEVICE;
  if (attrib != CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED &&
      attrib != CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
    return CUDA_ERROR_INVALID_VALUE;
  *pi = !env_set("LARDER_FAKE_CUDA_NO_VMM");
  return CUDA_SUCCESS;
}

static CUresult check_prop(const CUmemAllocationProp *prop, int *dev) {
  if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.id < 0 || prop->location.id >= num_devices()) return CUDA_ERROR_INVALID_DEVICE;
  *dev = visible(prop->location.id);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
  NEED_INIT();
  (void)option;
  int dev;
  CUresult r = check_prop(prop, &dev);
  if (r == CUDA_SUCCESS) *granularity = FAKE_GRANULARITY;
  return r;
}

/* Drops one reference to a; the last frees it.  Under lock. */
static void vmm_unref(vmm_alloc *a) {
  if (--a->refs > 0) return;
  if (a->created) used[a->device] -= a->size;
  close(a->fd);
  free(a);
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags) {
  NEED_INIT();
  int dev;
  CUresult r = check_prop(prop, &dev);
  if (r != CUDA_SUCCESS) return r;
  if (flags != 0 || size == 0 || size % FAKE_GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
  if (env_set("LARDER_FAKE_CUDA_NO_VMM")) return CUDA_ERROR_NOT_SUPPORTED;
  vmm_alloc *a = calloc(1, sizeof(*a));
  if (a == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  int over = used[dev] + size > mem_limit();
  if (!over) used[dev] += size;
  pthread_mutex_unlock(&lock);
  if (over) {
    free(a);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  char name[64];
  snprintf(name, sizeof(name), VMM_NAME "%d", dev);
  a->fd = memfd_create(name, MFD_CLOEXEC);
  if (a->fd < 0 || ftruncate(a->fd, (off_t)size) != 0) {
    if (a->fd >= 0) close(a->fd);
    free(a);
    pthread_mutex_lock(&lock);
    used[dev] -= size;
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  a->size = size;
  a->device = dev;
  a->created = 1;
  a->exportable = (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  a->refs = 1;
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)a;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  NEED_INIT();
  if (handle == 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  vmm_unref((vmm_alloc *)(uintptr_t)handle);
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle,
                                              CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags) {
  NEED_INIT();
  vmm_alloc *a = (vmm_alloc *)(uintptr_t)handle;
  if (a == NULL || shareableHandle == NULL || flags != 0 ||
      handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_INVALID_VALUE;
  if (!a->exportable) return CUDA_ERROR_NOT_PERMITTED;
  if (env_set("LARDER_FAKE_CUDA_FAIL_EXPORT")) return CUDA_ERROR_UNKNOWN;
  /* Not close-on-exec: the caller sets that, as it must with the real
   * driver, which does not say. */
  int fd = dup(a->fd);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *(int *)shareableHandle = fd;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                void *osHandle,
                                                CUmemAllocationHandleType shHandleType) {
  NEED_INIT();
  if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  int fd = (int)(intptr_t)osHandle;
  char path[64], target[256];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof(target) - 1);
  struct stat st;
  if (n <= 0 || fstat(fd, &st) != 0) return CUDA_ERROR_INVALID_HANDLE;
  target[n] = '\0';
  const char *at = strstr(target, "memfd:" VMM_NAME);
  if (at == NULL || st.st_size <= 0) return CUDA_ERROR_INVALID_HANDLE;
  vmm_alloc *a = calloc(1, sizeof(*a));
  if (a == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  a->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (a->fd < 0) {
    free(a);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  a->size = (size_t)st.st_size;
  a->device = atoi(at + strlen("memfd:" VMM_NAME));
  a->refs = 1;
  *handle = (CUmemGenericAllocationHandle)(uintptr_t)a;
  return CUDA_SUCCESS;
}

/* Reserved address ranges. */
typedef struct reservation {
  struct reservation *next;
  uintptr_t base;
  size_t size;
} reservation;
static reservation *reservations; /* under lock */

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                     CUdeviceptr addr, unsigned long long flags) {
  NEED_INIT();
  if (size == 0 || size % FAKE_GRANULARITY || alignment > FAKE_GRANULARITY || addr || flags)
    return CUDA_ERROR_INVALID_VALUE;
  reservation *v = calloc(1, sizeof(*v));
  void *p = v ? mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
              : MAP_FAILED;
  if (p == MAP_FAILED) {
    free(v);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  v->base = (uintptr_t)p;
  v->size = size;
  pthread_mutex_lock(&lock);
  v->next = reservations;
  reservations = v;
  pthread_mutex_unlock(&lock);
  *ptr = (CUdeviceptr)v->base;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  NEED_INIT();
  pthread_mutex_lock(&lock);
  int busy = 0;
  for (mapping *m = maps; m; m = m->next)
    busy |= m->imported == MAP_VMM && m->base >= (uintptr_t)ptr && m->base - ptr < size;
  reservation **pp = &reservations;
  while (*pp && ((*pp)->base != (uintptr_t)ptr || (*pp)->size != size)) pp = &(*pp)->next;
  reservation *v = busy ? NULL : *pp;
  if (v) *pp = v->next;
  pthread_mutex_unlock(&lock);
  if (v == NULL) return CUDA_ERROR_INVALID_VALUE; /* unknown, or still mapped */
  munmap((void *)v->base, v->size);
  free(v);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags) {
  NEED_INIT();
  vmm_alloc *a = (vmm_alloc *)(uintptr_t)handle;
  if (a == NULL || offset != 0 || flags != 0 || size == 0 || size > a->size ||
      size % FAKE_GRANULARITY)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  int inside = 0;
  for (reservation *v = reservations; v && !inside; v = v->next)
    inside = (uintptr_t)ptr >= v->base && size <= v->size && ptr - v->base <= v->size - size;
  for (mapping *m = maps; m && inside; m = m->next)
    if (m->imported == MAP_VMM && m->base < ptr + size && ptr < m->base + m->size) inside = 0;
  pthread_mutex_unlock(&lock);
  if (!inside) return CUDA_ERROR_INVALID_VALUE;
  mapping *m = calloc(1, sizeof(*m));
  if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  void *p =
      mmap((void *)(uintptr_t)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, a->fd, 0);
  if (p == MAP_FAILED) {
    free(m);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  m->base = (uintptr_t)ptr;
  m->size = size;
  m->fd = -1;
  m->device = a->device;
  m->imported = MAP_VMM;
  m->vmm = a;
  m->no_access = 1;
  m->slot = -1;
  pthread_mutex_lock(&lock);
  a->refs++;
  m->next = maps;
  maps = m;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                size_t count) {
  NEED_INIT();
  if (desc == NULL || count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      desc->location.id < 0 || desc->location.id >= num_devices() ||
      desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return CUDA_ERROR_INVALID_VALUE;
  int found = 0;
  pthread_mutex_lock(&lock);
  for (mapping *m = maps; m; m = m->next)
    if (m->imported == MAP_VMM && m->base == (uintptr_t)ptr && m->size == size) {
      m->no_access = 0;
      found = 1;
    }
  pthread_mutex_unlock(&lock);
  return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  NEED_INIT();
  pthread_mutex_lock(&lock);
  mapping **pp = &maps;
  while (*pp &&
         ((*pp)->imported != MAP_VMM || (*pp)->base != (uintptr_t)ptr || (*pp)->size != size))
    pp = &(*pp)->next;
  mapping *m = *pp;
  if (m) {
    *pp = m->next;
    vmm_unref(m->vmm);
  }
  pthread_mutex_unlock(&lock);
  if (m == NULL) return CUDA_ERROR_INVALID_VALUE;
  /* Back to reserved address space. */
  (void)mmap((void *)m->base, m->size, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  free(m);
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Events                                                                    */

typedef struct fake_event {
  int magic;
  int busy; /* recorded while $LARDER_FAKE_CUDA_GPU_BUSY existed */
} fake_event;
#define EVENT_MAGIC 0x45564e54

static int gpu_busy(void) {
  const char *path = getenv("LARDER_FAKE_CUDA_GPU_BUSY");
  return path && *path && access(path, F_OK) == 0;
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags) {
  NEED_INIT();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  (void)Flags;
  fake_event *e = calloc(1, sizeof(*e));
  if (e == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  e->magic = EVENT_MAGIC;
  *phEvent = (CUevent)(void *)e;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent) {
  NEED_INIT();
  fake_event *e = (fake_event *)(void *)hEvent;
  if (e == NULL || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
  e->magic = 0;
  free(e);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  NEED_INIT();
  if (current == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  fake_event *e = (fake_event *)(void *)hEvent;
  if (e == NULL || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
  /* A stream of the current context's device, or a special one; as the
   * real driver, any other is refused. */
  if (hStream != NULL && hStream != CU_STREAM_LEGACY && hStream != CU_STREAM_PER_THREAD &&
      hStream != (CUstream)(void *)&stream_token[current->device])
    return CUDA_ERROR_INVALID_HANDLE;
  __atomic_store_n(&e->busy, gpu_busy(), __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  NEED_INIT();
  fake_event *e = (fake_event *)(void *)hEvent;
  if (e == NULL || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
  if (__atomic_load_n(&e->busy, __ATOMIC_ACQUIRE) && gpu_busy()) return CUDA_ERROR_NOT_READY;
  __atomic_store_n(&e->busy, 0, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  CUresult r;
  while ((r = cuEventQuery(hEvent)) == CUDA_ERROR_NOT_READY) usleep(1000);
  return r;
}

/* The allocation (or import, or VMM mapping) that dptr lies in. */
CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
  NEED_INIT();
  CUresult r = CUDA_ERROR_NOT_FOUND;
  pthread_mutex_lock(&lock);
  for (mapping *m = maps; m; m = m->next)
    if ((uintptr_t)dptr >= m->base && (uintptr_t)dptr - m->base < m->size) {
      if (pbase) *pbase = (CUdeviceptr)m->base;
      if (psize) *psize = m->size;
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&lock);
  return r;
}
