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

#include "child.h"
#include "fsm.h"
#include "log.h"
#include "proctree.h"
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
  close_from(3);
  if (envp != NULL)
    execvpe(argv[0], argv, envp);
  else
    execvp(argv[0], argv);
  dprintf(STDERR_FILENO, "%s: cannot run '%s': %s\n",
          program_invocation_short_name, argv[0], strerror(errno));
  _exit(127);
}

/* ---------------------------------------------------------------- guard */

#define REAP_POLL_MS 50
/* After the command exits, what it left running gets this long to exit on
 * its own (a launcher's workers) before SIGTERM. */
#define REAP_TERM_AFTER_MS 200
#define REAP_GIVE_UP_MS 5000 /* after SIGKILL: unkillable (D state) */

struct guard {
  pid_t parent, cmd;
  uint64_t grace_ms;
  int cmd_status; /* wait status of the command, once it exited */
  bool cmd_done, term_sent, kill_sent;
  uint64_t cmd_done_ms;
  int deadline_fd;      /* spotd writes the lease's local deadline here */
  uint64_t deadline_ms; /* monotonic; 0: none */
  bool frozen;          /* the deadline passed: the tree is stopped */
  /* Contained: the tree's pid namespace, whose init (pid 1 there) is
   * g->init, our only child; the link is a socket to it. */
  pid_t init;
  int link;
};

/* What the guard reports to spotd on fd 3 once the command runs. */
struct guard_report {
  pid_t cmd;     /* the command, as spotd sees it */
  pid_t reaper;  /* the parent of the command: the init, or the guard */
  int contained; /* enum spot_child_contain */
};

/* Reaps every child that exited (the command and adopted orphans). */
static void
guard_reap(struct guard *g)
{
  int st;
  pid_t w;

  while ((w = waitpid(-1, &st, WNOHANG)) > 0)
    if (w == g->cmd && !g->cmd_done) {
      g->cmd_status = st;
      g->cmd_done = true;
      g->cmd_done_ms = spot_now_mono_ms();
    }
}

static bool
guard_tree_runs(void)
{
  struct spot_proc *v;
  size_t n;

  if (spot_proc_tree(getpid(), &v, &n) < 0)
    return false;
  free(v);
  return n > 0;
}

/* Leaves the way the command did: its exit status, or its signal. */
__attribute__((noreturn)) static void
guard_exit_like(int st)
{
  if (WIFSIGNALED(st)) {
    struct rlimit no_core = {0, 0};
    struct sigaction sa;
    sigset_t one;
    int sig = WTERMSIG(st);

    (void)setrlimit(RLIMIT_CORE, &no_core);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    sigaction(sig, &sa, NULL);
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    _exit(128 + sig);
  }
  _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
}

/* spotd is gone: nothing of the job may outlive it. */
__attribute__((noreturn)) static void
guard_kill_all(struct guard *g)
{
  if (g->init > 0) {
    /* The namespace's init killed: the kernel kills every process in it
     * and the init is reaped only once they are all gone. */
    kill(g->init, SIGKILL);
    while (waitpid(g->init, NULL, 0) < 0 && errno == EINTR)
      ;
    _exit(137);
  }
  for (int i = 0; i < 500; i++) { /* 5 s: then D-state processes win */
    int n = spot_proc_kill_tree(getpid(), SIGKILL);

    guard_reap(g);
    if (n <= 0 && !guard_tree_runs())
      break;
    usleep(10000);
  }
  _exit(137);
}

/* Whether every process of the tree is stopped (or gone). */
static bool
guard_tree_stopped(pid_t root)
{
  struct spot_proc *v;
  size_t n;
  bool all = true;

  if (spot_proc_tree(root, &v, &n) < 0)
    return false;
  for (size_t i = 0; i < n; i++)
    if (v[i].state != 'T' && v[i].state != 't')
      all = false;
  free(v);
  return all;
}

/* The job lease's local deadline passed and spotd did not renew it: its
 * loop may be stopped (a debugger, a freezer, swapping), so the guard
 * stops the tree itself, again until no process of it runs (one forked
 * meanwhile included). It stays stopped: spotd, once it runs, finds its
 * lease lost and kills it. */
