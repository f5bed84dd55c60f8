/* The checkpoint store: shared pieces of push, restore and list, and the
 * base every store operation embeds (store_internal.h). The pipelines are
 * in store_push.c (+ store_push_xfer.c, store_resume.c, store_ranks.c,
 * store_retain.c) and store_restore.c. */
#include "io/store/store.h"

#include <errno.h>
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"
#include "core/manifest.h"
#include "core/util.h"
#include "io/pool.h"
#include "io/store/store_internal.h"

const char *
spot_store_phase_name(enum spot_store_phase p)
{
  static const char *const names[] = {
      [SPOT_STORE_PHASE_PLAN] = "plan",
      [SPOT_STORE_PHASE_TRANSFER] = "transfer",
      [SPOT_STORE_PHASE_COMMIT] = "commit",
      [SPOT_STORE_PHASE_RETAIN] = "retain",
      [SPOT_STORE_PHASE_FINISH] = "finish",
  };

  if ((unsigned)p >= SPOT_STORE_PHASE_LAST)
    return "?";
  return names[p];
}

uint32_t
spot_store_restore_mode(uint32_t mode, uint32_t mask)
{
  return mode & 0777 & ~(mask & 0022);
}

uint32_t
spot_store_umask(void)
{
  FILE *f = fopen("/proc/self/status", "re");
  char line[256];
  unsigned m = 0;
  bool found = false;
  mode_t old;

  while (f != NULL && !found && fgets(line, sizeof(line), f) != NULL)
    found = sscanf(line, "Umask: %o", &m) == 1;
  if (f != NULL)
    fclose(f);
  if (found)
    return m & 0777;
  old = umask(077); /* only before 4.7 kernels; briefly the strictest */
  umask(old);
  return (uint32_t)old & 0777;
}

int
spot_store_key(const struct spot_store_config *cfg, const char *name,
               const char *rel, struct spot_buf *out)
{
  int r;

  spot_buf_reset(out);
  if (cfg->prefix != NULL && cfg->prefix[0] != '\0') {
    r = spot_buf_printf(out, "%s/", cfg->prefix);
    if (r < 0)
      return r;
  }
  r = spot_buf_printf(out, "%s/", cfg->job);
  if (r < 0)
    return r;
  if (name == NULL)
    return rel != NULL ? spot_buf_appends(out, rel) : 0;
  r = spot_buf_printf(out, "checkpoints/%s/", name);
  if (r < 0 || rel == NULL)
    return r;
  return spot_buf_appends(out, rel);
}

char *
spot__store_key(const struct spot_store_config *cfg, const char *name,
                const char *rel)
{
  struct spot_buf b;

  spot_buf_init(&b, 2048);
  if (spot_store_key(cfg, name, rel, &b) < 0) {
    spot_buf_fini(&b);
    return NULL;
  }
  return spot_buf_steal(&b);
}

int
spot__store_get_into(struct spot__store_op *b, struct spot_buf *body,
                     const char *name, const char *rel, size_t cap,
                     spot_s3_cb cb, void *data, struct spot_s3_op **s3op)
{
  char *key = spot__store_key(&b->cfg.c, name, rel);
  int r;

  if (key == NULL)
    return -ENOMEM;
  spot_buf_fini(body);
  spot_buf_init(body, cap);
  r = spot_s3_get(b->cfg.c.s3, b->cfg.bucket, key, 0, 0, NULL, body, cb, data,
                  s3op);
  free(key);
  if (r == 0)
    b->active_s3++;
  return r;
}

char *
spot_store_key_dup(const struct spot_store_config *cfg, const char *name,
                   const char *rel)
{
  return spot__store_key(cfg, name, rel);
}

/* SPOT_STORE_MIN_RATE=B/s (1..1e12): a test knob, as s3.c's
 * SPOT_S3_LOW_SPEED_TIME, so a slow-server test need not wait minutes. */
