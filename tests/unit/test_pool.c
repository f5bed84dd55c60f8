/* lib/io/pool.c: jobs run on the pool's threads and their after callbacks
 * on the loop's, more than libuv's 4 at once, a queued job cancelled
 * (never from inside the cancel), the threads joined at close and none
 * started before the first job, jobs handed from thread to thread without
 * one left behind. */
#include "cmocka-compat.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "core/util.h"
#include "io/pool.h"

struct world {
  uv_mutex_t mu;
  uv_cond_t cond;
  unsigned inside, cur, most, ran, after, cancelled;
  unsigned need; /* a job waits until this many run at once */
  bool gate;     /* gated jobs wait until it opens */
  bool after_off_loop, work_on_loop;
  uv_thread_t loop_thread;
};

struct job {
  uv_work_t req;
  struct world *w;
  bool gated, worked, aftered;
  int status;
};

static struct world *
world_init(struct world *w)
{
  memset(w, 0, sizeof(*w));
  assert_int_equal(uv_mutex_init(&w->mu), 0);
  assert_int_equal(uv_cond_init(&w->cond), 0);
  w->loop_thread = uv_thread_self();
  return w;
}

static void
world_fini(struct world *w)
{
  uv_cond_destroy(&w->cond);
  uv_mutex_destroy(&w->mu);
}

static void
work_cb(uv_work_t *req)
{
  struct job *j = spot_container_of(req, struct job, req);
  struct world *w = j->w;
  uv_thread_t self = uv_thread_self();
  uint64_t end = spot_now_mono_ms() + 30000; /* a loaded machine */

  uv_mutex_lock(&w->mu);
  if (uv_thread_equal(&self, &w->loop_thread))
    w->work_on_loop = true;
  w->inside++;
  if (++w->cur > w->most)
    w->most = w->cur;
  uv_cond_broadcast(&w->cond);
  /* Waits for the others of its batch (or the gate): only a pool running
   * them at once lets them all through before the deadline. */
  while (((j->gated && !w->gate) || w->inside < w->need) &&
         spot_now_mono_ms() < end)
    (void)uv_cond_timedwait(&w->cond, &w->mu, 100 * 1000 * 1000ULL);
  w->ran++;
  w->cur--;
  j->worked = true;
  uv_mutex_unlock(&w->mu);
  /* inside stays counted: a batch that met never lets a later job of the
   * same batch wait */
}

static void
after_cb(uv_work_t *req, int status)
{
  struct job *j = spot_container_of(req, struct job, req);
  uv_thread_t self = uv_thread_self();

  if (!uv_thread_equal(&self, &j->w->loop_thread))
    j->w->after_off_loop = true;
  j->aftered = true;
  j->status = status;
  j->w->after++;
  if (status == UV_ECANCELED)
    j->w->cancelled++;
}

