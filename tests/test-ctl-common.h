/*
 * test-ctl-common.h: what the larderctl and access-control tests share
 * (test-ctl*.c, test-acl*.c; prefix tc_).
 *
 * - Running programs: tc_run runs a command with its stdout and stderr
 *   captured, optionally as another user (the tests run as root and drop
 *   to uid/gid/groups in the child before exec); tc_ctl runs the larderctl
 *   of the same flavour against a daemon's socket.
 * - Checking output: a strict JSON validator, a Prometheus text-format
 *   validator.
 * - nginx: tests/remote/nginx.sh, stopped with the test.
 */
#ifndef LARDER_TESTS_CTL_COMMON_H
#define LARDER_TESTS_CTL_COMMON_H

#include <stddef.h>
#include <sys/types.h>

#include "daemon-harness.h"

typedef struct tc_cred {
  uid_t uid;
  gid_t gid;
  gid_t groups[8]; /* supplementary */
  int ngroups;
} tc_cred;

typedef struct tc_out {
  int status; /* exit status, 128 + signal, or -1 (timed out, killed) */
  char *out;  /* stdout, NUL-terminated */
  char *err;  /* stderr */
} tc_out;

/* larderctl of the same flavour ($LARDERCTL_BIN, else next to larderd). */
const char *tc_ctl_bin(void);

/* Runs argv (argv[0] a path) with cred (NULL: as is) and stdin from
 * /dev/null, within timeout_ms.  Returns o->status. */
int tc_run(tc_out *o, const tc_cred *cred, int timeout_ms, const char *const *argv);
/* larderctl --socket SOCKET args... (NULL-terminated). */
int tc_ctl(tc_out *o, const tc_cred *cred, const char *socket, ...);
void tc_out_free(tc_out *o);
/* Prints a result's output on stderr (for failing assertions). */
void tc_out_print(const char *what, const tc_out *o);

/* Whether s is exactly one JSON value (whitespace around it allowed). */
int tc_json_valid(const char *s);
/* Whether every non-empty line of s is one JSON value; returns the count,
 * or -1. */
int tc_json_lines(const char *s);

/* Validates Prometheus text exposition format 0.0.4: every sample belongs
 * to a family declared by # TYPE before it, names and labels are
 * well-formed, values parse, no series repeats, counters end in _total,
 * a histogram's samples are its _bucket (with le), _sum and _count.
 * Returns the number of samples, or -1 with the reason in err.  Family
 * names go to names (up to max, each NUL-terminated, 128 bytes). */
int tc_prom_check(const char *text, char *err, size_t errlen, char (*names)[128], int max,
                  int *num_names);

/* Makes the test's scratch directory and dir (under it) traversable by
 * every user (mode 0755), for clients that run as other users. */
void tc_open_tmpdir(const char *dir);

/* Opens a stream on source as cred in a child process and reads one batch.
 * Returns 0 or the error code, with larder_client_last_error in msg. */
int tc_open_as(const tc_cred *cred, const char *socket, const char *source, char *msg,
               size_t msglen);
/* tc_open_as, failing the test unless it returns want; the error message
 * must then contain needle (when not NULL). */
void tc_expect_open(const tc_cred *cred, const char *socket, const char *source, int want,
                    const char *needle);
/* 1, with a note on stderr, unless the tests run as root (they switch
 * users): the caller skips. */
int tc_need_root(void);

/* Starts nginx (tests/remote/nginx.sh) serving root, with extra options
 * ("" or "--limit-rate 100k"); returns its port, or 0 when nginx is not
 * available (the caller skips). */
int tc_nginx_start(const char *dir, const char *root, const char *options);
void tc_nginx_stop(const char *dir);

/* Waits up to timeout_ms until the daemon's log contains needle. */
int tc_wait_log(const dh_daemon *d, const char *needle, int timeout_ms);

#endif /* LARDER_TESTS_CTL_COMMON_H */