static uint64_t
min_rate_default(void)
{
  const char *v = getenv("SPOT_STORE_MIN_RATE");
  int64_t n;

  if (v != NULL && spot_parse_int64(v, 1, 1000000000000LL, &n) == 0)
    return (uint64_t)n;
  return SPOT_STORE_MIN_RATE_DEFAULT;
}

/* SPOT_STORE_WORKERS=N (1..64): a test knob for the default workers, so
 * CI on 2 cores runs the store with more coders than cores. */
static unsigned
workers_default(void)
{
  const char *v = getenv("SPOT_STORE_WORKERS");
  int64_t n;
  long cores;

  if (v != NULL && spot_parse_int64(v, 1, SPOT_STORE_WORKERS_MAX, &n) == 0)
    return (unsigned)n;
  /* the cores this process may run on (its CPU affinity: a run pinned
   * to 4 cores gets 4), as many as the config allows; pipe_budget()
   * trims them to the memory budget */
  cores = (long)uv_available_parallelism();
  return cores < 1                        ? 1
         : cores > SPOT_STORE_WORKERS_MAX ? SPOT_STORE_WORKERS_MAX
                                          : (unsigned)cores;
}

int
spot__store_cfg_copy(struct spot__store_cfg *dst,
                     const struct spot_store_config *src)
{
  memset(dst, 0, sizeof(*dst));
  dst->c = *src;
  dst->bucket = strdup(src->bucket != NULL ? src->bucket : "");
  dst->prefix = strdup(src->prefix != NULL ? src->prefix : "");
  dst->job = strdup(src->job != NULL ? src->job : "");
  if (src->journal_dir != NULL) {
    dst->journal_dir = strdup(src->journal_dir);
    if (dst->journal_dir == NULL) {
      spot__store_cfg_fini(dst);
      return -ENOMEM;
    }
  }
  if (src->lease_owner != NULL) {
    dst->lease_owner = strdup(src->lease_owner);
    if (dst->lease_owner == NULL) {
      spot__store_cfg_fini(dst);
      return -ENOMEM;
    }
  }
  if (dst->bucket == NULL || dst->prefix == NULL || dst->job == NULL) {
    spot__store_cfg_fini(dst);
    return -ENOMEM;
  }
  dst->c.bucket = dst->bucket;
  dst->c.prefix = dst->prefix;
  dst->c.job = dst->job;
  dst->c.journal_dir = dst->journal_dir;
  dst->c.lease_owner = dst->lease_owner;
  if (dst->c.part_size == 0)
    dst->c.part_size = SPOT_STORE_PART_DEFAULT;
  if (dst->c.memory == 0)
    dst->c.memory = SPOT_STORE_MEMORY_DEFAULT;
  if (dst->c.workers == 0)
    dst->c.workers = workers_default();
  if (dst->c.stale_upload_age_ms == 0)
    dst->c.stale_upload_age_ms = 3600 * 1000;
  if (dst->c.min_rate == 0)
    dst->c.min_rate = min_rate_default();
  if (src->s3 == NULL || dst->bucket[0] == '\0' || dst->job[0] == '\0' ||
      spot_xfer_sizes_check(dst->c.part_size, dst->c.memory,
                            dst->c.pack_threshold == SPOT_STORE_PACK_OFF
                                ? 0
                                : dst->c.pack_threshold,
                            NULL, 0) < 0 ||
      dst->c.parallel > 64 || dst->c.workers > SPOT_STORE_WORKERS_MAX ||
      dst->c.parallel_start > SPOT_STORE_PARALLEL_MAX) {
    spot__store_cfg_fini(dst);
    return -EINVAL;
  }
  return 0;
}

void
spot__store_cfg_fini(struct spot__store_cfg *c)
{
  free(c->bucket);
  free(c->prefix);
  free(c->job);
  free(c->journal_dir);
  free(c->lease_owner);
  c->lease_owner = NULL;
  c->bucket = c->prefix = c->job = c->journal_dir = NULL;
}