static unsigned
threads_now(void)
{
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  unsigned n = 0;

  assert_non_null(d);
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

static void
closed_cb(void *data)
{
  (*(int *)data)++;
}

static void
close_loop(uv_loop_t *loop, struct spot_pool *p)
{
  int closed = 0;

  spot_pool_close(p, closed_cb, &closed);
  assert_int_equal(closed, 0); /* from the loop */
  assert_int_equal(uv_run(loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(closed, 1);
  assert_int_equal(uv_loop_close(loop), 0); /* no handle left behind */
}

/* 8 jobs that can only finish together: libuv's pool (4 threads) would
 * hold them past the deadline; ours runs all 8. The loop runs until the
 * last after callback, and only the loop runs those. */
static void
test_runs_more_than_four(void **state)
{
  uv_loop_t loop;
  struct world w;
  struct job jobs[8];
  struct spot_pool *p;
  unsigned before = threads_now(), started;

  (void)state;
  world_init(&w)->need = 8;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(spot_pool_new(&loop, 8, &p), 0);
  assert_int_equal(spot_pool_threads(p), 0); /* none while idle */
  assert_int_equal(threads_now(), before);
  memset(jobs, 0, sizeof(jobs));
  for (size_t i = 0; i < 8; i++) {
    jobs[i].w = &w;
    assert_int_equal(spot_pool_queue(p, &jobs[i].req, work_cb, after_cb), 0);
  }
  assert_int_equal(spot_pool_pending(p), 8);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(w.ran, 8);
  assert_int_equal(w.after, 8);
  assert_int_equal(w.most, 8);
  assert_false(w.work_on_loop);
  assert_false(w.after_off_loop);
  assert_int_equal(spot_pool_pending(p), 0);
  started = spot_pool_threads(p);
  assert_true(started <= 8);
  /* counted now: a sanitizer may have started a thread of its own */
  before = threads_now();
  close_loop(&loop, p);
  assert_int_equal(threads_now(), before - started); /* joined */
  world_fini(&w);
}

/* One thread idle from an earlier job, then 4 jobs queued in a burst
 * that can only finish together: the idle thread is promised one of
 * them only, so 3 more start and all 4 run at once. */
static void
test_burst_after_idle(void **state)
{
  uv_loop_t loop;
  struct world w;
  struct job first, jobs[4];
  struct spot_pool *p;

  (void)state;
  world_init(&w);
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(spot_pool_new(&loop, 4, &p), 0);
  memset(&first, 0, sizeof(first));
  first.w = &w;
  assert_int_equal(spot_pool_queue(p, &first.req, work_cb, after_cb), 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(spot_pool_threads(p), 1);
  uv_mutex_lock(&w.mu);
  w.inside = 0;
  w.need = 4;
  uv_mutex_unlock(&w.mu);
  memset(jobs, 0, sizeof(jobs));
  for (size_t i = 0; i < 4; i++) {
    jobs[i].w = &w;
    assert_int_equal(spot_pool_queue(p, &jobs[i].req, work_cb, after_cb), 0);
  }
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(w.after, 5);
  assert_int_equal(w.most, 4);
  assert_int_equal(spot_pool_threads(p), 4);
  close_loop(&loop, p);
  world_fini(&w);
}

/* The cap holds: 6 jobs on 2 threads, at most 2 at once. */
static void
test_cap(void **state)
{
  uv_loop_t loop;
  struct world w;
  struct job jobs[6];
  struct spot_pool *p;

  (void)state;
  world_init(&w)->need = 0;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(spot_pool_new(&loop, 2, &p), 0);
  memset(jobs, 0, sizeof(jobs));
  for (size_t i = 0; i < 6; i++) {
    jobs[i].w = &w;
    assert_int_equal(spot_pool_queue(p, &jobs[i].req, work_cb, after_cb), 0);
  }
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(w.after, 6);
  assert_true(spot_pool_threads(p) <= 2);
  assert_true(w.most >= 1 && w.most <= 2);
  close_loop(&loop, p);
  world_fini(&w);
}

/* One thread busy with a gated job: the queued ones can be cancelled,
 * the running one cannot; a cancelled job never works, and its after
 * callback runs from the loop with UV_ECANCELED, not inside the cancel. */
static void
test_cancel_queued(void **state)
{
  uv_loop_t loop;
  struct world w;
  struct job jobs[3];
  uv_work_t stranger;
  struct spot_pool *p;

  (void)state;
  world_init(&w);
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(spot_pool_new(&loop, 1, &p), 0);
  memset(jobs, 0, sizeof(jobs));
  for (size_t i = 0; i < 3; i++) {
    jobs[i].w = &w;
    jobs[i].gated = i == 0;
    assert_int_equal(spot_pool_queue(p, &jobs[i].req, work_cb, after_cb), 0);
  }
  uv_mutex_lock(&w.mu);
  while (w.inside == 0) /* job 0 holds the one thread */
    uv_cond_wait(&w.cond, &w.mu);
  uv_mutex_unlock(&w.mu);
  assert_int_equal(spot_pool_cancel(p, &jobs[1].req), 0);
  assert_int_equal(w.after, 0); /* queued, not run inside the cancel */
  /* cancelled, its callback due: as uv_cancel(), too late now */
  assert_int_equal(spot_pool_cancel(p, &jobs[1].req), UV_EBUSY);
  assert_int_equal(spot_pool_cancel(p, &jobs[0].req), UV_EBUSY);
  assert_int_equal(spot_pool_cancel(p, &stranger), UV_EINVAL);
  uv_mutex_lock(&w.mu);
  w.gate = true;
  uv_cond_broadcast(&w.cond);
  uv_mutex_unlock(&w.mu);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(w.after, 3);
  assert_int_equal(w.cancelled, 1);
  assert_false(jobs[1].worked);
  assert_int_equal(jobs[1].status, UV_ECANCELED);
  assert_true(jobs[0].worked && jobs[0].status == 0);
  assert_true(jobs[2].worked && jobs[2].status == 0);
  assert_int_equal(spot_pool_threads(p), 1);
  close_loop(&loop, p);
  world_fini(&w);
}

static void
requeue_after_cb(uv_work_t *req, int status)
{
  struct job *j = spot_container_of(req, struct job, req);
  struct spot_pool *p = req->data;

  after_cb(req, status);
  if (j->w->after < 5)
    assert_int_equal(spot_pool_queue(p, req, work_cb, requeue_after_cb), 0);
}

/* An after callback may queue the next job (a pipeline does): the loop
 * keeps running until the chain ends. A pool that never got a job joins
 * nothing and closes. */
static void
test_chain_and_empty_close(void **state)
{
  uv_loop_t loop;
  struct world w;
  struct job j;
  struct spot_pool *p;

  (void)state;
  world_init(&w);
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(spot_pool_new(&loop, 3, &p), 0);
  memset(&j, 0, sizeof(j));
  j.w = &w;
  j.req.data = p;
  assert_int_equal(spot_pool_queue(p, &j.req, work_cb, requeue_after_cb), 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(w.after, 5);
  assert_int_equal(w.ran, 5);
  assert_int_equal(spot_pool_threads(p), 1); /* one job at a time */
  close_loop(&loop, p);

  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(spot_pool_new(&loop, 4, &p), 0);
  assert_int_equal(spot_pool_new(&loop, 0, &(struct spot_pool *){NULL}),
                   -EINVAL);
  close_loop(&loop, p);
  world_fini(&w);
}

/* The threads hand jobs to each other (a thread back from a job leaves
 * the next to one that waits): 16 threads, each of 64 jobs queued again
 * from its after callback until 4,000 have run, jobs of a few hundred ns
 * to a few hundred us. A job left queued with every thread asleep would
 * hang uv_run (the test's timeout fails it). */
struct spin {
  uv_work_t req;
  unsigned *ran, *queued;
  struct spot_pool *p;
  unsigned n;
  volatile unsigned sink;
};

static void
spin_work(uv_work_t *req)
{
  struct spin *s = spot_container_of(req, struct spin, req);

  for (unsigned i = 0; i < (s->n % 7) * 3000; i++)
    s->sink += i;
}

static void
spin_after(uv_work_t *req, int status)
{
  struct spin *s = spot_container_of(req, struct spin, req);

  assert_int_equal(status, 0);
  (*s->ran)++;
  if (*s->queued < 4000) {
    (*s->queued)++;
    s->n++;
    assert_int_equal(spot_pool_queue(s->p, req, spin_work, spin_after), 0);
  }
}

static void
test_hand_over(void **state)
{
  uv_loop_t loop;
  struct spin jobs[64];
  struct spot_pool *p;
  unsigned ran = 0, queued = 0;

  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(spot_pool_new(&loop, 16, &p), 0);
  memset(jobs, 0, sizeof(jobs));
  for (unsigned i = 0; i < 64; i++) {
    jobs[i].ran = &ran;
    jobs[i].queued = &queued;
    jobs[i].p = p;
    jobs[i].n = i;
    queued++;
    assert_int_equal(spot_pool_queue(p, &jobs[i].req, spin_work, spin_after),
                     0);
  }
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(ran, 4000);
  assert_int_equal(queued, 4000);
  assert_int_equal(spot_pool_pending(p), 0);
  assert_true(spot_pool_threads(p) <= 16);
  close_loop(&loop, p);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runs_more_than_four),
      cmocka_unit_test(test_burst_after_idle),
      cmocka_unit_test(test_cap),
      cmocka_unit_test(test_cancel_queued),
      cmocka_unit_test(test_chain_and_empty_close),
      cmocka_unit_test(test_hand_over),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
