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
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "../daemon/work.h"
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
