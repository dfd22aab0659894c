/*
 * work.h: larderd's worker threads (prefix work_).
 *
 * Decoding, cache reads and writes, planning and batch assembly run here,
 * off the loop.  The interface is uv_queue_work's: a task's run callback
 * runs on a worker, its done callback afterwards on the loop thread.
 *
 * Why not libuv's thread pool: it hands each finished task to the loop with
 * uv_async_send, and libuv 1.44 (Debian 12) makes the loop spin while a
 * worker is inside that call.  Workers run below the loop (worker_nice), so
 * the write that wakes the loop often lets the loop preempt the very worker
 * it then spins for: on 2 cores a quarter of the loop's time went to that
 * spin while trainers waited for their batch frames.  Here a worker appends
 * the finished task to a list, and writes an eventfd only when the loop may
 * be asleep: an awake loop takes the list before it next sleeps (its
 * prepare callback).  The loop never waits on a worker.
 *
 * Conventions
 * -----------
 * - Threading: work_pool_start, work_queue and work_pool_stop are the loop
 *   thread's.  A task's run callback runs on one worker thread; its done
 *   callback on the loop, after run has returned.
 * - Ownership: the caller owns each work_t and keeps it alive until its
 *   done callback has run.  The pool is freed in its handle's close
 *   callback, after work_pool_stop.
 * - Order: each owner's tasks start in the order they were queued; owners
 *   with tasks waiting take turns, one task each; background tasks
 *   (work_queue_background) start only when no other task is waiting.
 * - Fairness: owners whose tasks have taken 10 ms or more each of late
 *   are costly, and while an owner that is not costly is present (has
 *   tasks waiting or running, or is held with work_pool_hold_owner),
 *   costly owners' tasks run on at most workers - 1 workers together
 *   (unless there is one worker): jobs with costly units cannot take every
 *   worker while another job's cheap ones wait behind them.  Background
 *   tasks count for no owner.
 * - Errors: negative larder_errno_t.
 */
#ifndef LARDER_WORK_H
#define LARDER_WORK_H

#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

typedef struct work work_t;
typedef struct work_pool work_pool_t;

/* run: on a worker.  done: on the loop; status 0, or UV_ECANCELED when the
 * pool stopped before the task ran. */
typedef void (*work_run_cb)(work_t *w);
typedef void (*work_done_cb)(work_t *w, int status);

struct work {
  void *data;     /* the caller's */
  uint64_t owner; /* the caller's: whom the task is for (larderd: a
                     stream's dataset key, which a job's ranks share), read
                     when it is queued; 0 (as calloc leaves it) for tasks
                     of no one in particular */
  /* Private. */
  work_run_cb run;
  work_done_cb done;
  const atomic_int *quiet_while; /* see work_queue_quiet */
  struct owner *queued_on;       /* its owner's entry while queued or running */
  int ran_costly;                /* counted in the pool's costly workers */
  work_t *next;
};

/* Starts threads workers, each nice_delta (0-19) nicer than the loop
 * (failure to renice, where a sandbox forbids it, leaves it as it was).
 * drained(arg), if not NULL, runs on the loop after each hand-over of
 * finished tasks, once their done callbacks have run (the server writes the
 * frames they produced there).  Returns 0 and *out, or LARDER_ENOMEM /
 * LARDER_EIO (no thread or eventfd: nothing is left running).  Loop
 * thread. */
int work_pool_start(uv_loop_t *loop, int workers, int nice_delta, void (*drained)(void *arg),
                    void *arg, work_pool_t **out);

/*
 * Workers run nice_delta nicer than the loop so that, when cores are
 * short, trainers and the loop that hands them batches run first.  While
 * trainers wait for batches the reverse holds: the workers are what the
 * trainers wait on.  work_pool_boost(p, 1) runs every worker at the loop's
 * niceness, work_pool_boost(p, 0) nice_delta nicer again; workers that
 * start later take the current setting.  Returns 0, or LARDER_EACCES when
 * the system does not let the process lower a niceness it raised (no
 * CAP_SYS_NICE, and RLIMIT_NICE too low: systemd's LimitNICE=); the
 * workers then stay as they were.  Loop thread.
 */
