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
#include <inttypes.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"
#include "io/child.h"
#include "io/proctree.h"

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

void
spot_child_close_from(int lowfd)
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
  spot_child_close_from(3);
  if (envp != NULL)
    execvpe(argv[0], argv, envp);
  else
    execvp(argv[0], argv);
  dprintf(STDERR_FILENO, "%s: cannot run '%s': %s\n",
          program_invocation_short_name, argv[0], strerror(errno));
  _exit(127);
}

/* ---------------------------------------------------------- spot_child */

static const char *const state_names[] = {
    "idle", "running", "stopping", "exited", "closed",
};
_Static_assert(SPOT_ARRAY_SIZE(state_names) == SPOT_CHILD_STATE_LAST,
               "state_names");

static const struct spot_fsm child_fsm = {
    "child", state_names, SPOT_CHILD_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

const char *
spot_child_state_name(enum spot_child_state s)
{
  return spot_fsm_name(&child_fsm, (unsigned)s);
}

#define set_state(c, s) set_state_at((c), (s), __FILE__, __LINE__)
static void
set_state_at(struct spot_child *c, enum spot_child_state s, const char *file,
             int line)
{
  if (spot_fsm_move_detail(&child_fsm, c->state, s, file, line, "%s pid=%d",
                           c->name, (int)c->pid) > 0)
    c->state = s;
}

int
spot_child_init(struct spot_child *c, uv_loop_t *loop)
{
  memset(c, 0, sizeof(*c));
  c->loop = loop;
  c->exit_status = -1;
  c->deadline_fd = -1;
  c->init_fd = -1;
  return uv_timer_init(loop, &c->timer);
}

/* The guard left: the command and everything it started are gone. */
static void
proc_closed_cb(uv_handle_t *h)
{
  struct spot_child *c =
      spot_container_of((uv_process_t *)h, struct spot_child, proc);

  c->proc_open = false;
}

/* ------------------------------------------------------------- orphans */

/* The guards that run (spotd's only children): any other child of this
 * process is an orphan of a guard that was killed, adopted as the child
 * subreaper spotd is. */
#define LIVE_GUARDS_MAX 8
static pid_t live_guards[LIVE_GUARDS_MAX];

static void
guard_register(pid_t pid, bool live)
{
  for (size_t i = 0; i < LIVE_GUARDS_MAX; i++)
    if (live ? live_guards[i] == 0 : live_guards[i] == pid) {
      live_guards[i] = live ? pid : 0;
      return;
    }
}

static bool
guard_is_live(pid_t pid)
{
  for (size_t i = 0; i < LIVE_GUARDS_MAX; i++)
    if (live_guards[i] == pid)
      return true;
  return false;
}

/* SIGKILL to every orphan (a child of ours that is no live guard) and
 * what it started; reaps those that are gone. How many still run. */
static int
orphans_kill(void)
{
  struct spot_proc *v;
  size_t n;
  pid_t self = getpid();
  int left = 0;

  if (spot_proc_scan(&v, &n) < 0)
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (v[i].ppid != self || guard_is_live(v[i].pid))
      continue;
    if (v[i].state == 'Z' || v[i].state == 'X') {
      (void)waitpid(v[i].pid, NULL, WNOHANG);
      continue;
    }
    left++;
    (void)spot_proc_kill_tree(v[i].pid, SIGKILL);
    (void)spot_proc_kill(&v[i], SIGKILL);
  }
  free(v);
  return left;
}

static void deliver_exit(struct spot_child *c);

/* 1 while the init of the tree's pid namespace has not ended (it ends
 * only once every process of the namespace is gone): SIGKILLed, its
 * namespace with it. 0 once it ended, or when there is none. */
static int
init_left(struct spot_child *c)
{
  struct pollfd pfd;

  if (c->init_fd < 0)
    return 0;
  pfd.fd = c->init_fd;
  pfd.events = POLLIN;
  pfd.revents = 0;
  if (poll(&pfd, 1, 0) == 1) {
    close(c->init_fd);
    c->init_fd = -1;
    /* came back to us with its guard killed: reaped here */
    (void)waitpid(c->reaper_pid, NULL, WNOHANG);
    return 0;
  }
  (void)syscall(SYS_pidfd_send_signal, c->init_fd, SIGKILL, NULL, 0);
  return 1;
}

