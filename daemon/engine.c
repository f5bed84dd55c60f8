/* The engine: what spotd does, as one state machine (enum spotd_state).
 *
 *   CONNECTING   credentials (env, profile, IMDS role) and the metadata
 *                provider; then (restore.c)
 *   RESTORING    a journaled upload, then the newest committed checkpoint
 *   RUNNING      the trainer runs; periodic and requested checkpoints are
 *                signalled, complete folders are pushed (upload.c)
 *   RESTARTING   the trainer failed on its own with restarts left
 *                (restarts.c): the backoff, the pending upload, the newest
 *                commit, then RUNNING again; a notice or a signal drains
 *                (nothing runs to ask) instead
 *   DRAINING     a notice (or SIGTERM): the final checkpoint (upload.c)
 *                before the deadline (its own timer), else the last commit
 *   RELAUNCHING  ack the notice (Azure), run the relaunch step
 *   STOPPING     SIGTERM to the trainer, SIGKILL after a grace period that
 *                ends before the deadline
 *   FINISHING    the trainer exited by itself: finish the pending upload
 *   EXITING      close every handle
 *
 * Only spotd_set_state() changes the state: it logs the transition, tells
 * systemd (STATUS=) and refuses what the table below does not allow, so
 * the state only moves forward (but RESTARTING back to RUNNING, once per
 * restart); once closing it stays EXITING.
 * spotd_advance() moves on when the state's work is done, and
 * decide_exit() is the one place that turns the outcome into the exit
 * status and the last line. */
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
#include "engine.h"
#include "fanout.h"
#include "core/fsm.h"
#include "hist.h"
#include "joblease.h"
#include "core/log.h"
#include "io/aws.h"
#include "io/http.h"
#include "io/meta.h"
#include "relaunch.h"
#include "request.h"
#include "restarts.h"
#include "restore.h"
#include "runjoin.h"
#include "spotd.h"
#include "trainer.h"
#include "upload.h"
#include "core/util.h"
#include "watch.h"

/* Margin kept before a deadline for stopping the trainer. */
#define DEADLINE_MARGIN_MS 1000
/* spotd's own SIGTERM: time allowed for the final checkpoint and upload
 * (systemd/spotd.service has TimeoutStopSec= above it). */
#define SIGTERM_DRAIN_MS 90000

static const char *const state_names[] = {
    "init",     "connecting",  "restoring", "running",   "restarting",
    "draining", "relaunching", "stopping",  "finishing", "exiting",
};
_Static_assert(SPOT_ARRAY_SIZE(state_names) == SPOTD_STATE_LAST, "state_names");

#define B(s) SPOT_FSM_BIT(s)
static const uint32_t legal[SPOTD_STATE_LAST] = {
    [SPOTD_INIT] = B(SPOTD_CONNECTING) | B(SPOTD_EXITING),
    [SPOTD_CONNECTING] = B(SPOTD_RESTORING) | B(SPOTD_RUNNING) |
                         B(SPOTD_DRAINING) | B(SPOTD_EXITING),
    [SPOTD_RESTORING] = B(SPOTD_RUNNING) | B(SPOTD_DRAINING) | B(SPOTD_EXITING),
    [SPOTD_RUNNING] = B(SPOTD_RESTARTING) | B(SPOTD_DRAINING) |
                      B(SPOTD_STOPPING) | B(SPOTD_FINISHING) | B(SPOTD_EXITING),
    [SPOTD_RESTARTING] = B(SPOTD_RUNNING) | B(SPOTD_DRAINING) |
                         B(SPOTD_STOPPING) | B(SPOTD_EXITING),
    [SPOTD_DRAINING] =
        B(SPOTD_RELAUNCHING) | B(SPOTD_STOPPING) | B(SPOTD_EXITING),
    [SPOTD_RELAUNCHING] = B(SPOTD_STOPPING) | B(SPOTD_EXITING),
    [SPOTD_STOPPING] = B(SPOTD_EXITING),
    [SPOTD_FINISHING] = B(SPOTD_EXITING),
    [SPOTD_EXITING] = 0,
};

static const struct spot_fsm engine_fsm = {
    "state", state_names, SPOTD_STATE_LAST, legal, 0, SPOT_LOG_INFO};

