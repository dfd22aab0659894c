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
#define LARDER_ERRNO_MAP(XX)                          \
  XX(EINVAL, -1, "invalid argument")                  \
  XX(ENOMEM, -2, "out of memory")                     \
  XX(EIO, -3, "input/output error")                   \
  XX(ECORRUPT, -4, "corrupt or malformed data")       \
  XX(EUNSUPPORTED, -5, "unsupported feature")         \
  XX(ELIMIT, -6, "configured limit exceeded")         \
  XX(ECHECKSUM, -7, "checksum mismatch")              \
  XX(ENOENT, -8, "no such file or object")            \
  XX(EPROTO, -9, "protocol error")                    \
  XX(ETIMEDOUT, -10, "timed out")                     \
  XX(ECLOSED, -11, "connection closed")               \
  XX(EACCES, -12, "not allowed")                      \
  XX(EREMOTE, -13, "remote source failed")            \
  XX(ESHUTDOWN, -14, "daemon is shutting down")       \
  XX(EAGAIN, -15, "resource temporarily unavailable") \
  XX(EVERSION, -16, "protocol version mismatch")      \
  XX(EEOF, -17, "end of stream")                      \
  XX(ENOSPC, -18, "no space left on device")          \
  XX(EBUSY, -19, "resource busy")                     \
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

/* ------------------------------------------------------------------------ */
/* Connecting                                                                */

/*
 * Threading: a larder_client_t and its streams belong to one thread at a
 * time for everything but larder_batch_release and the larder_batch_* and
 * larder_array_* accessors, which any thread may call, concurrently with
 * larder_stream_next.  Use one client per trainer process (or per data
 * loading thread).
 */
typedef struct larder_client larder_client_t;
typedef struct larder_stream larder_stream_t;
typedef struct larder_batch larder_batch_t;
typedef struct larder_array larder_array_t;

#define LARDER_DEFAULT_SOCKET "/run/larder/larderd.sock"

/*
 * Connects to the daemon at socket_path (NULL: $LARDER_SOCKET, else
 * LARDER_DEFAULT_SOCKET) and performs the handshake.  On success *out is a
 * new client the caller closes with larder_client_close.  Returns 0,
 * LARDER_ECONNECT (no daemon), LARDER_EINVAL (a path too long for a Unix
 * socket), the code of the daemon's refusal (LARDER_ELIMIT for
 * max_clients, LARDER_EACCES, LARDER_ESHUTDOWN), LARDER_ECLOSED (closed
 * with no reason given), LARDER_ETIMEDOUT (no answer to the handshake
 * within 10 s), LARDER_EVERSION, LARDER_EPROTO or LARDER_ENOMEM.  Why it failed, in words (the socket's
 * path, the system's error, the daemon's message), is then
 * larder_connect_error's.  Any thread.
 */
int larder_client_connect(const char *socket_path, larder_client_t **out);

/* Why the calling thread's last larder_client_connect failed ("" after one
 * that succeeded): "cannot connect to larderd at PATH: ERROR (hint)" or the
 * daemon's refusal.  Thread-local; valid until that thread's next connect. */
const char *larder_connect_error(void);

/* Closes the connection and every stream of the client; their batches must
 * have been released (or exported and released through Arrow).  Batches
 * of CUDA streams still held (or their DLPack tensors) are the exception:
 * the daemon must not free device memory this process maps, so the
 * connection stays open until the last of them is released, which then
 * tells the daemon and closes it.
 *
 * fork(): a client belongs to the process that connected it.  A forked
 * child must not use its parent's clients (they share the socket and the
 * shared memory with the parent): there larder_stream_open,
 * larder_stream_next and larder_stream_flush fail with LARDER_EINVAL.  The
 * child may release the batches it inherited (with larder_batch_release
 * or an exported Arrow array's release) and close the clients: both free
 * memory and descriptors in the child only, and tell the daemon nothing,
 * so the parent's batches and streams are untouched.  The child connects
 * its own client. */
void larder_client_close(larder_client_t *client);

/* The last error message of this client (a static empty string when none);
 * valid until the next call on the client.  The owning thread calls it. */
const char *larder_client_last_error(const larder_client_t *client);

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */

/* The most batches a stream may hold (its window): the daemon's limit. */
#define LARDER_MAX_WINDOW 1024
/* The window larder_stream_options_init sets (and a window of 0 means). */
#define LARDER_DEFAULT_WINDOW 32

typedef struct larder_stream_options {
  const char *const *sources; /* paths, globs, directories or URLs;
                                  relative paths are relative to the
                                  caller's working directory */
  size_t num_sources;
  const char *const *columns; /* dotted paths; NULL/0 = every column;
                                  a batch holds them in the file's order
                                  (larder_batch_column_by_name finds one) */
  size_t num_columns;
  uint32_t batch_size;     /* rows per batch on this rank (default 256; <= 2^20) */
  uint64_t seed;           /* default 0 */
  int shuffle;             /* default 1 */
  uint32_t shuffle_window; /* units shuffled together; 0 = daemon's.
                                  More than the daemon's memory_limit holds
                                  (or its shuffle_window_bytes, if larger)
                                  fails the open with LARDER_ELIMIT */
  uint32_t unit_rows;      /* rows per unit at most; 0 = daemon's;
                                  the daemon keeps it within 64..65536 */
  uint64_t epochs;         /* the epoch the stream ends before, counted
                                  from epoch 0, not from start_epoch: a
                                  stream resumed at start_epoch 3 with
                                  epochs 5 delivers epochs 3 and 4, so a
                                  checkpoint's position resumes a job with
                                  the same setting (default 1; 0 =
                                  unbounded) */
  int32_t rank;            /* -1 (default): $RANK, else 0 */
  int32_t world_size;      /* -1 (default): $WORLD_SIZE, else 1;
                                  at most 65536 */
  int drop_last;           /* default 0: the last batch is padded */
  uint64_t start_epoch;    /* resume position (default 0, 0) */
  uint64_t start_batch;
  uint32_t window;          /* batches the client may hold (default
                                  LARDER_DEFAULT_WINDOW, 32),
                                  at most LARDER_MAX_WINDOW */
  uint64_t arena_bytes;     /* 0 = daemon's default */
  int memory_kind;          /* LARDER_MEMORY_HOST (default) or
                                  LARDER_MEMORY_CUDA: see below */
  int cuda_device;          /* CUDA streams: the device ordinal;
                                  -1 (default): $LOCAL_RANK, else 0 */
  uint32_t partitions;      /* node partitions P (0: the daemon's
                                  `partitions`, default 1): with P > 1
                                  the ranks of each node read, fetch and
                                  cache only their node's partitions of
                                  the data; batch_size * world_size must
                                  be a multiple of P */
  int32_t local_world_size; /* ranks per node; -1 (default):
                                  $LOCAL_WORLD_SIZE, $SLURM_NTASKS_PER_NODE,
                                  else world_size (one node) */
  const char *job;          /* the job's name in the daemon's metrics
                                  (the job label) and larderctl clients;
                                  NULL (default): $LARDER_JOB, else "";
                                  at most 64 printable ASCII characters */
} larder_stream_options_t;

/*
 * Where a stream's batches live (memory_kind).
 *
 * LARDER_MEMORY_CUDA: every buffer of every batch (values, validity
 * bitmaps, offsets) is in device memory of cuda_device, and every accessor
 * that returns a buffer pointer (larder_array_validity, _offsets,
 * _large_offsets, _values, and the Arrow and DLPack exports) returns a
 * device pointer, valid in any context of this process on that device
 * (PyTorch's included: it uses the primary context too).  The bytes are
 * those a host stream with the same options delivers, at the same
 * offsets: the daemon assembles each batch in host memory as for a host
 * stream, copies it into a device region that mirrors the arena, waits
 * for the copy, and only then hands the batch over, so a batch is
 * complete on the device when larder_stream_next returns it (no event to
 * wait on).  Release, order, exactly-once and resume are as for host
 * streams, and so is a batch held past larder_stream_close: the device
 * memory stays until its last batch is released (past
 * larder_client_close too, which then keeps the connection open until
 * then).
 * The CUDA driver is loaded at run time (libcuda.so.1, or
 * $LARDER_LIBCUDA); without it, or on a daemon without it, the open fails
 * with LARDER_EUNSUPPORTED and larder_client_last_error says what is
 * missing.  A device that does not exist fails with LARDER_EINVAL, device
 * memory exhausted with LARDER_ENOMEM, both naming the device.
 */