static void
guard_freeze(struct guard *g)
{
  pid_t root = g->init > 0 ? g->init : getpid(); /* the init reaps on */
  int n = 0;

  g->frozen = true;
  for (int i = 0; i < 200; i++) {
    int k = spot_proc_kill_tree(root, SIGSTOP);

    if (k > 0)
      n += k;
    if (guard_tree_stopped(root))
      break;
    usleep(5000);
  }
  log_warn("the job lease's local deadline passed without a renewal from "
           "spotd: stopped the trainer's tree (SIGSTOP, %d signals)",
           n);
}

/* Reads the deadlines spotd wrote (the last counts). */
static void
guard_read_deadline(struct guard *g)
{
  uint64_t v;
  ssize_t r;

  while (g->deadline_fd >= 0 &&
         (r = read(g->deadline_fd, &v, sizeof(v))) != 0) {
    if (r == (ssize_t)sizeof(v)) {
      g->deadline_ms = v;
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
      return;
    close(g->deadline_fd); /* spotd is gone, or wrote garbage */
    g->deadline_fd = -1;
  }
  if (g->deadline_fd >= 0) { /* end of file */
    close(g->deadline_fd);
    g->deadline_fd = -1;
  }
}

/* The command exited: what it left gets SIGTERM, then SIGKILL after the
 * grace. True once the guard may leave. */
static bool
guard_reap_rest(struct guard *g)
{
  uint64_t since = spot_now_mono_ms() - g->cmd_done_ms;

  if (!guard_tree_runs())
    return true;
  if (!g->term_sent && since >= REAP_TERM_AFTER_MS) {
    log_warn("the command exited but processes it started still run: "
             "SIGTERM, SIGKILL in %.1f s",
             (double)g->grace_ms / 1000.0);
    g->term_sent = true;
    spot_proc_kill_tree(getpid(), SIGTERM);
  } else if (g->term_sent && !g->kill_sent &&
             since >= REAP_TERM_AFTER_MS + g->grace_ms) {
    log_warn("processes the command started still run: SIGKILL");
    g->kill_sent = true;
    spot_proc_kill_tree(getpid(), SIGKILL);
  } else if (g->kill_sent &&
             since >= REAP_TERM_AFTER_MS + g->grace_ms + REAP_GIVE_UP_MS) {
    log_err("processes the command started survive SIGKILL: leaving them");
    return true;
  }
  return false;
}

__attribute__((noreturn)) static void
guard_run(struct guard *g, int parent_fd, const sigset_t *all)
{
  struct pollfd fds[3];
  int sfd = signalfd(-1, all, SFD_CLOEXEC | SFD_NONBLOCK);

  if (sfd < 0)
    guard_kill_all(g);
  fds[0].fd = parent_fd;
  fds[1].fd = sfd;
  for (;;) {
    struct signalfd_siginfo si;
    int timeout = g->cmd_done ? REAP_POLL_MS : -1;

    if (g->deadline_ms > 0 && !g->frozen) {
      uint64_t now = spot_now_mono_ms();
      uint64_t ms = g->deadline_ms > now ? g->deadline_ms - now : 0;
      int left = ms > 60000 ? 60000 : (int)ms;

      timeout = timeout < 0 || left < timeout ? left : timeout;
    }
    fds[2].fd = g->deadline_fd;
    fds[0].events = fds[1].events = fds[2].events = POLLIN;
    fds[0].revents = fds[1].revents = fds[2].revents = 0;
    if (poll(fds, 3, timeout) < 0 && errno != EINTR)
      guard_kill_all(g);
    if (fds[0].revents != 0)
      guard_kill_all(g); /* spotd is gone */
    while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
      ; /* SIGCHLD, or a signal sent to the guard: only reaping matters */
    guard_read_deadline(g);
    if (g->deadline_ms > 0 && !g->frozen &&
        spot_now_mono_ms() >= g->deadline_ms)
      guard_freeze(g);
    if (g->init > 0) {
      int st, cst;

      if (waitpid(g->init, &st, WNOHANG) != g->init)
        continue;
      /* Its namespace is empty now. The init sent the command's status;
       * none: it was killed, and so was the command. */
      if (read(g->link, &cst, sizeof(cst)) == (ssize_t)sizeof(cst))
        st = cst;
      guard_exit_like(st);
    }
    guard_reap(g);
    if (g->cmd_done && guard_reap_rest(g))
      guard_exit_like(g->cmd_status);
  }
}

/* ------------------------------------------------------------ the init */

/* Writes a small /proc file of this process. */
static int
write_proc(const char *path, const char *text)
{
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  ssize_t n;

  if (fd < 0)
    return -errno;
  n = write(fd, text, strlen(text));
  close(fd);
  return n == (ssize_t)strlen(text) ? 0 : -EIO;
}

/* The next child of this process starts a pid namespace of its own (as
 * root, else in a user namespace of its own where this uid and gid map to
 * themselves). The contain mode got. */
static enum spot_child_contain
contain_unshare(void)
{
  char map[64];
  uid_t uid = geteuid();
  gid_t gid = getegid();

  if (unshare(CLONE_NEWPID) == 0)
    return SPOT_CHILD_CONTAIN_PIDNS;
  if (unshare(CLONE_NEWUSER | CLONE_NEWPID) < 0)
    return SPOT_CHILD_CONTAIN_NONE;
  snprintf(map, sizeof(map), "%u %u 1\n", (unsigned)uid, (unsigned)uid);
  if (write_proc("/proc/self/uid_map", map) < 0)
    return SPOT_CHILD_CONTAIN_NONE; /* the child would be nobody: no */
  (void)write_proc("/proc/self/setgroups", "deny");
  snprintf(map, sizeof(map), "%u %u 1\n", (unsigned)gid, (unsigned)gid);
  (void)write_proc("/proc/self/gid_map", map);
  return SPOT_CHILD_CONTAIN_USERNS;
}

/* In the namespace's init: a mount namespace of its own (mounts of the
 * machine still reach it) with a /proc of the tree's pid namespace, so
 * that the trainer's pids and its /proc agree. */
static int
init_mount_proc(void)
{
  if (unshare(CLONE_NEWNS) < 0 ||
      mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0 ||
      mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) <
          0)
    return -errno;
  return 0;
}