const char *
spotd_state_name(enum spotd_state s)
{
  return spot_fsm_name(&engine_fsm, (unsigned)s);
}

bool
spotd_set_state_at(struct spotd *d, enum spotd_state s, const char *file,
                   int line)
{
  int r;

  if (d->closing && s != SPOTD_EXITING && s != d->state)
    r = spot_fsm_refuse(&engine_fsm, d->state, s, file, line, "closing");
  else
    r = spot_fsm_move(&engine_fsm, d->state, s, file, line);
  if (r <= 0)
    return r == 0;
  d->state = s;
  spotd_notify(d, "STATUS=%s", spotd_state_name(s));
  return true;
}

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
  uint64_t now = spot_now_mono_ms();

  if (d->deadline_mono == 0)
    return UINT64_MAX;
  return d->deadline_mono > now ? d->deadline_mono - now : 0;
}

uint64_t
spotd_final_ms_left(const struct spotd *d)
{
  uint64_t left = spotd_ms_left(d);

  if (left == UINT64_MAX)
    return left;
  return left > DEADLINE_MARGIN_MS * 2 ? left - DEADLINE_MARGIN_MS * 2 : 0;
}

int64_t
spotd_final_deadline_wall(const struct spotd *d)
{
  if (d->deadline_mono == 0 || d->deadline_wall <= 0)
    return 0;
  return d->deadline_wall > DEADLINE_MARGIN_MS * 2
             ? d->deadline_wall - DEADLINE_MARGIN_MS * 2
             : 1;
}

void
spotd_fail(struct spotd *d, int exit_code)
{
  if (d->closing)
    return;
  d->exit_code = exit_code;
  spotd_close(d);
}

/* ------------------------------------------------------------ outcome */

/* The exit status and the last line say what was preserved (README "Exit
 * status"). Runs once, when the engine is done. */
static void
decide_exit(struct spotd *d)
{
  const char *last = d->last_commit[0] ? d->last_commit : NULL;
  /* SIGTERM in a pod (SPOTD_TERMINATION_GRACE set) is the node going
   * away: it ends as a preemption, 75 or 76, so the Job makes a new pod. */
  bool stopped = d->drain_sigterm && !d->sigterm_reclaim;
  char when[32] = "";

  if (last != NULL)
    spot_rfc3339_format(d->last_commit_made, when, sizeof(when));
  if (d->state == SPOTD_FINISHING) {
    /* The trainer exited by itself: its status, unless it succeeded and
     * its last checkpoint could not be committed. */
    if (d->crash.exhausted) {
      log_err("the trainer failed again (%s %d) and all %" PRId64
              " restarts are used: giving up; the last committed checkpoint "
              "is %s",
              d->crash.last_signal ? "signal" : "status",
              d->crash.last_signal ? d->crash.last_signal
                                   : d->crash.last_status,
              d->crash.used, last ? last : "none");
      d->exit_code = SPOTD_EXIT_SOFTWARE;
      return;
    }
    if (d->exit_code == 0 && d->up.failed[0] != '\0') {
      log_err("the trainer finished but checkpoint %s could not be "
              "committed; the last committed checkpoint is %s",
              d->up.failed, last ? last : "none");
      d->exit_code = SPOTD_EXIT_UNAVAILABLE;
    }
    return;
  }
  if (d->final.state == FINAL_COMMITTED &&
      strcmp(d->final.name, d->restored_name) == 0) {
    d->exit_code = stopped ? 0 : SPOTD_EXIT_PREEMPTED;
    log_notice("%s before the trainer made a step: the job resumes from "
               "checkpoint %s, which it started from; no work is lost",
               stopped ? "stopped" : "preempted", last);
    return;
  }
  if (d->final.state == FINAL_COMMITTED) {
    d->exit_code = stopped ? 0 : SPOTD_EXIT_PREEMPTED;
    log_notice("%s: the final checkpoint %s is committed; the job resumes "
               "from it",
               stopped ? "stopped" : "preempted", last);
    return;
  }
  d->exit_code = stopped ? 128 + d->stop_signal : SPOTD_EXIT_PREEMPTED;
  if (last != NULL && d->crash.interrupted) {
    /* Nothing ran to checkpoint: the newest commit is all there is, and
     * the failed trainer made no step since. */
    if (stopped)
      d->exit_code = 0;
    log_notice("%s while restarting the failed trainer (nothing was "
               "running): the job resumes from checkpoint %s (committed %s)",
               stopped ? "stopped" : "preempted", last, when);
    return;
  }
  if (last == NULL) {
    if (!stopped)
      d->exit_code = SPOTD_EXIT_NOTHING_SAVED;
    log_err("%s: no checkpoint of job %s is committed: the next start "
            "begins from scratch",
            stopped ? "stopped" : "preempted", d->cfg->job);
  } else if (d->final.state == FINAL_NONE && !d->trainer_started) {
    log_notice("preempted before the trainer started: the job resumes from "
               "checkpoint %s (committed %s)",
               last, when);
  } else if (d->final.cut[0] != '\0') {
    log_warn("%s while the final checkpoint %s was being committed: the "
             "job resumes from it if LATEST names it, else from %s "
             "(committed %s) and the work since then is lost",
             stopped ? "stopped" : "preempted", d->final.cut, last, when);
  } else {
    log_warn("%s without a final checkpoint: the job resumes from %s "
             "(committed %s); the work since then is lost",
             stopped ? "stopped" : "preempted", last, when);
  }
}

