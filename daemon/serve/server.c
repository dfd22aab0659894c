/*
 * server.c: the listening socket, signals, housekeeping and shutdown.
 *
 * Shutdown (SIGTERM, SIGINT): stop accepting, tell every stream's client
 * with an Error (LARDER_ESHUTDOWN), flush and close the connections, wait
 * for the thread-pool tasks that are running (a task cannot be interrupted,
 * and the cache must only close after its last write), then close the cache
 * cleanly.  Whatever the cache held stays consistent: every unit was
 * written in one atomic batch.
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "fetch/awscreds.h"
#include "cred.h"
#include "log.h"
#include "serve/metrics.h"
#include "serve/admin.h"
#include "serve/conn.h"
#include "serve/cuda.h"
#include "serve/stream.h"
#include "serve/units.h"
#include "serve/server.h"
#include "util.h"

/* Trainers' wait fractions that turn the workers' boost on and off, over
 * at least BOOST_WINDOW_NS of reports. */
#define BOOST_ON_FRACTION 0.25
#define BOOST_OFF_FRACTION 0.10
#define BOOST_WINDOW_NS (100ull * 1000000ull)
#define BOOST_IDLE_NS (1000ull * 1000000ull)

static void set_boost(server_t *srv, int on) {
  if (srv->boost_on == on || srv->boost_refused || srv->pool == NULL) return;
  int rc = work_pool_boost(srv->pool, on);
  if (rc == LARDER_EACCES) {
    srv->boost_refused = 1;
    log_info(
        "trainers are waiting, but the workers cannot run at the daemon's priority "
        "(the system forbids lowering their niceness: give the service LimitNICE=+0 "
        "or CAP_SYS_NICE, or set worker_nice = 0); they stay %d nicer",
        (int)srv->cfg.worker_nice);
    return;
  }
  if (rc) return;
  srv->boost_on = on;
  STATS_SET(&srv->stats, workers_boosted, on);
  if (on) STATS_ADD(&srv->stats, worker_boosts, 1);
}

void server_trainer_report(server_t *srv, uint64_t wait_ns, uint64_t compute_ns) {
  srv->boost_wait_ns += wait_ns;
  srv->boost_compute_ns += compute_ns;
  uint64_t now = util_now_ns();
  if (srv->boost_from_ns == 0) srv->boost_from_ns = now;
  if (now - srv->boost_from_ns < BOOST_WINDOW_NS) return;
  uint64_t total = srv->boost_wait_ns + srv->boost_compute_ns;
  double waiting = total ? (double)srv->boost_wait_ns / (double)total : 0;
  if (waiting > BOOST_ON_FRACTION) set_boost(srv, 1);
  else if (waiting < BOOST_OFF_FRACTION) set_boost(srv, 0);
  srv->boost_wait_ns = srv->boost_compute_ns = 0;
  srv->boost_from_ns = now;
}

/* From the tick: no report for a while (no trainer, or trainers that hold
 * their batches) drops the boost. */
static void expire_boost(server_t *srv) {
  if (srv->boost_on && util_now_ns() - srv->boost_from_ns > BOOST_IDLE_NS) {
    set_boost(srv, 0);
    srv->boost_wait_ns = srv->boost_compute_ns = 0;
    srv->boost_from_ns = 0;
  }
}

/* A resolution under way (server_resolve): the caller's callback, and the
 * server whose count it is in. */
typedef struct resolve {
  server_t *srv;
  remote_cb cb;
  void *arg;
} resolve_t;

static void on_resolve_done(int status, const char *message, remote_object_t *objects, size_t count,
                            void *arg) {
  resolve_t *r = arg;
  r->srv->resolves_in_flight--;
  remote_cb cb = r->cb;
  void *cb_arg = r->arg;
  free(r);
  cb(status, message, objects, count, cb_arg);
}

int server_resolve(server_t *srv, const char *const *sources, size_t n, remote_cb cb, void *arg) {
  resolve_t *r = malloc(sizeof(*r));
  if (r == NULL) return LARDER_ENOMEM;
  r->srv = srv;
  r->cb = cb;
  r->arg = arg;
  srv->resolves_in_flight++;
  int rc = remote_resolve(srv->fetch, srv->remote_footers, sources, n,
                          (uint32_t)srv->cfg.footer_guess, (uint32_t)64 << 20, on_resolve_done, r);
  if (rc) {
    srv->resolves_in_flight--;
    free(r);
  }
  return rc;
}

static void on_connection(uv_stream_t *listener, int status);

/*
 * Out of descriptors.  libuv retries a failed accept at once, and when its
 * own reserve descriptor is gone (taken by a worker or RocksDB the moment
 * libuv let it go) it retries for ever: the loop would spin, serve nobody,
 * and log each failure (gigabytes in minutes).  So the listener closes,
 * which ends that loop; the listening socket lives on in listen_spare, with
 * its backlog; and a timer opens a new listener on it once a descriptor is
 * free.  Connected clients are served meanwhile.  Tested by
 * daemon_robust_accept_out_of_fds.
 */
static void on_listener_closed(uv_handle_t *h) {
  server_t *srv = h->data;
  srv->accept_paused = 2;
}

