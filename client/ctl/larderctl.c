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
#include <unistd.h>

#include "ctl.h"

const char *ctl_socket;

static void usage(FILE *out) {
  fputs(
      "usage: larderctl [--socket PATH] [--json] COMMAND [OPTIONS]\n"
      "\n"
      "The daemon (socket: --socket, else $LARDER_SOCKET, else " LARDER_DEFAULT_SOCKET
      "):\n"
      "  status                           is larderd up: version, uptime, config, cache\n"
      "  stats [--watch [--interval S]]   cache, fetches, clients, stage times and what\n"
      "                                   limits throughput right now\n"
      "  clients                          the connected trainers and their streams\n"
      "  ls [PREFIX]                      cached objects: identity, bytes, entries, last use\n"
      "  evict OBJECT... | --prefix P | --dataset SOURCE | --all  [--dry-run]\n"
      "                                   drop cached data (streams keep working)\n"
      "  prefetch SOURCE... [--columns a,b] [--unit-rows N]\n"
      "                                   warm the cache before training (resumable)\n"
      "  verify                           check every cached value's checksum\n"
      "  reload                           reload the daemon's configuration\n"
      "  config                           the configuration in effect\n"
      "  (evict, prefetch, verify, reload and config need root or the admin group)\n"
      "\n"
      "Parquet files (local paths directly; URLs through the daemon):\n"
      "  inspect PATH|URL [--json]        schema, row groups and column chunks\n"
      "  cat PATH|URL [--columns a,b.c] [--offset N] [--limit N] [--no-verify-crc]\n"
      "                                   rows as JSON Lines\n"
      "\n"
      "--json prints one JSON object (JSON Lines for stats --watch and prefetch).\n"
      "Exit status: 0 success, 1 failure, 2 usage error.\n"
      "Run 'larderctl COMMAND --help' for a command's options.\n",
      out);
}

/* A local path as the daemon must see it: absolute (the daemon's working
 * directory is not ours).  URLs and absolute paths are kept; globs stay
 * globs.  malloc'd. */
static char *abs_source(const char *s) {
  if (strstr(s, "://") || s[0] == '/') return strdup(s);
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == NULL) return strdup(s);
  while (s[0] == '.' && s[1] == '/') s += 2;
  size_t len = strlen(cwd) + strlen(s) + 2;
  char *out = malloc(len);
  if (out) snprintf(out, len, "%s/%s", cwd, strcmp(s, ".") == 0 ? "" : s);
  return out;
}

static int parse_count(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < 0) return -1;
  *out = v;
  return 0;
}

static int global_json;

/* The options every daemon command takes after its name too. */
static int common_option(int argc, char **argv, int *i, int *json) {
  const char *a = argv[*i];
  if (strcmp(a, "--json") == 0) {
    *json = 1;
    return 1;
  }
  if (strcmp(a, "--socket") == 0 && *i + 1 < argc) {
    ctl_socket = argv[++*i];
    return 1;
  }
  if (strncmp(a, "--socket=", 9) == 0) {
    ctl_socket = a + 9;
    return 1;
  }
  return 0;
}

static int cmd_inspect(int argc, char **argv) {
  int json = global_json;
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (common_option(argc, argv, &i, &json)) continue;
    else if (strcmp(argv[i], "--help") == 0) {
      puts(
          "usage: larderctl inspect PATH|URL [--json]\n"
          "URLs (http://, https://, s3://) are read by the daemon, within its allowlist.");
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
    fprintf(stderr, "usage: larderctl inspect PATH|URL [--json]\n");
    return 2;
  }
  if (strstr(path, "://")) return ctl_inspect_remote(path, json);
  return ctl_cmd_inspect_local(path, json);
}

static int cmd_cat(int argc, char **argv) {
  const char *path = NULL, *columns = NULL;
  int max_chunk_given = 0;
  int64_t offset = 0, limit = -1;
  pq_options opts;
  pq_options_init(&opts);
  int json_unused = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = NULL;
    if (common_option(argc, argv, &i, &json_unused)) continue;
    if ((strcmp(a, "--columns") == 0 || strcmp(a, "--offset") == 0 || strcmp(a, "--limit") == 0 ||
         strcmp(a, "--max-chunk-bytes") == 0)) {
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
      max_chunk_given = 1;
    } else if (strcmp(a, "--no-verify-crc") == 0) {
      opts.verify_crc = 0;
    } else if (strcmp(a, "--help") == 0) {
      puts(
          "usage: larderctl cat PATH|URL [--columns a,b.c] [--offset N] [--limit N]\n"
          "                          [--no-verify-crc] [--max-chunk-bytes N]\n"
          "URLs (http://, https://, s3://) are read by the daemon, within its allowlist.");
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
    fprintf(stderr, "usage: larderctl cat PATH|URL [--columns a,b.c] [--offset N] [--limit N]\n");
    return 2;
  }
  if (strstr(path, "://"))
    return ctl_cat_remote(path, columns, offset, limit, !opts.verify_crc,
                          max_chunk_given ? opts.max_chunk_decoded_bytes : 0);
  return ctl_cat_local(path, columns, offset, limit, &opts);
}

