/* guard.c: the guard, the process spotd starts instead of the command
 * (spot_child_shim_main(), child.h says what it guarantees): it starts
 * the command (contained: under an init in a pid namespace of its own),
 * reports its pid, freezes and kills the whole tree, and exits as the
 * command did. The rest of the child-process model is child.c. */
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
  struct spot_guard_report rep;
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
  spot_child_close_from(6);
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