/* pid 1 of the tree's namespace. The kernel kills every process of the
 * namespace when it ends, and reaps it only once they are all gone; it
 * ends when the guard does (PR_SET_PDEATHSIG, even by SIGKILL) or when
 * the command exited and what it left was stopped. Every process of the
 * namespace is its descendant. It blocks every signal (spotd's signals go
 * to the command's tree, never to it) and only reaps. */
__attribute__((noreturn)) static void
init_main(int link, char *const argv[], int ignore_signal, uint64_t grace_ms,
          const sigset_t *old, const sigset_t *all)
{
  struct pollfd pfd;
  int status = 0, sfd, r;
  bool done = false, term_sent = false;
  uint64_t done_ms = 0;
  pid_t cmd;
  char c;

  pfd.fd = link;
  pfd.events = POLLIN;
  pfd.revents = 0;
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || poll(&pfd, 1, 0) != 0)
    _exit(127); /* the guard is gone already (the link hung up) */
  (void)prctl(PR_SET_NAME, "spotd-init", 0, 0, 0);
  close(3);
  close(4);
  r = init_mount_proc();
  if (r < 0)
    dprintf(STDERR_FILENO,
            "%s: '%s' sees the machine's /proc, not its own: %s\n",
            program_invocation_short_name, argv[0], strerror(-r));
  cmd = fork();
  if (cmd == 0) {
    struct spot_child_exec x;

    close(link);
    sigprocmask(SIG_SETMASK, old, NULL);
    setsid();
    memset(&x, 0, sizeof(x));
    x.parent = 1;
    x.pdeath_signal = SIGKILL;
    x.ignore_signal = ignore_signal;
    spot_child_exec(argv, NULL, &x);
  }
  /* The guard finds the command's pid as spotd sees it, then answers. */
  if (cmd < 0 || write(link, &cmd, sizeof(cmd)) != (ssize_t)sizeof(cmd) ||
      read(link, &c, 1) != 1)
    _exit(127);
  sfd = signalfd(-1, all, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0)
    _exit(127);
  pfd.fd = sfd;
  for (;;) {
    struct signalfd_siginfo si;
    pid_t w;
    int st;

    (void)poll(&pfd, 1, done ? REAP_POLL_MS : -1);
    while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
      ;
    while ((w = waitpid(-1, &st, WNOHANG)) > 0)
      if (w == cmd) {
        status = st;
        done = true;
        done_ms = spot_now_mono_ms();
      }
    if (!done)
      continue;
    if (w < 0 && errno == ECHILD)
      break; /* nothing left */
    if (!term_sent && spot_now_mono_ms() - done_ms >= REAP_TERM_AFTER_MS) {
      term_sent = true;
      kill(-1, SIGTERM); /* every process of the namespace but us */
    } else if (term_sent &&
               spot_now_mono_ms() - done_ms >= REAP_TERM_AFTER_MS + grace_ms) {
      break; /* our end SIGKILLs the rest, and waits for them */
    }
  }
  (void)write(link, &status, sizeof(status));
  _exit(0);
}