static void on_relisten(uv_timer_t *t) {
  server_t *srv = t->data;
  if (srv->shutting_down || srv->accept_paused != 2) return;
  int fd = util_dup_cloexec(srv->listen_spare);
  if (fd < 0) {
    uv_timer_start(&srv->relisten, on_relisten, 250, 0);
    return;
  }
  uv_pipe_init(srv->loop, &srv->listener, 0);
  srv->listener.data = srv;
  int rc = uv_pipe_open(&srv->listener, fd);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&srv->listener, 128, on_connection);
  if (rc) {
    log_err("cannot listen again: %s", uv_strerror(rc));
    srv->accept_paused = 1;
    uv_close((uv_handle_t *)&srv->listener, on_listener_closed);
    uv_timer_start(&srv->relisten, on_relisten, 1000, 0);
    return;
  }
  srv->accept_paused = 0;
  srv->listening = 1;
  log_notice("accepting connections again");
}

static void pause_accepting(server_t *srv, int status) {
  if (!srv->listening || srv->listen_spare < 0) return;
  log_warn(
      "accept failed: %s: not accepting connections until a descriptor is free "
      "(raise LimitNOFILE)",
      uv_strerror(status));
  srv->listening = 0;
  srv->accept_paused = 1;
  uv_close((uv_handle_t *)&srv->listener, on_listener_closed);
  uv_timer_start(&srv->relisten, on_relisten, 250, 0);
}

/*
 * libuv accepts until the listening socket has nothing left, calling
 * on_connection for each, before it looks at any other descriptor.  A
 * client that connects and hangs up in a tight loop would keep it there:
 * the hang-ups of the connections already accepted would never be read, so
 * they would never be closed, and within seconds they would hold max_clients
 * and some 19,000 descriptors while every other client was refused.  So at most
 * ACCEPT_BURST connections are accepted per turn of the loop; the next one
 * waits, pending in libuv (which stops watching the listener until it is
 * accepted), for the turn after the loop has read and closed what is
 * ready.  Tested by daemon_robust_connect_churn.
 */
#define ACCEPT_BURST 32

static void on_connection(uv_stream_t *listener, int status) {
  server_t *srv = listener->data;
  if (status == UV_EMFILE || status == UV_ENFILE) {
    pause_accepting(srv, status);
    return;
  }
  if (status < 0) {
    log_warn("accept failed: %s", uv_strerror(status));
    return;
  }
  if (srv->accepts_this_turn >= ACCEPT_BURST) {
    srv->accept_deferred = 1;
    return;
  }
  srv->accepts_this_turn++;
  conn_accept(srv, listener);
}

/* Each turn of the loop, before it polls: a new burst, starting with the
 * connection left pending by the last one. */
static void accept_next_burst(server_t *srv) {
  srv->accepts_this_turn = 0;
  if (!srv->accept_deferred) return;
  srv->accept_deferred = 0;
  /* A listener closed meanwhile (out of descriptors, or shutdown) closed
   * the pending connection with it. */
  if (!srv->listening || srv->accept_paused || uv_is_closing((uv_handle_t *)&srv->listener)) return;
  srv->accepts_this_turn = 1;
  conn_accept(srv, (uv_stream_t *)&srv->listener);
}

/* Systemd socket activation: LISTEN_FDS names descriptors from 3 on. */
static int activated_fd(void) {
  const char *pid = getenv("LISTEN_PID");
  const char *fds = getenv("LISTEN_FDS");
  if (pid == NULL || fds == NULL || atoi(pid) != (int)getpid() || atoi(fds) < 1) return -1;
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  return 3;
}

