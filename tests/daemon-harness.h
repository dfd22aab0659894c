/*
 * daemon-harness.h: what the daemon's integration tests (test-daemon*.c)
 * share (prefix dh_).
 *
 * - Daemons: dh_start runs the real larderd binary ($LARDERD_BIN, else the
 *   larderd next to run-tests) on a socket and cache directory under
 *   test_tmpdir(), with the test's flags, and waits until the socket
 *   accepts; dh_stop sends SIGTERM and asserts exit status 0 and a log free
 *   of sanitizer reports (an LSan leak report at exit fails the test);
 *   dh_kill sends SIGKILL.  The daemon's stderr goes to <dir>/larderd.log.
 * - Datasets: dh_dataset writes Parquet files with tests/pqwrite.h, cached
 *   under tests/work/daemon (or $LARDER_TEST_WORK) so reruns are fast.  Each
 *   row has a unique `id` (0 .. N-1 across the files, in dataset order),
 *   from which every other column is computed (dh_expect_row checks them).
 * - Streams: dh_collect reads a whole stream through liblarder and records,
 *   per batch, its position, a hash of all its bytes and its ids;
 *   dh_collect_many does the same for several streams at once, one thread
 *   and one client each.
 * - Raw protocol: dh_raw_* speak frames on a bare socket, for the tests of
 *   hostile clients.
 * - The daemon's process: fd, memfd and RSS counts from /proc.
 * Every helper asserts (aborting the test) unless it returns a status.
 */
#ifndef LARDER_TESTS_DAEMON_HARNESS_H
#define LARDER_TESTS_DAEMON_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "larder.h"
#include "wire.h"
#include "task.h"

/* ------------------------------------------------------------------------ */
/* Daemons                                                                   */

#define DH_MAX_FLAGS 24

typedef struct dh_daemon {
  pid_t pid;     /* 0 when not running */
  char dir[512]; /* <tmpdir>/<name> */
  char socket[600];
  char cache[600];
  char log[600];
  char config[600]; /* an empty config file, so /etc is never read */
  char flags[DH_MAX_FLAGS][160];
  int num_flags;
  int starts;
} dh_daemon;

/* Prepares a daemon named name (its directory under test_tmpdir()), with
 * the flags (NULL-terminated list of "--key=value"; may be NULL). */
void dh_init(dh_daemon *d, const char *name, const char *const *flags);
/* Adds or replaces a flag ("--key=value") for the next start. */
void dh_flag(dh_daemon *d, const char *flag);
/* Points the daemon at another cache directory (under its dir). */
void dh_set_cache(dh_daemon *d, const char *subdir);
/* Starts it and waits (up to 30 s) until its socket accepts. */
void dh_start(dh_daemon *d);
/* Starts it without waiting for its socket; for daemons expected to fail. */
void dh_spawn(dh_daemon *d);
/* Waits up to timeout_ms for it to exit; returns the wait status, or -1
 * (it is still running). */
int dh_wait_exit(dh_daemon *d, int timeout_ms);
/* SIGTERM; asserts exit status 0 within timeout and a clean log. */
void dh_stop(dh_daemon *d);
/* SIGTERM; returns the raw wait status (-1 on timeout, then SIGKILLs). */
int dh_stop_status(dh_daemon *d, int timeout_ms);
/* SIGKILL and reap. */
void dh_kill(dh_daemon *d);
/* Whether the process is still running (not exited). */
int dh_alive(dh_daemon *d);
/* Asserts that the daemon's log has no sanitizer report. */
void dh_check_log(const dh_daemon *d);
/* Prints the end of the log on stderr. */
void dh_print_log(const dh_daemon *d);
/* The log as a string (caller frees). */
char *dh_read_log(const dh_daemon *d);

/* Sends an admin request and returns the reply text (caller frees), or
 * NULL when the daemon did not answer. */
char *dh_admin(const dh_daemon *d, const char *command);
/* A number from a stats JSON text: key may be "a.b" for nested objects. */
uint64_t dh_json_u64(const char *json, const char *key);
int dh_json_has(const char *json, const char *key);
/* The value of key (dotted) in the object at obj, or NULL. */
const char *dh_json_find(const char *obj, const char *key);
/* The stats object of the stream of client pid `pid` (the n-th such), or
 * NULL; points into json. */
const char *dh_json_stream(const char *json, int pid, int n);
/* One number from a fresh "stats" reply. */
uint64_t dh_stat(const dh_daemon *d, const char *key);

/* /proc views of the daemon's process. */
int dh_fd_count(pid_t pid);
int dh_memfd_count(pid_t pid);
/* Descriptors whose link starts with prefix ("socket:", "/memfd:"). */
int dh_fd_kind_count(pid_t pid, const char *prefix);
long dh_rss_kb(pid_t pid);
/* The process's peak RSS (VmHWM) in kB, after resetting it to its current
 * RSS when reset is set (where the kernel lets this process); -1 when
 * unknown. */