#define LARDER_MEMORY_HOST 0
#define LARDER_MEMORY_CUDA 1

/*
 * CUDA streams: the GPU work that reads a batch may still be queued or
 * running when the batch is released (PyTorch frees a tensor, and calls
 * its DLPack deleter, once the kernels that use it are queued, not done).
 * So the release of a CUDA batch (directly, or by the last of its Arrow or
 * DLPack consumers) records an event on the trainer's CUDA stream, and
 * goes to the daemon, which may then copy another batch over that memory,
 * only once the GPU has passed the event: larder_stream_next and
 * larder_stream_flush send those that have (without waiting), and
 * larder_stream_next, when it has no batch to return, waits for the GPU
 * (past its timeout if need be: the work is already queued) rather than
 * for a daemon that needs the releases.  larder_stream_close
 * waits for them too, and so does the last release after it, before the
 * stream's device memory is unmapped.  The event goes on the legacy
 * default stream unless the trainer names its own here: cuda_stream is a
 * CUstream (cudaStream_t, torch.cuda.Stream.cuda_stream) of the stream's
 * device, or NULL for the legacy default stream, which orders after the
 * work of every blocking stream (PyTorch's default stream is it; its
 * other streams are non-blocking, and work on them must be named here).
 * Releases after the call use it, so it must stay valid until they are
 * made.  A stream the driver refuses when a release records its event
 * (another device's) makes that release wait, on the releasing thread,
 * for all of the device's work in the trainer's context
 * (cuCtxSynchronize) instead.  Any thread; no effect on a host stream.
 */
void larder_stream_set_cuda_stream(larder_stream_t *stream, void *cuda_stream);

/* Fills opts with the defaults above.  Any thread. */
void larder_stream_options_init(larder_stream_options_t *opts);

/*
 * Opens a stream.  rank and world_size left at -1 are read from RANK and
 * WORLD_SIZE (as torchrun and Slurm set them; SLURM_PROCID, then
 * LOCAL_RANK, is used when RANK is unset, SLURM_NTASKS when WORLD_SIZE is),
 * and a cuda_device left at -1 from LOCAL_RANK.  A variable consulted that
 * is set but is not a decimal number in range (rank from 0, world size
 * from 1, both below 2^24) fails the open with LARDER_EINVAL, and the
 * error names the variable and its value.  LOCAL_RANK is read for the
 * device only when memory_kind asks for CUDA memory.  Relative source
 * paths are made absolute against the caller's working directory before
 * they are sent (sources with "://" are URLs and go as they are).  A
 * window above LARDER_MAX_WINDOW fails with LARDER_EINVAL.  Before the
 * first batch, larder_stream_position reports the start normalised as the
 * daemon reads it: a start_batch past the end of an epoch counts into the
 * next epochs.  The daemon's shared memory is checked before it is used:
 * an arena or ring smaller than the daemon says, or not sealed against
 * shrinking, fails the open with LARDER_EPROTO.  On success *out is a new
 * stream.  Returns 0 or a negative code (LARDER_EINVAL in a forked child,
 * see larder_client_close); larder_client_last_error says why (a missing
 * file, a bad column, ...).  Sources that hold no rows at all (files of
 * zero rows, read cleanly) fail with LARDER_EINVAL: an epoch of them would
 * have no batch, and an unbounded stream would never yield one.  So does
 * an unbounded stream whose epochs have no batch (drop_last with a global
 * batch larger than the dataset); bounded, it ends at once with
 * LARDER_EEOF.  Should the daemon not answer in time, a
 * reply that comes later is discarded and its stream closed on the
 * daemon's side.
 */
int larder_stream_open(larder_client_t *client, const larder_stream_options_t *opts,
                       larder_stream_t **out);

