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

#include "../client/larder.h"
#include "log.h"

struct work_pool {
  uv_poll_t poll;     /* the eventfd, readable when tasks are done */
  uv_prepare_t prepare;
  uv_check_t check;
  int efd;
  int nice_delta;
  int base_nice;         /* the loop's niceness when the pool started */
  int boosted;           /* workers run at base_nice; under mu */
  pid_t *tids;           /* of the workers that have started; under mu */
  int num_tids;
  void (*drained)(void *arg);
  void *drained_arg;
  int num_threads;
  pthread_t *threads;
  int closing_handles;

  pthread_mutex_t mu;
  pthread_cond_t cond;   /* tasks queued, or stopping */
  work_t *todo_head, *todo_tail;
  work_t *bg_head, *bg_tail; /* background tasks: taken when todo is empty */
  work_t *done_head, *done_tail;
  int idle;              /* workers waiting on cond */
  int stopping;
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

static void *worker_main(void *arg) {
  work_pool_t *p = arg;
  /* Signals are the loop's (uv_signal_t): a worker never takes one, but
   * for those its own faults raise.  Those stay open: a fault with its
   * signal blocked kills the process, and a SIGBUS from a mapped Parquet
   * file truncated under a decode must reach the reader's guard (bug fix:
   * a file truncated or rewritten in place mid-decode killed the daemon). */
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
    while (p->todo_head == NULL && p->bg_head == NULL && !p->stopping) {
      p->idle++;
      pthread_cond_wait(&p->cond, &p->mu);
      p->idle--;
    }
    work_t *w;
    if (p->todo_head != NULL) {
      w = p->todo_head;
      p->todo_head = w->next;
      if (p->todo_head == NULL) p->todo_tail = NULL;
      atomic_fetch_sub_explicit(&p->todo_count, 1, memory_order_relaxed);
    } else if (p->bg_head != NULL) {
      w = p->bg_head;
      p->bg_head = w->next;
      if (p->bg_head == NULL) p->bg_tail = NULL;
    } else {
      break; /* stopping, nothing left to run */
    }
    pthread_mutex_unlock(&p->mu);

    w->run(w);

    pthread_mutex_lock(&p->mu);
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

static int enqueue(work_pool_t *p, work_t *w, work_run_cb run, work_done_cb done,
                   int background, const atomic_int *quiet_while) {
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
  work_t **head = background ? &p->bg_head : &p->todo_head;
  work_t **tail = background ? &p->bg_tail : &p->todo_tail;
  if (*tail) (*tail)->next = w;
  else *head = w;
  *tail = w;
  if (!background) atomic_fetch_add_explicit(&p->todo_count, 1, memory_order_relaxed);
  if (p->idle > 0) pthread_cond_signal(&p->cond);
  pthread_mutex_unlock(&p->mu);
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
  if (!found && unlink_work(&p->todo_head, &p->todo_tail, w)) {
    found = 1;
    atomic_fetch_sub_explicit(&p->todo_count, 1, memory_order_relaxed);
  }
  pthread_mutex_unlock(&p->mu);
  return found ? 0 : LARDER_EBUSY;
}

int work_pool_foreground_waiting(work_pool_t *p) {
  return atomic_load_explicit(&p->todo_count, memory_order_relaxed) > 0;
}

void work_pool_stop(work_pool_t *p) {
  pthread_mutex_lock(&p->mu);
  p->stopping = 1;
  work_t *cancelled = p->todo_head;
  if (p->todo_tail) p->todo_tail->next = p->bg_head;
  else cancelled = p->bg_head;
  p->todo_head = p->todo_tail = NULL;
  p->bg_head = p->bg_tail = NULL;
  atomic_store_explicit(&p->todo_count, 0, memory_order_relaxed);
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->num_threads; i++) pthread_join(p->threads[i], NULL);
  drain(p, 0);
  while (cancelled) {
    work_t *next = cancelled->next;
    cancelled->next = NULL;
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
