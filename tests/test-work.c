/*
 * test-work.c: unit tests for larderd's worker threads (daemon/work.c).
 *
 * Conventions
 * -----------
 * - Each test runs its own uv loop and closes it leak-free: the pool's
 *   handles must be closed (uv_loop_close returns 0) and ASan sees no leak.
 * - The pool's handles do not keep the loop alive (the daemon's listener
 *   does); a test keeps its loop running with a timer until the tasks it
 *   queued are done.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "parquet/pq_internal.h"
#include "work.h"
#include "daemon-harness.h"
#include "task.h"

typedef struct ctx {
  pthread_t loop_thread;
  atomic_int ran;
  int done, cancelled, wrong_thread, drained;
  int expected;
  uv_timer_t keepalive;
} ctx_t;

typedef struct task {
  work_t work;
  ctx_t *ctx;
  int sleep_ms;
  atomic_int started;
  pthread_t ran_on;
} task_t;

static void task_run(work_t *w) {
  task_t *t = w->data;
  atomic_store(&t->started, 1);
  t->ran_on = pthread_self();
  if (t->sleep_ms) {
    struct timespec ts = {0, (long)t->sleep_ms * 1000000L};
    nanosleep(&ts, NULL);
  }
  atomic_fetch_add(&t->ctx->ran, 1);
}

static void task_done(work_t *w, int status) {
  task_t *t = w->data;
  ctx_t *c = t->ctx;
  if (!pthread_equal(pthread_self(), c->loop_thread)) c->wrong_thread++;
  if (status == UV_ECANCELED) c->cancelled++;
  else if (pthread_equal(t->ran_on, c->loop_thread)) c->wrong_thread++;
  c->done++;
}

static void on_drained(void *arg) { ((ctx_t *)arg)->drained++; }

static void on_keepalive(uv_timer_t *t) {
  ctx_t *c = t->data;
  if (c->done >= c->expected) uv_close((uv_handle_t *)t, NULL);
}

TEST_IMPL(work_pool_runs_tasks) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  ctx_t c = {.loop_thread = pthread_self(), .expected = 2000};
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 3, 5, on_drained, &c, &p));
  task_t *tasks = calloc((size_t)c.expected, sizeof(task_t));
  ASSERT_NOT_NULL(tasks);
  /* A few tasks sleep, so that the loop both finds finished tasks when it
   * is about to sleep and is woken for them. */
  for (int i = 0; i < c.expected; i++) {
    tasks[i].ctx = &c;
    tasks[i].work.data = &tasks[i];
    tasks[i].sleep_ms = i % 500 == 0;
    ASSERT_OK(work_queue(p, &tasks[i].work, task_run, task_done));
  }
  uv_timer_init(&loop, &c.keepalive);
  c.keepalive.data = &c;
  uv_timer_start(&c.keepalive, on_keepalive, 1, 1);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_EQ(c.done, c.expected);
  ASSERT_EQ(atomic_load(&c.ran), c.expected);
  ASSERT_EQ(c.cancelled, 0);
  ASSERT_EQ(c.wrong_thread, 0);
  ASSERT_GT(c.drained, 0);
  ASSERT_LE(c.drained, c.expected);
  work_pool_stop(p);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  free(tasks);
  return 0;
}

/* A task that finishes while the loop sleeps in epoll must wake it: one
 * task at a time, each queued after the previous one's done callback. */
typedef struct chain {
  work_t work;
  work_pool_t *pool;
  int left;
  int woke;
  pthread_t loop_thread;
} chain_t;

static void chain_run(work_t *w) {
  (void)w;
  struct timespec ts = {0, 2000000L}; /* the loop is asleep by then */
  nanosleep(&ts, NULL);
}

static void chain_done(work_t *w, int status) {
  chain_t *ch = w->data;
  if (status == 0 && pthread_equal(pthread_self(), ch->loop_thread)) ch->woke++;
  if (--ch->left > 0) work_queue(ch->pool, &ch->work, chain_run, chain_done);
}

static void chain_keepalive(uv_timer_t *t) {
  chain_t *ch = t->data;
  if (ch->left == 0) uv_close((uv_handle_t *)t, NULL);
}

