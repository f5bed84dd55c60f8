/* The training command, on lib/io/child.c: started by the guard in a
 * session of its own, with the checkpoint signal ignored (a trainer that
 * installs a handler overrides it), its whole process tree stopped with
 * SIGTERM then SIGKILL, nothing of it left when spotd exits or dies.
 * Checkpoint requests reach it through request.c. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "core/log.h"
#include "request.h"
#include "spotd.h"
#include "trainer.h"
#include "core/util.h"

static void
exit_cb(struct spot_child *c, void *data)
{
  struct spotd *d = data;
  char buf[16];

  (void)c;
  /* spotd starts it with the signal ignored: something reset that. */
  if (d->trainer.term_signal != 0 && d->trainer.term_signal == d->cfg->signal)
    spotd_warn(d,
               "the trainer pid=%d was killed by SIG%s, the checkpoint "
               "signal: its command resets the signal but installs no "
               "handler; install one (README, trainer contract)",
               (int)d->trainer.pid,
               spot_config_signal_name(d->cfg->signal, buf, sizeof(buf)));
  spotd_trainer_exited(d);
}

/* The trainer's environment (README "Environment of children"). */
static int
trainer_env(struct spotd *d, struct spot_env *e)
{
  int r = spot_env_init(e, false);

  if (r == 0)
    r = spot_env_set(e, "SPOTD_CKPT_DIR", "%s", d->ckpt_dir);
  if (r == 0 && d->resume_dir[0] != '\0')
    r = spot_env_set(e, "SPOTD_RESUME_DIR", "%s", d->resume_dir);
  if (r == 0)
    r = spot_env_set(e, "SPOTD_JOB", "%s", d->cfg->job);
  if (r == 0) {
    char sock[4200];

    /* Absolute: a trainer may change its directory (Hydra does). */
    r = spot_abs_path(d->cfg->socket, sock, sizeof(sock));
    if (r == 0)
      r = spot_env_set(e, "SPOTD_SOCKET", "%s", sock);
  }
  if (r == 0 && request_file(d) != NULL)
    r = spot_env_set(e, "SPOTD_REQUEST_FILE", "%s", request_file(d));
  if (r == 0 && request_file_id(d) != NULL)
    r = spot_env_set(e, SPOT_REQ_ENV_ID, "%s", request_file_id(d));
  if (r == 0)
    r = spot_env_set(e, "SPOTD_SIGNAL", "%d", d->cfg->signal);
  if (r == 0)
    r = spot_env_set(e, "SPOTD_RESTART_COUNT", "%lld",
                     (long long)d->restarts.count);
  if (r == 0)
    r = spot_env_set(e, "SPOTD_STORE", "%s", d->store_url);
  if (r == 0 && d->store.nranks > 1)
    r = spot_env_set(e, "SPOTD_RANK", "%u", d->store.rank);
  if (r == 0 && d->store.nranks > 1)
    r = spot_env_set(e, "SPOTD_NRANKS", "%u", d->store.nranks);
  if (r < 0)
    spot_env_fini(e);
  return r;
}

int
trainer_start(struct spotd *d)
{
  struct spot_child_options o;
  struct spot_env env;
  int r;

  request_trainer_starts(d);
  r = trainer_env(d, &env);
  if (r < 0)
    return log_err_errno(r, "the trainer's environment");
  memset(&o, 0, sizeof(o));
  o.name = "trainer";
  o.argv = d->argv;
  o.env = env.v;
  o.ignore_signal = d->cfg->signal;
  o.grace_ms = d->cfg->grace_ms;
  o.hold_fd = d->jl.lock_fd;
  o.exit_cb = exit_cb;
  o.data = d;
  r = spot_child_spawn(&d->trainer, &o);
  spot_env_fini(&env);
  if (r == 0)
    d->trainer_started = true;
  return r;
}

bool
trainer_running(const struct spotd *d)
{
  return spot_child_running(&d->trainer);
}

void
trainer_stop(struct spotd *d, uint64_t grace_ms)
{
  spot_child_stop(&d->trainer, grace_ms);
}