/*
 * Waits up to timeout_ms (-1: forever, 0: poll) for the next batch.  On
 * success *out is a batch the caller releases with larder_batch_release (or
 * exports).  Returns 0, LARDER_EEOF after the last batch, LARDER_ETIMEDOUT,
 * LARDER_EINVAL in a forked child (see larder_client_close), or the error
 * that ended the stream (larder_client_last_error says why).  The daemon
 * ends it with its own errors; the library ends it itself with
 * LARDER_EPROTO when the daemon sends a malformed batch (a buffer outside
 * the arena, too small for its array, or with numbers not aligned to their
 * width, up to 8 bytes) and LARDER_ENOMEM when it cannot allocate one.
 * Once ended, every later call returns that error.  A signal does not end
 * the wait (it goes on after EINTR): a caller that
 * must act on signals while it waits, such as Python's KeyboardInterrupt
 * through ctypes, calls with a finite timeout in a loop.  The thread that
 * owns the stream.
 */
int larder_stream_next(larder_stream_t *stream, int timeout_ms, larder_batch_t **out);

/* A descriptor, one per stream, that is readable (level-triggered) while
 * the stream may have something for larder_stream_next: while the client's
 * socket has data, and while something that a call for another stream of
 * the client (or larder_stream_open) read for this one waits in the
 * library, until larder_stream_next next runs for this stream.  In an
 * event loop, wait on it once the stream is open or larder_stream_next has
 * returned LARDER_ETIMEDOUT, then call larder_stream_next with a zero
 * timeout until it returns LARDER_ETIMEDOUT again; with several streams of
 * one client, wait on each stream's descriptor.  (A stream whose batches
 * come through shared memory makes it readable only for a reader that
 * said, by that LARDER_ETIMEDOUT, that it sleeps.)  It is an epoll
 * descriptor: poll, select and epoll can wait on it; do not read it.
 * Valid until larder_stream_close.  Any thread. */
int larder_stream_fd(const larder_stream_t *stream);

/* The position of the next batch larder_stream_next will return, for
 * checkpoints; open a stream with it as start_epoch/start_batch to resume. */
void larder_stream_position(const larder_stream_t *stream, uint64_t *epoch, uint64_t *batch);

uint64_t larder_stream_batches_per_epoch(const larder_stream_t *stream);
uint64_t larder_stream_num_samples(const larder_stream_t *stream);

/*
 * The node partitions the stream reads with: *partitions is P (1 without
 * partitions) and [*first, *last) the partitions of this rank's node (node
 * rank / local_world_size).  Any pointer may be NULL.  Any thread.
 */
void larder_stream_partitions(const larder_stream_t *stream, uint32_t *partitions, uint32_t *first,
                              uint32_t *last);

/* What the daemon said the trainer should know of the stream at open (for
 * instance that the node count does not divide the partitions, so that
 * nodes share some), or "" when nothing; valid while the stream is.  Any
 * thread. */
const char *larder_stream_note(const larder_stream_t *stream);

/* The stream's columns: a STRUCT array description with no data. */
int larder_stream_num_columns(const larder_stream_t *stream);
const char *larder_stream_column_name(const larder_stream_t *stream, int i);
larder_type_t larder_stream_column_type(const larder_stream_t *stream, int i);

/* Time the caller spent waiting for batches, and between calls (its own
 * work), since the stream opened, in nanoseconds.  Waiting is the time
 * blocked in larder_stream_next, and the time from a call that returned
 * LARDER_ETIMEDOUT to the next call (an event loop waits on
 * larder_stream_fd then).  The stall fraction is wait / (wait + compute).
 * The daemon learns these figures with the releases. */
void larder_stream_stall(const larder_stream_t *stream, uint64_t *wait_ns, uint64_t *compute_ns);

/*
 * Makes the daemon read the releases (and the stall figures they carry)
 * that it has not read yet.  Where the daemon offers a descriptor ring (the
 * default; see proto/larder.proto), batches arrive and releases leave
 * through shared memory, and the daemon reads them when it needs room; a
 * trainer that keeps up then makes no system call per batch.  Otherwise
 * the library sends releases together, up to half the stream's window at a
 * time.  Either way it tells the daemon before larder_stream_next waits,
 * whenever the daemon asks, and at once for a release made (on any thread)
 * while a reader waits, in larder_stream_next or on larder_stream_fd after
 * LARDER_ETIMEDOUT; so no call needs this for progress.  Call it to
 * make the daemon's per-stream stats current now.  Returns 0,
 * LARDER_ECLOSED when the connection is gone (seen when this or an
 * earlier call fails to send, or a read finds it closed; the later calls
 * of the client return it too), LARDER_EINVAL in a forked child, or the
 * error that ended the stream (as larder_stream_next returned it, such as
 * LARDER_ESHUTDOWN).  The thread that owns the stream.
 */