TEST_IMPL(work_pool_wakes_sleeping_loop) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  chain_t ch = {.left = 50, .loop_thread = pthread_self()};
  ASSERT_OK(work_pool_start(&loop, 2, 0, NULL, NULL, &ch.pool));
  ch.work.data = &ch;
  ASSERT_OK(work_queue(ch.pool, &ch.work, chain_run, chain_done));
  /* The keepalive timer fires rarely: the tasks' wakeups must come from
   * the pool, or the 50 steps take 50 seconds and the test times out. */
  uv_timer_t keep;
  uv_timer_init(&loop, &keep);
  keep.data = &ch;
  uv_timer_start(&keep, chain_keepalive, 1000, 1000);
  uint64_t t0 = uv_hrtime();
  while (ch.left > 0) uv_run(&loop, UV_RUN_ONCE);
  uint64_t ms = (uv_hrtime() - t0) / 1000000u;
  ASSERT_EQ(ch.woke, 50);
  ASSERT_LT(ms, 900); /* 50 tasks of 2 ms each, without waiting for the timer */
  uv_timer_stop(&keep);
  uv_close((uv_handle_t *)&keep, NULL);
  work_pool_stop(ch.pool);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return 0;
}

TEST_IMPL(work_pool_stop_cancels_queued) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  ctx_t c = {.loop_thread = pthread_self(), .expected = 11};
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 1, 0, NULL, NULL, &p));
  task_t tasks[11] = {0};
  for (int i = 0; i < 11; i++) {
    tasks[i].ctx = &c;
    tasks[i].work.data = &tasks[i];
    tasks[i].sleep_ms = i == 0 ? 50 : 0;
    ASSERT_OK(work_queue(p, &tasks[i].work, task_run, task_done));
  }
  /* Let the one worker start the first task, then stop: it finishes, and
   * the ten behind it are cancelled, each told so on the loop thread. */
  while (!atomic_load(&tasks[0].started)) {
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
  work_pool_stop(p);
  ASSERT_EQ(c.done, 11);
  ASSERT_EQ(c.cancelled, 10);
  ASSERT_EQ(c.wrong_thread, 0);
  ASSERT_EQ(atomic_load(&c.ran) + c.cancelled, 11);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Background tasks                                                          */

typedef struct ordered {
  work_t work;
  atomic_int *next_seq;
  atomic_int *gate; /* the task holds its worker until this is nonzero */
  int sleep_ms;     /* or for this long */
  atomic_int started;
  int seq; /* when it ran, among the test's tasks; -1 before */
  int status;
  int *done;
} ordered_t;

static void ordered_run(work_t *w) {
  ordered_t *o = w->data;
  atomic_store(&o->started, 1);
  while (o->gate && !atomic_load(o->gate)) {
    struct timespec ts = {0, 200000L};
    nanosleep(&ts, NULL);
  }
  if (o->sleep_ms) {
    struct timespec ts = {0, (long)o->sleep_ms * 1000000L};
    nanosleep(&ts, NULL);
  }
  o->seq = atomic_fetch_add(o->next_seq, 1);
}

static void ordered_done(work_t *w, int status) {
  ordered_t *o = w->data;
  o->status = status;
  (*o->done)++;
}

static void on_noop_timer(uv_timer_t *t) { (void)t; }

/* Waits until a worker has started task o. */
static void wait_started(ordered_t *o) {
  while (!atomic_load(&o->started)) {
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
}

/* Runs the loop until *done reaches n (the pool's handles do not keep the
 * loop alive: a timer does). */
static void run_until_done(uv_loop_t *loop, const int *done, int n) {
  uv_timer_t keep;
  uv_timer_init(loop, &keep);
  uv_timer_start(&keep, on_noop_timer, 1, 1);
  while (*done < n) uv_run(loop, UV_RUN_ONCE);
  /* The timer lives on this frame: its close must finish before it goes. */
  uv_close((uv_handle_t *)&keep, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
}

/* n tasks that number themselves in next_seq as they run and count their
 * done callbacks in done. */
static void ordered_init(ordered_t *t, int n, atomic_int *next_seq, int *done) {
  for (int i = 0; i < n; i++)
    t[i] = (ordered_t){.work.data = &t[i], .next_seq = next_seq, .seq = -1, .done = done};
}

/* A background task waits for every foreground task queued before it runs,
 * even those queued after it, and work_pool_foreground_waiting says when
 * foreground tasks wait for a worker. */
TEST_IMPL(work_pool_background_waits) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 1, 0, NULL, NULL, &p));
  atomic_int next_seq = 0, gate = 0;
  int done = 0;
  ordered_t t[6];
  ordered_init(t, 6, &next_seq, &done);
  t[0].gate = &gate; /* holds the one worker */
  ASSERT_OK(work_queue(p, &t[0].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue_background(p, &t[1].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue_background(p, &t[2].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue(p, &t[3].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue(p, &t[4].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue(p, &t[5].work, ordered_run, ordered_done));
  ASSERT_EQ(work_pool_foreground_waiting(p), 1);
  atomic_store(&gate, 1);
  run_until_done(&loop, &done, 6);
  ASSERT_EQ(work_pool_foreground_waiting(p), 0);
  /* Foreground in its order, then background in its order. */
  int want[6] = {0, 4, 5, 1, 2, 3};
  for (int i = 0; i < 6; i++) {
    ASSERT_EQ(t[i].status, 0);
    ASSERT_EQ(t[i].seq, want[i]);
  }
  work_pool_stop(p);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return 0;
}

/* Stopping the pool cancels the background tasks not yet started, with the
 * foreground ones. */
TEST_IMPL(work_pool_stop_cancels_background) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 1, 0, NULL, NULL, &p));
  atomic_int next_seq = 0;
  int done = 0;
  ordered_t t[4];
  ordered_init(t, 4, &next_seq, &done);
  t[0].sleep_ms = 50;
  ASSERT_OK(work_queue(p, &t[0].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue_background(p, &t[1].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue(p, &t[2].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue_background(p, &t[3].work, ordered_run, ordered_done));
  /* Stop while the one worker runs the first task: it finishes, and the
   * three behind it, background or not, are cancelled. */
  wait_started(&t[0]);
  work_pool_stop(p);
  ASSERT_EQ(done, 4);
  ASSERT_EQ(t[0].status, 0);
  ASSERT_EQ(t[0].seq, 0);
  for (int i = 1; i < 4; i++) {
    ASSERT_EQ(t[i].status, UV_ECANCELED);
    ASSERT_EQ(t[i].seq, -1);
  }
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return 0;
}

/* work_cancel takes back a task no worker has started, background or not,
 * and none of its callbacks run; a started task is not taken back. */
TEST_IMPL(work_cancel_queued) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 1, 0, NULL, NULL, &p));
  atomic_int next_seq = 0, gate = 0;
  int done = 0;
  ordered_t t[5];
  ordered_init(t, 5, &next_seq, &done);
  t[0].gate = &gate;
  ASSERT_OK(work_queue(p, &t[0].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue_background(p, &t[1].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue(p, &t[2].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue_background(p, &t[3].work, ordered_run, ordered_done));
  ASSERT_OK(work_queue(p, &t[4].work, ordered_run, ordered_done));
  ASSERT_EQ(work_pool_pending(p), 5);
  wait_started(&t[0]);
  ASSERT_EQ(work_cancel(p, &t[0].work), LARDER_EBUSY); /* running */
  ASSERT_OK(work_cancel(p, &t[3].work));               /* last in its list */
  ASSERT_OK(work_cancel(p, &t[2].work));               /* in the middle */
  ASSERT_EQ(work_cancel(p, &t[2].work), LARDER_EBUSY); /* not queued any more */
  ASSERT_EQ(work_pool_foreground_waiting(p), 1);       /* t[4] */
  ASSERT_OK(work_cancel(p, &t[4].work));
  ASSERT_EQ(work_pool_foreground_waiting(p), 0);
  ASSERT_EQ(work_pool_pending(p), 2); /* t[0] running, t[1] waiting */
  /* What is left runs: the first task, then the first background one,
   * which may be queued again behind a new task after the cancellations. */
  ASSERT_OK(work_queue(p, &t[3].work, ordered_run, ordered_done));
  atomic_store(&gate, 1);
  run_until_done(&loop, &done, 3);
  ASSERT_EQ(t[0].seq, 0);
  ASSERT_EQ(t[3].seq, 1); /* foreground now, ahead of the background t[1] */
  ASSERT_EQ(t[1].seq, 2);
  ASSERT_EQ(t[2].seq, -1);
  ASSERT_EQ(t[4].seq, -1);
  ASSERT_EQ(done, 3);
  ASSERT_EQ(work_pool_pending(p), 0);
  ASSERT_EQ(work_pool_pending(NULL), 0);
  ASSERT_EQ(work_cancel(NULL, &t[1].work), LARDER_EBUSY);
  work_pool_stop(p);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Quiet tasks                                                               */

typedef struct quiet_probe {
  ordered_t *task;
  int done_at_timer; /* the task's done count when the timer fired */
  int ran_at_timer;  /* whether its run had ended by then */
} quiet_probe_t;

static void on_quiet_timer(uv_timer_t *t) {
  quiet_probe_t *q = t->data;
  q->done_at_timer = *q->task->done;
  q->ran_at_timer = atomic_load(q->task->next_seq) > 0;
}

/* Runs the loop until a timer of ms fires, the task t queued before:
 * returns what the timer saw of t. */
static quiet_probe_t sleep_past(uv_loop_t *loop, ordered_t *t, uint64_t ms) {
  quiet_probe_t q = {.task = t, .done_at_timer = -1};
  uv_timer_t timer;
  uv_timer_init(loop, &timer);
  timer.data = &q;
  uv_timer_start(&timer, on_quiet_timer, ms, 0);
  while (q.done_at_timer < 0) uv_run(loop, UV_RUN_ONCE);
  /* The timer lives on this frame: its close finishes before it goes.
   * That turn of the loop passes its prepare, which takes finished tasks. */
  uv_close((uv_handle_t *)&timer, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  return q;
}

/* The loop thread, for quiet_run. */
static pid_t quiet_loop_tid;

/* Whether thread tid of this process is blocked in epoll_wait (where libuv
 * sleeps), from /proc/self/task/TID/syscall. */
static int in_epoll(pid_t tid) {
  char path[64], buf[128] = "";
  snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return 0;
  int ok = fgets(buf, sizeof(buf), f) != NULL;
  fclose(f);
  if (!ok) return 0;
  long nr = strtol(buf, NULL, 10);
  int sleeping = 0;
#ifdef SYS_epoll_wait
  sleeping |= nr == SYS_epoll_wait;
#endif
#ifdef SYS_epoll_pwait
  sleeping |= nr == SYS_epoll_pwait;
#endif
#ifdef SYS_epoll_pwait2
  sleeping |= nr == SYS_epoll_pwait2;
#endif
  return sleeping;
}

/* A task that ends only once the loop sleeps (or after a minute), so that
 * its end finds the loop asleep however loaded the machine. */
static void quiet_run(work_t *w) {
  for (int i = 0; i < 600000 && !in_epoll(quiet_loop_tid); i++) {
    struct timespec ts = {0, 100000L};
    nanosleep(&ts, NULL);
  }
  ordered_run(w);
}

/* A task queued with work_queue_quiet does not wake a sleeping loop while
 * its flag is set: its done callback waits for the loop's next wakeup (a
 * timer here), and runs before the loop sleeps again.  With the flag clear
 * it wakes the loop as any task does, and a flag cleared after the task
 * ended leaves nothing behind. */
TEST_IMPL(work_queue_quiet_wakes) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 1, 0, NULL, NULL, &p));
  atomic_int quiet = 1;

  /* Flag set: the loop sleeps through the task's end. */
  atomic_int next_seq = 0;
  int done = 0;
  ordered_t t[3];
  ordered_init(t, 1, &next_seq, &done);
  quiet_loop_tid = (pid_t)syscall(SYS_gettid);
  ASSERT_OK(work_queue_quiet(p, &t[0].work, quiet_run, ordered_done, &quiet));
  /* Timers until one finds the task ended (it ends while the loop sleeps):
   * its done callback must not have run before that wakeup. */
  quiet_probe_t q;
  int rounds = 0;
  do q = sleep_past(&loop, &t[0], 1000);
  while (!q.ran_at_timer && q.done_at_timer == 0 && ++rounds < 120);
  ASSERT_EQ(q.ran_at_timer, 1);
  ASSERT_EQ(q.done_at_timer, 0);
  ASSERT_EQ(done, 1); /* taken once the loop woke */
  ASSERT_EQ(t[0].status, 0);

  /* Flag clear: the task's end wakes the loop long before the timer.  It
   * ends once the loop sleeps (quiet_run), so that the wakeup is its end's:
   * a task done before the loop's prepare is taken there, and the loop
   * then sleeps until the timer with nothing left to wake it. */
  atomic_store(&quiet, 0);
  atomic_store(&next_seq, 0);
  done = 0;
  ordered_init(t + 1, 1, &next_seq, &done);
  ASSERT_OK(work_queue_quiet(p, &t[1].work, quiet_run, ordered_done, &quiet));
  {
    quiet_probe_t late = {.task = &t[1], .done_at_timer = -1};
    uv_timer_t timer;
    uv_timer_init(&loop, &timer);
    timer.data = &late;
    uv_timer_start(&timer, on_quiet_timer, 60000, 0);
    while (done == 0 && late.done_at_timer < 0) uv_run(&loop, UV_RUN_ONCE);
    ASSERT_EQ(done, 1);
    ASSERT_EQ(late.done_at_timer, -1); /* the end woke the loop, not the timer */
    uv_close((uv_handle_t *)&timer, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
  }

  /* Flag set while the task runs, cleared (on the loop thread) after it
   * ended: the loop takes it before it next sleeps. */
  atomic_store(&quiet, 1);
  atomic_store(&next_seq, 0);
  done = 0;
  ordered_init(t + 2, 1, &next_seq, &done);
  ASSERT_OK(work_queue_quiet(p, &t[2].work, ordered_run, ordered_done, &quiet));
  while (atomic_load(&next_seq) == 0) {
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
  }
  atomic_store(&quiet, 0);
  run_until_done(&loop, &done, 1);
  ASSERT_EQ(t[2].status, 0);

  work_pool_stop(p);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Priority boost                                                            */

typedef struct probe {
  work_t work;
  pthread_barrier_t *barrier;
  pid_t tid;
  int nice;
  int *done;
} probe_t;

static void probe_run(work_t *w) {
  probe_t *pr = w->data;
  pr->tid = (pid_t)syscall(SYS_gettid);
  errno = 0;
  pr->nice = getpriority(PRIO_PROCESS, (id_t)pr->tid);
  if (errno != 0) pr->nice = 100;
  /* Every worker holds one probe until all have one: no worker runs two. */
  pthread_barrier_wait(pr->barrier);
}

static void probe_done(work_t *w, int status) {
  probe_t *pr = w->data;
  if (status == 0) (*pr->done)++;
}

/* Asserts that each of the pool's n workers runs at niceness want. */
static void expect_worker_nice(uv_loop_t *loop, work_pool_t *p, int n, int want) {
  pthread_barrier_t barrier;
  ASSERT_OK(pthread_barrier_init(&barrier, NULL, (unsigned)n));
  probe_t probes[8] = {0};
  ASSERT_LE(n, 8);
  int done = 0;
  for (int i = 0; i < n; i++) {
    probes[i] = (probe_t){.barrier = &barrier, .done = &done};
    probes[i].work.data = &probes[i];
    ASSERT_OK(work_queue(p, &probes[i].work, probe_run, probe_done));
  }
  /* The pool's handles do not keep the loop alive; a timer does. */
  uv_timer_t keep;
  uv_timer_init(loop, &keep);
  uv_timer_start(&keep, on_noop_timer, 1000, 1000);
  uint64_t t0 = uv_hrtime();
  while (done < n) {
    ASSERT_LT(uv_hrtime() - t0, 10000000000ull);
    uv_run(loop, UV_RUN_ONCE);
  }
  uv_close((uv_handle_t *)&keep, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  for (int i = 0; i < n; i++) {
    ASSERT_EQ(probes[i].nice, want);
    for (int j = 0; j < i; j++) ASSERT_NE(probes[i].tid, probes[j].tid);
  }
  pthread_barrier_destroy(&barrier);
}

/* Runs a pool of 3 workers 5 nicer than this thread, boosts and unboosts
 * it; returns 0 when the system allowed it, 1 when it refused. */
static int boost_round(void) {
  errno = 0;
  int base = getpriority(PRIO_PROCESS, 0);
  ASSERT_EQ(errno, 0);
  int nicer = base + 5 > 19 ? 19 : base + 5;
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 3, 5, NULL, NULL, &p));
  expect_worker_nice(&loop, p, 3, nicer);
  int rc = work_pool_boost(p, 1);
  if (rc == 0) {
    expect_worker_nice(&loop, p, 3, base);
    ASSERT_OK(work_pool_boost(p, 1));
    ASSERT_OK(work_pool_boost(p, 0));
    expect_worker_nice(&loop, p, 3, nicer);
  } else {
    /* Refused: the workers stay as they were, and unboosting is no-op. */
    ASSERT_EQ(rc, LARDER_EACCES);
    expect_worker_nice(&loop, p, 3, nicer);
    ASSERT_OK(work_pool_boost(p, 0));
  }
  work_pool_stop(p);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return rc == 0 ? 0 : 1;
}

/* The workers run worker_nice nicer than the loop, and at its niceness
 * while boosted, when the system allows lowering a niceness. */
TEST_IMPL(work_pool_boost_sets_priority) {
  int refused = boost_round();
  ASSERT_EQ(refused, !dh_can_unnice());
  return 0;
}

/* Where the system forbids lowering a niceness (no CAP_SYS_NICE and
 * RLIMIT_NICE of 0, as for a service without LimitNICE=), the boost says
 * so and the workers stay nicer.  In a child, since dropping the
 * privilege cannot be undone. */
TEST_IMPL(work_pool_boost_refused) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (geteuid() == 0 &&
        (setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0))
      _exit(2);
    struct rlimit none = {0, 0};
    if (setrlimit(RLIMIT_NICE, &none) != 0) _exit(3);
    _exit(boost_round() == 1 ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  return 0;
}

/* A worker blocks the signals the loop handles, but not those its own
 * faults raise: a SIGBUS from a mapped file truncated under a decode must
 * reach the Parquet reader's guard on the worker (with every signal
 * blocked, the kernel would kill the daemon instead). */
typedef struct fault_task {
  work_t work;
  int bus_blocked, segv_blocked, term_blocked, hup_blocked;
  int caught, done;
} fault_task_t;

static void fault_run(work_t *w) {
  fault_task_t *t = w->data;
  sigset_t cur;
  pthread_sigmask(SIG_BLOCK, NULL, &cur);
  t->bus_blocked = sigismember(&cur, SIGBUS);
  t->segv_blocked = sigismember(&cur, SIGSEGV);
  t->term_blocked = sigismember(&cur, SIGTERM);
  t->hup_blocked = sigismember(&cur, SIGHUP);
  /* A page of a file that then shrinks to nothing. */
  long page = sysconf(_SC_PAGESIZE);
  int fd = memfd_create("larder-test-fault", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, page) != 0) return;
  volatile uint8_t *map = mmap(NULL, (size_t)page, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return;
  if (ftruncate(fd, 0) != 0) return;
  pq_guard_t guard;
  if (PQ_GUARD_FAULTED(&guard)) {
    t->caught = 1;
  } else {
    (void)map[0];
    pq_guard_pop(&guard);
  }
  munmap((void *)map, (size_t)page);
  close(fd);
}

static void fault_done(work_t *w, int status) {
  (void)status;
  ((fault_task_t *)w->data)->done = 1;
}

static void fault_keepalive(uv_timer_t *t) {
  if (((fault_task_t *)t->data)->done) uv_close((uv_handle_t *)t, NULL);
}

TEST_IMPL(work_pool_fault_signals) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 1, 0, NULL, NULL, &p));
  fault_task_t t;
  memset(&t, 0, sizeof(t));
  t.work.data = &t;
  ASSERT_OK(work_queue(p, &t.work, fault_run, fault_done));
  uv_timer_t keepalive;
  uv_timer_init(&loop, &keepalive);
  keepalive.data = &t;
  uv_timer_start(&keepalive, fault_keepalive, 1, 1);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_EQ(t.done, 1);
  ASSERT_EQ(t.bus_blocked, 0);
  ASSERT_EQ(t.segv_blocked, 0);
  ASSERT_EQ(t.term_blocked, 1);
  ASSERT_EQ(t.hup_blocked, 1);
  ASSERT_EQ(t.caught, 1);
  work_pool_stop(p);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Fairness between owners                                                   */

/* With one worker, owners with tasks waiting take turns: a task of owner Y
 * queued behind ten of owner X runs after X's next one, not after all ten;
 * each owner's tasks keep their order. */
TEST_IMPL(work_owners_take_turns) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 1, 0, NULL, NULL, &p));
  atomic_int next_seq = 0, gate = 0;
  int done = 0;
  ordered_t t[12];
  ordered_init(t, 12, &next_seq, &done);
  t[0].gate = &gate;
  for (int i = 0; i < 10; i++) {
    t[i].work.owner = 7;
    ASSERT_OK(work_queue(p, &t[i].work, ordered_run, ordered_done));
  }
  wait_started(&t[0]);
  t[10].work.owner = 9;
  ASSERT_OK(work_queue(p, &t[10].work, ordered_run, ordered_done));
  t[11].work.owner = 9;
  ASSERT_OK(work_queue(p, &t[11].work, ordered_run, ordered_done));
  atomic_store(&gate, 1);
  run_until_done(&loop, &done, 12);
  ASSERT_EQ(t[0].seq, 0);
  ASSERT_EQ(t[1].seq, 1);  /* X's turn */
  ASSERT_EQ(t[10].seq, 2); /* then Y's */
  ASSERT_EQ(t[2].seq, 3);
  ASSERT_EQ(t[11].seq, 4);
  for (int i = 3; i < 10; i++) ASSERT_EQ(t[i].seq, i + 2);
  work_pool_stop(p);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return 0;
}

