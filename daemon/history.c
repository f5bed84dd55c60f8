/* The job history and the metrics, fed by the engine (lib/core/history.h,
 * lib/core/metrics.h, lib/io/store/history_store.h say what each event means).
 *
 * The engine calls one hist_*() function per event; each is a no-op when
 * nothing is set up (d->hist NULL) or once spotd is closing, and never
 * fails: the writer is fire-and-forget (a failed write is a warning) and
 * nothing here waits for it, so a final checkpoint is never delayed.
 *
 *   hist_open()       the S3 client exists: make the writer
 *   hist_launched()   the trainer started: RUN_START, restart count
 *   hist_restored()   RESTORE
 *   hist_requested()  a checkpoint signal (its reason, its time)
 *   hist_complete()   a complete folder (save time)
 *   hist_pushed()     CHECKPOINT (committed or not)
 *   hist_notice()     NOTICE
 *   hist_relaunched() RELAUNCH
 *   hist_exited()     the trainer exited (when, for a restart's downtime)
 *   hist_restart()    RESTART: the failed trainer starts again, with the
 *                     step it reached, the checkpoint it resumes from, the
 *                     backoff and the time it was down
 *   hist_restarted()  ... and the trainer runs again (the metric)
 *   hist_step()       the trainer's step (control socket "step"): each
 *                     report goes into a PROGRESS event, at most one per
 *                     PROGRESS_MIN_MS (a later report waits that long and
 *                     replaces an unsent one; the writer keeps one queued
 *                     at most), so the step a killed spotd's trainer
 *                     reached is in the store for the next start
 *   hist_lease()      LEASE (waiting, held, failed, released, lost)
 *   hist_refused()    why the trainer is not started: the RUN_END of a
 *                     spotd that never started it says "refused" and why
 *   hist_end()        RUN_END, the last metrics file, then the writer is
 *                     closed within HIST_CLOSE_MS; the metrics timer too.
 *
 * Ownership: struct spotd_hist is freed once both its timer and its writer
 * have closed (pending counts them). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "fanout.h"
#include "hist.h"
#include "io/store/history_store.h"
#include "core/log.h"
#include "core/metrics.h"
#include "request.h"
#include "spotd.h"
#include "trainer.h"
#include "upload.h"
#include "core/util.h"

#define HIST_CLOSE_MS 3000
#define HIST_PENDING 8 /* checkpoints between complete and pushed */

struct hist_ckpt {
  char name[SPOT_HIST_NAME_MAX + 1];
  char reason[SPOT_HIST_WORD_MAX + 1];
  double save_s;
  uint64_t complete_mono;
  int64_t capture_wall; /* when the trainer began saving this state */
  int64_t step;
};

struct spotd_hist {
  struct spotd *d;
  struct spot_history *w; /* NULL until the S3 client exists, or failed */
  struct spot_metrics *m;
  uv_timer_t timer;                 /* the metrics file */
  uv_timer_t progress_timer;        /* a PROGRESS event held back */
  unsigned pending;                 /* closes to wait for before free */
  bool started;                     /* RUN_START emitted */
  char why[SPOT_HIST_WORD_MAX + 1]; /* reason of the signalled request */
  int64_t signal_wall;
  struct hist_ckpt ck[HIST_PENDING];
  int64_t step;                /* the trainer's, -1 unknown */
  int64_t commit_capture_wall; /* state of the newest commit, 0 none */
  int64_t commit_step;
  int64_t notice_wall;                  /* 0 none */
  int64_t progress_step;                /* in the last PROGRESS event, -1 */
  uint64_t progress_mono;               /* when that was written */
  int64_t exit_wall;                    /* the trainer's last exit, 0 */
  char refused[SPOT_HIST_WORD_MAX + 1]; /* hist_refused(), "" none */
  unsigned warned;
  unsigned emitted; /* events handed to the writer */
};

static bool
live(const struct spotd *d)
{
  return d->hist != NULL && !d->closing;
}