int larder_stream_flush(larder_stream_t *stream);

/* Closes the stream; its unreleased batches stay valid until released. */
void larder_stream_close(larder_stream_t *stream);

/* ------------------------------------------------------------------------ */
/* Batches and arrays (zero-copy views into the shared-memory arena)         */

int64_t larder_batch_num_rows(const larder_batch_t *batch);
uint64_t larder_batch_epoch(const larder_batch_t *batch);
uint64_t larder_batch_index(const larder_batch_t *batch);
int larder_batch_num_columns(const larder_batch_t *batch);
const larder_array_t *larder_batch_column(const larder_batch_t *batch, int i);
const larder_array_t *larder_batch_column_by_name(const larder_batch_t *batch, const char *name);
/* Bytes of the batch's buffers in the arena.  Each buffer starts on a
 * 64-byte boundary, so the batch takes up to 63 bytes more per buffer:
 * size arena_bytes with that room (and more, as batches vary). */
uint64_t larder_batch_bytes(const larder_batch_t *batch);
/* LARDER_MEMORY_HOST or LARDER_MEMORY_CUDA: where the buffers of the
 * batch's arrays are (the stream's memory_kind), and the CUDA device
 * ordinal (-1 for host memory).  Any thread. */
int larder_batch_memory_kind(const larder_batch_t *batch);
int larder_batch_device(const larder_batch_t *batch);

/* Gives the batch's arena region back to the daemon (see
 * larder_stream_flush for when the release goes out), and frees the
 * batch.  In a forked child it only frees the batch (see
 * larder_client_close).  An exported batch is released by its ArrowArray:
 * this ignores it.  Any thread; once. */
void larder_batch_release(larder_batch_t *batch);

const char *larder_array_name(const larder_array_t *a);
larder_type_t larder_array_type(const larder_array_t *a);
int larder_array_nullable(const larder_array_t *a);
int32_t larder_array_byte_width(const larder_array_t *a); /* FIXED_BINARY, DECIMAL */
int32_t larder_array_precision(const larder_array_t *a);
int32_t larder_array_scale(const larder_array_t *a);
larder_time_unit_t larder_array_unit(const larder_array_t *a);
int larder_array_utc(const larder_array_t *a);
int64_t larder_array_length(const larder_array_t *a);
int64_t larder_array_null_count(const larder_array_t *a);
/* NULL when the array has no nulls. */
const uint8_t *larder_array_validity(const larder_array_t *a);
/* int32 offsets (length + 1) of BINARY/STRING/LIST/MAP; else NULL. */
const int32_t *larder_array_offsets(const larder_array_t *a);
/* int64 offsets (length + 1) of LARGE_BINARY/LARGE_STRING/LARGE_LIST;
 * else NULL.  (The daemon does not send these types yet.) */
const int64_t *larder_array_large_offsets(const larder_array_t *a);
/* Fixed-width values (BOOL: a bitmap), or the bytes of BINARY/STRING. */
const void *larder_array_values(const larder_array_t *a);
uint64_t larder_array_values_size(const larder_array_t *a);
int larder_array_num_children(const larder_array_t *a);
const larder_array_t *larder_array_child(const larder_array_t *a, int i);
/* LARDER_MEMORY_HOST or LARDER_MEMORY_CUDA: whether the pointers above
 * are host or device pointers (its batch's larder_batch_memory_kind). */
int larder_array_memory_kind(const larder_array_t *a);