int work_pool_boost(work_pool_t *p, int on);

/* Queues w: run(w) on a worker, then done(w, 0) on the loop.  Returns 0, or
 * LARDER_ESHUTDOWN when p is NULL or stopping (w is then not queued).  Loop
 * thread. */
int work_queue(work_pool_t *p, work_t *w, work_run_cb run, work_done_cb done);

/*
 * Queues w as background work: a worker starts it only when no task queued
 * with work_queue is waiting, so work that has a deadline far off (a
 * window's row order, made long before its batches) fills the gaps between
 * batch assemblies instead of delaying them.  Such a task should work in
 * slices and end early (to be queued again) once
 * work_pool_foreground_waiting says other work waits: a worker never
 * leaves a task it has started.  While the workers are never idle a
 * background task may wait indefinitely, so nothing may depend on its
 * running, and its owner takes it back with work_cancel when it no longer
 * wants it.  Returns as work_queue.  Loop thread.
 */
int work_queue_background(work_pool_t *p, work_t *w, work_run_cb run, work_done_cb done);

/*
 * Queues w as work_queue does, except that when w finishes while
 * *quiet_while is nonzero its worker does not wake a sleeping loop for it:
 * its done callback runs the next time the loop wakes for anything else
 * (always before the loop sleeps again).  For work whose result is of no
 * use until some other event comes, such as a batch assembled while the
 * client's window is full: the release that makes room wakes the loop, and
 * the batch goes out in the same turn, one wakeup instead of two.  The
 * owner writes *quiet_while on the loop thread only; a flag cleared there
 * needs nothing more, since the loop takes every finished task before it
 * sleeps.  Returns as work_queue.  Loop thread.
 */
int work_queue_quiet(work_pool_t *p, work_t *w, work_run_cb run, work_done_cb done,
                     const atomic_int *quiet_while);

/* Takes w off its queue if no worker has started it.  Returns 0 when it
 * did: w's callbacks will not run, and w is the caller's again.  Else
 * (started, done, or not queued) LARDER_EBUSY, and the done callback runs
 * as usual.  Loop thread. */
int work_cancel(work_pool_t *p, work_t *w);

/*
 * Holds owner present (see Fairness) until a matching
 * work_pool_release_owner, whether or not it has tasks: a stream is held
 * from open to close, so that a worker stays free for it between its
 * batches, while another owner's costly tasks queue.  Holds count; owner 0
 * is never held.  Out of memory, the hold is dropped (the owner then counts
 * only while it has tasks).  Loop thread (any thread holding no pool
 * lock would do).
 */
void work_pool_hold_owner(work_pool_t *p, uint64_t owner);
void work_pool_release_owner(work_pool_t *p, uint64_t owner);

/* The tasks outstanding: queued (by any work_queue* call) and whose done
 * callback has not yet started, whether they wait, run or have finished.
 * A task that work_cancel took back, or whose done callback has begun,
 * no longer counts; one queued again from its done callback counts anew.
 * 0 for p NULL.  The server's shutdown waits for it to reach 0 before it
 * stops the pool.  Loop thread. */
int work_pool_pending(const work_pool_t *p);

/* Nonzero when tasks queued with work_queue wait for a worker (a hint: the
 * count is read without the pool's lock).  Any thread. */
int work_pool_foreground_waiting(work_pool_t *p);

/* Stops the pool: tasks already running finish, their done callbacks and
 * those of tasks not yet started (with UV_ECANCELED) run now, the threads
 * are joined, and the pool is freed once its handle closes.  Loop thread;
 * p is not used afterwards. */
void work_pool_stop(work_pool_t *p);

#endif /* LARDER_WORK_H */