/* ---------------------------------------------------------- draining */

static void
deadline_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, deadline_timer);

  if (d->closing || d->state != SPOTD_DRAINING)
    return;
  final_deadline(d);
  spotd_advance(d);
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
  if (!spotd_set_state(d, SPOTD_DRAINING))
    return;
  final_begin(d, reason);
  left = spotd_final_ms_left(d);
  if (left != UINT64_MAX)
    uv_timer_start(&d->deadline_timer, deadline_cb, left, 0);
  spotd_advance(d);
}

static void
notice_cb(struct spot_meta *m, const struct spot_notice *n, void *data)
{
  struct spotd *d = data;
  char when[32] = "none";

  (void)m;
  if (d->closing)
    return;
  if (n->deadline_wall_ms != 0)
    spot_rfc3339_format(n->deadline_wall_ms, when, sizeof(when));
  log_notice("interruption notice: %s (%s) deadline %s id=%s", n->reason,
             spot_notice_kind_name(n->kind), when, n->id);
  hist_notice(d, n);
  if (n->kind == SPOT_NOTICE_REBALANCE) {
    /* Advisory: checkpoint early, keep training. */
    if (d->state == SPOTD_RUNNING)
      spotd_request_checkpoint(d, n->reason);
    return;
  }
  if (m != NULL)
    fanout_publish(d, n);
  if (d->state == SPOTD_DRAINING && d->have_notice)
    return; /* already acting on one */
  d->have_notice = true;
  d->notice = *n;
  if (d->state == SPOTD_RESTARTING)
    restart_abandon(d);
  if (d->state == SPOTD_RUNNING || d->state == SPOTD_DRAINING ||
      d->state == SPOTD_RESTARTING)
    start_drain(d, n->reason, n->deadline_mono_ms, n->deadline_wall_ms);
  else if (d->state == SPOTD_CONNECTING || d->state == SPOTD_RESTORING)
    log_warn("notice before the trainer started: it will not be started");
}

void
spotd_job_notice(struct spotd *d, const struct spot_notice *n)
{
  notice_cb(NULL, n, d);
}

void
spotd_operator_final(struct spotd *d)
{
  struct spot_notice n;

  if (d->closing || d->state != SPOTD_RUNNING)
    return;
  memset(&n, 0, sizeof(n));
  n.provider = SPOT_PROVIDER_NONE;
  n.kind = SPOT_NOTICE_TERMINATE;
  n.deadline_wall_ms = spot_now_wall_ms() + SIGTERM_DRAIN_MS;
  n.deadline_mono_ms = spot_now_mono_ms() + SIGTERM_DRAIN_MS;
  spot_strlcpy(n.reason, "spotctl-final", sizeof(n.reason));
  spot_strlcpy(n.id, "spotctl", sizeof(n.id));
  fanout_publish(d, &n);
  notice_cb(NULL, &n, d);
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
    log_info("acknowledged scheduled event %s", d->notice.id);
}

/* ------------------------------------------------------------ advance */

/* The drain is over: ack (Azure), relaunch step, then stop. Returns true
 * when the relaunch step runs (spotd_advance() follows its end). */