static void
report_cb(int err, const char *key, const char *message, void *data)
{
  struct spotd_hist *h = data;

  if (err == 0 || err == -ECANCELED)
    return;
  /* A warning, never an error; one line per episode is enough. */
  if (h->warned++ < 3)
    log_warn("job history: writing %s failed: %s", key,
             message[0] ? message : strerror(-err));
}

static void
metrics_flush(struct spotd_hist *h)
{
  struct spotd *d = h->d;
  struct spot_buf b;
  int r;

  if (d->cfg->metrics_file == NULL)
    return;
  spot_buf_init(&b, 1 << 20);
  r = spotd_metrics_text(d, &b);
  if (r == 0)
    r = spot_metrics_write_file(d->cfg->metrics_file, spot_buf_str(&b));
  if (r < 0 && h->warned++ < 3)
    log_warn_errno(r, "metrics file %s", d->cfg->metrics_file);
  spot_buf_fini(&b);
}

static bool event(struct spotd *d, struct spot_hist_event *ev,
                  enum spot_hist_type t);
static void emit(struct spotd *d, struct spot_hist_event *ev);

/* At most one PROGRESS event per this long: the Python helper reports a
 * step at most every 100 ms. */
#define PROGRESS_MIN_MS 100

/* The trainer's step, when it moved since the last PROGRESS event: one
 * small PUT per report (PROGRESS_MIN_MS apart at most), nothing while it
 * stands still. */
static void
progress(struct spotd_hist *h)
{
  struct spot_hist_event ev;
  uint64_t now = spot_now_mono_ms();

  if (h->step < 0 || h->step == h->progress_step ||
      (h->progress_mono != 0 && now - h->progress_mono < PROGRESS_MIN_MS) ||
      !event(h->d, &ev, SPOT_HIST_PROGRESS))
    return;
  h->progress_step = h->step;
  h->progress_mono = now;
  emit(h->d, &ev);
}

static void
progress_timer_cb(uv_timer_t *t)
{
  struct spotd_hist *h =
      spot_container_of(t, struct spotd_hist, progress_timer);

  if (!h->d->closing)
    progress(h);
}

/* A report: written now, or once PROGRESS_MIN_MS since the last is over. */
static void
progress_soon(struct spotd_hist *h)
{
  uint64_t now = spot_now_mono_ms(), since = now - h->progress_mono;

  if (h->progress_mono == 0 || since >= PROGRESS_MIN_MS) {
    progress(h);
    return;
  }
  if (!uv_is_active((uv_handle_t *)&h->progress_timer))
    uv_timer_start(&h->progress_timer, progress_timer_cb,
                   PROGRESS_MIN_MS - since, 0);
}

static void
metrics_timer_cb(uv_timer_t *t)
{
  struct spotd_hist *h = spot_container_of(t, struct spotd_hist, timer);

  if (h->d->closing)
    return;
  metrics_flush(h);
  progress(h);
}

/* A change worth seeing: rewrite the file on the next loop iteration, not
 * now (a notice's drain starts first; the write fsyncs). */
static void
flush_soon(struct spotd_hist *h)
{
  if (h->d->cfg->metrics_file != NULL)
    uv_timer_start(&h->timer, metrics_timer_cb, 0,
                   h->d->cfg->metrics_interval_ms);
}

/* Each event carries the step: no PROGRESS needed for the same step. */
static void
stepped(struct spotd_hist *h, const struct spot_hist_event *ev)
{
  if (ev->step >= 0 && ev->step >= h->step)
    h->progress_step = ev->step;
}

void
hist_init(struct spotd *d)
{
  struct spotd_hist *h = calloc(1, sizeof(*h));
  char rank[24];

  snprintf(rank, sizeof(rank), "%lld", (long long)d->cfg->rank);
  if (h == NULL || spot_metrics_new_spotd(&h->m) < 0 ||
      spot_metrics_common_labels(
          h->m, SPOT_LABELS("job", d->cfg->job, "rank", rank)) < 0) {
    if (h != NULL)
      spot_metrics_free(h->m);
    free(h);
    log_warn("job history and metrics: out of memory; running without");
    return;
  }
  h->d = d;
  h->step = h->commit_step = h->progress_step = -1;
  uv_timer_init(d->loop, &h->timer);
  uv_timer_init(d->loop, &h->progress_timer);
  h->pending = 2;
  d->hist = h;
  /* The metrics file and the trainer's progress in the history. */
  uv_timer_start(&h->timer, metrics_timer_cb, d->cfg->metrics_interval_ms,
                 d->cfg->metrics_interval_ms);
}