/* Usage lines of the daemon commands. */
static const char *const usage_of[][2] = {
    {"status",
     "larderctl status [--json]\nWhether larderd is up: version, uptime, config file, socket, "
     "cache.\nExit status 1 when it is not running."},
    {"stats",
     "larderctl stats [--json] [--watch [--interval SECONDS] [--count N]]\n"
     "Cache use and hit ratio per dataset, fetches, per-client batches/s, MB/s and\n"
     "stall, running jobs, the stages and what limits throughput right now.  Every\n"
     "rate covers one window (the last few seconds); a stage shows its time per\n"
     "second of it (s/s: how many requests or workers were at it on average).\n"
     "--watch refreshes in place (JSON Lines with --json)."},
    {"clients",
     "larderctl clients [--json]\nThe connected trainers and their streams: your own, or "
     "everyone's when an\n"
     "admin asks (root, the daemon's user, admin_group)."},
    {"ls",
     "larderctl ls [PREFIX] [--json]\nCached objects (files and URLs): id, identity, bytes, "
     "entries, last use: those\n"
     "your open streams read, or all of them when an admin asks."},
    {"evict",
     "larderctl evict OBJECT... | --prefix URL-OR-PATH | --dataset SOURCE... | --all\n"
     "                [--dry-run] [--json]\n"
     "Drops cached data and reports the bytes freed.  OBJECT is an id or a name\n"
     "from `larderctl ls`; --dataset takes the sources as trainers name them\n"
     "(paths, globs, directories, URLs, S3 prefixes).  Streams reading it keep\n"
     "working: what they need again is fetched and decoded again."},
    {"prefetch",
     "larderctl prefetch SOURCE... [--columns a,b] [--unit-rows N]\n"
     "                  [--partitions P --nodes N --node n --seed S] [--json]\n"
     "Warms the cache with a dataset before training: a progress bar on a terminal\n"
     "(plain lines otherwise, JSON Lines with --json).  Resumable: what is cached\n"
     "already is skipped, so running it again continues where it stopped.  Use the\n"
     "columns and unit_rows the trainers use: the cache is per column and unit.\n"
     "With --partitions, only the row groups of node n's partitions (of N nodes),\n"
     "as streams with that seed and partitions cut them."},
    {"verify",
     "larderctl verify [--json]\nReads every cached value, checks its checksum and drops the bad "
     "ones."},
    {"reload",
     "larderctl reload [--json]\nReloads the daemon's configuration (like SIGHUP) and says what "
     "changed."},
    {"config", "larderctl config [--json]\nThe configuration in effect (secrets hidden)."},
};

static const char *usage_for(const char *cmd) {
  for (size_t i = 0; i < sizeof(usage_of) / sizeof(usage_of[0]); i++)
    if (strcmp(usage_of[i][0], cmd) == 0) return usage_of[i][1];
  return "";
}

static int usage_error(const char *cmd, const char *fmt, const char *arg) {
  fprintf(stderr, "larderctl %s: ", cmd);
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\nusage: %s\n", usage_for(cmd));
  return 2;
}

static int cmd_status(int argc, char **argv) {
  int json = global_json;
  for (int i = 1; i < argc; i++) {
    if (common_option(argc, argv, &i, &json)) continue;
    if (strcmp(argv[i], "--help") == 0) return puts(usage_for("status")), 0;
    return usage_error("status", "unexpected argument %s", argv[i]);
  }
  return ctl_cmd_status(json);
}