static void
orphans_timer_cb(uv_timer_t *t)
{
  struct spot_child *c = spot_container_of(t, struct spot_child, timer);
  int left;

  if (c->state == SPOT_CHILD_CLOSED)
    return;
  left = orphans_kill() + init_left(c);
  if (left != 0) {
    if (spot_now_mono_ms() - c->orphans_since_ms >= 5000) {
      log_warn("%s pid=%d: %d processes of its tree survive SIGKILL: "
               "waiting for them",
               c->name, (int)c->pid, left);
      c->orphans_since_ms = spot_now_mono_ms();
    }
    uv_timer_start(&c->timer, orphans_timer_cb, 20, 0);
    return;
  }
  deliver_exit(c);
}

static void
exit_cb(uv_process_t *p, int64_t status, int term_signal)
{
  struct spot_child *c = spot_container_of(p, struct spot_child, proc);
  int left;

  if (c->state == SPOT_CHILD_CLOSED)
    return;
  /* The handle is done: closed now, so the same child can be spawned
   * again (a restarted trainer) without a second live handle on it. */
  uv_close((uv_handle_t *)&c->proc, proc_closed_cb);
  guard_register(c->guard_pid, false);
  if (c->deadline_fd >= 0) {
    close(c->deadline_fd);
    c->deadline_fd = -1;
  }
  c->exit_status = status;
  c->term_signal = term_signal;
  uv_timer_stop(&c->timer);
  /* A guard leaves once its tree is gone, unless it was killed: then
   * what it guarded is ours now (spotd is a child subreaper). Nothing of
   * the old tree may run when the exit is reported (a restart, a lease
   * release follow): it is killed, and waited for. */
  left = orphans_kill() + init_left(c);
  if (left != 0) {
    log_warn("%s pid=%d: its guard pid=%d was killed; %d processes of its "
             "tree came back to spotd: SIGKILL, and waiting for them",
             c->name, (int)c->pid, (int)c->guard_pid, left);
    c->orphans_since_ms = spot_now_mono_ms();
    uv_timer_start(&c->timer, orphans_timer_cb, 20, 0);
    return;
  }
  deliver_exit(c);
}