/* The guard, contained: the init is forked in the new pid namespace. 0
 * with g->init set, or negative errno. */
static int
guard_start_init(struct guard *g, char **argv, int ignore_signal,
                 const sigset_t *old, const sigset_t *all)
{
  int sv[2];
  pid_t pid;

  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return -errno;
  pid = fork();
  if (pid < 0) {
    int e = errno;

    close(sv[0]);
    close(sv[1]);
    return -e;
  }
  if (pid == 0) {
    close(sv[0]);
    init_main(sv[1], argv + 5, ignore_signal, g->grace_ms, old, all);
  }
  close(sv[1]);
  g->init = pid;
  g->link = sv[0];
  return 0;
}

/* The command's pid as spotd sees it: the init's child whose pid in the
 * namespace is inner. */
static pid_t
guard_find_cmd(pid_t init, pid_t inner)
{
  struct spot_proc *v;
  size_t n;
  pid_t found = 0;

  if (spot_proc_scan(&v, &n) < 0)
    return 0;
  for (size_t i = 0; i < n && found == 0; i++) {
    pid_t in;

    if (v[i].ppid == init && spot_proc_inner_pid(&v[i], &in) == 0 &&
        in == inner)
      found = v[i].pid;
  }
  free(v);
  return found;
}

enum spot_child_contain
spot_child_contain_probe(void)
{
  pid_t pid = fork();
  int st;

  if (pid == 0) {
    enum spot_child_contain m = contain_unshare();
    pid_t init;

    if (m == SPOT_CHILD_CONTAIN_NONE)
      _exit(SPOT_CHILD_CONTAIN_NONE);
    init = fork();
    if (init == 0)
      _exit(init_mount_proc() == 0 ? 0 : 1);
    if (init < 0 || waitpid(init, &st, 0) != init || !WIFEXITED(st))
      _exit(SPOT_CHILD_CONTAIN_NONE);
    _exit(WEXITSTATUS(st) == 0 ? (int)m : 8 + (int)m);
  }
  if (pid < 0)
    return SPOT_CHILD_CONTAIN_NONE;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return SPOT_CHILD_CONTAIN_NONE;
  if (!WIFEXITED(st))
    return SPOT_CHILD_CONTAIN_NONE;
  if (WEXITSTATUS(st) >= 8) {
    log_warn("the trainer's pid namespace gets no /proc of its own here "
             "(mount refused): its /proc shows the machine's processes");
    return (enum spot_child_contain)(WEXITSTATUS(st) - 8);
  }
  return (enum spot_child_contain)WEXITSTATUS(st);
}

/* argv: NAME SPOT_CHILD_SHIM_ARG IGNORE_SIGNAL PARENT_PID GRACE_MS
 * COMMAND...
 *
 * The guard: spotd starts it (in a session of its own) and it starts the
 * command. It is a child subreaper, so every process of the job, in any
 * session or process group, stays its descendant: spotd finds the job as
 * the guard's tree (proctree.h). It blocks every signal (a signal to its
 * process group or session reaches only the job), reaps, and:
 *  - when spotd dies (its pidfd), SIGKILLs the whole tree and leaves;
 *  - when the command exits, stops what the command left (SIGTERM, then
 *    SIGKILL after the grace) and leaves with the command's status or by
 *    its signal, so spotd sees the command's end as the guard's. */