void
spot__store_msg(char *buf, size_t size, const char *fmt, ...)
{
  va_list ap;

  if (buf[0] != '\0')
    return; /* keep the first error: it is the cause */
  va_start(ap, fmt);
  vsnprintf(buf, size, fmt, ap);
  va_end(ap);
}

void
spot__store_s3_msg(char *buf, size_t size, const char *what,
                   const struct spot_s3_result *res)
{
  char tmp[512];

  spot__store_msg(buf, size, "%s: %s", what,
                  spot_s3_strerror(res, tmp, sizeof(tmp)));
}

int
spot__store_prefix_name(const char *p, char **name)
{
  size_t len = strlen(p);
  const char *start;

  if (len < 2 || p[len - 1] != '/')
    return -EINVAL;
  start = p + len - 2;
  while (start > p && start[-1] != '/')
    start--;
  *name = strndup(start, (size_t)(p + len - 1 - start));
  if (*name == NULL)
    return -ENOMEM;
  if (!spot_ckpt_name_valid(*name)) {
    free(*name);
    *name = NULL;
    return -EINVAL; /* not a checkpoint of ours (".spotd-...", ...) */
  }
  return 0;
}

/* ------------------------------------------------------------ the base */

/* Whether a transfer is past its deadline, and the op's own. */
static void
watch_cb(uv_timer_t *t)
{
  struct spot__store_op *b =
      spot_container_of(t, struct spot__store_op, watch_timer);
  uint64_t now = spot_now_mono_ms();

  if (b->life != SPOT__STORE_RUNNING)
    return;
  if (b->deadline_ms != 0 && now >= b->deadline_ms) {
    spot__store_fail_msg(
        b, -ETIMEDOUT, "%s did not finish within %" PRIu64 " s (%s)",
        b->kind->name, (b->deadline_ms - b->start_ms) / 1000, b->deadline_what);
    spot_store_cancel((struct spot_store_op *)(void *)b);
    return;
  }
  for (size_t i = 0; b->pipe != NULL && i < b->pipe->nslots; i++) {
    struct spot__store_slot *s = &b->pipe->slots[i];

    if (s->s3op != NULL && s->deadline_ms != 0 && now >= s->deadline_ms) {
      s->work_err = -ETIMEDOUT;
      s->deadline_ms = 0;
      spot_s3_cancel(s->s3op); /* its callback runs from the loop */
    }
  }
}

void
spot__store_deadline(struct spot__store_op *b, uint64_t ms, const char *what)
{
  b->deadline_ms = ms > 0 ? b->start_ms + ms : 0;
  b->deadline_what = what;
}

void
spot__store_slot_sent(struct spot__store_slot *s, uint64_t bytes)
{
  uint64_t rate = s->op->cfg.c.min_rate;
  unsigned n = spot_pace_limit(&s->op->pace);

  /* The floor is per transfer up to SPOT_PACE_START in flight; beyond,
   * they share it: many transfers on a slow link each go slowly, which is
   * not a server trickling (spotd starts at 32 after a notice). */
  if (n > SPOT_PACE_START)
    rate = rate * SPOT_PACE_START / n;
  if (rate == 0)
    rate = 1;
  s->work_err = 0;
  s->sent_bytes = bytes;
  s->sent_ms = spot_now_mono_ms();
  s->deadline_ms =
      s->sent_ms + SPOT_STORE_TRANSFER_GRACE_MS + bytes * 1000 / rate;
}

void
spot__store_slot_finished(struct spot__store_slot *s, uint64_t bytes)
{
  struct spot__store_op *b = s->op;

  b->xfer_bytes += bytes;
  b->xfer_done++;
  b->xfer_busy_ms += spot_now_mono_ms() - s->sent_ms;
}

