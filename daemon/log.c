/*
 * log.c: priority-prefixed lines on stderr.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "log.h"

static volatile int current_level = LOG_INFO_;

int log_level_parse(const char *name) {
  static const struct {
    const char *name;
    int level;
  } names[] = {{"err", LOG_ERR_},      {"error", LOG_ERR_},     {"warning", LOG_WARNING_},
               {"warn", LOG_WARNING_}, {"notice", LOG_NOTICE_}, {"info", LOG_INFO_},
               {"debug", LOG_DEBUG_}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (strcasecmp(name, names[i].name) == 0) return names[i].level;
  return -1;
}

void log_set_level(int level) { current_level = level; }
int log_get_level(void) { return current_level; }

void log_msg(int level, const char *fmt, ...) {
  if (level > current_level) return;
  char line[2048];
  int n = snprintf(line, sizeof(line), "<%d>", level);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m < 0) return;
  size_t len = (size_t)n + (size_t)m;
  if (len > sizeof(line) - 2) len = sizeof(line) - 2;
  line[len++] = '\n';
  ssize_t w = write(2, line, len);
  (void)w;
}

static char log_path[4096];

int log_open_file(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) return -errno;
  if (dup2(fd, 2) < 0 || dup2(fd, 1) < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  close(fd);
  if (path != log_path) snprintf(log_path, sizeof(log_path), "%s", path);
  return 0;
}

void log_reopen(void) {
  if (log_path[0] == '\0') return;
  int rc = log_open_file(log_path);
  if (rc) log_msg(LOG_WARNING_, "cannot reopen the log file %s: %s", log_path, strerror(-rc));
}
