/*
 * cuda.h: larderd's side of CUDA streams (prefix cuda_), the batches that
 * land in a trainer's GPU memory with no copy in the trainer.
 *
 * Design
 * ------
 * A CUDA stream is assembled exactly as a host stream, into its host arena
 * (same offsets, same bytes).  Beside the arena the stream owns one device
 * region of the arena's size on the trainer's device (cuda_region_open),
 * allocated in that device's primary context, exported once with the
 * driver's legacy IPC handle (64 bytes, sent in OpenStreamReply).  The
 * arena is registered pinned (cuMemHostRegister) where the driver allows
 * it (RLIMIT_MEMLOCK: systemd's LimitMEMLOCK=infinity), else copies go
 * from pageable memory, slower but correct.  After a worker assembles a
 * batch, it starts copying the batch's byte ranges to the same offsets of
 * the region (cuda_region_copy: cuMemcpyHtoDAsync on a CUDA stream of the
 * worker's own, per device, then cuStreamAddCallback) and goes on to its
 * next task: the copy overlaps the assembly of the next batches.  The
 * driver's callback, on a thread of the driver's, queues the completion
 * for the loop (an async handle, cuda_loop_start), which calls the
 * stream's done callback; the batch is published only then.  A copy that
 * fails reaches the callback too (cuStreamAddCallback, unlike
 * cuLaunchHostFunc, runs on errors), and fails its stream.  Where a
 * worker must wait (a callback the driver refused), it waits asleep: the
 * daemon's primary contexts are set to CU_CTX_SCHED_BLOCKING_SYNC, since
 * a spinning wait would take a core from the trainers.  The copies count
 * in the stats cuda_copies, cuda_copy_bytes and cuda_copy_ns (from the
 * start of a batch's copies until the driver reports them done).  So
 * the trainer never sees a half-copied batch, never blocks its CPU on a
 * copy, and needs no event: the trainer's larder_stream_next returns a
 * batch that is complete on the device.  The trainer opens the handle
 * once (cuIpcOpenMemHandle, or maps the descriptor, below) and turns arena
 * offsets into device pointers.  The other way round, a release reaches
 * the daemon only once the trainer's GPU has run the work queued before
 * it (liblarder's fences, client/lcuda.h), so a copy never overwrites
 * memory a kernel of the trainer's still reads.
 *
 * Two exports.  By default, legacy IPC: cuIpcGetMemHandle /
 * cuIpcOpenMemHandle work between any two processes of one host (one PID
 * namespace or not) that see the same GPUs, of any two users, with a
 * plain 64-byte handle in a protocol message: no descriptor to pass.
 * Tested with the real driver (580, H200): a trainer running as nobody
 * maps a root daemon's region (cuda_other_user), which no ptrace rule
 * would allow, and so does one in a PID and mount namespace of its own,
 * with its own /proc, as in a container (cuda_pid_namespace).  With
 * cuda_fd_handles = true, and a client that says it can map one
 * (cuda_fd_ok), the region is a VMM allocation instead (cuMemCreate with
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, mapped with cuMemAddressReserve
 * / cuMemMap / cuMemSetAccess), whose descriptor
 * (cuMemExportToShareableHandle) travels with SCM_RIGHTS beside the
 * arena's; the trainer imports and maps it (cuMemImportFromShareableHandle).
 * What that buys: the descriptor is a capability, which only the process
 * it was sent to holds, where a legacy handle is a 64-byte token that opens
 * the memory for any process, of any user, that presents it
 * (cuda_other_user); and the trainer's mapping keeps the memory
 * alive by itself, so the daemon frees its side when the stream ends
 * instead of parking it for a trainer that still maps it.  What it needs:
 * a device with VMM and POSIX descriptor handles (asked once per device,
 * cuDeviceGetAttribute; one without them gets legacy regions, with a
 * warning), sizes in the allocation granularity, and more calls on both
 * sides.  A device that has them but fails to make one fails the open:
 * the operator asked for descriptors, not for a legacy token.  The
 * descriptor is close-on-exec in the daemon, which starts children
 * (credential_process).  The trainer maps the region for its own device
 * only, where a legacy handle also enabled peer access from its other
 * GPUs.  Legacy stays the default: it is the one measured on a GPU.
 *
 * Lifetime: one primary context per device, retained on first use for
 * the daemon's life (worker threads keep a CUDA stream per device in it);
 * one region per stream, freed (with the pinning undone) when the stream
 * is destroyed, after its last assembly task, once its trainer maps it no
 * more: it closed the stream having unmapped it, or its process exited;
 * until then the region is parked (below).  The gauge cuda_device_bytes
 * and the per-device figures (cuda_device_bytes_of) follow the regions.
 *
 * Threads: cuda_check, the parks and cuda_loop_* on the loop;
 * cuda_region_open, cuda_region_detach_host and cuda_region_close on a
 * worker (the driver's first context retain, the allocation, pinning and
 * unpinning the arena and freeing device memory take from milliseconds to
 * a second, which the loop must not spend; parks free theirs through
 * cuda_set_closer), concurrently for several regions; cuda_region_copy on
 * workers, concurrently for one region (disjoint ranges); the done
 * callbacks on the loop.
 */
