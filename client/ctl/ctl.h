/*
 * ctl.h: internals of larderctl, shared by its command files (prefix ctl_).
 *
 * Conventions: each command returns the process exit status: 0 on success,
 * 1 when the operation failed (message on stderr), 2 for usage errors.
 * larderctl is single-threaded.
 */
#ifndef LARDER_CTL_H
#define LARDER_CTL_H

#include <stddef.h>
#include <stdint.h>

#include "parquet/parquet.h"

/* Global options (larderctl.c): --socket (NULL: $LARDER_SOCKET, else the
 * default socket). */
extern const char *ctl_socket;
const char *ctl_socket_path(void);

/* Prints a command's failure (ctl_daemon.c): on stderr, and with json also
 * as {"error":{"code":NAME,"message":MSG}} on stdout.  Returns code. */
int ctl_fail(int json, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Commands that talk to the daemon (ctl_daemon.c). */
int ctl_cmd_status(int json);
int ctl_cmd_stats(int json, int watch, double interval, long count);
/* One request whose whole answer is printed (clients, ls, evict, verify,
 * reload, config). */
int ctl_cmd_simple(const char *command, char **args, size_t nargs, int json, int dry_run);
int ctl_cmd_prefetch(char **args, size_t nargs, int json);
int ctl_inspect_remote(const char *url, int json);
int ctl_cat_remote(const char *url, const char *columns, int64_t offset, int64_t limit,
                   int no_verify_crc, uint64_t max_chunk);

/* Local Parquet tools (ctl_parquet.c). */
int ctl_cmd_inspect_local(const char *path, int json);
int ctl_cat_local(const char *path, const char *columns, int64_t offset, int64_t limit,
                  const pq_options *opts);

#endif /* LARDER_CTL_H */
