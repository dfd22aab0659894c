/*
 * fetch.c: HTTP(S) and S3 range requests with libcurl's multi interface
 * inside the libuv loop.  What is S3's own (its URLs, signing, error codes
 * and listings' pages) is in s3.c; this file carries the transfers.
 *
 * The integration follows curl's multi-socket pattern: libcurl tells us
 * which sockets to watch (socket_cb) and when to wake it (timer_cb); each
 * watched socket gets a uv_poll_t (a poll_ctx, freed only in its close
 * callback) and the fetcher owns one uv_timer_t.  After every
 * curl_multi_socket_action the finished transfers are drained with
 * curl_multi_info_read.
 *
 * Each request owns a uv_timer_t for its retry backoff, so a request's
 * memory is freed in that timer's close callback and nowhere else.
 */
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "fetch/awscreds.h"
#include "fetch/fetch.h"
#include "larder.h"
#include "fetch/s3.h"
#include "log.h"
#include "serve/metrics.h"
#include "fetch/version.h"
#include "util.h"

/* RQ_DEFERRED: the result is known when fetch_get is called (an object
 * kept whole, an empty range, shutdown); it is delivered from the request's
 * timer on the next loop iteration, never from inside fetch_get. */
enum { RQ_QUEUED, RQ_RUNNING, RQ_BACKOFF, RQ_DEFERRED, RQ_DONE };

/* The longest a request refused for its credentials waits for the
 * refresher's walk (awscreds_refused): a walk ends sooner (each source has
 * its timeout), unless the refresher was replaced meanwhile (a reload),
 * whose end nobody reports. */
#define CREDS_WAIT_MS 60000

/* Objects kept whole at most: every request for a fresh range and every
 * object kept walks the list, and small objects (a footer and a few rows
 * each) would otherwise number in the millions within max_whole_bytes. */
#define WHOLES_MAX 1024

/* Objects whose server ignored Range, kept whole so they are read once. */
typedef struct whole_obj {
  struct whole_obj *next;
  char *url;
  uint8_t *data;
  uint64_t size;
  char etag[128];
  char last_modified[64];
} whole_obj_t;

/* Hosts kept with no request after their last one ends, for their link
 * measurements (the least recently used goes first). */
#define HOSTS_IDLE_MAX 64
/* The adaptive concurrency (host_adapt): the limit's floor and start, and
 * how often the rate of a request alone is measured again. */
#define HOST_LIMIT_MIN 2
#define HOST_LIMIT_START 2
#define HOST_PROBE_NS (10ull * 1000000000ull)
/* A round whose link waited for first bytes longer than this part of it
 * (no body arriving, requests running) takes one request more. */
#define HOST_IDLE_MAX 0.03
/* A round whose requests each got at least this part of base takes more;
 * less shows them sharing one bottleneck. */
#define HOST_SHARE_MIN 0.75
/* A request waiting this long for its first byte leaves its slot to the
 * others (host_stalled). */
#define HOST_STALL_RTTS 10
#define HOST_STALL_MIN_NS 1000000000ull

/* A host's running requests, for max_inflight_per_host, and what its
 * link measured.  A slot lives while requests name it (refs), and, once
 * it has measurements, among the HOSTS_IDLE_MAX idle ones kept: clients
 * name any number of hosts over a daemon's life, and each request's lookup
 * walks the list. */
typedef struct host_slot {
  struct host_slot *next;
  char name[256];
  uint32_t inflight;
  uint32_t refs;    /* requests whose host it is */
  uint64_t used_ns; /* when a request last named it */
  /* Moving averages (1/8 weight to each new sample) over ranged answers:
   * the wait from sending a request to its first byte, and the rate of
   * one request's body once it flows (what a gap's bytes cost it). */
  uint64_t rtt_us;
  double rate; /* bytes per second */
  uint32_t rtt_samples, rate_samples;
  /* The host's concurrency in force (fetch_options_t.inflight_auto),
   * between HOST_LIMIT_MIN and max_inflight_per_host, and what sets it
   * (host_adapt): the rate of a request with the link nearly to itself,
   * and this round's answers. */
  uint32_t limit;
  int growing;  /* doubling, until a round first shows the link shared */
  double base;  /* bytes per second of a request among HOST_LIMIT_MIN */
  uint32_t gen; /* grows when the limit changes: a round counts only the
                    * answers of requests started under the limit in force */
  uint32_t round_n;
  double round_bytes, round_time_s; /* timed answers: bytes, seconds */
  double round_busy;                /* sum of the requests running */
  /* The link idle for want of a first byte: requests running, none of
   * them receiving its body (host_link).  idle_from: since when, 0: not. */
  uint32_t streaming;
  uint64_t idle_from, idle_ns;
  uint64_t round_t0, round_idle0; /* when this round began; idle_ns then */
  int probing;                    /* a round at HOST_LIMIT_MIN measures base again */
  uint32_t probe_return;          /* the limit after the probe */
  uint64_t probe_at_ns;           /* when the next probe is due */
  uint32_t stalled;               /* running, long without a first byte (host_stalled) */
} host_slot_t;

struct fetch {
  uv_loop_t *loop;
  CURLM *multi;
  uv_timer_t timer;
  fetch_options_t opts;
  /* The S3 signer owns the credentials (opts.s3_access_key, s3_secret_key
   * and s3_session_token point at its copies). */
  s3_signer_t s3;
  fetch_req_t *q_head, *q_tail; /* queued, in ask order */
  host_slot_t *hosts;
  uint64_t inflight_bytes;
  uint32_t demand_running; /* running requests that a trainer waits for */
  uint64_t stalled_at_ns;  /* when host_stalled last counted */
  int running;
  fetch_req_t *live;   /* every request not finished yet */
  whole_obj_t *wholes; /* most recently used first */
  uint64_t whole_bytes;
  uint32_t num_wholes; /* at most WHOLES_MAX */
  int closing;
  int handles_open; /* uv handles not yet closed (timer + polls + reqs) */
  void (*done)(void *);
  void *done_arg;
  uint64_t rng;
  /* The S3 credentials' generation: it grows whenever fetch_set_credentials
   * puts different ones in force.  asked_gen: the generation S3 refused
   * and a walk of the chain was asked for (awscreds_refused), 0: none. */
  uint64_t cred_gen, asked_gen;
};

struct fetch_req {
  fetch_t *f;
  fetch_req_t *next;                  /* queue link */
  fetch_req_t *live_prev, *live_next; /* fetch_t.live: not finished yet */
  int live;
  char *url;
  char *real_url;
  fetch_range_t range;
  int ranged;
  int ahead;       /* read-ahead: queued behind the demand requests */
  int demand_slot; /* counted in demand_running */
  fetch_cb cb;
  void *arg;
  CURL *easy;
  struct curl_slist *headers;
  host_slot_t *host;
  uint32_t host_gen;   /* host_slot_t.gen when it started */
  int streaming;       /* counted in host_slot_t.streaming */
  uint64_t started_ns; /* when this attempt started */
  uint64_t charged;    /* bytes counted in inflight_bytes */
  uint8_t *buf;
  uint64_t len, cap;
  uint64_t expect;    /* bytes the range asks for (0: unknown) */
  int overflow;       /* the body went past body_limit */
  int error_body_cut; /* an error body reached FETCH_ERROR_BODY_MAX */
  int header_too_long;
  int conditional;         /* asked with If-None-Match / If-Modified-Since */
  int is_list;             /* a ListObjectsV2 page */
  uint64_t retry_after_ms; /* the last answer's Retry-After (0: none) */
  uint64_t known_size;     /* fetch_range_t.object_size */
  char known_etag[128];
  char known_lm[64];
  char reval_etag[128]; /* fetch_range_t.revalidate_* */
  char reval_lm[64];
  long http_status;
  char content_range[128];
  char etag[128];
  char last_modified[64];
  char location[512]; /* a redirect's target, without its query string */
  int64_t content_length;
  int attempts;
  uint64_t cred_gen; /* the credentials the last attempt was signed with */
  int creds_wait;    /* refused for its credentials: waits for new ones */
  int creds_fail;    /* ends with LARDER_EACCES from its timer (msg says why) */
  uint64_t start_ns;
  uv_timer_t backoff;
  int state;
  int deferred_status; /* RQ_DEFERRED: the status to finish with */
  int cancelled;
  int freed;
  fetch_result_t res;
  char msg[1024];
  char errbuf[CURL_ERROR_SIZE]; /* libcurl's detail on the last failure */
  /* Listing requests keep their own continuation. */
  void *list_ctx;
};