void
hist_open(struct spotd *d)
{
  struct spot_history_options o;
  struct spotd_hist *h = d->hist;
  int r;

  if (!live(d) || h->w != NULL)
    return;
  memset(&o, 0, sizeof(o));
  o.replace_progress = true;
  r = spot_history_new(d->loop, &d->store, &o, report_cb, h, &h->w);
  if (r < 0) {
    h->w = NULL;
    log_warn_errno(r, "job history: not recorded");
    return;
  }
  h->pending++;
}

static bool
event(struct spotd *d, struct spot_hist_event *ev, enum spot_hist_type t)
{
  struct spotd_hist *h = d->hist;

  if (!live(d) && !(d->hist != NULL && t == SPOT_HIST_RUN_END))
    return false;
  if (h->w == NULL || spot_history_event_init(h->w, ev, t) < 0)
    return false;
  ev->step = h->step;
  return true;
}

static void
emit(struct spotd *d, struct spot_hist_event *ev)
{
  int r = spot_history_emit(d->hist->w, ev);

  d->hist->emitted++;
  stepped(d->hist, ev);
  if (r < 0)
    log_warn_errno(r, "job history: %s event dropped",
                   spot_hist_type_name(ev->type));
}

static void
run_start(struct spotd *d)
{
  struct spot_hist_event ev;
  char host[SPOT_HIST_STR_MAX + 1] = "";

  if (d->hist->started || !event(d, &ev, SPOT_HIST_RUN_START))
    return;
  d->hist->started = true;
  ev.time_ms = (int64_t)d->start_wall_ms;
  ev.step = -1;
  if (gethostname(host, sizeof(host) - 1) == 0)
    SPOT_HIST_SET(&ev, host, host);
  ev.restart_count = d->restarts.count;
  /* The ranks of one run name it alike: the history counts it once. */
  if (d->cfg->nranks > 1) {
    SPOT_HIST_SET(&ev, run, fanout_run_id(d));
    ev.rank = d->cfg->rank;
    ev.nranks = d->cfg->nranks;
  }
  emit(d, &ev);
}

void
hist_launched(struct spotd *d)
{
  if (!live(d))
    return;
  if (d->restarts.count > 0)
    spot_metrics_add(d->hist->m, SPOT_M_TRAINER_RESTARTS, NULL,
                     (double)d->restarts.count);
  run_start(d);
}

void
hist_restored(struct spotd *d, const struct spot_store_result *res)
{
  struct spot_hist_event ev;
  double secs = (double)res->elapsed_ms / 1000.0;

  if (!live(d))
    return;
  spot_metrics_set(d->hist->m, SPOT_M_RESTORE_SECONDS, NULL, secs);
  d->hist->commit_capture_wall = spot_now_wall_ms();
  if (!event(d, &ev, SPOT_HIST_RESTORE))
    return;
  SPOT_HIST_SET(&ev, checkpoint, res->name);
  ev.raw_bytes = res->raw_bytes;
  ev.stored_bytes = res->stored_bytes;
  ev.seconds = secs;
  emit(d, &ev);
}

/* The request's reason as a short, bounded word (a metrics label). */
static const char *
reason_word(const struct spotd *d, const char *why)
{
  if (strcmp(why, "interval") == 0)
    return "periodic";
  if (strcmp(why, "spotctl checkpoint") == 0)
    return "manual";
  if (strcmp(why, "sigterm") == 0)
    return "sigterm";
  if (strstr(why, "rebalance") != NULL || strstr(why, "recommend") != NULL)
    return "rebalance";
  return "notice";
}