bool
spot__store_slot_too_slow(struct spot__store_slot *s, const char *what)
{
  if (s->work_err != -ETIMEDOUT)
    return false;
  spot__store_fail_msg(
      s->op, -ETIMEDOUT,
      "%s: the server is too slow: %" PRIu64 " bytes not moved in %" PRIu64
      " s (the floor is %" PRIu64 " B/s plus %d s per transfer)",
      what, s->sent_bytes, (spot_now_mono_ms() - s->sent_ms) / 1000,
      s->op->cfg.c.min_rate, SPOT_STORE_TRANSFER_GRACE_MS / 1000);
  return true;
}

int
spot__store_op_new(size_t size, const struct spot__store_kind *kind,
                   uv_loop_t *loop, const struct spot_store_config *cfg,
                   spot_store_progress_cb progress, spot_store_cb cb,
                   void *data, struct spot__store_op **out)
{
  struct spot__store_op *b = calloc(1, size);
  int r;

  if (b == NULL)
    return -ENOMEM;
  b->kind = kind;
  b->loop = loop;
  b->progress = progress;
  b->cb = cb;
  b->data = data;
  r = uv_mutex_init(&b->fail_mu);
  if (r < 0) {
    free(b);
    return r;
  }
  r = spot__store_cfg_copy(&b->cfg, cfg);
  if (r == 0) {
    r = uv_timer_init(loop, &b->progress_timer);
    if (r < 0)
      spot__store_cfg_fini(&b->cfg);
  }
  if (r < 0) {
    uv_mutex_destroy(&b->fail_mu);
    free(b);
    return r;
  }
  /* Cannot fail once a timer of the same loop initialised. */
  (void)uv_timer_init(loop, &b->watch_timer);
  b->handles = 2;
  b->start_ms = spot_now_mono_ms();
  uv_timer_start(&b->watch_timer, watch_cb, 1000, 1000);
  uv_unref((uv_handle_t *)&b->watch_timer);
  *out = b;
  return 0;
}

void
spot__store_op_free(struct spot__store_op *b)
{
  if (b->kind->free != NULL)
    b->kind->free(b);
  spot__store_cfg_fini(&b->cfg);
  uv_mutex_destroy(&b->fail_mu);
  free(b->name);
  free(b);
#ifdef __GLIBC__
  /* The op's threads are joined and its buffers unmapped, but what it
   * malloc'd and freed (zstd's contexts, curl's handles, the file list)
   * stays touched in malloc's heap unless trimmed: memory an idle spotd
   * would keep after its first checkpoint (spotd keeps every thread in one
   * arena so that this reaches all of it: daemon/main.c). */
  (void)malloc_trim(0);
#endif
}

void
spot__store_handle_closed(struct spot__store_op *b)
{
  if (--b->handles == 0)
    spot__store_op_free(b);
}

static void
progress_close_cb(uv_handle_t *h)
{
  spot__store_handle_closed(
      spot_container_of(h, struct spot__store_op, progress_timer));
}

static void
watch_close_cb(uv_handle_t *h)
{
  spot__store_handle_closed(
      spot_container_of(h, struct spot__store_op, watch_timer));
}

static void
pool_closed_cb(void *data)
{
  spot__store_handle_closed(data);
}

void
spot__store_close(struct spot__store_op *b)
{
  if (b->pool != NULL) {
    spot_pool_close(b->pool, pool_closed_cb, b); /* joins its threads */
    b->pool = NULL;
  }
  uv_timer_stop(&b->progress_timer);
  uv_close((uv_handle_t *)&b->progress_timer, progress_close_cb);
  uv_timer_stop(&b->watch_timer);
  uv_close((uv_handle_t *)&b->watch_timer, watch_close_cb);
  if (b->kind->close != NULL)
    b->kind->close(b);
}

static void
progress_timer_cb(uv_timer_t *t)
{
  struct spot__store_op *b =
      spot_container_of(t, struct spot__store_op, progress_timer);

  if (b->kind->tick != NULL)
    b->kind->tick(b);
}

