/* Child processes (child.h): environment, exec shim, libuv supervision. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "child.h"
#include "log.h"
#include "util.h"

/* ---------------------------------------------------------- environment */

/* The service manager's variables are spotd's, not its children's:
 * sd_notify socket, watchdog, socket activation, credentials. */
static const char *const private_prefixes[] = {
    "NOTIFY_SOCKET=",    "WATCHDOG_",
    "LISTEN_",           "MONITOR_",
    "TRIGGER_",          "INVOCATION_ID=",
    "MAINPID=",          "MANAGERPID=",
    "SYSTEMD_EXEC_PID=", "CREDENTIALS_DIRECTORY=",
};

bool
spot_env_private(const char *entry)
{
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(private_prefixes); i++)
    if (strncmp(entry, private_prefixes[i], strlen(private_prefixes[i])) == 0)
      return true;
  return false;
}

static int
env_push(struct spot_env *e, char *entry)
{
  if (e->n + 1 >= e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 64;
    char **v = realloc(e->v, cap * sizeof(char *));

    if (v == NULL) {
      free(entry);
      return -ENOMEM;
    }
    e->v = v;
    e->cap = cap;
  }
  e->v[e->n++] = entry;
  e->v[e->n] = NULL;
  return 0;
}

int
spot_env_init(struct spot_env *e, bool keep_spotd)
{
  memset(e, 0, sizeof(*e));
  for (char **p = environ; p != NULL && *p != NULL; p++) {
    char *dup;
    int r;

    if (spot_env_private(*p) || (!keep_spotd && strncmp(*p, "SPOTD_", 6) == 0))
      continue;
    dup = strdup(*p);
    r = dup == NULL ? -ENOMEM : env_push(e, dup);
    if (r < 0) {
      spot_env_fini(e);
      return r;
    }
  }
  if (e->v == NULL) { /* an empty environment: still a NULL-terminated one */
    e->v = calloc(1, sizeof(char *));
    if (e->v == NULL)
      return -ENOMEM;
    e->cap = 1;
  }
  return 0;
}

int
spot_env_set(struct spot_env *e, const char *name, const char *fmt, ...)
{
  size_t len = strlen(name);
  char *value = NULL, *entry = NULL;
  va_list ap;
  int r;

  va_start(ap, fmt);
  r = vasprintf(&value, fmt, ap);
  va_end(ap);
  if (r < 0)
    return -ENOMEM;
  r = asprintf(&entry, "%s=%s", name, value);
  free(value);
  if (r < 0)
    return -ENOMEM;
  for (size_t i = 0; i < e->n; i++)
    if (strncmp(e->v[i], name, len) == 0 && e->v[i][len] == '=') {
      free(e->v[i]);
      e->v[i] = entry;
      return 0;
    }
  return env_push(e, entry);
}

void
spot_env_fini(struct spot_env *e)
{
  for (size_t i = 0; i < e->n; i++)
    free(e->v[i]);
  free(e->v);
  memset(e, 0, sizeof(*e));
}

/* ----------------------------------------------------------------- exec */

static void
close_from(int lowfd)
{
  long max;

  if (close_range((unsigned)lowfd, ~0U, 0) == 0)
    return;
  max = sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > 65536)
    max = 65536;
  for (int fd = lowfd; fd < max; fd++)
    close(fd);
}

