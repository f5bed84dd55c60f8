/* The engine's executor: the libuv and system-call half of the engine.
 * Callbacks (timers, signals, the trainer's exit, the metadata watcher,
 * the other modules' completions through the functions of driver.h)
 * become events; feed() reads the facts of the other modules, stamps the
 * time, steps the pure engine (engine.c) and carries its commands out, in
 * order, through the modules. A command whose outcome the engine needs
 * (the trainer started, the relaunch claim, the lease released) feeds the
 * next event from within: steps nest as the calls they replace did. The
 * engine's state and exit status are d->eng's, written only by
 * engine.c. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "control.h"
#include "driver.h"
#include "engine.h"
#include "fanout.h"
#include "hist.h"
#include "io/aws.h"
#include "io/http.h"
#include "io/meta.h"
#include "joblease.h"
#include "core/log.h"
#include "probe.h"
#include "relaunch.h"
#include "request.h"
#include "restarts.h"
#include "startup.h"
#include "runjoin.h"
#include "spotd.h"
#include "trainer.h"
#include "upload.h"
#include "core/util.h"
#include "watch.h"

void
spotd_notify(struct spotd *d, const char *fmt, ...)
{
  char msg[512];
  va_list ap;

  (void)d;
  if (getenv("NOTIFY_SOCKET") == NULL)
    return;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  sd_notify(0, msg);
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

uint64_t
spotd_ms_left(const struct spotd *d)
{
  return spotd_engine_ms_left(&d->eng, spot_now_mono_ms());
}

uint64_t
spotd_final_ms_left(const struct spotd *d)
{
  return spotd_engine_final_ms_left(&d->eng, spot_now_mono_ms());
}

int64_t
spotd_final_deadline_wall(const struct spotd *d)
{
  return spotd_engine_final_deadline_wall(&d->eng);
}

/* ------------------------------------------------------------- events */

static void execute(struct spotd *d, const struct spotd_cmd *c);

/* What the other modules hold, as the engine reads it. */
static void
facts(const struct spotd *d, struct spotd_facts *f)
{
  memset(f, 0, sizeof(*f));
  f->trainer_running = trainer_running(d);
  f->trainer_started = d->trainer_started;
  f->upload_idle = upload_idle(d);
  f->request_pending = request_pending(d);
  f->lease_lost = d->jl.state == JOB_LEASE_LOST;
  f->final = d->final.state;
  f->final_is_restored = strcmp(d->final.name, d->restored_name) == 0;
  f->final_cut = d->final.cut;
  f->last_commit = d->last_commit;
  f->last_commit_made = d->last_commit_made;
  f->upload_failed = d->up.failed;
  f->crash_exhausted = d->crash.exhausted;
  f->crash_interrupted = d->crash.interrupted;
  f->crash_last_signal = d->crash.last_signal;
  f->crash_last_status = d->crash.last_status;
  f->crash_used = d->crash.used;
}

/* One event: the facts and the time, a step, its commands. Returns false
 * when the engine refused the move the event asked for. */
static bool
feed(struct spotd *d, struct spotd_event *ev)
{
  struct spotd_cmds out = {.n = 0};

  ev->now_mono = spot_now_mono_ms();
  ev->now_wall = spot_now_wall_ms();
  facts(d, &ev->facts);
  spotd_engine_step(&d->eng, ev, &out);
  if (out.dropped > 0)
    log_err("internal: engine: %u commands past %d for event %s dropped",
            out.dropped, SPOTD_CMDS_MAX, spotd_event_name(ev->kind));
  /* A command's nested step may have closed spotd: what this step asked
   * after that has nothing left to act on, but its log lines. */
  for (unsigned i = 0; i < out.n; i++)
    if (!d->closing || out.c[i].kind == SPOTD_CMD_LOG)
      execute(d, &out.c[i]);
  return !out.refused;
}