static int listen_socket(server_t *srv) {
  uv_pipe_init(srv->loop, &srv->listener, 0);
  srv->listener.data = srv;
  int fd = activated_fd();
  int rc;
  /* The socket's path is then systemd's: it outlives this process, and a
   * restart finds it there (the daemon must never unlink it). */
  srv->socket_activated = fd >= 0;
  if (fd >= 0) {
    rc = uv_pipe_open(&srv->listener, fd);
    if (rc) {
      log_err("cannot use the socket systemd passed: %s", uv_strerror(rc));
      return LARDER_EIO;
    }
    log_info("listening on the socket systemd passed (fd %d)", fd);
  } else {
    const char *path = srv->cfg.socket;
    /* A stale socket from a crashed daemon would make bind fail; a live
     * daemon answers, and then this one must not steal its socket. */
    struct stat st;
    if (stat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
      int s = socket(AF_UNIX, SOCK_STREAM, 0);
      struct sockaddr_un addr;
      memset(&addr, 0, sizeof(addr));
      addr.sun_family = AF_UNIX;
      snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
      if (s >= 0 && connect(s, (struct sockaddr *)&addr, sizeof(addr)) == 0) {
        close(s);
        log_err("%s: another larderd is already listening there", path);
        return LARDER_EBUSY;
      }
      if (s >= 0) close(s);
      unlink(path);
    }
    /* Bound here rather than with uv_pipe_bind: libuv unlinks a path it
     * bound when the handle closes, and the listener closes and reopens
     * while the daemon is out of descriptors (pause_accepting). */
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(addr.sun_path)) {
      log_err("cannot bind %s: the path is longer than %zu bytes", path, sizeof(addr.sun_path) - 1);
      return LARDER_EIO;
    }
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
      log_err("cannot bind %s: %s", path, strerror(errno));
      if (lfd >= 0) close(lfd);
      return LARDER_EIO;
    }
    rc = uv_pipe_open(&srv->listener, lfd);
    if (rc) {
      log_err("cannot use the socket bound at %s: %s", path, uv_strerror(rc));
      close(lfd);
      return LARDER_EIO;
    }
    if (chmod(path, (mode_t)srv->cfg.socket_mode) != 0)
      log_warn("cannot set the mode of %s: %s", path, strerror(errno));
    log_info("listening on %s", path);
  }
  rc = uv_listen((uv_stream_t *)&srv->listener, 128, on_connection);
  if (rc) {
    log_err("cannot listen: %s", uv_strerror(rc));
    return LARDER_EIO;
  }
  srv->listening = 1;
  /* Before the workers start: they act as clients on local files. */
  cred_init();
  if (!cred_can_switch())
    log_notice(
        "local sources are served to uid %u and root alone: larderd lacks CAP_SETUID and "
        "CAP_SETGID, which it needs to open files as its other clients",
        (unsigned)geteuid());
  uv_os_fd_t lfd;
  if (uv_fileno((uv_handle_t *)&srv->listener, &lfd) == 0)
    srv->listen_spare = util_dup_cloexec(lfd);
  return 0;
}

/* ------------------------------------------------------------------------ */

static void on_tick(uv_timer_t *t);

static void flush_frames(void *arg) { conn_flush_all(arg); }

static void on_flush(uv_prepare_t *h) {
  conn_flush_all(h->data);
  accept_next_burst(h->data);
}

static void finish_shutdown(server_t *srv) {
  /* Called from the tick once no task is in flight (work_pool_pending), no
   * resolution is under way (server_resolve), no client is left and no
   * CUDA copy runs (cuda_copies_pending).
   * The fetches end first: their callbacks may still queue tasks, which the
   * pool then runs or cancels as it stops. */
  awscreds_stop(srv->awscreds);
  srv->awscreds = NULL;
  if (srv->fetch) {
    fetch_destroy(srv->fetch, NULL, NULL);
    srv->fetch = NULL;
  }
  if (srv->pool) {
    work_pool_stop(srv->pool);
    srv->pool = NULL;
  }
  cuda_set_closer(NULL, NULL);
  uv_timer_stop(&srv->tick);
  uv_close((uv_handle_t *)&srv->tick, NULL);
  uv_close((uv_handle_t *)&srv->relisten, NULL);
  uv_close((uv_handle_t *)&srv->flush, NULL);
  uv_close((uv_handle_t *)&srv->sig_term, NULL);
  uv_close((uv_handle_t *)&srv->sig_int, NULL);
  uv_close((uv_handle_t *)&srv->sig_hup, NULL);
  cuda_loop_stop();
}

static void begin_shutdown(server_t *srv, const char *why) {
  if (srv->shutting_down) return;
  srv->shutting_down = 1;
  srv->shutdown_ns = util_now_ns();
  log_notice("%s: shutting down", why);
  sd_notify(0, "STOPPING=1\nSTATUS=shutting down");
  admin_shutdown(srv); /* prefetch and cat jobs end */
  /* Fetches and their retries end now (fetch_shutdown): a stream open
   * waiting for a server must not hold the exit. */
  if (srv->fetch) fetch_shutdown(srv->fetch);
  metrics_stop(srv); /* the HTTP endpoint closes; the textfile stays */
  if (srv->listening || srv->accept_paused) {
    if (srv->listening) uv_close((uv_handle_t *)&srv->listener, NULL);
    srv->listening = 0;
    srv->accept_paused = 0;
    if (!srv->socket_activated && srv->cfg.socket) unlink(srv->cfg.socket);
  }
  if (srv->listen_spare >= 0) {
    close(srv->listen_spare);
    srv->listen_spare = -1;
  }
  for (conn_t *c = srv->conns; c; c = c->next) {
    while (c->streams) {
      stream_t *s = c->streams;
      stream_fail(s, LARDER_ESHUTDOWN, "the daemon is shutting down");
    }
  }
  /* Connections close after their Error frames have been written. */
  for (conn_t *c = srv->conns; c; c = c->next) conn_shutdown(c);
  uv_timer_start(&srv->tick, on_tick, 10, 10);
}

/*
 * A reload applies the command-line flags again on top of the file, as
 * main.c does at startup; they are read back from /proc/self/cmdline.
 * Built from the defaults and the file alone, the configuration would
 * revert every setting given as a flag (a --memory_limit=1G would become
 * 8G again) and report flags of restart-only keys (--socket, --cache_dir)
 * as changed.  Tested by daemon_reload_keeps_flags.
 */
