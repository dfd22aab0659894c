/*
 * larderctl.c: the admin CLI.  Parses the command line and dispatches to
 * the command files (ctl_*.c).
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

int ctl_sb_puts(pq_strbuf_t *sb, const char *s) {
  size_t n = strlen(s);
  if (sb->len + n + 1 > sb->cap) {
    size_t cap = sb->cap ? sb->cap : 256;
    while (cap < sb->len + n + 1) cap *= 2;
    char *p = realloc(sb->data, cap);
    if (p == NULL) return LARDER_ENOMEM;
    sb->data = p;
    sb->cap = cap;
  }
  memcpy(sb->data + sb->len, s, n + 1);
  sb->len += n;
  return 0;
}

int ctl_sb_printf(pq_strbuf_t *sb, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  int n = vsnprintf(small, sizeof(small), fmt, ap);
  va_end(ap);
  if (n < 0) return LARDER_EINVAL;
  if ((size_t)n < sizeof(small)) return ctl_sb_puts(sb, small);
  char *big = malloc((size_t)n + 1);
  if (big == NULL) return LARDER_ENOMEM;
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  int rc = ctl_sb_puts(sb, big);
  free(big);
  return rc;
}

static void usage(FILE *out) {
  fputs(
      "usage: larderctl COMMAND [OPTIONS]\n"
      "\n"
      "Parquet files (local paths, no daemon needed):\n"
      "  inspect PATH [--json]            schema, row groups and column chunks\n"
      "  cat PATH [--columns a,b.c] [--offset N] [--limit N] [--no-verify-crc]\n"
      "                                   rows as JSON Lines\n"
      "\n"
      "Run 'larderctl COMMAND --help' for a command's options.\n",
      out);
}

static int parse_count(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < 0) return -1;
  *out = v;
  return 0;
}

static int cmd_inspect(int argc, char **argv) {
  int json = 0;
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (strcmp(argv[i], "--help") == 0) {
      puts("usage: larderctl inspect PATH [--json]");
      return 0;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "larderctl inspect: unknown option %s\n", argv[i]);
      return 2;
    } else if (path == NULL) path = argv[i];
    else {
      fprintf(stderr, "larderctl inspect: one path at a time\n");
      return 2;
    }
  }
  if (path == NULL) {
    fprintf(stderr, "usage: larderctl inspect PATH [--json]\n");
    return 2;
  }
  return ctl_cmd_inspect_local(path, json);
}

static int cmd_cat(int argc, char **argv) {
  const char *path = NULL, *columns = NULL;
  int64_t offset = 0, limit = -1;
  pq_options opts;
  pq_options_init(&opts);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = NULL;
    if ((strcmp(a, "--columns") == 0 || strcmp(a, "--offset") == 0 ||
         strcmp(a, "--limit") == 0 || strcmp(a, "--max-chunk-bytes") == 0)) {
      if (i + 1 >= argc) {
        fprintf(stderr, "larderctl cat: %s needs a value\n", a);
        return 2;
      }
      val = argv[++i];
    } else if (strncmp(a, "--columns=", 10) == 0 || strncmp(a, "--offset=", 9) == 0 ||
               strncmp(a, "--limit=", 8) == 0) {
      val = strchr(a, '=') + 1;
    }
    if (strncmp(a, "--columns", 9) == 0 && val) columns = val;
    else if (strncmp(a, "--offset", 8) == 0 && val) {
      if (parse_count(val, &offset)) {
        fprintf(stderr, "larderctl cat: bad --offset %s\n", val);
        return 2;
      }
    } else if (strncmp(a, "--limit", 7) == 0 && val) {
      if (parse_count(val, &limit)) {
        fprintf(stderr, "larderctl cat: bad --limit %s\n", val);
        return 2;
      }
    } else if (strcmp(a, "--max-chunk-bytes") == 0 && val) {
      int64_t v;
      if (parse_count(val, &v) || v == 0) {
        fprintf(stderr, "larderctl cat: bad --max-chunk-bytes %s\n", val);
        return 2;
      }
      opts.max_chunk_decoded_bytes = (uint64_t)v;
    } else if (strcmp(a, "--no-verify-crc") == 0) {
      opts.verify_crc = 0;
    } else if (strcmp(a, "--help") == 0) {
      puts("usage: larderctl cat PATH [--columns a,b.c] [--offset N] [--limit N]\n"
           "                      [--no-verify-crc] [--max-chunk-bytes N]");
      return 0;
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "larderctl cat: unknown option %s\n", a);
      return 2;
    } else if (path == NULL) {
      path = a;
    } else {
      fprintf(stderr, "larderctl cat: one path at a time\n");
      return 2;
    }
  }
  if (path == NULL) {
    fprintf(stderr, "usage: larderctl cat PATH [--columns a,b.c] [--offset N] [--limit N]\n");
    return 2;
  }
  return ctl_cat_local(path, columns, offset, limit, &opts);
}

typedef struct ctl_command {
  const char *name;
  int (*fn)(int argc, char **argv);
} ctl_command;

static const ctl_command commands[] = {
    {"inspect", cmd_inspect},
    {"cat", cmd_cat},
    {NULL, NULL},
};

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const ctl_command *c = commands; c->name; c++)
    if (strcmp(argv[1], c->name) == 0) return c->fn(argc - 1, argv + 1);
  fprintf(stderr, "larderctl: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
