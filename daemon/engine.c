/* The engine: what spotd does, as one state machine.
 *
 *   CONNECTING   credentials (env, profile, IMDS role) and the metadata
 *                provider; then
 *   RESTORING    the newest committed checkpoint into SPOTD_CKPT_DIR/NAME
 *   RUNNING      the trainer runs; periodic and requested checkpoints are
 *                signalled, complete folders are pushed one at a time in
 *                the background (the newest waiting one supersedes older
 *                waiting ones)
 *   DRAINING     a notice (or SIGTERM): checkpoint at once, push it before
 *                the deadline, or give up at the deadline and keep the last
 *                committed checkpoint
 *   RELAUNCHING  ack the notice (Azure), run the relaunch step
 *   STOPPING     SIGTERM to the trainer, SIGKILL after a grace period that
 *                ends before the deadline
 *   FINISHING    the trainer is gone: finish the pending upload
 *   EXITING      close every handle
 *
 * Only spotd_set_state() changes the state; it logs the transition and
 * tells systemd (STATUS=). advance() moves on when the state's work is
 * done. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "manifest.h"
#include "spot-config.h"
#include "spotd.h"
#include "util.h"

/* Exit status after a handled preemption (EX_TEMPFAIL): "resume later". */
#define SPOTD_EXIT_PREEMPTED 75
/* Margin kept before a deadline for stopping the trainer. */
#define DEADLINE_MARGIN_MS 1000
/* spotd's own SIGTERM: time allowed for the final checkpoint and upload
 * (systemd/spotd.service has TimeoutStopSec= above it). */
#define SIGTERM_DRAIN_MS 90000
#define RELAUNCH_TIMEOUT_MS 60000

static void advance(struct spotd *d);
static void start_upload(struct spotd *d, const char *name);

static const char *const state_names[] = {
    "init",        "connecting", "restoring", "running", "draining",
    "relaunching", "stopping",   "finishing", "exiting",
};

const char *
spotd_state_name(enum spotd_state s)
{
  return (unsigned)s < SPOTD_STATE_LAST ? state_names[s] : "?";
}

void
spotd_set_state(struct spotd *d, enum spotd_state s)
{
  if (d->state == s)
    return;
  log_info("state %s -> %s", spotd_state_name(d->state), spotd_state_name(s));
  d->state = s;
  spotd_notify(d, "STATUS=%s", spotd_state_name(s));
}

void
spotd_warn(struct spotd *d, const char *fmt, ...)
{
  char line[256];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  log_warn("%s", line);
  if (d->nwarnings == SPOT_PROTO_MAX_WARNINGS) {
    memmove(d->warnings[0], d->warnings[1],
            sizeof(d->warnings[0]) * (SPOT_PROTO_MAX_WARNINGS - 1));
    d->nwarnings--;
  }
  spot_strlcpy(d->warnings[d->nwarnings++], line, sizeof(d->warnings[0]));
}

/* -------------------------------------------------------- checkpoints */

static void give_up_final(struct spotd *d, const char *why);

static void
ckpt_timer_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, ckpt_timer);

  if (!d->ckpt_requested)
    return;
  d->ckpt_requested = false;
  spotd_warn(d,
             "the trainer did not complete a checkpoint within %.0f s of "
             "the signal",
             (double)d->cfg->ckpt_timeout_ms / 1000.0);
  /* Draining without a deadline (SIGTERM) waited on this very request:
   * without giving up here it would wait forever. */
  if (d->state == SPOTD_DRAINING && d->final_name[0] == '\0')
    give_up_final(d, "no final checkpoint");
  advance(d);
}

void
spotd_request_checkpoint(struct spotd *d, const char *why)
{
  char sig[16];
  int r;

  if (!d->trainer.running)
    return;
  if (d->ckpt_requested) {
    log_info("checkpoint requested (%s): one is already in progress", why);
    return;
  }
  r = trainer_signal(&d->trainer, d->cfg->signal,
                     d->cfg->signal_target == SPOT_CONFIG_TARGET_GROUP);
  if (r < 0) {
    spotd_warn(d, "cannot signal the trainer: %s", uv_strerror(r));
    return;
  }
  d->ckpt_requested = true;
  d->ckpt_signal_mono = spot_now_mono_ms();
  log_info("checkpoint requested (%s): SIG%s sent to trainer pid=%d (%s)", why,
           spot_config_signal_name(d->cfg->signal, sig, sizeof(sig)),
           (int)d->trainer.pid,
           spot_config_signal_target_name(d->cfg->signal_target));
  if (d->cfg->ckpt_timeout_ms > 0)
    uv_timer_start(&d->ckpt_timer, ckpt_timer_cb, d->cfg->ckpt_timeout_ms, 0);
}

static void
interval_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, interval_timer);

  if (d->state == SPOTD_RUNNING)
    spotd_request_checkpoint(d, "interval");
}

/* Local copies older than the newest commit are not needed any more. */
static void
prune_local(struct spotd *d, const char *keep)
{
  for (size_t i = 0; i < d->nknown; i++) {
    const char *n = d->known[i];
    char path[4300];

    if (strcmp(n, keep) == 0 || strcmp(n, d->waiting) == 0 ||
        (d->upload != NULL && strcmp(n, d->upload_name) == 0))
      continue;
    snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, n);
    if (access(path, F_OK) == 0) {
      log_info("removing local checkpoint %s (committed %s is newer)", n, keep);
      spot_rm_tree(path);
    }
  }
}