/*
 * Every buffer of a batch in one call, for FFIs (Python's ctypes) where
 * each call costs more than the work it does: the accessors above take
 * about 80 calls for a batch of 15 columns, this takes one.
 *
 * The arrays are listed in the batch's slot order: the columns first, in
 * the stream's order (arrays[i] is column i for i < num_columns), then
 * the children, each array's children contiguous from first_child.  The
 * fields of an entry are those of the accessors of the same array:
 * validity is NULL when null_count is 0; offsets are int32 or int64 as
 * offset_width (4 or 8) says, NULL when offset_width is 0; byte_width is
 * the bytes per value of the fixed-width types (0 for BOOL, whose values
 * are bits, and for the variable-width and nested types).  The pointers
 * are into the arena, valid until the batch is released (as for the
 * accessors); the static facts of a column (name, nullable, unit, scale)
 * come from the larder_array_* accessors, once per stream.  Every field
 * is 8 bytes wide (on 64-bit hosts), so that an FFI can read a
 * larder_batch_info_t followed by the entries as one vector of int64: a
 * Python caller turns it into a list in one step.
 */
typedef struct larder_array_info {
  int64_t type;         /* larder_type_t */
  int64_t byte_width;   /* bytes per fixed-width value, else 0 */
  int64_t offset_width; /* 4, 8, or 0 when the type has no offsets */
  int64_t num_children;
  int64_t first_child; /* index of its first child here, -1 when none */
  int64_t parent;      /* index of its parent here, -1 for a column */
  int64_t length;
  int64_t null_count;
  const uint8_t *validity;
  const void *offsets;
  const void *values;
  uint64_t values_size; /* bytes at values */
} larder_array_info_t;

typedef struct larder_batch_info {
  int64_t num_rows;
  uint64_t epoch;
  uint64_t index;
  uint64_t bytes; /* larder_batch_bytes */
  int64_t num_columns;
  int64_t num_arrays; /* columns and their children, all levels */
  /* The stream's arena, which holds every buffer of the batch: a caller
   * that maps it once (a Python buffer object) makes each array a view at
   * an offset into it, and a bounds-checked one. */
  const uint8_t *arena;
  uint64_t arena_size;
} larder_batch_info_t;

/*
 * Fills *info (when not NULL) and the first min(max_arrays, num_arrays)
 * entries of arrays (NULL when max_arrays is 0) for batch, and returns
 * num_arrays, the same for every batch of a stream: a caller sizes its
 * array once, with a first call of max_arrays 0.  Returns LARDER_EINVAL
 * for a NULL batch or a negative max_arrays.  Allocates nothing and
 * cannot fail otherwise.  Any thread, as the accessors.
 */
int larder_batch_describe(const larder_batch_t *batch, larder_batch_info_t *info,
                          larder_array_info_t *arrays, int max_arrays);

/* ------------------------------------------------------------------------ */
/* Arrow C Data Interface                                                    */

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE
#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4
struct ArrowSchema {
  const char *format;
  const char *name;
  const char *metadata;
  int64_t flags;
  int64_t n_children;
  struct ArrowSchema **children;
  struct ArrowSchema *dictionary;
  void (*release)(struct ArrowSchema *);
  void *private_data;
};
struct ArrowArray {
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void **buffers;
  struct ArrowArray **children;
  struct ArrowArray *dictionary;
  void (*release)(struct ArrowArray *);
  void *private_data;
};
#endif /* ARROW_C_DATA_INTERFACE */

/*
 * Exports a batch as an Arrow struct array (one child per column) and its
 * schema, without copying: the buffers point into the arena.  Ownership of
 * the batch moves to the ArrowArray: its release callback releases the
 * batch, so the caller must not call larder_batch_release afterwards (one
 * that it calls while the array lives is ignored).  The schema is
 * independent and has its own release.  A child moved out of either (as
 * the interface allows) stays valid until its own release, and the batch
 * is released when the last part of the array is.  Release callbacks may
 * run on any thread.  A map's entries and keys are exported non-nullable,
 * as Arrow requires.  Returns 0, LARDER_ENOMEM (the batch then still
 * belongs to the caller), LARDER_EUNSUPPORTED for a batch with a null map
 * entry or key (which Parquet allows and Arrow does not; the accessors
 * still read it) or LARDER_EINVAL for a batch exported already (it
 * belongs to that array).  On an error nothing is exported: there is no
 * schema or array to release.
 */
int larder_batch_export(larder_batch_t *batch, struct ArrowSchema *schema,
                        struct ArrowArray *array);

/* ------------------------------------------------------------------------ */
/* Arrow C Device Data Interface and DLPack (device memory, and host too)    */