static int reapply_flags(config_t *next, char *err, size_t errlen) {
  FILE *f = fopen("/proc/self/cmdline", "r");
  if (f == NULL) return 0;
  /* The whole command line, however long its flags' values. */
  size_t n = 0, cap = 65536;
  char *buf = malloc(cap);
  for (;;) {
    if (buf != NULL && n + 1 == cap) {
      char *more = realloc(buf, cap * 2);
      if (more == NULL) free(buf);
      buf = more;
      cap *= 2;
    }
    if (buf == NULL) break;
    size_t got = fread(buf + n, 1, cap - 1 - n, f);
    if (got == 0) break;
    n += got;
  }
  fclose(f);
  size_t argc = 0;
  char **argv = NULL;
  if (buf != NULL) {
    buf[n] = '\0';
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1) argc++;
    argv = malloc((argc ? argc : 1) * sizeof(char *));
  }
  if (buf == NULL || argv == NULL) {
    free(buf);
    snprintf(err, errlen, "out of memory reading the command line");
    return LARDER_ENOMEM;
  }
  argc = 0;
  for (size_t i = 0; i < n; i += strlen(buf + i) + 1) argv[argc++] = buf + i;
  int rc = 0;
  for (size_t i = 1; i < argc && rc == 0; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--config") == 0) {
      i++;
      continue;
    }
    if (strncmp(a, "--config=", 9) == 0 || strncmp(a, "--", 2) != 0) continue;
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
      continue;
    }
    /* A flag that held at startup fails now only when the file it names
     * (s3_secret_key_file, ...) cannot be read: the reload is refused. */
    rc = config_set(next, key, value, err, errlen);
  }
  explicit_bzero(buf, n); /* flags may hold secrets */
  free(argv);
  free(buf);
  return rc;
}

int server_apply_access(server_t *srv, char *err, size_t errlen) {
  acl_t *a;
  int rc = acl_create((const char *const *)srv->cfg.allow, srv->cfg.num_allow, srv->cfg.admin_group,
                      &a, err, errlen);
  if (rc) return rc;
  acl_free(srv->acl);
  srv->acl = a;
  return 0;
}

/* Whether the configuration names S3 keys itself: then they alone are
 * used, and the chain (awscreds.h) is not walked. */
static int explicit_keys(const config_t *c) {
  return (c->s3_access_key && *c->s3_access_key) || (c->s3_secret_key && *c->s3_secret_key);
}

static void explicit_credentials(const config_t *c, fetch_options_t *fo) {
  fo->s3_access_key = c->s3_access_key && *c->s3_access_key ? c->s3_access_key : NULL;
  fo->s3_secret_key = c->s3_secret_key && *c->s3_secret_key ? c->s3_secret_key : NULL;
  fo->s3_session_token = c->s3_session_token && *c->s3_session_token ? c->s3_session_token : NULL;
}

static void chain_options(const config_t *c, awscreds_options_t *ao) {
  memset(ao, 0, sizeof(*ao));
  ao->profile = c->s3_profile;
  ao->region = c->s3_region && *c->s3_region ? c->s3_region : "us-east-1";
  ao->sts_endpoint = c->s3_sts_endpoint;
  ao->refresh_margin_s =
      (uint32_t)(c->s3_credentials_refresh_margin > 86400 ? 86400
                                                          : c->s3_credentials_refresh_margin);
}

/* A value the refresher resolved: new requests sign with it, those in
 * flight keep what they were signed with (fetch_set_credentials).  Loop
 * thread. */
static void on_credentials(const awscreds_value_t *v, void *arg) {
  server_t *srv = arg;
  if (srv->fetch == NULL) return;
  if (fetch_set_credentials(srv->fetch, v->access_key, v->secret_key, v->session_token) != 0)
    log_err("out of memory; the S3 credentials stay as they were");
}

/* Starts the refresher for the chain's value v (access_key NULL: none;
 * resolve_now: the walk failed and is retried). */
static void start_refresher(server_t *srv, const awscreds_value_t *v, int resolve_now) {
  awscreds_options_t ao;
  chain_options(&srv->cfg, &ao);
  if (awscreds_start(srv->loop, &ao, v && v->access_key ? v : NULL, resolve_now, &srv->stats,
                     on_credentials, srv, &srv->awscreds) != 0)
    log_err("cannot start the S3 credential refresher; credentials will not be refreshed");
}

/* The gauge of seconds left to the credentials in force.  Loop thread. */
static void credentials_tick(server_t *srv) {
  if (srv->awscreds == NULL) return;
  char source[16];
  int64_t exp;
  awscreds_describe(srv->awscreds, source, sizeof(source), &exp);
  int64_t left = exp ? exp - (int64_t)time(NULL) : 0;
  STATS_SET(&srv->stats, credentials_expiry_seconds, left > 0 ? left : 0);
}