static void
upload_progress_cb(const struct spot_store_progress *p, void *data)
{
  struct spotd *d = data;
  double secs = (double)p->elapsed_ms / 1000.0;

  d->upload_done_bytes = p->raw_done;
  d->upload_total_bytes = p->raw_total;
  d->upload_rate = secs > 0 ? (double)p->raw_done / secs : 0;
  /* One progress line every 2 s for long uploads. */
  if (p->phase == SPOT_STORE_PHASE_TRANSFER && p->raw_total > 0 &&
      p->elapsed_ms >= d->upload_log_ms + 2000) {
    char done[32], total[32];

    d->upload_log_ms = p->elapsed_ms;
    log_info("uploading %s: %s / %s (%.0f%%) at %.0f MB/s, ratio %.2f", p->name,
             spot_fmt_bytes(p->raw_done, done, sizeof(done)),
             spot_fmt_bytes(p->raw_total, total, sizeof(total)),
             100.0 * (double)p->raw_done / (double)p->raw_total,
             d->upload_rate / 1e6,
             p->stored_done > 0 ? (double)p->raw_done / (double)p->stored_done
                                : 1.0);
  }
}

static void
push_done_cb(const struct spot_store_result *res, void *data)
{
  struct spotd *d = data;
  char name[256];

  d->upload = NULL;
  spot_strlcpy(name, d->upload_name, sizeof(name));
  d->upload_name[0] = '\0';
  if (res->err == 0) {
    double secs = (double)res->elapsed_ms / 1000.0;

    log_info("committed checkpoint name=%s files=%" PRIu64 " raw=%" PRIu64
             " stored=%" PRIu64 " ratio=%.2f in %.1f s (%u retries)",
             name, res->files, res->raw_bytes, res->stored_bytes,
             res->stored_bytes > 0
                 ? (double)res->raw_bytes / (double)res->stored_bytes
                 : 1.0,
             secs, res->retries);
    if (res->warning != NULL && res->warning[0] != '\0')
      spotd_warn(d, "%s", res->warning);
    spot_strlcpy(d->last_commit, name, sizeof(d->last_commit));
    d->last_commit_wall = spot_now_wall_ms();
    if (secs > 0 && res->raw_bytes > 0) {
      d->last_upload_bps = (double)res->raw_bytes / secs;
      d->last_upload_raw = res->raw_bytes;
    }
    if (d->final_pending && strcmp(name, d->final_name) == 0)
      d->final_committed = true;
    spotd_notify(d, "STATUS=committed %s", name);
    prune_local(d, name);
    control_commit_event(d, name, 0, "");
  } else if (res->err == -ECANCELED) {
    log_info("upload of %s cancelled", name);
    control_commit_event(d, name, res->err, "cancelled");
  } else {
    spotd_warn(d, "upload of checkpoint %s failed: %s", name, res->message);
    control_commit_event(d, name, res->err, res->message);
    if (d->final_pending && strcmp(name, d->final_name) == 0)
      d->final_pending = false; /* give up: the last commit stays */
  }
  if (d->waiting[0] != '\0' && !d->closing) {
    char next[256];

    spot_strlcpy(next, d->waiting, sizeof(next));
    d->waiting[0] = '\0';
    start_upload(d, next);
  }
  advance(d);
}

static void
start_upload(struct spotd *d, const char *name)
{
  char dir[4300];
  int r;

  snprintf(dir, sizeof(dir), "%s/%s", d->ckpt_dir, name);
  spot_strlcpy(d->upload_name, name, sizeof(d->upload_name));
  d->upload_done_bytes = d->upload_total_bytes = 0;
  d->upload_rate = 0;
  d->upload_log_ms = 0;
  /* This spotd is the job's only writer: uploads begun before it started
   * belong to a dead predecessor and are aborted by the retention step. */
  d->store.stale_upload_age_ms =
      (uint64_t)(spot_now_wall_ms() - d->start_wall_ms) + 1000;
  log_info("uploading checkpoint %s", name);
  r = spot_store_push(d->loop, &d->store, dir, name, upload_progress_cb,
                      push_done_cb, d, &d->upload);
  if (r < 0) {
    d->upload = NULL;
    d->upload_name[0] = '\0';
    spotd_warn(d, "cannot upload checkpoint %s: %s", name, strerror(-r));
    if (d->final_pending && strcmp(name, d->final_name) == 0)
      d->final_pending = false;
  }
}