void
hist_requested(struct spotd *d, const char *why)
{
  if (!live(d))
    return;
  spot_strlcpy(d->hist->why, reason_word(d, why), sizeof(d->hist->why));
  d->hist->signal_wall = spot_now_wall_ms();
}

/* Called before the request ends (request_completed()). */
void
hist_complete(struct spotd *d, const char *name)
{
  struct spotd_hist *h = d->hist;
  struct hist_ckpt *c;

  if (!live(d))
    return;
  c = &h->ck[0];
  for (size_t i = 0; i < HIST_PENDING; i++)
    if (h->ck[i].name[0] == '\0') {
      c = &h->ck[i];
      break;
    }
  memset(c, 0, sizeof(*c));
  spot_strlcpy(c->name, name, sizeof(c->name));
  c->complete_mono = spot_now_mono_ms();
  c->step = h->step;
  c->capture_wall = spot_now_wall_ms();
  if (request_pending(d)) {
    spot_strlcpy(c->reason, h->why, sizeof(c->reason));
    c->save_s = (double)(c->complete_mono - d->req.signal_mono) / 1000.0;
    c->capture_wall = h->signal_wall;
    spot_metrics_observe(h->m, SPOT_M_SAVE_SECONDS, NULL, c->save_s);
  } else {
    spot_strlcpy(c->reason, "trainer", sizeof(c->reason));
  }
}

static void
pushed_metrics(struct spotd_hist *h, const struct hist_ckpt *c,
               const struct spot_store_result *res, double upload_s)
{
  const char *outcome = res->err == 0            ? "committed"
                        : res->err == -ECANCELED ? "cancelled"
                                                 : "failed";

  spot_metrics_add(h->m, SPOT_M_CHECKPOINTS,
                   SPOT_LABELS("reason", c->reason, "outcome", outcome), 1);
  spot_metrics_observe(h->m, SPOT_M_UPLOAD_SECONDS, NULL, upload_s);
  if (res->err != 0)
    return;
  spot_metrics_add(h->m, SPOT_M_UPLOADED_BYTES, SPOT_LABELS("kind", "raw"),
                   (double)res->raw_bytes);
  spot_metrics_add(h->m, SPOT_M_UPLOADED_BYTES, SPOT_LABELS("kind", "stored"),
                   (double)res->stored_bytes);
  spot_metrics_set(h->m, SPOT_M_LAST_COMMIT, NULL,
                   (double)spot_now_wall_ms() / 1000.0);
}

void
hist_pushed(struct spotd *d, const char *name,
            const struct spot_store_result *res)
{
  struct spotd_hist *h = d->hist;
  struct spot_hist_event ev;
  struct hist_ckpt c = {.reason = "trainer", .step = -1};
  double upload_s = (double)res->elapsed_ms / 1000.0;

  if (!live(d))
    return;
  for (size_t i = 0; i < HIST_PENDING; i++)
    if (strcmp(h->ck[i].name, name) == 0) {
      c = h->ck[i];
      h->ck[i].name[0] = '\0';
      upload_s = (double)(spot_now_mono_ms() - c.complete_mono) / 1000.0;
      break;
    }
  pushed_metrics(h, &c, res, upload_s);
  if (res->err == 0) {
    h->commit_capture_wall = c.capture_wall;
    h->commit_step = c.step;
  }
  if (!event(d, &ev, SPOT_HIST_CHECKPOINT))
    return;
  SPOT_HIST_SET(&ev, checkpoint, name);
  SPOT_HIST_SET(&ev, reason, c.reason);
  ev.step = c.step;
  ev.save_s = c.save_s;
  ev.upload_s = upload_s;
  ev.raw_bytes = res->raw_bytes;
  ev.stored_bytes = res->stored_bytes;
  ev.committed = res->err == 0;
  emit(d, &ev);
  flush_soon(h);
}