long dh_peak_rss_kb(pid_t pid, int reset);
/* CPU time (user + system) the process used so far, in milliseconds. */
double dh_cpu_ms(pid_t pid);
/* Waits up to timeout_ms for the daemon's fd count to come down to at most
 * want; returns the last count. */
int dh_wait_fds(pid_t pid, int want, int timeout_ms);

/* The niceness of each of pid's threads named comm (at most max of them,
 * into nices); returns how many there are. */
int dh_thread_nices(pid_t pid, const char *comm, int *nices, int max);
/* Whether this process may lower a niceness it raised (root, CAP_SYS_NICE
 * or a high enough RLIMIT_NICE), tried in a child. */
int dh_can_unnice(void);

/* Under a sanitizer the daemon is slower; tests scale by this (1 or 3). */
int dh_slow(void);
/* Whether this is the ASan flavour (its quarantine makes RSS meaningless;
 * LeakSanitizer at the daemon's exit checks leaks instead). */
int dh_asan(void);

/* ------------------------------------------------------------------------ */
/* Datasets                                                                  */

typedef struct dh_spec {
  int files;
  int rows_per_file; /* rows of every file but the last */
  int last_rows;     /* rows of the last file (0: rows_per_file) */
  int rg_rows;       /* rows per row group */
  int codec;         /* PQ_SNAPPY, PQ_ZSTD, ... (0 = uncompressed) */
  int64_t id_base;   /* first id (0) */
  int variant;       /* mixed into every non-id value: a "changed" file */
} dh_spec;

/* Writes (or reuses) the dataset of spec under the work dir in a
 * directory named name, and copies its path into dir.  Returns the number
 * of rows. */
int64_t dh_dataset(const dh_spec *spec, const char *name, char *dir, size_t dirlen);
/* Writes one file of the dataset (file index f of spec) at path. */
void dh_write_file(const dh_spec *spec, int f, const char *path);
/* Overwrites 8 KiB a third of the way into the largest RocksDB table file
 * (.sst) in db_dir, as a failing disk might; returns that file's size
 * (asserting one of more than 16 KiB is there). */
long dh_damage_largest_table(const char *db_dir);
/* The work directory (tests/work/daemon or $LARDER_TEST_WORK/daemon). */
const char *dh_work_dir(void);

/* The columns of every dataset, in order. */
#define DH_COL_ID 0    /* id: int64 */
#define DH_COL_LABEL 1 /* label: int32, (id * 7 + variant) % 10 */
#define DH_COL_X 2     /* x: double, id * 0.5 + variant */
#define DH_COL_NAME 3  /* name: string, "r<id>:" + (id % 13) letters */
#define DH_COL_OPT 4   /* opt: int64, nullable: null when id % 7 == 3 */
#define DH_COL_TAGS \
  5 /* tags: list<int32>, null when id % 11 == 5, else
                          id % 4 elements id + k */
#define DH_NUM_COLS 6

/* Waits until the daemon's log holds needle at least n times; fails the
 * test, printing the log, after timeout_ms. */
void dh_wait_log(const dh_daemon *d, const char *needle, int n, double timeout_ms);

/* Checks every column of row i of batch b against its id (columns looked
 * up by name; absent columns are skipped). */
void dh_expect_row(const larder_batch_t *b, int64_t i, int variant);

/* The standard dataset of most tests: 4 files of 2500, 2500, 2500 and 2000
 * rows, row groups of 1000 rows (so 1000, 1000, 500), snappy: 9500 rows.
 * With unit_rows 128 that makes 8 + 8 + 4 units a file, 76 in all. */
#define DH_STD_ROWS 9500
#define DH_STD_UNIT_ROWS 128
#define DH_STD_UNITS 76
extern const dh_spec dh_std_spec;
int64_t dh_std_dataset(char *dir, size_t dirlen);
/* A bigger one for load: 6 files of 10000 rows, row groups of 2500, zstd;
 * 60000 rows.  With unit_rows 512: 5 units a row group, 120 in all. */
#define DH_MID_ROWS 60000
#define DH_MID_UNITS 120
extern const dh_spec dh_mid_spec;
int64_t dh_mid_dataset(char *dir, size_t dirlen);
/* The id of row `row` of row group rg at row_start within file f of spec. */
int64_t dh_spec_id(const dh_spec *spec, int f, int rg, int64_t row);

/* Writes a DuckDB dataset with tests/gen/demo-data.mjs (cached); returns 0,
 * or -1 when node is not available (the caller skips). */
int dh_demo_dataset(int rows, int shards, char *dir, size_t dirlen);

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */

typedef struct dh_batch {
  uint64_t epoch, index;
  int64_t rows;
  uint64_t hash;
  int64_t *ids; /* rows ids (NULL when the stream has no id column) */
} dh_batch;