static bool
feed_kind(struct spotd *d, enum spotd_event_kind k, int code)
{
  struct spotd_event ev;

  memset(&ev, 0, sizeof(ev));
  ev.kind = k;
  ev.code = code;
  return feed(d, &ev);
}

static void
feed_notice(struct spotd *d, enum spotd_event_kind k,
            const struct spot_notice *n)
{
  struct spotd_event ev;

  memset(&ev, 0, sizeof(ev));
  ev.kind = k;
  ev.notice = n;
  feed(d, &ev);
}

void
spotd_fail(struct spotd *d, int exit_code)
{
  feed_kind(d, SPOTD_EV_FAIL, exit_code);
}

void
spotd_close(struct spotd *d)
{
  feed_kind(d, SPOTD_EV_CLOSE, 0);
}

void
spotd_advance(struct spotd *d)
{
  if (!d->closing)
    feed_kind(d, SPOTD_EV_ADVANCE, 0);
}

void
spotd_on_signal(struct spotd *d, int signum)
{
  feed_kind(d, SPOTD_EV_SIGNAL, signum);
}

void
spotd_job_notice(struct spotd *d, const struct spot_notice *n)
{
  if (!d->closing)
    feed_notice(d, SPOTD_EV_JOB_NOTICE, n);
}

void
spotd_operator_final(struct spotd *d)
{
  if (!d->closing)
    feed_kind(d, SPOTD_EV_OPERATOR_FINAL, 0);
}

void
spotd_relaunch_claimed(struct spotd *d, bool run_it)
{
  struct spotd_event ev;

  if (d->closing)
    return;
  memset(&ev, 0, sizeof(ev));
  ev.kind = SPOTD_EV_CLAIM;
  ev.run_it = run_it;
  feed(d, &ev);
}

void
spotd_relaunch_ended(struct spotd *d)
{
  if (!d->closing)
    feed_kind(d, SPOTD_EV_RELAUNCH_ENDED, 0);
}

void
spotd_lease_lost(struct spotd *d)
{
  if (!d->closing)
    feed_kind(d, SPOTD_EV_LEASE_LOST, 0);
}

void
spotd_trainer_exited(struct spotd *d)
{
  if (!d->closing)
    feed_kind(d, SPOTD_EV_TRAINER_EXITED, spot_child_status(&d->trainer));
}

void
spotd_launch(struct spotd *d)
{
  if (!d->closing)
    feed_kind(d, SPOTD_EV_LAUNCH, 0);
}

void
spotd_relaunch_trainer(struct spotd *d)
{
  if (!d->closing)
    feed_kind(d, SPOTD_EV_RELAUNCH_TRAINER, 0);
}

void
spotd_restoring(struct spotd *d)
{
  feed_kind(d, SPOTD_EV_RESTORING, 0);
}

bool
spotd_restart_begin(struct spotd *d)
{
  return feed_kind(d, SPOTD_EV_RESTART_BEGIN, 0) &&
         d->eng.state == SPOTD_RESTARTING;
}

static void
notice_cb(struct spot_meta *m, const struct spot_notice *n, void *data)
{
  struct spotd *d = data;

  (void)m;
  if (!d->closing)
    feed_notice(d, SPOTD_EV_NOTICE, n);
}

static void
deadline_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, deadline_timer);

  if (!d->closing)
    feed_kind(d, SPOTD_EV_DEADLINE, 0);
}

static void
interval_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, interval_timer);

  if (!d->closing && d->eng.state == SPOTD_RUNNING)
    spotd_request_checkpoint(d, "interval");
}

static void
meta_status_cb(struct spot_meta *m, void *data)
{
  const char *w = spot_meta_warning(m);

  if (w != NULL) {
    log_warn("metadata: %s", w);
    hist_meta_error(data);
  }
}

static void
ack_cb(int status, void *data)
{
  struct spotd *d = data;

  if (d->closing)
    return;
  if (status < 0 && status != UV_ECANCELED)
    spotd_warn(d, "acknowledging the scheduled event failed: %s",
               strerror(-status));
  else if (status == 0)
    log_info("acknowledged scheduled event %s", d->eng.notice.id);
}