#ifndef LARDER_DAEMON_CUDA_H
#define LARDER_DAEMON_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "stats.h"

#define CUDA_IPC_HANDLE_BYTES 64

typedef struct cuda_region cuda_region_t;

/* Whether the driver loads and device exists: 0, LARDER_EUNSUPPORTED (err
 * says what is missing) or LARDER_EINVAL (err names the device). */
int cuda_check(int device, char *err, size_t errlen);
/* This process's ordinal of the device with that 16-byte UUID, or -1. */
int cuda_device_by_uuid(const uint8_t *uuid);

/* How a region is exported to its trainer. */
typedef struct cuda_export {
  int fd_wanted;                         /* in: export a descriptor (the client can map
                                             one, and cuda_fd_handles is set) */
  uint8_t handle[CUDA_IPC_HANDLE_BYTES]; /* out, when fd < 0: the legacy IPC handle */
  int fd;                                /* out: the VMM allocation's POSIX descriptor
                                             (the caller's to close once sent), or -1 */
  uint64_t region_bytes;                 /* out: the bytes allocated */
} cuda_export_t;

/* Allocates the region of size bytes on device, mirroring host (the
 * arena's mapping, size bytes), pins host where it can, and exports it in
 * ex: as a VMM allocation with a POSIX file descriptor when ex->fd_wanted
 * and the device allows it (else, with a warning once, as below), or with
 * a legacy IPC handle.  The region takes size rounded up to 2 MiB (and to
 * the allocation granularity), which it adds to stats->cuda_device_bytes.
 * Returns 0, LARDER_EUNSUPPORTED, LARDER_EINVAL (device), LARDER_ENOMEM
 * (device memory exhausted, naming the device) or LARDER_EIO, with err
 * set.  A worker (any thread but the loop's, which it would stall). */
int cuda_region_open(int device, uint8_t *host, uint64_t size, stats_global_t *stats,
                     cuda_region_t **out, cuda_export_t *ex, char *err, size_t errlen);

/* Called on the loop thread once the copies of one cuda_region_copy call
 * completed (status 0) or failed (LARDER_EIO, err says why). */
typedef void (*cuda_copy_cb)(void *arg, int status, const char *err);

/* Starts copying host bytes [offs[i], offs[i] + lens[i]), i < n, to the
 * same offsets of the region, on the calling worker's CUDA stream, and
 * returns without waiting for them.  Returns 0, and then done(arg, ...)
 * runs exactly once on the loop (cuda_loop_start's) after the copies end;
 * or LARDER_EIO / LARDER_ENOMEM with err set, and then done is never
 * called and no copy is left running.  Workers. */
int cuda_region_copy(cuda_region_t *r, const uint64_t *offs, const uint64_t *lens, int n,
                     cuda_copy_cb done, void *arg, char *err, size_t errlen);

/* The loop that runs the done callbacks: cuda_loop_start makes its async
 * handle (0 or a libuv error); cuda_loop_stop closes it, once
 * cuda_copies_pending() is 0 (a copy started later would find no loop).
 * Loop thread. */
int cuda_loop_start(uv_loop_t *loop);
void cuda_loop_stop(void);
/* Copies started whose done callback has not run yet.  Any thread. */
int cuda_copies_pending(void);

/* Whether the arena is pinned (copies are asynchronous DMA). */
int cuda_region_pinned(const cuda_region_t *r);
int cuda_region_device(const cuda_region_t *r);

/* Unpins the arena, which is about to be unmapped, and drops the
 * region's reference to it: the region is then device memory only, and
 * copies fail.  Any thread (one at a time per region). */
void cuda_region_detach_host(cuda_region_t *r);

