/*
 * work.c: larderd's worker threads (see work.h for why they are not
 * libuv's).
 */
#include "work.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "larder.h"
#include "htab.h"
#include "log.h"
#include "util.h"

/*
 * Fairness between owners
 * -----------------------
 * Each foreground task waits in its owner's queue (work_t.owner: a client,
 * 0 for tasks of no one in particular).  Owners with waiting tasks form a
 * ring, and a free worker serves them in turn, one task each, so one
 * owner's thousand queued units wait behind another's next batch, not the
 * other way round.  Turns alone are not enough when tasks take long: with
 * every worker on costly units (30 s each), another owner's cheap task
 * still waits for one to finish.  So an owner is costly when its tasks
 * averaged COSTLY_NS or more of late, and while some owner present (with
 * tasks waiting or running, or held: work_pool_hold_owner) is not costly,
 * costly owners' tasks run on at most workers - 1 workers together: the
 * last one stays for the cheap owners, idle if they have nothing queued at
 * that moment.  Costly owners share the rest in turn, and have every
 * worker when no cheap owner is present.  Cheap tasks are never held back:
 * any other owner's task waits for little behind them, and reserving a
 * worker would cost throughput for nothing (a job's ranks sharing their
 * loads, a trainer computing while the daemon works).  One worker
 * (workers = 1) is never reserved.
 *
 * Owners live in a table (htab) while present; an owner's entry goes when
 * it has no task and no hold.  A task of owner 0, or one whose owner entry
 * cannot be allocated, waits in the pool's own entry (nobody), which is
 * never freed.
 */
#define COSTLY_NS 10000000ull /* 10 ms */

typedef struct owner {
  htab_node_t node; /* in owners, by key; not for nobody */
  uint64_t key;
  int holds;                 /* work_pool_hold_owner */
  int running;               /* its foreground tasks on workers */
  uint64_t avg_ns;           /* its foreground tasks' run time, a moving
                                 average (1/8 per task) */
  int costly;                /* avg_ns >= COSTLY_NS */
  int counted_cheap;         /* counted in present_cheap */
  work_t *head, *tail;       /* its foreground tasks waiting */
  struct owner *prev, *next; /* in the ring while it has tasks waiting */
} owner_t;

struct work_pool {
  uv_poll_t poll; /* the eventfd, readable when tasks are done */
  uv_prepare_t prepare;
  uv_check_t check;
  int efd;
  int nice_delta;
  int base_nice; /* the loop's niceness when the pool started */
  int boosted;   /* workers run at base_nice; under mu */
  pid_t *tids;   /* of the workers that have started; under mu */
  int num_tids;
  void (*drained)(void *arg);
  void *drained_arg;
  int num_threads;
  pthread_t *threads;
  int closing_handles;

  pthread_mutex_t mu;
  pthread_cond_t cond;       /* tasks queued, or stopping */
  htab_t owners;             /* owner_t by key, while present */
  owner_t nobody;            /* owner 0's tasks, and those of an owner with no entry */
  owner_t *ring;             /* owners with foreground tasks waiting: the next
                            to serve, then the others in turn */
  int present_cheap;         /* owners present and not costly */
  int costly_running;        /* workers running costly owners' tasks */
  work_t *bg_head, *bg_tail; /* background tasks: taken when no foreground
                                task waits */
  work_t *done_head, *done_tail;
  int idle; /* workers waiting on cond */
  int stopping;
  int pending; /* tasks queued and whose done callback has not
                            started (work_pool_pending); the loop's alone,
                            so outside mu */
  /* Set under mu by the loop when it takes the done list just before it
   * may sleep (prepare), cleared once it is awake again (check).  A worker
   * that finishes a task writes the eventfd only while it is set: a loop
   * that is awake takes the task at its next prepare without a system call
   * on either side. */
  atomic_int may_sleep;
  atomic_int done_count; /* tasks on the done list, read without the lock */
  atomic_int todo_count; /* foreground tasks waiting, read without the lock */
};

/* Sets thread tid's niceness; returns 0 or errno.  On Linux a thread's
 * niceness is its own: PRIO_PROCESS with a thread id sets only that
 * thread's. */
static int set_nice(pid_t tid, int nice) {
  if (nice > 19) nice = 19;
  return setpriority(PRIO_PROCESS, (id_t)tid, nice) == 0 ? 0 : errno;
}

static uint64_t owner_hash(uint64_t key) { return util_hash64(&key, sizeof(key), 0x6f776e72ull); }

