/*
 * admin.c: the administrative requests larderctl sends.
 *
 *   status, stats, clients, ls                 anyone who can reach the socket
 *   inspect URL, cat URL                       anyone, within the allowlist
 *   evict, prefetch, verify, reload, config    root, the daemon's user, or
 *                                              admin_group (acl.h)
 *
 * What one user sees of another: admins see every client, stream and
 * cached object; anyone else sees only the clients of their own uid, their
 * streams, and the cached objects those streams read (admin_visible_to).  Pids,
 * uids and source paths are another user's business: a path may name a
 * project, a customer or a person.  Counters over everyone (clients,
 * streams, bytes, rates, the cache's use) stay visible to all.
 *
 * Replies are JSON when the request asks for it (stable keys, one object),
 * else text for people.  Long texts travel in several AdminReply frames
 * (more = 1), and so do progress (prefetch) and rows (cat); the last frame
 * has more = 0 and the request's final code.
 *
 * Jobs: evict, verify, prefetch, inspect and cat run asynchronously (the
 * thread pool, the fetcher, the unit pool) and belong to their connection:
 * when it closes, they stop.  Each counts as one of the connection's
 * pending requests (max_pending_per_client).  A prefetch is resumable: it
 * skips what the cache already holds, so running it again after an
 * interruption continues where it stopped.
 *
 * Rates: admin_tick samples the counters every second; stats reports
 * rates over the last RATE_SAMPLES seconds (since the start when younger).
 *
 * Files: this one holds the dispatch, replies, arguments, status, clients,
 * ls, config and reload, the job machinery, evict and verify;
 * admin_stats.c the rates and stats; admin_jobs.c prefetch, inspect and
 * cat.  admin_int.h is what they share.
 */
#include <ctype.h>
#include <fnmatch.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fetch/awscreds.h"
#include "cred.h"
#include "serve/cuda.h"
#include "log.h"
#include "serve/metrics.h"
#include "parquet/pq_inspect.h"
#include "fetch/remote.h"
#include "serve/admin.h"
#include "serve/admin_int.h"
#include "serve/conn.h"
#include "serve/stream.h"
#include "serve/units.h"
#include "serve/server.h"
#include "plan/shuffle.h"
#include "util.h"

/* ------------------------------------------------------------------------ */
/* Text buffers                                                              */

/* Replies are built in a strbuf_t (strbuf.h) with unchecked appends: its
 * error sticks, and is checked once at the end. */

/* A JSON string literal (UTF-8 passes through; control characters are
 * escaped). */
void admin_sb_json(strbuf_t *b, const char *s) {
  strbuf_append(b, "\"", 1);
  for (const char *p = s ? s : ""; *p; p++) {
    unsigned char ch = (unsigned char)*p;
    if (ch == '"') strbuf_puts(b, "\\\"");
    else if (ch == '\\') strbuf_puts(b, "\\\\");
    else if (ch == '\n') strbuf_puts(b, "\\n");
    else if (ch == '\t') strbuf_puts(b, "\\t");
    else if (ch == '\r') strbuf_puts(b, "\\r");
    else if (ch < 0x20) strbuf_printf(b, "\\u%04x", ch);
    else strbuf_append(b, (const char *)p, 1);
  }
  strbuf_append(b, "\"", 1);
}

/* A finite JSON number (NaN and infinities become 0). */
void admin_sb_num(strbuf_t *b, double v) {
  if (!isfinite(v)) v = 0;
  strbuf_printf(b, "%.6g", v);
}

/* ------------------------------------------------------------------------ */
/* Human formatting                                                          */

const char *admin_fmt_bytes(char *buf, size_t size, double v) {
  util_human_bytes(buf, size, v);
  return buf;
}

/* Seconds as "2h 03m", "5m 07s", "12s", "0.4s". */
const char *admin_fmt_dur(char *buf, size_t size, double s) {
  if (!isfinite(s) || s < 0) snprintf(buf, size, "?");
  else if (s < 10) snprintf(buf, size, "%.1fs", s);
  else if (s < 60) snprintf(buf, size, "%.0fs", s);
  else if (s < 3600) snprintf(buf, size, "%dm %02ds", (int)(s / 60), (int)s % 60);
  else if (s < 86400) snprintf(buf, size, "%dh %02dm", (int)(s / 3600), (int)(s / 60) % 60);
  else snprintf(buf, size, "%dd %02dh", (int)(s / 86400), (int)(s / 3600) % 24);
  return buf;
}

