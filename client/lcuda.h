/*
 * lcuda.h: liblarder's internal view of the CUDA driver API (prefix
 * lcuda_), shared by liblarder (client/cuda.c) and larderd (daemon/serve/cuda.c),
 * which links liblarder.a.  Not installed; nothing here is public.
 *
 * The driver is loaded at run time: dlopen("libcuda.so.1"), or the path in
 * $LARDER_LIBCUDA (the tests' double, tests/cuda-fake/), so that larderd
 * and every trainer start, and host streams work, on a host without a GPU
 * or driver.  The types and prototypes come from the toolkit's cuda.h
 * (Makefile: CUDA_HOME), which defines LARDER_HAVE_CUDA_H; a build without
 * it leaves the CUDA path out, and lcuda_load then always fails.
 *
 * cuda.h renames the versioned entry points (cuMemAlloc is cuMemAlloc_v2,
 * ...); LCUDA_FUNCS names them as cuda.h does, so the member names, their
 * types and the symbols looked up (LCUDA_SYMBOL) are the versioned ones
 * throughout, and the double defines the same.
 */
#ifndef LARDER_LCUDA_H
#define LARDER_LCUDA_H

#include <stddef.h>
#include <stdint.h>

#include "larder.h"

#define LCUDA_IPC_HANDLE_BYTES 64
/* Devices larderd and liblarder tell apart (cuda_device below this). */
#define LCUDA_MAX_DEVICES 64

#ifdef LARDER_HAVE_CUDA_H
#include <cuda.h>

/* A table: clang-format would run it into one expression. */
/* clang-format off */
#define LCUDA_FUNCS(XX)                                                         \
  XX(cuInit) XX(cuDriverGetVersion) XX(cuGetErrorString) XX(cuGetErrorName)     \
  XX(cuDeviceGetCount) XX(cuDeviceGet) XX(cuDeviceGetName) XX(cuDeviceGetUuid)  \
  XX(cuDeviceGetAttribute)                                                      \
  XX(cuDevicePrimaryCtxRetain) XX(cuDevicePrimaryCtxRelease)                    \
  XX(cuDevicePrimaryCtxSetFlags)                                                \
  XX(cuCtxPushCurrent) XX(cuCtxPopCurrent) XX(cuCtxSetCurrent)                  \
  XX(cuCtxSynchronize) XX(cuMemAlloc) XX(cuMemFree) XX(cuMemGetInfo)            \
  XX(cuMemAllocHost) XX(cuMemFreeHost) XX(cuIpcGetMemHandle)                    \
  XX(cuIpcOpenMemHandle) XX(cuIpcCloseMemHandle) XX(cuMemHostRegister)          \
  XX(cuMemHostUnregister) XX(cuStreamCreate) XX(cuStreamDestroy)                \
  XX(cuStreamSynchronize) XX(cuStreamAddCallback) XX(cuMemcpyHtoDAsync)        \
  XX(cuMemcpyHtoD) XX(cuMemcpyDtoH)                                             \
  XX(cuMemGetAllocationGranularity) XX(cuMemCreate) XX(cuMemRelease)            \
  XX(cuMemAddressReserve) XX(cuMemAddressFree) XX(cuMemMap) XX(cuMemUnmap)      \
  XX(cuMemSetAccess) XX(cuMemExportToShareableHandle)                           \
  XX(cuMemImportFromShareableHandle) XX(cuEventCreate) XX(cuEventDestroy)       \
  XX(cuEventRecord) XX(cuEventQuery) XX(cuEventSynchronize)                     \
  XX(cuMemGetAddressRange)
/* clang-format on */

#define LCUDA_STR_(x) #x
/* The symbol's name as cuda.h spells it after its renames. */
#define LCUDA_SYMBOL(x) LCUDA_STR_(x)

typedef struct lcuda_api {
#define LCUDA_MEMBER_(name) __typeof__(name) *name;
  LCUDA_FUNCS(LCUDA_MEMBER_)
#undef LCUDA_MEMBER_
  char path[256]; /* what was loaded */
  int driver_version;
  int num_devices;
} lcuda_api_t;

/* "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"-style text for
 * r into buf; returns buf.  Any thread. */
const char *lcuda_strerror(const lcuda_api_t *api, CUresult r, char *buf, size_t len);
#else
typedef struct lcuda_api lcuda_api_t;
#endif /* LARDER_HAVE_CUDA_H */