static uint64_t rnd(fetch_t *f) {
  f->rng += 0x9e3779b97f4a7c15ull;
  uint64_t z = f->rng;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void live_link(fetch_t *f, fetch_req_t *r) {
  r->live = 1;
  r->live_prev = NULL;
  r->live_next = f->live;
  if (f->live) f->live->live_prev = r;
  f->live = r;
}

static void live_unlink(fetch_t *f, fetch_req_t *r) {
  if (!r->live) return;
  r->live = 0;
  if (r->live_prev) r->live_prev->live_next = r->live_next;
  else f->live = r->live_next;
  if (r->live_next) r->live_next->live_prev = r->live_prev;
  r->live_prev = r->live_next = NULL;
}

void fetch_options_init(fetch_options_t *o) {
  memset(o, 0, sizeof(*o));
  o->max_inflight_per_host = 16;
  o->inflight_auto = 1;
  o->max_inflight_bytes = 512ull << 20;
  o->max_retries = 8;
  o->retry_base_ms = 100;
  o->retry_max_ms = 10000;
  o->connect_timeout_s = 10;
  o->low_speed_bytes = 1024;
  o->low_speed_time_s = 30;
  o->tls_verify = 1;
  o->s3_region = "us-east-1";
  o->s3_list_max_keys = 1000;
  o->max_whole_bytes = 1ull << 30;
}

void fetch_redact(const char *url, char *buf, size_t size) {
  /* Drop userinfo (user:password@) and the query string, which may carry
   * presigned credentials. */
  const char *scheme = strstr(url, "://");
  const char *start = scheme ? scheme + 3 : url;
  const char *at = strchr(start, '@');
  const char *slash = strchr(start, '/');
  size_t n = 0;
  if (scheme) n = (size_t)snprintf(buf, size, "%.*s", (int)(start - url), url);
  if (n >= size) return;
  const char *rest = at && (slash == NULL || at < slash) ? at + 1 : start;
  const char *q = strchr(rest, '?');
  snprintf(buf + n, size - n, "%.*s%s", (int)(q ? (size_t)(q - rest) : strlen(rest)), rest,
           q ? "?..." : "");
}

/* ------------------------------------------------------------------------ */
/* URLs                                                                      */

/* The HTTP(S) URL a request goes to: an s3:// URL's on the configured
 * endpoint (s3.h), any other as written.  Returns a malloc'd string, or
 * NULL when out of memory. */
static char *resolve_url(fetch_t *f, const char *url, const char *query) {
  if (strncmp(url, "s3://", 5) == 0) return s3_http_url(&f->opts, url, query);
  return strdup(url);
}

static void host_of(const char *url, char *host, size_t size) {
  const char *s = strstr(url, "://");
  s = s ? s + 3 : url;
  const char *at = strchr(s, '@');
  const char *slash = strchr(s, '/');
  if (at && (slash == NULL || at < slash)) s = at + 1;
  size_t n = strcspn(s, "/?");
  snprintf(host, size, "%.*s", (int)n, s);
}

/* The slot of host name, with a reference for the caller's request;
 * NULL when out of memory (the request then counts for no host). */
static host_slot_t *host_slot(fetch_t *f, const char *name) {
  for (host_slot_t *h = f->hosts; h; h = h->next)
    if (strcmp(h->name, name) == 0) {
      h->refs++;
      h->used_ns = util_now_ns();
      return h;
    }
  host_slot_t *h = calloc(1, sizeof(*h));
  if (h == NULL) return NULL;
  snprintf(h->name, sizeof(h->name), "%s", name);
  h->refs = 1;
  h->used_ns = util_now_ns();
  h->next = f->hosts;
  f->hosts = h;
  return h;
}

/* Drops a request's reference to h.  A slot with no request left is freed,
 * unless it has measurements: then it stays, and the least recently used
 * of more than HOSTS_IDLE_MAX idle slots goes instead. */
static void host_unref(fetch_t *f, host_slot_t *h) {
  if (--h->refs > 0) return;
  host_slot_t **victim = NULL;
  int idle = 0;
  for (host_slot_t **pp = &f->hosts; *pp; pp = &(*pp)->next) {
    host_slot_t *x = *pp;
    if (x->refs > 0) continue;
    if (x == h && h->rtt_samples == 0 && h->rate_samples == 0) {
      victim = pp;
      idle = HOSTS_IDLE_MAX + 1;
      break;
    }
    idle++;
    if (victim == NULL || x->used_ns < (*victim)->used_ns) victim = pp;
  }
  if (idle <= HOSTS_IDLE_MAX || victim == NULL) return;
  host_slot_t *x = *victim;
  *victim = x->next;
  free(x);
}

/* Keeps h's idle time: the link waits, with requests running and none of
 * them receiving its body, for a first byte.  Called whenever either count
 * changes.  Loop thread. */
static void host_link(host_slot_t *h) {
  int idle = h->inflight > 0 && h->streaming == 0;
  if (idle && h->idle_from == 0) h->idle_from = util_now_ns();
  else if (!idle && h->idle_from != 0) {
    h->idle_ns += util_now_ns() - h->idle_from;
    h->idle_from = 0;
  }
}

static uint64_t host_idle_ns(const host_slot_t *h, uint64_t now) {
  return h->idle_ns + (h->idle_from ? now - h->idle_from : 0);
}

/* The limit a host's requests start under: max_inflight_per_host, or with
 * inflight_auto the host's adaptive limit, never above it. */
static uint32_t host_limit(const fetch_t *f, const host_slot_t *h) {
  uint32_t max = f->opts.max_inflight_per_host;
  if (!f->opts.inflight_auto) return max;
  uint32_t lim = h->limit ? h->limit : HOST_LIMIT_START;
  return lim < max ? lim : max;
}

/* Puts lim in force on h: its later requests start a new round. */
static void host_set_limit(fetch_t *f, host_slot_t *h, uint32_t lim) {
  if (lim != h->limit) {
    h->gen++;
    log_debug("%s: %u requests at once%s", h->name, lim, h->probing ? " (probing)" : "");
  }
  h->limit = lim;
  h->round_t0 = util_now_ns();
  h->round_idle0 = host_idle_ns(h, h->round_t0);
  h->round_n = 0;
  h->round_bytes = h->round_time_s = h->round_busy = 0;
  if (f->opts.stats) STATS_SET(f->opts.stats, fetch_host_concurrency, host_limit(f, h));
}

/*
 * Sizes h's concurrency from its measured link, once a round (as many
 * answers as the limit, of requests started under it) has come back.
 * Requests that share one bottleneck each get a part of it: adding one
 * adds nothing but makes every range arrive later, the one needed next
 * too, so that a trainer waits for bytes the link has in fact brought.
 * Requests each limited on their own (a per-connection cap, a first
 * byte's wait) add up.  The round tells them apart as TCP Vegas does, by
 * the rate of one request (its bytes over its time from sending to its
 * last byte; a round's: its answers' bytes over their seconds, so that a
 * short answer weighs little): base, the rate of a request in the first
 * rounds at HOST_LIMIT_MIN, stands for a request with the link nearly to
 * itself, and q = the round's rate / base.
 *
 * q of HOST_SHARE_MIN or more: each request still got most of a lone
 * one's rate, the link takes more, and the limit grows (doubling until a
 * round first shows sharing, then one at a time).  Less: the requests
 * share a bottleneck, and the limit shrinks to what brought bytes
 * (requests running times q) and one to spare; where that is the limit
 * already, a round in which the link waited for a first byte (host_link)
 * more than HOST_IDLE_MAX of the time takes one request more, a round
 * trip the requests in flight left uncovered.  A round without a timed
 * answer (all small) grows it: such requests are bound by their round
 * trips.  Only a round that filled its limit grows it.
 *
 * A round faster than base raises it.  Every HOST_PROBE_NS a probe, one
 * round at HOST_LIMIT_MIN, measures base anew, and the limit returns to
 * what it was: a link that got slower would otherwise shrink the limit
 * for good.  Loop thread.
 */
static void host_adapt(fetch_t *f, host_slot_t *h) {
  uint32_t max = f->opts.max_inflight_per_host;
  double mean = h->round_time_s > 0 ? h->round_bytes / h->round_time_s : 0;
  if (h->probing) {
    if (h->round_n < HOST_LIMIT_MIN) return;
    if (mean > 0) h->base = mean;
    h->probing = 0;
    h->probe_at_ns = util_now_ns() + HOST_PROBE_NS;
    host_set_limit(f, h, h->probe_return);
    return;
  }
  if (h->round_n < h->limit) return;
  if (mean > h->base) h->base = mean;
  double busy = h->round_busy / h->round_n;
  /* q: what each request got of the rate of one among HOST_LIMIT_MIN;
   * busy * q: the requests' worth of bytes the round brought. */
  double q = mean > 0 && h->base > 0 ? mean / h->base : 1;
  uint64_t now = util_now_ns();
  double idle = h->round_t0 && now > h->round_t0
                    ? (double)(host_idle_ns(h, now) - h->round_idle0) / (double)(now - h->round_t0)
                    : 0;
  uint32_t lim = h->limit;
  /* Only a limit the queue filled says anything about more. */
  int full = busy + 0.5 >= (double)lim;
  if (q >= HOST_SHARE_MIN) {
    if (full) lim = h->growing ? lim * 2 : lim + 1;
  } else {
    h->growing = 0;
    double want = busy * q + 1; /* the requests that bring bytes, one to spare */
    if (want + 0.5 < (double)lim) lim = (uint32_t)(want + 0.999);
    else if (idle > HOST_IDLE_MAX && full) lim++;
  }
  if (lim > max) lim = max;
  if (lim < HOST_LIMIT_MIN) lim = HOST_LIMIT_MIN;
  if (!h->growing && lim > HOST_LIMIT_MIN && util_now_ns() >= h->probe_at_ns) {
    h->probing = 1;
    h->probe_return = lim;
    lim = HOST_LIMIT_MIN;
  }
  log_debug("%s: round of %u: busy %.2f, share %.2f, idle %.3f, rate %.0f, base %.0f", h->name,
            h->round_n, busy, q, idle, mean, h->base);
  host_set_limit(f, h, lim);
}

/* Adds r's answer to its host's link measurements: the wait for its first
 * byte, and (for a body long enough to time) its rate once flowing. */
static void host_measure(fetch_req_t *r) {
  host_slot_t *h = r->host;
  curl_off_t pre = 0, start = 0, total = 0;
  if (h == NULL || curl_easy_getinfo(r->easy, CURLINFO_PRETRANSFER_TIME_T, &pre) != CURLE_OK ||
      curl_easy_getinfo(r->easy, CURLINFO_STARTTRANSFER_TIME_T, &start) != CURLE_OK ||
      curl_easy_getinfo(r->easy, CURLINFO_TOTAL_TIME_T, &total) != CURLE_OK || start < pre)
    return;
  uint64_t rtt = (uint64_t)(start - pre);
  h->rtt_us = h->rtt_samples++ ? h->rtt_us - h->rtt_us / 8 + rtt / 8 : rtt;
  /* A body that came in one read has no duration to time. */
  int timed = r->len >= 16384 && total - start >= 50;
  if (timed) {
    double rate = (double)r->len * 1e6 / (double)(total - start);
    h->rate = h->rate_samples++ ? h->rate + (rate - h->rate) / 8 : rate;
  }
  /* The round counts every answer of a request started under the limit in
   * force, timed or not (a host of small answers, each mostly a wait for
   * its first byte, needs more of them at once). */
  if (h->limit == 0) {
    h->limit = HOST_LIMIT_START;
    h->growing = 1;
    h->probe_at_ns = util_now_ns() + HOST_PROBE_NS;
  }
  if (r->host_gen != h->gen) return;
  h->round_n++;
  h->round_busy += h->inflight + 1; /* its own slot is already given back */
  if (timed) {
    h->round_bytes += (double)r->len;
    h->round_time_s += (double)(total - pre) * 1e-6;
  }
  host_adapt(r->f, h);
}

uint64_t fetch_merge_gap(fetch_t *f, const char *url, uint64_t ceiling) {
  char *real = resolve_url(f, url, NULL);
  if (real == NULL) return ceiling;
  char name[256];
  host_of(real, name, sizeof(name));
  free(real);
  uint64_t gap = ceiling;
  for (host_slot_t *h = f->hosts; h; h = h->next)
    if (strcmp(h->name, name) == 0) {
      if (h->rtt_samples == 0 || h->rate_samples == 0) break;
      double g = (double)h->rtt_us * 1e-6 * h->rate;
      if (g < (double)ceiling) gap = (uint64_t)g;
      break;
    }
  if (f->opts.stats) STATS_SET(f->opts.stats, fetch_merge_gap_bytes, gap);
  return gap;
}

static void whole_free(fetch_t *f, whole_obj_t *w);

/*
 * Frees the fetcher once it is being destroyed and its last uv handle (the
 * timer, a request's timer or a socket's poll) has closed.  Every close
 * callback checks, the polls' as well as the timers': transfers cut at
 * shutdown close their sockets after the requests end, so a poll may close
 * last, and the fetcher, libcurl's multi handle and its connections would
 * otherwise leak.  Tested by remote_faults_shutdown.
 */
static void maybe_done(fetch_t *f) {
  if (!f->closing || f->handles_open != 0 || f->done == NULL) return;
  void (*done)(void *) = f->done;
  void *arg = f->done_arg;
  curl_multi_cleanup(f->multi);
  while (f->wholes) {
    whole_obj_t *w = f->wholes;
    f->wholes = w->next;
    whole_free(f, w);
  }
  while (f->hosts) {
    host_slot_t *hs = f->hosts;
    f->hosts = hs->next;
    free(hs);
  }
  s3_signer_free(&f->s3);
  free(f);
  done(arg);
}

/* ------------------------------------------------------------------------ */
/* Socket and timer callbacks (the curl multi + libuv pattern)              */

typedef struct poll_ctx {
  uv_poll_t poll;
  curl_socket_t fd;
  fetch_t *f;
} poll_ctx_t;

static void drain(fetch_t *f);

static void on_poll_close(uv_handle_t *h) {
  poll_ctx_t *ctx = h->data;
  fetch_t *f = ctx->f;
  free(ctx);
  f->handles_open--;
  maybe_done(f);
}

static void on_poll(uv_poll_t *h, int status, int events) {
  poll_ctx_t *ctx = h->data;
  fetch_t *f = ctx->f;
  int flags = 0;
  /* On a socket error (a reset, most often) let libcurl read and write the
   * socket itself: it then fails the transfer with the real cause
   * ("Connection reset by peer") instead of the "select/poll returned
   * error" that CURL_CSELECT_ERR gives, which named no cause. */
  if (status < 0) flags = CURL_CSELECT_IN | CURL_CSELECT_OUT;
  if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  curl_multi_socket_action(f->multi, ctx->fd, flags, &f->running);
  drain(f);
}

static int socket_cb(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp) {
  (void)easy;
  fetch_t *f = userp;
  poll_ctx_t *ctx = socketp;
  if (what == CURL_POLL_REMOVE) {
    if (ctx) {
      uv_poll_stop(&ctx->poll);
      curl_multi_assign(f->multi, s, NULL);
      uv_close((uv_handle_t *)&ctx->poll, on_poll_close);
    }
    return 0;
  }
  if (ctx == NULL) {
    ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) return -1;
    ctx->fd = s;
    ctx->f = f;
    if (uv_poll_init_socket(f->loop, &ctx->poll, s) != 0) {
      free(ctx);
      return -1;
    }
    ctx->poll.data = ctx;
    f->handles_open++;
    curl_multi_assign(f->multi, s, ctx);
  }
  int events = 0;
  if (what & CURL_POLL_IN) events |= UV_READABLE;
  if (what & CURL_POLL_OUT) events |= UV_WRITABLE;
  uv_poll_start(&ctx->poll, events, on_poll);
  return 0;
}