/* The entry of owner key, made when create is set; NULL when there is none
 * (or no memory for one).  Under mu. */
static owner_t *owner_find(work_pool_t *p, uint64_t key, int create) {
  if (key == 0) return &p->nobody;
  uint64_t h = owner_hash(key);
  for (htab_node_t *n = htab_chain(&p->owners, h); n; n = n->next) {
    owner_t *o = HTAB_ENTRY(n, owner_t, node);
    if (n->hash == h && o->key == key) return o;
  }
  if (!create) return NULL;
  owner_t *o = calloc(1, sizeof(*o));
  if (o == NULL) return NULL;
  o->key = key;
  if (htab_insert(&p->owners, &o->node, h) != 0) {
    free(o);
    return NULL;
  }
  return o;
}

/* Brings present_cheap up to date for o, present or not.  Under mu. */
static void recount(work_pool_t *p, owner_t *o, int present) {
  int cheap = present && !o->costly;
  if (cheap == o->counted_cheap) return;
  p->present_cheap += cheap ? 1 : -1;
  o->counted_cheap = cheap;
}

/* Frees o's entry once it has no task and no hold, and counts it again
 * either way (call after any change to its tasks, holds or cost).  An
 * entry in the table is present; nobody while it has tasks.  Under mu. */
static void owner_maybe_free(work_pool_t *p, owner_t *o) {
  int busy = o->holds > 0 || o->running > 0 || o->head != NULL;
  if (o == &p->nobody || busy) {
    recount(p, o, o != &p->nobody || busy);
    return;
  }
  recount(p, o, 0);
  htab_remove(&p->owners, &o->node);
  free(o);
}

static void ring_add(work_pool_t *p, owner_t *o) {
  if (p->ring == NULL) {
    o->prev = o->next = o;
    p->ring = o;
    return;
  }
  /* Last in turn: just before the one served next. */
  o->next = p->ring;
  o->prev = p->ring->prev;
  o->prev->next = o;
  p->ring->prev = o;
}

static void ring_remove(work_pool_t *p, owner_t *o) {
  if (o->next == o) {
    p->ring = NULL;
  } else {
    o->prev->next = o->next;
    o->next->prev = o->prev;
    if (p->ring == o) p->ring = o->next;
  }
  o->prev = o->next = NULL;
}

/* The next foreground task to start, taken off its owner's queue, or NULL
 * when none may start now (see Fairness).  Under mu. */
static work_t *take_foreground(work_pool_t *p) {
  if (p->ring == NULL) return NULL;
  int held_back =
      p->num_threads > 1 && p->present_cheap > 0 && p->costly_running >= p->num_threads - 1;
  owner_t *o = p->ring;
  while (held_back && o->costly) {
    o = o->next;
    if (o == p->ring) return NULL;
  }
  work_t *w = o->head;
  o->head = w->next;
  w->next = NULL;
  if (o->head == NULL) {
    o->tail = NULL;
    ring_remove(p, o);
    /* ring_remove moved the turn on when o was next. */
  } else {
    p->ring = o->next;
  }
  o->running++;
  w->queued_on = o;
  w->ran_costly = o->costly;
  p->costly_running += o->costly;
  atomic_fetch_sub_explicit(&p->todo_count, 1, memory_order_relaxed);
  return w;
}

