/*
 * main.c: larderd's entry point: command line, configuration, the cache,
 * then the server loop.
 *
 *   larderd [--config PATH] [--key=value ...] [--help] [--help-config]
 *           [--version]
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "server.h"

#define DEFAULT_CONFIG "/etc/larder/larderd.conf"

static void usage(FILE *out) {
  fprintf(out,
          "usage: larderd [--config PATH] [--KEY=VALUE ...]\n"
          "\n"
          "Serves shuffled training batches from Parquet shards to trainers on this\n"
          "host.  Settings come from %s (or --config) and\n"
          "--KEY=VALUE flags; `larderd --help-config` lists every key.\n",
          DEFAULT_CONFIG);
}

int main(int argc, char **argv) {
  server_t *srv = calloc(1, sizeof(*srv));
  if (srv == NULL || config_defaults(&srv->cfg) != 0) {
    fprintf(stderr, "larderd: out of memory\n");
    return 1;
  }
  const char *config_path = NULL;
  int explicit_config = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(argv[i], "--help-config") == 0) {
      config_print_reference(stdout);
      return 0;
    }
    if (strcmp(argv[i], "--version") == 0) {
      printf("larderd %s\n", LARDERD_VERSION);
      return 0;
    }
    if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
      config_path = argv[++i];
      explicit_config = 1;
    } else if (strncmp(argv[i], "--config=", 9) == 0) {
      config_path = argv[i] + 9;
      explicit_config = 1;
    }
  }
  char err[512];
  if (config_path == NULL) config_path = DEFAULT_CONFIG;
  if (config_load_file(&srv->cfg, config_path, !explicit_config, err, sizeof(err)) != 0) {
    fprintf(stderr, "larderd: %s\n", err);
    return 2;
  }
  if (srv->cfg.path) srv->config_path = strdup(srv->cfg.path);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--config") == 0) {
      i++;
      continue;
    }
    if (strncmp(a, "--config=", 9) == 0) continue;
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "larderd: unexpected argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
    const char *eq = strchr(a, '=');
    char key[128];
    const char *value;
    if (eq) {
      snprintf(key, sizeof(key), "%.*s", (int)(eq - a - 2), a + 2);
      value = eq + 1;
    } else if (i + 1 < argc) {
      snprintf(key, sizeof(key), "%s", a + 2);
      value = argv[++i];
    } else {
      fprintf(stderr, "larderd: %s needs a value\n", a);
      return 2;
    }
    if (config_set(&srv->cfg, key, value, err, sizeof(err)) != 0) {
      fprintf(stderr, "larderd: %s\n", err);
      return 2;
    }
  }
  log_set_level(srv->cfg.log_level);
  /* Units and cache values are megabytes each and come and go constantly.
   * glibc would map and unmap each one, paying page faults on every reuse;
   * keep freed memory in the heap instead (bounded by the peak, which
   * memory_limit bounds). */
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  mallopt(M_TOP_PAD, 64 << 20);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  srv->workers = srv->cfg.workers ? (int)srv->cfg.workers : (int)(cores > 0 ? cores : 2);
  /* libuv sizes its thread pool from the environment on first use. */
  char n[16];
  snprintf(n, sizeof(n), "%d", srv->workers);
  setenv("UV_THREADPOOL_SIZE", n, 1);

  store_options_t so;
  store_options_init(&so);
  so.dir = srv->cfg.cache_dir;
  so.capacity_bytes = srv->cfg.cache_capacity;
  so.idle_evict_s = (uint32_t)srv->cfg.cache_idle_evict;
  int rc = store_open(&so, &srv->store, err, sizeof(err));
  if (rc) {
    log_err("cannot open the cache in %s: %s", srv->cfg.cache_dir, err);
    return 1;
  }
  int status = server_run(srv);
  store_close(srv->store);
  log_notice("stopped");
  config_free(&srv->cfg);
  free(srv->config_path);
  free(srv);
  return status;
}