int
spotd_checkpoint_complete(struct spotd *d, const char *name)
{
  char path[4300];
  struct stat st;

  if (!spot_ckpt_name_valid(name) || name[0] == '.')
    return -EINVAL;
  if (watch_is_known(d, name))
    return -EALREADY;
  snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, name);
  if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
    return -ENOENT;
  watch_mark_known(d, name);
  if (d->ckpt_requested) {
    d->last_save_ms = spot_now_mono_ms() - d->ckpt_signal_mono;
    d->ckpt_requested = false;
    uv_timer_stop(&d->ckpt_timer);
  }
  log_info("checkpoint %s is complete%s", name,
           d->state == SPOTD_DRAINING ? " (final)" : "");
  if (d->state == SPOTD_DRAINING || d->state == SPOTD_FINISHING ||
      d->state == SPOTD_STOPPING) {
    /* The final checkpoint goes first: an older upload is cancelled. */
    if (d->state == SPOTD_DRAINING) {
      d->final_pending = true;
      spot_strlcpy(d->final_name, name, sizeof(d->final_name));
    }
    if (d->upload != NULL && strcmp(d->upload_name, name) != 0 &&
        d->state == SPOTD_DRAINING) {
      log_info("cancelling the upload of %s for the final checkpoint %s",
               d->upload_name, name);
      spot_strlcpy(d->waiting, name, sizeof(d->waiting));
      spot_store_cancel(d->upload);
      return 0;
    }
  }
  if (d->upload != NULL) {
    if (d->waiting[0] != '\0')
      log_info("checkpoint %s supersedes %s, which waited for upload", name,
               d->waiting);
    spot_strlcpy(d->waiting, name, sizeof(d->waiting));
  } else {
    start_upload(d, name);
  }
  advance(d);
  return 0;
}

/* ------------------------------------------------------------ notices */

static uint64_t
ms_left(const struct spotd *d)
{
  uint64_t now = spot_now_mono_ms();

  if (d->deadline_mono == 0)
    return UINT64_MAX;
  return d->deadline_mono > now ? d->deadline_mono - now : 0;
}

static void
give_up_final(struct spotd *d, const char *why)
{
  if (!d->final_pending || d->final_committed)
    return;
  spotd_warn(d, "%s: the last committed checkpoint (%s) is kept", why,
             d->last_commit[0] ? d->last_commit : "none");
  d->final_pending = false;
  d->waiting[0] = '\0';
  if (d->upload != NULL)
    spot_store_cancel(d->upload);
}

static void
drain_timer_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, relaunch_timer);

  if (d->state != SPOTD_DRAINING)
    return;
  if (d->ckpt_requested) {
    d->ckpt_requested = false;
    spotd_warn(d, "the trainer did not checkpoint before the deadline");
  }
  d->final_pending = true; /* so give_up reports it */
  give_up_final(d, "the final upload could not finish before the deadline");
  advance(d);
}

static void
start_drain(struct spotd *d, const char *reason, uint64_t deadline_mono,
            int64_t deadline_wall)
{
  uint64_t left;

  spot_strlcpy(d->reason, reason, sizeof(d->reason));
  d->deadline_mono = deadline_mono;
  d->deadline_wall = deadline_wall;
  uv_timer_stop(&d->interval_timer);
  spotd_set_state(d, SPOTD_DRAINING);
  left = ms_left(d);
  if (d->trainer.running) {
    d->final_pending = true;
    d->final_name[0] = '\0';
    /* A checkpoint signalled moments ago counts as the final one. */
    if (!d->ckpt_requested)
      spotd_request_checkpoint(d, reason);
    /* Deadline-aware: say early when it cannot fit. */
    if (d->last_upload_bps > 0 && left != UINT64_MAX) {
      double est = (double)d->last_save_ms +
                   (double)d->last_upload_raw / d->last_upload_bps * 1000.0;
      if (est > (double)left)
        spotd_warn(d,
                   "the final checkpoint needs about %.1f s but the "
                   "deadline is in %.1f s: it may not be committed, and "
                   "then the last committed checkpoint (%s) is kept",
                   est / 1000.0, (double)left / 1000.0,
                   d->last_commit[0] ? d->last_commit : "none");
    }
  } else {
    d->final_pending = false;
  }
  if (left != UINT64_MAX) {
    uint64_t at =
        left > DEADLINE_MARGIN_MS * 2 ? left - DEADLINE_MARGIN_MS * 2 : 0;
    uv_timer_start(&d->relaunch_timer, drain_timer_cb, at, 0);
  }
  advance(d);
}

static void
notice_cb(struct spot_meta *m, const struct spot_notice *n, void *data)
{
  struct spotd *d = data;
  char when[32] = "none";

  (void)m;
  if (n->deadline_wall_ms != 0)
    spot_rfc3339_format(n->deadline_wall_ms, when, sizeof(when));
  log_notice("interruption notice: %s (%s) deadline %s id=%s", n->reason,
             spot_notice_kind_name(n->kind), when, n->id);
  if (n->kind == SPOT_NOTICE_REBALANCE) {
    /* Advisory: checkpoint early, keep training. */
    if (d->state == SPOTD_RUNNING)
      spotd_request_checkpoint(d, n->reason);
    return;
  }
  if (d->state == SPOTD_DRAINING && d->have_notice)
    return; /* already acting on one */
  d->have_notice = true;
  d->notice = *n;
  if (d->state == SPOTD_RUNNING || d->state == SPOTD_DRAINING)
    start_drain(d, n->reason, n->deadline_mono_ms, n->deadline_wall_ms);
  else if (d->state == SPOTD_CONNECTING || d->state == SPOTD_RESTORING)
    log_warn("notice before the trainer started: it will not be started");
}

