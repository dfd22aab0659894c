/*
 * pq_util.c: the Parquet module's small shared pieces: error formatting,
 * growable buffers, the metadata arena, byte sources and display names.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parquet/pq_internal.h"

int pq_error_set(pq_error *err, int code, const char *fmt, ...) {
  if (err != NULL) {
    err->code = code;
    err->whole_page = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
  }
  return code;
}

void pq_options_init(pq_options *opts) {
  memset(opts, 0, sizeof(*opts));
  opts->max_chunk_decoded_bytes = (uint64_t)2 << 30;
  opts->max_footer_bytes = 64u << 20;
  opts->verify_crc = 1;
}

/* ------------------------------------------------------------------------ */

int pq_buf_reserve(pq_buf_t *b, size_t cap) {
  if (cap <= b->cap && b->data != NULL) return 0;
  size_t want = b->cap ? b->cap : 256;
  while (want < cap) {
    if (want > SIZE_MAX / 2) return LARDER_ENOMEM;
    want *= 2;
  }
  uint8_t *p = realloc(b->data, want + PQ_BUF_SLACK);
  if (p == NULL) return LARDER_ENOMEM;
  b->data = p;
  b->cap = want;
  return 0;
}

void pq_buf_free(pq_buf_t *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

/* ------------------------------------------------------------------------ */

struct pq_arena_block {
  struct pq_arena_block *next;
  size_t used, size;
  _Alignas(16) unsigned char data[];
};

void *pq_arena_alloc(pq_arena_t *arena, size_t size) {
  size = (size + 15) & ~(size_t)15;
  if (size == 0) size = 16;
  if (arena->used + size > arena->limit || arena->used + size < size) return NULL;
  struct pq_arena_block *b = arena->head;
  if (b == NULL || b->size - b->used < size) {
    size_t block = arena->block_bytes ? arena->block_bytes : 65536;
    size_t bsize = size > block ? size : block;
    b = malloc(sizeof(*b) + bsize);
    if (b == NULL) return NULL;
    arena->reserved += sizeof(*b) + bsize;
    b->next = arena->head;
    b->used = 0;
    b->size = bsize;
    arena->head = b;
  }
  void *p = b->data + b->used;
  b->used += size;
  arena->used += size;
  memset(p, 0, size);
  return p;
}

char *pq_arena_strndup(pq_arena_t *arena, const char *s, size_t len) {
  char *p = pq_arena_alloc(arena, len + 1);
  if (p == NULL) return NULL;
  if (len) memcpy(p, s, len);
  p[len] = '\0';
  return p;
}

void pq_arena_free(pq_arena_t *arena) {
  struct pq_arena_block *b = arena->head;
  while (b != NULL) {
    struct pq_arena_block *next = b->next;
    free(b);
    b = next;
  }
  arena->head = NULL;
  arena->used = 0;
  arena->reserved = 0;
}

/* ------------------------------------------------------------------------ */

static int file_read(const pq_source *src, uint64_t off, size_t len, void *buf) {
  int fd = (int)src->fd;
  uint8_t *p = buf;
  if (off > src->size || len > src->size - off) return LARDER_ECORRUPT;
  while (len > 0) {
    ssize_t n = pread(fd, p, len, (off_t)off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return LARDER_EIO;
    }
    if (n == 0) return LARDER_ECORRUPT; /* the file shrank under us */
    p += n;
    off += (uint64_t)n;
    len -= (size_t)n;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* SIGBUS guards                                                             */

static __thread pq_guard_t *guard_top;
static struct sigaction previous_bus;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;

static void on_sigbus(int sig, siginfo_t *info, void *uctx) {
  pq_guard_t *g = guard_top;
  if (g != NULL) {
    guard_top = g->prev;
    siglongjmp(g->env, 1);
  }
  /* Not ours: hand it on, as if we had never been installed. */
  if (previous_bus.sa_flags & SA_SIGINFO) {
    previous_bus.sa_sigaction(sig, info, uctx);
  } else if (previous_bus.sa_handler != SIG_IGN && previous_bus.sa_handler != SIG_DFL) {
    previous_bus.sa_handler(sig);
  } else {
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
  }
}

static void install_guard(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &previous_bus);
}

void pq_guard_push(pq_guard_t *g) {
  pthread_once(&guard_once, install_guard);
  g->prev = guard_top;
  guard_top = g;
}

void pq_guard_pop(pq_guard_t *g) {
  if (guard_top == g) guard_top = g->prev;
}

/* ------------------------------------------------------------------------ */

static const uint8_t *file_map(const pq_source *src, uint64_t off, size_t len) {
  if (src->ctx == NULL || off > src->size || len > src->size - off) return NULL;
  return (const uint8_t *)src->ctx + off;
}

static void file_will_read(const pq_source *src, uint64_t off, uint64_t len) {
  if (src->ctx == NULL || off >= src->size) return;
  if (len > src->size - off) len = src->size - off;
  long page = sysconf(_SC_PAGESIZE);
  uint64_t start = off & ~(uint64_t)(page - 1);
  uint8_t *base = (uint8_t *)src->ctx + start;
  size_t n = (size_t)(off + len - start);
#ifdef MADV_POPULATE_READ
  /* Older kernels (before 5.14) reject it; read-ahead is the fallback. */
  if (madvise(base, n, MADV_POPULATE_READ) == 0) return;
#endif
  madvise(base, n, MADV_WILLNEED);
}

/* Takes fd (open for reading) as src's: checks that it is a regular file,
 * makes its reads blocking and maps it.  Closes fd on failure. */
static int source_take_fd(pq_source *src, int fd, const char *name, pq_error *err) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return pq_error_set(err, LARDER_EIO, "%s: not a regular file", name);
  }
  (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  src->read = file_read;
  src->fd = fd;
  src->size = (uint64_t)st.st_size;
  if (st.st_size > 0) {
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base != MAP_FAILED) {
      src->ctx = base;
      src->map = file_map;
      src->will_read = file_will_read;
      src->may_fault = 1;
    }
  }
  return 0;
}