/* As the Arrow C Device Data Interface defines them (ABI-stable). */
#ifndef ARROW_C_DEVICE_DATA_INTERFACE
#define ARROW_C_DEVICE_DATA_INTERFACE
typedef int32_t ArrowDeviceType;
#define ARROW_DEVICE_CPU 1
#define ARROW_DEVICE_CUDA 2
#define ARROW_DEVICE_CUDA_HOST 3
struct ArrowDeviceArray {
  struct ArrowArray array;
  int64_t device_id;
  ArrowDeviceType device_type;
  void *sync_event;
  int64_t reserved[3];
};
#endif /* ARROW_C_DEVICE_DATA_INTERFACE */

/*
 * As larder_batch_export, into an ArrowDeviceArray: device_type
 * ARROW_DEVICE_CUDA and device_id the stream's device for a CUDA stream
 * (ARROW_DEVICE_CPU and -1 for a host stream), and sync_event NULL: the
 * batch is complete on the device before larder_stream_next returns it.
 * Ownership moves to array->array as for larder_batch_export; the same
 * return codes.
 */
int larder_batch_export_device(larder_batch_t *batch, struct ArrowSchema *schema,
                               struct ArrowDeviceArray *array);

/* As dlpack.h (v0.8 and later) defines them: the subset liblarder fills. */
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_
typedef enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 } DLDeviceType;
typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;
typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLBfloat = 4U,
  kDLBool = 6U
} DLDataTypeCode;
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
#endif /* DLPACK_DLPACK_H_ */

/*
 * Exports the batch's fixed-width columns as DLPack tensors, without
 * copying: tensors[i] (for i below n, n at most the batch's columns) is
 * column i's values as a 1-D tensor of its rows (FIXED_BINARY: 2-D, rows
 * by byte_width, of uint8), on the batch's device (kDLCUDA and the
 * device for a CUDA stream, kDLCPU for a host one), or NULL for a column
 * that is not fixed-width (BOOL's bits, strings, lists, structs, maps,
 * decimals).  A null slot holds zero bytes (larder_array_validity says
 * which; DLPack has no validity).  Types: INT*, UINT* as kDLInt/kDLUInt,
 * FLOAT16/32/64 as kDLFloat, DATE32 and TIME32 as int32, TIME64 and
 * TIMESTAMP as int64.  Ownership of the batch moves to the tensors: each
 * holds a reference, its deleter drops it, and the last one releases the
 * batch (larder_batch_release is then ignored, as after an Arrow export).
 * Deleters may run on any thread, once each.  Returns the number of
 * tensors made (at least 1), LARDER_EUNSUPPORTED when no column is
 * fixed-width (the batch still belongs to the caller), LARDER_EINVAL for
 * a batch exported already or a bad n, LARDER_ENOMEM.
 */
int larder_batch_export_dlpack(larder_batch_t *batch, DLManagedTensor **tensors, int n);

/*
 * A DLPack tensor over one buffer of the batch, for consumers that each
 * want a tensor of their own (Python's __dlpack__ protocol hands one to
 * every caller), any buffer (values, validity, offsets, a child's) and
 * any number of times.  data is a pointer the accessors or
 * larder_batch_describe gave for this batch, and [data, data + the
 * tensor's bytes) must lie in the batch's stream's memory (its arena, or
 * the device region of a CUDA stream); dtype (lanes 1, whole bytes) and
 * shape (ndim 1 or 2, compact row-major) say how to read it.  The tensor
 * is on the batch's device (kDLCUDA for a CUDA stream, kDLCPU for a host
 * one) and holds a reference to the batch: the batch is released when its
 * owner has released it (larder_batch_release, or the release of its
 * export) and every such tensor's deleter has run, whichever is last.
 * The caller must still own the batch (before its release or export).
 * Deleters may run on any thread, once each.  Returns 0 with *out set,
 * LARDER_EINVAL (a bad type or shape, memory outside the batch's, a batch
 * exported already), LARDER_ENOMEM.
 */
int larder_batch_dlpack(larder_batch_t *batch, const void *data, DLDataType dtype, int ndim,
                        const int64_t *shape, DLManagedTensor **out);

#ifdef __cplusplus
}
#endif
#endif /* LARDER_H */