typedef struct dh_run {
  dh_batch *b;
  size_t n, cap;
  int rc;         /* 0, or the error that ended the stream */
  char err[1024]; /* larder_client_last_error when rc != 0 */
  uint64_t batches_per_epoch, num_samples;
  int check_rows; /* check every row's columns (dh_expect_row) */
  int variant;
  int (*variant_of)(int64_t id); /* per-row variant, else `variant` */
} dh_run;

/* A hash of every byte of every array of b (lengths, null counts,
 * validity, offsets, values), column after column. */
uint64_t dh_batch_hash(const larder_batch_t *b);
/* The batch's ids (the "id" column) into ids; returns the count. */
int64_t dh_batch_ids(const larder_batch_t *b, int64_t *ids, int64_t cap);

/* Opens a stream with opts on socket and reads it to its end (or
 * max_batches), releasing each batch.  Returns 0 or the error (also in
 * run->rc, with the message in run->err). */
int dh_collect(const char *socket, const larder_stream_options_t *opts, uint64_t max_batches,
               dh_run *run);
/* n streams at once, each on its own thread and client. */
void dh_collect_many(const char *socket, const larder_stream_options_t *opts, int n, dh_run *runs);
void dh_run_free(dh_run *run);
/* Asserts that two runs delivered the same batches, byte for byte. */
void dh_expect_same(const dh_run *a, const dh_run *b);

/* Stream options with the defaults, one source, and the given settings. */
void dh_opts(larder_stream_options_t *o, const char *const *source, uint32_t batch_size,
             uint64_t seed, uint64_t epochs);
/* Options for the standard dataset's tests: dh_opts with nsrc sources,
 * units of DH_STD_UNIT_ROWS rows, a shuffle window of 8 and an arena of
 * arena_bytes. */
void dh_std_opts(larder_stream_options_t *o, const char *const *source, size_t nsrc,
                 uint32_t batch_size, uint64_t seed, uint64_t epochs, uint64_t arena_bytes);
/* The standard dataset (dh_std_dataset, made on first use) as a source
 * list of one, valid for the rest of the test. */
const char *const *dh_std_source(void);
/* Its directory: dh_std_source()[0]. */
const char *dh_std_dir(void);

/*
 * A client in a child process that opens `streams` streams (stream i with
 * seed o->seed + i * seed_step), reads `reads` batches from each, keeps the
 * first `hold` of them and releases the rest, then writes one byte to the
 * pipe it returns in *ready_fd and waits to be killed; with drain, it keeps
 * reading and releasing after that instead.  The child is this test binary
 * run again (fork and exec: a forked copy of a process whose other threads
 * hold the allocator's lock, as ASan's does, would deadlock in malloc).
 * o must name one source.  Returns the child's pid.
 */
pid_t dh_spawn_holder(const char *socket, const larder_stream_options_t *o, int streams,
                      uint64_t seed_step, int reads, int hold, int drain, int *ready_fd);
/* The child's side: run-tests --hold-client ARGS (runner.c). */
int dh_holder_main(int argc, char **argv);

/* ------------------------------------------------------------------------ */
/* Raw protocol                                                              */

/* Connects to the socket; returns the descriptor. */
int dh_raw_connect(const char *socket);
/* Writes all of buf; returns 0 or -errno. */
int dh_raw_write(int fd, const void *buf, size_t len);
int dh_raw_send(int fd, const Larder__Frame *f);
/* Reads one frame within timeout_ms.  Descriptors that come with it are
 * closed unless fds is given (then up to 8 are stored, *num_fds set).
 * Returns NULL at end of stream or timeout (*rc: LARDER_ECLOSED or
 * LARDER_ETIMEDOUT). */
Larder__Frame *dh_raw_recv(int fd, int timeout_ms, int *fds, int *num_fds, int *rc);
/* An OpenStream frame, length prefix included (malloc'd, *len bytes), for
 * n sources (which may be empty) in batches of batch_size rows, world_size
 * 1 and everything else at its default: the raw bytes a test sends, cuts or
 * repeats. */
uint8_t *dh_open_frame(uint32_t request_id, char **sources, size_t n, uint32_t batch_size,
                       size_t *len);
/* Hello with version; returns the reply frame. */
Larder__Frame *dh_raw_hello(int fd, uint32_t version);
/* Sends OpenStream for the options and returns the reply (the arena fd, if
 * any, in *arena_fd, else -1). */
Larder__Frame *dh_raw_open(int fd, uint32_t request_id, const larder_stream_options_t *o,
                           int *arena_fd);
/* The same, asking for a descriptor ring (client/ring.h): its descriptor,
 * if the daemon sent one, in *ring_fd, else -1. */
Larder__Frame *dh_raw_open_ring(int fd, uint32_t request_id, const larder_stream_options_t *o,
                                int *arena_fd, int *ring_fd);
/* Whether the peer closed the connection within timeout_ms (frames before
 * the end are read and dropped; an Error frame's code goes to *err_code). */
int dh_raw_wait_closed(int fd, int timeout_ms, int *err_code);

#endif /* LARDER_TESTS_DAEMON_HARNESS_H */