static int open_errno_code(int e) {
  return e == ENOENT                  ? LARDER_ENOENT
         : e == EACCES                ? LARDER_EACCES
         : e == EMFILE || e == ENFILE ? LARDER_ELIMIT
                                      : LARDER_EIO;
}

int pq_source_open_file(pq_source *src, const char *path, pq_error *err) {
  memset(src, 0, sizeof(*src));
  src->fd = -1;
  snprintf(src->name, sizeof(src->name), "%s", path);
  /* Non-blocking, so that a FIFO put where a Parquet file was fails here
   * instead of blocking a worker until a writer comes. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    return pq_error_set(err, open_errno_code(e), "%s: %s", path, strerror(e));
  }
  return source_take_fd(src, fd, path, err);
}

int pq_source_open_fd(pq_source *src, int fd, const char *name, pq_error *err) {
  memset(src, 0, sizeof(*src));
  src->fd = -1;
  snprintf(src->name, sizeof(src->name), "%s", name);
#if defined(__SANITIZE_THREAD__)
  /* As util_dup_cloexec (daemon/util.h): ThreadSanitizer does not see the
   * descriptor fcntl(F_DUPFD_CLOEXEC) returns. */
  int own = dup(fd);
  if (own >= 0 && fcntl(own, F_SETFD, FD_CLOEXEC) != 0) {
    close(own);
    own = -1;
  }
#else
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
#endif
  if (own < 0) {
    int e = errno;
    return pq_error_set(err, open_errno_code(e), "%s: %s", name, strerror(e));
  }
  return source_take_fd(src, own, name, err);
}

void pq_source_close_file(pq_source *src) {
  if (src->read == file_read) {
    if (src->ctx) munmap(src->ctx, (size_t)src->size);
    if (src->fd >= 0) close((int)src->fd);
  }
  src->ctx = NULL;
  src->map = NULL;
  src->will_read = NULL;
  src->fd = -1;
  src->read = NULL;
}

static int mem_read(const pq_source *src, uint64_t off, size_t len, void *buf) {
  if (off > src->size || len > src->size - off) return LARDER_ECORRUPT;
  if (len) memcpy(buf, (const uint8_t *)src->ctx + off, len);
  return 0;
}

