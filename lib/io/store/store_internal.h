/* Internals shared by the store's files: store.c (the op base and pure
 * helpers), store_push*.c, store_retain.c, store_ranks.c, store_resume.c,
 * store_restore.c and store_list.c. */
#ifndef SPOT_STORE_INTERNAL_H
#define SPOT_STORE_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <unistd.h>

#include "core/codec.h"
#include "core/fsm.h"
#include "core/manifest.h"
#include "core/pace.h"
#include "io/store/store.h"

/* A config with its strings copied and defaults filled in. */
struct spot__store_cfg {
  struct spot_store_config c;
  char *bucket, *prefix, *job, *journal_dir, *lease_owner;
};

int spot__store_cfg_copy(struct spot__store_cfg *dst,
                         const struct spot_store_config *src);
void spot__store_cfg_fini(struct spot__store_cfg *c);
/* malloc'd key, NULL on ENOMEM. */
char *spot__store_key(const struct spot_store_config *cfg, const char *name,
                      const char *rel);
struct spot__store_op;
/* GET of the job's object (name, rel as spot__store_key()) into body,
 * emptied first (cap its first allocation); b->active_s3 counts it. 0
 * (cb follows) or negative errno. */
int spot__store_get_into(struct spot__store_op *b, struct spot_buf *body,
                         const char *name, const char *rel, size_t cap,
                         spot_s3_cb cb, void *data, struct spot_s3_op **s3op);
/* ".../checkpoints/NAME/" (a CommonPrefix) -> NAME, malloc'd. Returns 0,
 * -EINVAL (not of that shape, or NAME is not spot_ckpt_name_valid()) or
 * -ENOMEM. */