static int
pidfd_open_(pid_t pid)
{
  return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* The guard: a small process in the command's group that outlives nothing.
 * When the parent (spotd) dies before the command, it SIGKILLs the whole
 * group (PR_SET_PDEATHSIG reaches only the command itself, not the
 * workers a launcher started); when the command exits, it leaves. */
__attribute__((noreturn)) static void
guard_run(pid_t parent, pid_t leader)
{
  struct pollfd fds[2];
  int null = open("/dev/null", O_RDWR);

  for (int fd = 0; fd < 3 && null >= 0; fd++)
    dup2(null, fd);
  close_from(3);
  fds[0].fd = pidfd_open_(parent);
  fds[1].fd = pidfd_open_(leader);
  if (fds[0].fd < 0 || fds[1].fd < 0) {
    if (fds[0].fd < 0 && errno == ESRCH)
      kill(-getpgrp(), SIGKILL);
    _exit(0);
  }
  (void)prctl(PR_SET_NAME, "spotd-guard", 0, 0, 0);
  fds[0].events = fds[1].events = POLLIN;
  for (;;) {
    fds[0].revents = fds[1].revents = 0;
    if (poll(fds, 2, -1) < 0 && errno != EINTR)
      _exit(0);
    if (fds[0].revents != 0)
      break; /* spotd is gone */
    if (fds[1].revents != 0) {
      /* The command ended: leave, unless spotd died first. */
      fds[0].revents = 0;
      if (poll(fds, 1, 0) <= 0 || fds[0].revents == 0)
        _exit(0);
      break;
    }
  }
  kill(-getpgrp(), SIGKILL);
  _exit(0);
}

static void
guard_start(pid_t parent)
{
  pid_t leader = getpid(), pid = fork();

  if (pid == 0) {
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    guard_run(parent, leader);
  }
}

void
spot_child_exec(char *const argv[], char *const envp[],
                const struct spot_child_exec *x)
{
  if (x->pdeath_signal != 0) {
    if (prctl(PR_SET_PDEATHSIG, x->pdeath_signal) < 0 ||
        getppid() != x->parent) {
      dprintf(STDERR_FILENO, "%s: the parent of '%s' is gone\n",
              program_invocation_short_name, argv[0]);
      _exit(127);
    }
  }
  if (x->ignore_signal > 0) {
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    sigaction(x->ignore_signal, &sa, NULL);
  }
  if (x->guard)
    guard_start(x->parent);
  close_from(3);
  if (envp != NULL)
    execvpe(argv[0], argv, envp);
  else
    execvp(argv[0], argv);
  dprintf(STDERR_FILENO, "%s: cannot run '%s': %s\n",
          program_invocation_short_name, argv[0], strerror(errno));
  _exit(127);
}

/* argv: NAME SPOT_CHILD_SHIM_ARG IGNORE_SIGNAL PARENT_PID COMMAND... */
void
spot_child_shim_main(int argc, char **argv)
{
  struct spot_child_exec x;
  int64_t sig, parent;

  if (argc < 5 || spot_parse_int64(argv[2], 0, 64, &sig) < 0 ||
      spot_parse_int64(argv[3], 1, INT32_MAX, &parent) < 0) {
    dprintf(STDERR_FILENO, "spotd: internal: bad exec shim arguments\n");
    _exit(127);
  }
  memset(&x, 0, sizeof(x));
  x.parent = (pid_t)parent;
  x.pdeath_signal = SIGKILL;
  x.ignore_signal = (int)sig;
  x.guard = true;
  spot_child_exec(argv + 4, NULL, &x);
}

/* One /proc/PID/stat: "pid (comm) S ppid pgrp ...". */
static bool
proc_in_group(const char *pid, pid_t pgid)
{
  char path[64], buf[512], *p, st;
  long ppid, pgrp;
  ssize_t n;
  int fd;

  snprintf(path, sizeof(path), "/proc/%s/stat", pid);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0)
    return false;
  buf[n] = '\0';
  p = strrchr(buf, ')');
  if (p == NULL || sscanf(p + 1, " %c %ld %ld", &st, &ppid, &pgrp) != 3)
    return false;
  return pgrp == (long)pgid && st != 'Z' && st != 'X';
}

bool
spot_child_group_alive(pid_t pgid)
{
  struct dirent *de;
  bool alive = false;
  DIR *dir;

  if (kill(-pgid, 0) < 0 && errno == ESRCH)
    return false;
  dir = opendir("/proc");
  if (dir == NULL)
    return true; /* kill() says so */
  while (!alive && (de = readdir(dir)) != NULL)
    if (de->d_name[0] >= '1' && de->d_name[0] <= '9')
      alive = proc_in_group(de->d_name, pgid);
  closedir(dir);
  return alive;
}

/* ---------------------------------------------------------- spot_child */

#define REAP_POLL_MS 50
#define REAP_TERM_AFTER_MS                                                     \
  200                        /* a launcher's workers may exit on their own     \
                              */
#define REAP_GIVE_UP_MS 5000 /* after SIGKILL: unkillable (D state) */

static const char *const state_names[] = {
    "idle", "running", "stopping", "reaping", "exited", "closed",
};
_Static_assert(SPOT_ARRAY_SIZE(state_names) == SPOT_CHILD_STATE_LAST,
               "state_names");