void
spot__store_progress_start(struct spot__store_op *b)
{
  if (b->progress == NULL)
    return;
  uv_timer_start(&b->progress_timer, progress_timer_cb, 250, 250);
  uv_unref((uv_handle_t *)&b->progress_timer);
}

void
spot__store_progress(struct spot__store_op *b, enum spot_store_phase phase)
{
  struct spot_store_progress p;

  if (b->progress == NULL)
    return;
  p.phase = phase;
  p.name = b->name != NULL ? b->name : "";
  p.raw_done = b->raw_done;
  p.raw_total = b->raw_total;
  p.stored_done = b->stored_done;
  p.elapsed_ms = spot_now_mono_ms() - b->start_ms;
  p.retries = b->retries;
  p.marker_pending = b->marker_pending;
  p.parallel =
      b->pipe != NULL && b->pipe->slots != NULL ? spot_pace_limit(&b->pace) : 0;
  b->progress(&p, b->data);
}

void
spot__store_fail(struct spot__store_op *b, int err)
{
  int none = 0;

  /* the first one stays, whichever thread it came from */
  atomic_compare_exchange_strong(&b->err, &none, err < 0 ? err : -EIO);
}

void
spot__store_fail_msg(struct spot__store_op *b, int err, const char *fmt, ...)
{
  va_list ap;
  char raw[sizeof(b->msg)];

  va_start(ap, fmt);
  vsnprintf(raw, sizeof(raw), fmt, ap);
  va_end(ap);
  uv_mutex_lock(&b->fail_mu);
  /* Paths and names may come from the store's manifest: never raw. */
  if (b->msg[0] == '\0')
    spot_escape(raw, b->msg, sizeof(b->msg));
  spot__store_fail(b, err);
  uv_mutex_unlock(&b->fail_mu);
}

void
spot__store_fail_s3(struct spot__store_op *b, const char *what,
                    const struct spot_s3_result *res)
{
  uv_mutex_lock(&b->fail_mu);
  spot__store_s3_msg(b->msg, sizeof(b->msg), what, res);
  spot__store_fail(b, res->err);
  uv_mutex_unlock(&b->fail_mu);
}

bool
spot__store_cancel_mark(struct spot__store_op *b)
{
  if (b->life != SPOT__STORE_RUNNING)
    return false;
  b->life = SPOT__STORE_CANCELLING;
  uv_mutex_lock(&b->fail_mu);
  spot__store_fail(b, -ECANCELED);
  spot__store_msg(b->msg, sizeof(b->msg), "cancelled");
  uv_mutex_unlock(&b->fail_mu);
  return true;
}

static void
work_after_cb(uv_work_t *req, int status)
{
  struct spot__store_op *b =
      spot_container_of(req, struct spot__store_op, work);

  b->active_work--;
  if (status < 0)
    spot__store_fail_msg(b, status, "%s", uv_strerror(status));
  b->kind->advance(b);
}

/* The op's pool, made on its first job: its coders and one thread more
 * for the op's sequential job or follow's scan beside them. */
static int
op_pool(struct spot__store_op *b)
{
  unsigned max = b->cfg.c.workers + 1;
  int r;

  if (b->pool != NULL) {
    spot_pool_set_max(b->pool, max);
    return 0;
  }
  r = spot_pool_new(b->loop, max, &b->pool);
  if (r == 0) {
    char name[12];

    /* push-wk-N, restore-wk-N, list-wk-N */
    snprintf(name, sizeof(name), "%s-wk", b->kind->name);
    spot_pool_set_name(b->pool, name);
    b->handles++; /* closed in spot__store_close() */
  }
  return r;
}

int
spot__store_work(struct spot__store_op *b, uv_work_t *req, uv_work_cb fn,
                 uv_after_work_cb after)
{
  int r = op_pool(b);

  return r < 0 ? r : spot_pool_queue(b->pool, req, fn, after);
}