int server_reload(server_t *srv, char *summary, size_t len, char *changed_out, size_t changed_len,
                  char *restart_out, size_t restart_len) {
  config_t next;
  char err[512];
  summary[0] = '\0';
  if (changed_out && changed_len) changed_out[0] = '\0';
  if (restart_out && restart_len) restart_out[0] = '\0';
  if (config_defaults(&next) != 0) {
    snprintf(summary, len, "out of memory");
    return LARDER_ENOMEM;
  }
  if (srv->config_path) {
    if (config_load_file(&next, srv->config_path, 0, err, sizeof(err)) != 0) {
      log_err("reload: %s; keeping the current configuration", err);
      snprintf(summary, len, "%s; keeping the current configuration", err);
      config_free(&next);
      return LARDER_EINVAL;
    }
  }
  if (reapply_flags(&next, err, sizeof(err)) != 0 ||
      config_systemd_credentials(&next, err, sizeof(err)) != 0) {
    log_err("reload: %s; keeping the current configuration", err);
    snprintf(summary, len, "%s; keeping the current configuration", err);
    config_free(&next);
    return LARDER_EINVAL;
  }
  /* larder ACL: check the new rules before anything changes. */
  acl_t *check;
  if (acl_create((const char *const *)next.allow, next.num_allow, next.admin_group, &check, err,
                 sizeof(err)) != 0) {
    log_err("reload: %s; keeping the current configuration", err);
    snprintf(summary, len, "%s; keeping the current configuration", err);
    config_free(&next);
    return LARDER_EINVAL;
  }
  acl_free(check);
  log_reopen();
  char restart[512], changed[1024];
  config_apply_live_report(&srv->cfg, &next, restart, sizeof(restart), changed, sizeof(changed));
  if (changed_out && changed_len) snprintf(changed_out, changed_len, "%s", changed);
  if (restart_out && restart_len) snprintf(restart_out, restart_len, "%s", restart);
  config_free(&next);
  if (server_apply_access(srv, err, sizeof(err)) != 0) log_err("reload: %s", err);
  metrics_config_changed(srv);
  snprintf(summary, len, "reloaded %s; changed: %s%s%s",
           srv->config_path ? srv->config_path : "(no file)", changed[0] ? changed : "nothing",
           restart[0] ? "; these keys changed but need a restart: " : "", restart);
  log_set_level(srv->cfg.log_level);
  if (srv->store) store_set_capacity(srv->store, srv->cfg.cache_capacity);
  if (srv->stage) stage_set_capacity(srv->stage, srv->cfg.stage_capacity);
  if (srv->fetch) {
    fetch_set_limits(srv->fetch, (uint32_t)srv->cfg.fetch_inflight_per_host,
                     srv->cfg.fetch_inflight_auto, srv->cfg.fetch_inflight_bytes,
                     (uint32_t)srv->cfg.fetch_retries, (uint32_t)srv->cfg.fetch_retry_base_ms);
    /* The credentials are looked up again: the configuration's keys (their
     * files read again) at once; else the chain, off the loop, with the
     * options as they are now (s3_profile), its value in force for the
     * next request once it arrives.  Keys dropped from the configuration
     * are dropped at once. */
    if (explicit_keys(&srv->cfg)) {
      awscreds_stop(srv->awscreds);
      srv->awscreds = NULL;
      fetch_options_t fo;
      fetch_options_init(&fo);
      explicit_credentials(&srv->cfg, &fo);
      if (fetch_set_credentials(srv->fetch, fo.s3_access_key, fo.s3_secret_key,
                                fo.s3_session_token) != 0)
        log_err("reload: out of memory; the S3 credentials stay as they were");
    } else {
      if (srv->awscreds == NULL) fetch_set_credentials(srv->fetch, NULL, NULL, NULL);
      awscreds_stop(srv->awscreds);
      srv->awscreds = NULL;
      start_refresher(srv, NULL, 1);
    }
  }
  units_trim(srv);
  if (restart[0]) log_notice("reloaded; these keys changed but need a restart: %s", restart);
  else log_notice("reloaded the configuration");
  if (changed[0]) log_info("reload changed: %s", changed);
  return 0;
}

static void on_signal(uv_signal_t *h, int signum) {
  server_t *srv = h->data;
  if (signum == SIGHUP) {
    char summary[2048];
    server_reload(srv, summary, sizeof(summary), NULL, 0, NULL, 0);
  } else {
    begin_shutdown(srv, signum == SIGTERM ? "SIGTERM" : "SIGINT");
  }
}

/* A connection closes on shutdown once its queued frames are written, and
 * a client that never reads never lets them be written, so one such client
 * would keep the daemon from ever exiting.  After this grace period the
 * remaining connections are closed without flushing.  Tested by
 * daemon_robust_sigterm_streams. */
#define SHUTDOWN_GRACE_NS (5ull * 1000000000ull)

/* From the tick: entries that failed their checksum since the last report,
 * logged at most once a minute.  Each is dropped and rebuilt from the
 * sources, so trainers see nothing, and nothing else would tell an
 * operator that the cache's disk returns bad data. */
static void note_cache_faults(server_t *srv) {
  if (srv->store == NULL) return;
  uint64_t now = util_now_ns();
  if (srv->checksum_logged_ns && now - srv->checksum_logged_ns < 60ull * 1000000000ull) return;
  store_stats_t st;
  store_stats_get(srv->store, &st);
  if (st.checksum_failures <= srv->checksum_failures_logged) return;
  log_warn(
      "cache: %llu entries failed their checksum since %s (each dropped, and rebuilt "
      "from its source when read); the disk under %s may be failing: larderctl verify "
      "checks every entry",
      (unsigned long long)(st.checksum_failures - srv->checksum_failures_logged),
      srv->checksum_logged_ns ? "the last report" : "the start", srv->cfg.cache_dir);
  srv->checksum_failures_logged = st.checksum_failures;
  srv->checksum_logged_ns = now;
}

