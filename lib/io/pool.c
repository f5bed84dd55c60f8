/* The store's worker pool (pool.h). One mutex guards the two job lists
 * and the thread bookkeeping; the threads wait on one condition variable
 * (a thread back from a job hands the next to one waiting there) and hand
 * finished jobs to the loop through one uv_async_t. */
#include "io/pool.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"
#include "core/util.h"

struct job {
  struct job *next;
  uv_work_t *req;
  uv_work_cb work;
  uv_after_work_cb after;
  int status;
};

struct spot_pool {
  uv_loop_t *loop;
  uv_async_t async; /* a job done: its after callback is due */
  uv_mutex_t mu;
  uv_cond_t cond;
  /* under mu: */
  struct job *queued, *queued_tail; /* waiting for a thread, in order */
  struct job *done, *done_tail;     /* finished or cancelled, in order */
  struct job *running;              /* being worked, unordered */
  unsigned nqueued;                 /* jobs waiting for a thread */
  unsigned idle;                    /* threads waiting on cond */
  unsigned starting; /* threads made, not yet at their first wait */
  bool stopping;
  /* loop thread only: */
  uv_thread_t *threads;
  unsigned nthreads, max;
  char name[12];    /* the threads' prefix */
  unsigned pending; /* queued, not yet after-called */
  void (*close_cb)(void *data);
  void *close_data;
};

static void
push_tail(struct job **head, struct job **tail, struct job *j)
{
  j->next = NULL;
  if (*tail != NULL)
    (*tail)->next = j;
  else
    *head = j;
  *tail = j;
}

static void
unlink_running(struct spot_pool *p, struct job *j)
{
  struct job **pp = &p->running;

  while (*pp != NULL && *pp != j)
    pp = &(*pp)->next;
  if (*pp != NULL)
    *pp = j->next;
}

static void
worker(void *arg)
{
  struct spot_pool *p = arg;
  sigset_t all;
  bool back = false; /* back from a job, not woken from the wait */

  /* Signals are the loop's business (uv_signal_t): never run a handler
   * on a worker in the middle of a job. */
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  uv_mutex_lock(&p->mu);
  p->starting--;
  for (;;) {
    struct job *j;

    /* A thread back from a job leaves the next one to a thread that
     * waits for work, when one does, and waits in its turn. With more
     * threads than cores the threads that happen to be on a core would
     * otherwise take every job as it is queued while the woken ones
     * wait for a core: a few threads did most of an upload (6 or 7 of
     * its 64 parts on one of 16), and their share of the bytes bounds
     * the node's rate where the cores are many. The hand-over costs a
     * wake-up per job; a job is a part, milliseconds of work. */
    while ((p->queued == NULL || (back && p->idle > 0)) && !p->stopping) {
      if (p->queued != NULL)
        uv_cond_signal(&p->cond); /* to one that waits: it takes it */
      p->idle++;
      uv_cond_wait(&p->cond, &p->mu);
      p->idle--;
      back = false;
    }
    if (p->stopping)
      break;
    j = p->queued;
    p->queued = j->next;
    p->nqueued--;
    if (p->queued == NULL)
      p->queued_tail = NULL;
    else if (p->idle > 0)
      uv_cond_signal(&p->cond); /* more waiting: wake the next taker */
    j->next = p->running;
    p->running = j;
    uv_mutex_unlock(&p->mu);
    j->work(j->req);
    uv_mutex_lock(&p->mu);
    unlink_running(p, j);
    push_tail(&p->done, &p->done_tail, j);
    uv_async_send(&p->async);
    back = true;
  }
  uv_mutex_unlock(&p->mu);
}

static void
async_cb(uv_async_t *a)
{
  struct spot_pool *p = spot_container_of(a, struct spot_pool, async);
  struct job *list, *j;

  uv_mutex_lock(&p->mu);
  list = p->done;
  p->done = p->done_tail = NULL;
  uv_mutex_unlock(&p->mu);
  /* An after callback may queue or cancel jobs: the list is ours now. */
  while ((j = list) != NULL) {
    list = j->next;
    p->pending--;
    if (p->pending == 0)
      uv_unref((uv_handle_t *)&p->async);
    j->after(j->req, j->status);
    free(j);
  }
}

int
spot_pool_new(uv_loop_t *loop, unsigned max_threads, struct spot_pool **out)
{
  struct spot_pool *p;
  int r;

  if (max_threads == 0 || max_threads > SPOT_POOL_MAX)
    return -EINVAL;
  p = calloc(1, sizeof(*p));
  if (p == NULL)
    return -ENOMEM;
  p->threads = calloc(SPOT_POOL_MAX, sizeof(*p->threads));
  if (p->threads == NULL) {
    free(p);
    return -ENOMEM;
  }
  p->loop = loop;
  p->max = max_threads;
  spot_pool_set_name(p, "pool");
  r = uv_mutex_init(&p->mu);
  if (r == 0) {
    r = uv_cond_init(&p->cond);
    if (r < 0)
      uv_mutex_destroy(&p->mu);
  }
  if (r == 0) {
    r = uv_async_init(loop, &p->async, async_cb);
    if (r < 0) {
      uv_cond_destroy(&p->cond);
      uv_mutex_destroy(&p->mu);
    }
  }
  if (r < 0) {
    free(p->threads);
    free(p);
    return r;
  }
  uv_unref((uv_handle_t *)&p->async);
  *out = p;
  return 0;
}