static void
meta_status_cb(struct spot_meta *m, void *data)
{
  struct spotd *d = data;
  const char *w = spot_meta_warning(m);

  if (w != NULL)
    log_warn("metadata: %s", w);
  (void)d;
}

/* ----------------------------------------------------------- relaunch */

static void
relaunch_close_cb(uv_handle_t *h)
{
  (void)h;
}

static void
record_relaunch(struct spotd *d, int status, bool ok)
{
  struct relaunch_attempt *a;

  if (d->nrelaunch == SPOT_PROTO_MAX_RELAUNCH) {
    memmove(d->relaunches, d->relaunches + 1,
            sizeof(d->relaunches[0]) * (SPOT_PROTO_MAX_RELAUNCH - 1));
    d->nrelaunch--;
  }
  a = &d->relaunches[d->nrelaunch++];
  a->wall_ms = spot_now_wall_ms();
  spot_strlcpy(a->reason, d->reason, sizeof(a->reason));
  a->exit_status = status;
  a->ok = ok;
}

static void
relaunch_exit_cb(uv_process_t *p, int64_t status, int term_signal)
{
  struct spotd *d = spot_container_of(p, struct spotd, relaunch_proc);
  int st = term_signal ? 128 + term_signal : (int)status;

  d->relaunch_running = false;
  uv_timer_stop(&d->relaunch_timer);
  uv_close((uv_handle_t *)p, relaunch_close_cb);
  record_relaunch(d, st, st == 0);
  if (st == 0)
    log_info("relaunch step succeeded");
  else
    spotd_warn(d,
               "relaunch step failed with status %d (the checkpoint "
               "stays committed)",
               st);
  spotd_set_state(d, SPOTD_STOPPING);
  advance(d);
}

static void
relaunch_timeout_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, relaunch_timer);

  if (d->relaunch_running) {
    spotd_warn(d, "relaunch step timed out: killing it");
    uv_process_kill(&d->relaunch_proc, SIGKILL);
  }
}

static int
run_relaunch(struct spotd *d)
{
  uv_process_options_t o;
  uv_stdio_container_t stdio[3];
  char **argv = NULL, **env = NULL;
  char err[256], deadline[32] = "";
  const char *ckpt = d->final_committed ? d->final_name : d->last_commit;
  size_t n = 0, cap;
  int argc, r;
  uint64_t timeout = RELAUNCH_TIMEOUT_MS;

  r = spot_config_split_args(d->cfg->relaunch, &argv, &argc, err, sizeof(err));
  if (r < 0) {
    spotd_warn(d, "relaunch: %s", err);
    return r;
  }
  for (char **e = environ; *e != NULL; e++)
    n++;
  cap = n + 8;
  env = calloc(cap, sizeof(char *));
  if (env == NULL) {
    spot_config_free_args(argv);
    return -ENOMEM;
  }
  n = 0;
  for (char **e = environ; *e != NULL; e++)
    if (strncmp(*e, "SPOTD_", 6) != 0 && strncmp(*e, "NOTIFY_SOCKET=", 14) != 0)
      env[n++] = strdup(*e);
  if (d->deadline_wall != 0)
    spot_rfc3339_format(d->deadline_wall, deadline, sizeof(deadline));
  if (asprintf(&env[n++], "SPOTD_JOB=%s", d->cfg->job) < 0 ||
      asprintf(&env[n++], "SPOTD_STORE=%s", d->store_url) < 0 ||
      asprintf(&env[n++], "SPOTD_CHECKPOINT=%s", ckpt) < 0 ||
      asprintf(&env[n++], "SPOTD_REASON=%s", d->reason) < 0 ||
      asprintf(&env[n++], "SPOTD_DEADLINE=%s", deadline) < 0)
    r = -ENOMEM;
  memset(&o, 0, sizeof(o));
  for (int i = 0; i < 3; i++) {
    stdio[i].flags = UV_INHERIT_FD;
    stdio[i].data.fd = i;
  }
  o.file = argv[0];
  o.args = argv;
  o.env = env;
  o.exit_cb = relaunch_exit_cb;
  o.stdio = stdio;
  o.stdio_count = 3;
  if (r == 0) {
    log_info("relaunch: running '%s' (checkpoint %s, reason %s)",
             d->cfg->relaunch, ckpt[0] ? ckpt : "none", d->reason);
    r = uv_spawn(d->loop, &d->relaunch_proc, &o);
    if (r < 0) {
      uv_close((uv_handle_t *)&d->relaunch_proc, relaunch_close_cb);
      spotd_warn(d, "relaunch: cannot run '%s': %s", argv[0], uv_strerror(r));
    } else {
      d->relaunch_running = true;
      if (ms_left(d) < timeout)
        timeout = ms_left(d) > DEADLINE_MARGIN_MS
                      ? ms_left(d) - DEADLINE_MARGIN_MS
                      : DEADLINE_MARGIN_MS;
      uv_timer_start(&d->relaunch_timer, relaunch_timeout_cb, timeout, 0);
    }
  }
  for (size_t i = 0; i < n; i++)
    free(env[i]);
  free(env);
  spot_config_free_args(argv);
  return r;
}