static void on_timeout(uv_timer_t *t) {
  fetch_t *f = t->data;
  curl_multi_socket_action(f->multi, CURL_SOCKET_TIMEOUT, 0, &f->running);
  drain(f);
}

static int timer_cb(CURLM *multi, long timeout_ms, void *userp) {
  (void)multi;
  fetch_t *f = userp;
  if (timeout_ms < 0) uv_timer_stop(&f->timer);
  else uv_timer_start(&f->timer, on_timeout, (uint64_t)timeout_ms, 0);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Transfers                                                                 */

/*
 * The most body bytes r may take: what was asked (fetch.h).  A whole-object
 * answer, or a 206 without a length to a suffix request, is bounded too:
 * otherwise a server sending an endless body would grow the daemon until it
 * is killed.  Tested by remote_hostile_endless_body.
 */
static uint64_t body_limit(const fetch_req_t *r) {
  long st = r->http_status;
  if (st < 200 || st >= 300) return FETCH_ERROR_BODY_MAX;
  if (st == 206 && r->range.suffix) return r->range.suffix;
  if (st == 206 && r->ranged) return r->range.length;
  if (r->is_list) return FETCH_LIST_BODY_MAX;
  /* A whole object: at most what may be kept of one, not merely the
   * object's size: a server that ignores Range may send a multi-gigabyte
   * shard in answer to each of a row group's ranges, all in memory at once.
   * Tested by remote_hostile_no_range_large. */
  uint64_t whole = r->f->opts.max_whole_bytes ? r->f->opts.max_whole_bytes : 1;
  if (r->known_size && r->known_size < whole) return r->known_size;
  return whole;
}

static size_t on_data(char *p, size_t size, size_t nmemb, void *userp) {
  fetch_req_t *r = userp;
  size_t n = size * nmemb;
  if (!r->streaming && r->host && n > 0) {
    r->streaming = 1;
    r->host->streaming++;
    host_link(r->host);
  }
  if (r->len + n > r->cap) {
    uint64_t limit = body_limit(r);
    if (r->len + n > limit) {
      if (r->http_status < 200 || r->http_status >= 300) {
        /* An error body is read for its message; what is beyond the cap
         * is not needed, and the status decides (completed). */
        r->error_body_cut = 1;
        n = (size_t)(limit - r->len);
        if (n) {
          uint8_t *b = realloc(r->buf, limit);
          if (b) {
            r->buf = b;
            r->cap = limit;
            memcpy(r->buf + r->len, p, n);
            r->len += n;
          }
        }
        return 0;
      }
      r->overflow = 1;
      return 0;
    }
    uint64_t cap = r->cap ? r->cap : 65536;
    while (cap < r->len + n) cap *= 2;
    if (cap > limit && limit >= r->len + n) cap = limit;
    uint8_t *b = realloc(r->buf, cap ? cap : 1);
    if (b == NULL) return 0;
    r->buf = b;
    r->cap = cap;
  }
  memcpy(r->buf + r->len, p, n);
  r->len += n;
  return n;
}

static void header_value(const char *line, size_t n, char *out, size_t size) {
  const char *colon = memchr(line, ':', n);
  if (colon == NULL) return;
  const char *v = colon + 1;
  const char *end = line + n;
  while (v < end && isspace((unsigned char)*v)) v++;
  while (end > v && isspace((unsigned char)end[-1])) end--;
  snprintf(out, size, "%.*s", (int)(end - v), v);
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *userp) {
  fetch_req_t *r = userp;
  size_t n = size * nmemb;
  if (n > FETCH_HEADER_LINE_MAX) {
    /* An oversized header line is named as such (not "Out of memory"),
     * and retried.  Tested by remote_hostile_headers. */
    r->header_too_long = 1;
    return 0;
  }
  if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
    /* A new response (after a redirect or 100-continue): start over. */
    r->content_range[0] = r->etag[0] = r->last_modified[0] = '\0';
    r->content_length = -1;
    r->retry_after_ms = 0;
    const char *sp = memchr(p, ' ', n);
    r->http_status = sp ? strtol(sp + 1, NULL, 10) : 0;
    if (r->http_status == 200 && r->len == 0 && r->buf && r->cap && r->expect) {
      /* The buffer was sized for a range; a whole object may come. */
    }
  } else if (n > 14 && strncasecmp(p, "content-range:", 14) == 0) {
    header_value(p, n, r->content_range, sizeof(r->content_range));
  } else if (n > 5 && strncasecmp(p, "etag:", 5) == 0) {
    header_value(p, n, r->etag, sizeof(r->etag));
  } else if (n > 14 && strncasecmp(p, "last-modified:", 14) == 0) {
    header_value(p, n, r->last_modified, sizeof(r->last_modified));
  } else if (n > 9 && strncasecmp(p, "location:", 9) == 0) {
    char loc[sizeof(r->location)];
    header_value(p, n, loc, sizeof(loc));
    /* A presigned target carries its credentials in the query, and a
     * redirect may name a user and password: the message keeps neither
     * (fetch_redact, as for every URL logged). */
    fetch_redact(loc, r->location, sizeof(r->location));
  } else if (n > 15 && strncasecmp(p, "content-length:", 15) == 0) {
    char v[32] = "";
    header_value(p, n, v, sizeof(v));
    r->content_length = strtoll(v, NULL, 10);
  } else if (n > 12 && strncasecmp(p, "retry-after:", 12) == 0) {
    /* Seconds, or an HTTP date (RFC 9110 10.2.3); capped when used. */
    char v[64] = "";
    header_value(p, n, v, sizeof(v));
    char *end = NULL;
    unsigned long long secs = strtoull(v, &end, 10);
    if (v[0] && end && *end == '\0') {
      r->retry_after_ms = secs > 86400 ? 86400000ull : secs * 1000ull;
    } else {
      time_t t = curl_getdate(v, NULL);
      time_t now = time(NULL);
      if (t > now) r->retry_after_ms = (uint64_t)(t - now > 86400 ? 86400 : t - now) * 1000ull;
    }
  }
  return n;
}

static void release_slot(fetch_req_t *r) {
  fetch_t *f = r->f;
  if (r->host && r->state == RQ_RUNNING) r->host->inflight--;
  if (r->host && r->streaming) r->host->streaming--;
  r->streaming = 0;
  if (r->host) host_link(r->host);
  if (r->demand_slot) f->demand_running--;
  r->demand_slot = 0;
  f->inflight_bytes -= r->charged;
  r->charged = 0;
}

static void start_queued(fetch_t *f);