int spot__store_prefix_name(const char *prefix, char **name);
/* Writes into buf only if it is still empty (the first error wins). */
void spot__store_msg(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void spot__store_s3_msg(char *buf, size_t size, const char *what,
                        const struct spot_s3_result *res);

/* LATEST and manifests are read with this cap. */
#define SPOT__STORE_LATEST_CAP 1024
#define SPOT__STORE_MANIFEST_CAP SPOT_MANIFEST_JSON_MAX
/* A retired checkpoint's marker (store_retain.c): its manifest is deleted,
 * objects that kept checkpoints reference are left to collect later. */
#define SPOT__STORE_RETIRED "RETIRED"

/* ------------------------------------------------------------ the base
 *
 * Every store operation (push, restore, list) embeds this struct first.
 * It holds what they all do the same way: the first error and its message,
 * the count of thread-pool jobs and S3 requests in flight (the op moves on
 * only when none is), the progress figures and timer, the final callback,
 * and the handle bookkeeping that frees the op after its last close. */
struct spot__store_op;

struct spot__store_kind {
  const char *name; /* "push", "restore", "list": for log lines */
  /* Moves on from the current state; a no-op while busy. */
  void (*advance)(struct spot__store_op *b);
  /* Cancels what is in flight; the op is already marked cancelled. */
  void (*cancel)(struct spot__store_op *b);
  /* Frees what the op owns beyond the base (the base is freed after). */
  void (*free)(struct spot__store_op *b);
  /* Progress timer tick (may be NULL). */
  void (*tick)(struct spot__store_op *b);
  /* Closes the op's own handles, each close callback ending in
   * spot__store_handle_closed() (may be NULL). */
  void (*close)(struct spot__store_op *b);
};

/* Where an op is in its life, whatever its own state: cancel is legal
 * while RUNNING, a no-op after. */
enum spot__store_life {
  SPOT__STORE_RUNNING = 0,
  SPOT__STORE_CANCELLING, /* cancel asked; the final callback is pending */
  SPOT__STORE_FINISHED,   /* the final callback ran */
};

struct spot__store_pipe;

struct spot__store_op {
  const struct spot__store_kind *kind;
  uv_loop_t *loop;
  struct spot__store_cfg cfg;
  char *name; /* the checkpoint, once known */
  spot_store_progress_cb progress;
  spot_store_cb cb; /* push and restore; list keeps its own */
  void *data;

  /* The first failure and its line. A job on the pool (a walk, the
   * restore's folder work) may fail while the loop cancels or times the
   * op out: err is atomic and msg is written under fail_mu. */
  _Atomic int err;
  char msg[768];
  uv_mutex_t fail_mu;
  enum spot__store_life life;

  unsigned active_work;   /* pool jobs in flight */
  unsigned active_s3;     /* S3 requests in flight */
  uv_work_t work;         /* the op's one sequential pool job */
  struct spot_pool *pool; /* pool.h: made on the first job, joined at close */

  uint64_t start_ms;
  uint64_t raw_total, raw_done, stored_done;
  bool marker_pending; /* push: following, SPOT_STORE_MARKER not seen */
  unsigned retries;
  uv_timer_t progress_timer;
  /* Every second: the op's deadline (deadline_ms, 0 = none) and each
   * transfer's (spot__store_slot_sent()). */
  uv_timer_t watch_timer;
  uint64_t deadline_ms;
  const char *deadline_what;
  struct spot__store_pipe *pipe;
  /* the transfers the watch checks */ /* "--restore-timeout" etc., for the
                                          message */
  unsigned handles; /* open handles; the last close frees the op */
  /* Transfers in flight (pace.h), set up by spot__store_pipe_init(), fed
   * by spot__store_pace(); the transfers finished so far: */
  struct spot_pace pace;
  uint64_t xfer_bytes, xfer_done, xfer_busy_ms;
};

/* Feeds the op's controller (inflight: transfers in flight now, once the
 * pump has sent what it can), logs a change at debug and moves the pipe's
 * slot cap with it. Returns whether the limit changed. */
bool spot__store_pace(struct spot__store_op *b, unsigned inflight);

/* The op fails with -ETIMEDOUT and a line naming what (an option) unless
 * it finishes within ms. */
void spot__store_deadline(struct spot__store_op *b, uint64_t ms,
                          const char *what);
/* Allocates an op of size bytes (its struct starts with the base), copies
 * cfg, initialises the progress timer. 0 or negative errno (nothing to
 * free). On success the op is freed only through spot__store_close(). */
int spot__store_op_new(size_t size, const struct spot__store_kind *kind,
                       uv_loop_t *loop, const struct spot_store_config *cfg,
                       spot_store_progress_cb progress, spot_store_cb cb,
                       void *data, struct spot__store_op **out);
/* Frees the base's fields and calls kind->free, then free(b). For ops
 * whose handles never opened. */
void spot__store_op_free(struct spot__store_op *b);
/* Starts the 250 ms progress timer (when a progress callback is set). */
void spot__store_progress_start(struct spot__store_op *b);
void spot__store_progress(struct spot__store_op *b, enum spot_store_phase p);
/* Stops the timer and closes every handle; the last close frees b. */
void spot__store_close(struct spot__store_op *b);
void spot__store_handle_closed(struct spot__store_op *b);

void spot__store_fail(struct spot__store_op *b, int err);
void spot__store_fail_msg(struct spot__store_op *b, int err, const char *fmt,
                          ...) __attribute__((format(printf, 3, 4)));
void spot__store_fail_s3(struct spot__store_op *b, const char *what,
                         const struct spot_s3_result *res);
/* Marks the op cancelled and failed with -ECANCELED; false when it is
 * already finished or cancelled (then the caller does nothing). */
bool spot__store_cancel_mark(struct spot__store_op *b);

static inline bool
spot__store_cancelled(const struct spot__store_op *b)
{
  return b->life == SPOT__STORE_CANCELLING;
}

static inline bool
spot__store_busy(const struct spot__store_op *b)
{
  return b->active_work > 0 || b->active_s3 > 0;
}

/* Bookkeeping every S3 callback of an op starts with. */
static inline void
spot__store_s3_done(struct spot__store_op *b, struct spot_s3_op **slot,
                    const struct spot_s3_result *res)
{
  b->active_s3--;
  if (slot != NULL)
    *slot = NULL;
  b->retries += res->retries;
}

/* Queues a job on the op's own pool (pool.h), made on first use and
 * joined when the op closes: as uv_queue_work(), 0 or negative errno. */
int spot__store_work(struct spot__store_op *b, uv_work_t *req, uv_work_cb fn,
                     uv_after_work_cb after);
/* As uv_cancel() for a job of spot__store_work(). */
int spot__store_work_cancel(struct spot__store_op *b, uv_work_t *req);

/* Queues fn on the pool as the op's sequential job; its completion fails
 * the op on a pool error and calls kind->advance. */
int spot__store_queue(struct spot__store_op *b, uv_work_cb fn);

/* Fills the parts of a result every op has (err, message, name, retries,
 * elapsed), reports FINISH progress on success, runs b->cb, closes. The
 * caller fills the rest of res first. */
void spot__store_finish(struct spot__store_op *b, struct spot_store_result *r);

/* A compressing or decompressing thread's context: a codec and one raw
 * part buffer, lent to one pool job at a time. */
struct spot__store_coder {
  struct spot_codec *codec;
  void *raw;
  bool busy;
};

int spot__store_coders_new(size_t n, size_t part_max,
                           struct spot__store_coder **out);
void spot__store_coders_free(struct spot__store_coder *c, size_t n);
/* A free coder, or NULL. */
struct spot__store_coder *spot__store_coder_take(struct spot__store_coder *c,
                                                 size_t n);

/* A part in flight, in push or restore: its compressed buffer, the coder
 * lent to it while it is on the pool, the S3 request while it is on the
 * wire. state 0 is free; each op names its other states in the machine
 * it gives spot__store_pipe_init(), and only spot__store_slot_set_state()
 * changes it. */
struct spot__store_slot {
  struct spot__store_op *op;
  unsigned state;
  size_t file, part;
  uint64_t seq; /* dispatch order: the oldest goes first */
  void *comp;
  size_t comp_cap;
  size_t comp_len; /* push: encoded length; restore: bytes fetched */
  uint64_t want;   /* restore: the frame's stored length */
  size_t nfiles;   /* restore: packed files [file, file + nfiles) in one
                      ranged read of their pack; 0: frame part of file */
  uint64_t raw_len;
  uint32_t crc;
  int mode; /* push: enum spot_codec_mode */
  uint64_t work_ns;
  struct spot__store_coder *coder;
  uv_work_t work;
  int work_err;       /* also -ETIMEDOUT: the watch cancelled the transfer */
  bool work_local;    /* restore: work_err came from writing the local file */
  unsigned refetches; /* restore: fetches of this frame (run) after the first */
  struct spot_s3_op *s3op;
  uint64_t sent_ms, deadline_ms, sent_bytes; /* the transfer in flight */
};

/* `workers` coders and `workers + max` slots, of which at most `cap`
 * (workers + the controller's limit) in use, their buffers allocated on
 * first use: what bounds a push's or a restore's memory, whatever the
 * checkpoint size. */
struct spot__store_pipe {
  struct spot__store_coder *coders;
  size_t ncoders;
  struct spot__store_slot *slots;
  size_t nslots, cap;
  uint64_t seq;
  const struct spot_fsm *slot_fsm; /* the op's slot states (lib/core/fsm.h) */
};

/* part_max: the largest raw part. Fits workers and the transfers in
 * flight into cfg memory and starts the op's controller. slot_fsm: the
 * machine of the op's slot states, state 0 free (its legal table names
 * the moves of spot__store_pipe_work() and spot__store_pipe_worked()
 * too). 0 or negative errno (then fini). */
int spot__store_pipe_init(struct spot__store_pipe *p, struct spot__store_op *op,
                          size_t part_max, const struct spot_fsm *slot_fsm);
/* Moves s to state through its pipe's machine (logged at debug with the
 * slot's file and part); an illegal move is refused, logged as an
 * internal error, and s keeps its state. */
#define spot__store_slot_set_state(s, state)                                   \
  spot__store_slot_set_state_at((s), (state), __FILE__, __LINE__)
void spot__store_slot_set_state_at(struct spot__store_slot *s, unsigned state,
                                   const char *file, int line);
void spot__store_pipe_fini(struct spot__store_pipe *p);
/* The oldest slot in state (any free one for 0) that ok accepts (ok may
 * be NULL), or NULL. */
struct spot__store_slot *
spot__store_pipe_find(struct spot__store_pipe *p, unsigned state,
                      bool (*ok)(const struct spot__store_slot *s));
/* A free slot, its buffer allocated, while fewer than cap are in use:
 * 0 (*out set), 1 (none) or -ENOMEM. */
int spot__store_pipe_take(struct spot__store_pipe *p,
                          struct spot__store_slot **out);
/* Lends a free coder to s and queues work on the pool; s moves to
 * work_state. 0, 1 (no coder free: nothing done) or negative errno (the
 * op failed with a message). */
int spot__store_pipe_work(struct spot__store_pipe *p,
                          struct spot__store_slot *s, uv_work_cb work,
                          uv_after_work_cb after, unsigned work_state);
/* First thing in an after-work callback: takes the coder back and frees
 * the slot. Returns the job's error (status or work_err). */
int spot__store_pipe_worked(struct spot__store_slot *s, int status);
/* A transfer of bytes started on s (s->s3op set): arms its deadline. */
void spot__store_slot_sent(struct spot__store_slot *s, uint64_t bytes);
/* s's transfer of bytes succeeded: counted for the controller. */
void spot__store_slot_finished(struct spot__store_slot *s, uint64_t bytes);
/* Whether s's transfer was cancelled for being too slow; then the op has
 * failed with a message naming what (e.g. "a.bin part 2"). */
bool spot__store_slot_too_slow(struct spot__store_slot *s, const char *what);
/* Cancels pool jobs in work_state and S3 requests in s3_state. */
void spot__store_pipe_cancel(struct spot__store_pipe *p, unsigned work_state,
                             unsigned s3_state);

#endif