static void
ack_cb(int status, void *data)
{
  struct spotd *d = data;

  if (status < 0 && status != UV_ECANCELED)
    spotd_warn(d, "acknowledging the scheduled event failed: %s",
               strerror(-status));
  else if (status == 0)
    log_info("acknowledged scheduled event %s", d->notice.id);
}

/* ------------------------------------------------------------ advance */

static bool
upload_idle(const struct spotd *d)
{
  return d->upload == NULL && d->waiting[0] == '\0';
}

static void
advance(struct spotd *d)
{
  uint64_t grace;

  switch (d->state) {
  case SPOTD_DRAINING:
    /* Waiting for the final checkpoint and its commit. */
    if (d->final_pending && !d->final_committed &&
        (d->trainer.running || !upload_idle(d) || d->ckpt_requested))
      return;
    if (d->final_pending && !d->final_committed && d->final_name[0] == '\0')
      give_up_final(d, "the trainer exited without a final checkpoint");
    if (!upload_idle(d) && !d->final_committed)
      return; /* an older upload is still finishing */
    uv_timer_stop(&d->relaunch_timer);
    if (d->have_notice && d->notice.provider == SPOT_PROVIDER_AZURE &&
        d->meta != NULL && d->notice.id[0] != '\0')
      spot_meta_ack(d->meta, d->notice.id, ack_cb, d);
    if (d->cfg->relaunch != NULL && !d->drain_sigterm) {
      spotd_set_state(d, SPOTD_RELAUNCHING);
      if (run_relaunch(d) == 0)
        return;
      record_relaunch(d, -1, false);
    }
    spotd_set_state(d, SPOTD_STOPPING);
    SPOT_FALLTHROUGH;
  case SPOTD_STOPPING:
    if (d->trainer.running) {
      grace = d->cfg->grace_ms;
      if (ms_left(d) != UINT64_MAX) {
        uint64_t left = ms_left(d);
        left = left > DEADLINE_MARGIN_MS ? left - DEADLINE_MARGIN_MS : 0;
        if (left < grace)
          grace = left;
      }
      trainer_stop(&d->trainer, grace);
      return;
    }
    if (!upload_idle(d))
      return;
    if (d->exit_code < 0)
      d->exit_code = d->drain_sigterm ? (d->signals_seen ? 128 + SIGTERM : 1)
                                      : SPOTD_EXIT_PREEMPTED;
    if (d->drain_sigterm && d->final_committed)
      d->exit_code = 0;
    spotd_close(d);
    return;
  case SPOTD_FINISHING:
    if (!upload_idle(d))
      return;
    spotd_close(d);
    return;
  default:
    return;
  }
}

void
spotd_trainer_exited(struct spotd *d)
{
  struct trainer *t = &d->trainer;

  if (d->exit_code < 0 && d->state == SPOTD_RUNNING)
    d->exit_code = t->term_signal ? 128 + t->term_signal : (int)t->exit_status;
  uv_timer_stop(&d->interval_timer);
  uv_timer_stop(&d->ckpt_timer);
  d->ckpt_requested = false;
  /* A checkpoint completed just before the exit may not have been seen. */
  watch_scan(d);
  switch (d->state) {
  case SPOTD_RUNNING:
    if (d->exit_code != 0)
      spotd_warn(d, "the trainer failed (status %d): not relaunching",
                 d->exit_code);
    spotd_set_state(d, SPOTD_FINISHING);
    break;
  default:
    break;
  }
  advance(d);
}

void
spotd_on_signal(struct spotd *d, int signum)
{
  d->signals_seen++;
  if (d->signals_seen > 1 || d->state < SPOTD_RUNNING) {
    log_warn("signal %d: stopping now", signum);
    d->exit_code = 128 + signum;
    if (d->upload != NULL)
      spot_store_cancel(d->upload);
    d->waiting[0] = '\0';
    spotd_close(d);
    return;
  }
  /* Already acting on a notice: the signal is the same end arriving by
   * another road (Slurm SIGTERMs the job as soon as the requeue is
   * accepted). Finish that; keep its relaunch and its exit status. */
  if (d->have_notice && !d->drain_sigterm &&
      (d->state == SPOTD_DRAINING || d->state == SPOTD_RELAUNCHING ||
       d->state == SPOTD_STOPPING)) {
    log_notice("signal %d: already stopping for the %s notice, finishing "
               "that (again to stop now)",
               signum, d->reason);
    return;
  }
  log_notice("signal %d: final checkpoint, then stop (again to stop now)",
             signum);
  d->drain_sigterm = true;
  if (d->state == SPOTD_RUNNING)
    start_drain(d, "sigterm", spot_now_mono_ms() + SIGTERM_DRAIN_MS,
                spot_now_wall_ms() + SIGTERM_DRAIN_MS);
}

/* ------------------------------------------------------------- start */