/* ----------------------------------------------------------- commands */

/* START_TRAINER: the trainer, then TRAINER_STARTED (or FAIL 127). */
static void
start_trainer(struct spotd *d, bool restart)
{
  if (trainer_start(d) < 0) {
    if (!restart)
      hist_refused(d, "no-command");
    spotd_fail(d, SPOTD_EXIT_NO_COMMAND);
    return;
  }
  restarts_record(d);
  if (restart) {
    hist_restarted(d);
    /* The watch stayed on: the folder is the same. */
  } else {
    hist_launched(d);
    if (watch_start(d) < 0)
      spotd_warn(d,
                 "cannot watch %s: checkpoints are only seen through "
                 "`spotctl done`",
                 d->ckpt_dir);
  }
  if (d->cfg->interval_ms > 0)
    uv_timer_start(&d->interval_timer, interval_cb, d->cfg->interval_ms,
                   d->cfg->interval_ms);
  feed_kind(d, SPOTD_EV_TRAINER_STARTED, 0);
}

/* The pending request's --ckpt-timeout passed (request.c): dropped, and
 * whoever waited on it told; after a notice the deadline rules (--help),
 * so the request stays. */
void
spotd_request_timed_out(struct spotd *d)
{
  char msg[128];

  if (d->eng.state == SPOTD_DRAINING && d->eng.have_notice &&
      !d->eng.drain_sigterm)
    return;
  request_drop(d);
  spotd_warn(d,
             "no checkpoint completed within %.0f s of request %llu: no "
             "folder of %s got its SPOTD_COMPLETE marker",
             (double)d->cfg->ckpt_timeout_ms / 1000.0,
             (unsigned long long)d->req.seq, d->ckpt_dir);
  upload_follow_drop(d, "checkpoint timeout");
  /* `spotctl checkpoint --wait` waited on this request: no commit comes. */
  snprintf(msg, sizeof(msg),
           "no checkpoint completed within %.0f s of the request "
           "(--ckpt-timeout)",
           (double)d->cfg->ckpt_timeout_ms / 1000.0);
  control_commit_event(d, "", -ETIMEDOUT, msg);
  /* A SIGTERM drain waited on this very request. */
  if (d->eng.state == SPOTD_DRAINING)
    final_give_up(d, "no final checkpoint");
  spotd_advance(d);
}

/* The trainer exited: its requests end, the timers that ask it stop. */
static void
trainer_gone(struct spotd *d)
{
  hist_exited(d);
  uv_timer_stop(&d->interval_timer);
  request_drop(d);
  /* A checkpoint completed just before the exit may not have been seen. */
  watch_scan(d);
  upload_follow_drop(d, "the trainer exited");
  upload_drop_local(d);
}

static void
freeze(struct spotd *d)
{
  int n = spot_child_kill(&d->trainer, SIGSTOP);

  if (n >= 0)
    log_warn("froze the trainer (SIGSTOP to %d processes of its tree); "
             "killing it",
             n);
}

static void close_handles(struct spotd *d);