static int setup_easy(fetch_req_t *r) {
  fetch_t *f = r->f;
  if (r->easy == NULL) {
    r->easy = curl_easy_init();
    if (r->easy == NULL) return LARDER_ENOMEM;
  } else {
    curl_easy_reset(r->easy);
  }
  curl_slist_free_all(r->headers);
  r->headers = NULL;
  CURL *e = r->easy;
  curl_easy_setopt(e, CURLOPT_URL, r->real_url);
  curl_easy_setopt(e, CURLOPT_PRIVATE, r);
  r->errbuf[0] = '\0';
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->errbuf);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  /* Redirects are not followed: the allowlist names the hosts the daemon may
   * read for its clients, and a redirect would take it anywhere (another
   * host, a metadata endpoint, file://).  A 3xx fails with the target named,
   * so the operator can list the final URL instead. */
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, (long)f->opts.connect_timeout_s);
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, (long)f->opts.low_speed_bytes);
  curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)f->opts.low_speed_time_s);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, f->opts.tls_verify ? 1L : 0L);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, f->opts.tls_verify ? 2L : 0L);
  if (f->opts.ca_file && *f->opts.ca_file) curl_easy_setopt(e, CURLOPT_CAINFO, f->opts.ca_file);
  curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, NULL);
  curl_easy_setopt(e, CURLOPT_USERAGENT, "larderd/0.1");
  char rangebuf[96];
  if (r->range.suffix) {
    snprintf(rangebuf, sizeof(rangebuf), "Range: bytes=-%llu", (unsigned long long)r->range.suffix);
    r->headers = curl_slist_append(r->headers, rangebuf);
  } else if (r->ranged) {
    snprintf(rangebuf, sizeof(rangebuf), "Range: bytes=%llu-%llu",
             (unsigned long long)r->range.offset,
             (unsigned long long)(r->range.offset + r->range.length - 1));
    r->headers = curl_slist_append(r->headers, rangebuf);
  }
  /* A fresh request for an object kept whole asks whether it changed: the
   * copy kept answers a 304 (completed). */
  r->conditional = 0;
  if (r->range.fresh && !r->is_list) {
    whole_obj_t *w = NULL;
    for (whole_obj_t *x = f->wholes; x; x = x->next)
      if (strcmp(x->url, r->url) == 0) w = x;
    char cond[256];
    if (w && w->etag[0]) {
      snprintf(cond, sizeof(cond), "If-None-Match: %.200s", w->etag);
      r->headers = curl_slist_append(r->headers, cond);
      r->conditional = 1;
    } else if (w && w->last_modified[0]) {
      snprintf(cond, sizeof(cond), "If-Modified-Since: %s", w->last_modified);
      r->headers = curl_slist_append(r->headers, cond);
      r->conditional = 1;
    } else if (w == NULL && r->reval_etag[0]) {
      /* The caller keeps this version's bytes (a footer): 2 marks it. */
      snprintf(cond, sizeof(cond), "If-None-Match: %.200s", r->reval_etag);
      r->headers = curl_slist_append(r->headers, cond);
      r->conditional = 2;
    } else if (w == NULL && r->reval_lm[0]) {
      snprintf(cond, sizeof(cond), "If-Modified-Since: %s", r->reval_lm);
      r->headers = curl_slist_append(r->headers, cond);
      r->conditional = 2;
    }
  }
  if (strncmp(r->url, "s3://", 5) == 0) {
    int rc = s3_sign(&f->s3, e, &r->headers, r->url, r->msg, sizeof(r->msg));
    if (rc) return rc;
    r->cred_gen = f->cred_gen;
  }
  if (r->headers) curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->headers);
  return 0;
}

static void finish(fetch_req_t *r, int status);
static void finish_deferred(fetch_req_t *r, int status);

static void start_one(fetch_req_t *r) {
  fetch_t *f = r->f;
  r->len = 0;
  r->overflow = 0;
  r->error_body_cut = 0;
  r->header_too_long = 0;
  r->retry_after_ms = 0;
  r->http_status = 0;
  r->location[0] = '\0';
  r->content_length = -1;
  r->attempts++;
  /* A request that cannot start gives its slot back, or the bytes it was
   * charged (say, for want of credentials) would stay counted in flight
   * forever; and it ends from the loop: start_queued is walking the queue,
   * which the callback may change.  Tested by remote_s3_errors. */
  int rc = setup_easy(r);
  if (rc) {
    release_slot(r); /* its bytes and demand slot; no host slot yet */
    finish_deferred(r, rc);
    return;
  }
  r->state = RQ_RUNNING;
  r->started_ns = util_now_ns();
  if (r->host) {
    r->host->inflight++;
    r->host_gen = r->host->gen;
    host_link(r->host);
  }
  if (curl_multi_add_handle(f->multi, r->easy) != CURLM_OK) {
    snprintf(r->msg, sizeof(r->msg), "cannot start a transfer");
    release_slot(r);
    finish_deferred(r, LARDER_ENOMEM);
    return;
  }
  if (f->opts.stats) STATS_ADD(f->opts.stats, fetch_inflight, 1);
}

/* Queues r in ask order within its class: demand requests before every
 * read-ahead request, so that a trainer waiting for a row group never waits
 * behind the prefetch of later ones. */
static void enqueue(fetch_t *f, fetch_req_t *r) {
  r->state = RQ_QUEUED;
  r->next = NULL;
  if (!r->ahead) {
    fetch_req_t **pp = &f->q_head;
    while (*pp && !(*pp)->ahead) pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
    if (r->next == NULL) f->q_tail = r;
    return;
  }
  if (f->q_tail) f->q_tail->next = r;
  else f->q_head = r;
  f->q_tail = r;
}

/* Takes a queued request out of the queue. */
static void dequeue(fetch_t *f, fetch_req_t *r) {
  fetch_req_t **pp = &f->q_head, *prev = NULL;
  while (*pp && *pp != r) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (*pp == NULL) return;
  *pp = r->next;
  if (f->q_tail == r) f->q_tail = prev;
  r->next = NULL;
}

void fetch_promote(fetch_req_t *r) {
  if (r == NULL || !r->ahead) return;
  r->ahead = 0;
  if (r->state != RQ_QUEUED) return;
  dequeue(r->f, r);
  enqueue(r->f, r);
  start_queued(r->f);
}

/* Counts each host's stalled requests: running, no byte of the body yet,
 * for HOST_STALL_RTTS of its round trips and at least HOST_STALL_MIN_NS
 * (one server slow to answer some requests must not hold up the rest of a
 * small limit until fetch_low_speed_time ends them).  Walks the requests
 * not finished, from start_queued (libcurl's timer calls that at least
 * once a second while transfers run), at most every 100 ms.  Loop
 * thread. */
static void host_stalled(fetch_t *f) {
  uint64_t now = util_now_ns();
  /* A stall is seconds long: counting them every 100 ms is enough, and
   * keeps the walk off most calls. */
  if (now - f->stalled_at_ns < 100000000ull) return;
  f->stalled_at_ns = now;
  for (host_slot_t *h = f->hosts; h; h = h->next) h->stalled = 0;
  if (!f->opts.inflight_auto) return;
  for (fetch_req_t *r = f->live; r; r = r->live_next) {
    if (r->state != RQ_RUNNING || r->host == NULL || r->streaming) continue;
    uint64_t wait = r->host->rtt_us * 1000ull * HOST_STALL_RTTS;
    if (wait < HOST_STALL_MIN_NS) wait = HOST_STALL_MIN_NS;
    if (now - r->started_ns > wait) r->host->stalled++;
  }
}

static void start_queued(fetch_t *f) {
  host_stalled(f);
  fetch_req_t **pp = &f->q_head;
  fetch_req_t *prev = NULL;
  while (*pp && !f->closing) {
    fetch_req_t *r = *pp;
    uint64_t need = r->ranged && !r->range.suffix ? r->range.length : 65536;
    /* The host's adaptive limit holds back the column ranges, whoever
     * waits for them; a footer or a listing (small, bound by its round
     * trip: an open waits for all of them) may use every slot, and a
     * request that has waited long for its first byte (host_stalled)
     * leaves its slot to the others. */
    host_slot_t *h = r->host;
    int host_ok = 1;
    if (h != NULL) {
      host_ok = h->inflight < f->opts.max_inflight_per_host;
      if (host_ok && r->ranged && !r->range.suffix) {
        uint32_t counted = h->inflight > h->stalled ? h->inflight - h->stalled : 0;
        host_ok = counted < host_limit(f, h);
      }
    }
    /* The bytes limit never blocks the only transfer: one request larger
     * than the limit still goes, alone. */
    int bytes_ok = f->inflight_bytes == 0 || f->inflight_bytes + need <= f->opts.max_inflight_bytes;
    if (!bytes_ok) break; /* keep the ask order for bytes */
    if (!host_ok) {
      prev = r;
      pp = &r->next;
      continue;
    }
    /* While a trainer waits for some request, read-ahead starts nothing
     * new: the link is the trainer's until its data is in.  (Read-ahead
     * already running goes on; parts are short.) */
    if (r->ahead && f->demand_running > 0) break;
    *pp = r->next;
    if (f->q_tail == r) f->q_tail = prev;
    r->next = NULL;
    r->charged = need;
    f->inflight_bytes += need;
    if (!r->ahead) {
      r->demand_slot = 1;
      f->demand_running++;
    }
    start_one(r);
  }
}

static void on_backoff(uv_timer_t *t) {
  fetch_req_t *r = t->data;
  if (r->cancelled || r->f->closing) {
    snprintf(r->msg, sizeof(r->msg), "the daemon is shutting down");
    finish(r, LARDER_ESHUTDOWN);
    return;
  }
  if (r->creds_wait || r->creds_fail) {
    /* Refused for its credentials, and no new ones came (in time). */
    if (r->creds_wait) {
      char tmp[1024];
      snprintf(tmp, sizeof(tmp), "%.900s; no new credentials came within %d s", r->msg,
               CREDS_WAIT_MS / 1000);
      snprintf(r->msg, sizeof(r->msg), "%s", tmp);
    }
    r->creds_wait = r->creds_fail = 0;
    if (r->f->opts.stats) STATS_ADD(r->f->opts.stats, fetch_errors, 1);
    finish(r, LARDER_EACCES);
    start_queued(r->f);
    return;
  }
  /* Back in the queue, at the head of its class: it was asked for before
   * the rest of them. */
  fetch_t *f = r->f;
  r->state = RQ_QUEUED;
  fetch_req_t **pp = &f->q_head;
  while (r->ahead && *pp && !(*pp)->ahead) pp = &(*pp)->next;
  r->next = *pp;
  *pp = r;
  if (r->next == NULL) f->q_tail = r;
  start_queued(f);
}

