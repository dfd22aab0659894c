/*
 * larder.h: the public interface of liblarder.
 *
 * Conventions
 * -----------
 * - Names: every public symbol starts with larder_; opaque handles are
 *   larder_<noun>_t and functions are larder_<noun>_<verb>().
 * - Errors: functions that can fail return 0 (or a non-negative count) on
 *   success and a negative larder_errno_t code on failure.  larder_strerror()
 *   turns a code into a static English string; larder_err_name() gives its
 *   symbolic name.  Where a richer message exists it is available through the
 *   handle that failed, never through global state.
 * - Ownership: memory that liblarder returns through a pointer belongs to
 *   liblarder unless the function's comment says the caller must free it.
 * - Threading: each function's comment says which threads may call it.
 * - ABI: only plain C types cross this interface, so that Python's ctypes
 *   and other FFIs can call it directly.
 */
#ifndef LARDER_H
#define LARDER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Error codes.  The list is an X-macro so that the code, its name and its
 * message are defined once and shared by the daemon, the library and the CLI.
 */
#define LARDER_ERRNO_MAP(XX)                                                  \
  XX(EINVAL, -1, "invalid argument")                                          \
  XX(ENOMEM, -2, "out of memory")                                             \
  XX(EIO, -3, "input/output error")                                           \
  XX(ECORRUPT, -4, "corrupt or malformed data")                               \
  XX(EUNSUPPORTED, -5, "unsupported feature")                                 \
  XX(ELIMIT, -6, "configured limit exceeded")                                 \
  XX(ECHECKSUM, -7, "checksum mismatch")                                      \
  XX(ENOENT, -8, "no such file or object")                                    \
  XX(EPROTO, -9, "protocol error")                                            \
  XX(ETIMEDOUT, -10, "timed out")                                             \
  XX(ECLOSED, -11, "connection closed")                                       \
  XX(EACCES, -12, "not allowed")                                              \
  XX(EREMOTE, -13, "remote source failed")                                    \
  XX(ESHUTDOWN, -14, "daemon is shutting down")                               \
  XX(EAGAIN, -15, "resource temporarily unavailable")                         \
  XX(EVERSION, -16, "protocol version mismatch")                              \
  XX(EEOF, -17, "end of stream")                                              \
  XX(ENOSPC, -18, "no space left on device")                                  \
  XX(EBUSY, -19, "resource busy")                                             \
  XX(ECONNECT, -20, "cannot connect to the daemon")

typedef enum larder_errno {
#define LARDER_ERRNO_ENUM_(name, code, msg) LARDER_##name = (code),
  LARDER_ERRNO_MAP(LARDER_ERRNO_ENUM_)
#undef LARDER_ERRNO_ENUM_
  LARDER_ERRNO_MIN_ = -21
} larder_errno_t;

/* Returns a static, never-NULL description of err.  Any thread. */
const char *larder_strerror(int err);

/* Returns the static symbolic name of err, such as "LARDER_EIO".  Any thread. */
const char *larder_err_name(int err);

/*
 * Column types of the serving layout.  Batches are laid out like Apache
 * Arrow's columnar format, and each type maps one to one onto an Arrow type;
 * the comment gives that type's Arrow C Data Interface format string.
 *
 * Buffers of an array of `length` slots:
 * - validity: a bitmap of ceil(length / 8) bytes, least significant bit
 *   first, bit set = value present.  Absent (NULL) when null_count is 0.
 * - fixed-width types: `values` holds length elements; a null slot holds
 *   zero bytes.  BOOL values are a bitmap like validity.
 * - BINARY/STRING: int32 `offsets` of length + 1 entries and `values` bytes;
 *   LARGE_BINARY/LARGE_STRING use int64 offsets.  A null slot is empty.
 * - FIXED_BINARY and DECIMAL*: length * byte_width bytes.  DECIMAL128 and
 *   DECIMAL256 are little-endian two's complement integers, scaled by
 *   10^-scale.
 * - LIST/LARGE_LIST: int32 / int64 `offsets` into the single child.
 * - STRUCT: one child per field, each of the struct's length.
 * - MAP: int32 offsets into one STRUCT child with fields "key" and "value".
 */
typedef enum larder_type {
  LARDER_TYPE_NULL = 0,     /* "n" */
  LARDER_TYPE_BOOL,         /* "b" */
  LARDER_TYPE_INT8,         /* "c" */
  LARDER_TYPE_INT16,        /* "s" */
  LARDER_TYPE_INT32,        /* "i" */
  LARDER_TYPE_INT64,        /* "l" */
  LARDER_TYPE_UINT8,        /* "C" */
  LARDER_TYPE_UINT16,       /* "S" */
  LARDER_TYPE_UINT32,       /* "I" */
  LARDER_TYPE_UINT64,       /* "L" */
  LARDER_TYPE_FLOAT16,      /* "e" */
  LARDER_TYPE_FLOAT32,      /* "f" */
  LARDER_TYPE_FLOAT64,      /* "g" */
  LARDER_TYPE_DATE32,       /* "tdD": days since 1970-01-01 */
  LARDER_TYPE_TIME32,       /* "tts"/"ttm": int32, unit seconds or millis */
  LARDER_TYPE_TIME64,       /* "ttu"/"ttn": int64, unit micros or nanos */
  LARDER_TYPE_TIMESTAMP,    /* "ts?:" or "ts?:UTC": int64 since the epoch */
  LARDER_TYPE_DECIMAL128,   /* "d:P,S" */
  LARDER_TYPE_DECIMAL256,   /* "d:P,S,256" */
  LARDER_TYPE_BINARY,       /* "z" */
  LARDER_TYPE_STRING,       /* "u" */
  LARDER_TYPE_LARGE_BINARY, /* "Z" */
  LARDER_TYPE_LARGE_STRING, /* "U" */
  LARDER_TYPE_FIXED_BINARY, /* "w:N" */
  LARDER_TYPE_LIST,         /* "+l" */
  LARDER_TYPE_LARGE_LIST,   /* "+L" */
  LARDER_TYPE_STRUCT,       /* "+s" */
  LARDER_TYPE_MAP,          /* "+m" */
  LARDER_TYPE_COUNT_
} larder_type_t;

typedef enum larder_time_unit {
  LARDER_UNIT_SECOND = 0,
  LARDER_UNIT_MILLI = 1,
  LARDER_UNIT_MICRO = 2,
  LARDER_UNIT_NANO = 3
} larder_time_unit_t;

/* Returns the static lower-case name of a type ("int64", "list"), or "?". */
const char *larder_type_name(larder_type_t type);

#ifdef __cplusplus
}
#endif
#endif /* LARDER_H */
