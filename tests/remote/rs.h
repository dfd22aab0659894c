/*
 * rs.h: the loopback test servers of tests/remote from C tests (prefix rs_).
 *
 * Each server is a child process that prints one JSON line when it is ready
 * ({"port":N,"pid":N,...}) and stops on SIGTERM:
 *   rs_start_s3front     node tests/remote/s3front.mjs (S3: SigV4, faults)
 *   rs_start_faultproxy  node tests/remote/faultproxy.mjs (faults, bandwidth)
 *   rs_start_nginx       tests/remote/nginx.sh run (static files)
 * Every server is started with --watch-pid of the calling process, so a test
 * that dies leaves none behind.  Its stderr and log go to files in dir.
 *
 * Build: add tests/remote/rs.c to TEST_SRCS.  The scripts are found under
 * $LARDER_REMOTE_DIR, else tests/remote (relative to the working directory;
 * the runner runs from the repository root); node is found in PATH.
 *
 * Functions return 0 (or an HTTP status) on success and -1 on failure, with
 * the reason on stderr, so tests decide what to assert.
 */
#ifndef LARDER_TESTS_RS_H
#define LARDER_TESTS_RS_H

#include <stdint.h>
#include <sys/types.h>

typedef struct rs_server {
  pid_t pid;        /* the child (node, or nginx.sh's wrapper); 0 when stopped */
  int port;         /* where it listens, on 127.0.0.1 */
  char url[64];     /* "http://127.0.0.1:PORT" */
  char ready[4096]; /* the ready line (JSON) */
} rs_server;

/*
 * Starts argv (argv[0] looked up in PATH) with stdout on a pipe and stderr
 * into stderr_path (NULL: inherited), and waits up to timeout_ms for the
 * ready line.  Returns 0 or -1 (the child is then killed).
 */
int rs_start(rs_server *s, const char *const argv[], const char *stderr_path, int timeout_ms);

/*
 * s3front.mjs with its data and log in dir (created), and extra flags
 * (NULL-terminated, may be NULL), e.g. {"--bucket", "data", NULL}.
 */
int rs_start_s3front(rs_server *s, const char *dir, const char *const extra[]);
/* faultproxy.mjs in front of upstream ("http://127.0.0.1:PORT"). */
int rs_start_faultproxy(rs_server *s, const char *upstream, const char *dir,
                        const char *const extra[]);
/* nginx.sh run DIR ROOT (its config, logs and pid under dir). */
int rs_start_nginx(rs_server *s, const char *dir, const char *root, const char *const extra[]);

/* SIGTERM, then waits up to timeout_ms; returns the exit status (0 when it
 * stopped cleanly), or -1 after a timeout (it is SIGKILLed then). */
int rs_stop(rs_server *s, int timeout_ms);

/*
 * One HTTP/1.1 request to 127.0.0.1:port (Connection: close).  body may be
 * NULL.  Returns the status code and, when reply is not NULL, the response
 * body (malloc'd, NUL-terminated); -1 when there was no response.
 */
int rs_http(int port, const char *method, const char *path, const char *body, char **reply);

/* POST /__control with a JSON object, e.g.
 * "{\"add\":{\"type\":\"status\",\"status\":503,\"count\":2}}".  Returns 0 when
 * the server took it (the reason is printed otherwise). */
int rs_control(const rs_server *s, const char *json);
/* GET /__stats (caller frees), or NULL. */
char *rs_stats(const rs_server *s);

/*
 * A number in a JSON text by key: "requests", or a dotted path through
 * nested objects: "by_status.503", "by_path./data/x.parquet.requests" (the
 * key is matched greedily against the object's keys, so keys may contain
 * dots).  Returns def when absent.
 */
int64_t rs_json_int(const char *json, const char *path, int64_t def);

#endif