void
hist_notice(struct spotd *d, const struct spot_notice *n)
{
  struct spot_hist_event ev;

  if (!live(d))
    return;
  spot_metrics_add(d->hist->m, SPOT_M_NOTICES, SPOT_LABELS("kind", n->reason),
                   1);
  if (d->hist->notice_wall == 0 && n->kind != SPOT_NOTICE_REBALANCE)
    d->hist->notice_wall = spot_now_wall_ms();
  if (event(d, &ev, SPOT_HIST_NOTICE)) {
    SPOT_HIST_SET(&ev, kind, n->reason);
    ev.deadline_ms = n->deadline_wall_ms != 0 ? n->deadline_wall_ms : -1;
    emit(d, &ev);
  }
  flush_soon(d->hist);
}

void
hist_meta_error(struct spotd *d)
{
  if (live(d))
    spot_metrics_add(d->hist->m, SPOT_M_META_ERRORS, NULL, 1);
}

/* "--backend NAME" of the relaunch command, else "command". */
static void
backend_of(const char *cmd, char *out, size_t size)
{
  const char *p = cmd != NULL ? strstr(cmd, "--backend") : NULL;
  size_t n = 0;

  spot_strlcpy(out, "command", size);
  if (p == NULL)
    return;
  p += strlen("--backend");
  while (*p == ' ' || *p == '=')
    p++;
  while (p[n] != '\0' && p[n] != ' ' && p[n] != '\n' && n + 1 < size)
    n++;
  if (n > 0) {
    memcpy(out, p, n);
    out[n] = '\0';
  }
}

void
hist_relaunched(struct spotd *d, bool ok)
{
  struct spot_hist_event ev;
  char backend[SPOT_HIST_WORD_MAX + 1];

  if (!live(d))
    return;
  spot_metrics_add(d->hist->m, SPOT_M_RELAUNCHES,
                   SPOT_LABELS("outcome", ok ? "ok" : "failed"), 1);
  if (!event(d, &ev, SPOT_HIST_RELAUNCH))
    return;
  backend_of(d->cfg->relaunch, backend, sizeof(backend));
  SPOT_HIST_SET(&ev, backend, backend);
  SPOT_HIST_SET(&ev, result, ok ? "ok" : "failed");
  SPOT_HIST_SET(&ev, reason, d->eng.reason);
  emit(d, &ev);
}

void
hist_exited(struct spotd *d)
{
  if (live(d))
    d->hist->exit_wall = spot_now_wall_ms();
}

void
hist_restart(struct spotd *d)
{
  struct spot_hist_event ev;
  int64_t exited = d->hist != NULL ? d->hist->exit_wall : 0;

  if (!event(d, &ev, SPOT_HIST_RESTART))
    return;
  ev.restart_count = d->crash.used;
  ev.exit_code = d->crash.last_signal ? -1 : d->crash.last_status;
  ev.exit_signal = d->crash.last_signal;
  ev.seconds = (double)d->crash.wait_ms / 1000.0;
  if (exited > 0 && ev.time_ms > exited)
    ev.down_s = (double)(ev.time_ms - exited) / 1000.0;
  SPOT_HIST_SET(&ev, checkpoint, d->last_commit);
  emit(d, &ev);
  flush_soon(d->hist);
}

void
hist_restarted(struct spotd *d)
{
  if (live(d)) {
    spot_metrics_add(d->hist->m, SPOT_M_TRAINER_RESTARTS, NULL, 1);
    flush_soon(d->hist);
  }
}

void
hist_lease(struct spotd *d, const char *action, int64_t epoch)
{
  struct spot_hist_event ev;

  if (!event(d, &ev, SPOT_HIST_LEASE))
    return;
  SPOT_HIST_SET(&ev, action, action);
  ev.epoch = epoch;
  emit(d, &ev);
}

void
hist_step(struct spotd *d, int64_t step)
{
  if (!live(d))
    return;
  d->hist->step = step;
  progress_soon(d->hist);
}

void
hist_refused(struct spotd *d, const char *why)
{
  if (d->hist != NULL && d->hist->refused[0] == '\0')
    spot_strlcpy(d->hist->refused, why, sizeof(d->hist->refused));
}

