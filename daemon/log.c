/*
 * log.c: priority-prefixed lines on stderr.
 */
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
  } names[] = {{"err", LOG_ERR_},       {"error", LOG_ERR_}, {"warning", LOG_WARNING_},
               {"warn", LOG_WARNING_},  {"notice", LOG_NOTICE_}, {"info", LOG_INFO_},
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