static void trim_work(work_t *w) {
  (void)w;
  malloc_trim(0);
}

static void trim_done(work_t *w, int cancelled) {
  (void)cancelled;
  server_t *srv = w->data;
  srv->trim_queued = 0;
}

/* Hands the heap that many freed footers left back to the system, on a
 * worker when none has batch work: glibc keeps it otherwise (a stream over
 * 20,000 small files left 2 GB of RSS after it closed, 109 MB after a
 * trim), and a trim of a large heap takes milliseconds the loop should not
 * spend.  Loop thread. */
static void trim_heap(server_t *srv) {
  if (srv->trim_queued || !footers_trim_due(srv->footers)) return;
  srv->trim_work.data = srv;
  if (work_queue_background(srv->pool, &srv->trim_work, trim_work, trim_done) == 0) {
    srv->trim_queued = 1;
  }
}

static void on_tick(uv_timer_t *t) {
  server_t *srv = t->data;
  if (srv->shutting_down) {
    if (srv->conns && util_now_ns() - srv->shutdown_ns > SHUTDOWN_GRACE_NS) {
      for (conn_t *c = srv->conns; c; c = c->next)
        if (!c->closing) {
          log_notice("client pid %d did not read its last frames; closing its connection",
                     (int)c->pid);
          conn_close(c);
        }
    }
    if (work_pool_pending(srv->pool) == 0 && srv->resolves_in_flight == 0 && srv->conns == NULL &&
        cuda_copies_pending() == 0)
      finish_shutdown(srv);
    return;
  }
  /* systemctl status shows this line (a no-op outside systemd). */
  uint64_t bytes = STATS_GET(&srv->stats, batch_bytes);
  sd_notifyf(0, "STATUS=%llu clients, %llu streams, %.1f GB delivered, %.0f MiB of units in memory",
             (unsigned long long)STATS_GET(&srv->stats, clients),
             (unsigned long long)STATS_GET(&srv->stats, streams), (double)bytes / 1e9,
             (double)srv->unit_bytes / 1048576.0);
  expire_boost(srv);
  units_expire_read_ahead(srv);
  units_trim(srv);
  units_retry(srv);
  conn_expire_partial(srv);
  cuda_reap();     /* CUDA regions of trainers that exited since (cuda.h) */
  admin_tick(srv); /* rate samples for larderctl stats */
  credentials_tick(srv);
  note_cache_faults(srv);
  trim_heap(srv);
}

/* ------------------------------------------------------------------------ */
/* Remote footers kept in the cache across restarts                         */

typedef struct footer_write {
  work_t work;
  store_t *store;
  stats_global_t *stats;
  char *url;
  uint8_t *rec; /* NULL: delete */
  size_t len;
} footer_write_t;

static void footer_write_work(work_t *w) {
  footer_write_t *fw = w->data;
  int rc = fw->rec ? store_footer_put(fw->store, fw->url, fw->rec, fw->len)
                   : store_footer_delete(fw->store, fw->url);
  /* A footer not stored is fetched again after a restart; nothing else. */
  if (rc && rc != LARDER_EINVAL)
    log_debug("cannot keep a remote footer in the cache: %s", larder_strerror(rc));
  if (rc == 0 && fw->rec) STATS_ADD(fw->stats, remote_footers_stored, 1);
}

static void footer_write_done(work_t *w, int status) {
  (void)status;
  footer_write_t *fw = w->data;
  free(fw->url);
  free(fw->rec);
  free(fw);
}

/* remote_footers_persist_cb: the write goes to a worker, off the loop. */
static void persist_footer(void *arg, const char *url, const void *rec, size_t len) {
  server_t *srv = arg;
  footer_write_t *fw = calloc(1, sizeof(*fw));
  if (fw == NULL) return;
  fw->store = srv->store;
  fw->stats = &srv->stats;
  fw->url = strdup(url);
  fw->rec = rec ? malloc(len ? len : 1) : NULL;
  fw->len = len;
  fw->work.data = fw;
  if (fw->url == NULL || (rec && fw->rec == NULL)) {
    footer_write_done(&fw->work, 0);
    return;
  }
  if (rec) memcpy(fw->rec, rec, len);
  if (work_queue(srv->pool, &fw->work, footer_write_work, footer_write_done) != 0)
    footer_write_done(&fw->work, 0);
}

typedef struct footer_load {
  remote_footers_t *set;
  char **drop; /* records the set did not take: deleted after the scan */
  size_t ndrop, cap;
} footer_load_t;