static bool
drained(struct spotd *d)
{
  uv_timer_stop(&d->deadline_timer);
  if (d->have_notice && d->notice.provider == SPOT_PROVIDER_AZURE &&
      d->meta != NULL && d->notice.id[0] != '\0')
    spot_meta_ack(d->meta, d->notice.id, ack_cb, d);
  if (d->cfg->relaunch != NULL && !d->drain_sigterm) {
    spotd_set_state(d, SPOTD_RELAUNCHING);
    /* Multi-node: only the rank whose job-wide marker lands runs it. */
    if (fanout_claim_relaunch(d) == 0)
      return true; /* spotd_relaunch_claimed() follows */
    if (relaunch_start(d) == 0)
      return true; /* spotd_relaunch_ended() follows */
  }
  spotd_set_state(d, SPOTD_STOPPING);
  return false;
}

void
spotd_relaunch_claimed(struct spotd *d, bool run_it)
{
  if (d->closing || d->state != SPOTD_RELAUNCHING)
    return;
  if (run_it && relaunch_start(d) == 0)
    return; /* spotd_relaunch_ended() follows */
  spotd_relaunch_ended(d);
}

void
spotd_relaunch_ended(struct spotd *d)
{
  if (d->closing || d->state != SPOTD_RELAUNCHING)
    return;
  spotd_set_state(d, SPOTD_STOPPING);
  spotd_advance(d);
}

void
spotd_lease_lost(struct spotd *d)
{
  if (d->closing)
    return;
  upload_cancel_all(d);
  d->exit_code = SPOTD_EXIT_LEASE_LOST;
  if (!trainer_running(d)) {
    spotd_fail(d, SPOTD_EXIT_LEASE_LOST);
    return;
  }
  /* The next holder may start its trainer from now on: not one more step
   * here. SIGSTOP cannot be caught; SIGKILL follows at once. The engine
   * goes to STOPPING from whatever it was doing: nothing is committed any
   * more, and spotd_trainer_exited() ends it with exit 73. */
  {
    int n = spot_child_kill(&d->trainer, SIGSTOP);

    if (n >= 0)
      log_warn("froze the trainer (SIGSTOP to %d processes of its tree); "
               "killing it",
               n);
  }
  trainer_stop(d, 0);
  if (d->state != SPOTD_STOPPING && d->state != SPOTD_FINISHING)
    spotd_set_state(d, SPOTD_STOPPING);
}

static void
stop_trainer(struct spotd *d)
{
  uint64_t grace = d->cfg->grace_ms, left = spotd_ms_left(d);

  if (left != UINT64_MAX) {
    left = left > DEADLINE_MARGIN_MS ? left - DEADLINE_MARGIN_MS : 0;
    if (left < grace)
      grace = left;
  }
  trainer_stop(d, grace);
}

void
spotd_advance(struct spotd *d)
{
  if (d->closing)
    return;
  switch (d->state) {
  case SPOTD_DRAINING:
    if (final_wait(d) || drained(d))
      return;
    SPOT_FALLTHROUGH;
  case SPOTD_STOPPING:
    if (trainer_running(d)) {
      stop_trainer(d);
      return;
    }
    if (!upload_idle(d) || lease_release(d))
      return;
    decide_exit(d);
    spotd_close(d);
    return;
  case SPOTD_RESTARTING:
    restart_advance(d);
    return;
  case SPOTD_FINISHING:
    if (!upload_idle(d) || lease_release(d))
      return;
    decide_exit(d);
    spotd_close(d);
    return;
  default:
    return;
  }
}

void
spotd_trainer_exited(struct spotd *d)
{
  if (d->closing)
    return;
  if (d->jl.state == JOB_LEASE_LOST) {
    spotd_fail(d, SPOTD_EXIT_LEASE_LOST);
    return;
  }
  if (d->exit_code < 0 && d->state == SPOTD_RUNNING)
    d->exit_code = spot_child_status(&d->trainer);
  hist_exited(d);
  uv_timer_stop(&d->interval_timer);
  uv_timer_stop(&d->ckpt_timer);
  request_end(d);
  /* A checkpoint completed just before the exit may not have been seen. */
  watch_scan(d);
  upload_follow_drop(d, "the trainer exited");
  upload_drop_local(d);
  if (d->state == SPOTD_RUNNING) {
    if (d->exit_code != 0 && fanout_exit_check(d))
      return; /* a peer's preemption, or spotd_trainer_exited() again */
    if (d->exit_code != 0 && restart_after_crash(d))
      return; /* RESTARTING: spotd_advance() moves on */
    if (d->exit_code != 0 && d->cfg->max_restarts == 0)
      spotd_warn(d, "the trainer failed (status %d): not relaunching",
                 d->exit_code);
    spotd_set_state(d, SPOTD_FINISHING);
  }
  spotd_advance(d);
}

