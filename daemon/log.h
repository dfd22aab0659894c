/*
 * log.h: larderd's logging (prefix log_).
 *
 * Lines go to stderr, each prefixed with its syslog priority in the form
 * journald understands ("<3>" for errors ...), so that under systemd the
 * journal keeps the levels and outside it the lines stay readable.  Nothing
 * logged may contain secrets: callers log URLs through their redacted form.
 * Any thread may log; a line is written with one write(2).  With log_file
 * (larderd --daemonize) stderr is that file, reopened on SIGHUP.
 */
#ifndef LARDER_LOG_H
#define LARDER_LOG_H

enum { LOG_ERR_ = 3, LOG_WARNING_ = 4, LOG_NOTICE_ = 5, LOG_INFO_ = 6, LOG_DEBUG_ = 7 };

/* Returns the level for "err", "warning", ... or -1. */
int log_level_parse(const char *name);
void log_set_level(int level);
int log_get_level(void);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Sends the log (stderr, and stdout with it) to the end of the file at path
 * (created 0640 if missing).  Returns 0 or a negative errno. */
int log_open_file(const char *path);
/* Reopens that file (SIGHUP, after logrotate moved it); no-op without one. */
void log_reopen(void);

#define log_err(...) log_msg(LOG_ERR_, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARNING_, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_NOTICE_, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO_, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG_, __VA_ARGS__)

#endif /* LARDER_LOG_H */
