/*
 * util.c: hashing, clocks, heap settings and formatting.
 */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "larder.h"
#include "util.h"

#define SCHED_RESET_ON_FORK_FLAG_ 0x01ull /* SCHED_FLAG_RESET_ON_FORK */

/* The kernel's struct sched_attr (glibc 2.36 has no wrapper): its first
 * size bytes are what sched_getattr and sched_setattr exchange. */
typedef struct sched_attr_ {
  uint32_t size, sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime, sched_deadline, sched_period;
} sched_attr_t_;

uint64_t util_hash64(const void *data, size_t len, uint64_t seed) {
  const uint8_t *p = data;
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

uint64_t util_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void util_heap_setup(void) {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  mallopt(M_TOP_PAD, 64 << 20);
  /* glibc gives each thread that allocates under contention an arena of
   * its own (up to 8 per core), and each keeps its freed memory: with the
   * settings above, the same units freed in one arena and allocated in
   * another made the heap creep up by a few hundred KiB a round with 8
   * workers.  Four arenas serve the workers' allocations, megabytes each
   * and a few per millisecond, without contention to speak of. */
  mallopt(M_ARENA_MAX, 4);
}

int util_thread_slice(uint64_t slice_ns) {
  sched_attr_t_ a;
  memset(&a, 0, sizeof(a));
  /* Read first, so that the policy and the niceness (systemd's Nice=, the
   * operator's renice) stay as they are. */
  if (syscall(SYS_sched_getattr, 0, &a, (unsigned)sizeof(a), 0u) != 0)
    return errno == ENOSYS ? LARDER_EUNSUPPORTED : LARDER_EIO;
  /* Custom slices are the fair class's; a real-time or deadline thread
   * (chrt) keeps what it has, and for SCHED_DEADLINE sched_runtime is its
   * reservation. */
  if (a.sched_policy != SCHED_OTHER && a.sched_policy != SCHED_BATCH &&
      a.sched_policy != SCHED_IDLE)
    return LARDER_EUNSUPPORTED;
  a.size = sizeof(a);
  /* Keep reset-on-fork (systemd's CPUSchedulingResetOnFork=), the one
   * flag that is the thread's setting rather than the call's. */
  a.sched_flags &= SCHED_RESET_ON_FORK_FLAG_;
  a.sched_runtime = slice_ns;
  if (syscall(SYS_sched_setattr, 0, &a, 0u) != 0)
    return errno == ENOSYS || errno == EINVAL ? LARDER_EUNSUPPORTED : LARDER_EIO;
  /* A kernel without custom slices takes the call and drops the runtime
   * of a fair-class thread: it reads back as 0. */
  sched_attr_t_ b;
  memset(&b, 0, sizeof(b));
  if (syscall(SYS_sched_getattr, 0, &b, (unsigned)sizeof(b), 0u) != 0) return LARDER_EIO;
  return b.sched_runtime != 0 ? 0 : LARDER_EUNSUPPORTED;
}

void util_human_bytes(char *buf, size_t size, double v) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    u++;
  }
  snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

const char *util_sandbox_hint(int err, const char *path, int is_dir, char *buf, size_t size) {
  buf[0] = '\0';
  const char *inv = getenv("INVOCATION_ID");
  if (inv == NULL || *inv == '\0' || (err != EROFS && err != EACCES && err != EPERM)) return buf;
  char dir[1024];
  snprintf(dir, sizeof(dir), "%s", path);
  if (!is_dir) {
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = '\0';
  }
  snprintf(buf, size,
           " (larderd.service's hardening, ProtectSystem=strict, lets larderd write only the "
           "paths it names: allow %s with a drop-in, `systemctl edit larderd`, holding "
           "[Service] ReadWritePaths=%s, then restart larderd)",
           dir, dir);
  return buf;
}

static int private_tmp = -1;
static pthread_once_t private_tmp_once = PTHREAD_ONCE_INIT;

static void private_tmp_init(void) {
  private_tmp = 0;
  FILE *f = fopen("/proc/self/mountinfo", "r");
  if (f == NULL) return;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    /* id parent major:minor root mountpoint ... */
    char root[512], mnt[512];
    if (sscanf(line, "%*s %*s %*s %511s %511s", root, mnt) == 2 && strcmp(mnt, "/tmp") == 0 &&
        strstr(root, "systemd-private-") != NULL)
      private_tmp = 1;
  }
  free(line);
  fclose(f);
}

int util_private_tmp(void) {
  pthread_once(&private_tmp_once, private_tmp_init);
  return private_tmp;
}