static void
launch(struct spotd *d)
{
  int r;

  if (d->have_notice) {
    /* The machine is going away: starting the trainer would only cost
     * the time left. Relaunch elsewhere and leave. */
    log_warn("notice %s before the trainer started: not starting it",
             d->notice.reason);
    spot_strlcpy(d->reason, d->notice.reason, sizeof(d->reason));
    d->deadline_mono = d->notice.deadline_mono_ms;
    d->deadline_wall = d->notice.deadline_wall_ms;
    d->final_pending = false;
    spotd_set_state(d, SPOTD_DRAINING);
    advance(d);
    return;
  }
  r = trainer_start(&d->trainer, d);
  if (r < 0) {
    d->exit_code = 127;
    spotd_close(d);
    return;
  }
  r = watch_start(d);
  if (r < 0)
    spotd_warn(d,
               "cannot watch %s: checkpoints are only seen through "
               "`spotctl done`",
               d->ckpt_dir);
  if (d->cfg->interval_ms > 0)
    uv_timer_start(&d->interval_timer, interval_cb, d->cfg->interval_ms,
                   d->cfg->interval_ms);
  spotd_set_state(d, SPOTD_RUNNING);
  spotd_notify(d, "READY=1\nSTATUS=running, trainer pid %d",
               (int)d->trainer.pid);
}

static void
restart_count_put_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;

  if (res->err < 0)
    spotd_warn(d, "cannot record the restart count in the store");
}

static char *
root_key(struct spotd *d, const char *rel)
{
  struct spot_buf b;

  spot_buf_init(&b, 2048);
  if (spot_store_key(&d->store, NULL, rel, &b) < 0) {
    spot_buf_fini(&b);
    return NULL;
  }
  return spot_buf_steal(&b);
}

static void
restart_count_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  char *key, *buf = d->restart_buf;
  int64_t n = 0;

  if (res->err == 0) {
    /* The object is written as "N\n": strip the line end before parsing. */
    char num[32];
    size_t len = spot_strlcpy(num, spot_buf_str(&d->restart_body), sizeof(num));

    if (len >= sizeof(num))
      len = sizeof(num) - 1;
    while (len > 0 && (num[len - 1] == '\n' || num[len - 1] == '\r' ||
                       num[len - 1] == ' '))
      num[--len] = '\0';
    if (spot_parse_int64(num, 0, INT32_MAX, &n) < 0) {
      spotd_warn(d, "the store's RESTARTS is not a count: starting at 1");
      n = 0;
    }
  }
  spot_buf_fini(&d->restart_body);
  d->restart_count = n + 1;
  snprintf(buf, sizeof(d->restart_buf), "%lld\n", (long long)d->restart_count);
  key = root_key(d, "RESTARTS");
  if (key != NULL && spot_s3_put(d->s3, d->store.bucket, key, buf, strlen(buf),
                                 0, restart_count_put_cb, d, NULL) < 0)
    spotd_warn(d, "cannot record the restart count in the store");
  free(key);
  if (!d->closing)
    launch(d);
}

static void
restore_done_cb(const struct spot_store_result *res, void *data)
{
  struct spotd *d = data;
  char tmp[4300], dst[4300];
  char *key;

  d->upload = NULL;
  if (res->err == -ENOENT && strstr(res->message, "LATEST") != NULL) {
    log_info("no committed checkpoint for job %s: starting fresh", d->cfg->job);
    launch(d);
    return;
  }
  if (res->err < 0) {
    log_err("restore failed: %s", res->message);
    d->exit_code = 1;
    spotd_close(d);
    return;
  }
  snprintf(tmp, sizeof(tmp), "%s/.spotd-resume", d->ckpt_dir);
  snprintf(dst, sizeof(dst), "%s/%s", d->ckpt_dir, res->name);
  if (access(dst, F_OK) == 0)
    spot_rm_tree(dst);
  if (rename(tmp, dst) < 0) {
    log_err("restore: moving %s to %s: %s", tmp, dst, strerror(errno));
    d->exit_code = 1;
    spotd_close(d);
    return;
  }
  log_info("restored checkpoint %s into %s (%" PRIu64 " bytes in %.1f s)",
           res->name, dst, res->raw_bytes, (double)res->elapsed_ms / 1000.0);
  if (d->store.nranks > 1) {
    /* Multi-node: every node restores the whole checkpoint (simple; the
     * other ranks' files are there too) and its trainer resumes from its
     * own rank's folder. */
    char mine[4400];

    snprintf(mine, sizeof(mine), "%s/rank-%u", dst, d->store.rank);
    if (strlen(mine) < sizeof(d->resume_dir) && access(mine, F_OK) == 0)
      spot_strlcpy(d->resume_dir, mine, sizeof(d->resume_dir));
    else
      log_warn("checkpoint %s holds no files of rank %u: no "
               "SPOTD_RESUME_DIR",
               res->name, d->store.rank);
  } else {
    spot_strlcpy(d->resume_dir, dst, sizeof(d->resume_dir));
  }
  spot_strlcpy(d->last_commit, res->name, sizeof(d->last_commit));
  d->last_commit_wall = spot_now_wall_ms();
  watch_mark_known(d, res->name);
  /* SPOTD_RESTART_COUNT: relaunches of this job, kept in the store. */
  key = root_key(d, "RESTARTS");
  spot_buf_init(&d->restart_body, 64);
  if (key == NULL ||
      spot_s3_get(d->s3, d->store.bucket, key, 0, 0, NULL, &d->restart_body,
                  restart_count_cb, d, NULL) < 0) {
    spot_buf_fini(&d->restart_body);
    d->restart_count = 1;
    launch(d);
  }
  free(key);
}

