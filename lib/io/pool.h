/* A worker pool owned by its user, in place of libuv's global one
 * (uv_queue_work), which runs 4 threads unless UV_THREADPOOL_SIZE says
 * otherwise: a push on a 16-core node then compressed on 4 cores at most.
 *
 * Jobs take the same uv_work_t and callbacks as uv_queue_work: the work
 * callback runs on a pool thread, the after callback on the pool's loop,
 * once per job, in completion order, with status 0 or UV_ECANCELED (a
 * job cancelled before it started). Threads start on demand, one per job
 * waiting with none idle, up to the pool's maximum; an idle thread sleeps
 * on a condition variable and costs no CPU. A thread back from a job
 * leaves the next job to an idle one, if any, so the jobs spread over the
 * threads even where the threads outnumber the cores. The store makes
 * one pool per operation, so spotd has none while it waits for a notice.
 *
 * Everything here except the work callbacks runs on the loop's thread. */
#ifndef SPOT_POOL_H
#define SPOT_POOL_H

#include <uv.h>

struct spot_pool;

/* max_threads: 1 to SPOT_POOL_MAX. 0 or negative errno. */
int spot_pool_new(uv_loop_t *loop, unsigned max_threads,
                  struct spot_pool **out);
#define SPOT_POOL_MAX 128
/* Names the threads started from now on PREFIX-N (N from 0, cut to the
 * 15 characters a thread name holds), as top -H and /proc/PID/task/TID/comm
 * show them; unnamed, they are "pool-N". */
void spot_pool_set_name(struct spot_pool *p, const char *prefix);
/* Raises or lowers the thread cap for threads not yet started (threads
 * already running stay until close). */
void spot_pool_set_max(struct spot_pool *p, unsigned max_threads);
/* Queues a job; req must stay valid until after has run. 0 or negative
 * errno (then neither callback runs). While jobs are queued or running,
 * the pool keeps the loop alive, as uv_queue_work does. */
int spot_pool_queue(struct spot_pool *p, uv_work_t *req, uv_work_cb work,
                    uv_after_work_cb after);
/* As uv_cancel(): 0 when the job had not started (its after callback
 * runs from the loop with UV_ECANCELED, never inside this call), UV_EBUSY
 * when it is running or done, UV_EINVAL when the pool does not know it. */
int spot_pool_cancel(struct spot_pool *p, uv_work_t *req);
/* Threads started so far (for tests and log lines). */
unsigned spot_pool_threads(struct spot_pool *p);
/* Jobs queued or running whose after callback has not run yet. */
unsigned spot_pool_pending(const struct spot_pool *p);
/* Stops and joins the threads, then closes the pool's handle; cb (may be
 * NULL) runs from the loop once the memory is freed. Call it once no job
 * is pending: one still running is waited for, and the after callbacks
 * of those not yet delivered are dropped. */
void spot_pool_close(struct spot_pool *p, void (*cb)(void *data), void *data);

#endif
