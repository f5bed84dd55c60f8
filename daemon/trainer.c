/* The training command: started in its own session (so its whole process
 * group can be signalled without touching spotd), asked to checkpoint with
 * a signal, stopped with SIGTERM and, after a grace period, SIGKILL. The
 * model is Neovim's proc.c. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "spotd.h"
#include "util.h"

#define ENV_MAX 4096

static void
exit_cb(uv_process_t *p, int64_t status, int term_signal)
{
  struct trainer *t = spot_container_of(p, struct trainer, proc);

  t->running = false;
  t->exit_status = status;
  t->term_signal = term_signal;
  uv_timer_stop(&t->kill_timer);
  if (term_signal != 0)
    log_info("trainer pid=%d ended by signal %d", (int)t->pid, term_signal);
  else
    log_info("trainer pid=%d exited with status %d", (int)t->pid, (int)status);
  spotd_trainer_exited(t->d);
}

static int env_add(char **env, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int
env_add(char **env, size_t *n, const char *fmt, ...)
{
  va_list ap;
  int r;

  if (*n + 1 >= ENV_MAX)
    return -E2BIG;
  va_start(ap, fmt);
  r = vasprintf(&env[*n], fmt, ap);
  va_end(ap);
  if (r < 0)
    return -ENOMEM;
  (*n)++;
  return 0;
}

int
trainer_start(struct trainer *t, struct spotd *d)
{
  uv_process_options_t o;
  uv_stdio_container_t stdio[3];
  char **env;
  size_t n = 0;
  int r = 0;

  memset(t, 0, sizeof(*t));
  t->d = d;
  t->exit_status = -1;
  r = uv_timer_init(d->loop, &t->kill_timer);
  if (r < 0)
    return r;
  env = calloc(ENV_MAX, sizeof(char *));
  if (env == NULL)
    return -ENOMEM;
  /* Our own variables win over inherited ones of the same name. */
  for (char **e = environ; *e != NULL && r == 0; e++)
    if (strncmp(*e, "SPOTD_", 6) != 0 &&
        strncmp(*e, "NOTIFY_SOCKET=", 14) != 0 &&
        strncmp(*e, "WATCHDOG_", 9) != 0 && strncmp(*e, "LISTEN_", 7) != 0)
      r = env_add(env, &n, "%s", *e);
  if (r == 0)
    r = env_add(env, &n, "SPOTD_CKPT_DIR=%s", d->ckpt_dir);
  if (r == 0 && d->resume_dir[0] != '\0')
    r = env_add(env, &n, "SPOTD_RESUME_DIR=%s", d->resume_dir);
  if (r == 0)
    r = env_add(env, &n, "SPOTD_JOB=%s", d->cfg->job);
  if (r == 0)
    r = env_add(env, &n, "SPOTD_SOCKET=%s", d->cfg->socket);
  if (r == 0)
    r = env_add(env, &n, "SPOTD_RESTART_COUNT=%lld",
                (long long)d->restart_count);
  if (r == 0)
    r = env_add(env, &n, "SPOTD_STORE=%s", d->store_url);
  if (r == 0 && d->store.nranks > 1)
    r = env_add(env, &n, "SPOTD_RANK=%u", d->store.rank);
  if (r == 0 && d->store.nranks > 1)
    r = env_add(env, &n, "SPOTD_NRANKS=%u", d->store.nranks);
  if (r < 0)
    goto out;

  memset(&o, 0, sizeof(o));
  stdio[0].flags = UV_INHERIT_FD;
  stdio[0].data.fd = 0;
  stdio[1].flags = UV_INHERIT_FD;
  stdio[1].data.fd = 1;
  stdio[2].flags = UV_INHERIT_FD;
  stdio[2].data.fd = 2;
  o.file = d->argv[0];
  o.args = d->argv;
  o.env = env;
  o.exit_cb = exit_cb;
  o.stdio = stdio;
  o.stdio_count = 3;
  /* setsid(): its own session and process group. */
  o.flags = UV_PROCESS_DETACHED;
  r = uv_spawn(d->loop, &t->proc, &o);
  /* uv_spawn initialises the handle even when it fails */
  t->proc_open = true;
  if (r < 0) {
    log_err("cannot start the training command '%s': %s", d->argv[0],
            uv_strerror(r));
    goto out;
  }
  t->running = true;
  t->pid = t->proc.pid;
  t->start_ms = spot_now_mono_ms();
  log_info("trainer pid=%d started: %s", (int)t->pid, d->argv[0]);
out:
  for (size_t i = 0; i < n; i++)
    free(env[i]);
  free(env);
  return r;
}

int
trainer_signal(struct trainer *t, int signum, bool group)
{
  int r;

  if (!t->running)
    return -ESRCH;
  r = uv_kill(group ? -t->pid : t->pid, signum);
  if (r < 0 && group) /* the group may be gone while the leader lingers */
    r = uv_kill(t->pid, signum);
  return r;
}

static void
kill_timer_cb(uv_timer_t *timer)
{
  struct trainer *t = spot_container_of(timer, struct trainer, kill_timer);

  if (!t->running)
    return;
  log_warn("trainer pid=%d still running after the grace period: SIGKILL",
           (int)t->pid);
  trainer_signal(t, SIGKILL, true);
}

void
trainer_stop(struct trainer *t, uint64_t grace_ms)
{
  if (!t->running || t->stop_sent)
    return;
  t->stop_sent = true;
  log_info("stopping trainer pid=%d: SIGTERM, SIGKILL in %.1f s", (int)t->pid,
           (double)grace_ms / 1000.0);
  trainer_signal(t, SIGTERM, true);
  uv_timer_start(&t->kill_timer, kill_timer_cb, grace_ms, 0);
}

void
trainer_close(struct trainer *t)
{
  struct spotd *d = t->d;

  if (d == NULL)
    return;
  if (t->running)
    trainer_signal(t, SIGKILL, true);
  if (!uv_is_closing((uv_handle_t *)&t->kill_timer)) {
    uv_close((uv_handle_t *)&t->kill_timer, NULL);
  }
  if (t->proc_open && !uv_is_closing((uv_handle_t *)&t->proc)) {
    uv_close((uv_handle_t *)&t->proc, NULL);
  }
}