static void *worker_main(void *arg) {
  work_pool_t *p = arg;
  /* Signals are the loop's (uv_signal_t): a worker never takes one, but
   * for those its own faults raise.  Those stay open: a fault with its
   * signal blocked kills the process, and a SIGBUS from a mapped Parquet
   * file truncated under a decode must reach the reader's guard, or a file
   * truncated or rewritten in place mid-decode would kill the daemon. */
  sigset_t all;
  sigfillset(&all);
  static const int faults[] = {SIGBUS, SIGSEGV, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
  for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++) sigdelset(&all, faults[i]);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  /* The name shows in top -H and /proc/<pid>/task/<tid>/comm, so an
   * operator can tell the workers from RocksDB's threads. */
  pthread_setname_np(pthread_self(), "larderd-work");
  pid_t tid = (pid_t)syscall(SYS_gettid);
  pthread_mutex_lock(&p->mu);
  p->tids[p->num_tids++] = tid;
  if (!p->boosted && p->nice_delta > 0) set_nice(tid, p->base_nice + p->nice_delta);
  for (;;) {
    work_t *w = take_foreground(p);
    if (w == NULL && p->bg_head != NULL &&
        atomic_load_explicit(&p->todo_count, memory_order_relaxed) == 0) {
      w = p->bg_head;
      p->bg_head = w->next;
      if (p->bg_head == NULL) p->bg_tail = NULL;
      w->next = NULL;
      w->queued_on = NULL;
    }
    if (w == NULL) {
      /* work_pool_stop empties the queues as it sets stopping (under mu). */
      if (p->stopping) break;
      p->idle++;
      pthread_cond_wait(&p->cond, &p->mu);
      p->idle--;
      continue;
    }
    pthread_mutex_unlock(&p->mu);

    uint64_t t0 = util_now_ns();
    w->run(w);
    uint64_t ran = util_now_ns() - t0;

    pthread_mutex_lock(&p->mu);
    owner_t *o = w->queued_on;
    w->queued_on = NULL;
    if (o != NULL) {
      o->avg_ns = o->avg_ns - o->avg_ns / 8 + ran / 8;
      o->costly = o->avg_ns >= COSTLY_NS;
      p->costly_running -= w->ran_costly;
      w->ran_costly = 0;
      o->running--;
      owner_maybe_free(p, o);
      /* A task that waited for its owner's turn may start now. */
      if (p->ring != NULL && p->idle > 0) pthread_cond_signal(&p->cond);
    }
    w->next = NULL;
    if (p->done_tail) p->done_tail->next = w;
    else p->done_head = w;
    p->done_tail = w;
    atomic_fetch_add_explicit(&p->done_count, 1, memory_order_release);
    /* The owner's flag is read under the lock that the loop's prepare
     * takes after any change the loop made to it, so a task that sees it
     * set is on the list that prepare takes. */
    int wake = atomic_load_explicit(&p->may_sleep, memory_order_relaxed) &&
               !(w->quiet_while && atomic_load_explicit(w->quiet_while, memory_order_relaxed));
    pthread_mutex_unlock(&p->mu);
    /* Each finishing worker that saw the loop about to sleep writes on its
     * own: none waits on another, which may have been preempted. */
    if (wake) {
      uint64_t one = 1;
      ssize_t n;
      do n = write(p->efd, &one, sizeof(one));
      while (n < 0 && errno == EINTR);
    }
    pthread_mutex_lock(&p->mu);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* Runs the done callbacks of every finished task; with before_sleep, marks
 * the loop as about to sleep in the same critical section, so a task that
 * finishes after it writes the eventfd.  Loop thread. */
static void drain(work_pool_t *p, int before_sleep) {
  if (!before_sleep && atomic_load_explicit(&p->done_count, memory_order_acquire) == 0) return;
  pthread_mutex_lock(&p->mu);
  if (before_sleep) atomic_store_explicit(&p->may_sleep, 1, memory_order_relaxed);
  work_t *w = p->done_head;
  p->done_head = p->done_tail = NULL;
  atomic_store_explicit(&p->done_count, 0, memory_order_relaxed);
  pthread_mutex_unlock(&p->mu);
  if (w == NULL) return;
  while (w) {
    work_t *next = w->next;
    w->next = NULL;
    p->pending--;
    w->done(w, 0);
    w = next;
  }
  if (p->drained) p->drained(p->drained_arg);
}

static void on_readable(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  work_pool_t *p = h->data;
  uint64_t v;
  /* The counter is reset by the read; EAGAIN means another read got it. */
  if (read(p->efd, &v, sizeof(v)) < 0 && errno != EAGAIN && errno != EINTR)
    log_warn("work pool: cannot read its eventfd");
  drain(p, 0);
}

/* Before the loop may sleep: tasks that finished while it ran are handed
 * over here, and from now on a finishing task wakes it. */
static void on_prepare(uv_prepare_t *h) {
  work_pool_t *p = h->data;
  /* Checking the count first would race with a worker that read may_sleep
   * as 0 before it was set: take the lock whenever the flag turns on. */
  drain(p, 1);
}

/* Awake again: finishing tasks wait for the next prepare. */
static void on_check(uv_check_t *h) {
  work_pool_t *p = h->data;
  atomic_store_explicit(&p->may_sleep, 0, memory_order_relaxed);
}

static void on_handle_closed(uv_handle_t *h) {
  work_pool_t *p = h->data;
  if (--p->closing_handles > 0) return;
  /* Owners still held (their holders stop with the pool) or left by
   * cancelled tasks: no task waits or runs any more. */
  for (size_t i = 0; p->owners.buckets && i <= p->owners.mask; i++) {
    htab_node_t *n = p->owners.buckets[i];
    while (n) {
      htab_node_t *next = n->next;
      free(HTAB_ENTRY(n, owner_t, node));
      n = next;
    }
  }
  htab_free(&p->owners);
  close(p->efd);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cond);
  free(p->threads);
  free(p->tids);
  free(p);
}

int work_pool_start(uv_loop_t *loop, int workers, int nice_delta, void (*drained)(void *arg),
                    void *arg, work_pool_t **out) {
  *out = NULL;
  if (workers < 1) workers = 1;
  work_pool_t *p = calloc(1, sizeof(*p));
  if (p == NULL) return LARDER_ENOMEM;
  p->threads = calloc((size_t)workers, sizeof(pthread_t));
  p->tids = calloc((size_t)workers, sizeof(pid_t));
  p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->threads == NULL || p->tids == NULL || p->efd < 0) {
    int rc = p->efd >= 0 ? LARDER_ENOMEM : LARDER_EIO;
    if (p->efd >= 0) close(p->efd);
    free(p->threads);
    free(p->tids);
    free(p);
    return rc;
  }
  p->nice_delta = nice_delta > 19 ? 19 : nice_delta;
  errno = 0;
  p->base_nice = getpriority(PRIO_PROCESS, 0);
  if (errno != 0) p->base_nice = 0;
  p->drained = drained;
  p->drained_arg = arg;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cond, NULL);
  atomic_init(&p->done_count, 0);
  atomic_init(&p->todo_count, 0);
  atomic_init(&p->may_sleep, 1);
  for (int i = 0; i < workers; i++) {
    if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
      log_err("cannot start worker thread %d of %d", i + 1, workers);
      break;
    }
    p->num_threads++;
  }
  uv_poll_init(loop, &p->poll, p->efd);
  uv_prepare_init(loop, &p->prepare);
  uv_check_init(loop, &p->check);
  p->poll.data = p->prepare.data = p->check.data = p;
  if (p->num_threads < workers) {
    work_pool_stop(p);
    return LARDER_EIO;
  }
  uv_poll_start(&p->poll, UV_READABLE, on_readable);
  uv_prepare_start(&p->prepare, on_prepare);
  uv_check_start(&p->check, on_check);
  /* No handle keeps the loop alive: the tasks' owners do. */
  uv_unref((uv_handle_t *)&p->poll);
  uv_unref((uv_handle_t *)&p->prepare);
  uv_unref((uv_handle_t *)&p->check);
  *out = p;
  return 0;
}