const char *
spot_child_state_name(enum spot_child_state s)
{
  return (unsigned)s < SPOT_CHILD_STATE_LAST ? state_names[s] : "?";
}

static void
set_state(struct spot_child *c, enum spot_child_state s)
{
  if (c->state == s)
    return;
  log_debug("%s pid=%d: %s -> %s", c->name, (int)c->pid,
            spot_child_state_name(c->state), spot_child_state_name(s));
  c->state = s;
}

int
spot_child_init(struct spot_child *c, uv_loop_t *loop)
{
  memset(c, 0, sizeof(*c));
  c->loop = loop;
  c->exit_status = -1;
  return uv_timer_init(loop, &c->timer);
}

static void
finish(struct spot_child *c)
{
  uv_timer_stop(&c->timer);
  set_state(c, SPOT_CHILD_EXITED);
  if (c->exit_cb != NULL)
    c->exit_cb(c, c->data);
}

static void
reap_cb(uv_timer_t *t)
{
  struct spot_child *c = spot_container_of(t, struct spot_child, timer);
  uint64_t now = spot_now_mono_ms(), since = now - c->reap_start_ms;

  if (c->state != SPOT_CHILD_REAPING)
    return;
  if (!spot_child_group_alive(c->pid)) {
    finish(c);
    return;
  }
  if (!c->group_term_sent && since >= REAP_TERM_AFTER_MS) {
    log_warn("%s pid=%d exited but processes of its group still run: "
             "SIGTERM, SIGKILL in %.1f s",
             c->name, (int)c->pid, (double)c->grace_ms / 1000.0);
    c->group_term_sent = true;
    c->reap_start_ms = now - REAP_TERM_AFTER_MS;
    kill(-c->pid, SIGTERM);
  } else if (c->group_term_sent && !c->group_kill_sent &&
             since >= REAP_TERM_AFTER_MS + c->grace_ms) {
    log_warn("processes of the %s's group still run: SIGKILL", c->name);
    c->group_kill_sent = true;
    kill(-c->pid, SIGKILL);
  } else if (c->group_kill_sent &&
             since >= REAP_TERM_AFTER_MS + c->grace_ms + REAP_GIVE_UP_MS) {
    log_err("processes of the %s's group survive SIGKILL: leaving them",
            c->name);
    finish(c);
  }
}

static void
exit_cb(uv_process_t *p, int64_t status, int term_signal)
{
  struct spot_child *c = spot_container_of(p, struct spot_child, proc);

  if (c->state == SPOT_CHILD_CLOSED)
    return;
  c->exit_status = status;
  c->term_signal = term_signal;
  uv_timer_stop(&c->timer);
  if (term_signal != 0)
    log_info("%s pid=%d ended by signal %d", c->name, (int)c->pid, term_signal);
  else
    log_info("%s pid=%d exited with status %d", c->name, (int)c->pid,
             (int)status);
  if (!spot_child_group_alive(c->pid)) {
    finish(c);
    return;
  }
  /* Stopping already: the grace runs from the SIGTERM sent then. */
  c->reap_start_ms = c->state == SPOT_CHILD_STOPPING
                         ? c->reap_start_ms - REAP_TERM_AFTER_MS
                         : spot_now_mono_ms();
  set_state(c, SPOT_CHILD_REAPING);
  uv_timer_start(&c->timer, reap_cb, REAP_POLL_MS, REAP_POLL_MS);
}

/* The shim is this very binary, held open once (O_PATH): exec works even
 * after the file was replaced on disk (an upgrade), and under valgrind,
 * whose own binary /proc/self/exe would name at exec time, the open
 * resolves to the program. */