/* The time a SIGTERM leaves: SPOTD_TERMINATION_GRACE seconds when set
 * (a Kubernetes pod sets it a little under its
 * terminationGracePeriodSeconds), else SIGTERM_DRAIN_MS. The final
 * checkpoint's estimate is checked against it (final_begin). With it set,
 * the SIGTERM is the node's reclaim and the exit status a preemption's
 * (decide_exit). */
static uint64_t
sigterm_grace_ms(struct spotd *d)
{
  const char *v = getenv("SPOTD_TERMINATION_GRACE");
  int64_t s;

  if (v == NULL || *v == '\0')
    return SIGTERM_DRAIN_MS;
  if (spot_parse_int64(v, 1, 86400, &s) < 0) {
    log_warn("SPOTD_TERMINATION_GRACE '%.20s' is not 1 to 86400 seconds: "
             "using %d s",
             v, SIGTERM_DRAIN_MS / 1000);
    return SIGTERM_DRAIN_MS;
  }
  log_info("SIGTERM grace: %" PRId64 " s (SPOTD_TERMINATION_GRACE): the node "
           "is going away, this ends as a preemption",
           s);
  d->sigterm_reclaim = true;
  return (uint64_t)s * 1000;
}

/* The signal's drain as a notice, for the history and, multi-node, for
 * the other ranks (fanout.c): a drain of one rank (a Kubernetes node
 * drain, a Slurm or systemd stop) is the job's, with its deadline, so
 * every rank takes the final checkpoint instead of dying on the lost
 * peer. */
static void
signal_notice(struct spotd *d, uint64_t ms, struct spot_notice *n)
{
  char when[32] = "";

  memset(n, 0, sizeof(*n));
  n->provider = SPOT_PROVIDER_NONE;
  n->kind = SPOT_NOTICE_TERMINATE;
  n->deadline_wall_ms = spot_now_wall_ms() + (int64_t)ms;
  n->deadline_mono_ms = spot_now_mono_ms() + ms;
  spot_strlcpy(n->reason, "sigterm", sizeof(n->reason));
  spot_strlcpy(n->id, "signal", sizeof(n->id));
  spot_rfc3339_format(n->deadline_wall_ms, when, sizeof(when));
  log_notice("drain deadline %s%s", when,
             d->store.nranks > 1 ? ": the job's, told to the other ranks" : "");
  /* With a termination grace the node is going away: a preemption in the
   * history too. A plain stop stays a stop. */
  if (d->sigterm_reclaim)
    hist_notice(d, n);
  fanout_publish(d, n);
}

void
spotd_on_signal(struct spotd *d, int signum)
{
  struct spot_notice n;
  uint64_t ms;

  if (d->closing) {
    log_info("signal %d: already exiting", signum);
    return;
  }
  d->signals_seen++;
  if (d->signals_seen > 1 || d->state < SPOTD_RUNNING) {
    log_warn("signal %d: stopping now", signum);
    spotd_fail(d, 128 + signum);
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
    /* With the final checkpoint committed the trainer has nothing left to
     * do, and whoever sent this (Slurm at a requeue) kills what is left
     * once its own wait is over: stop the trainer now, so the job lease
     * is released while there is time (the next node need not wait for
     * its TTL). */
    if (d->final.state == FINAL_COMMITTED && trainer_running(d)) {
      log_info("the final checkpoint %s is committed: stopping the trainer "
               "now, then releasing the job lease",
               d->last_commit);
      trainer_stop(d, 0);
    }
    return;
  }
  log_notice("signal %d: final checkpoint, then stop (again to stop now)",
             signum);
  d->drain_sigterm = true;
  d->stop_signal = signum;
  ms = sigterm_grace_ms(d);
  if (d->state != SPOTD_RUNNING && d->state != SPOTD_RESTARTING)
    return; /* finishing: the trainer ended by itself */
  signal_notice(d, ms, &n);
  if (d->state == SPOTD_RESTARTING)
    restart_abandon(d);
  start_drain(d, "sigterm", n.deadline_mono_ms, n.deadline_wall_ms);
}

