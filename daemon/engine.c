/* The engine: what spotd does, as one state machine (enum spotd_state),
 * and as a pure step function: spotd_engine_step() takes one event (the
 * time and the facts of the other modules come with it) and returns the
 * commands driver.c carries out. No libuv, no clock, no system call here
 * (the lint suite's `pure` check): test_engine replays whole runs.
 *
 *   CONNECTING   credentials (env, profile, IMDS role) and the metadata
 *                provider; then (startup.c)
 *   RESTORING    a journaled upload, then the newest committed checkpoint
 *   RUNNING      the trainer runs; periodic and requested checkpoints are
 *                signalled, complete folders are pushed (upload.c)
 *   RESTARTING   the trainer failed on its own with restarts left
 *                (restarts.c): the backoff, the pending upload, the newest
 *                commit, then RUNNING again; a notice or a signal drains
 *                (nothing runs to ask) instead
 *   DRAINING     a notice (or SIGTERM): the final checkpoint (upload.c)
 *                before the deadline (ARM_DEADLINE), else the last commit
 *   RELAUNCHING  ack the notice (Azure), run the relaunch step
 *   STOPPING     SIGTERM to the trainer, SIGKILL after a grace period that
 *                ends before the deadline
 *   FINISHING    the trainer exited by itself: finish the pending upload
 *   EXITING      close every handle
 *
 * Only set_state() changes the state: it logs the transition, tells
 * systemd (NOTIFY STATUS=) and refuses what legal[] does not allow, so the
 * state only moves forward (but RESTARTING back to RUNNING, once per
 * restart); EXITING is the end. What each state does on entry is one
 * table, on_enter[]; advance() moves on when the state's work is done,
 * and decide_exit() is the one place that turns the outcome into the exit
 * status and the last line. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"

/* Margin kept before a deadline for stopping the trainer. */
#define DEADLINE_MARGIN_MS 1000
/* spotd's own SIGTERM: time allowed for the final checkpoint and upload
 * (systemd/spotd.service has TimeoutStopSec= above it). */
#define SIGTERM_DRAIN_MS 90000
#define EXIT_ERROR 71
#define EXIT_SOFTWARE 70
#define EXIT_UNAVAILABLE 69
#define EXIT_LEASE_LOST 73
#define EXIT_PREEMPTED 75
#define EXIT_NOTHING_SAVED 76
#define EXIT_NO_COMMAND 127

static const char *const state_names[] = {
    "init",     "connecting",  "restoring", "running",   "restarting",
    "draining", "relaunching", "stopping",  "finishing", "exiting",
};
_Static_assert(SPOT_ARRAY_SIZE(state_names) == SPOTD_STATE_LAST, "state_names");

static const char *const event_names[] = {
    "started",        "restoring",        "launch",     "trainer-started",
    "restart-begin",  "relaunch-trainer", "notice",     "job-notice",
    "operator-final", "signal",           "advance",    "deadline",
    "trainer-exited", "peer-checked",     "no-restart", "claim",
    "relaunch-ended", "lease-released",   "lease-lost", "fail",
    "close",
};
_Static_assert(SPOT_ARRAY_SIZE(event_names) == SPOTD_EV_LAST, "event_names");

static const char *const cmd_names[] = {
    "notify",
    "warn",
    "hist-notice",
    "publish",
    "request-checkpoint",
    "fanout-start",
    "start-trainer",
    "running",
    "stop-interval",
    "abandon-restart",
    "request-final",
    "arm-deadline",
    "disarm-deadline",
    "final-deadline",
    "final-give-up",
    "ack",
    "claim-relaunch",
    "run-relaunch",
    "stop-trainer",
    "freeze",
    "cancel-uploads",
    "trainer-gone",
    "peer-check",
    "try-restart",
    "restart-advance",
    "release-lease",
    "advance",
    "hist-end",
    "exit",
    "log",
};
_Static_assert(SPOT_ARRAY_SIZE(cmd_names) == SPOTD_CMD_LAST, "cmd_names");

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

const char *
spotd_event_name(enum spotd_event_kind k)
{
  return (unsigned)k < SPOTD_EV_LAST ? event_names[k] : "?";
}