/* Parses "bytes a-b/total". */
static int parse_content_range(const char *s, uint64_t *a, uint64_t *b, uint64_t *total) {
  unsigned long long x, y;
  char t[32];
  if (sscanf(s, "bytes %llu-%llu/%31s", &x, &y, t) != 3) return -1;
  *a = x;
  *b = y;
  *total = t[0] == '*' ? 0 : strtoull(t, NULL, 10);
  return 0;
}

/* The object kept whole for url, moved to the front (most recently used). */
static whole_obj_t *find_whole(fetch_t *f, const char *url) {
  for (whole_obj_t **pp = &f->wholes; *pp; pp = &(*pp)->next) {
    whole_obj_t *w = *pp;
    if (strcmp(w->url, url) != 0) continue;
    *pp = w->next;
    w->next = f->wholes;
    f->wholes = w;
    return w;
  }
  return NULL;
}

static void whole_free(fetch_t *f, whole_obj_t *w) {
  f->whole_bytes -= w->size;
  f->num_wholes--;
  free(w->url);
  free(w->data);
  free(w);
}

/*
 * Keeps w (the answer of a server that ignores Range) at the front,
 * replacing an older copy of the same object (a fresh read), then drops the
 * least recently used objects beyond max_whole_bytes or WHOLES_MAX (tests:
 * remote_http_no_range: every object of such a server was kept for the
 * daemon's lifetime, so a dataset larger than memory could not be read
 * from one).  The newest object always stays, whatever its size.
 */
static void whole_keep(fetch_t *f, whole_obj_t *w) {
  for (whole_obj_t **pp = &f->wholes; *pp; pp = &(*pp)->next) {
    if (strcmp((*pp)->url, w->url) != 0) continue;
    whole_obj_t *old = *pp;
    *pp = old->next;
    whole_free(f, old);
    break;
  }
  w->next = f->wholes;
  f->wholes = w;
  f->whole_bytes += w->size;
  f->num_wholes++;
  while ((f->whole_bytes > f->opts.max_whole_bytes || f->num_wholes > WHOLES_MAX) &&
         f->wholes->next) {
    whole_obj_t **pp = &f->wholes->next;
    while ((*pp)->next) pp = &(*pp)->next;
    whole_obj_t *last = *pp;
    *pp = NULL;
    whole_free(f, last);
  }
}

static void on_deferred(uv_timer_t *t) {
  fetch_req_t *r = t->data;
  finish(r, r->deferred_status);
}

/* Ends r with status on the next loop iteration. */
static void finish_deferred(fetch_req_t *r, int status) {
  r->state = RQ_DEFERRED;
  r->deferred_status = status;
  uv_timer_start(&r->backoff, on_deferred, 0, 0);
}

/* Ends r now (from a transfer's completion) or deferred (from fetch_get). */
static void end_req(fetch_req_t *r, int status, int deferred) {
  if (deferred) finish_deferred(r, status);
  else finish(r, status);
}

/* Drops the copy of url kept whole, if any. */
static void whole_drop(fetch_t *f, const char *url) {
  for (whole_obj_t **pp = &f->wholes; *pp; pp = &(*pp)->next) {
    if (strcmp((*pp)->url, url) != 0) continue;
    whole_obj_t *w = *pp;
    *pp = w->next;
    whole_free(f, w);
    return;
  }
}

/* Serves r from an object kept whole, if there is one of the version the
 * caller knows (a copy of another version is not the caller's object: the
 * server is asked instead). */
static int serve_from_whole(fetch_req_t *r, int deferred) {
  whole_obj_t *w = find_whole(r->f, r->url);
  if (w == NULL) return 0;
  if (!version_same(r->known_size, r->known_etag, r->known_lm, w->size, w->etag, w->last_modified))
    return 0;
  uint64_t off = r->range.suffix ? (r->range.suffix > w->size ? 0 : w->size - r->range.suffix)
                 : r->ranged     ? r->range.offset
                                 : 0;
  uint64_t len = r->range.suffix ? w->size - off : r->ranged ? r->range.length : w->size;
  if (off > w->size || len > w->size - off) {
    snprintf(r->msg, sizeof(r->msg), "range %llu+%llu is outside the object (%llu bytes)",
             (unsigned long long)off, (unsigned long long)len, (unsigned long long)w->size);
    end_req(r, LARDER_ECORRUPT, deferred);
    return 1;
  }
  free(r->buf);
  r->buf = malloc(len ? len : 1);
  if (r->buf == NULL) {
    end_req(r, LARDER_ENOMEM, deferred);
    return 1;
  }
  memcpy(r->buf, w->data + off, len);
  r->len = r->cap = len;
  r->res.object_size = w->size;
  snprintf(r->res.etag, sizeof(r->res.etag), "%s", w->etag);
  snprintf(r->res.last_modified, sizeof(r->res.last_modified), "%s", w->last_modified);
  r->res.whole_object = 1;
  end_req(r, 0, deferred);
  return 1;
}

/* What a finished transfer's outcome handlers return, besides 0 (done) and
 * a negative code: the request has already ended (served from an object
 * kept whole), and nothing is left for completed to do. */
#define ENDED 1
/* And: S3 refused the request's credentials as expired (token_refused);
 * new ones may cure it (creds_refused). */
#define TOKEN_REFUSED 2

/* A body libcurl stopped taking (CURLE_WRITE_ERROR): over its cap
 * (body_limit) or out of memory.  Returns the code, with r->msg set and
 * *retry set where another answer may differ. */
static int body_refused(fetch_req_t *r, const char *where, int *retry) {
  int code;
  uint64_t limit = body_limit(r);
  code = r->overflow ? LARDER_ECORRUPT : LARDER_ENOMEM;
  *retry = r->overflow;
  if (!r->overflow) {
    snprintf(r->msg, sizeof(r->msg), "%s: out of memory for the body", where);
  } else if (r->http_status != 206 && !r->is_list && r->known_size > limit) {
    /* The whole object, larger than may be kept. */
    *retry = 0;
    code = LARDER_ELIMIT;
    snprintf(r->msg, sizeof(r->msg),
             "%s: HTTP %ld: the server sent the whole object (it ignores Range) and its "
             "%llu bytes are more than fetch_whole_bytes (%llu bytes), the most larderd "
             "keeps of such objects",
             where, r->http_status, (unsigned long long)r->known_size, (unsigned long long)limit);
  } else if (r->http_status == 206 || r->known_size) {
    /* More than the range, or than the object the stream opened: a
     * wrong answer (an error page, another version), maybe not the
     * next one. */
    snprintf(r->msg, sizeof(r->msg), "%s: HTTP %ld: the body is longer than the %llu bytes %s",
             where, r->http_status, (unsigned long long)limit,
             r->http_status == 206 ? "the range asked for" : "of the object");
  } else if (r->is_list) {
    *retry = 0;
    snprintf(r->msg, sizeof(r->msg), "%s: HTTP %ld: a listing page is longer than %llu bytes",
             where, r->http_status, (unsigned long long)limit);
  } else {
    /* A whole object of unknown size, larger than may be kept. */
    *retry = 0;
    code = LARDER_ELIMIT;
    snprintf(r->msg, sizeof(r->msg),
             "%s: HTTP %ld: the server sent the whole object (it ignores Range) and it is "
             "larger than fetch_whole_bytes (%llu bytes), the most larderd keeps of such "
             "objects",
             where, r->http_status, (unsigned long long)limit);
  }
  return code;
}

/* A transfer libcurl failed (cc != CURLE_OK): the code to end it with,
 * with r->msg set and *retry set when another attempt may succeed.  Never
 * returns 0. */
static int transfer_failed(fetch_req_t *r, CURLcode cc, const char *where, const char *why,
                           int *retry) {
  int code;
  if (r->header_too_long || (cc == CURLE_OUT_OF_MEMORY && r->http_status)) {
    /* libcurl fails a header line over its own limit (100 KB) as out of
     * memory; ours is lower (FETCH_HEADER_LINE_MAX).  Either way a proxy or
     * server misbehaves, and another attempt may meet a healthy one. */
    *retry = 1;
    snprintf(r->msg, sizeof(r->msg),
             "%s: HTTP %ld: a response header line is longer than %u bytes (or libcurl's limit)",
             where, r->http_status, (unsigned)FETCH_HEADER_LINE_MAX);
    return LARDER_EREMOTE;
  }
  switch (cc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      *retry = 1;
      code = LARDER_EREMOTE;
      snprintf(r->msg, sizeof(r->msg), "%s: %s%s", where, why,
               cc == CURLE_OPERATION_TIMEDOUT ? " (stalled or timed out)" : "");
      break;
    case CURLE_WRITE_ERROR: code = body_refused(r, where, retry); break;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
      code = LARDER_EACCES;
      snprintf(r->msg, sizeof(r->msg), "%s: TLS verification failed: %s", where, why);
      break;
    default:
      code = LARDER_EREMOTE;
      snprintf(r->msg, sizeof(r->msg), "%s: %s", where, why);
      break;
  }
  return code;
}

/* A 206: the bytes asked for, checked against Content-Range and their
 * count.  Returns 0 (r->res.object_size set) or the code, with r->msg and
 * *retry set. */
static int partial_answer(fetch_req_t *r, const char *where, int *retry) {
  int code = 0;
  uint64_t a, b, total;
  uint64_t want_a = r->range.offset, want_b = r->range.offset + r->range.length - 1;
  if (parse_content_range(r->content_range, &a, &b, &total) != 0) {
    code = LARDER_ECORRUPT;
    *retry = 1;
    snprintf(r->msg, sizeof(r->msg), "%s: 206 without a valid Content-Range ('%s')", where,
             r->content_range);
  } else {
    if (r->range.suffix) {
      want_b = total ? total - 1 : b;
      want_a = r->range.suffix >= want_b + 1 ? 0 : want_b + 1 - r->range.suffix;
    }
    if (a != want_a || b != want_b || (total && b >= total)) {
      code = LARDER_ECORRUPT;
      *retry = 1;
      snprintf(r->msg, sizeof(r->msg), "%s: asked for bytes %llu-%llu, the server answered %s",
               where, (unsigned long long)want_a, (unsigned long long)want_b, r->content_range);
    } else if (r->len != b - a + 1) {
      code = LARDER_EREMOTE;
      *retry = 1;
      snprintf(r->msg, sizeof(r->msg), "%s: short read: %llu of %llu bytes", where,
               (unsigned long long)r->len, (unsigned long long)b - a + 1);
    } else {
      r->res.object_size = total;
    }
  }
  return code;
}