static void begin_restore(struct spotd *d);

static void
resume_done_cb(const struct spot_store_result *res, void *data)
{
  struct spotd *d = data;

  d->upload = NULL;
  if (res->err == 0)
    log_info("resumed and committed checkpoint %s left by the previous spotd "
             "(%u parts were already stored)",
             res->name, res->resumed_parts);
  else
    spotd_warn(d, "the upload of %s left by the previous spotd failed: %s",
               res->name, res->message);
  if (d->closing)
    return;
  begin_restore(d);
}

/* A spotd killed mid-upload left a journal next to the checkpoint folder:
 * finish that push first (its parts already stored are not sent again),
 * so the restore that follows brings the newest checkpoint back. Only the
 * newest journal is resumed; older ones are dropped and their uploads
 * aborted by the next commit's retention. Returns true when a push was
 * started. */
static bool
resume_journaled(struct spotd *d)
{
  DIR *dir = opendir(d->journal_dir);
  struct dirent *de;
  char best[256] = "", prefix[300];
  struct timespec best_mtime = {0, 0};
  size_t plen;
  int r;

  if (dir == NULL)
    return false;
  snprintf(prefix, sizeof(prefix), "%s--", d->cfg->job);
  plen = strlen(prefix);
  while ((de = readdir(dir)) != NULL) {
    char path[4400], marker[4400], name[256];
    size_t n = strlen(de->d_name);
    struct stat st;

    if (strncmp(de->d_name, prefix, plen) != 0 || n < plen + 6 ||
        strcmp(de->d_name + n - 5, ".json") != 0 ||
        n - plen - 5 >= sizeof(name))
      continue;
    memcpy(name, de->d_name + plen, n - plen - 5);
    name[n - plen - 5] = '\0';
    snprintf(path, sizeof(path), "%s/%s", d->journal_dir, de->d_name);
    snprintf(marker, sizeof(marker), "%s/%s/%s", d->ckpt_dir, name,
             SPOTD_COMPLETE);
    if (!spot_ckpt_name_valid(name) || stat(marker, &st) < 0 ||
        stat(path, &st) < 0) {
      unlink(path);
      continue;
    }
    if (best[0] == '\0' || st.st_mtim.tv_sec > best_mtime.tv_sec ||
        (st.st_mtim.tv_sec == best_mtime.tv_sec &&
         st.st_mtim.tv_nsec > best_mtime.tv_nsec)) {
      if (best[0] != '\0') {
        snprintf(path, sizeof(path), "%s/%s%s.json", d->journal_dir, prefix,
                 best);
        unlink(path);
      }
      spot_strlcpy(best, name, sizeof(best));
      best_mtime = st.st_mtim;
    } else {
      unlink(path);
    }
  }
  closedir(dir);
  if (best[0] == '\0')
    return false;
  log_info("the previous spotd was interrupted while uploading %s: resuming "
           "that upload",
           best);
  spotd_set_state(d, SPOTD_RESTORING);
  watch_mark_known(d, best);
  snprintf(prefix, sizeof(prefix), "%s/%s", d->ckpt_dir, best);
  spot_strlcpy(d->upload_name, best, sizeof(d->upload_name));
  r = spot_store_push(d->loop, &d->store, prefix, best, NULL, resume_done_cb, d,
                      &d->upload);
  if (r < 0) {
    d->upload = NULL;
    spotd_warn(d, "cannot resume the upload of %s: %s", best, strerror(-r));
    return false;
  }
  return true;
}

static void
aws_ready_cb(int err, const char *msg, void *data)
{
  struct spotd *d = data;
  struct spot_s3_config sc;
  int r;

  if (err < 0) {
    log_err("%s", msg[0] ? msg : strerror(-err));
    d->exit_code = 1;
    spotd_close(d);
    return;
  }
  memset(&sc, 0, sizeof(sc));
  spot_aws_s3_config(d->aws, &sc);
  r = spot_s3_new(d->http, &sc, &d->s3);
  if (r < 0) {
    log_err_errno(r, "S3 client");
    d->exit_code = 1;
    spotd_close(d);
    return;
  }
  d->store.s3 = d->s3;
  if (resume_journaled(d))
    return; /* begin_restore() runs when that push ends */
  begin_restore(d);
}

static void
begin_restore(struct spotd *d)
{
  char tmp[4300];
  int r;

  if (!d->cfg->restore) {
    launch(d);
    return;
  }
  spotd_set_state(d, SPOTD_RESTORING);
  snprintf(tmp, sizeof(tmp), "%s/.spotd-resume", d->ckpt_dir);
  if (access(tmp, F_OK) == 0)
    spot_rm_tree(tmp);
  r = spot_store_restore(d->loop, &d->store, NULL, tmp, NULL, restore_done_cb,
                         d, &d->upload);
  if (r < 0) {
    log_err_errno(r, "restore");
    d->exit_code = 1;
    spotd_close(d);
  }
}

static int
mkdir_p(const char *path)
{
  char buf[4200];

  if (spot_strlcpy(buf, path, sizeof(buf)) >= sizeof(buf))
    return -ENAMETOOLONG;
  for (char *p = buf + 1; *p != '\0'; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
      return -errno;
    *p = '/';
  }
  if (mkdir(buf, 0755) < 0 && errno != EEXIST)
    return -errno;
  return 0;
}