const char *
spotd_cmd_name(enum spotd_cmd_kind k)
{
  return (unsigned)k < SPOTD_CMD_LAST ? cmd_names[k] : "?";
}

void
spotd_engine_init(struct spotd_engine *e, const struct spotd_engine_config *cfg)
{
  memset(e, 0, sizeof(*e));
  e->cfg = *cfg;
  e->state = SPOTD_INIT; /* initial state */
  e->exit_code = -1;
}

uint64_t
spotd_engine_ms_left(const struct spotd_engine *e, uint64_t now)
{
  if (e->deadline_mono == 0)
    return UINT64_MAX;
  return e->deadline_mono > now ? e->deadline_mono - now : 0;
}

uint64_t
spotd_engine_final_ms_left(const struct spotd_engine *e, uint64_t now)
{
  uint64_t left = spotd_engine_ms_left(e, now);

  if (left == UINT64_MAX)
    return left;
  return left > DEADLINE_MARGIN_MS * 2 ? left - DEADLINE_MARGIN_MS * 2 : 0;
}

int64_t
spotd_engine_final_deadline_wall(const struct spotd_engine *e)
{
  if (e->deadline_mono == 0 || e->deadline_wall <= 0)
    return 0;
  return e->deadline_wall > DEADLINE_MARGIN_MS * 2
             ? e->deadline_wall - DEADLINE_MARGIN_MS * 2
             : 1;
}

/* ----------------------------------------------------------- commands */

/* One step: the engine, the event, the commands it appends. */
struct step {
  struct spotd_engine *e;
  const struct spotd_event *ev;
  const struct spotd_facts *f;
  struct spotd_cmds *out;
  struct spotd_cmd spill; /* a command past SPOTD_CMDS_MAX: dropped */
};

static struct spotd_cmd *
cmd(struct step *s, enum spotd_cmd_kind k)
{
  struct spotd_cmd *c;

  if (s->out->n == SPOTD_CMDS_MAX) {
    /* Never with the engine's steps (test_engine counts them): a bug,
     * which the driver reports. */
    s->out->dropped++;
    memset(&s->spill, 0, sizeof(s->spill));
    return &s->spill;
  }
  c = &s->out->c[s->out->n++];
  memset(c, 0, sizeof(*c));
  c->kind = k;
  return c;
}

/* A line for the log, as a command the driver carries out in its order
 * among the others: the engine writes nothing itself. */