/* A 304 Not Modified: the caller's copy (conditional 2) or the object kept
 * whole (conditional 1) is current, or else a wrong answer.  Returns 0,
 * ENDED (served from the object kept whole) or the code, with r->msg and
 * *retry set. */
static int not_modified_answer(fetch_req_t *r, const char *where, int *retry) {
  fetch_t *f = r->f;
  int code = 0;
  if (r->conditional == 2) {
    /* The caller's copy is current: no bytes, and its validators. */
    r->res.not_modified = 1;
    r->len = 0;
    if (r->etag[0] == '\0') snprintf(r->etag, sizeof(r->etag), "%s", r->reval_etag);
    if (r->last_modified[0] == '\0')
      snprintf(r->last_modified, sizeof(r->last_modified), "%s", r->reval_lm);
  } else if (r->conditional && find_whole(f, r->url)) {
    /* The object kept whole is still current. */
    if (f->opts.stats) STATS_ADD(f->opts.stats, fetch_requests, 1);
    serve_from_whole(r, 0);
    return ENDED;
  } else {
    /* larderd asks conditionally only for an object it keeps whole; a
     * 304 otherwise (a caching proxy answering for a client that never
     * asked, or the copy just dropped) is an error, not a redirect
     * without a target, and is retried, unconditionally.  Tested by
     * remote_hostile_headers. */
    code = LARDER_EREMOTE;
    *retry = 1;
    snprintf(r->msg, sizeof(r->msg), "%s: HTTP 304 Not Modified to a request %s", where,
             r->conditional ? "whose object larderd no longer keeps"
                            : "that was not conditional (a caching proxy answering wrongly?)");
  }
  return code;
}

/* A 200: the whole object.  A range asked for means the server ignores
 * Range: the object is kept whole so that it is downloaded only once, and
 * the range is served from it.  Returns 0 (r->res.object_size set), ENDED
 * (served from the object kept) or the code, with r->msg and *retry set. */
static int whole_answer(fetch_req_t *r, const char *where, int *retry) {
  fetch_t *f = r->f;
  int code = 0;
  if (r->content_length >= 0 && r->len != (uint64_t)r->content_length) {
    code = LARDER_EREMOTE;
    *retry = 1;
    snprintf(r->msg, sizeof(r->msg), "%s: short read: %llu of %lld bytes", where,
             (unsigned long long)r->len, (long long)r->content_length);
  } else if ((r->ranged || r->range.suffix) &&
             !version_same(r->known_size, r->known_etag, r->known_lm, r->len, r->etag,
                           r->last_modified)) {
    /* A 200 answering a range that disagrees with the object the
     * stream opened is an error for this request, retried, and never
     * kept: kept as the whole object, a 24-byte maintenance page would
     * stand for the object until the daemon restarted.  Tested by
     * remote_hostile_wrong_whole. */
    code = LARDER_EREMOTE;
    *retry = 1;
    snprintf(r->msg, sizeof(r->msg),
             "%s: HTTP 200 with %llu bytes%s%s answering a range request, but the object is "
             "%llu bytes%s%s: not the object (an error page?); not used",
             where, (unsigned long long)r->len, r->etag[0] ? ", ETag " : "", r->etag,
             (unsigned long long)r->known_size, r->known_etag[0] ? ", ETag " : "", r->known_etag);
  } else {
    r->res.object_size = r->len;
    if (r->ranged || r->range.suffix) {
      whole_obj_t *w = calloc(1, sizeof(*w));
      if (w) w->url = strdup(r->url);
      if (w && w->url == NULL) {
        free(w);
        w = NULL;
      }
      if (w) {
        w->data = r->buf;
        w->size = r->len;
        snprintf(w->etag, sizeof(w->etag), "%s", r->etag);
        snprintf(w->last_modified, sizeof(w->last_modified), "%s", r->last_modified);
        whole_keep(f, w);
        r->buf = NULL;
        r->len = r->cap = 0;
        snprintf(r->res.etag, sizeof(r->res.etag), "%s", r->etag);
        snprintf(r->res.last_modified, sizeof(r->res.last_modified), "%s", r->last_modified);
        log_notice("%s ignores Range requests: read the whole object once", where);
        if (f->opts.stats) STATS_ADD(f->opts.stats, fetch_bytes, w->size);
        if (f->opts.stats) STATS_ADD(f->opts.stats, fetch_requests, 1);
        serve_from_whole(r, 0);
        return ENDED;
      }
    }
  }
  return code;
}

/* Any other status: refused (4xx, 3xx) or failed (5xx, 429).  Returns the
 * code (never 0), with r->msg and *retry set.  s3: S3's error code from the
 * body, or "". */
static int status_refused(fetch_req_t *r, long st, const char *s3, const char *where, int *retry) {
  int code;
  if (st == 403 || st == 401) {
    code = LARDER_EACCES;
    snprintf(r->msg, sizeof(r->msg), "access denied for %s: check credentials (HTTP %ld%s%s)",
             where, st, s3[0] ? " " : "", s3);
  } else if (st == 404) {
    code = LARDER_ENOENT;
    snprintf(r->msg, sizeof(r->msg), "not found: %s (HTTP 404%s%s)", where, s3[0] ? " " : "", s3);
  } else if (st >= 300 && st < 400) {
    code = LARDER_EREMOTE;
    snprintf(r->msg, sizeof(r->msg),
             "%.500s: redirected (HTTP %ld) to %.300s; larderd does not follow redirects, so that "
             "the allowlist covers every host it reads: use the final URL as the source",
             where, st, r->location[0] ? r->location : "(no Location header)");
  } else if (st == 416) {
    code = LARDER_ECORRUPT;
    if (r->range.suffix)
      snprintf(r->msg, sizeof(r->msg), "%s: not a Parquet file: the object is empty (HTTP 416)",
               where);
    else
      snprintf(r->msg, sizeof(r->msg),
               "%s: range not satisfiable (HTTP 416): the object is "
               "shorter than its footer says",
               where);
  } else if (st == 429 || st >= 500) {
    code = LARDER_EREMOTE;
    *retry = 1;
    snprintf(r->msg, sizeof(r->msg), "%s: HTTP %ld%s%s", where, st, s3[0] ? " " : "", s3);
  } else if (st == 400 && strstr(s3, "Signature")) {
    code = LARDER_EACCES;
    snprintf(r->msg, sizeof(r->msg), "access denied for %s: check credentials (HTTP 400 %s)", where,
             s3);
  } else {
    code = LARDER_EREMOTE;
    snprintf(r->msg, sizeof(r->msg), "%s: unexpected HTTP %ld%s%s", where, st, s3[0] ? " " : "",
             s3);
  }
  return code;
}

/* Whether S3 refused a request (HTTP st, error code s3) because its
 * temporary credentials expired or were revoked: AWS's SDKs take these
 * codes as a sign to fetch credentials again. */
static int token_refused(long st, const char *s3) {
  static const char *const codes[] = {"ExpiredToken", "TokenRefreshRequired", "InvalidToken",
                                      "ExpiredTokenException"};
  if (st != 400 && st != 403) return 0;
  for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
    if (strcmp(s3, codes[i]) == 0) return 1;
  return 0;
}

/* A transfer libcurl completed: what its HTTP status means.  Returns 0,
 * ENDED or the code, with r->msg and *retry set. */
static int http_answer(fetch_req_t *r, const char *where, int *retry) {
  int code;
  long st = 0;
  curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &st);
  r->http_status = st;
  char s3[64];
  s3_error_code(r->buf, r->len, s3, sizeof(s3));
  if (st == 206) return partial_answer(r, where, retry);
  if (st == 304) return not_modified_answer(r, where, retry);
  if (st == 200) return whole_answer(r, where, retry);
  code = status_refused(r, st, s3, where, retry);
  return token_refused(st, s3) ? TOKEN_REFUSED : code;
}

/* Ends r with its bytes and validators.  A copy of the object kept whole
 * that the answer shows stale is dropped. */
static void succeeded(fetch_req_t *r) {
  fetch_t *f = r->f;
  snprintf(r->res.etag, sizeof(r->res.etag), "%s", r->etag);
  snprintf(r->res.last_modified, sizeof(r->res.last_modified), "%s", r->last_modified);
  /* A fresh answer of another version than the copy kept whole (a server
   * that ignores Range only at times, as a CDN on a miss) makes the copy
   * stale: later ranges must come from the server, not from it.  Tested
   * by remote_hostile_no_range_change. */
  whole_obj_t *w = r->range.fresh ? find_whole(f, r->url) : NULL;
  if (w && !version_same(w->size, w->etag, w->last_modified, r->res.object_size, r->etag,
                         r->last_modified))
    whole_drop(f, r->url);
  if (f->opts.stats) {
    STATS_ADD(f->opts.stats, fetch_bytes, r->len);
    STATS_ADD(f->opts.stats, fetch_requests, 1);
  }
  if (r->http_status == 206) host_measure(r);
  finish(r, 0);
}

/* The backoff before r's next attempt: retry_base_ms doubling with each
 * attempt made, up to retry_max_ms, with full jitter in [delay/2, delay)
 * so that retries from many ranks spread out. */
static uint64_t backoff_ms(fetch_req_t *r) {
  fetch_t *f = r->f;
  int shift = r->attempts > 16 ? 16 : r->attempts > 0 ? r->attempts - 1 : 0;
  uint64_t delay = (uint64_t)f->opts.retry_base_ms << shift;
  if (delay > f->opts.retry_max_ms) delay = f->opts.retry_max_ms;
  return delay / 2 + rnd(f) % (delay / 2 + 1);
}

/* Ends r with code, or, where retry allows and attempts are left, waits
 * out a backoff and queues it again.  Either way the queue moves on. */