int
spot__store_work_cancel(struct spot__store_op *b, uv_work_t *req)
{
  return b->pool != NULL ? spot_pool_cancel(b->pool, req) : UV_EINVAL;
}

int
spot__store_queue(struct spot__store_op *b, uv_work_cb fn)
{
  int r = spot__store_work(b, &b->work, fn, work_after_cb);

  if (r == 0)
    b->active_work++;
  return r;
}

void
spot__store_finish(struct spot__store_op *b, struct spot_store_result *res)
{
  b->life = SPOT__STORE_FINISHED;
  if (b->err < 0 && b->msg[0] == '\0')
    snprintf(b->msg, sizeof(b->msg), "%s", strerror(-b->err));
  res->err = b->err;
  res->message = b->err < 0 ? b->msg : "";
  res->name = b->name != NULL ? b->name : "";
  res->retries = b->retries;
  res->elapsed_ms = spot_now_mono_ms() - b->start_ms;
  if (res->warning == NULL)
    res->warning = "";
  if (b->err == 0)
    spot__store_progress(b, SPOT_STORE_PHASE_FINISH);
  b->cb(res, b->data);
  spot__store_close(b);
}

void
spot_store_cancel(struct spot_store_op *op)
{
  struct spot__store_op *b = (struct spot__store_op *)(void *)op;

  if (b != NULL && spot__store_cancel_mark(b))
    b->kind->cancel(b);
}

/* ------------------------------------------------------------ coders */

int
spot__store_coders_new(size_t n, size_t part_max,
                       struct spot__store_coder **out)
{
  struct spot__store_coder *c = calloc(n, sizeof(*c));
  int r;

  if (c == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < n; i++) {
    r = spot_codec_new(part_max, &c[i].codec);
    c[i].raw = r == 0 ? spot_big_alloc(part_max, part_max) : NULL;
    if (r == 0 && c[i].raw == NULL)
      r = -ENOMEM;
    if (r < 0) {
      spot__store_coders_free(c, i + 1);
      return r;
    }
  }
  *out = c;
  return 0;
}

void
spot__store_coders_free(struct spot__store_coder *c, size_t n)
{
  for (size_t i = 0; c != NULL && i < n; i++) {
    /* raw is allocated only after the codec */
    if (c[i].raw != NULL)
      spot_big_free(c[i].raw, spot_codec_part_max(c[i].codec));
    spot_codec_free(c[i].codec);
  }
  free(c);
}

struct spot__store_coder *
spot__store_coder_take(struct spot__store_coder *c, size_t n)
{
  for (size_t i = 0; c != NULL && i < n; i++)
    if (!c[i].busy)
      return &c[i];
  return NULL;
}

/* ------------------------------------------------------------ the pipe */

/* What a coder costs beyond its raw part and the codec's scratch part:
 * zstd's contexts and the filter trial's buffer (measured ~2 MiB at level
 * 1 with 8 MiB parts; counted high). What a transfer costs beyond its
 * compressed part: curl's buffers and handle. */
#define CODER_EXTRA ((uint64_t)3 << 20)
#define XFER_EXTRA ((uint64_t)256 << 10)

/* Fits the workers and the transfers in flight into the memory budget
 * and starts the controller (pace.h). */