int
spotd_metrics_text(struct spotd *d, struct spot_buf *out)
{
  struct spotd_hist *h = d->hist;
  int64_t since;

  if (h == NULL)
    return -ENOMEM;
  since = d->last_commit[0] ? d->last_commit_wall : (int64_t)d->start_wall_ms;
  if (d->trainer_started)
    spot_metrics_set(h->m, SPOT_M_WORK_AT_RISK, NULL,
                     (double)(spot_now_wall_ms() - since) / 1000.0);
  return spot_metrics_render(h->m, out);
}

/* ---------------------------------------------------------------- end */

static void
maybe_free(struct spotd_hist *h)
{
  if (--h->pending > 0)
    return;
  spot_metrics_free(h->m);
  free(h);
}

static void
writer_closed_cb(void *data)
{
  maybe_free(data);
}

static void
timer_closed_cb(uv_handle_t *t)
{
  maybe_free(spot_container_of((uv_timer_t *)t, struct spotd_hist, timer));
}

static void
progress_closed_cb(uv_handle_t *t)
{
  maybe_free(
      spot_container_of((uv_timer_t *)t, struct spotd_hist, progress_timer));
}

static const char *
outcome(const struct spotd *d)
{
  /* Never started: a refusal (lease, restore, command), whatever the exit
   * status says; a notice or a signal before the start stays what it
   * is. */
  if (!d->trainer_started && !d->eng.have_notice && !d->eng.drain_sigterm)
    return d->eng.signals_seen > 0 ? "stopped" : "refused";
  if (d->eng.have_notice && !d->eng.drain_sigterm)
    return "preempted";
  /* SIGTERM with a termination grace: the node is going away. */
  if (d->eng.drain_sigterm)
    return d->eng.sigterm_reclaim ? "preempted" : "stopped";
  /* The trainer ended by itself: with an error (or a signal) it crashed,
   * whatever spotd did next; a success is "exited". */
  if (d->eng.ended_in == SPOTD_FINISHING)
    return d->crash.exhausted || d->trainer.exit_status != 0 ||
                   d->trainer.term_signal != 0
               ? "crashed"
               : "exited";
  return "crashed";
}

static void
run_end(struct spotd *d)
{
  struct spotd_hist *h = d->hist;
  struct spot_hist_event ev;
  bool final = d->final.state == FINAL_COMMITTED;
  const char *o = outcome(d);

  if (!event(d, &ev, SPOT_HIST_RUN_END))
    return;
  SPOT_HIST_SET(&ev, outcome, o);
  ev.committed = final;
  if (strcmp(o, "refused") == 0)
    SPOT_HIST_SET(&ev, reason, h->refused[0] ? h->refused : "error");
  if (d->crash.exhausted)
    SPOT_HIST_SET(&ev, reason, "restarts-used");
  if (strcmp(o, "preempted") == 0 || strcmp(o, "crashed") == 0) {
    int64_t end = h->notice_wall ? h->notice_wall : spot_now_wall_ms();
    int64_t from = h->commit_capture_wall ? h->commit_capture_wall
                                          : (int64_t)d->start_wall_ms;
    ev.lost_s = final ? 0 : (double)(end > from ? end - from : 0) / 1000.0;
  }
  if (d->trainer_started && !trainer_running(d)) {
    ev.exit_code = d->trainer.exit_status;
    ev.exit_signal = d->trainer.term_signal;
  }
  emit(d, &ev);
}

/* The engine's HIST_END, as it enters EXITING (from eng.ended_in). */
void
hist_end(struct spotd *d)
{
  struct spotd_hist *h = d->hist;

  if (h == NULL || d->closing)
    return;
  /* A run is a trainer started, or a startup that saw something (a
   * restore, a notice); a spotd that failed at its store check is none. */
  if (d->trainer_started || h->emitted > 0) {
    run_start(d); /* when launched before the writer existed */
    run_end(d);
  }
  metrics_flush(h);
  d->hist = NULL;
  uv_close((uv_handle_t *)&h->timer, timer_closed_cb);
  uv_close((uv_handle_t *)&h->progress_timer, progress_closed_cb);
  if (h->w != NULL &&
      spot_history_close(h->w, HIST_CLOSE_MS, writer_closed_cb, h) < 0)
    maybe_free(h);
}