void
spot_pool_set_name(struct spot_pool *p, const char *prefix)
{
  snprintf(p->name, sizeof(p->name), "%s", prefix);
}

void
spot_pool_set_max(struct spot_pool *p, unsigned max_threads)
{
  if (max_threads == 0)
    max_threads = 1;
  p->max = max_threads > SPOT_POOL_MAX ? SPOT_POOL_MAX : max_threads;
}

int
spot_pool_queue(struct spot_pool *p, uv_work_t *req, uv_work_cb work,
                uv_after_work_cb after)
{
  struct job *j;
  bool spawn;
  int r;

  if (work == NULL || after == NULL)
    return -EINVAL;
  j = calloc(1, sizeof(*j));
  if (j == NULL)
    return -ENOMEM;
  j->req = req;
  j->work = work;
  j->after = after;
  uv_mutex_lock(&p->mu);
  push_tail(&p->queued, &p->queued_tail, j);
  p->nqueued++;
  /* A thread more only when the jobs waiting outnumber the threads that
   * will take them (waiting, or started and not there yet) and the cap
   * allows: a pool asked for one job at a time stays at one thread. An
   * idle thread counts until it has taken a job, so jobs queued in a burst
   * are not all promised to the same one. */
  spawn = p->nqueued > p->idle + p->starting && p->nthreads < p->max;
  if (spawn)
    p->starting++;
  uv_cond_signal(&p->cond);
  uv_mutex_unlock(&p->mu);
  if (spawn) {
    r = uv_thread_create(&p->threads[p->nthreads], worker, p);
    if (r == 0) {
      char name[16];

      snprintf(name, sizeof(name), "%s-%u", p->name, p->nthreads);
      pthread_setname_np(p->threads[p->nthreads], name);
      p->nthreads++;
    } else {
      uv_mutex_lock(&p->mu);
      p->starting--;
      if (p->nthreads == 0) {
        /* no thread would ever take it */
        p->queued = p->queued_tail = NULL;
        p->nqueued = 0;
        uv_mutex_unlock(&p->mu);
        free(j);
        return r;
      }
      uv_mutex_unlock(&p->mu);
      log_debug("pool: no thread beyond %u: %s", p->nthreads, uv_strerror(r));
    }
  }
  if (p->pending++ == 0)
    uv_ref((uv_handle_t *)&p->async);
  return 0;
}

int
spot_pool_cancel(struct spot_pool *p, uv_work_t *req)
{
  struct job **pp, *j, *r;
  int ret = UV_EINVAL;

  uv_mutex_lock(&p->mu);
  for (pp = &p->queued, j = NULL; *pp != NULL; pp = &(*pp)->next) {
    if ((*pp)->req == req) {
      j = *pp;
      *pp = j->next;
      break;
    }
  }
  if (j != NULL) {
    p->nqueued--;
    /* the tail moves back when the last one left */
    p->queued_tail = NULL;
    for (struct job *t = p->queued; t != NULL; t = t->next)
      p->queued_tail = t;
    j->status = UV_ECANCELED;
    push_tail(&p->done, &p->done_tail, j);
    uv_async_send(&p->async);
    ret = 0;
  } else {
    for (r = p->running; r != NULL && ret != UV_EBUSY; r = r->next)
      if (r->req == req)
        ret = UV_EBUSY;
    for (r = p->done; r != NULL && ret != UV_EBUSY; r = r->next)
      if (r->req == req)
        ret = UV_EBUSY;
  }
  uv_mutex_unlock(&p->mu);
  return ret;
}

unsigned
spot_pool_threads(struct spot_pool *p)
{
  return p->nthreads;
}

unsigned
spot_pool_pending(const struct spot_pool *p)
{
  return p->pending;
}

static void
close_cb(uv_handle_t *h)
{
  struct spot_pool *p =
      spot_container_of((uv_async_t *)h, struct spot_pool, async);
  void (*cb)(void *data) = p->close_cb;
  void *data = p->close_data;

  free(p);
  if (cb != NULL)
    cb(data);
}

void
spot_pool_close(struct spot_pool *p, void (*cb)(void *data), void *data)
{
  struct job *j;

  uv_mutex_lock(&p->mu);
  p->stopping = true;
  uv_cond_broadcast(&p->cond);
  uv_mutex_unlock(&p->mu);
  for (unsigned i = 0; i < p->nthreads; i++)
    uv_thread_join(&p->threads[i]);
  if (p->pending > 0)
    log_warn("pool: closed with %u jobs not delivered", p->pending);
  while ((j = p->queued) != NULL) {
    p->queued = j->next;
    free(j);
  }
  while ((j = p->done) != NULL) {
    p->done = j->next;
    free(j);
  }
  uv_cond_destroy(&p->cond);
  uv_mutex_destroy(&p->mu);
  free(p->threads);
  p->threads = NULL;
  p->close_cb = cb;
  p->close_data = data;
  uv_close((uv_handle_t *)&p->async, close_cb);
}
