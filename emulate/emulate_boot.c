/* spotd-emulate --boot-cmd CMD: the emulated cloud "boots" each
 * instance it launches. --boot-after SEC (default 1) after the launch, the
 * metadata service answers as the new instance (its id, type, zone, tags
 * or attributes; no notice) and CMD runs through /bin/sh -c in a process
 * group of its own, with SPOT_EMULATE_INSTANCE (the id or name) and
 * SPOT_EMULATE_URL (this emulator) in its environment: typically
 *   spotd run --job-from aws-tag --metadata-url "$SPOT_EMULATE_URL" ...
 * so one emulator rehearses a whole preemption cycle. When the emulator
 * stops, the booted commands get SIGTERM and are waited for (10 s, then
 * SIGKILL). */
#include "emulate_cloud.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"

#define BOOTS_MAX 16

struct boot_req {
  char id[96];
  bool gce;
};

static struct {
  pthread_mutex_t mu;
  const char *cmd;
  double after_s;
  char url[128];
  void (*clear)(void *);
  void *arg;
  pid_t pids[BOOTS_MAX];
  unsigned n;
  bool stopping;
} b = {.mu = PTHREAD_MUTEX_INITIALIZER};

void
emu_boot_setup(const char *cmd, double after_s, const char *url,
               void (*clear_notice)(void *), void *arg)
{
  b.cmd = cmd;
  b.after_s = after_s;
  spot_strlcpy(b.url, url, sizeof(b.url));
  b.clear = clear_notice;
  b.arg = arg;
}

static void
spawn(const char *id)
{
  char *argv[] = {(char *)"/bin/sh", (char *)"-c", (char *)b.cmd, NULL};
  char **env, e1[160], e2[200];
  size_t n = 0;
  posix_spawnattr_t at;
  pid_t pid;
  int r;

  while (environ[n] != NULL)
    n++;
  env = calloc(n + 3, sizeof(*env));
  if (env == NULL)
    return;
  for (size_t i = 0; i < n; i++)
    env[i] = environ[i];
  snprintf(e1, sizeof(e1), "SPOT_EMULATE_INSTANCE=%s", id);
  snprintf(e2, sizeof(e2), "SPOT_EMULATE_URL=%s", b.url);
  env[n] = e1;
  env[n + 1] = e2;
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&at, 0);
  {
    sigset_t none;

    sigemptyset(&none);
    posix_spawnattr_setsigmask(&at, &none);
  }
  r = posix_spawn(&pid, "/bin/sh", NULL, &at, argv, env);
  posix_spawnattr_destroy(&at);
  free(env);
  if (r != 0) {
    fprintf(stderr, "spotd-emulate: boot of %s: cannot run /bin/sh: %s\n", id,
            strerror(r));
    return;
  }
  printf("booted %s: pid %d\n", id, (int)pid);
  fflush(stdout);
  pthread_mutex_lock(&b.mu);
  if (b.n < BOOTS_MAX)
    b.pids[b.n++] = pid;
  pthread_mutex_unlock(&b.mu);
}

static void *
boot_thread(void *data)
{
  struct boot_req *q = data;
  struct timespec ts;
  bool ok;

  ts.tv_sec = (time_t)b.after_s;
  ts.tv_nsec = (long)((b.after_s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
    ;
  pthread_mutex_lock(&b.mu);
  ok = !b.stopping;
  pthread_mutex_unlock(&b.mu);
  if (ok)
    ok = q->gce ? emu_gce_boot(q->id) == 0 : emu_ec2_boot(q->id) == 0;
  if (ok && b.clear != NULL)
    b.clear(b.arg);
  if (ok)
    spawn(q->id);
  free(q);
  return NULL;
}

void
emu_boot_launched(const char *id, bool gce)
{
  struct boot_req *q;
  pthread_attr_t at;
  pthread_t t;

  if (b.cmd == NULL)
    return;
  q = calloc(1, sizeof(*q));
  if (q == NULL)
    return;
  spot_strlcpy(q->id, id, sizeof(q->id));
  q->gce = gce;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &at, boot_thread, q) != 0)
    free(q);
  pthread_attr_destroy(&at);
}

void
emu_boot_stop(void)
{
  uint64_t end;

  pthread_mutex_lock(&b.mu);
  b.stopping = true;
  for (unsigned i = 0; i < b.n; i++)
    kill(-b.pids[i], SIGTERM);
  pthread_mutex_unlock(&b.mu);
  end = spot_now_mono_ms() + 10000;
  for (unsigned i = 0; i < b.n; i++) {
    int st;

    while (waitpid(b.pids[i], &st, WNOHANG) == 0) {
      struct timespec ts = {0, 50 * 1000000L};

      if (spot_now_mono_ms() > end) {
        kill(-b.pids[i], SIGKILL);
        waitpid(b.pids[i], &st, 0);
        break;
      }
      nanosleep(&ts, NULL);
    }
  }
}