/* ------------------------------------------------------------- launch */

static void
interval_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, interval_timer);

  if (!d->closing && d->state == SPOTD_RUNNING)
    spotd_request_checkpoint(d, "interval");
}

void
spotd_launch(struct spotd *d)
{
  if (d->closing)
    return;
  fanout_start(d); /* multi-node: publishes a notice seen until now */
  if (d->have_notice) {
    /* The machine is going away: starting the trainer would only cost
     * the time left. Relaunch elsewhere and leave. */
    log_warn("notice %s before the trainer started: not starting it",
             d->notice.reason);
    start_drain(d, d->notice.reason, d->notice.deadline_mono_ms,
                d->notice.deadline_wall_ms);
    return;
  }
  if (trainer_start(d) < 0) {
    hist_refused(d, "no-command");
    spotd_fail(d, SPOTD_EXIT_NO_COMMAND);
    return;
  }
  restarts_record(d);
  hist_launched(d);
  if (watch_start(d) < 0)
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

void
spotd_relaunch_trainer(struct spotd *d)
{
  if (d->closing || d->state != SPOTD_RESTARTING)
    return;
  if (trainer_start(d) < 0) {
    spotd_fail(d, SPOTD_EXIT_NO_COMMAND);
    return;
  }
  restarts_record(d);
  hist_restarted(d);
  /* The watch stayed on: the folder is the same. */
  if (d->cfg->interval_ms > 0)
    uv_timer_start(&d->interval_timer, interval_cb, d->cfg->interval_ms,
                   d->cfg->interval_ms);
  spotd_set_state(d, SPOTD_RUNNING);
  spotd_notify(d, "STATUS=running, trainer pid %d (restart %" PRId64 ")",
               (int)d->trainer.pid, d->crash.used);
}

/* -------------------------------------------------------------- start */

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
  uv_timer_init(d->loop, &d->ckpt_timer);
  uv_timer_init(d->loop, &d->deadline_timer);
  uv_timer_init(d->loop, &d->relaunch.timer);
  restarts_init(d);
  spot_child_init(&d->trainer, d->loop);
  spot_child_init(&d->relaunch.child, d->loop);
  fanout_init(d);
}

static int
start(struct spotd *d)
{
  int r;

  d->exit_code = -1;
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
      d->exit_code = SPOTD_EXIT_IOERR;
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
  spotd_set_state(d, SPOTD_CONNECTING);
  return 0;
}

int
spotd_start(struct spotd *d)
{
  int r = start(d);

  if (r < 0) {
    if (d->exit_code < 0) /* else the start said which */
      d->exit_code = SPOTD_EXIT_ERROR;
    spotd_close(d);
  }
  return r;
}

void
spotd_restoring(struct spotd *d)
{
  spotd_set_state(d, SPOTD_RESTORING);
}

bool
spotd_restart_begin(struct spotd *d)
{
  if (!spotd_set_state(d, SPOTD_RESTARTING))
    return false;
  d->exit_code = -1; /* the failure is not the outcome: it restarts */
  return true;
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

void
spotd_close(struct spotd *d)
{
  if (d->closing)
    return;
  hist_end(d);
  d->closing = true;
  spotd_set_state(d, SPOTD_EXITING);
  spotd_notify(d, "STOPPING=1");
  upload_cancel_all(d);
  if (d->restore.op != NULL)
    spot_store_cancel(d->restore.op);
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
  timer_close(&d->ckpt_timer);
  timer_close(&d->deadline_timer);
  timer_close(&d->watchdog);
  if (d->meta != NULL) {
    spot_meta_close(d->meta, NULL, NULL);
    d->meta = NULL;
  }
  /* The S3 client, credentials and HTTP go last, from main(), once the
   * store operations have delivered their cancellation. */
  if (d->exit_code < 0)
    d->exit_code = SPOTD_EXIT_ERROR;
}