/* 1234567 as "1,234,567". */
const char *admin_fmt_count(char *buf, size_t size, uint64_t v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof(tmp), "%" PRIu64, v);
  size_t o = 0;
  for (int i = 0; i < n && o + 2 < size; i++) {
    if (i && (n - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = tmp[i];
  }
  buf[o] = '\0';
  return buf;
}

/* s shortened to width columns with "..." in the middle. */
const char *admin_fmt_fit(char *buf, size_t size, const char *s, size_t width) {
  size_t n = strlen(s);
  if (n <= width || width < 8) {
    snprintf(buf, size, "%s", s);
    return buf;
  }
  size_t head = (width - 3) / 2, tail = width - 3 - head;
  snprintf(buf, size, "%.*s...%s", (int)head, s, s + n - tail);
  return buf;
}

/* ------------------------------------------------------------------------ */
/* Replies                                                                   */

void admin_reply_frame(conn_t *c, uint32_t request_id, int code, const char *text, size_t len,
                       int more) {
  if (c == NULL || c->closing || c->draining) return;
  char *copy = NULL;
  Larder__AdminReply r = LARDER__ADMIN_REPLY__INIT;
  r.request_id = request_id;
  r.code = code;
  r.more = more;
  if (text && text[len] != '\0') {
    copy = malloc(len + 1);
    if (copy == NULL) return;
    memcpy(copy, text, len);
    copy[len] = '\0';
    r.text = copy;
  } else {
    r.text = (char *)(text ? text : "");
  }
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_ADMIN_REPLY;
  f.admin_reply = &r;
  conn_send(c, &f, -1);
  free(copy);
}

/* The final admin_reply, cut into frames of about REPLY_CHUNK bytes (never
 * inside a UTF-8 sequence) so that no frame exceeds the client's limit. */
void admin_reply(conn_t *c, uint32_t request_id, int code, const char *text) {
  const char *t = text ? text : "";
  size_t n = strlen(t), off = 0;
  while (n - off > REPLY_CHUNK) {
    size_t cut = off + REPLY_CHUNK;
    while (cut > off && ((unsigned char)t[cut] & 0xC0) == 0x80) cut--;
    admin_reply_frame(c, request_id, 0, t + off, cut - off, 1);
    off = cut;
  }
  admin_reply_frame(c, request_id, code, t + off, n - off, 0);
}

void admin_reply_error(conn_t *c, uint32_t request_id, int code, const char *fmt, ...) {
  char msg[2400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  admin_reply_frame(c, request_id, code, msg, strlen(msg), 0);
}

static conn_t *find_conn(server_t *srv, uint64_t id) {
  for (conn_t *c = srv->conns; c; c = c->next)
    if (c->id == id && !c->closing && !c->draining) return c;
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Request arguments: positional words and --name=value options              */

const char *admin_opt_value(const Larder__AdminRequest *req, const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i < req->n_args; i++) {
    const char *a = req->args[i];
    if (a && strncmp(a, "--", 2) == 0 && strncmp(a + 2, name, n) == 0 && a[2 + n] == '=')
      return a + 3 + n;
  }
  return NULL;
}

int admin_opt_flag(const Larder__AdminRequest *req, const char *name) {
  for (size_t i = 0; i < req->n_args; i++)
    if (req->args[i] && strncmp(req->args[i], "--", 2) == 0 && strcmp(req->args[i] + 2, name) == 0)
      return 1;
  return 0;
}

size_t admin_positional(const Larder__AdminRequest *req, const char **out, size_t max) {
  size_t k = 0;
  for (size_t i = 0; i < req->n_args && k < max; i++)
    if (req->args[i] && strncmp(req->args[i], "--", 2) != 0) out[k++] = req->args[i];
  return k;
}

int admin_parse_u64(const char *s, uint64_t *out) {
  if (s == NULL || !isdigit((unsigned char)*s)) return -1;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end) return -1;
  *out = v;
  return 0;
}

/* "a,b.c" into a malloc'd vector of malloc'd strings. */
char **admin_split_list(const char *spec, size_t *n) {
  *n = 0;
  if (spec == NULL || *spec == '\0') return NULL;
  size_t count = 1;
  for (const char *p = spec; *p; p++) count += *p == ',';
  char **v = calloc(count + 1, sizeof(char *));
  if (v == NULL) return NULL;
  const char *p = spec;
  while (*p) {
    size_t len = strcspn(p, ",");
    if (len) {
      v[*n] = strndup(p, len);
      if (v[*n] == NULL) break;
      (*n)++;
    }
    p += len;
    if (*p == ',') p++;
  }
  return v;
}

void admin_free_list(char **v, size_t n) {
  if (v == NULL) return;
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

/* The module's state (admin_int.h), made at its first use. */
admin_state_t *admin_state(server_t *srv) {
  if (srv->admin == NULL) srv->admin = calloc(1, sizeof(admin_state_t));
  return srv->admin;
}

/* ------------------------------------------------------------------------ */
/* Visibility                                                                */

/* Whether the peer of conn may see everyone's clients, streams and objects:
 * root, the daemon's user or admin_group (acl_is_admin).  Loop thread. */
int admin_sees_all(const conn_t *self) {
  acl_peer_t peer;
  conn_peer(self, &peer);
  return acl_is_admin(self->srv->acl, &peer);
}

/* Whether a listing for self (all: admin_sees_all) may show connection c and its
 * streams: an admin's may, anyone else's only for c of the same uid. */
int admin_visible_to(const conn_t *self, int all, const conn_t *c) {
  return all || c->uid == self->uid;
}

/* ------------------------------------------------------------------------ */
/* status                                                                    */

/* Connections that are trainers: past their Hello, not larderctl's (nor
 * another admin client's), and not closing.  A connection counts only once
 * its Hello says what it is. */
uint64_t admin_count_trainers(server_t *srv) {
  uint64_t n = 0;
  for (conn_t *c = srv->conns; c; c = c->next)
    if (c->hello_done && !c->is_admin_conn && !c->closing && !c->draining) n++;
  return n;
}

static void cmd_status(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  store_stats_t st;
  memset(&st, 0, sizeof(st));
  if (srv->store) store_stats_get(srv->store, &st);
  double up = (double)(util_now_ns() - srv->started_ns) / 1e9;
  const char *metrics = metrics_endpoint(srv);
  strbuf_t b = {0};
  if (req->json) {
    strbuf_printf(&b, "{\"up\":true,\"version\":\"%s\",\"pid\":%d,\"uptime_s\":", LARDERD_VERSION,
                  (int)getpid());
    admin_sb_num(&b, up);
    strbuf_printf(&b, ",\"started_unix\":%" PRId64 ",\"config_path\":", srv->started_unix);
    if (srv->config_path) admin_sb_json(&b, srv->config_path);
    else strbuf_puts(&b, "null");
    strbuf_puts(&b, ",\"socket\":");
    admin_sb_json(&b, srv->cfg.socket);
    strbuf_puts(&b, ",\"cache_dir\":");
    admin_sb_json(&b, srv->cfg.cache_dir);
    strbuf_printf(&b,
                  ",\"cache_capacity_bytes\":%" PRIu64 ",\"cache_used_bytes\":%" PRIu64
                  ",\"cache_entries\":%" PRIu64 ",\"workers\":%d,\"clients\":%" PRIu64
                  ",\"trainers\":%" PRIu64 ",\"streams\":%" PRIu64
                  ",\"allowlist_rules\":%zu,\"metrics_endpoint\":",
                  st.capacity_bytes, st.used_bytes, st.entries, srv->workers,
                  /* the other connections: not the larderctl asking */
                  STATS_GET(&srv->stats, clients) - 1, admin_count_trainers(srv),
                  STATS_GET(&srv->stats, streams), acl_num_rules(srv->acl));
    if (*metrics) admin_sb_json(&b, metrics);
    else strbuf_puts(&b, "null");
    strbuf_puts(&b, ",\"metrics_textfile\":");
    if (srv->cfg.metrics_textfile && *srv->cfg.metrics_textfile)
      admin_sb_json(&b, srv->cfg.metrics_textfile);
    else strbuf_puts(&b, "null");
    strbuf_puts(&b, "}");
  } else {
    char a[32], bb[32], d[32], n[32];
    strbuf_printf(&b, "larderd %s is up (pid %d)\n", LARDERD_VERSION, (int)getpid());
    strbuf_printf(&b, "  uptime      %s\n", admin_fmt_dur(d, sizeof(d), up));
    strbuf_printf(&b, "  config      %s\n",
                  srv->config_path ? srv->config_path : "(none: defaults and flags)");
    strbuf_printf(&b, "  socket      %s\n", srv->cfg.socket);
    strbuf_printf(
        &b, "  cache       %s: %s of %s used (%.0f%%), %s entries\n", srv->cfg.cache_dir,
        admin_fmt_bytes(a, sizeof(a), (double)st.used_bytes),
        admin_fmt_bytes(bb, sizeof(bb), (double)st.capacity_bytes),
        st.capacity_bytes ? (double)st.used_bytes * 100.0 / (double)st.capacity_bytes : 0.0,
        admin_fmt_count(n, sizeof(n), st.entries));
    strbuf_printf(&b, "  workers     %d\n", srv->workers);
    uint64_t trainers = admin_count_trainers(srv), streams = STATS_GET(&srv->stats, streams);
    strbuf_printf(&b, "  trainers    %" PRIu64 " connected, %" PRIu64 " stream%s open\n", trainers,
                  streams, streams == 1 ? "" : "s");
    if (acl_num_rules(srv->acl))
      strbuf_printf(&b, "  allowlist   %zu rule%s\n", acl_num_rules(srv->acl),
                    acl_num_rules(srv->acl) == 1 ? "" : "s");
    else strbuf_puts(&b, "  allowlist   off: any URL may be fetched (set allow = ... lines)\n");
    if (*metrics) strbuf_printf(&b, "  metrics     %s\n", metrics);
    if (srv->cfg.metrics_textfile && *srv->cfg.metrics_textfile)
      strbuf_printf(&b, "  metrics     %s (every %" PRIu64 " s)\n", srv->cfg.metrics_textfile,
                    srv->cfg.metrics_interval);
  }
  admin_reply(c, req->request_id, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

/* ------------------------------------------------------------------------ */
/* clients                                                                   */

/* Lists the connections self may see (visible_to), itself left out. */
static void cmd_clients(conn_t *self, const Larder__AdminRequest *req) {
  server_t *srv = self->srv;
  int all = admin_sees_all(self);
  strbuf_t b = {0};
  uint64_t now = util_now_ns();
  int n = 0;
  if (req->json) strbuf_puts(&b, "{\"clients\":[");
  else
    strbuf_printf(&b, "%6s %8s %6s %6s  %-16s %10s %7s\n", "CLIENT", "PID", "UID", "GID", "NAME",
                  "CONNECTED", "STREAMS");
  for (conn_t *c = srv->conns; c; c = c->next) {
    if (c == self || c->closing || c->draining || !admin_visible_to(self, all, c)) continue;
    double age = (double)(now - c->connected_ns) / 1e9;
    if (req->json) {
      strbuf_printf(&b, "%s{\"client\":%" PRIu64 ",\"pid\":%d,\"uid\":%u,\"gid\":%u,\"name\":",
                    n ? "," : "", c->id, (int)c->pid, (unsigned)c->uid, (unsigned)c->gid);
      admin_sb_json(&b, c->name);
      strbuf_puts(&b, ",\"connected_s\":");
      admin_sb_num(&b, age);
      strbuf_printf(&b, ",\"arena_bytes\":%" PRIu64 ",\"pending\":%d,\"streams\":[", c->arena_bytes,
                    c->pending_requests);
    } else {
      char d[32];
      strbuf_printf(&b, "%6" PRIu64 " %8d %6u %6u  %-16.16s %10s %7d\n", c->id, (int)c->pid,
                    (unsigned)c->uid, (unsigned)c->gid, c->name[0] ? c->name : "?",
                    admin_fmt_dur(d, sizeof(d), age), c->num_streams);
    }
    int k = 0;
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      stream_info_t si;
      stream_info(s, &si);
      const stats_stream_t *ss = stream_stats(s);
      double bps, byps, stall;
      admin_stream_rates(srv, c, s, &bps, &byps, &stall);
      if (req->json) {
        strbuf_printf(&b,
                      "%s{\"stream\":%u,\"rank\":%u,\"world_size\":%u,\"dataset\":", k ? "," : "",
                      si.id, si.rank, si.world_size);
        admin_sb_json(&b, si.dataset);
        strbuf_puts(&b, ",\"job\":");
        admin_sb_json(&b, si.job);
        strbuf_printf(&b,
                      ",\"files\":%" PRIu64 ",\"rows\":%" PRIu64 ",\"batches_per_epoch\":%" PRIu64
                      ",\"epochs\":%" PRIu64 ",\"batches\":%" PRIu64 ",\"bytes\":%" PRIu64
                      ",\"arena_bytes\":%" PRIu64
                      ",\"window\":%u,\"partitions\":%u,"
                      "\"node_partitions\":[%u,%u],\"stall\":",
                      si.num_files, si.total_rows, si.batches_per_epoch, si.epochs,
                      STATS_GET(ss, batches), STATS_GET(ss, bytes), si.arena_bytes, si.window,
                      si.partitions, si.part_first, si.part_last);
        if (stall >= 0) admin_sb_num(&b, stall);
        else strbuf_puts(&b, "null");
        strbuf_printf(&b, ",\"order\":\"%s\",\"order_auto\":%s,\"order_note\":",
                      !si.shuffle      ? "dataset"
                      : si.rg_together ? "row_groups"
                                       : "units",
                      si.rg_auto ? "true" : "false");
        admin_sb_json(&b, si.order_note);
        strbuf_puts(&b, "}");
      } else {
        char name[64], a[32], st_s[16];
        if (stall >= 0) snprintf(st_s, sizeof(st_s), "%.1f%%", stall * 100);
        else snprintf(st_s, sizeof(st_s), "-");
        uint64_t bpe = si.batches_per_epoch ? si.batches_per_epoch : 1;
        uint64_t done = STATS_GET(ss, batches);
        char epochs[32];
        if (si.epochs) snprintf(epochs, sizeof(epochs), "of %" PRIu64, si.epochs);
        else snprintf(epochs, sizeof(epochs), "(unbounded)");
        char parts[48 + 80] = "";
        if (si.partitions > 1)
          snprintf(parts, sizeof(parts), " · partitions %u-%u of %u", si.part_first,
                   si.part_last - 1, si.partitions);
        if (si.job[0])
          snprintf(parts + strlen(parts), sizeof(parts) - strlen(parts), " · job %s", si.job);
        if (si.shuffle)
          snprintf(parts + strlen(parts), sizeof(parts) - strlen(parts), " · %s%s",
                   si.rg_together ? "row groups together" : "units mixed singly",
                   si.rg_auto ? " (auto)" : "");
        strbuf_printf(&b,
                      "         stream %u: rank %u/%u%s · %s · %.1f epochs %s · %" PRIu64
                      " batches (%s) · stall %s\n",
                      si.id, si.rank, si.world_size, parts,
                      admin_fmt_fit(name, sizeof(name), si.dataset, 48), (double)done / (double)bpe,
                      epochs, done, admin_fmt_bytes(a, sizeof(a), (double)STATS_GET(ss, bytes)),
                      st_s);
      }
      k++;
    }
    if (req->json) strbuf_puts(&b, "]}");
    n++;
  }
  if (req->json) strbuf_puts(&b, "]}");
  else if (n == 0) {
    free(b.data);
    memset(&b, 0, sizeof(b));
    strbuf_puts(&b,
                all ? "no client is connected\n"
                    : "no client of yours is connected (other users' are listed to admins only)\n");
  }
  admin_reply(self, req->request_id, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

/* ------------------------------------------------------------------------ */
/* ls                                                                        */

typedef struct objlist {
  store_object_info_t *v;
  size_t n, cap;
  int oom;
} objlist_t;

static void collect_object(const store_object_info_t *info, void *arg) {
  objlist_t *l = arg;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    store_object_info_t *v = realloc(l->v, cap * sizeof(*v));
    if (v == NULL) {
      l->oom = 1;
      return;
    }
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = *info;
}

static int cmp_object(const void *a, const void *b) {
  const store_object_info_t *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c) return c;
  return x->last_use < y->last_use ? 1 : x->last_use > y->last_use ? -1 : 0;
}

static int list_objects(server_t *srv, objlist_t *l) {
  memset(l, 0, sizeof(*l));
  if (srv->store == NULL) return 0;
  int rc = store_list_objects(srv->store, collect_object, l);
  if (rc < 0) return rc;
  if (l->oom) return LARDER_ENOMEM;
  if (l->n > 1) qsort(l->v, l->n, sizeof(*l->v), cmp_object);
  return 0;
}

static const char *fmt_ago(char *buf, size_t size, int64_t unix_s) {
  if (unix_s <= 0) {
    snprintf(buf, size, "never");
    return buf;
  }
  char d[32];
  double ago = (double)((int64_t)time(NULL) - unix_s);
  if (ago < 1) snprintf(buf, size, "just now");
  else snprintf(buf, size, "%s ago", admin_fmt_dur(d, sizeof(d), ago));
  return buf;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The objects a non-admin's ls shows: the files that the open streams of
 * self's uid read (any of its connections), as a sorted array of object
 * ids in *ids (free it; NULL when *n is 0).  Returns 0 or LARDER_ENOMEM.
 * Loop thread. */
static int own_objects(const conn_t *self, uint64_t **ids, size_t *n) {
  *ids = NULL;
  *n = 0;
  size_t cap = 0;
  for (conn_t *c = self->srv->conns; c; c = c->next) {
    if (!admin_visible_to(self, 0, c)) continue;
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      stream_info_t si;
      stream_info(s, &si);
      for (uint32_t i = 0; si.ds && i < si.ds->num_files; i++) {
        if (*n == cap) {
          cap = cap ? cap * 2 : 64;
          uint64_t *v = realloc(*ids, cap * sizeof(*v));
          if (v == NULL) {
            free(*ids);
            *ids = NULL;
            *n = 0;
            return LARDER_ENOMEM;
          }
          *ids = v;
        }
        (*ids)[(*n)++] = si.ds->files[i].object_id;
      }
    }
  }
  if (*n > 1) qsort(*ids, *n, sizeof(**ids), cmp_u64);
  return 0;
}

/* Lists the cached objects: all of them to an admin, else those that the
 * user's open streams read (own_objects). */
static void cmd_ls(conn_t *c, const Larder__AdminRequest *req) {
  int all = admin_sees_all(c);
  uint64_t *own = NULL;
  size_t num_own = 0;
  if (!all && own_objects(c, &own, &num_own) != 0) {
    admin_reply_error(c, req->request_id, LARDER_ENOMEM, "cannot list the cache: %s",
                      larder_strerror(LARDER_ENOMEM));
    return;
  }
  objlist_t l;
  int rc = list_objects(c->srv, &l);
  if (rc) {
    free(own);
    admin_reply_error(c, req->request_id, rc, "cannot list the cache: %s", larder_strerror(rc));
    return;
  }
  const char *pos[1];
  const char *prefix = admin_positional(req, pos, 1) ? pos[0] : NULL;
  strbuf_t b = {0};
  uint64_t bytes = 0, entries = 0;
  size_t shown = 0;
  if (req->json) strbuf_puts(&b, "{\"objects\":[");
  else
    /* Fixed-width columns first, then the object and its identity whole:
     * a name or an identity is never cut to fit a column. */
    strbuf_printf(&b, "%-16s  %10s %8s  %-16s  %s\n", "ID", "BYTES", "ENTRIES", "LAST USE",
                  "OBJECT (IDENTITY)");
  for (size_t i = 0; i < l.n; i++) {
    const store_object_info_t *o = &l.v[i];
    if (prefix && strncmp(o->name, prefix, strlen(prefix)) != 0) continue;
    if (!all && (num_own == 0 || !bsearch(&o->id, own, num_own, sizeof(*own), cmp_u64))) continue;
    bytes += o->bytes;
    entries += o->entries;
    if (req->json) {
      strbuf_printf(&b, "%s{\"id\":\"%016" PRIx64 "\",\"object\":", shown ? "," : "", o->id);
      admin_sb_json(&b, o->name);
      strbuf_puts(&b, ",\"identity\":");
      admin_sb_json(&b, o->identity);
      strbuf_printf(&b,
                    ",\"bytes\":%" PRIu64 ",\"entries\":%" PRIu64 ",\"last_use_unix\":%" PRId64 "}",
                    o->bytes, o->entries, o->last_use);
    } else {
      char a[32], ago[48];
      strbuf_printf(&b, "%016" PRIx64 "  %10s %8" PRIu64 "  %-16s  %s (%s)\n", o->id,
                    admin_fmt_bytes(a, sizeof(a), (double)o->bytes), o->entries,
                    fmt_ago(ago, sizeof(ago), o->last_use), o->name, o->identity);
    }
    shown++;
  }
  if (req->json) {
    strbuf_printf(&b,
                  "],\"total\":{\"objects\":%zu,\"bytes\":%" PRIu64 ",\"entries\":%" PRIu64 "}}",
                  shown, bytes, entries);
  } else {
    char a[32], n[32];
    if (shown == 0) {
      free(b.data);
      memset(&b, 0, sizeof(b));
      if (all)
        strbuf_printf(&b, "the cache holds nothing%s%s\n", prefix ? " under " : "",
                      prefix ? prefix : "");
      else
        strbuf_printf(&b,
                      "the cache holds nothing%s%s that your open streams read (other users' "
                      "objects are listed to admins only)\n",
                      prefix ? " under " : "", prefix ? prefix : "");
    } else {
      strbuf_printf(&b, "%zu object%s, %s in %s entries (an entry is one column of one unit)\n",
                    shown, shown == 1 ? "" : "s", admin_fmt_bytes(a, sizeof(a), (double)bytes),
                    admin_fmt_count(n, sizeof(n), entries));
    }
  }
  free(l.v);
  free(own);
  admin_reply(c, req->request_id, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

/* ------------------------------------------------------------------------ */
/* config and reload                                                         */

typedef struct cfgdump {
  strbuf_t *b;
  int json;
  int n;
} cfgdump_t;

static void dump_key(const char *key, const char *value, int live, void *arg) {
  cfgdump_t *d = arg;
  if (d->json) {
    strbuf_puts(d->b, d->n ? "," : "");
    strbuf_printf(d->b, "{\"key\":\"%s\",\"value\":", key);
    admin_sb_json(d->b, value);
    strbuf_printf(d->b, ",\"live\":%s}", live ? "true" : "false");
  } else {
    strbuf_printf(d->b, "%-28s = %s\n", key, value);
  }
  d->n++;
}

static void cmd_config(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  strbuf_t b = {0};
  cfgdump_t d = {&b, req->json, 0};
  if (req->json) {
    strbuf_puts(&b, "{\"config_path\":");
    if (srv->config_path) admin_sb_json(&b, srv->config_path);
    else strbuf_puts(&b, "null");
    strbuf_puts(&b, ",\"keys\":[");
  } else {
    strbuf_printf(&b,
                  "# the configuration in effect (%s, then command-line flags); secrets hidden\n",
                  srv->config_path ? srv->config_path : "defaults");
  }
  config_each(&srv->cfg, dump_key, &d);
  if (req->json) strbuf_puts(&b, "]}");
  admin_reply(c, req->request_id, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

/* Appends a JSON array of the keys in list ("a, b, c"; "" for none). */
static void sb_key_list(strbuf_t *b, const char *list) {
  strbuf_puts(b, "[");
  int first = 1;
  for (const char *p = list; *p;) {
    while (*p == ' ' || *p == ',') p++;
    size_t n = strcspn(p, ", ");
    if (n == 0) break;
    char key[128];
    snprintf(key, sizeof(key), "%.*s", (int)(n < sizeof(key) - 1 ? n : sizeof(key) - 1), p);
    if (!first) strbuf_puts(b, ",");
    admin_sb_json(b, key);
    first = 0;
    p += n;
  }
  strbuf_puts(b, "]");
}

static void cmd_reload(conn_t *c, const Larder__AdminRequest *req) {
  char summary[2400], changed[1024], restart[512];
  int rc = server_reload(c->srv, summary, sizeof(summary), changed, sizeof(changed), restart,
                         sizeof(restart));
  if (rc) {
    admin_reply_error(c, req->request_id, rc, "reload failed: %s", summary);
    return;
  }
  strbuf_t b = {0};
  if (req->json) {
    strbuf_puts(&b, "{\"reloaded\":true,\"changed\":");
    sb_key_list(&b, changed);
    strbuf_puts(&b, ",\"restart_needed\":");
    sb_key_list(&b, restart);
    strbuf_puts(&b, ",\"summary\":");
    admin_sb_json(&b, summary);
    strbuf_puts(&b, "}");
  } else {
    strbuf_printf(&b, "%s\n", summary);
  }
  admin_reply(c, req->request_id, 0, b.data);
  free(b.data);
}

/* ------------------------------------------------------------------------ */
/* Jobs                                                                      */

static void on_job_timer_closed(uv_handle_t *h) {
  job_t *j = h->data;
  free(j);
}

void admin_job_maybe_free(job_t *j) {
  if (j->freeing || j->async > 0 || !(j->finished || j->cancelled)) return;
  j->freeing = 1;
  admin_state_t *as = j->srv->admin;
  if (as) {
    job_t **pp = &as->jobs;
    while (*pp && *pp != j) pp = &(*pp)->next;
    if (*pp) *pp = j->next;
  }
  conn_t *c = find_conn(j->srv, j->conn_id);
  if (c && c->pending_requests > 0) c->pending_requests--;
  if (j->destroy) j->destroy(j);
  uv_timer_stop(&j->timer);
  uv_close((uv_handle_t *)&j->timer, on_job_timer_closed);
}

/* Allocates a job of size bytes (a struct that starts with job_t) for
 * connection c, or replies with the limit it would exceed. */
void *admin_job_new(conn_t *c, const Larder__AdminRequest *req, int kind, size_t size) {
  server_t *srv = c->srv;
  if (c->pending_requests >= (int)srv->cfg.max_pending_per_client) {
    admin_reply_error(c, req->request_id, LARDER_ELIMIT,
                      "this client has %d requests in progress, the limit (max_pending_per_client)",
                      c->pending_requests);
    return NULL;
  }
  admin_state_t *as = admin_state(srv);
  job_t *j = calloc(1, size);
  if (j == NULL || as == NULL) {
    free(j);
    admin_reply_error(c, req->request_id, LARDER_ENOMEM, "out of memory");
    return NULL;
  }
  j->kind = kind;
  j->srv = srv;
  j->conn_id = c->id;
  j->request_id = req->request_id;
  j->json = req->json;
  j->dry_run = req->dry_run;
  uv_timer_init(srv->loop, &j->timer);
  j->timer.data = j;
  j->work.data = j;
  j->next = as->jobs;
  as->jobs = j;
  c->pending_requests++;
  return j;
}

conn_t *admin_job_conn(job_t *j) { return j->cancelled ? NULL : find_conn(j->srv, j->conn_id); }

void admin_job_finish(job_t *j, int code, const char *text) {
  if (!j->finished) {
    j->finished = 1;
    admin_reply(admin_job_conn(j), j->request_id, code, text);
  }
  admin_job_maybe_free(j);
}

/* The admin jobs running (prefetch, verify, evict, remote reads), and how
 * many of them are prefetches. */
int admin_jobs_running(server_t *srv, int *prefetches) {
  int n = 0;
  *prefetches = 0;
  admin_state_t *as = srv->admin;
  for (job_t *j = as ? as->jobs : NULL; j; j = j->next) {
    n++;
    *prefetches += j->kind == JOB_PREFETCH;
  }
  return n;
}

void admin_job_fail(job_t *j, int code, const char *fmt, ...) {
  char msg[2400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  admin_job_finish(j, code, msg);
}

static void job_work_cb(work_t *w) {
  job_t *j = w->data;
  j->work_fn(j);
}

static void job_after_cb(work_t *w, int status) {
  job_t *j = w->data;
  j->async--;
  if (j->cancelled) {
    admin_job_maybe_free(j);
    return;
  }
  if (status == UV_ECANCELED) {
    admin_job_fail(j, LARDER_ESHUTDOWN, "the daemon is shutting down");
    return;
  }
  j->after_fn(j);
}

/* Runs work(j) on a worker thread, then after(j) on the loop unless the
 * job was cancelled meanwhile (then it is freed).  Returns 0 or
 * LARDER_ENOMEM (nothing queued). */
int admin_job_queue(job_t *j, void (*work)(job_t *j), void (*after)(job_t *j)) {
  j->work_fn = work;
  j->after_fn = after;
  j->async++;
  if (work_queue(j->srv->pool, &j->work, job_work_cb, job_after_cb) != 0) {
    j->async--;
    return LARDER_ENOMEM;
  }
  return 0;
}

static void admin_cancel(job_t *j) {
  if (j->cancelled || j->freeing) return;
  j->cancelled = 1;
  if (j->cancel) j->cancel(j);
  admin_job_maybe_free(j);
}

void admin_conn_closed(conn_t *c) {
  admin_state_t *as = c->srv->admin;
  if (as == NULL) return;
  job_t *j = as->jobs;
  while (j) {
    job_t *next = j->next;
    if (j->conn_id == c->id) admin_cancel(j);
    j = next;
  }
}

void admin_shutdown(server_t *srv) {
  admin_state_t *as = srv->admin;
  if (as == NULL) return;
  job_t *j = as->jobs;
  while (j) {
    job_t *next = j->next;
    admin_cancel(j);
    j = next;
  }
  if (as->jobs == NULL) {
    free(as->rates);
    free(as);
    srv->admin = NULL;
  }
}

/* ------------------------------------------------------------------------ */
/* evict and verify                                                          */

typedef struct evict_job {
  job_t j;
  uint64_t *ids;
  size_t num_ids;
  uint64_t entries, bytes;
  int rc;
  char what[600];
} evict_job_t;

/* Whether a cached object's name belongs to a dataset source: the object
 * itself, a file of a directory (not recursive, as streams read them), an
 * object under an S3 prefix, or a match of a glob. */
static int source_matches(const char *src, const char *name) {
  int url = remote_is_url(src);
  /* src is never NULL: cmd_evict counts the --dataset arguments and then
   * collects them in a second pass over the same arguments, which the
   * analyzer cannot tell finds as many. */
  /* NOLINTNEXTLINE(clang-analyzer-core.NonNullParamChecker) */
  if (strpbrk(src, "*?[")) return fnmatch(src, name, url ? 0 : FNM_PATHNAME) == 0;
  size_t n = strlen(src);
  if (n == 0 || strncmp(name, src, n) != 0) return 0;
  if (name[n] == '\0') return 1;
  const char *rest = name + n;
  if (src[n - 1] != '/') {
    if (*rest != '/') return 0;
    rest++;
  }
  return url || strchr(rest, '/') == NULL;
}

/* Local sources also match through their resolved paths (what streams
 * record as object names). */
static int dataset_matches(char **sources, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++) {
    if (source_matches(sources[i], name)) return 1;
    if (remote_is_url(sources[i])) continue;
    if (strpbrk(sources[i], "*?[")) {
      glob_t g;
      if (glob(sources[i], 0, NULL, &g) == 0) {
        int hit = 0;
        for (size_t k = 0; k < g.gl_pathc && !hit; k++) {
          char real[PATH_MAX];
          hit = realpath(g.gl_pathv[k], real) && strcmp(real, name) == 0;
        }
        globfree(&g);
        if (hit) return 1;
      }
    } else {
      char real[PATH_MAX];
      if (realpath(sources[i], real) && source_matches(real, name)) return 1;
    }
  }
  return 0;
}

static int is_object_id(const char *s, uint64_t *id) {
  if (strlen(s) != 16) return 0;
  for (int i = 0; i < 16; i++)
    if (!isxdigit((unsigned char)s[i])) return 0;
  *id = strtoull(s, NULL, 16);
  return 1;
}

static void evict_work(job_t *j) {
  evict_job_t *e = (evict_job_t *)j;
  for (size_t i = 0; i < e->num_ids; i++) {
    uint64_t n = 0, b = 0;
    int rc = store_evict(j->srv->store, NULL, e->ids[i], j->dry_run, &n, &b);
    if (rc && e->rc == 0) e->rc = rc;
    e->entries += n;
    e->bytes += b;
  }
}

static void evict_after(job_t *j) {
  evict_job_t *e = (evict_job_t *)j;
  if (e->rc) {
    admin_job_fail(j, e->rc, "evict %s: %s", e->what, larder_strerror(e->rc));
    return;
  }
  char a[32], n[32];
  log_notice("admin evict %s%s: %zu objects, %" PRIu64 " entries, %" PRIu64 " bytes", e->what,
             j->dry_run ? " (dry run)" : "", e->num_ids, e->entries, e->bytes);
  strbuf_t b = {0};
  if (j->json)
    strbuf_printf(&b,
                  "{\"dry_run\":%s,\"objects\":%zu,\"entries\":%" PRIu64 ",\"bytes\":%" PRIu64 "}",
                  j->dry_run ? "true" : "false", e->num_ids, e->entries, e->bytes);
  else if (e->num_ids == 0)
    strbuf_printf(&b, "nothing to evict: no cached object matches %s\n", e->what);
  else
    strbuf_printf(&b, "%s %s in %s entries of %zu object%s (%s)%s\n",
                  j->dry_run ? "would free" : "freed",
                  admin_fmt_bytes(a, sizeof(a), (double)e->bytes),
                  admin_fmt_count(n, sizeof(n), e->entries), e->num_ids, e->num_ids == 1 ? "" : "s",
                  e->what, j->dry_run ? "; nothing was evicted (--dry-run)" : "");
  admin_job_finish(j, b.error ? LARDER_ENOMEM : 0, b.data);
  free(b.data);
}

static void evict_destroy(job_t *j) { free(((evict_job_t *)j)->ids); }

static void cmd_evict(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  const char *pos[256];
  size_t npos = admin_positional(req, pos, 256);
  int all = admin_opt_flag(req, "all");
  const char *prefix = admin_opt_value(req, "prefix");
  size_t ndatasets = 0;
  for (size_t i = 0; i < req->n_args; i++)
    if (req->args[i] && strncmp(req->args[i], "--dataset=", 10) == 0) ndatasets++;
  int modes = (all != 0) + (prefix != NULL) + (ndatasets > 0) + (npos > 0);
  if (modes != 1) {
    admin_reply_error(c, req->request_id, LARDER_EINVAL,
                      "evict: name what to evict, one way: OBJECT... (ids or names from `larderctl "
                      "ls`), --prefix URL-OR-PATH, --dataset SOURCE, or --all");
    return;
  }
  if (srv->store == NULL) {
    admin_reply_error(c, req->request_id, LARDER_EUNSUPPORTED, "the daemon has no cache");
    return;
  }
  objlist_t l;
  int rc = list_objects(srv, &l);
  if (rc) {
    admin_reply_error(c, req->request_id, rc, "cannot list the cache: %s", larder_strerror(rc));
    return;
  }
  char **datasets = NULL;
  if (ndatasets) {
    datasets = calloc(ndatasets, sizeof(char *));
    size_t k = 0;
    for (size_t i = 0; datasets && i < req->n_args; i++)
      if (req->args[i] && strncmp(req->args[i], "--dataset=", 10) == 0)
        datasets[k++] = req->args[i] + 10;
  }
  evict_job_t *e = admin_job_new(c, req, JOB_EVICT, sizeof(evict_job_t));
  if (e == NULL) {
    free(datasets);
    free(l.v);
    return;
  }
  e->j.destroy = evict_destroy;
  e->ids = calloc(l.n + 1, sizeof(uint64_t));
  if (e->ids == NULL || (ndatasets && datasets == NULL)) {
    free(datasets);
    free(l.v);
    admin_job_fail(&e->j, LARDER_ENOMEM, "out of memory");
    return;
  }
  if (all) snprintf(e->what, sizeof(e->what), "the whole cache");
  else if (prefix) snprintf(e->what, sizeof(e->what), "prefix %s", prefix);
  else if (ndatasets)
    snprintf(e->what, sizeof(e->what), "dataset %s%s", datasets[0], ndatasets > 1 ? " ..." : "");
  else snprintf(e->what, sizeof(e->what), "%s%s", pos[0], npos > 1 ? " ..." : "");
  /* Local datasets are resolved as the admin who named them, as a stream
   * or a prefetch of theirs would be. */
  cred_saved_t saved = {0};
  if (ndatasets) {
    acl_peer_t peer;
    conn_peer(c, &peer);
    char why[512];
    rc = cred_enter(&peer, &saved, why, sizeof(why));
    if (rc) {
      free(datasets);
      free(l.v);
      admin_job_fail(&e->j, rc, "%s", why);
      return;
    }
  }
  for (size_t i = 0; i < l.n; i++) {
    const store_object_info_t *o = &l.v[i];
    int take = all;
    if (prefix) take = strncmp(o->name, prefix, strlen(prefix)) == 0;
    if (ndatasets) take = dataset_matches(datasets, ndatasets, o->name);
    for (size_t k = 0; k < npos && !take; k++) {
      uint64_t id;
      take = (is_object_id(pos[k], &id) && id == o->id) || strcmp(pos[k], o->name) == 0;
    }
    if (take) e->ids[e->num_ids++] = o->id;
  }
  if (ndatasets) cred_leave(&saved);
  free(datasets);
  free(l.v);
  if (npos && e->num_ids == 0) {
    admin_job_fail(&e->j, LARDER_ENOENT, "evict: no cached object is %s (see `larderctl ls`)",
                   pos[0]);
    return;
  }
  if (admin_job_queue(&e->j, evict_work, evict_after) != 0)
    admin_job_fail(&e->j, LARDER_ENOMEM, "cannot queue the eviction");
}

typedef struct verify_job {
  job_t j;
  uint64_t checked, bad;
  int rc;
  char err[512];
} verify_job_t;

static void verify_work(job_t *j) {
  verify_job_t *v = (verify_job_t *)j;
  v->rc = store_verify(j->srv->store, &v->checked, &v->bad, v->err, sizeof(v->err));
}

static void verify_after(job_t *j) {
  verify_job_t *v = (verify_job_t *)j;
  if (v->rc == LARDER_ECORRUPT) {
    /* The scan stopped at a damaged table file: values past it were not
     * read, and reads of them fail (and are decoded again) until the file
     * goes. */
    admin_job_fail(j, v->rc,
                   "verify: stopped after %" PRIu64 " values (%" PRIu64
                   " bad, dropped): %s; stop "
                   "larderd and remove %s to start an empty cache (the sources hold everything "
                   "in it)",
                   v->checked, v->bad, v->err[0] ? v->err : larder_strerror(v->rc),
                   j->srv->cfg.cache_dir);
    return;
  }
  if (v->rc) {
    admin_job_fail(j, v->rc, "verify: %s", v->err[0] ? v->err : larder_strerror(v->rc));
    return;
  }
  log_notice("admin verify: %" PRIu64 " values checked, %" PRIu64 " bad ones dropped", v->checked,
             v->bad);
  strbuf_t b = {0};
  char n[32];
  if (j->json)
    strbuf_printf(&b, "{\"checked\":%" PRIu64 ",\"bad\":%" PRIu64 ",\"dropped\":%" PRIu64 "}",
                  v->checked, v->bad, v->bad);
  else if (v->bad == 0)
    strbuf_printf(&b, "checked %s cached values: every checksum matches\n",
                  admin_fmt_count(n, sizeof(n), v->checked));
  else
    strbuf_printf(&b,
                  "checked %s cached values: %" PRIu64
                  " had a bad checksum and were dropped "
                  "(they are rebuilt when next needed)\n",
                  admin_fmt_count(n, sizeof(n), v->checked), v->bad);
  admin_job_finish(j, 0, b.data);
  free(b.data);
}

static void cmd_verify(conn_t *c, const Larder__AdminRequest *req) {
  if (c->srv->store == NULL) {
    admin_reply_error(c, req->request_id, LARDER_EUNSUPPORTED, "the daemon has no cache");
    return;
  }
  verify_job_t *v = admin_job_new(c, req, JOB_VERIFY, sizeof(verify_job_t));
  if (v == NULL) return;
  if (admin_job_queue(&v->j, verify_work, verify_after) != 0)
    admin_job_fail(&v->j, LARDER_ENOMEM, "cannot queue the verification");
}

/* ------------------------------------------------------------------------ */
/* Dispatch                                                                  */

typedef struct admin_cmd {
  const char *name;
  int admin; /* root, the daemon's user or admin_group only */
  int job;   /* runs asynchronously (refused while shutting down) */
  void (*fn)(conn_t *c, const Larder__AdminRequest *req);
} admin_cmd_t;

static const admin_cmd_t commands[] = {
    {"status", 0, 0, cmd_status},         {"stats", 0, 0, admin_cmd_stats},
    {"clients", 0, 0, cmd_clients},       {"ls", 0, 0, cmd_ls},
    {"inspect", 0, 1, admin_cmd_inspect}, {"cat", 0, 1, admin_cmd_cat},
    {"evict", 1, 1, cmd_evict},           {"prefetch", 1, 1, admin_cmd_prefetch},
    {"verify", 1, 1, cmd_verify},         {"reload", 1, 0, cmd_reload},
    {"config", 1, 0, cmd_config},
};

void admin_handle(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  const char *cmd = req->command ? req->command : "";
  c->is_admin_conn = 1;
  const admin_cmd_t *ac = NULL;
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
    if (strcmp(commands[i].name, cmd) == 0) ac = &commands[i];
  if (ac == NULL) {
    admin_reply_error(c, req->request_id, LARDER_EUNSUPPORTED,
                      "unknown admin command '%.64s' (is larderctl newer than larderd %s?)", cmd,
                      LARDERD_VERSION);
    return;
  }
  if (ac->admin) {
    acl_peer_t peer;
    conn_peer(c, &peer);
    if (!acl_is_admin(srv->acl, &peer)) {
      log_notice("client pid %d uid %u: `%s` refused: not root or in the admin group", (int)c->pid,
                 (unsigned)c->uid, cmd);
      admin_reply_error(
          c, req->request_id, LARDER_EACCES,
          "not allowed: `larderctl %s` needs root or membership in the admin group%s%s "
          "(you are uid %u)",
          cmd, srv->cfg.admin_group && *srv->cfg.admin_group ? " " : " (admin_group is not set)",
          srv->cfg.admin_group && *srv->cfg.admin_group ? srv->cfg.admin_group : "",
          (unsigned)c->uid);
      return;
    }
    log_info("admin: %s by pid %d uid %u%s", cmd, (int)c->pid, (unsigned)c->uid,
             req->dry_run ? " (dry run)" : "");
  }
  if (ac->job && srv->shutting_down) {
    admin_reply_error(c, req->request_id, LARDER_ESHUTDOWN, "the daemon is shutting down");
    return;
  }
  ac->fn(c, req);
}