static void retry_or_fail(fetch_req_t *r, int code, int retry) {
  fetch_t *f = r->f;
  if (retry && !r->cancelled && !f->closing && (uint32_t)r->attempts <= f->opts.max_retries) {
    if (f->opts.stats) STATS_ADD(f->opts.stats, fetch_retries, 1);
    uint64_t delay = backoff_ms(r);
    /* Retry-After lengthens the wait, up to retry_max_ms, so that a server
     * asking for an hour cannot hold a stream that long.  Tested by
     * remote_hostile_headers. */
    if (r->retry_after_ms > delay)
      delay = r->retry_after_ms < f->opts.retry_max_ms ? r->retry_after_ms : f->opts.retry_max_ms;
    log_debug("%s; retry %d in %llu ms", r->msg, r->attempts, (unsigned long long)delay);
    r->state = RQ_BACKOFF;
    uv_timer_start(&r->backoff, on_backoff, delay, 0);
    start_queued(f);
    return;
  }
  if (retry) {
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%.900s; gave up after %d attempts", r->msg, r->attempts);
    snprintf(r->msg, sizeof(r->msg), "%s", tmp);
  }
  if (f->opts.stats) STATS_ADD(f->opts.stats, fetch_errors, 1);
  finish(r, code);
  start_queued(f);
}

/* Puts every request waiting for new credentials back on its way: after
 * a backoff when new ones are in force (fail 0), else ending it with
 * LARDER_EACCES, why appended to its message.  Only timers are started
 * here, so that no callback runs while the list is walked. */
static void creds_release(fetch_t *f, int fail, const char *why) {
  for (fetch_req_t *r = f->live; r; r = r->live_next) {
    if (!r->creds_wait) continue;
    r->creds_wait = 0;
    uint64_t delay = 0;
    if (fail) {
      r->creds_fail = 1;
      size_t n = strlen(r->msg);
      snprintf(r->msg + n, sizeof(r->msg) - n, ", and renewing them did not help: %s", why);
    } else {
      if (f->opts.stats) STATS_ADD(f->opts.stats, fetch_retries, 1);
      delay = backoff_ms(r);
      log_debug("%s; new credentials are in force: retry %d in %llu ms", r->msg, r->attempts,
                (unsigned long long)delay);
    }
    uv_timer_start(&r->backoff, on_backoff, delay, 0);
  }
}

/* The end of the walk creds_refused asked for (awscreds_refused_cb): new
 * credentials have released the waiting requests already
 * (fetch_set_credentials); the refused ones still in force, or no value,
 * end them. */
static void on_creds_walked(int status, void *arg) {
  fetch_t *f = arg;
  if (f->asked_gen == 0) return;
  int same = f->asked_gen == f->cred_gen;
  f->asked_gen = 0;
  if (!same || f->closing) return;
  char why[160];
  if (status == 0) {
    /* The walk succeeded (credentials_refreshes counted it) but helped
     * nothing: counted as a failed refresh. */
    snprintf(why, sizeof(why), "the credential source gave the same credentials again");
    if (f->opts.stats) STATS_ADD(f->opts.stats, credentials_refresh_errors, 1);
  } else {
    snprintf(why, sizeof(why), "the refresh failed (%s; the log says more)",
             larder_strerror(status));
  }
  log_warn("S3 refused the credentials in force as expired, and renewing them did not help: %s",
           why);
  creds_release(f, 1, why);
}

/*
 * S3 refused r's credentials as expired or revoked (token_refused) before
 * their stated expiration (clock skew, a revoked session).  Signed with
 * credentials no longer in force, r is retried as after any failure; else
 * it waits (in state RQ_BACKOFF, at most CREDS_WAIT_MS) while the chain is
 * walked again (awscreds_refused), once for all the requests refused with
 * the same credentials, and is retried when new ones are in force, within
 * the usual attempts.  It fails with LARDER_EACCES when no attempt is
 * left, when no refresher runs (the configuration's keys), or when the
 * walk gives no new credentials (on_creds_walked).
 */
static void creds_refused(fetch_req_t *r, int code, const char *where, const char *s3) {
  fetch_t *f = r->f;
  if (r->cred_gen != f->cred_gen) {
    retry_or_fail(r, code, 1);
    return;
  }
  int rc = 0;
  if (f->asked_gen != f->cred_gen) {
    rc = awscreds_refused(f->opts.creds ? *f->opts.creds : NULL, on_creds_walked, f);
    if (rc == 0) {
      f->asked_gen = f->cred_gen;
      log_warn("S3 refused the credentials in force (HTTP %ld %s for %s): resolving them again",
               r->http_status, s3, where);
    }
  }
  if (rc != 0 || r->cancelled || f->closing || (uint32_t)r->attempts > f->opts.max_retries) {
    /* Nothing renews them, or no attempt is left: status_refused's
     * message (access denied). */
    if (rc == 0 && !r->cancelled && !f->closing) {
      char tmp[1024];
      snprintf(tmp, sizeof(tmp), "%.900s; gave up after %d attempts", r->msg, r->attempts);
      snprintf(r->msg, sizeof(r->msg), "%s", tmp);
    }
    retry_or_fail(r, code, 0);
    return;
  }
  snprintf(r->msg, sizeof(r->msg),
           "access denied for %.600s: S3 refused the credentials as expired or revoked (HTTP %ld "
           "%s)",
           where, r->http_status, s3);
  r->state = RQ_BACKOFF;
  r->creds_wait = 1;
  uv_timer_start(&r->backoff, on_backoff, CREDS_WAIT_MS, 0);
  start_queued(f);
}

/* Decides what a finished transfer means: done, retry, or fail. */
static void completed(fetch_req_t *r, CURLcode cc) {
  fetch_t *f = r->f;
  char where[400];
  fetch_redact(r->url, where, sizeof(where));
  if (f->opts.stats) STATS_SUB(f->opts.stats, fetch_inflight, 1);
  release_slot(r);
  curl_multi_remove_handle(f->multi, r->easy);
  int retry = 0, code = 0;
  /* libcurl's error buffer says more than curl_easy_strerror (which
   * certificate check failed, which host did not answer); it never holds
   * credentials. */
  const char *why = r->errbuf[0] ? r->errbuf : curl_easy_strerror(cc);
  /* An error body cut at its cap still has its status to decide by. */
  if (cc == CURLE_WRITE_ERROR && r->error_body_cut && !r->header_too_long) cc = CURLE_OK;
  if (cc != CURLE_OK) code = transfer_failed(r, cc, where, why, &retry);
  else code = http_answer(r, where, &retry);
  if (code == ENDED) return;
  if (code == TOKEN_REFUSED) {
    char s3[64];
    s3_error_code(r->buf, r->len, s3, sizeof(s3));
    creds_refused(r, LARDER_EACCES, where, s3);
    return;
  }
  if (code == 0) {
    succeeded(r);
    return;
  }
  retry_or_fail(r, code, retry);
}

static void on_req_close(uv_handle_t *h) {
  fetch_req_t *r = h->data;
  fetch_t *f = r->f;
  if (r->host) host_unref(f, r->host);
  if (r->easy) curl_easy_cleanup(r->easy);
  curl_slist_free_all(r->headers);
  free(r->buf);
  free(r->url);
  free(r->real_url);
  free(r);
  f->handles_open--;
  maybe_done(f);
}

static void finish(fetch_req_t *r, int status) {
  live_unlink(r->f, r);
  r->state = RQ_DONE;
  r->res.status = status;
  r->res.message = status ? r->msg : NULL;
  r->res.data = r->buf;
  r->res.length = r->len;
  r->res.attempts = r->attempts;
  r->res.fetch_ns = util_now_ns() - r->start_ns;
  if (r->f->opts.stats && status == 0) STATS_ADD(r->f->opts.stats, fetch_ns, r->res.fetch_ns);
  if (status == 0) metrics_observe_fetch(r->res.fetch_ns);
  if (r->cancelled) {
    fetch_req_free(r);
    return;
  }
  if (r->cb) r->cb(r, &r->res, r->arg);
}

static void drain(fetch_t *f) {
  CURLMsg *m;
  int left;
  while ((m = curl_multi_info_read(f->multi, &left)) != NULL) {
    if (m->msg != CURLMSG_DONE) continue;
    fetch_req_t *r = NULL;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
    if (r) completed(r, m->data.result);
  }
  start_queued(f);
}

/* ------------------------------------------------------------------------ */

int fetch_create(uv_loop_t *loop, const fetch_options_t *opts, fetch_t **out) {
  static int global_init;
  if (!global_init) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return LARDER_EIO;
    global_init = 1;
  }
  fetch_t *f = calloc(1, sizeof(*f));
  if (f == NULL) return LARDER_ENOMEM;
  f->loop = loop;
  f->opts = *opts;
  f->rng = util_now_ns();
  f->multi = curl_multi_init();
  if (f->multi == NULL) {
    free(f);
    return LARDER_ENOMEM;
  }
  s3_signer_init(&f->s3, opts->s3_region);
  f->opts.s3_access_key = f->opts.s3_secret_key = f->opts.s3_session_token = NULL;
  if (fetch_set_credentials(f, opts->s3_access_key, opts->s3_secret_key, opts->s3_session_token) !=
      0) {
    curl_multi_cleanup(f->multi);
    free(f);
    return LARDER_ENOMEM;
  }
  curl_multi_setopt(f->multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
  curl_multi_setopt(f->multi, CURLMOPT_SOCKETDATA, f);
  curl_multi_setopt(f->multi, CURLMOPT_TIMERFUNCTION, timer_cb);
  curl_multi_setopt(f->multi, CURLMOPT_TIMERDATA, f);
  curl_multi_setopt(f->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)opts->max_inflight_per_host);
  uv_timer_init(loop, &f->timer);
  f->timer.data = f;
  f->handles_open = 1;
  *out = f;
  return 0;
}

static void on_fetch_timer_close(uv_handle_t *h) {
  fetch_t *f = h->data;
  f->handles_open--;
  maybe_done(f);
}

static void noop_done(void *arg) { (void)arg; }

/*
 * Ends every fetch at once; begin_shutdown calls it.  fetch_destroy alone
 * would not do: the daemon calls it once no task is in flight, and a stream
 * open waiting for its footers is such a task, so SIGTERM would wait for
 * every attempt of a server that never answers (nearly five minutes by
 * default).  Tested by remote_hostile_shutdown.
 */