void
spot_child_shim_main(int argc, char **argv)
{
  struct guard g;
  struct guard_report rep;
  sigset_t all, old;
  int64_t sig, parent, grace;
  int parent_fd;
  pid_t self;

  if (argc < 6 || spot_parse_int64(argv[2], 0, 64, &sig) < 0 ||
      spot_parse_int64(argv[3], 1, INT32_MAX, &parent) < 0 ||
      spot_parse_int64(argv[4], 0, INT64_MAX / 2, &grace) < 0) {
    dprintf(STDERR_FILENO, "spotd: internal: bad exec shim arguments\n");
    _exit(127);
  }
  memset(&g, 0, sizeof(g));
  g.parent = (pid_t)parent;
  g.grace_ms = (uint64_t)grace;
  g.deadline_fd = 4;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, &old);
  /* 3: the pipe that reports the command's pid; 4: the lease's local
   * deadline; 5: held, not used (the lease's lock, spot_lease_lock_hold:
   * the kernel drops it once spotd and this guard are both gone). */
  close_from(6);
  (void)fcntl(g.deadline_fd, F_SETFL, O_NONBLOCK);
  (void)fcntl(5, F_SETFD, FD_CLOEXEC);
  (void)fcntl(g.deadline_fd, F_SETFD, FD_CLOEXEC);
  parent_fd = (int)syscall(SYS_pidfd_open, g.parent, 0);
  if (parent_fd < 0 || getppid() != g.parent ||
      prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) {
    dprintf(STDERR_FILENO, "%s: cannot guard '%s': %s\n",
            program_invocation_short_name, argv[5],
            getppid() != g.parent ? "spotd is gone" : strerror(errno));
    _exit(127);
  }
  (void)fcntl(parent_fd, F_SETFD, FD_CLOEXEC);
  (void)prctl(PR_SET_NAME, "spotd-guard", 0, 0, 0);
  memset(&rep, 0, sizeof(rep));
  rep.contained = (int)contain_unshare();
  if (rep.contained != SPOT_CHILD_CONTAIN_NONE) {
    struct pollfd pfd;
    pid_t inner = 0;

    if (guard_start_init(&g, argv, (int)sig, &old, &all) < 0) {
      dprintf(STDERR_FILENO, "%s: cannot start '%s': %s\n",
              program_invocation_short_name, argv[5], strerror(errno));
      _exit(127);
    }
    pfd.fd = g.link;
    pfd.events = POLLIN;
    if (poll(&pfd, 1, 60000) != 1 ||
        read(g.link, &inner, sizeof(inner)) != (ssize_t)sizeof(inner))
      guard_kill_all(&g);
    rep.cmd = guard_find_cmd(g.init, inner);
    rep.reaper = g.init;
    if (rep.cmd <= 0)
      rep.cmd = g.init; /* gone already: the init stands for it */
    if (write(3, &rep, sizeof(rep)) != (ssize_t)sizeof(rep) ||
        write(g.link, "", 1) != 1)
      guard_kill_all(&g);
    close(3);
    guard_run(&g, parent_fd, &all);
  }
  self = getpid(); /* the command checks it after PR_SET_PDEATHSIG */
  g.cmd = fork();
  if (g.cmd < 0) {
    dprintf(STDERR_FILENO, "%s: cannot start '%s': %s\n",
            program_invocation_short_name, argv[5], strerror(errno));
    _exit(127);
  }
  if (g.cmd == 0) {
    struct spot_child_exec x;

    sigprocmask(SIG_SETMASK, &old, NULL);
    setsid(); /* the command leads a session and process group of its own */
    memset(&x, 0, sizeof(x));
    x.parent = self;
    x.pdeath_signal = SIGKILL; /* the guard SIGKILLed: the command too */
    x.ignore_signal = (int)sig;
    spot_child_exec(argv + 5, NULL, &x);
  }
  rep.cmd = g.cmd;
  rep.reaper = getpid();
  if (write(3, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
    guard_kill_all(&g); /* spotd cannot know the command: it is gone */
  close(3);
  guard_run(&g, parent_fd, &all);
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

int
spot_child_spawn(struct spot_child *c, const struct spot_child_options *o)
{
  uv_process_options_t po;
  uv_stdio_container_t stdio[6];
  struct guard_report rep;
  struct pollfd pfd;
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
  pfd.fd = rp[0];
  pfd.events = POLLIN;
  memset(&rep, 0, sizeof(rep));
  if (poll(&pfd, 1, 60000) != 1 ||
      read(rp[0], &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
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