static void
pipe_budget(struct spot__store_pipe *p, struct spot__store_op *op,
            size_t part_max)
{
  struct spot_store_config *c = &op->cfg.c;
  uint64_t slot = spot_codec_bound(part_max) + XFER_EXTRA;
  uint64_t coder = 2 * (uint64_t)part_max + CODER_EXTRA + slot;
  uint64_t workers = c->workers, fit = 0;
  struct spot_pace_config pc;
  char mem[32], need[32];

  /* Each worker holds a coder and the slot it encodes into; what is
   * left is for transfers, at least 2 (1 with 1 worker). */
  while (workers > 0) {
    uint64_t fixed = workers * coder;
    fit = c->memory > fixed ? (c->memory - fixed) / slot : 0;
    if (fit >= 2 || (workers == 1 && fit >= 1))
      break;
    workers--;
  }
  if (workers == 0) {
    workers = fit = 1;
    log_warn("%s: the memory budget %s is below what one worker and one "
             "transfer of %zu-byte parts need (%s); using that",
             op->kind->name, spot_fmt_bytes(c->memory, mem, sizeof(mem)),
             part_max, spot_fmt_bytes(coder + slot, need, sizeof(need)));
  } else if (workers < c->workers) {
    log_warn("%s: the memory budget %s fits %" PRIu64 " of %u workers",
             op->kind->name, spot_fmt_bytes(c->memory, mem, sizeof(mem)),
             workers, c->workers);
  }
  if (fit > SPOT_STORE_PARALLEL_MAX)
    fit = SPOT_STORE_PARALLEL_MAX;
  if (c->parallel > fit)
    log_warn("%s: --parallel %u does not fit in the memory budget %s: %" PRIu64
             " transfers",
             op->kind->name, c->parallel,
             spot_fmt_bytes(c->memory, mem, sizeof(mem)), fit);
  c->workers = (unsigned)workers;
  memset(&pc, 0, sizeof(pc));
  pc.max = (unsigned)fit;
  pc.fixed = c->parallel > 0;
  pc.start = pc.fixed ? c->parallel : c->parallel_start;
  pc.target_bps = c->target_rate;
  spot_pace_init(&op->pace, &pc);
  p->ncoders = workers;
  p->nslots = workers + fit;
  p->cap = workers + spot_pace_limit(&op->pace);
  log_debug("%s name=%s parallel %u (%s, at most %" PRIu64 ", %" PRIu64
            " workers, memory %s)",
            op->kind->name, op->name != NULL ? op->name : "?",
            spot_pace_limit(&op->pace), pc.fixed ? "fixed" : "adaptive", fit,
            workers, spot_fmt_bytes(c->memory, mem, sizeof(mem)));
}

int
spot__store_pipe_init(struct spot__store_pipe *p, struct spot__store_op *op,
                      size_t part_max, const struct spot_fsm *slot_fsm)
{
  size_t bound = spot_codec_bound(part_max);
  int r;

  p->slot_fsm = slot_fsm;
  pipe_budget(p, op, part_max);
  r = spot__store_coders_new(p->ncoders, part_max, &p->coders);
  if (r < 0)
    return r;
  p->slots = calloc(p->nslots, sizeof(*p->slots));
  if (p->slots == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < p->nslots; i++) {
    p->slots[i].op = op;
    p->slots[i].comp_cap = bound; /* allocated on first use */
  }
  return 0;
}

int
spot__store_pipe_take(struct spot__store_pipe *p, struct spot__store_slot **out)
{
  struct spot__store_slot *free_slot = NULL;
  size_t used = 0;

  for (size_t i = 0; i < p->nslots; i++) {
    if (p->slots[i].state != 0)
      used++;
    else if (free_slot == NULL ||
             (free_slot->comp == NULL && p->slots[i].comp != NULL))
      free_slot = &p->slots[i]; /* one with a buffer first */
  }
  if (free_slot == NULL || used >= p->cap)
    return 1;
  /* Untouched pages of these buffers cost no memory; a huge page costs
   * 2 MiB once touched. All of it gets them: the push reads a part of a
   * grouped file into it whole (store_push_xfer.c), and in 4 KiB pages
   * the last quarter took 1000 page faults per slot (a 1 GiB push 13,500
   * -> 32,400); a restore's frame leaves at most one huge page partly
   * used. */
  if (free_slot->comp == NULL &&
      (free_slot->comp =
           spot_big_alloc(free_slot->comp_cap, free_slot->comp_cap)) == NULL)
    return -ENOMEM;
  *out = free_slot;
  return 0;
}