/* Counts the tasks of ts[0 .. n) that have started. */
static int count_started(ordered_t *ts, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) k += atomic_load(&ts[i].started);
  return k;
}

/* Waits up to 10 s for count_started(ts, n) to reach want. */
static int wait_count_started(ordered_t *ts, int n, int want) {
  for (int i = 0; i < 10000 && count_started(ts, n) < want; i++) {
    struct timespec sl = {0, 1000000L};
    nanosleep(&sl, NULL);
  }
  return count_started(ts, n);
}

/*
 * An owner whose tasks are costly (20 ms each, above the pool's 10 ms) runs
 * on at most workers - 1 of the workers while another owner is held: the
 * held owner's task starts at once while the costly ones hold their
 * workers.  Alone, the costly owner takes every worker; and an owner of
 * cheap tasks takes every worker beside a held one.  Tasks that hold their
 * worker until a gate opens make this exact, not a matter of timing.
 */
TEST_IMPL(work_costly_owner_leaves_a_worker) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 3, 0, NULL, NULL, &p));
  atomic_int next_seq = 0, gate = 0;
  int done = 0;
  enum { WARM = 12, HELD = 6, CHEAP = 6 };
  /* Held as a stream holds its job: the owner's entry, and the cost it has
   * measured, last between its tasks. */
  work_pool_hold_owner(p, 5);
  ordered_t warm[WARM], a[HELD], b[1], c[CHEAP], alone[HELD];
  /* Owner 5's tasks measure as costly: 20 ms each. */
  ordered_init(warm, WARM, &next_seq, &done);
  for (int i = 0; i < WARM; i++) {
    warm[i].work.owner = 5;
    warm[i].sleep_ms = 20;
    ASSERT_OK(work_queue(p, &warm[i].work, ordered_run, ordered_done));
  }
  run_until_done(&loop, &done, WARM);
  /* Alone, its gated tasks take all three workers. */
  ordered_init(alone, HELD, &next_seq, &done);
  for (int i = 0; i < HELD; i++) {
    alone[i].work.owner = 5;
    alone[i].gate = &gate;
    alone[i].sleep_ms = 20; /* costly still, after the gate */
    ASSERT_OK(work_queue(p, &alone[i].work, ordered_run, ordered_done));
  }
  ASSERT_EQ(wait_count_started(alone, HELD, 3), 3);
  atomic_store(&gate, 1);
  run_until_done(&loop, &done, WARM + HELD);
  atomic_store(&gate, 0);
  /* Owner 6 is held (a stream between batches): owner 5 gets two. */
  work_pool_hold_owner(p, 6);
  ordered_init(a, HELD, &next_seq, &done);
  for (int i = 0; i < HELD; i++) {
    a[i].work.owner = 5;
    a[i].gate = &gate;
    a[i].sleep_ms = 20;
    ASSERT_OK(work_queue(p, &a[i].work, ordered_run, ordered_done));
  }
  ASSERT_EQ(wait_count_started(a, HELD, 2), 2);
  struct timespec sl = {0, 50000000L}; /* a third would have started by now */
  nanosleep(&sl, NULL);
  ASSERT_EQ(count_started(a, HELD), 2);
  /* Owner 6's task starts on the worker left for it, while 5's hold theirs. */
  ordered_init(b, 1, &next_seq, &done);
  b[0].work.owner = 6;
  ASSERT_OK(work_queue(p, &b[0].work, ordered_run, ordered_done));
  run_until_done(&loop, &done, WARM + HELD + 1);
  ASSERT_EQ(count_started(a, HELD), 2);
  /* Cheap tasks (owner 8, 0 ms) are not held back: three at once. */
  atomic_store(&gate, 1);
  run_until_done(&loop, &done, WARM + 2 * HELD + 1);
  atomic_store(&gate, 0);
  ordered_init(c, CHEAP, &next_seq, &done);
  for (int i = 0; i < CHEAP; i++) {
    c[i].work.owner = 8;
    ASSERT_OK(work_queue(p, &c[i].work, ordered_run, ordered_done));
  }
  run_until_done(&loop, &done, WARM + 2 * HELD + 1 + CHEAP);
  ordered_t g[3];
  ordered_init(g, 3, &next_seq, &done);
  for (int i = 0; i < 3; i++) {
    g[i].work.owner = 8;
    g[i].gate = &gate;
    ASSERT_OK(work_queue(p, &g[i].work, ordered_run, ordered_done));
  }
  ASSERT_EQ(wait_count_started(g, 3, 3), 3);
  atomic_store(&gate, 1);
  run_until_done(&loop, &done, WARM + 2 * HELD + 1 + CHEAP + 3);
  work_pool_release_owner(p, 6);
  work_pool_release_owner(p, 6); /* one too many: no effect */
  work_pool_release_owner(p, 5);
  work_pool_stop(p);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return 0;
}