static int enqueue(work_pool_t *p, work_t *w, work_run_cb run, work_done_cb done, int background,
                   const atomic_int *quiet_while) {
  if (p == NULL) return LARDER_ESHUTDOWN; /* the server stopped its pool */
  w->run = run;
  w->done = done;
  w->quiet_while = quiet_while;
  w->next = NULL;
  pthread_mutex_lock(&p->mu);
  if (p->stopping) {
    pthread_mutex_unlock(&p->mu);
    return LARDER_ESHUTDOWN;
  }
  if (background) {
    w->queued_on = NULL;
    if (p->bg_tail) p->bg_tail->next = w;
    else p->bg_head = w;
    p->bg_tail = w;
  } else {
    owner_t *o = owner_find(p, w->owner, 1);
    if (o == NULL) o = &p->nobody; /* no memory: served, only not apart */
    w->queued_on = o;
    if (o->tail) o->tail->next = w;
    else o->head = w;
    o->tail = w;
    if (o->head == w) ring_add(p, o);
    owner_maybe_free(p, o); /* counts it: it has a task, so it stays */
    atomic_fetch_add_explicit(&p->todo_count, 1, memory_order_relaxed);
  }
  if (p->idle > 0) pthread_cond_signal(&p->cond);
  pthread_mutex_unlock(&p->mu);
  p->pending++;
  return 0;
}

int work_queue(work_pool_t *p, work_t *w, work_run_cb run, work_done_cb done) {
  return enqueue(p, w, run, done, 0, NULL);
}

int work_queue_quiet(work_pool_t *p, work_t *w, work_run_cb run, work_done_cb done,
                     const atomic_int *quiet_while) {
  return enqueue(p, w, run, done, 0, quiet_while);
}

int work_queue_background(work_pool_t *p, work_t *w, work_run_cb run, work_done_cb done) {
  return enqueue(p, w, run, done, 1, NULL);
}

