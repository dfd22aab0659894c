/*
 * remote-harness.h: what the remote-source integration tests
 * (test-remote-*.c) share (prefix rh_), on top of daemon-harness.h (the
 * daemon, datasets, streams) and remote/rs.h (the loopback servers).
 *
 * - Tools: rh_require checks for node, nginx and tests/node_modules and
 *   says why a test skips when one is missing.
 * - Servers: rh_nginx serves a directory; rh_s3 starts s3front.mjs and
 *   uploads a directory with s3put.mjs.  Each lives in its own directory
 *   under test_tmpdir() and stops with the test (rs.h's --watch-pid), or
 *   with rh_stop.
 * - Sources: rh_urls turns a dataset directory into one URL per file, in
 *   the same order as the files sort locally, so a remote run can be
 *   compared with a local one batch by batch.
 * - Logs: nginx's access log and the node servers' request logs are JSON
 *   lines; rh_log_* read them back and pick fields.
 * Every helper asserts (aborting the test) unless it returns a status.
 */
#ifndef LARDER_TESTS_REMOTE_HARNESS_H
#define LARDER_TESTS_REMOTE_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "daemon-harness.h"
#include "remote/rs.h"

#define RH_MAX_FILES 64

/* Returns 0 when node, nginx and tests/node_modules are there, else
 * prints why on stderr and returns TEST_SKIP. */
int rh_require(int need_nginx, int need_node);

/* Starts nginx (rs_start_nginx) on root in <tmpdir>/<name>; extra flags may
 * be NULL.  The access log is <tmpdir>/<name>/access.log. */
void rh_nginx(rs_server *s, const char *name, const char *root, const char *const *extra);
/* The access log path of an nginx started with rh_nginx. */
void rh_nginx_log(const char *name, char *buf, size_t size);

/* Starts s3front.mjs in <tmpdir>/<name> with bucket "data" plus extra
 * flags (may be NULL). */
void rh_s3(rs_server *s, const char *name, const char *const *extra);
/* Uploads the *.parquet files of dir to s3 under prefix (may be ""), with
 * the front's default credentials.  Returns the number of files. */
int rh_s3_put(const rs_server *s3, const char *bucket, const char *prefix, const char *dir);

/* Stops a server (SIGTERM, then SIGKILL after 10 s). */
void rh_stop(rs_server *s);

/* The *.parquet file names of dir, sorted (n returned; names malloc'd). */
int rh_files(const char *dir, char **names, int max);
void rh_files_free(char **names, int n);
/* One URL per file of dir: base + "/" + name (base without a trailing
 * slash).  Fills urls (malloc'd strings) and returns the count. */
int rh_urls(const char *base, const char *dir, char **urls, int max);

/* The Range headers the daemon should send for the projected columns
 * (cols/ncols; NULL/0 = all) of every row group of the local file at path,
 * chunks closer than gap merged as units.c does: "bytes=a-b" strings into
 * out (at most max; NULL to only count).  Returns the number of ranges and
 * adds their bytes to *bytes when not NULL. */
int rh_ranges(const char *path, const char *const *cols, size_t ncols, uint64_t gap, char out[][64],
              int max, uint64_t *bytes);
/* The bytes of the projected ranges of every *.parquet file of dir. */
uint64_t rh_projected_bytes(const char *dir, const char *const *cols, size_t ncols, uint64_t gap);

/* A copy of the dataset directory src at dst (a fresh directory). */
void rh_copy_dir(const char *src, const char *dst);

/* ------------------------------------------------------------------------ */
/* JSON-lines logs                                                           */

typedef struct rh_log {
  char *text;   /* the whole file */
  char **lines; /* pointers into text, NUL-terminated */
  int n;
} rh_log;

/* Reads a JSON-lines file (empty when missing). */
void rh_log_read(rh_log *log, const char *path);
void rh_log_free(rh_log *log);
/* A string field of one line ("" when absent or null) into buf. */
const char *rh_field(const char *line, const char *key, char *buf, size_t size);
/* An integer field (def when absent). */
int64_t rh_field_int(const char *line, const char *key, int64_t def);

/* Waits until the file at path has at least n lines (nginx writes its log
 * after the response, so a test that just read a stream may be ahead). */
int rh_wait_lines(const char *path, int n, int timeout_ms);

/* Reads o's stream to its end from a daemon of its own (2 workers, local
 * files): the reference a remote run is compared with. */
void rh_local_reference(const larder_stream_options_t *o, dh_run *out);

/* Whether the file at path contains needle. */
int rh_file_contains(const char *path, const char *needle);

#endif /* LARDER_TESTS_REMOTE_HARNESS_H */