/*
 * Several costly owners (three jobs of wide files) together run on at most
 * workers - 1 workers while a cheap owner is held; the cheap owner's task
 * starts on the worker left.  Released, the costly ones have every worker.
 */
TEST_IMPL(work_costly_owners_share_the_rest) {
  uv_loop_t loop;
  ASSERT_OK(uv_loop_init(&loop));
  work_pool_t *p;
  ASSERT_OK(work_pool_start(&loop, 3, 0, NULL, NULL, &p));
  atomic_int next_seq = 0, gate = 0;
  int done = 0;
  enum { WARM = 8, GATED = 3 };
  static const uint64_t costly[3] = {11, 12, 13};
  ordered_t warm[3][WARM], g[3][GATED], b[1];
  for (int k = 0; k < 3; k++) {
    work_pool_hold_owner(p, costly[k]);
    ordered_init(warm[k], WARM, &next_seq, &done);
    for (int i = 0; i < WARM; i++) {
      warm[k][i].work.owner = costly[k];
      warm[k][i].sleep_ms = 30;
      ASSERT_OK(work_queue(p, &warm[k][i].work, ordered_run, ordered_done));
    }
  }
  run_until_done(&loop, &done, 3 * WARM);
  work_pool_hold_owner(p, 6); /* cheap: no task measured yet */
  for (int k = 0; k < 3; k++) {
    ordered_init(g[k], GATED, &next_seq, &done);
    for (int i = 0; i < GATED; i++) {
      g[k][i].work.owner = costly[k];
      g[k][i].gate = &gate;
      g[k][i].sleep_ms = 30;
      ASSERT_OK(work_queue(p, &g[k][i].work, ordered_run, ordered_done));
    }
  }
  /* Two start, and no third. */
  int started = 0;
  for (int i = 0; i < 10000 && started < 2; i++) {
    started = count_started(g[0], GATED) + count_started(g[1], GATED) + count_started(g[2], GATED);
    struct timespec sl = {0, 1000000L};
    nanosleep(&sl, NULL);
  }
  ASSERT_EQ(started, 2);
  struct timespec sl = {0, 50000000L};
  nanosleep(&sl, NULL);
  ASSERT_EQ(count_started(g[0], GATED) + count_started(g[1], GATED) + count_started(g[2], GATED),
            2);
  ordered_init(b, 1, &next_seq, &done);
  b[0].work.owner = 6;
  ASSERT_OK(work_queue(p, &b[0].work, ordered_run, ordered_done));
  run_until_done(&loop, &done, 3 * WARM + 1);
  /* The cheap owner goes: the third worker takes a costly task. */
  work_pool_release_owner(p, 6);
  started = 0;
  for (int i = 0; i < 10000 && started < 3; i++) {
    started = count_started(g[0], GATED) + count_started(g[1], GATED) + count_started(g[2], GATED);
    struct timespec w = {0, 1000000L};
    nanosleep(&w, NULL);
  }
  ASSERT_EQ(started, 3);
  atomic_store(&gate, 1);
  run_until_done(&loop, &done, 3 * WARM + 1 + 3 * GATED);
  for (int k = 0; k < 3; k++) work_pool_release_owner(p, costly[k]);
  work_pool_stop(p);
  ASSERT_OK(uv_run(&loop, UV_RUN_DEFAULT));
  ASSERT_OK(uv_loop_close(&loop));
  return 0;
}