bool
spot__store_pace(struct spot__store_op *b, unsigned inflight)
{
  struct spot_pace_sample s;
  unsigned old = spot_pace_limit(&b->pace);

  if (b->pipe == NULL || b->pipe->slots == NULL)
    return false;
  s.now_ms = spot_now_mono_ms();
  s.bytes = b->xfer_bytes;
  s.done = b->xfer_done;
  s.busy_ms = b->xfer_busy_ms;
  s.throttled = spot_s3_throttled(b->cfg.c.s3);
  s.inflight = inflight;
  if (!spot_pace_sample(&b->pace, &s))
    return false;
  b->pipe->cap = b->pipe->ncoders + spot_pace_limit(&b->pace);
  log_debug("%s name=%s parallel %u -> %u (%s; %.0f MB/s)", b->kind->name,
            b->name != NULL ? b->name : "?", old, spot_pace_limit(&b->pace),
            b->pace.why, b->pace.rate_bps / 1e6);
  return true;
}

void
spot__store_pipe_fini(struct spot__store_pipe *p)
{
  spot__store_coders_free(p->coders, p->ncoders);
  for (size_t i = 0; p->slots != NULL && i < p->nslots; i++)
    spot_big_free(p->slots[i].comp, p->slots[i].comp_cap);
  free(p->slots);
  memset(p, 0, sizeof(*p));
}

struct spot__store_slot *
spot__store_pipe_find(struct spot__store_pipe *p, unsigned state,
                      bool (*ok)(const struct spot__store_slot *s))
{
  struct spot__store_slot *best = NULL;

  for (size_t i = 0; i < p->nslots; i++) {
    struct spot__store_slot *s = &p->slots[i];

    if (s->state != state || (ok != NULL && !ok(s)))
      continue;
    if (state == 0)
      return s;
    if (best == NULL || s->seq < best->seq)
      best = s;
  }
  return best;
}

int
spot__store_pipe_work(struct spot__store_pipe *p, struct spot__store_slot *s,
                      uv_work_cb work, uv_after_work_cb after,
                      unsigned work_state)
{
  struct spot__store_coder *c = spot__store_coder_take(p->coders, p->ncoders);
  int r;

  if (c == NULL)
    return 1;
  s->coder = c;
  c->busy = true;
  r = spot__store_work(s->op, &s->work, work, after);
  if (r < 0) {
    c->busy = false;
    s->coder = NULL;
    spot__store_fail_msg(s->op, r, "queueing work: %s", strerror(-r));
    return r;
  }
  spot__store_slot_set_state(s, work_state);
  s->op->active_work++;
  return 0;
}

int
spot__store_pipe_worked(struct spot__store_slot *s, int status)
{
  s->op->active_work--;
  s->coder->busy = false;
  s->coder = NULL;
  spot__store_slot_set_state(s, 0);
  return status < 0 ? status : s->work_err;
}

void
spot__store_slot_set_state_at(struct spot__store_slot *s, unsigned state,
                              const char *file, int line)
{
  if (spot_fsm_move_detail(s->op->pipe->slot_fsm, s->state, state, file, line,
                           "name=%s file=%zu part=%zu",
                           s->op->name != NULL ? s->op->name : "?", s->file,
                           s->part) > 0)
    s->state = state;
}

void
spot__store_pipe_cancel(struct spot__store_pipe *p, unsigned work_state,
                        unsigned s3_state)
{
  for (size_t i = 0; i < p->nslots; i++) {
    struct spot__store_slot *s = &p->slots[i];

    if (s->state == work_state)
      (void)spot__store_work_cancel(s->op, &s->work);
    else if (s->state == s3_state && s->s3op != NULL)
      spot_s3_cancel(s->s3op);
  }
}