static int load_footer(void *arg, const char *url, const void *rec, size_t len) {
  footer_load_t *fl = arg;
  int rc = remote_footers_load(fl->set, url, rec, len);
  if (rc == LARDER_ENOMEM) return rc;
  if (rc == 0) return 0;
  /* Past the set's bound, or not a record it reads: deleted, so that the
   * records on disk stay within what the set keeps. */
  if (fl->ndrop == fl->cap) {
    size_t cap = fl->cap ? fl->cap * 2 : 16;
    char **d = realloc(fl->drop, cap * sizeof(*d));
    if (d == NULL) return LARDER_ENOMEM;
    fl->drop = d;
    fl->cap = cap;
  }
  if ((fl->drop[fl->ndrop] = strdup(url)) == NULL) return LARDER_ENOMEM;
  fl->ndrop++;
  return 0;
}

/* Puts the remote footers the cache kept back into the footer set (within
 * remote_footer_memory; the rest are deleted), and has the set keep the
 * cache up to date from now on.  Before the loop runs. */
static void keep_footers(server_t *srv) {
  if (srv->store == NULL || srv->cfg.remote_footer_memory == 0) return;
  footer_load_t fl = {srv->remote_footers, NULL, 0, 0};
  int n = store_footer_scan(srv->store, load_footer, &fl);
  for (size_t i = 0; i < fl.ndrop; i++) {
    store_footer_delete(srv->store, fl.drop[i]);
    free(fl.drop[i]);
  }
  free(fl.drop);
  n -= (int)fl.ndrop;
  if (n > 0) {
    STATS_ADD(&srv->stats, remote_footers_loaded, (uint64_t)n);
    log_info("%d remote footers kept in the cache by an earlier run", n);
  }
  remote_footers_set_persist(srv->remote_footers, persist_footer, srv);
}

static int start_fetcher(server_t *srv) {
  fetch_options_t fo;
  fetch_options_init(&fo);
  fo.creds = &srv->awscreds;
  const config_t *c = &srv->cfg;
  fo.max_inflight_per_host = (uint32_t)c->fetch_inflight_per_host;
  fo.inflight_auto = c->fetch_inflight_auto;
  fo.max_inflight_bytes = c->fetch_inflight_bytes;
  fo.max_retries = (uint32_t)c->fetch_retries;
  fo.retry_base_ms = (uint32_t)c->fetch_retry_base_ms;
  fo.connect_timeout_s = (uint32_t)c->fetch_connect_timeout;
  fo.low_speed_bytes = (uint32_t)c->fetch_low_speed_bytes;
  fo.low_speed_time_s = (uint32_t)c->fetch_low_speed_time;
  fo.max_whole_bytes = c->fetch_whole_bytes;
  fo.tls_verify = c->tls_verify;
  fo.ca_file = c->ca_file && *c->ca_file ? c->ca_file : NULL;
  fo.s3_region = c->s3_region && *c->s3_region ? c->s3_region : "us-east-1";
  fo.s3_endpoint = c->s3_endpoint && *c->s3_endpoint ? c->s3_endpoint : getenv("AWS_ENDPOINT_URL");
  fo.s3_path_style = c->s3_path_style;
  fo.s3_list_max_keys = (uint32_t)c->s3_list_max_keys;
  fo.stats = &srv->stats;
  /* The chain is walked here, before the loop runs, so that the first
   * streams find credentials in force; the refresher then keeps them
   * fresh off the loop. */
  awscreds_value_t v;
  memset(&v, 0, sizeof(v));
  int chain = !explicit_keys(c), rc = 0;
  if (chain) {
    awscreds_options_t ao;
    char err[512];
    chain_options(c, &ao);
    rc = awscreds_resolve(&ao, &v, err, sizeof(err));
    if (rc == 0)
      log_notice("S3 credentials from %s%s", v.source,
                 v.expiration ? ", temporary: refreshed before they expire" : "");
    else if (rc == LARDER_ENOENT) log_info("%s", err);
    else log_warn("S3 credentials: %s; retrying in the background", err);
    fo.s3_access_key = v.access_key;
    fo.s3_secret_key = v.secret_key;
    fo.s3_session_token = v.session_token;
  } else {
    explicit_credentials(c, &fo);
  }
  int frc = fetch_create(srv->loop, &fo, &srv->fetch);
  if (frc == 0 && chain) start_refresher(srv, &v, rc != 0 && rc != LARDER_ENOENT);
  awscreds_value_clear(&v);
  return frc;
}

/* Gives the loop thread its time slice (loop_slice_us), now that the
 * workers and the cache's threads are started with the kernel's default:
 * on 2 cores with both workers busy, a thread of the daemon's priority
 * that woke every 100 us lost 35-106 ms a second to waits of up to 4.7 ms
 * for a worker's slice to end, and 4-7 ms with a slice of 100 us. */
static void set_loop_slice(server_t *srv) {
  if (srv->cfg.loop_slice_us == 0) return;
  uint64_t us = srv->cfg.loop_slice_us > 100000 ? 100000 : srv->cfg.loop_slice_us;
  int rc = util_thread_slice(us * 1000);
  if (rc == 0)
    log_info("the loop thread runs with a time slice of %llu us", (unsigned long long)us);
  else if (rc == LARDER_EUNSUPPORTED)
    log_info(
        "the loop thread keeps the kernel's time slice (loop_slice_us needs Linux 6.12 or "
        "later, and a thread in the fair scheduling class)");
  else log_warn("cannot set the loop thread's time slice: %s", larder_strerror(rc));
}