static void elog(struct step *s, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
elog(struct step *s, int level, const char *fmt, ...)
{
  struct spotd_cmd *c = cmd(s, SPOTD_CMD_LOG);
  va_list ap;

  c->arg = level;
  va_start(ap, fmt);
  (void)vsnprintf(c->text, sizeof(c->text), fmt, ap);
  va_end(ap);
}

static void
cmd_arg(struct step *s, enum spotd_cmd_kind k, int arg)
{
  cmd(s, k)->arg = arg;
}

static void cmd_text(struct step *s, enum spotd_cmd_kind k, const char *fmt,
                     ...) __attribute__((format(printf, 3, 4)));

static void
cmd_text(struct step *s, enum spotd_cmd_kind k, const char *fmt, ...)
{
  struct spotd_cmd *c = cmd(s, k);
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(c->text, sizeof(c->text), fmt, ap);
  va_end(ap);
}

/* ------------------------------------------------------------- states */

static void enter_running(struct step *s, enum spotd_state from);
static void enter_restarting(struct step *s, enum spotd_state from);
static void enter_draining(struct step *s, enum spotd_state from);
static void enter_relaunching(struct step *s, enum spotd_state from);
static void enter_exiting(struct step *s, enum spotd_state from);

/* Entry actions, one per state: what entering it does besides the log
 * line and systemd's STATUS= (set_state() runs them). */
static void (*const on_enter[SPOTD_STATE_LAST])(struct step *s,
                                                enum spotd_state from) = {
    [SPOTD_RUNNING] = enter_running,   [SPOTD_RESTARTING] = enter_restarting,
    [SPOTD_DRAINING] = enter_draining, [SPOTD_RELAUNCHING] = enter_relaunching,
    [SPOTD_EXITING] = enter_exiting,
};

#define set_state(s, to) set_state_at((s), (to), __FILE__, __LINE__)
static bool
set_state_at(struct step *s, enum spotd_state to, const char *file, int line)
{
  struct spotd_engine *e = s->e;
  enum spotd_state from = e->state;
  int r = spot_fsm_move(&engine_fsm, from, to, file, line);

  if (r <= 0) {
    if (r < 0)
      s->out->refused = true;
    return r == 0;
  }
  e->state = to;
  cmd_text(s, SPOTD_CMD_NOTIFY, "STATUS=%s", spotd_state_name(to));
  if (on_enter[to] != NULL)
    on_enter[to](s, from);
  return true;
}

/* RUNNING: the trainer runs (started, or started again): tell systemd. */
static void
enter_running(struct step *s, enum spotd_state from)
{
  cmd_arg(s, SPOTD_CMD_RUNNING, from == SPOTD_RESTARTING);
}

/* RESTARTING: the failure is not the outcome, it restarts. */
static void
enter_restarting(struct step *s, enum spotd_state from)
{
  (void)from;
  s->e->exit_code = -1;
}

/* DRAINING (and a drain started again for a notice): ask the trainer for
 * its final checkpoint, arm the deadline the final checkpoint has, look
 * again once the request changed the final checkpoint's state. */
static void
enter_draining(struct step *s, enum spotd_state from)
{
  uint64_t left = spotd_engine_final_ms_left(s->e, s->ev->now_mono);

  (void)from;
  cmd(s, SPOTD_CMD_REQUEST_FINAL);
  if (left != UINT64_MAX)
    cmd(s, SPOTD_CMD_ARM_DEADLINE)->ms = left;
  cmd(s, SPOTD_CMD_ADVANCE);
}

/* RELAUNCHING: multi-node, only the rank whose job-wide marker lands runs
 * the step: CLAIM, then RELAUNCH_ENDED follow. */
static void
enter_relaunching(struct step *s, enum spotd_state from)
{
  (void)from;
  cmd(s, SPOTD_CMD_CLAIM_RELAUNCH);
}

/* EXITING: the history's last record (of the state left), then close
 * everything with the exit status (71 when nothing decided one). */
static void
enter_exiting(struct step *s, enum spotd_state from)
{
  struct spotd_engine *e = s->e;

  e->ended_in = from;
  if (e->exit_code < 0)
    e->exit_code = EXIT_ERROR;
  cmd(s, SPOTD_CMD_HIST_END);
  cmd_arg(s, SPOTD_CMD_EXIT, e->exit_code);
}

static void
fail(struct step *s, int code)
{
  if (code >= 0)
    s->e->exit_code = code;
  set_state(s, SPOTD_EXITING);
}

/* ------------------------------------------------------------ outcome */

/* The exit status and the last line say what was preserved (README "Exit
 * status"). Runs once, when the engine is done. */
static void
decide_exit(struct step *s)
{
  struct spotd_engine *e = s->e;
  const struct spotd_facts *f = s->f;
  const char *last =
      f->last_commit != NULL && f->last_commit[0] ? f->last_commit : NULL;
  /* SIGTERM in a pod (SPOTD_TERMINATION_GRACE set) is the node going
   * away: it ends as a preemption, 75 or 76, so the Job makes a new pod. */
  bool stopped = e->drain_sigterm && !e->sigterm_reclaim;
  char when[32] = "";

  if (last != NULL)
    spot_rfc3339_format(f->last_commit_made, when, sizeof(when));
  if (e->state == SPOTD_FINISHING) {
    /* The trainer exited by itself: its status, unless it succeeded and
     * its last checkpoint could not be committed. */
    if (f->crash_exhausted) {
      elog(s, SPOT_LOG_ERR,
           "the trainer failed again (%s %d) and all %" PRId64
           " restarts are used: giving up; the last committed checkpoint "
           "is %s",
           f->crash_last_signal ? "signal" : "status",
           f->crash_last_signal ? f->crash_last_signal : f->crash_last_status,
           f->crash_used, last ? last : "none");
      e->exit_code = EXIT_SOFTWARE;
      return;
    }
    if (e->exit_code == 0 && f->upload_failed != NULL &&
        f->upload_failed[0] != '\0') {
      elog(s, SPOT_LOG_ERR,
           "the trainer finished but checkpoint %s could not be "
           "committed; the last committed checkpoint is %s",
           f->upload_failed, last ? last : "none");
      e->exit_code = EXIT_UNAVAILABLE;
    }
    return;
  }
  if (f->final == FINAL_COMMITTED && f->final_is_restored) {
    e->exit_code = stopped ? 0 : EXIT_PREEMPTED;
    elog(s, SPOT_LOG_NOTICE,
         "%s before the trainer made a step: the job resumes from "
         "checkpoint %s, which it started from; no work is lost",
         stopped ? "stopped" : "preempted", last);
    return;
  }
  if (f->final == FINAL_COMMITTED) {
    e->exit_code = stopped ? 0 : EXIT_PREEMPTED;
    elog(s, SPOT_LOG_NOTICE,
         "%s: the final checkpoint %s is committed; the job resumes "
         "from it",
         stopped ? "stopped" : "preempted", last);
    return;
  }
  e->exit_code = stopped ? 128 + e->stop_signal : EXIT_PREEMPTED;
  if (last != NULL && f->crash_interrupted) {
    /* Nothing ran to checkpoint: the newest commit is all there is, and
     * the failed trainer made no step since. */
    if (stopped)
      e->exit_code = 0;
    elog(s, SPOT_LOG_NOTICE,
         "%s while restarting the failed trainer (nothing was "
         "running): the job resumes from checkpoint %s (committed %s)",
         stopped ? "stopped" : "preempted", last, when);
    return;
  }
  if (last == NULL) {
    if (!stopped)
      e->exit_code = EXIT_NOTHING_SAVED;
    elog(s, SPOT_LOG_ERR,
         "%s: no checkpoint of job %s is committed: the next start "
         "begins from scratch",
         stopped ? "stopped" : "preempted", e->cfg.job);
  } else if (f->final == FINAL_NONE && !f->trainer_started) {
    elog(s, SPOT_LOG_NOTICE,
         "preempted before the trainer started: the job resumes from "
         "checkpoint %s (committed %s)",
         last, when);
  } else if (f->final_cut != NULL && f->final_cut[0] != '\0') {
    elog(s, SPOT_LOG_WARNING,
         "%s while the final checkpoint %s was being committed: the "
         "job resumes from it if LATEST names it, else from %s "
         "(committed %s) and the work since then is lost",
         stopped ? "stopped" : "preempted", f->final_cut, last, when);
  } else {
    elog(s, SPOT_LOG_WARNING,
         "%s without a final checkpoint: the job resumes from %s "
         "(committed %s); the work since then is lost",
         stopped ? "stopped" : "preempted", last, when);
  }
}

/* ---------------------------------------------------------- draining */

/* The final-checkpoint rule: whether the drain must still wait (for the
 * final checkpoint or an upload). A request the trainer can no longer
 * answer is given up (FINAL_GIVE_UP; ADVANCE then looks again). */
static bool
final_wait(struct step *s)
{
  const struct spotd_facts *f = s->f;

  switch (f->final) {
  case FINAL_REQUESTED:
    if (f->trainer_running || f->request_pending || !f->upload_idle)
      return true;
    cmd_text(s, SPOTD_CMD_FINAL_GIVE_UP,
             "the trainer exited without a final checkpoint");
    cmd(s, SPOTD_CMD_ADVANCE);
    return true;
  case FINAL_UPLOADING:
    return true;
  case FINAL_COMMITTED:
    return false;
  default:
    return !f->upload_idle; /* an older upload is still finishing */
  }
}

static void
start_drain(struct step *s, const char *reason, uint64_t deadline_mono,
            int64_t deadline_wall)
{
  struct spotd_engine *e = s->e;
  enum spotd_state from = e->state;

  spot_strlcpy(e->reason, reason, sizeof(e->reason));
  e->deadline_mono = deadline_mono;
  e->deadline_wall = deadline_wall;
  cmd(s, SPOTD_CMD_STOP_INTERVAL);
  /* A notice during a SIGTERM's drain starts it again, on its deadline. */
  if (from == SPOTD_DRAINING)
    enter_draining(s, from);
  else
    set_state(s, SPOTD_DRAINING);
}

static void
notice(struct step *s, const struct spot_notice *n, bool own)
{
  struct spotd_engine *e = s->e;
  char when[32] = "none";

  if (n->deadline_wall_ms != 0)
    spot_rfc3339_format(n->deadline_wall_ms, when, sizeof(when));
  elog(s, SPOT_LOG_NOTICE, "interruption notice: %s (%s) deadline %s id=%s",
       n->reason, spot_notice_kind_name(n->kind), when, n->id);
  cmd(s, SPOTD_CMD_HIST_NOTICE)->notice = n;
  if (n->kind == SPOT_NOTICE_REBALANCE) {
    /* Advisory: checkpoint early, keep training. */
    if (e->state == SPOTD_RUNNING)
      cmd_text(s, SPOTD_CMD_REQUEST_CHECKPOINT, "%s", n->reason);
    return;
  }
  if (own)
    cmd(s, SPOTD_CMD_PUBLISH)->notice = n;
  if (e->state == SPOTD_DRAINING && e->have_notice)
    return; /* already acting on one */
  e->have_notice = true;
  e->notice = *n;
  if (e->state == SPOTD_RESTARTING)
    cmd(s, SPOTD_CMD_ABANDON_RESTART);
  if (e->state == SPOTD_RUNNING || e->state == SPOTD_DRAINING ||
      e->state == SPOTD_RESTARTING)
    start_drain(s, n->reason, n->deadline_mono_ms, n->deadline_wall_ms);
  else if (e->state == SPOTD_CONNECTING || e->state == SPOTD_RESTORING)
    elog(s, SPOT_LOG_WARNING,
         "notice before the trainer started: it will not be started");
}

/* A notice the engine makes (a signal's, the operator's), ms from now. */
static struct spot_notice *
made_notice(struct step *s, uint64_t ms, const char *reason, const char *id)
{
  struct spot_notice *n = &s->e->made;

  memset(n, 0, sizeof(*n));
  n->provider = SPOT_PROVIDER_NONE;
  n->kind = SPOT_NOTICE_TERMINATE;
  n->deadline_wall_ms = s->ev->now_wall + (int64_t)ms;
  n->deadline_mono_ms = s->ev->now_mono + ms;
  spot_strlcpy(n->reason, reason, sizeof(n->reason));
  spot_strlcpy(n->id, id, sizeof(n->id));
  return n;
}

static void
operator_final(struct step *s)
{
  struct spot_notice *n;

  if (s->e->state != SPOTD_RUNNING)
    return;
  n = made_notice(s, SIGTERM_DRAIN_MS, "spotctl-final", "spotctl");
  cmd(s, SPOTD_CMD_PUBLISH)->notice = n;
  notice(s, n, false);
}

/* ------------------------------------------------------------ advance */

/* The drain is over: ack (Azure), relaunch step, then stop. Returns true
 * when the relaunch step runs (CLAIM, then RELAUNCH_ENDED follow). */
static bool
drained(struct step *s)
{
  struct spotd_engine *e = s->e;

  cmd(s, SPOTD_CMD_DISARM_DEADLINE);
  if (e->have_notice && e->notice.provider == SPOT_PROVIDER_AZURE &&
      e->notice.id[0] != '\0')
    cmd(s, SPOTD_CMD_ACK)->notice = &e->notice;
  if (e->cfg.relaunch && !e->drain_sigterm) {
    set_state(s, SPOTD_RELAUNCHING);
    return true;
  }
  set_state(s, SPOTD_STOPPING);
  return false;
}

static void
stop_trainer(struct step *s)
{
  uint64_t grace = s->e->cfg.grace_ms,
           left = spotd_engine_ms_left(s->e, s->ev->now_mono);

  if (left != UINT64_MAX) {
    left = left > DEADLINE_MARGIN_MS ? left - DEADLINE_MARGIN_MS : 0;
    if (left < grace)
      grace = left;
  }
  cmd(s, SPOTD_CMD_STOP_TRAINER)->ms = grace;
}

/* Trainer gone, uploads idle: release the job lease; LEASE_RELEASED ends
 * the run. */
static void
finish(struct step *s)
{
  if (!s->f->upload_idle)
    return;
  cmd(s, SPOTD_CMD_RELEASE_LEASE);
}

static void
advance(struct step *s)
{
  switch (s->e->state) {
  case SPOTD_DRAINING:
    if (final_wait(s) || drained(s))
      return;
    SPOT_FALLTHROUGH;
  case SPOTD_STOPPING:
    if (s->f->trainer_running) {
      stop_trainer(s);
      return;
    }
    finish(s);
    return;
  case SPOTD_RESTARTING:
    cmd(s, SPOTD_CMD_RESTART_ADVANCE);
    return;
  case SPOTD_FINISHING:
    finish(s);
    return;
  default:
    return;
  }
}

static void
lease_released(struct step *s)
{
  enum spotd_state st = s->e->state;

  if ((st != SPOTD_STOPPING && st != SPOTD_FINISHING) ||
      s->f->trainer_running || !s->f->upload_idle)
    return;
  decide_exit(s);
  set_state(s, SPOTD_EXITING);
}

static void
lease_lost(struct step *s)
{
  struct spotd_engine *e = s->e;

  cmd(s, SPOTD_CMD_CANCEL_UPLOADS);
  e->exit_code = EXIT_LEASE_LOST;
  if (!s->f->trainer_running) {
    fail(s, EXIT_LEASE_LOST);
    return;
  }
  /* The next holder may start its trainer from now on: not one more step
   * here. SIGSTOP cannot be caught; SIGKILL follows at once. The engine
   * goes to STOPPING from whatever it was doing: nothing is committed any
   * more, and TRAINER_EXITED ends it with exit 73. */
  cmd(s, SPOTD_CMD_FREEZE);
  cmd(s, SPOTD_CMD_STOP_TRAINER)->ms = 0;
  if (e->state != SPOTD_STOPPING && e->state != SPOTD_FINISHING)
    set_state(s, SPOTD_STOPPING);
}

static void
trainer_exited(struct step *s)
{
  struct spotd_engine *e = s->e;

  if (s->f->lease_lost) {
    fail(s, EXIT_LEASE_LOST);
    return;
  }
  if (e->exit_code < 0 && e->state == SPOTD_RUNNING)
    e->exit_code = s->ev->code;
  /* its requests end; a checkpoint completed just before the exit may
   * not have been seen */
  cmd(s, SPOTD_CMD_TRAINER_GONE);
  if (e->state == SPOTD_RUNNING && e->exit_code != 0) {
    /* a peer's preemption (JOB_NOTICE), or PEER_CHECKED */
    cmd(s, SPOTD_CMD_PEER_CHECK);
    return;
  }
  if (e->state == SPOTD_RUNNING)
    set_state(s, SPOTD_FINISHING);
  cmd(s, SPOTD_CMD_ADVANCE);
}

/* The trainer failed and nothing restarts it. */
static void
no_restart(struct step *s)
{
  struct spotd_engine *e = s->e;

  if (e->exit_code != 0 && e->cfg.max_restarts == 0)
    cmd_text(s, SPOTD_CMD_WARN,
             "the trainer failed (status %d): not relaunching", e->exit_code);
  set_state(s, SPOTD_FINISHING);
  advance(s);
}

/* The time a SIGTERM leaves: SPOTD_TERMINATION_GRACE seconds when set
 * (a Kubernetes pod sets it a little under its
 * terminationGracePeriodSeconds), else SIGTERM_DRAIN_MS. The final
 * checkpoint's estimate is checked against it (final_begin). With it set,
 * the SIGTERM is the node's reclaim and the exit status a preemption's
 * (decide_exit). */
static uint64_t
sigterm_grace_ms(struct step *s)
{
  struct spotd_engine *e = s->e;
  const char *v = e->cfg.termination_grace;
  int64_t sec;

  if (v == NULL || *v == '\0')
    return SIGTERM_DRAIN_MS;
  if (spot_parse_int64(v, 1, 86400, &sec) < 0) {
    elog(s, SPOT_LOG_WARNING,
         "SPOTD_TERMINATION_GRACE '%.20s' is not 1 to 86400 seconds: "
         "using %d s",
         v, SIGTERM_DRAIN_MS / 1000);
    return SIGTERM_DRAIN_MS;
  }
  elog(s, SPOT_LOG_INFO,
       "SIGTERM grace: %" PRId64 " s (SPOTD_TERMINATION_GRACE): the node "
       "is going away, this ends as a preemption",
       sec);
  e->sigterm_reclaim = true;
  return (uint64_t)sec * 1000;
}

/* The signal's drain as a notice, for the history and, multi-node, for
 * the other ranks (fanout.c): a drain of one rank (a Kubernetes node
 * drain, a Slurm or systemd stop) is the job's, with its deadline, so
 * every rank takes the final checkpoint instead of dying on the lost
 * peer. */
static const struct spot_notice *
signal_notice(struct step *s, uint64_t ms)
{
  struct spot_notice *n = made_notice(s, ms, "sigterm", "signal");
  char when[32] = "";

  spot_rfc3339_format(n->deadline_wall_ms, when, sizeof(when));
  elog(s, SPOT_LOG_NOTICE, "drain deadline %s%s", when,
       s->e->cfg.nranks > 1 ? ": the job's, told to the other ranks" : "");
  /* With a termination grace the node is going away: a preemption in the
   * history too. A plain stop stays a stop. */
  if (s->e->sigterm_reclaim)
    cmd(s, SPOTD_CMD_HIST_NOTICE)->notice = n;
  cmd(s, SPOTD_CMD_PUBLISH)->notice = n;
  return n;
}

static void
on_signal(struct step *s, int signum)
{
  struct spotd_engine *e = s->e;
  const struct spot_notice *n;
  uint64_t ms;

  e->signals_seen++;
  if (e->signals_seen > 1 || e->state < SPOTD_RUNNING) {
    elog(s, SPOT_LOG_WARNING, "signal %d: stopping now", signum);
    fail(s, 128 + signum);
    return;
  }
  /* Already acting on a notice: the signal is the same end arriving by
   * another road (Slurm SIGTERMs the job as soon as the requeue is
   * accepted). Finish that; keep its relaunch and its exit status. */
  if (e->have_notice && !e->drain_sigterm &&
      (e->state == SPOTD_DRAINING || e->state == SPOTD_RELAUNCHING ||
       e->state == SPOTD_STOPPING)) {
    elog(s, SPOT_LOG_NOTICE,
         "signal %d: already stopping for the %s notice, finishing "
         "that (again to stop now)",
         signum, e->reason);
    /* With the final checkpoint committed the trainer has nothing left to
     * do, and whoever sent this (Slurm at a requeue) kills what is left
     * once its own wait is over: stop the trainer now, so the job lease
     * is released while there is time (the next node need not wait for
     * its TTL). */
    if (s->f->final == FINAL_COMMITTED && s->f->trainer_running) {
      elog(s, SPOT_LOG_INFO,
           "the final checkpoint %s is committed: stopping the trainer "
           "now, then releasing the job lease",
           s->f->last_commit);
      cmd(s, SPOTD_CMD_STOP_TRAINER)->ms = 0;
    }
    return;
  }
  elog(s, SPOT_LOG_NOTICE,
       "signal %d: final checkpoint, then stop (again to stop now)", signum);
  e->drain_sigterm = true;
  e->stop_signal = signum;
  ms = sigterm_grace_ms(s);
  if (e->state != SPOTD_RUNNING && e->state != SPOTD_RESTARTING)
    return; /* finishing: the trainer ended by itself */
  n = signal_notice(s, ms);
  if (e->state == SPOTD_RESTARTING)
    cmd(s, SPOTD_CMD_ABANDON_RESTART);
  start_drain(s, "sigterm", n->deadline_mono_ms, n->deadline_wall_ms);
}

static void
launch(struct step *s)
{
  struct spotd_engine *e = s->e;

  cmd(s, SPOTD_CMD_FANOUT_START); /* multi-node: publishes a notice seen
                                     until now */
  if (e->have_notice) {
    /* The machine is going away: starting the trainer would only cost
     * the time left. Relaunch elsewhere and leave. */
    elog(s, SPOT_LOG_WARNING,
         "notice %s before the trainer started: not starting it",
         e->notice.reason);
    start_drain(s, e->notice.reason, e->notice.deadline_mono_ms,
                e->notice.deadline_wall_ms);
    return;
  }
  cmd_arg(s, SPOTD_CMD_START_TRAINER, 0);
}

/* ---------------------------------------------------------------- step */

void
spotd_engine_step(struct spotd_engine *e, const struct spotd_event *ev,
                  struct spotd_cmds *out)
{
  struct step s = {e, ev, &ev->facts, out, {0}};

  out->n = 0;
  out->dropped = 0;
  out->refused = false;
  if (e->state == SPOTD_EXITING) {
    if (ev->kind == SPOTD_EV_SIGNAL)
      elog(&s, SPOT_LOG_INFO, "signal %d: already exiting", ev->code);
    return; /* once closing, whatever still arrives does nothing */
  }
  switch (ev->kind) {
  case SPOTD_EV_STARTED:
    set_state(&s, SPOTD_CONNECTING);
    break;
  case SPOTD_EV_RESTORING:
    set_state(&s, SPOTD_RESTORING);
    break;
  case SPOTD_EV_LAUNCH:
    launch(&s);
    break;
  case SPOTD_EV_TRAINER_STARTED:
    set_state(&s, SPOTD_RUNNING);
    break;
  case SPOTD_EV_RESTART_BEGIN:
    set_state(&s, SPOTD_RESTARTING);
    break;
  case SPOTD_EV_RELAUNCH_TRAINER:
    if (e->state == SPOTD_RESTARTING)
      cmd_arg(&s, SPOTD_CMD_START_TRAINER, 1);
    break;
  case SPOTD_EV_NOTICE:
  case SPOTD_EV_JOB_NOTICE:
    if (ev->notice != NULL)
      notice(&s, ev->notice, ev->kind == SPOTD_EV_NOTICE);
    break;
  case SPOTD_EV_OPERATOR_FINAL:
    operator_final(&s);
    break;
  case SPOTD_EV_SIGNAL:
    on_signal(&s, ev->code);
    break;
  case SPOTD_EV_ADVANCE:
    advance(&s);
    break;
  case SPOTD_EV_DEADLINE:
    if (e->state != SPOTD_DRAINING)
      break;
    cmd(&s, SPOTD_CMD_FINAL_DEADLINE);
    cmd(&s, SPOTD_CMD_ADVANCE);
    break;
  case SPOTD_EV_TRAINER_EXITED:
    trainer_exited(&s);
    break;
  case SPOTD_EV_PEER_CHECKED:
    if (e->state == SPOTD_RUNNING)
      cmd(&s, SPOTD_CMD_TRY_RESTART);
    break;
  case SPOTD_EV_NO_RESTART:
    if (e->state == SPOTD_RUNNING)
      no_restart(&s);
    break;
  case SPOTD_EV_CLAIM:
    if (e->state != SPOTD_RELAUNCHING)
      break;
    if (ev->run_it) {
      cmd(&s, SPOTD_CMD_RUN_RELAUNCH);
      break;
    }
    SPOT_FALLTHROUGH;
  case SPOTD_EV_RELAUNCH_ENDED:
    if (e->state != SPOTD_RELAUNCHING)
      break;
    set_state(&s, SPOTD_STOPPING);
    advance(&s);
    break;
  case SPOTD_EV_LEASE_RELEASED:
    lease_released(&s);
    break;
  case SPOTD_EV_LEASE_LOST:
    lease_lost(&s);
    break;
  case SPOTD_EV_FAIL:
    fail(&s, ev->code);
    break;
  case SPOTD_EV_CLOSE:
    fail(&s, -1);
    break;
  default:
    break;
  }
}