/* Loads the driver once per process (later calls return the same table;
 * a failure is not kept, so a later call tries again) and initialises it
 * (cuInit).  Returns the table, or NULL with why in err: no cuda.h at
 * build time, no libcuda, a symbol missing, cuInit failing (no device).
 * Any thread. */
const lcuda_api_t *lcuda_load(char *err, size_t errlen);

/* Whether device is a usable ordinal: 0, LARDER_EUNSUPPORTED (no driver,
 * err says what is missing) or LARDER_EINVAL (err names the device and
 * the count).  Any thread. */
int lcuda_check_device(int device, char *err, size_t errlen);

/* The UUID of device (an ordinal of this process, checked): 0, or a
 * negative code with err set. */
int lcuda_device_uuid(int device, uint8_t uuid[16], char *err, size_t errlen);
/* This process's ordinal of the device with that UUID, or -1. */
int lcuda_device_by_uuid(const uint8_t uuid[16]);

/* ------------------------------------------------------------------------ */
/* The trainer's side (client/cuda.c)                                        */

/* A stream's device region, opened from the daemon's IPC handle or
 * descriptor. */
typedef struct lcuda_map lcuda_map_t;

/* Opens the daemon's region of size bytes on device (primary context, made
 * current only for the call): from its legacy IPC handle (handle,
 * handle_len) when fd < 0, else from fd, the POSIX file descriptor of its
 * VMM allocation of region_bytes (cuMemImportFromShareableHandle, mapped
 * at an address range of this process's own; the caller keeps fd and
 * closes it).  Returns 0 with *out set, or a negative code with err set:
 * LARDER_EUNSUPPORTED (no driver), LARDER_EINVAL (device), LARDER_EPROTO
 * (a handle of the wrong size, a region smaller than size), LARDER_EIO
 * (the driver refused the handle), LARDER_ENOMEM.  The opening thread. */
int lcuda_map_open(int device, const uint8_t *handle, size_t handle_len, int fd,
                   uint64_t region_bytes, uint64_t size, lcuda_map_t **out, char *err,
                   size_t errlen);
/* The device address of the region's first byte. */
uint64_t lcuda_map_base(const lcuda_map_t *m);

/*
 * Fences: the trainer's GPU reads a batch in work it queued, which may
 * still run when the batch is released on the host (PyTorch frees a
 * tensor's storage, and calls its DLPack deleter, once the kernels that
 * use it are queued, not done).  The daemon would then copy another batch
 * over memory the GPU still reads.  So a release records an event on the
 * stream the trainer works on, after the work queued there so far
 * (lcuda_fence_push), and goes to the daemon only once that event has
 * passed (lcuda_fence_pop).  Fences are kept oldest first; their events
 * are reused.  The caller serializes the calls on a mapping (the stream's
 * lock); in a forked child, push fails and pop finds nothing.
 */
/* Records a fence for seq after the work queued so far on stream (a
 * CUstream of the mapping's device; NULL: the legacy default stream,
 * which orders after every blocking stream's work).  Returns 0, or
 * LARDER_EIO (the driver refused the stream) or LARDER_ENOMEM, having
 * then waited for all the work of the mapping's context (cuCtxSynchronize,
 * on the calling thread; not for another device's, which may read the
 * batch through peer access), so that the caller releases at once; or
 * LARDER_EIO without waiting when the mapping's context cannot be made
 * current; or LARDER_EINVAL (another process's mapping, which runs no
 * work of its own on it). */
int lcuda_fence_push(lcuda_map_t *m, void *stream, uint64_t seq);
/* Takes the oldest fence if its event has passed (an event the driver
 * reports failed, in a context that is gone, has passed too): returns 1
 * with *seq set, or 0 when there is none or it has not passed.  Never
 * blocks. */
int lcuda_fence_pop(lcuda_map_t *m, uint64_t *seq);
/* Fences not taken yet. */
int lcuda_fence_count(const lcuda_map_t *m);
/* The oldest fence's event (NULL when none), for lcuda_fence_wait. */
void *lcuda_fence_oldest(const lcuda_map_t *m);
/* Blocks the calling thread until event ev (lcuda_fence_oldest's) has
 * passed, or has been recorded again and passed.  Without the caller's
 * lock on m: it touches no fence, and the mapping must only stay open
 * (the caller holds a reference to its stream). */
void lcuda_fence_wait(const lcuda_map_t *m, void *ev);
/* Closes the mapping (in the process that opened it; a forked child only
 * frees the struct: CUDA does not survive fork) and releases the primary
 * context it retained.  NULL is ignored. */
void lcuda_map_close(lcuda_map_t *m);

#endif /* LARDER_LCUDA_H */
