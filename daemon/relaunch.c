/* The relaunch step (--relaunch CMD): run once the drain is over, with
 * SPOTD_JOB, SPOTD_STORE, SPOTD_CHECKPOINT, SPOTD_REASON and
 * SPOTD_DEADLINE. One struct relaunch_step, enum relaunch_state:
 *   IDLE -> RUNNING -> SUCCEEDED | FAILED, and any -> CANCELLED on close.
 * Its own timer bounds it (60 s, or the deadline minus a margin); after
 * close neither its exit nor its timer does anything. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "core/fsm.h"
#include "hist.h"
#include "core/log.h"
#include "relaunch.h"
#include "spotd.h"
#include "core/util.h"

#define RELAUNCH_TIMEOUT_MS 60000
#define RELAUNCH_MARGIN_MS 1000

static const char *const names[] = {
    "idle", "running", "succeeded", "failed", "cancelled",
};
_Static_assert(SPOT_ARRAY_SIZE(names) == RELAUNCH_STATE_LAST, "names");

static const struct spot_fsm relaunch_fsm = {
    "relaunch step", names, RELAUNCH_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

const char *
relaunch_state_name(enum relaunch_state s)
{
  return spot_fsm_name(&relaunch_fsm, (unsigned)s);
}

#define set_state(r, s) set_state_at((r), (s), __FILE__, __LINE__)
static void
set_state_at(struct relaunch_step *r, enum relaunch_state s, const char *file,
             int line)
{
  if (spot_fsm_move(&relaunch_fsm, r->state, s, file, line) > 0)
    r->state = s;
}

static void
record(struct spotd *d, int status, bool ok)
{
  struct relaunch_step *r = &d->relaunch;
  struct relaunch_attempt *a;

  if (r->n == SPOT_PROTO_MAX_RELAUNCH) {
    memmove(r->attempts, r->attempts + 1,
            sizeof(r->attempts[0]) * (SPOT_PROTO_MAX_RELAUNCH - 1));
    r->n--;
  }
  a = &r->attempts[r->n++];
  a->wall_ms = spot_now_wall_ms();
  spot_strlcpy(a->reason, d->eng.reason, sizeof(a->reason));
  a->exit_status = status;
  a->ok = ok;
  hist_relaunched(d, ok);
}

static void
exit_cb(struct spot_child *c, void *data)
{
  struct spotd *d = data;
  struct relaunch_step *r = &d->relaunch;
  int st = spot_child_status(c);

  if (r->state != RELAUNCH_RUNNING || d->closing)
    return;
  uv_timer_stop(&r->timer);
  record(d, st, st == 0);
  set_state(r, st == 0 ? RELAUNCH_SUCCEEDED : RELAUNCH_FAILED);
  if (st == 0)
    log_info("relaunch step succeeded");
  else if (d->last_commit[0] != '\0')
    spotd_warn(d,
               "relaunch step failed with status %d (checkpoint %s stays "
               "committed)",
               st, d->last_commit);
  else
    spotd_warn(d,
               "relaunch step failed with status %d (no checkpoint of the "
               "job is committed)",
               st);
  spotd_relaunch_ended(d);
}

static void
timer_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, relaunch.timer);

  if (d->relaunch.state != RELAUNCH_RUNNING || d->closing)
    return;
  spotd_warn(d, "relaunch step timed out: killing it");
  spot_child_kill(&d->relaunch.child, SIGKILL);
}

static int
step_env(struct spotd *d, struct spot_env *e, const char *ckpt)
{
  char deadline[32] = "";
  int r = spot_env_init(e, false);

  if (d->eng.deadline_wall != 0)
    spot_rfc3339_format(d->eng.deadline_wall, deadline, sizeof(deadline));
  if (r == 0)
    r = spot_env_set(e, "SPOTD_JOB", "%s", d->cfg->job);
  if (r == 0)
    r = spot_env_set(e, "SPOTD_STORE", "%s", d->store_url);
  if (r == 0)
    r = spot_env_set(e, "SPOTD_CHECKPOINT", "%s", ckpt);
  if (r == 0)
    r = spot_env_set(e, "SPOTD_REASON", "%s", d->eng.reason);
  if (r == 0)
    r = spot_env_set(e, "SPOTD_DEADLINE", "%s", deadline);
  if (r < 0)
    spot_env_fini(e);
  return r;
}

static int
spawn(struct spotd *d, char **argv)
{
  struct relaunch_step *rs = &d->relaunch;
  struct spot_child_options o;
  struct spot_env env;
  uint64_t timeout = RELAUNCH_TIMEOUT_MS, left = spotd_ms_left(d);
  const char *ckpt = d->last_commit;
  int r;

  r = step_env(d, &env, ckpt);
  if (r < 0)
    return r;
  memset(&o, 0, sizeof(o));
  o.name = "relaunch step";
  o.argv = argv;
  o.env = env.v;
  o.grace_ms = 2000;
  o.exit_cb = exit_cb;
  o.data = d;
  log_info("relaunch: running '%s' (checkpoint %s, reason %s)",
           d->cfg->relaunch, ckpt[0] ? ckpt : "none", d->eng.reason);
  r = spot_child_spawn(&rs->child, &o);
  spot_env_fini(&env);
  if (r < 0)
    return r;
  set_state(rs, RELAUNCH_RUNNING);
  if (left < timeout)
    timeout = left > RELAUNCH_MARGIN_MS ? left - RELAUNCH_MARGIN_MS
                                        : RELAUNCH_MARGIN_MS;
  uv_timer_start(&rs->timer, timer_cb, timeout, 0);
  return 0;
}

int
relaunch_start(struct spotd *d)
{
  char **argv = NULL, err[256];
  int argc, r;

  r = spot_config_split_args(d->cfg->relaunch, &argv, &argc, err, sizeof(err));
  if (r < 0)
    spotd_warn(d, "relaunch: %s", err);
  else
    r = spawn(d, argv);
  spot_config_free_args(argv);
  if (r < 0) {
    set_state(&d->relaunch, RELAUNCH_FAILED);
    record(d, -1, false);
  }
  return r;
}

void
relaunch_close(struct spotd *d)
{
  struct relaunch_step *r = &d->relaunch;

  if (r->state == RELAUNCH_RUNNING)
    set_state(r, RELAUNCH_CANCELLED);
  spot_child_close(&r->child);
  if (r->timer.loop != NULL && !uv_is_closing((uv_handle_t *)&r->timer)) {
    uv_timer_stop(&r->timer);
    uv_close((uv_handle_t *)&r->timer, NULL);
  }
}