static int cmd_stats(int argc, char **argv) {
  int json = global_json, watch = 0;
  double interval = 1;
  long count = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (common_option(argc, argv, &i, &json)) continue;
    if (strcmp(a, "--help") == 0) return puts(usage_for("stats")), 0;
    if (strcmp(a, "--watch") == 0 || strcmp(a, "-w") == 0) {
      watch = 1;
    } else if (strcmp(a, "--interval") == 0 || strncmp(a, "--interval=", 11) == 0 ||
               strcmp(a, "--count") == 0 || strncmp(a, "--count=", 8) == 0) {
      const char *v = strchr(a, '=');
      if (v) v++;
      else if (i + 1 < argc) v = argv[++i];
      else return usage_error("stats", "%s needs a value", a);
      char *end;
      if (a[2] == 'i') {
        interval = strtod(v, &end);
        if (*end || !(interval >= 0.1 && interval <= 3600))
          return usage_error("stats", "bad --interval %s (0.1 to 3600 seconds)", v);
      } else {
        count = strtol(v, &end, 10);
        if (*end || count < 1) return usage_error("stats", "bad --count %s", v);
      }
      watch = 1;
    } else {
      return usage_error("stats", "unexpected argument %s", a);
    }
  }
  return ctl_cmd_stats(json, watch, interval, count);
}

/* clients, ls, verify, reload, config: options, then at most max_pos words. */
static int cmd_plain(int argc, char **argv, size_t max_pos) {
  const char *cmd = argv[0];
  int json = global_json;
  char *pos[4];
  size_t n = 0;
  for (int i = 1; i < argc; i++) {
    if (common_option(argc, argv, &i, &json)) continue;
    if (strcmp(argv[i], "--help") == 0) return puts(usage_for(cmd)), 0;
    if (argv[i][0] == '-' || n >= max_pos)
      return usage_error(cmd, "unexpected argument %s", argv[i]);
    pos[n++] = argv[i];
  }
  /* ls PREFIX: a relative local prefix is relative to us, not the daemon. */
  char *abs = n && strstr(pos[0], "://") == NULL && pos[0][0] != '/' ? abs_source(pos[0]) : NULL;
  if (abs) pos[0] = abs;
  int rc = ctl_cmd_simple(cmd, pos, n, json, 0);
  free(abs);
  return rc;
}

static int cmd_clients(int argc, char **argv) { return cmd_plain(argc, argv, 0); }
static int cmd_ls(int argc, char **argv) { return cmd_plain(argc, argv, 1); }
static int cmd_verify(int argc, char **argv) { return cmd_plain(argc, argv, 0); }
static int cmd_reload(int argc, char **argv) { return cmd_plain(argc, argv, 0); }
static int cmd_config(int argc, char **argv) { return cmd_plain(argc, argv, 0); }

/* Builds "--name=value" for the request. */
static char *opt_arg(const char *name, const char *value) {
  size_t len = strlen(name) + strlen(value) + 4;
  char *s = malloc(len);
  if (s) snprintf(s, len, "--%s=%s", name, value);
  return s;
}

static void free_args(char **args, size_t n) {
  for (size_t i = 0; i < n; i++) free(args[i]);
  free(args);
}

static int cmd_evict(int argc, char **argv) {
  int json = global_json, dry = 0, all = 0;
  char **args = calloc((size_t)argc + 2, sizeof(char *));
  size_t n = 0;
  int modes = 0, objects = 0, datasets = 0, prefixes = 0;
  if (args == NULL) return 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (common_option(argc, argv, &i, &json)) continue;
    if (strcmp(a, "--help") == 0) {
      free_args(args, n);
      return puts(usage_for("evict")), 0;
    }
    if (strcmp(a, "--dry-run") == 0 || strcmp(a, "-n") == 0) {
      dry = 1;
    } else if (strcmp(a, "--all") == 0) {
      all = 1;
    } else if (strcmp(a, "--prefix") == 0 || strncmp(a, "--prefix=", 9) == 0 ||
               strcmp(a, "--dataset") == 0 || strncmp(a, "--dataset=", 10) == 0) {
      int is_prefix = a[2] == 'p';
      const char *v = strchr(a, '=');
      if (v) v++;
      else if (i + 1 < argc) v = argv[++i];
      else {
        free_args(args, n);
        return usage_error("evict", "%s needs a value", a);
      }
      if (*v == '\0') {
        free_args(args, n);
        return usage_error("evict", "%s needs a value", a);
      }
      if (is_prefix && prefixes++) {
        free_args(args, n);
        return usage_error("evict", "one --prefix at a time%s", "");
      }
      datasets += !is_prefix;
      /* A local prefix keeps its trailing slash. */
      char *abs = is_prefix && strstr(v, "://") == NULL && v[0] != '/' ? abs_source(v) : NULL;
      if (!is_prefix) abs = abs_source(v);
      args[n++] = opt_arg(is_prefix ? "prefix" : "dataset", abs ? abs : v);
      free(abs);
      /* More sources may follow a --dataset, as words. */
      while (!is_prefix && i + 1 < argc && argv[i + 1][0] != '-') {
        abs = abs_source(argv[++i]);
        args[n++] = abs ? opt_arg("dataset", abs) : NULL;
        free(abs);
      }
    } else if (a[0] == '-') {
      free_args(args, n);
      return usage_error("evict", "unknown option %s", a);
    } else {
      /* An id from ls, or an object's name (a path made absolute). */
      args[n++] = strchr(a, '/') ? abs_source(a) : strdup(a);
      objects = 1;
    }
  }
  if (all) args[n++] = strdup("--all");
  modes = all + (prefixes > 0) + (datasets > 0) + objects;
  for (size_t i = 0; i < n; i++)
    if (args[i] == NULL) {
      free_args(args, n);
      return 1;
    }
  if (modes != 1) {
    free_args(args, n);
    return usage_error("evict", "%s",
                       modes ? "name what to evict one way only" : "name what to evict");
  }
  int rc = ctl_cmd_simple("evict", args, n, json, dry);
  free_args(args, n);
  return rc;
}