static void
deliver_exit(struct spot_child *c)
{
  int64_t status = c->exit_status;
  int term_signal = c->term_signal;

  if (term_signal != 0)
    log_info("%s pid=%d ended by signal %d", c->name, (int)c->pid, term_signal);
  else
    log_info("%s pid=%d exited with status %d", c->name, (int)c->pid,
             (int)status);
  set_state(c, SPOT_CHILD_EXITED);
  if (c->exit_cb != NULL)
    c->exit_cb(c, c->data);
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

/* The guard's report on fd, waited for at most timeout_ms: 0, or -1 (no
 * report: the guard ended, or the time is up). A signal (a child's
 * SIGCHLD: spotd is a subreaper) is no reason to give up: taken for "no
 * report" it left the job uncontained and the guard ending its tree. */
static int
wait_report(int fd, struct spot_guard_report *rep, int timeout_ms)
{
  uint64_t end = spot_now_mono_ms() + (uint64_t)timeout_ms;
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  ssize_t n;

  for (;;) {
    uint64_t now = spot_now_mono_ms();
    int r;

    if (now >= end)
      return -1;
    r = poll(&pfd, 1, (int)(end - now));
    if (r == 1)
      break;
    if (r < 0 && errno == EINTR)
      continue;
    return -1;
  }
  do
    n = read(fd, rep, sizeof(*rep));
  while (n < 0 && errno == EINTR);
  return n == (ssize_t)sizeof(*rep) ? 0 : -1;
}

int
spot_child_spawn(struct spot_child *c, const struct spot_child_options *o)
{
  uv_process_options_t po;
  uv_stdio_container_t stdio[6];
  struct spot_guard_report rep;
  pid_t cmd = 0;
  int rp[2], dp[2];
  static bool subreaper;
  char sig[16], parent[24], grace[24], self_path[64];
  char **args;
  size_t n = 0;
  int r;

  if (c->proc_open) {
    log_err("cannot start the %s: the previous one's handle is still open",
            o->name);
    return -EBUSY;
  }
  r = self_exe(self_path, sizeof(self_path));
  if (r < 0) {
    log_err_errno(r, "cannot start the %s: /proc/self/exe", o->name);
    return r;
  }
  /* Orphans of a guard that gets killed come to spotd, which ends them
   * before it reports the exit (exit_cb). */
  if (!subreaper && prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    subreaper = true;
  if (pipe2(rp, O_CLOEXEC) < 0)
    return log_err_errno(-errno, "cannot start the %s: pipe", o->name);
  if (pipe2(dp, O_CLOEXEC) < 0) {
    r = -errno;
    close(rp[0]);
    close(rp[1]);
    return log_err_errno(r, "cannot start the %s: pipe", o->name);
  }
  (void)fcntl(dp[1], F_SETFL, O_NONBLOCK);
  while (o->argv[n] != NULL)
    n++;
  args = calloc(n + 6, sizeof(char *));
  if (args == NULL) {
    close(rp[0]);
    close(rp[1]);
    close(dp[0]);
    close(dp[1]);
    return -ENOMEM;
  }
  snprintf(sig, sizeof(sig), "%d", o->ignore_signal);
  snprintf(parent, sizeof(parent), "%d", (int)getpid());
  snprintf(grace, sizeof(grace), "%" PRIu64, o->grace_ms);
  args[0] = (char *)"spotd-guard";
  args[1] = (char *)SPOT_CHILD_SHIM_ARG;
  args[2] = sig;
  args[3] = parent;
  args[4] = grace;
  memcpy(args + 5, o->argv, n * sizeof(char *));
  spot_strlcpy(c->name, o->name, sizeof(c->name));
  c->exit_cb = o->exit_cb;
  c->data = o->data;
  memset(&po, 0, sizeof(po));
  for (int i = 0; i < 3; i++) {
    stdio[i].flags = UV_INHERIT_FD;
    stdio[i].data.fd = i;
  }
  stdio[3].flags = UV_INHERIT_FD; /* the guard reports the command's pid */
  stdio[3].data.fd = rp[1];
  stdio[4].flags = UV_INHERIT_FD; /* the lease's local deadline */
  stdio[4].data.fd = dp[0];
  stdio[5].flags = UV_INHERIT_FD; /* held by the guard: the lease's lock */
  stdio[5].data.fd = o->hold_fd > 0 ? o->hold_fd : dp[0];
  po.file = self_path;
  po.args = args;
  po.env = (char **)o->env;
  po.exit_cb = exit_cb;
  po.stdio = stdio;
  po.stdio_count = 6;
  /* setsid(): the guard and the command get a session and group of their
   * own, away from spotd's terminal. */
  po.flags = UV_PROCESS_DETACHED;
  r = uv_spawn(c->loop, &c->proc, &po);
  c->proc_open = true; /* uv_spawn initialises the handle even on failure */
  free(args);
  close(rp[1]);
  close(dp[0]);
  if (r < 0) {
    close(dp[1]);
    close(rp[0]);
    log_err("cannot start the %s '%s': %s", c->name, o->argv[0],
            uv_strerror(r));
    return r;
  }
  /* The guard forks the command at once; like uv_spawn's own wait for
   * the exec, a wait for its pid (the guard's exit, if it cannot fork,
   * ends it at once). It makes the pid namespace, its init and /proc
   * first: on a loaded machine that took over 5 s, and a guard that
   * reports to a closed pipe ends the tree it just started. */
  memset(&rep, 0, sizeof(rep));
  if (wait_report(rp[0], &rep, 60000) < 0)
    memset(&rep, 0, sizeof(rep));
  close(rp[0]);
  cmd = rep.cmd;
  c->guard_pid = c->proc.pid;
  c->reaper_pid = rep.reaper > 0 ? rep.reaper : c->proc.pid;
  c->contained = (enum spot_child_contain)rep.contained;
  c->init_fd = -1;
  if (rep.reaper > 0 && rep.reaper != c->guard_pid)
    c->init_fd = (int)syscall(SYS_pidfd_open, rep.reaper, 0);
  guard_register(c->guard_pid, true);
  c->deadline_fd = dp[1];
  if (c->deadline_ms > 0)
    spot_child_set_deadline(c, c->deadline_ms);
  c->pid = cmd > 0 ? cmd : c->proc.pid;
  c->start_ms = spot_now_mono_ms();
  set_state(c, SPOT_CHILD_RUNNING);
  log_info("%s pid=%d started: %s (guard pid=%d%s)", c->name, (int)c->pid,
           o->argv[0], (int)c->guard_pid,
           c->contained == SPOT_CHILD_CONTAIN_NONE
               ? ", not contained: its processes outlive spotd and the guard "
                 "killed together"
               : ", in a pid namespace of its own");
  return 0;
}

void
spot_child_set_deadline(struct spot_child *c, uint64_t deadline_mono_ms)
{
  c->deadline_ms = deadline_mono_ms;
  if (c->deadline_fd >= 0 &&
      write(c->deadline_fd, &deadline_mono_ms, sizeof(deadline_mono_ms)) !=
          (ssize_t)sizeof(deadline_mono_ms))
    log_warn("%s pid=%d: cannot hand the lease deadline to its guard: %s",
             c->name, (int)c->pid, strerror(errno));
}

bool
spot_child_running(const struct spot_child *c)
{
  return c->state == SPOT_CHILD_RUNNING || c->state == SPOT_CHILD_STOPPING;
}

int
spot_child_kill(struct spot_child *c, int signum)
{
  if (!spot_child_running(c))
    return -ESRCH;
  return spot_proc_kill_tree(c->reaper_pid, signum);
}

int
spot_child_tree(const struct spot_child *c, struct spot_proc **out, size_t *n)
{
  if (!spot_child_running(c))
    return -ESRCH;
  return spot_proc_tree(c->reaper_pid, out, n);
}

bool
spot_child_is_leader(const struct spot_child *c, const struct spot_proc *p)
{
  return p->pid == c->pid && p->ppid == c->reaper_pid;
}

static void
kill_timer_cb(uv_timer_t *t)
{
  struct spot_child *c = spot_container_of(t, struct spot_child, timer);

  if (c->state != SPOT_CHILD_STOPPING)
    return;
  log_warn("%s pid=%d still running after the grace period: SIGKILL", c->name,
           (int)c->pid);
  spot_child_kill(c, SIGKILL);
}

void
spot_child_stop(struct spot_child *c, uint64_t grace_ms)
{
  if (c->state != SPOT_CHILD_RUNNING)
    return;
  set_state(c, SPOT_CHILD_STOPPING);
  log_info("stopping %s pid=%d: SIGTERM to its %d processes, SIGKILL in "
           "%.1f s",
           c->name, (int)c->pid, spot_child_kill(c, SIGTERM),
           (double)grace_ms / 1000.0);
  uv_timer_start(&c->timer, kill_timer_cb, grace_ms, 0);
}

void
spot_child_close(struct spot_child *c)
{
  if (c->loop == NULL || c->state == SPOT_CHILD_CLOSED)
    return;
  if (spot_child_running(c)) {
    spot_proc_kill_tree(c->guard_pid, SIGKILL);
    kill(c->guard_pid, SIGKILL); /* a guard left alone would do the same */
  }
  guard_register(c->guard_pid, false);
  if (c->deadline_fd >= 0) {
    close(c->deadline_fd);
    c->deadline_fd = -1;
  }
  if (c->init_fd >= 0) {
    close(c->init_fd);
    c->init_fd = -1;
  }
  set_state(c, SPOT_CHILD_CLOSED);
  uv_timer_stop(&c->timer);
  uv_close((uv_handle_t *)&c->timer, NULL);
  if (c->proc_open && !uv_is_closing((uv_handle_t *)&c->proc))
    uv_close((uv_handle_t *)&c->proc, proc_closed_cb);
}

int
spot_child_status(const struct spot_child *c)
{
  return c->term_signal != 0 ? 128 + c->term_signal : (int)c->exit_status;
}
