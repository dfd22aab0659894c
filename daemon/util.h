/*
 * util.h: small helpers shared by larderd's modules (prefix util_).
 * Any thread, unless a function says otherwise.
 */
#ifndef LARDER_UTIL_H
#define LARDER_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

/* A 64-bit hash of len bytes, chained through seed (FNV-1a with a
 * SplitMix64 finalizer: stable across runs and machines, which cache keys
 * and priorities rely on). */
uint64_t util_hash64(const void *data, size_t len, uint64_t seed);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t util_now_ns(void);

/* Sets glibc's heap for larderd's allocations: units and cache values are
 * megabytes each and come and go constantly; glibc would map and unmap
 * each one, paying page faults on every reuse, so freed memory stays in the
 * heap instead (bounded by the peak, which memory_limit bounds), in at
 * most four arenas.  Call once, before the threads start. */
void util_heap_setup(void);

/* Asks the kernel's fair scheduler (EEVDF, Linux 6.12 and later) for a time
 * slice of slice_ns for the calling thread, keeping its policy and
 * niceness; threads it creates afterwards inherit the slice.  A thread
 * with a shorter slice than the one running preempts it when it wakes.
 * Returns 0 when the kernel took the slice, LARDER_EUNSUPPORTED when it
 * ignores custom slices (older kernels) or the thread is not in the fair
 * class (a real-time or deadline policy), or a negative code when the call
 * failed.  The thread concerned. */
int util_thread_slice(uint64_t slice_ns);

/* Formats bytes as "12.3 MiB" into buf. */
void util_human_bytes(char *buf, size_t size, double bytes);

/*
 * What an operator must change when larderd cannot write path (a file, or
 * a directory when is_dir) because of err: under systemd (INVOCATION_ID is
 * set) a read-only filesystem (EROFS) or a refusal (EACCES, EPERM) is
 * usually larderd.service's ProtectSystem=strict, which a drop-in lifts
 * with ReadWritePaths= for that directory.  Writes the hint, starting with
 * a space, into buf ("" when there is none) and returns buf.
 */
const char *util_sandbox_hint(int err, const char *path, int is_dir, char *buf, size_t size);

/* Whether the daemon's /tmp is a private one (systemd's PrivateTmp=yes):
 * a mount at /tmp of a systemd-private-* directory.  Trainers' files under
 * /tmp are then not the daemon's.  Reads /proc/self/mountinfo once. */
int util_private_tmp(void);

/*
 * A duplicate of fd that exec does not inherit, or -1 with errno set.  Any
 * thread.  ThreadSanitizer does not see the descriptor that
 * fcntl(F_DUPFD_CLOEXEC) returns: it keeps the history of the last
 * descriptor with that number (a client's socket the loop polled) and
 * reports a worker's close of the duplicate as a race with it, halting the
 * daemon.  Its builds dup, then set FD_CLOEXEC; the window between the two,
 * where a fork could inherit the descriptor, exists in those builds only.
 */
static inline int util_dup_cloexec(int fd) {
#if defined(__SANITIZE_THREAD__)
  int d = dup(fd);
  if (d >= 0 && fcntl(d, F_SETFD, FD_CLOEXEC) != 0) {
    int e = errno;
    close(d);
    errno = e;
    return -1;
  }
  return d;
#else
  return fcntl(fd, F_DUPFD_CLOEXEC, 0);
#endif
}

#endif /* LARDER_UTIL_H */