int
spotd_start(struct spotd *d)
{
  struct spot_aws_options ao;
  struct spot_meta_config mc;
  int r;

  d->exit_code = -1;
  d->start_wall_ms = spot_now_wall_ms();
  d->ckpt_dir = d->cfg->ckpt_dir;
  r = mkdir_p(d->ckpt_dir);
  if (r < 0)
    return log_err_errno(r, "checkpoint folder %s", d->ckpt_dir);
  uv_timer_init(d->loop, &d->interval_timer);
  uv_timer_init(d->loop, &d->ckpt_timer);
  uv_timer_init(d->loop, &d->relaunch_timer);
  d->store.bucket = d->cfg->bucket;
  d->store.prefix = d->cfg->prefix;
  d->store.job = d->cfg->job;
  d->store.part_size = d->cfg->part_size;
  d->store.parallel = (unsigned)d->cfg->parallel;
  d->store.compress = d->cfg->compress == SPOT_CONFIG_COMPRESS_NONE
                          ? SPOT_STORE_COMPRESS_NEVER
                          : SPOT_STORE_COMPRESS_AUTO;
  d->store.keep = (unsigned)d->cfg->keep;
  if (asprintf(&d->journal_dir, "%s/.spotd-journal", d->ckpt_dir) < 0)
    return -ENOMEM;
  r = mkdir_p(d->journal_dir);
  if (r < 0)
    return log_err_errno(r, "journal folder %s", d->journal_dir);
  d->store.journal_dir = d->journal_dir;
  d->store.rank = (unsigned)d->cfg->rank;
  d->store.nranks = (unsigned)d->cfg->nranks;
  d->store.rank_wait_ms = d->cfg->rank_wait_ms;
  snprintf(d->store_url, sizeof(d->store_url), "s3://%s/%s%s%s", d->cfg->bucket,
           d->cfg->prefix, d->cfg->prefix[0] ? "/" : "", d->cfg->job);

  r = control_start(d);
  if (r < 0)
    return r;
  r = spot_http_new(d->loop, &d->http);
  if (r < 0)
    return log_err_errno(r, "HTTP client");

  spot_meta_config_init(&mc);
  mc.provider = (enum spot_provider)SPOT_PROVIDER_AUTO;
  switch (d->cfg->provider) {
  case SPOT_CONFIG_PROVIDER_AWS:
    mc.provider = SPOT_PROVIDER_AWS;
    break;
  case SPOT_CONFIG_PROVIDER_GCP:
    mc.provider = SPOT_PROVIDER_GCP;
    break;
  case SPOT_CONFIG_PROVIDER_AZURE:
    mc.provider = SPOT_PROVIDER_AZURE;
    break;
  case SPOT_CONFIG_PROVIDER_NONE:
    mc.provider = SPOT_PROVIDER_NONE;
    break;
  default:
    break;
  }
  mc.base_url = d->cfg->metadata_url;
  mc.poll_interval_ms = (unsigned)d->cfg->poll_interval_ms;
  mc.imdsv1_fallback = d->cfg->imdsv1;
  mc.vm_name = d->cfg->vm_name;
  mc.status_cb = meta_status_cb;
  if (mc.provider != SPOT_PROVIDER_NONE) {
    r = spot_meta_new(d->loop, d->http, &mc, notice_cb, d, &d->meta);
    if (r == 0)
      r = spot_meta_start(d->meta);
    if (r < 0)
      return log_err_errno(r, "metadata watcher");
  }

  memset(&ao, 0, sizeof(ao));
  ao.endpoint = d->cfg->endpoint;
  ao.region = d->cfg->region;
  r = spot_aws_new(d->loop, d->http, &ao, &d->aws);
  if (r == 0)
    r = spot_aws_start(d->aws, aws_ready_cb, d);
  if (r < 0)
    return log_err_errno(r, "AWS settings");
  spotd_set_state(d, SPOTD_CONNECTING);
  return 0;
}

/* -------------------------------------------------------------- close */

static void
timer_close(struct spotd *d, uv_timer_t *t)
{
  if (t->loop != NULL && !uv_is_closing((uv_handle_t *)t)) {
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, NULL);
  }
}

void
spotd_close(struct spotd *d)
{
  if (d->closing)
    return;
  d->closing = true;
  spotd_set_state(d, SPOTD_EXITING);
  spotd_notify(d, "STOPPING=1");
  if (d->upload != NULL)
    spot_store_cancel(d->upload);
  if (d->relaunch_running)
    uv_process_kill(&d->relaunch_proc, SIGKILL);
  trainer_close(&d->trainer);
  watch_close(d);
  control_close(d);
  timer_close(d, &d->interval_timer);
  timer_close(d, &d->ckpt_timer);
  timer_close(d, &d->relaunch_timer);
  timer_close(d, &d->watchdog);
  if (d->meta != NULL) {
    spot_meta_close(d->meta, NULL, NULL);
    d->meta = NULL;
  }
  /* The S3 client, credentials and HTTP go last, from main(), once the
   * store operations have delivered their cancellation. */
  if (d->exit_code < 0)
    d->exit_code = 1;
}