static void
execute(struct spotd *d, const struct spotd_cmd *c)
{
  switch (c->kind) {
  case SPOTD_CMD_NOTIFY:
    spotd_notify(d, "%s", c->text);
    break;
  case SPOTD_CMD_WARN:
    spotd_warn(d, "%s", c->text);
    break;
  case SPOTD_CMD_HIST_NOTICE:
    hist_notice(d, c->notice);
    break;
  case SPOTD_CMD_PUBLISH:
    fanout_publish(d, c->notice);
    break;
  case SPOTD_CMD_REQUEST_CHECKPOINT:
    spotd_request_checkpoint(d, c->text);
    break;
  case SPOTD_CMD_FANOUT_START:
    fanout_start(d);
    break;
  case SPOTD_CMD_START_TRAINER:
    start_trainer(d, c->arg != 0);
    break;
  case SPOTD_CMD_RUNNING:
    if (c->arg)
      spotd_notify(d, "STATUS=running, trainer pid %d (restart %" PRId64 ")",
                   (int)d->trainer.pid, d->crash.used);
    else
      spotd_notify(d, "READY=1\nSTATUS=running, trainer pid %d",
                   (int)d->trainer.pid);
    break;
  case SPOTD_CMD_STOP_INTERVAL:
    uv_timer_stop(&d->interval_timer);
    break;
  case SPOTD_CMD_ABANDON_RESTART:
    restart_abandon(d);
    break;
  case SPOTD_CMD_REQUEST_FINAL:
    final_begin(d, d->eng.reason);
    break;
  case SPOTD_CMD_ARM_DEADLINE:
    uv_timer_start(&d->deadline_timer, deadline_cb, c->ms, 0);
    break;
  case SPOTD_CMD_DISARM_DEADLINE:
    uv_timer_stop(&d->deadline_timer);
    break;
  case SPOTD_CMD_FINAL_DEADLINE:
    final_deadline(d);
    break;
  case SPOTD_CMD_FINAL_GIVE_UP:
    final_give_up(d, c->text);
    break;
  case SPOTD_CMD_ACK:
    if (d->meta != NULL)
      spot_meta_ack(d->meta, c->notice->id, ack_cb, d);
    break;
  case SPOTD_CMD_CLAIM_RELAUNCH:
    if (fanout_claim_relaunch(d) != 0) /* else spotd_relaunch_claimed() */
      spotd_relaunch_claimed(d, true);
    break;
  case SPOTD_CMD_RUN_RELAUNCH:
    if (relaunch_start(d) != 0) /* else spotd_relaunch_ended() follows */
      spotd_relaunch_ended(d);
    break;
  case SPOTD_CMD_STOP_TRAINER:
    trainer_stop(d, c->ms);
    break;
  case SPOTD_CMD_FREEZE:
    freeze(d);
    break;
  case SPOTD_CMD_CANCEL_UPLOADS:
    upload_cancel_all(d);
    break;
  case SPOTD_CMD_TRAINER_GONE:
    trainer_gone(d);
    break;
  case SPOTD_CMD_PEER_CHECK:
    /* else a peer's notice (spotd_job_notice()), or
     * spotd_trainer_exited() again */
    if (!fanout_exit_check(d))
      feed_kind(d, SPOTD_EV_PEER_CHECKED, 0);
    break;
  case SPOTD_CMD_TRY_RESTART:
    /* else RESTARTING (spotd_restart_begin()): spotd_advance() moves on */
    if (!restart_after_crash(d))
      feed_kind(d, SPOTD_EV_NO_RESTART, 0);
    break;
  case SPOTD_CMD_RESTART_ADVANCE:
    restart_advance(d);
    break;
  case SPOTD_CMD_RELEASE_LEASE:
    if (!lease_release(d)) /* else its end calls spotd_advance() */
      feed_kind(d, SPOTD_EV_LEASE_RELEASED, 0);
    break;
  case SPOTD_CMD_ADVANCE:
    spotd_advance(d);
    break;
  case SPOTD_CMD_HIST_END:
    hist_end(d);
    break;
  case SPOTD_CMD_EXIT:
    close_handles(d);
    break;
  case SPOTD_CMD_LOG:
    spot_log(c->arg, "%s", c->text);
    break;
  default:
    break;
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

/* The checkpoint and journal folders, absolute (SPOTD_CKPT_DIR and
 * SPOTD_RESUME_DIR are given to the trainer as absolute paths). */
static int
folders(struct spotd *d)
{
  int r = mkdir_p(d->cfg->ckpt_dir);

  if (r < 0)
    return log_err_errno(r, "checkpoint folder %s", d->cfg->ckpt_dir);
  d->ckpt_dir = realpath(d->cfg->ckpt_dir, NULL);
  if (d->ckpt_dir == NULL)
    return log_err_errno(-errno, "checkpoint folder %s", d->cfg->ckpt_dir);
  if (asprintf(&d->journal_dir, "%s/.spotd-journal", d->ckpt_dir) < 0) {
    d->journal_dir = NULL;
    return -ENOMEM;
  }
  r = mkdir_p(d->journal_dir);
  if (r < 0)
    return log_err_errno(r, "journal folder %s", d->journal_dir);
  return 0;
}

static void
store_config(struct spotd *d)
{
  const struct spot_config *c = d->cfg;

  d->store.bucket = c->bucket;
  d->store.prefix = c->prefix;
  d->store.job = c->job;
  d->store.part_size = c->part_size;
  d->store.parallel = (unsigned)c->parallel;
  d->store.memory = c->memory;
  d->store.target_rate = c->target_rate;
  d->store.pack_threshold =
      c->pack_threshold == 0 ? SPOT_STORE_PACK_OFF : c->pack_threshold;
  d->store.compress = c->compress == SPOT_CONFIG_COMPRESS_NONE
                          ? SPOT_STORE_COMPRESS_NEVER
                          : SPOT_STORE_COMPRESS_AUTO;
  d->store.keep = (unsigned)c->keep;
  d->store.follow_symlinks = c->follow_symlinks;
  d->store.dedup = c->dedup && c->nranks <= 1;
  d->store.journal_dir = d->journal_dir;
  d->store.rank = (unsigned)c->rank;
  d->store.nranks = (unsigned)c->nranks;
  d->store.rank_wait_ms = c->rank_wait_ms;
  d->store.reshard = c->reshard;
  snprintf(d->store_url, sizeof(d->store_url), "s3://%s/%s%s%s", c->bucket,
           c->prefix, c->prefix[0] ? "/" : "", c->job);
}

static int
meta_start(struct spotd *d)
{
  static const enum spot_provider providers[] = {
      [SPOT_CONFIG_PROVIDER_AWS] = SPOT_PROVIDER_AWS,
      [SPOT_CONFIG_PROVIDER_GCP] = SPOT_PROVIDER_GCP,
      [SPOT_CONFIG_PROVIDER_AZURE] = SPOT_PROVIDER_AZURE,
      [SPOT_CONFIG_PROVIDER_NONE] = SPOT_PROVIDER_NONE,
  };
  struct spot_meta_config mc;
  int r;

  spot_meta_config_init(&mc);
  mc.provider = SPOT_PROVIDER_AUTO;
  if (d->cfg->provider != SPOT_CONFIG_PROVIDER_AUTO &&
      (unsigned)d->cfg->provider < SPOT_ARRAY_SIZE(providers))
    mc.provider = providers[d->cfg->provider];
  mc.base_url = d->cfg->metadata_url;
  mc.poll_interval_ms = (unsigned)d->cfg->poll_interval_ms;
  mc.imdsv1_fallback = d->cfg->imdsv1;
  mc.vm_name = d->cfg->vm_name;
  mc.status_cb = meta_status_cb;
  if (mc.provider == SPOT_PROVIDER_NONE)
    return 0;
  r = spot_meta_new(d->loop, d->http, &mc, notice_cb, d, &d->meta);
  if (r == 0)
    r = spot_meta_start(d->meta);
  if (r < 0)
    return log_err_errno(r, "metadata watcher");
  return 0;
}

void
spotd_handles_init(struct spotd *d)
{
  uv_timer_init(d->loop, &d->interval_timer);
  request_handles_init(d);
  uv_timer_init(d->loop, &d->deadline_timer);
  uv_timer_init(d->loop, &d->relaunch.timer);
  restarts_init(d);
  spot_child_init(&d->trainer, d->loop);
  spot_child_init(&d->relaunch.child, d->loop);
  fanout_init(d);
}

/* The engine's configuration, read once. */
static void
engine_init(struct spotd *d)
{
  struct spotd_engine_config ec;

  memset(&ec, 0, sizeof(ec));
  ec.job = d->cfg->job;
  ec.relaunch = d->cfg->relaunch != NULL;
  ec.max_restarts = d->cfg->max_restarts;
  ec.grace_ms = d->cfg->grace_ms;
  ec.nranks = (unsigned)d->cfg->nranks;
  ec.termination_grace = getenv("SPOTD_TERMINATION_GRACE");
  spotd_engine_init(&d->eng, &ec);
}

/* The start's local part; on failure *code is the exit status (-1: 71). */
static int
start(struct spotd *d, int *code)
{
  int r;

  d->steps.step = -1;
  d->last_commit_step = -1;
  d->steps.rate = -1;
  d->start_wall_ms = spot_now_wall_ms();
  spotd_handles_init(d);
  r = folders(d);
  if (r < 0) {
    /* The checkpoint folder is the local disk's: read-only, full, no
     * permission. Exit as the restore's local errors do. */
    if (r != -ENOMEM)
      *code = SPOTD_EXIT_IOERR;
    return r;
  }
  store_config(d);
  hist_init(d);
  r = control_start(d);
  if (r == 0)
    r = request_open(d);
  if (r < 0)
    return r;
  r = spot_http_new(d->loop, &d->http);
  if (r < 0)
    return log_err_errno(r, "HTTP client");
  r = meta_start(d);
  if (r == 0)
    r = restore_start(d);
  if (r < 0)
    return r;
  feed_kind(d, SPOTD_EV_STARTED, 0);
  return 0;
}

int
spotd_start(struct spotd *d)
{
  int code = -1, r;

  engine_init(d);
  r = start(d, &code);
  if (r < 0) /* an exit status the start said, else 71 */
    spotd_fail(d, code >= 0 ? code : SPOTD_EXIT_ERROR);
  return r;
}

/* -------------------------------------------------------------- close */

static void
timer_close(uv_timer_t *t)
{
  if (t->loop != NULL && !uv_is_closing((uv_handle_t *)t)) {
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, NULL);
  }
}

void
spotd_free_clients(struct spotd *d)
{
  spot_s3_free(d->s3);
  d->s3 = NULL;
  spot_aws_close(d->aws, NULL, NULL);
  d->aws = NULL;
  if (d->http != NULL)
    spot_http_close(d->http, NULL, NULL);
  d->http = NULL;
}

/* EXIT: every handle closes (what still arrives finds d->closing). */
static void
close_handles(struct spotd *d)
{
  if (d->closing)
    return;
  d->closing = true;
  spotd_notify(d, "STOPPING=1");
  upload_cancel_all(d);
  if (d->restore.op != NULL)
    spot_store_cancel(d->restore.op);
  if (d->fb.op != NULL)
    spot_store_cancel(d->fb.op);
  if (d->restore.s3op != NULL)
    spot_s3_cancel(d->restore.s3op);
  relaunch_close(d);
  restart_close(d);
  runjoin_close(d);
  fanout_close(d);
  lease_close(d);
  spot_child_close(&d->trainer);
  request_close(d);
  watch_close(d);
  control_close(d);
  timer_close(&d->interval_timer);
  timer_close(&d->deadline_timer);
  timer_close(&d->watchdog);
  if (d->meta != NULL) {
    spot_meta_close(d->meta, NULL, NULL);
    d->meta = NULL;
  }
  /* The S3 client, credentials and HTTP go last, from main(), once the
   * store operations have delivered their cancellation. */
}

void
spotd_free(struct spotd *d)
{
  free(d->journal_dir);
  d->journal_dir = NULL;
  free(d->ckpt_dir);
  d->ckpt_dir = NULL;
  probe_fini(d);
  fanout_fini(d);
  request_fini(d);
}