static int cmd_prefetch(int argc, char **argv) {
  int json = global_json;
  char **args = calloc((size_t)argc + 2, sizeof(char *));
  size_t n = 0, sources = 0;
  if (args == NULL) return 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (common_option(argc, argv, &i, &json)) continue;
    if (strcmp(a, "--help") == 0) {
      free_args(args, n);
      return puts(usage_for("prefetch")), 0;
    }
    static const char *const valued[] = {"columns", "unit-rows", "partitions",
                                         "nodes",   "node",      "seed"};
    const char *key = NULL;
    for (size_t k = 0; k < sizeof(valued) / sizeof(valued[0]) && key == NULL; k++) {
      size_t kl = strlen(valued[k]);
      if (strncmp(a, "--", 2) == 0 && strncmp(a + 2, valued[k], kl) == 0 &&
          (a[2 + kl] == '\0' || a[2 + kl] == '='))
        key = valued[k];
    }
    if (key) {
      const char *v = strchr(a, '=');
      if (v) v++;
      else if (i + 1 < argc) v = argv[++i];
      else {
        free_args(args, n);
        return usage_error("prefetch", "%s needs a value", a);
      }
      args[n++] = opt_arg(key, v);
    } else if (a[0] == '-' && a[1]) {
      free_args(args, n);
      return usage_error("prefetch", "unknown option %s", a);
    } else {
      args[n++] = abs_source(a);
      sources++;
    }
    if (args[n - 1] == NULL) {
      free_args(args, n);
      return 1;
    }
  }
  if (sources == 0) {
    free_args(args, n);
    return usage_error("prefetch", "name the dataset%s", "");
  }
  int rc = ctl_cmd_prefetch(args, n, json);
  free_args(args, n);
  return rc;
}

typedef struct ctl_command {
  const char *name;
  int (*fn)(int argc, char **argv);
} ctl_command;

static const ctl_command commands[] = {
    {"inspect", cmd_inspect}, {"cat", cmd_cat},           {"status", cmd_status},
    {"stats", cmd_stats},     {"clients", cmd_clients},   {"ls", cmd_ls},
    {"evict", cmd_evict},     {"prefetch", cmd_prefetch}, {"verify", cmd_verify},
    {"reload", cmd_reload},   {"config", cmd_config},     {NULL, NULL},
};

int main(int argc, char **argv) {
  int i = 1;
  /* Global options come before the command. */
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0 || strcmp(a, "help") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(a, "--version") == 0) {
      puts("larderctl 0.1.0");
      return 0;
    }
    if (strcmp(a, "--json") == 0) {
      global_json = 1;
    } else if (strcmp(a, "--socket") == 0 && i + 1 < argc) {
      ctl_socket = argv[++i];
    } else if (strncmp(a, "--socket=", 9) == 0) {
      ctl_socket = a + 9;
    } else {
      fprintf(stderr, "larderctl: unknown option %s\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (i >= argc) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[i], "help") == 0) {
    usage(stdout);
    return 0;
  }
  for (const ctl_command *c = commands; c->name; c++)
    if (strcmp(argv[i], c->name) == 0) return c->fn(argc - i, argv + i);
  fprintf(stderr, "larderctl: unknown command '%s'\n", argv[i]);
  usage(stderr);
  return 2;
}