int server_run(server_t *srv) {
  /* libuv writes with write(2), so a client that closes its end while a
   * Batch frame is being written would kill the whole daemon with SIGPIPE.
   * Ignore it: the write fails with EPIPE and only that connection closes.
   * Tested by daemon_resume. */
  signal(SIGPIPE, SIG_IGN);
  srv->loop = uv_default_loop();
  srv->started_ns = util_now_ns();
  srv->started_unix = (int64_t)time(NULL);
  units_init(srv, stream_read_ahead_all);
  if (footers_create(&srv->stats, &srv->footers) != 0 ||
      remote_footers_create(srv->cfg.remote_footer_memory, &srv->stats, &srv->remote_footers) !=
          0) {
    log_err("out of memory");
    units_shutdown(srv);
    footers_destroy(srv->footers);
    srv->footers = NULL;
    return 1;
  }
  int nice = srv->cfg.worker_nice > 19 ? 19 : (int)srv->cfg.worker_nice;
  if (work_pool_start(srv->loop, srv->workers, nice, flush_frames, srv, &srv->pool) != 0) {
    log_err("cannot start %d worker threads", srv->workers);
    units_shutdown(srv);
    footers_destroy(srv->footers);
    srv->footers = NULL;
    remote_footers_free(srv->remote_footers);
    srv->remote_footers = NULL;
    return 1;
  }
  keep_footers(srv);
  if (start_fetcher(srv) != 0) log_warn("remote sources are unavailable: cannot start libcurl");
  uv_timer_init(srv->loop, &srv->tick);
  srv->tick.data = srv;
  uv_timer_init(srv->loop, &srv->relisten);
  srv->relisten.data = srv;
  srv->listen_spare = -1;
  uv_prepare_init(srv->loop, &srv->flush);
  srv->flush.data = srv;
  uv_prepare_start(&srv->flush, on_flush);
  uv_unref((uv_handle_t *)&srv->flush);
  /* CUDA streams' copies report their ends to this loop (cuda.h). */
  if (cuda_loop_start(srv->loop) != 0) log_warn("CUDA streams are unavailable: no async handle");
  cuda_set_closer(stream_close_region, srv); /* parks free their regions on workers */
  uv_signal_init(srv->loop, &srv->sig_term);
  uv_signal_init(srv->loop, &srv->sig_int);
  uv_signal_init(srv->loop, &srv->sig_hup);
  srv->sig_term.data = srv->sig_int.data = srv->sig_hup.data = srv;
  uv_signal_start(&srv->sig_term, on_signal, SIGTERM);
  uv_signal_start(&srv->sig_int, on_signal, SIGINT);
  uv_signal_start(&srv->sig_hup, on_signal, SIGHUP);
  char aerr[512];
  int rc = server_apply_access(srv, aerr, sizeof(aerr));
  if (rc) log_err("%s", aerr);
  if (rc == 0) {
    rc = listen_socket(srv);
    if (rc) uv_close((uv_handle_t *)&srv->listener, NULL);
  }
  if (rc == 0 && (rc = metrics_start(srv, aerr, sizeof(aerr))) != 0) {
    log_err("%s", aerr);
    uv_close((uv_handle_t *)&srv->listener, NULL);
    srv->listening = 0;
    if (!srv->socket_activated && srv->cfg.socket) unlink(srv->cfg.socket);
  }
  if (rc && srv->listen_spare >= 0) {
    close(srv->listen_spare);
    srv->listen_spare = -1;
  }
  if (rc) {
    metrics_stop(srv);
    finish_shutdown(srv);
    uv_run(srv->loop, UV_RUN_DEFAULT);
    units_shutdown(srv);
    admin_shutdown(srv);
    footers_destroy(srv->footers);
    srv->footers = NULL;
    remote_footers_free(srv->remote_footers);
    srv->remote_footers = NULL;
    acl_free(srv->acl);
    srv->acl = NULL;
    return 1;
  }
  uv_timer_start(&srv->tick, on_tick, 1000, 1000);
  set_loop_slice(srv);
  log_notice("larderd %s ready (%d workers, cache %s)", LARDERD_VERSION, srv->workers,
             srv->cfg.cache_dir);
  sd_notifyf(0, "READY=1\nSTATUS=ready: %d workers, cache %s", srv->workers, srv->cfg.cache_dir);
  if (srv->on_ready) srv->on_ready(srv);
  uv_run(srv->loop, UV_RUN_DEFAULT);
  units_shutdown(srv);
  admin_shutdown(srv);
  footers_destroy(srv->footers);
  srv->footers = NULL;
  remote_footers_free(srv->remote_footers);
  srv->remote_footers = NULL;
  metrics_stop(srv);
  acl_free(srv->acl);
  srv->acl = NULL;
  int close_rc = uv_loop_close(srv->loop);
  if (close_rc) log_warn("event loop closed with handles open");
  return 0;
}