static int
self_exe(char *path, size_t size)
{
  static int fd = -1;

  if (fd < 0)
    fd = open("/proc/self/exe", O_PATH | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  snprintf(path, size, "/proc/self/fd/%d", fd);
  return 0;
}

int
spot_child_spawn(struct spot_child *c, const struct spot_child_options *o)
{
  uv_process_options_t po;
  uv_stdio_container_t stdio[3];
  char sig[16], parent[24], self_path[64];
  char **args;
  size_t n = 0;
  int r;

  r = self_exe(self_path, sizeof(self_path));
  if (r < 0) {
    log_err_errno(r, "cannot start the %s: /proc/self/exe", o->name);
    return r;
  }
  while (o->argv[n] != NULL)
    n++;
  args = calloc(n + 5, sizeof(char *));
  if (args == NULL)
    return -ENOMEM;
  snprintf(sig, sizeof(sig), "%d", o->ignore_signal);
  snprintf(parent, sizeof(parent), "%d", (int)getpid());
  args[0] = (char *)"spotd-exec";
  args[1] = (char *)SPOT_CHILD_SHIM_ARG;
  args[2] = sig;
  args[3] = parent;
  memcpy(args + 4, o->argv, n * sizeof(char *));
  spot_strlcpy(c->name, o->name, sizeof(c->name));
  c->exit_cb = o->exit_cb;
  c->data = o->data;
  c->grace_ms = o->grace_ms;
  memset(&po, 0, sizeof(po));
  for (int i = 0; i < 3; i++) {
    stdio[i].flags = UV_INHERIT_FD;
    stdio[i].data.fd = i;
  }
  po.file = self_path;
  po.args = args;
  po.env = (char **)o->env;
  po.exit_cb = exit_cb;
  po.stdio = stdio;
  po.stdio_count = 3;
  po.flags = UV_PROCESS_DETACHED; /* setsid(): its own session and group */
  r = uv_spawn(c->loop, &c->proc, &po);
  c->proc_open = true; /* uv_spawn initialises the handle even on failure */
  free(args);
  if (r < 0) {
    log_err("cannot start the %s '%s': %s", c->name, o->argv[0],
            uv_strerror(r));
    return r;
  }
  c->pid = c->proc.pid;
  c->start_ms = spot_now_mono_ms();
  set_state(c, SPOT_CHILD_RUNNING);
  log_info("%s pid=%d started: %s", c->name, (int)c->pid, o->argv[0]);
  return 0;
}

bool
spot_child_running(const struct spot_child *c)
{
  return c->state == SPOT_CHILD_RUNNING || c->state == SPOT_CHILD_STOPPING ||
         c->state == SPOT_CHILD_REAPING;
}

int
spot_child_signal(struct spot_child *c, int signum, bool group)
{
  int r;

  if (!spot_child_running(c))
    return -ESRCH;
  if (c->state == SPOT_CHILD_REAPING)
    return uv_kill(-c->pid, signum);
  r = uv_kill(group ? -c->pid : c->pid, signum);
  if (r < 0 && group) /* the group may be gone while the leader lingers */
    r = uv_kill(c->pid, signum);
  return r;
}

static void
kill_timer_cb(uv_timer_t *t)
{
  struct spot_child *c = spot_container_of(t, struct spot_child, timer);

  if (c->state != SPOT_CHILD_STOPPING)
    return;
  log_warn("%s pid=%d still running after the grace period: SIGKILL", c->name,
           (int)c->pid);
  spot_child_signal(c, SIGKILL, true);
}

void
spot_child_stop(struct spot_child *c, uint64_t grace_ms)
{
  if (c->state != SPOT_CHILD_RUNNING)
    return;
  set_state(c, SPOT_CHILD_STOPPING);
  c->grace_ms = grace_ms;
  c->group_term_sent = true;
  c->reap_start_ms = spot_now_mono_ms();
  log_info("stopping %s pid=%d: SIGTERM, SIGKILL in %.1f s", c->name,
           (int)c->pid, (double)grace_ms / 1000.0);
  spot_child_signal(c, SIGTERM, true);
  uv_timer_start(&c->timer, kill_timer_cb, grace_ms, 0);
}

void
spot_child_close(struct spot_child *c)
{
  if (c->loop == NULL || c->state == SPOT_CHILD_CLOSED)
    return;
  if (spot_child_running(c)) {
    kill(-c->pid, SIGKILL);
    kill(c->pid, SIGKILL);
  }
  set_state(c, SPOT_CHILD_CLOSED);
  uv_timer_stop(&c->timer);
  uv_close((uv_handle_t *)&c->timer, NULL);
  if (c->proc_open)
    uv_close((uv_handle_t *)&c->proc, NULL);
}

int
spot_child_status(const struct spot_child *c)
{
  return c->term_signal != 0 ? 128 + c->term_signal : (int)c->exit_status;
}