static const uint8_t *mem_map(const pq_source *src, uint64_t off, size_t len) {
  if (off > src->size || len > src->size - off) return NULL;
  return (const uint8_t *)src->ctx + off;
}

void pq_source_init_memory(pq_source *src, const void *data, size_t len, const char *name) {
  memset(src, 0, sizeof(*src));
  src->fd = -1;
  src->read = mem_read;
  src->map = mem_map;
  src->ctx = (void *)data; /* read-only by contract: only mem_read/map use it */
  src->size = len;
  snprintf(src->name, sizeof(src->name), "%s", name ? name : "(memory)");
}

/* ------------------------------------------------------------------------ */

const char *pq_physical_name(int physical) {
  static const char *const names[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                      "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
  if (physical >= 0 && physical < 8) return names[physical];
  return physical == PQ_PHYSICAL_NONE ? "GROUP" : "UNKNOWN";
}

const char *pq_codec_name(int codec) {
  static const char *const names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                                      "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
  if (codec >= 0 && codec < 8) return names[codec];
  return "UNKNOWN";
}

const char *pq_encoding_name(int encoding) {
  static const char *const names[] = {"PLAIN",
                                      "GROUP_VAR_INT",
                                      "PLAIN_DICTIONARY",
                                      "RLE",
                                      "BIT_PACKED",
                                      "DELTA_BINARY_PACKED",
                                      "DELTA_LENGTH_BYTE_ARRAY",
                                      "DELTA_BYTE_ARRAY",
                                      "RLE_DICTIONARY",
                                      "BYTE_STREAM_SPLIT",
                                      "ALP"};
  if (encoding >= 0 && encoding < 11) return names[encoding];
  return "UNKNOWN";
}

const char *pq_repetition_name(int repetition) {
  static const char *const names[] = {"REQUIRED", "OPTIONAL", "REPEATED"};
  if (repetition >= 0 && repetition < 3) return names[repetition];
  return "UNKNOWN";
}

static const char *unit_name(larder_time_unit_t unit) {
  switch (unit) {
    case LARDER_UNIT_SECOND: return "SECONDS";
    case LARDER_UNIT_MILLI: return "MILLIS";
    case LARDER_UNIT_MICRO: return "MICROS";
    case LARDER_UNIT_NANO: return "NANOS";
  }
  return "?";
}

void pq_logical_format(const pq_logical_t *lt, char *buf, size_t size) {
  switch (lt->kind) {
    case PQ_LT_NONE: snprintf(buf, size, "%s", ""); break;
    case PQ_LT_STRING: snprintf(buf, size, "STRING"); break;
    case PQ_LT_MAP: snprintf(buf, size, "MAP"); break;
    case PQ_LT_LIST: snprintf(buf, size, "LIST"); break;
    case PQ_LT_ENUM: snprintf(buf, size, "ENUM"); break;
    case PQ_LT_DECIMAL: snprintf(buf, size, "DECIMAL(%d,%d)", lt->precision, lt->scale); break;
    case PQ_LT_DATE: snprintf(buf, size, "DATE"); break;
    case PQ_LT_TIME:
      snprintf(buf, size, "TIME(%s,%s)", unit_name(lt->unit), lt->utc ? "true" : "false");
      break;
    case PQ_LT_TIMESTAMP:
      snprintf(buf, size, "TIMESTAMP(%s,%s)", unit_name(lt->unit), lt->utc ? "true" : "false");
      break;
    case PQ_LT_INTEGER:
      snprintf(buf, size, "INTEGER(%d,%s)", lt->bit_width, lt->is_signed ? "true" : "false");
      break;
    case PQ_LT_UNKNOWN: snprintf(buf, size, "UNKNOWN"); break;
    case PQ_LT_JSON: snprintf(buf, size, "JSON"); break;
    case PQ_LT_BSON: snprintf(buf, size, "BSON"); break;
    case PQ_LT_UUID: snprintf(buf, size, "UUID"); break;
    case PQ_LT_FLOAT16: snprintf(buf, size, "FLOAT16"); break;
    case PQ_LT_INTERVAL: snprintf(buf, size, "INTERVAL"); break;
    case PQ_LT_MAP_KEY_VALUE: snprintf(buf, size, "MAP_KEY_VALUE"); break;
  }
}