/* Frees the region and unpins the arena (before the arena is unmapped).
 * NULL is ignored.  Any thread; a worker for a region never parked. */
void cuda_region_close(cuda_region_t *r);

/*
 * Regions kept for a live trainer.  The driver's rule for legacy IPC: an
 * exporter must not free memory a process still has open
 * (cuIpcOpenMemHandle) before that process closes it.  liblarder closes
 * its mapping before it sends CloseStream, or says in it that it still
 * maps the region (it holds batches: device_memory_held), and a dead
 * trainer has none; a stream the daemon ends itself (an error, its
 * shutdown, a connection it ends for a protocol error) may still be mapped
 * too.  The region of either is parked under its connection (owner), its
 * stream id and its trainer's process (pid) when the stream closes
 * (cuda_park), until the client's CloseStream for it without
 * device_memory_held (cuda_unpark), or, once the connection ended
 * (cuda_orphan), until that process has exited (cuda_reap, from the tick,
 * watching a pidfd taken at its first CUDA stream's open, cuda_watch_pid):
 * a trainer the daemon disconnected may map the region
 * as long as it lives.  At shutdown the daemon exits with them.  Parks
 * count in the stats until freed.  The stream's last tasks may still copy
 * into the region after it closed: the stream settles the park when it is
 * freed (cuda_park_settle), which frees the region then if it was
 * unparked in between.  The caller counts a connection's parks, and its
 * process's orphans (cuda_orphans_of), with its streams against
 * max_streams_per_client, so that no trainer can make the list grow
 * without end, and their device bytes (cuda_parked_bytes,
 * cuda_parked_bytes_of_uid) with its arenas against
 * max_arena_bytes_per_client and max_arena_bytes_per_uid, so that no
 * trainer holds more of a GPU's memory than those allow.  A region exported as a descriptor is not parked: the
 * trainer's own mapping keeps its memory (which then counts in the
 * trainer's process, not in the daemon's stats).  Loop thread.
 */
typedef struct cuda_park cuda_park_t;
/* Parks r for (owner, stream_id) and process pid from now on; the stream
 * keeps using it until it calls cuda_park_settle.  Returns the park, or
 * NULL (a descriptor's region, or no memory for the list): the stream then
 * frees r itself. */
cuda_park_t *cuda_park(uint64_t owner, int pid, uint32_t uid, int pidfd, uint32_t stream_id,
                       cuda_region_t *r);
/* A descriptor that becomes readable when process pid exits (pidfd_open),
 * or -1 (before Linux 5.3, or the process is gone): the caller's.  Taken
 * while the process is connected, so that its pid, reused later, cannot
 * be mistaken for it.  A park without one asks kill(pid, 0). */
int cuda_watch_pid(int pid);
/* The stream is done with the parked region, whose arena goes next: frees
 * it now if it was unparked meanwhile, else leaves it parked (device
 * memory only, cuda_region_detach_host, which the caller may have done
 * already, on a worker). */
void cuda_park_settle(cuda_park_t *p);
/* How a park's region is freed: fn(arg, r) frees r (cuda_region_close) on
 * a worker, so that the loop never waits for the driver; unset, the loop
 * frees it.  Loop thread. */
typedef void (*cuda_closer_fn)(void *arg, cuda_region_t *r);
void cuda_set_closer(cuda_closer_fn fn, void *arg);
/* Unparks (owner, stream_id): returns the parks it ended (0 or 1). */
int cuda_unpark(uint64_t owner, uint32_t stream_id);
/* Connection owner ended: its parks stay until their process exits. */
void cuda_orphan(uint64_t owner);
/* Ends the parks of connections that ended whose process has exited. */
void cuda_reap(void);
/* Parks of process pid whose connection ended. */
int cuda_orphans_of(int pid);
/* The device bytes of connection owner's parks and of process pid's
 * orphans: what a connection's trainer holds parked. */
uint64_t cuda_parked_bytes(uint64_t owner, int pid);
/* The device bytes of every park of user uid, its connections' and its
 * orphans. */
uint64_t cuda_parked_bytes_of_uid(uint32_t uid);

/* The device bytes regions hold on device (0 for devices never used), and
 * the number of device ordinals that regions were ever opened on, plus
 * one for the highest (so 0 .. cuda_devices_seen() - 1 covers them). */
uint64_t cuda_device_bytes_of(int device);
int cuda_devices_seen(void);

#endif /* LARDER_DAEMON_CUDA_H */