/* Unlinks w from the list at *head (tail *tail); returns 1 if it was there. */
static int unlink_work(work_t **head, work_t **tail, work_t *w) {
  work_t *prev = NULL;
  for (work_t *x = *head; x; prev = x, x = x->next) {
    if (x != w) continue;
    if (prev) prev->next = x->next;
    else *head = x->next;
    if (*tail == x) *tail = prev;
    x->next = NULL;
    return 1;
  }
  return 0;
}

int work_cancel(work_pool_t *p, work_t *w) {
  if (p == NULL) return LARDER_EBUSY;
  pthread_mutex_lock(&p->mu);
  int found = unlink_work(&p->bg_head, &p->bg_tail, w);
  /* A waiting foreground task is on the queue of the owner it names in
   * queued_on; a running one names it too, but is on no queue. */
  owner_t *o = found ? NULL : w->queued_on;
  if (o != NULL && unlink_work(&o->head, &o->tail, w)) {
    found = 1;
    w->queued_on = NULL;
    atomic_fetch_sub_explicit(&p->todo_count, 1, memory_order_relaxed);
    if (o->head == NULL) ring_remove(p, o);
    owner_maybe_free(p, o);
  }
  pthread_mutex_unlock(&p->mu);
  if (found) p->pending--;
  return found ? 0 : LARDER_EBUSY;
}

void work_pool_hold_owner(work_pool_t *p, uint64_t owner) {
  if (p == NULL || owner == 0) return;
  pthread_mutex_lock(&p->mu);
  owner_t *o = owner_find(p, owner, 1);
  if (o) {
    o->holds++;
    owner_maybe_free(p, o); /* counts it */
  }                         /* no memory: the owner counts only while it has tasks */
  pthread_mutex_unlock(&p->mu);
}

void work_pool_release_owner(work_pool_t *p, uint64_t owner) {
  if (p == NULL || owner == 0) return;
  pthread_mutex_lock(&p->mu);
  owner_t *o = owner_find(p, owner, 0);
  if (o && o->holds > 0) {
    o->holds--;
    owner_maybe_free(p, o);
    /* One owner fewer: another's tasks may start now. */
    if (p->ring != NULL && p->idle > 0) pthread_cond_broadcast(&p->cond);
  }
  pthread_mutex_unlock(&p->mu);
}

int work_pool_pending(const work_pool_t *p) { return p ? p->pending : 0; }

int work_pool_foreground_waiting(work_pool_t *p) {
  return atomic_load_explicit(&p->todo_count, memory_order_relaxed) > 0;
}

void work_pool_stop(work_pool_t *p) {
  pthread_mutex_lock(&p->mu);
  p->stopping = 1;
  /* Every waiting task, foreground (owner by owner, in turn) then
   * background, is cancelled. */
  work_t *cancelled = NULL, **tail = &cancelled;
  while (p->ring != NULL) {
    owner_t *o = p->ring;
    *tail = o->head;
    tail = &o->tail->next;
    o->head = o->tail = NULL;
    ring_remove(p, o);
  }
  *tail = p->bg_head;
  for (work_t *w = cancelled; w; w = w->next) w->queued_on = NULL;
  p->bg_head = p->bg_tail = NULL;
  atomic_store_explicit(&p->todo_count, 0, memory_order_relaxed);
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->num_threads; i++) pthread_join(p->threads[i], NULL);
  drain(p, 0);
  while (cancelled) {
    work_t *next = cancelled->next;
    cancelled->next = NULL;
    p->pending--;
    cancelled->done(cancelled, UV_ECANCELED);
    cancelled = next;
  }
  p->closing_handles = 3;
  uv_close((uv_handle_t *)&p->poll, on_handle_closed);
  uv_close((uv_handle_t *)&p->prepare, on_handle_closed);
  uv_close((uv_handle_t *)&p->check, on_handle_closed);
}

int work_pool_boost(work_pool_t *p, int on) {
  on = on != 0;
  pthread_mutex_lock(&p->mu);
  int rc = 0;
  if (p->boosted != on && p->nice_delta > 0) {
    int nice = on ? p->base_nice : p->base_nice + p->nice_delta;
    for (int i = 0; i < p->num_tids && rc == 0; i++) {
      int err = set_nice(p->tids[i], nice);
      /* A worker that has exited (the pool stopping) is no error. */
      if (err == EACCES || err == EPERM) rc = LARDER_EACCES;
    }
    if (rc == 0) p->boosted = on;
  }
  pthread_mutex_unlock(&p->mu);
  return rc;
}