void fetch_shutdown(fetch_t *f) {
  f->closing = 1;
  /* Queued requests never started: they end now. */
  while (f->q_head) {
    fetch_req_t *r = f->q_head;
    f->q_head = r->next;
    snprintf(r->msg, sizeof(r->msg), "the daemon is shutting down");
    finish(r, LARDER_ESHUTDOWN);
  }
  f->q_tail = NULL;
  /* Transfers in flight and requests waiting out a backoff end now too:
   * left to run on, a server that stalls would hold the daemon's exit for
   * the whole low-speed time (30 s by default), and a backoff for up to
   * retry_max_ms.  Callbacks may end or start others (those end from the
   * loop), so start over from the head each time.  Deferred ones end on the
   * next iteration anyway.  Tested by remote_faults_shutdown. */
  for (;;) {
    fetch_req_t *r = f->live;
    while (r && r->state != RQ_RUNNING && r->state != RQ_BACKOFF) r = r->live_next;
    if (r == NULL) break;
    if (r->state == RQ_RUNNING) {
      if (f->opts.stats) STATS_SUB(f->opts.stats, fetch_inflight, 1);
      release_slot(r);
      curl_multi_remove_handle(f->multi, r->easy);
    } else {
      uv_timer_stop(&r->backoff);
    }
    snprintf(r->msg, sizeof(r->msg), "the daemon is shutting down");
    finish(r, LARDER_ESHUTDOWN);
  }
}

void fetch_destroy(fetch_t *f, void (*done)(void *), void *arg) {
  awscreds_refused_cancel(f->opts.creds ? *f->opts.creds : NULL, f);
  f->done = done ? done : noop_done;
  f->done_arg = arg;
  fetch_shutdown(f);
  uv_timer_stop(&f->timer);
  uv_close((uv_handle_t *)&f->timer, on_fetch_timer_close);
}

/* Whether two credential strings (each may be NULL) differ. */
static int cred_differs(const char *a, const char *b) {
  if (a == NULL || b == NULL) return a != b;
  return strcmp(a, b) != 0;
}

int fetch_set_credentials(fetch_t *f, const char *access_key, const char *secret_key,
                          const char *session_token) {
  int changed = cred_differs(f->s3.cred[0], access_key) ||
                cred_differs(f->s3.cred[1], secret_key) ||
                cred_differs(f->s3.cred[2], session_token);
  int rc = s3_signer_set(&f->s3, access_key, secret_key, session_token);
  if (rc) return rc;
  f->opts.s3_access_key = f->s3.cred[0];
  f->opts.s3_secret_key = f->s3.cred[1];
  f->opts.s3_session_token = f->s3.cred[2];
  if (changed) {
    /* Requests refused for the old ones try the new ones. */
    f->cred_gen++;
    creds_release(f, 0, NULL);
  }
  return 0;
}

void fetch_set_limits(fetch_t *f, uint32_t per_host, int inflight_auto, uint64_t bytes,
                      uint32_t retries, uint32_t retry_base_ms) {
  f->opts.max_inflight_per_host = per_host ? per_host : 1;
  f->opts.inflight_auto = inflight_auto;
  f->opts.max_inflight_bytes = bytes ? bytes : 1;
  f->opts.max_retries = retries;
  f->opts.retry_base_ms = retry_base_ms ? retry_base_ms : 1;
  curl_multi_setopt(f->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)f->opts.max_inflight_per_host);
  start_queued(f);
}

fetch_req_t *fetch_get(fetch_t *f, const char *url, const fetch_range_t *range, fetch_cb cb,
                       void *arg) {
  fetch_req_t *r = calloc(1, sizeof(*r));
  if (r == NULL) return NULL;
  r->f = f;
  r->url = strdup(url);
  r->real_url = resolve_url(f, url, NULL);
  if (r->url == NULL || r->real_url == NULL) {
    free(r->url);
    free(r->real_url);
    free(r);
    return NULL;
  }
  if (range) {
    r->range = *range;
    r->range.etag = r->range.last_modified = NULL; /* copied below */
    r->range.revalidate_etag = r->range.revalidate_last_modified = NULL;
    if (range->revalidate_etag)
      snprintf(r->reval_etag, sizeof(r->reval_etag), "%s", range->revalidate_etag);
    if (range->revalidate_last_modified)
      snprintf(r->reval_lm, sizeof(r->reval_lm), "%s", range->revalidate_last_modified);
    r->ahead = range->ahead != 0;
    r->ranged = range->suffix == 0;
    r->expect = range->suffix ? 0 : range->length;
    r->known_size = range->object_size;
    if (range->etag) snprintf(r->known_etag, sizeof(r->known_etag), "%s", range->etag);
    if (range->last_modified)
      snprintf(r->known_lm, sizeof(r->known_lm), "%s", range->last_modified);
  }
  r->cb = cb;
  r->arg = arg;
  r->start_ns = util_now_ns();
  r->content_length = -1;
  char host[256];
  host_of(r->real_url, host, sizeof(host));
  r->host = host_slot(f, host);
  uv_timer_init(f->loop, &r->backoff);
  r->backoff.data = r;
  f->handles_open++;
  live_link(f, r);
  /* These call back from the loop, after fetch_get has returned, never from
   * inside it: before the caller has stored the request it returns, units.c
   * would miss the data of ranges cut from an object kept whole and later
   * cancel a freed request.  Tested by remote_http_no_range. */
  if (r->ranged && r->range.length == 0) {
    finish_deferred(r, 0);
    return r;
  }
  if (f->closing) {
    snprintf(r->msg, sizeof(r->msg), "the daemon is shutting down");
    finish_deferred(r, LARDER_ESHUTDOWN);
    return r;
  }
  /* A revalidation is never answered from the object kept whole, or a
   * changed object on a server that ignores Range would go unnoticed.
   * Tested by remote_revalidate. */
  if (!r->range.fresh && serve_from_whole(r, 1)) return r;
  enqueue(f, r);
  start_queued(f);
  return r;
}

void fetch_req_free(fetch_req_t *r) {
  if (r == NULL || r->freed) return;
  if (r->state != RQ_DONE) {
    /* Still running: let it finish, then free. */
    r->cancelled = 1;
    r->cb = NULL;
    if (r->state == RQ_BACKOFF || r->state == RQ_DEFERRED) {
      /* Only its timer is pending: no need to wait out a backoff (up to
       * retry_max_ms) before freeing it. */
      r->state = RQ_DONE;
    } else if (r->state == RQ_QUEUED) {
      dequeue(r->f, r);
      r->state = RQ_DONE;
    } else {
      return;
    }
  }
  live_unlink(r->f, r);
  r->freed = 1;
  uv_timer_stop(&r->backoff);
  uv_close((uv_handle_t *)&r->backoff, on_req_close);
}

void fetch_cancel(fetch_req_t *r) { fetch_req_free(r); }

uint8_t *fetch_req_steal(fetch_req_t *r, uint64_t *length) {
  uint8_t *b = r->buf;
  *length = r->len;
  r->buf = NULL;
  r->len = r->cap = 0;
  r->res.data = NULL;
  return b;
}

/* ------------------------------------------------------------------------ */
/* ListObjectsV2: the pages' transfers (what they say is s3.c's)            */

typedef struct list_ctx {
  fetch_t *f;
  s3_listing_t *ls;
  fetch_list_cb cb;
  void *arg;
} list_ctx_t;

static void list_next(list_ctx_t *lc);

static void list_free(list_ctx_t *lc) {
  s3_listing_free(lc->ls);
  free(lc);
}

/* A page's answer: the next page, the objects listed, or the error.
 * Exactly one of them, and lc is freed unless a page follows. */
static void list_page(fetch_req_t *req, const fetch_result_t *res, void *arg) {
  list_ctx_t *lc = arg;
  if (res->status != 0) {
    lc->cb(res->status, res->message, NULL, 0, lc->arg);
    fetch_req_free(req);
    list_free(lc);
    return;
  }
  char m[1400], where[600];
  fetch_redact(req->url ? req->url : "", where, sizeof(where));
  int rc = s3_listing_page(lc->ls, (const char *)res->data, res->length, where, m, sizeof(m));
  fetch_req_free(req);
  if (rc < 0) {
    lc->cb(rc, m, NULL, 0, lc->arg);
    list_free(lc);
    return;
  }
  if (rc > 0) {
    list_next(lc);
    return;
  }
  size_t n = 0;
  fetch_object_t *objs = s3_listing_take(lc->ls, &n);
  lc->cb(0, NULL, objs, n, lc->arg);
  list_free(lc);
}

/* Queues the request of the listing's next page. */
static void list_next(list_ctx_t *lc) {
  char query[4096], bucket_url[1100];
  s3_listing_next_page(lc->ls, lc->f->opts.s3_list_max_keys, query, sizeof(query), bucket_url,
                       sizeof(bucket_url));
  fetch_req_t *r = calloc(1, sizeof(*r));
  if (r == NULL) {
    lc->cb(LARDER_ENOMEM, "out of memory", NULL, 0, lc->arg);
    list_free(lc);
    return;
  }
  fetch_t *f = lc->f;
  r->f = f;
  r->url = s3_listing_name(lc->ls);
  r->real_url = resolve_url(f, bucket_url, query);
  r->cb = list_page;
  r->arg = lc;
  r->is_list = 1;
  r->start_ns = util_now_ns();
  r->content_length = -1;
  char host[256];
  host_of(r->real_url ? r->real_url : "", host, sizeof(host));
  r->host = host_slot(f, host);
  uv_timer_init(f->loop, &r->backoff);
  r->backoff.data = r;
  f->handles_open++;
  live_link(f, r);
  if (r->url == NULL || r->real_url == NULL) {
    snprintf(r->msg, sizeof(r->msg), "out of memory");
    finish_deferred(r, LARDER_ENOMEM);
    return;
  }
  if (f->closing) {
    snprintf(r->msg, sizeof(r->msg), "the daemon is shutting down");
    finish_deferred(r, LARDER_ESHUTDOWN);
    return;
  }
  enqueue(f, r);
  start_queued(f);
}

int fetch_list(fetch_t *f, const char *s3_prefix, const char *pattern, fetch_list_cb cb,
               void *arg) {
  s3_listing_t *ls = NULL;
  int rc = s3_listing_create(s3_prefix, pattern, &ls);
  if (rc) return rc;
  list_ctx_t *lc = calloc(1, sizeof(*lc));
  if (lc == NULL) {
    s3_listing_free(ls);
    return LARDER_ENOMEM;
  }
  lc->f = f;
  lc->ls = ls;
  lc->cb = cb;
  lc->arg = arg;
  list_next(lc);
  return 0;
}
