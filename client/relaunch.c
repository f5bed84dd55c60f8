/* spotctl relaunch: ask for new capacity once spotd has committed the final
 * checkpoint. spotd runs it as its relaunch step (--relaunch "spotctl
 * relaunch --backend slurm") with SPOTD_JOB, SPOTD_STORE, SPOTD_CHECKPOINT,
 * SPOTD_REASON and SPOTD_DEADLINE in the environment; restart automation
 * may call it by hand with the same variables.
 *
 * Backends:
 *   exec   run CMD (fork/execvp, its own process group) with those
 *          variables; its exit status is ours; SIGTERM then SIGKILL to its
 *          group when the time runs out.
 *   slurm  inside a Slurm job: `scontrol requeue $SLURM_JOB_ID`. With
 *          --hold or --exclude-node: `scontrol requeuehold`, then (for
 *          --exclude-node) `scontrol update JobId=.. ExcNodeList=..,NODE`,
 *          then `scontrol release`. Slurm refuses to change ExcNodeList of
 *          a running job, hence the hold. Busy answers (timeouts, "unable
 *          to contact the controller", ...) are retried with exponential
 *          backoff and jitter; a refusal is not.
 *
 * Time: everything (all attempts and backoffs) fits in one budget:
 * --timeout, else SPOTD_DEADLINE minus a margin, else 60 s.
 *
 * Idempotency: one marker file per preemption, named by a SHA-256 of
 * (job, checkpoint, reason, deadline), in --state-dir, $SPOTCTL_STATE_DIR,
 * $XDG_RUNTIME_DIR/spotd-relaunch or /tmp/spotd-relaunch-UID (a folder of
 * ours, mode 0700). The file is flock()ed while a relaunch runs and holds
 * one line once it succeeded; a second call for the same preemption finds
 * the line and does nothing (exit 0). A failed relaunch leaves the file
 * empty, so it can be retried. (spotd passes no SPOTD_* variable of its own
 * to the step but these five, hence SPOTCTL_STATE_DIR.) The marker is local
 * to the machine: it stops the daemon and a hand-run call from requeueing
 * twice, not two machines.
 *
 * Slurm kills the job (SIGTERM to its processes) as soon as the requeue is
 * accepted: this command ignores SIGTERM while the slurm backend runs, and
 * runs scontrol in a process group of its own, so that the marker is written
 * and a held job is released before KillWait ends.
 *
 * Blocking code (client style): children are waited for with sigtimedwait()
 * on SIGCHLD, with SIGCHLD, SIGTERM, SIGINT and SIGHUP blocked. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "core/util.h"
#include "io/child.h"
#include "relaunch_cloud.h"
#include "spotctl.h"

#define DEFAULT_TIMEOUT_MS 60000
#define DEADLINE_MARGIN_MS 5000
#define MIN_TIMEOUT_MS 5000
#define KILL_GRACE_MS 2000
#define SCONTROL_CALL_MS 20000
#define BACKOFF_BASE_MS 500
#define BACKOFF_CAP_MS 8000
#define DEFAULT_SLURM_RETRIES 5
#define OUT_MAX 4096
#define WAIT_SLICE_MS 200

enum backend {
  BACKEND_EXEC,
  BACKEND_SLURM,
  BACKEND_LAST,
};

static const char *const backend_names[] = {"exec", "slurm"};

struct relaunch {
  enum backend backend;
  bool dry_run, exclude_node, hold;
  int64_t timeout_s; /* < 0: default */
  int64_t retries;   /* < 0: default */
  const char *state_dir;
  char **cmd;
  int ncmd;
  /* the preemption, from spotd */
  const char *job, *store, *ckpt, *reason, *deadline;
  int64_t deadline_ms; /* wall clock, 0 = none */
  /* slurm */
  const char *slurm_job, *node;
  char scontrol[PATH_MAX];
  /* time budget on the monotonic clock */
  uint64_t end_mono;
  /* idempotency marker */
  char marker[PATH_MAX];
  int marker_fd;
  sigset_t blocked, old_mask;
  pid_t pid; /* ours, for the children's parent-death check */
  bool told_term;
};

struct child_result {
  int status; /* exit status, or 128 + signal */
  bool timed_out;
  bool interrupted;
  char out[OUT_MAX];
};

/* ------------------------------------------------------------ logging */

/* The first lines of a command's output as one line: "a; b" (at most
 * size-1 bytes). */
static const char *
one_line(const char *in, char *buf, size_t size)
{
  size_t o = 0;
  bool sep = false;

  for (const char *p = in; *p != '\0' && o + 3 < size; p++) {
    if (*p == '\n' || *p == '\r') {
      sep = o > 0;
      continue;
    }
    if (sep) {
      buf[o++] = ';';
      buf[o++] = ' ';
      sep = false;
    }
    buf[o++] = (*p >= 0x20 && *p != 0x7f) ? *p : '?';
  }
  buf[o] = '\0';
  if (o == 0)
    spot_strlcpy(buf, "(no output)", size);
  return buf;
}

static void
describe_status(const struct child_result *c, char *buf, size_t size)
{
  if (c->timed_out)
    snprintf(buf, size, "timed out: killed");
  else if (c->interrupted)
    snprintf(buf, size, "interrupted: stopped");
  else if (c->status > 128)
    snprintf(buf, size, "killed by signal %d", c->status - 128);
  else
    snprintf(buf, size, "exit status %d", c->status);
}

/* ------------------------------------------------------------- time */

static uint64_t
ms_left(const struct relaunch *r)
{
  uint64_t now = spot_now_mono_ms();

  return r->end_mono > now ? r->end_mono - now : 0;
}

/* A signal that arrived while waiting. The slurm backend keeps going on
 * SIGTERM (Slurm sends it to the whole job once the requeue is accepted);
 * exec passes it on to the command. Returns true when the caller must
 * stop. */
static bool
on_signal(struct relaunch *r, int sig)
{
  if (sig == SIGCHLD || sig < 0)
    return false;
  if (r->backend == BACKEND_SLURM && sig != SIGINT) {
    if (!r->told_term)
      relaunch_say(
          "signal %d ignored: finishing the requeue (Slurm stops the job "
          "once it is accepted)",
          sig);
    r->told_term = true;
    return false;
  }
  relaunch_say("signal %d: stopping", sig);
  return true;
}

/* Sleeps ms milliseconds; false when interrupted. */
static bool
pause_ms(struct relaunch *r, uint64_t ms)
{
  uint64_t end = spot_now_mono_ms() + ms;

  for (;;) {
    uint64_t now = spot_now_mono_ms();
    struct timespec ts;
    int sig;

    if (now >= end)
      return true;
    ts.tv_sec = (time_t)((end - now) / 1000);
    ts.tv_nsec = (long)((end - now) % 1000) * 1000000L;
    sig = sigtimedwait(&r->blocked, NULL, &ts);
    if (on_signal(r, sig))
      return false;
  }
}

/* ------------------------------------------------------------ children */

__attribute__((noreturn)) static void
child_exec(struct relaunch *r, char *const argv[], const char *path, int out_fd)
{
  static const int reset[] = {SIGTERM, SIGINT,  SIGHUP,  SIGQUIT,
                              SIGPIPE, SIGCHLD, SIGUSR1, SIGUSR2};
  struct sigaction sa;

  setpgid(0, 0);
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_DFL;
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(reset); i++)
    sigaction(reset[i], &sa, NULL);
  sigprocmask(SIG_SETMASK, &r->old_mask, NULL);
  if (out_fd >= 0) {
    if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(out_fd, STDERR_FILENO) < 0)
      _exit(127);
  }
  if (r->backend == BACKEND_EXEC) {
    /* lib/child.c, as spotd's children: the command does not outlive us
     * (spotd SIGKILLs a relaunch step that overruns its own limit), gets
     * no descriptor above 2 and none of the service manager's
     * variables. */
    struct spot_child_exec x = {.parent = r->pid, .pdeath_signal = SIGTERM};
    struct spot_env env;

    if (spot_env_init(&env, true) < 0)
      _exit(127);
    spot_child_exec(argv, env.v, &x);
  }
  /* scontrol is left to finish: a release must not die with us when
   * Slurm kills the job. */
  if (path != NULL)
    execv(path, argv);
  else
    execvp(argv[0], argv);
  dprintf(STDERR_FILENO, "spotctl relaunch: cannot run '%s': %s\n", argv[0],
          strerror(errno));
  _exit(127);
}

/* Runs argv (path, or a PATH lookup of argv[0] when path is NULL) in its own
 * process group until it exits or until the monotonic time limit, then
 * SIGTERM and, KILL_GRACE_MS later, SIGKILL to the group. With capture, its
 * stdout and stderr (first OUT_MAX-1 bytes) go to res->out. Returns 0 (the
 * outcome is in res) or negative errno when it could not be started. */
static int
run_child(struct relaunch *r, char *const argv[], const char *path,
          uint64_t limit, bool capture, struct child_result *res)
{
  int out_fd = -1, wst = 0, err;
  bool term_sent = false;
  pid_t pid;

  memset(res, 0, sizeof(*res));
  if (capture) {
    out_fd = memfd_create("spotctl-relaunch-out", MFD_CLOEXEC);
    if (out_fd < 0)
      return -errno;
  }
  fflush(NULL);
  pid = fork();
  if (pid < 0) {
    err = -errno;
    if (out_fd >= 0)
      close(out_fd);
    return err;
  }
  if (pid == 0)
    child_exec(r, argv, path, out_fd);
  setpgid(pid, pid); /* also done by the child: no race with killpg */

  for (;;) {
    uint64_t now = spot_now_mono_ms(), wait;
    struct timespec ts;
    pid_t w;
    int sig;

    w = waitpid(pid, &wst, WNOHANG);
    if (w == pid)
      break;
    if (w < 0 && errno != EINTR) {
      err = -errno;
      killpg(pid, SIGKILL);
      waitpid(pid, &wst, 0);
      if (out_fd >= 0)
        close(out_fd);
      return err;
    }
    if (now >= limit) {
      if (!term_sent) {
        if (!res->interrupted)
          res->timed_out = true;
        killpg(pid, SIGTERM);
        term_sent = true;
        limit = now + KILL_GRACE_MS;
        continue;
      }
      killpg(pid, SIGKILL);
      while (waitpid(pid, &wst, 0) < 0 && errno == EINTR)
        ;
      break;
    }
    wait = limit - now < WAIT_SLICE_MS ? limit - now : WAIT_SLICE_MS;
    ts.tv_sec = 0;
    ts.tv_nsec = (long)wait * 1000000L;
    sig = sigtimedwait(&r->blocked, NULL, &ts);
    if (on_signal(r, sig) && !term_sent) {
      res->interrupted = true;
      limit = 0; /* SIGTERM now, SIGKILL after the grace */
    }
  }
  /* Anything left in its group (a daemonised grandchild) goes too. */
  killpg(pid, SIGKILL);
  if (WIFSIGNALED(wst))
    res->status = 128 + WTERMSIG(wst);
  else
    res->status = WEXITSTATUS(wst);
  if (out_fd >= 0) {
    ssize_t n = pread(out_fd, res->out, sizeof(res->out) - 1, 0);
    res->out[n > 0 ? n : 0] = '\0';
    close(out_fd);
  }
  return 0;
}

/* ------------------------------------------------------------- marker */

/* A folder of ours: created 0700 if missing; must be a real directory
 * owned by us and not writable by others. */
static int
own_dir(const char *dir)
{
  struct stat st;

  if (mkdir(dir, 0700) < 0 && errno != EEXIST)
    return -errno;
  if (lstat(dir, &st) < 0)
    return -errno;
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) != 0)
    return -EPERM;
  return 0;
}

static int
marker_dir(const struct relaunch *r, char *buf, size_t size)
{
  const char *env;
  size_t n;

  if (r->state_dir != NULL)
    n = spot_strlcpy(buf, r->state_dir, size);
  else if ((env = getenv("SPOTCTL_STATE_DIR")) != NULL && env[0] != '\0')
    n = spot_strlcpy(buf, env, size);
  else if ((env = getenv("XDG_RUNTIME_DIR")) != NULL && env[0] == '/')
    n = (size_t)snprintf(buf, size, "%s/spotd-relaunch", env);
  else
    n = (size_t)snprintf(buf, size, "/tmp/spotd-relaunch-%u",
                         (unsigned)geteuid());
  return n < size ? 0 : -ENAMETOOLONG;
}

/* relaunch-<32 hex>: the first 128 bits of SHA-256(job NUL checkpoint NUL
 * reason NUL deadline). */
static int
marker_name(const struct relaunch *r, char *buf, size_t size)
{
  const char *parts[] = {r->job, r->ckpt, r->reason, r->deadline};
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int ok;

  if (ctx == NULL)
    return -ENOMEM;
  ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  for (size_t i = 0; ok && i < SPOT_ARRAY_SIZE(parts); i++)
    ok = EVP_DigestUpdate(ctx, parts[i], strlen(parts[i]) + 1);
  ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen);
  EVP_MD_CTX_free(ctx);
  if (!ok || mdlen < 16 || size < 9 + 33)
    return -EIO;
  spot_strlcpy(buf, "relaunch-", size);
  for (unsigned i = 0; i < 16; i++)
    snprintf(buf + 9 + 2 * i, 3, "%02x", md[i]);
  return 0;
}

static int
marker_path(struct relaunch *r)
{
  char dir[PATH_MAX], name[64];
  int e;

  if ((e = marker_dir(r, dir, sizeof(dir))) < 0 ||
      (e = marker_name(r, name, sizeof(name))) < 0)
    return e;
  if ((size_t)snprintf(r->marker, sizeof(r->marker), "%s/%s", dir, name) >=
      sizeof(r->marker))
    return -ENAMETOOLONG;
  return 0;
}

/* The marker's line when the relaunch is done, "" otherwise. */
static void
marker_read(int fd, char *buf, size_t size)
{
  ssize_t n = pread(fd, buf, size - 1, 0);

  buf[n > 0 ? n : 0] = '\0';
  buf[strcspn(buf, "\n")] = '\0';
}

/* Opens and locks the marker. Returns 0 (locked, not done), 1 (done
 * already: its line in done), or negative errno (no marker: the relaunch
 * goes on without idempotency, with a warning). */
static int
marker_open(struct relaunch *r, char *done, size_t size)
{
  char dir[PATH_MAX];
  int fd, e;

  r->marker_fd = -1;
  if ((e = marker_dir(r, dir, sizeof(dir))) < 0 || (e = own_dir(dir)) < 0)
    return e;
  fd = open(r->marker, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return -errno;
  /* Another call for the same preemption holds it while it runs: wait for
   * it within our budget. */
  while (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      e = -errno;
      close(fd);
      return e;
    }
    if (ms_left(r) == 0) {
      close(fd);
      return -EBUSY;
    }
    if (!pause_ms(r, 100)) {
      close(fd);
      return -EINTR;
    }
  }
  marker_read(fd, done, size);
  if (done[0] != '\0') {
    close(fd);
    return 1;
  }
  r->marker_fd = fd;
  return 0;
}

static void
marker_commit(struct relaunch *r, const char *what)
{
  char when[32] = "";
  int n;

  if (r->marker_fd < 0)
    return;
  spot_rfc3339_format(spot_now_wall_ms(), when, sizeof(when));
  n = dprintf(r->marker_fd,
              "relaunched at %s by %s (job %s, checkpoint %s, reason %s, "
              "deadline %s)\n",
              when, what, r->job, r->ckpt[0] ? r->ckpt : "none", r->reason,
              r->deadline[0] ? r->deadline : "none");
  if (n < 0 || fsync(r->marker_fd) < 0)
    relaunch_say("warning: cannot write the marker %s: %s", r->marker,
                 strerror(errno));
}

static void
marker_close(struct relaunch *r)
{
  if (r->marker_fd >= 0)
    close(r->marker_fd); /* also drops the lock */
  r->marker_fd = -1;
}

/* --------------------------------------------------------------- exec */

static void
cmd_line(char *const argv[], int argc, char *buf, size_t size)
{
  size_t o = 0;

  buf[0] = '\0';
  for (int i = 0; i < argc && o < size; i++)
    o += (size_t)snprintf(buf + o, size - o, "%s%s", i ? " " : "", argv[i]);
}

static int
backend_exec(struct relaunch *r, char *what, size_t what_size)
{
  struct child_result *c;
  char line[512], st[64];
  int64_t tries = r->retries < 0 ? 1 : r->retries + 1;
  int e;

  cmd_line(r->cmd, r->ncmd, line, sizeof(line));
  snprintf(what, what_size, "exec '%s'", line);
  c = calloc(1, sizeof(*c));
  if (c == NULL)
    return spotctl_fail("relaunch: out of memory");
  for (int64_t i = 1; i <= tries; i++) {
    relaunch_say("attempt %" PRId64 "/%" PRId64 ": running '%s' (%.1f s left)",
                 i, tries, line, (double)ms_left(r) / 1000.0);
    e = run_child(r, r->cmd, NULL, r->end_mono, false, c);
    if (e < 0) {
      free(c);
      return spotctl_fail("relaunch: cannot start '%s': %s", r->cmd[0],
                          strerror(-e));
    }
    describe_status(c, st, sizeof(st));
    relaunch_say("attempt %" PRId64 "/%" PRId64 ": '%s': %s", i, tries,
                 r->cmd[0], st);
    if (c->status == 0 && !c->timed_out && !c->interrupted) {
      free(c);
      return SPOTCTL_EXIT_OK;
    }
    if (c->timed_out || c->interrupted || c->status == 127 || i == tries)
      break;
    {
      uint64_t d = spot_backoff_ms((unsigned)(i - 1), BACKOFF_BASE_MS,
                                   BACKOFF_CAP_MS, spot_random_u32());
      if (d >= ms_left(r)) {
        relaunch_say("no time left for another attempt");
        break;
      }
      relaunch_say("retrying in %.1f s", (double)d / 1000.0);
      if (!pause_ms(r, d))
        break;
    }
  }
  e = c->status == 127 && !c->timed_out && !c->interrupted;
  free(c);
  if (e)
    return spotctl_fail("relaunch: '%s' could not be run (exit status 127)",
                        r->cmd[0]);
  return spotctl_fail("relaunch: '%s' failed: %s", line, st);
}

/* -------------------------------------------------------------- slurm */

/* Answers of a busy or unreachable controller, worth another try. */
static bool
slurm_transient(const char *out)
{
  static const char *const busy[] = {
      "timed out",
      "unable to contact slurm controller",
      "connection refused",
      "temporarily unavailable",
      "try again",
      "zero bytes were transmitted",
      "communication connection failure",
      "slurm backup controller in standby mode",
      "resource temporarily",
  };

  for (size_t i = 0; i < SPOT_ARRAY_SIZE(busy); i++)
    if (strcasestr(out, busy[i]) != NULL)
      return true;
  return false;
}

/* The job is requeued already (by an earlier attempt whose answer was lost,
 * or by someone else). */
static bool
slurm_already_pending(const char *out)
{
  return strcasestr(out, "job is pending execution") != NULL ||
         strcasestr(out, "already pending") != NULL;
}

enum {
  CALL_OK = 0,
  CALL_PENDING = 1, /* requeue: the job is pending already */
};

/* One scontrol request with retries on busy answers. Returns CALL_OK,
 * CALL_PENDING (with accept_pending) or -1 after printing why. The output
 * of the successful call is left in c->out. */
static int
scontrol(struct relaunch *r, char *const args[], bool accept_pending,
         struct child_result *c)
{
  char *argv[8], line[256], msg[512], st[64];
  int64_t tries = (r->retries < 0 ? DEFAULT_SLURM_RETRIES : r->retries) + 1;
  int n = 0, e;

  argv[n++] = (char *)"scontrol";
  for (int i = 0; args[i] != NULL && n < 7; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  cmd_line(argv, n, line, sizeof(line));
  for (int64_t i = 1; i <= tries; i++) {
    uint64_t left = ms_left(r), limit, d;

    if (left == 0) {
      relaunch_say("'%s': no time left", line);
      return -1;
    }
    limit = spot_now_mono_ms() +
            (left < SCONTROL_CALL_MS ? left : SCONTROL_CALL_MS);
    relaunch_say("attempt %" PRId64 "/%" PRId64 ": %s", i, tries, line);
    e = run_child(r, argv, r->scontrol, limit, true, c);
    if (e < 0) {
      relaunch_say("'%s': cannot run: %s", line, strerror(-e));
      return -1;
    }
    if (c->status == 0 && !c->timed_out && !c->interrupted) {
      relaunch_say("attempt %" PRId64 "/%" PRId64 ": %s: ok", i, tries, line);
      return CALL_OK;
    }
    describe_status(c, st, sizeof(st));
    one_line(c->out, msg, sizeof(msg));
    relaunch_say("attempt %" PRId64 "/%" PRId64 ": %s: %s: %s", i, tries, line,
                 st, msg);
    if (c->interrupted)
      return -1;
    if (accept_pending && slurm_already_pending(c->out)) {
      relaunch_say("job %s is pending already: requeued before", r->slurm_job);
      return CALL_PENDING;
    }
    if (!c->timed_out && !slurm_transient(c->out)) {
      spotctl_fail("relaunch: Slurm refused '%s': %s", line, msg);
      return -1;
    }
    if (i == tries)
      break;
    d = spot_backoff_ms((unsigned)(i - 1), BACKOFF_BASE_MS, BACKOFF_CAP_MS,
                        spot_random_u32());
    if (d >= ms_left(r)) {
      relaunch_say("no time left for another attempt");
      break;
    }
    relaunch_say("Slurm is busy: retrying in %.1f s", (double)d / 1000.0);
    if (!pause_ms(r, d))
      return -1;
  }
  spotctl_fail("relaunch: '%s' did not succeed (Slurm busy or unreachable): "
               "%s",
               line, msg);
  return -1;
}

/* ExcNodeList of `scontrol show job -o` output plus node, or "" when node
 * is excluded already. */
static int
merge_exclude(const char *show, const char *node, char *buf, size_t size)
{
  const char *p = strstr(show, " ExcNodeList=");
  size_t len, nlen = strlen(node);

  buf[0] = '\0';
  if (p == NULL)
    return (size_t)snprintf(buf, size, "%s", node) < size ? 0 : -ENOSPC;
  p += strlen(" ExcNodeList=");
  len = strcspn(p, " \n");
  if (len == 0 || (len == 6 && strncmp(p, "(null)", 6) == 0))
    return (size_t)snprintf(buf, size, "%s", node) < size ? 0 : -ENOSPC;
  /* already there as a whole element? */
  for (const char *q = p; q < p + len;) {
    size_t el = strcspn(q, ", \n");
    if (el > len - (size_t)(q - p))
      el = len - (size_t)(q - p);
    if (el == nlen && strncmp(q, node, nlen) == 0)
      return 0;
    q += el + 1;
  }
  return (size_t)snprintf(buf, size, "%.*s,%s", (int)len, p, node) < size
             ? 0
             : -ENOSPC;
}

static int
backend_slurm(struct relaunch *r, char *what, size_t what_size)
{
  struct child_result *c;
  char jobarg[64], upd_job[80], upd_exc[512], list[448];
  int rc = SPOTCTL_EXIT_FAIL, e;

  c = malloc(sizeof(*c));
  if (c == NULL)
    return spotctl_fail("relaunch: out of memory");
  spot_strlcpy(jobarg, r->slurm_job, sizeof(jobarg));
  snprintf(upd_job, sizeof(upd_job), "JobId=%s", r->slurm_job);

  if (!r->hold && !r->exclude_node) {
    char *req[] = {(char *)"requeue", jobarg, NULL};

    snprintf(what, what_size, "scontrol requeue %s", r->slurm_job);
    if (scontrol(r, req, true, c) >= 0) {
      relaunch_say(
          "job %s requeued: Slurm runs it again, and its spotd restores "
          "checkpoint %s",
          r->slurm_job, r->ckpt[0] ? r->ckpt : "(none)");
      rc = SPOTCTL_EXIT_OK;
    }
    free(c);
    return rc;
  }

  {
    char *req[] = {(char *)"requeuehold", jobarg, NULL};

    snprintf(what, what_size, "scontrol requeuehold/release %s%s", r->slurm_job,
             r->exclude_node ? " excluding the node" : "");
    if (scontrol(r, req, true, c) < 0) {
      free(c);
      return SPOTCTL_EXIT_FAIL;
    }
  }
  if (r->exclude_node) {
    char *show[] = {(char *)"show", (char *)"job", (char *)"-o", jobarg, NULL};

    e = -1;
    if (scontrol(r, show, false, c) == CALL_OK) {
      e = merge_exclude(c->out, r->node, list, sizeof(list));
      if (e < 0)
        relaunch_say(
            "warning: the excluded node list is too long: not excluding "
            "%s",
            r->node);
    }
    if (e == 0 && list[0] == '\0') {
      relaunch_say("node %s is excluded already", r->node);
    } else if (e == 0) {
      char *upd[] = {(char *)"update", upd_job, upd_exc, NULL};

      snprintf(upd_exc, sizeof(upd_exc), "ExcNodeList=%s", list);
      if (scontrol(r, upd, false, c) == CALL_OK)
        relaunch_say("job %s will not run on %s again", r->slurm_job, r->node);
      else
        relaunch_say("warning: job %s may come back on %s", r->slurm_job,
                     r->node);
    }
  }
  {
    char *rel[] = {(char *)"release", jobarg, NULL};

    if (scontrol(r, rel, false, c) == CALL_OK) {
      relaunch_say("job %s requeued and released: Slurm runs it again, and its "
                   "spotd restores checkpoint %s",
                   r->slurm_job, r->ckpt[0] ? r->ckpt : "(none)");
      rc = SPOTCTL_EXIT_OK;
    } else {
      spotctl_fail("relaunch: job %s is requeued but held: release it with "
                   "'scontrol release %s'",
                   r->slurm_job, r->slurm_job);
    }
  }
  free(c);
  return rc;
}

/* Where scontrol is on PATH. */
static int
find_scontrol(char *buf, size_t size)
{
  const char *path = getenv("PATH");
  const char *p;

  if (path == NULL || path[0] == '\0')
    path = "/usr/local/bin:/usr/bin:/bin";
  for (p = path; *p != '\0';) {
    size_t len = strcspn(p, ":");
    const char *dir = len ? p : ".";
    int dl = len ? (int)len : 1;

    if ((size_t)snprintf(buf, size, "%.*s/scontrol", dl, dir) < size &&
        access(buf, X_OK) == 0)
      return 0;
    p += len;
    if (*p == ':')
      p++;
  }
  return -ENOENT;
}

/* ---------------------------------------------------------- arguments */

static const char relaunch_usage[] =
    "Usage: spotctl relaunch --backend exec|slurm|aws|gcp [OPTIONS]\n"
    "                        [-- CMD [ARG...]]\n"
    "\n"
    "Ask for new capacity after spotd committed the final checkpoint. spotd\n"
    "runs it as its relaunch step; it can be run by hand with the same\n"
    "variables: SPOTD_JOB (the job id), SPOTD_STORE (the job root,\n"
    "s3://BUCKET/PREFIX/JOB: --store and the job id), SPOTD_CHECKPOINT,\n"
    "SPOTD_REASON, SPOTD_DEADLINE (RFC 3339, may be empty).\n"
    "\n"
    "Backends:\n"
    "  exec -- CMD...     run CMD with those variables; its status is ours\n"
    "  slurm              scontrol requeue $SLURM_JOB_ID (inside a job)\n"
    "  aws                EC2 CreateFleet in another pool (see\n"
    "                     'spotctl relaunch --backend aws --help')\n"
    "  gcp                GCE instances.insert (SPOT) in another zone\n"
    "                     ('spotctl relaunch --backend gcp --help')\n"
    "\n"
    "Options:\n"
    "  --backend NAME     exec, slurm, aws or gcp (required)\n"
    "  --dry-run          print what would be done, do nothing\n"
    "  --timeout SEC      time for everything (default: SPOTD_DEADLINE\n"
    "                     minus 5 s, else 60 s); then SIGTERM, SIGKILL\n"
    "  --retries N        retries of a busy scheduler (slurm, default 5)\n"
    "                     or of a failing CMD (exec, default 0)\n"
    "  --exclude-node     slurm: do not come back on $SLURMD_NODENAME\n"
    "                     (requeuehold, update ExcNodeList, release)\n"
    "  --hold             slurm: requeuehold, then release\n"
    "  --state-dir DIR    where the per-preemption markers live (default\n"
    "                     $SPOTCTL_STATE_DIR, "
    "$XDG_RUNTIME_DIR/spotd-relaunch,\n"
    "                     /tmp/spotd-relaunch-UID)\n"
    "\n"
    "A second call for the same preemption (job, checkpoint, reason,\n"
    "deadline) does nothing and says so. Exit status: 0 relaunched (or\n"
    "already), 1 failed, 2 usage.\n";

enum {
  OPT_BACKEND = 256,
  OPT_DRY_RUN,
  OPT_TIMEOUT,
  OPT_RETRIES,
  OPT_EXCLUDE,
  OPT_HOLD,
  OPT_STATE_DIR,
};

static int
parse_args(int argc, char **argv, struct relaunch *r)
{
  static const struct option opts[] = {
      {"backend", required_argument, NULL, OPT_BACKEND},
      {"dry-run", no_argument, NULL, OPT_DRY_RUN},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
      {"retries", required_argument, NULL, OPT_RETRIES},
      {"exclude-node", no_argument, NULL, OPT_EXCLUDE},
      {"hold", no_argument, NULL, OPT_HOLD},
      {"state-dir", required_argument, NULL, OPT_STATE_DIR},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char *backend = NULL;
  int c;

  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
    switch (c) {
    case 'h':
      fputs(relaunch_usage, stdout);
      return 1;
    case OPT_BACKEND:
      backend = optarg;
      break;
    case OPT_DRY_RUN:
      r->dry_run = true;
      break;
    case OPT_TIMEOUT:
      if (spot_parse_int64(optarg, 1, 86400, &r->timeout_s) < 0)
        return spotctl_usage("relaunch: --timeout: expected whole seconds "
                             "from 1 to 86400, got '%s'",
                             optarg);
      break;
    case OPT_RETRIES:
      if (spot_parse_int64(optarg, 0, 100, &r->retries) < 0)
        return spotctl_usage("relaunch: --retries: expected 0 to 100, got "
                             "'%s'",
                             optarg);
      break;
    case OPT_EXCLUDE:
      r->exclude_node = true;
      break;
    case OPT_HOLD:
      r->hold = true;
      break;
    case OPT_STATE_DIR:
      if (optarg[0] == '\0')
        return spotctl_usage("relaunch: --state-dir: empty path");
      r->state_dir = optarg;
      break;
    default:
      return spotctl_bad_option("relaunch", argv);
    }
  }
  if (backend == NULL)
    return spotctl_usage("relaunch: --backend exec|slurm|aws|gcp is "
                         "required");
  r->backend = BACKEND_LAST;
  for (int i = 0; i < BACKEND_LAST; i++)
    if (strcmp(backend, backend_names[i]) == 0)
      r->backend = (enum backend)i;
  if (r->backend == BACKEND_LAST)
    return spotctl_usage("relaunch: unknown backend '%s' (expected exec, "
                         "slurm, aws or gcp)",
                         backend);
  r->cmd = argv + optind;
  r->ncmd = argc - optind;
  if (r->backend == BACKEND_EXEC && r->ncmd == 0)
    return spotctl_usage("relaunch: the exec backend needs a command: "
                         "--backend exec -- CMD [ARG...]");
  if (r->backend != BACKEND_EXEC && r->ncmd > 0)
    return spotctl_usage("relaunch: unexpected argument '%s' (only the exec "
                         "backend takes a command)",
                         r->cmd[0]);
  if (r->backend != BACKEND_SLURM && (r->hold || r->exclude_node))
    return spotctl_usage("relaunch: --hold and --exclude-node are slurm "
                         "options");
  return 0;
}

/* The variables spotd passes. SPOTD_CHECKPOINT and SPOTD_DEADLINE may be
 * empty (no committed checkpoint, no deadline) but must be set. */
static int
read_env(struct relaunch *r)
{
  int rc = relaunch_read_env(&r->job, &r->store, &r->ckpt, &r->reason,
                             &r->deadline, &r->deadline_ms);

  if (rc != 0)
    return rc;
  if (r->backend == BACKEND_SLURM) {
    int64_t id;

    r->slurm_job = getenv("SLURM_JOB_ID");
    if (r->slurm_job == NULL || r->slurm_job[0] == '\0')
      return spotctl_fail("relaunch: not inside a Slurm job (SLURM_JOB_ID is "
                          "not set): the slurm backend requeues the job it "
                          "runs in");
    if (spot_parse_int64(r->slurm_job, 1, INT64_MAX, &id) < 0)
      return spotctl_fail("relaunch: SLURM_JOB_ID '%s' is not a job id",
                          r->slurm_job);
    r->node = getenv("SLURMD_NODENAME");
    if (r->exclude_node && (r->node == NULL || r->node[0] == '\0' ||
                            strpbrk(r->node, " ,=") != NULL))
      return spotctl_fail("relaunch: --exclude-node needs SLURMD_NODENAME "
                          "(the node this job runs on)");
    if (find_scontrol(r->scontrol, sizeof(r->scontrol)) < 0)
      return spotctl_fail("relaunch: scontrol not found in PATH (install "
                          "Slurm's client commands or fix PATH)");
  }
  return 0;
}

/* The budget: --timeout, else until the deadline minus a margin (at least
 * MIN_TIMEOUT_MS), else 60 s. */
static uint64_t
budget_ms(const struct relaunch *r)
{
  int64_t left;

  if (r->timeout_s > 0)
    return (uint64_t)r->timeout_s * 1000;
  if (r->deadline_ms == 0)
    return DEFAULT_TIMEOUT_MS;
  left = r->deadline_ms - spot_now_wall_ms() - DEADLINE_MARGIN_MS;
  return left > MIN_TIMEOUT_MS ? (uint64_t)left : MIN_TIMEOUT_MS;
}

static int
dry_run(struct relaunch *r, int mr)
{
  char line[512], done[512] = "";

  printf("job %s, store %s, checkpoint %s, reason %s, deadline %s\n", r->job,
         r->store, r->ckpt[0] ? r->ckpt : "(none)", r->reason,
         r->deadline[0] ? r->deadline : "(none)");
  if (mr == 0) {
    int fd = open(r->marker, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

    if (fd >= 0) {
      marker_read(fd, done, sizeof(done));
      close(fd);
    }
    printf("marker: %s (%s)\n", r->marker,
           done[0] ? "relaunched already" : "not relaunched yet");
  }
  if (done[0] != '\0') {
    printf("would do nothing: %s\n", done);
    return SPOTCTL_EXIT_OK;
  }
  printf("time budget: %.1f s\n", (double)budget_ms(r) / 1000.0);
  if (r->backend == BACKEND_EXEC) {
    cmd_line(r->cmd, r->ncmd, line, sizeof(line));
    printf("would run: %s\n", line);
  } else if (!r->hold && !r->exclude_node) {
    printf("would run: %s requeue %s\n", r->scontrol, r->slurm_job);
  } else {
    printf("would run: %s requeuehold %s\n", r->scontrol, r->slurm_job);
    if (r->exclude_node)
      printf("would run: %s update JobId=%s ExcNodeList=<current>,%s\n",
             r->scontrol, r->slurm_job, r->node);
    printf("would run: %s release %s\n", r->scontrol, r->slurm_job);
  }
  return SPOTCTL_EXIT_OK;
}

int
spotctl_cmd_relaunch(int argc, char **argv)
{
  struct relaunch r;
  struct sigaction sa;
  char done[512] = "", what[640] = "";
  int rc, mr;

  /* the cloud backends have their own options (relaunch_aws.c) */
  switch (spotctl_relaunch_cloud_backend(argc, argv)) {
  case 1:
    return spotctl_relaunch_aws(argc, argv);
  case 2:
    return spotctl_relaunch_gcp(argc, argv);
  default:
    break;
  }
  memset(&r, 0, sizeof(r));
  r.timeout_s = -1;
  r.retries = -1;
  r.marker_fd = -1;
  r.job = r.store = r.ckpt = r.reason = r.deadline = "";
  rc = parse_args(argc, argv, &r);
  if (rc != 0)
    return rc == 1 ? SPOTCTL_EXIT_OK : rc;
  rc = read_env(&r);
  if (rc != 0)
    return rc;
  if (r.ckpt[0] == '\0')
    relaunch_say(
        "warning: SPOTD_CHECKPOINT is empty: no committed checkpoint, the "
        "job restarts from its newest one in the store, if any");
  mr = marker_path(&r);
  if (r.dry_run)
    return dry_run(&r, mr);

  /* Children are reaped here: a SIGCHLD ignored by our parent would make
   * the kernel reap them instead. */
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = SIG_DFL;
  sigaction(SIGCHLD, &sa, NULL);
  r.pid = getpid();
  sigemptyset(&r.blocked);
  sigaddset(&r.blocked, SIGCHLD);
  sigaddset(&r.blocked, SIGTERM);
  sigaddset(&r.blocked, SIGINT);
  sigaddset(&r.blocked, SIGHUP);
  sigprocmask(SIG_BLOCK, &r.blocked, &r.old_mask);
  r.end_mono = spot_now_mono_ms() + budget_ms(&r);
  relaunch_say(
      "%s backend: job %s, checkpoint %s, reason %s, deadline %s, %.1f s "
      "budget",
      backend_names[r.backend], r.job, r.ckpt[0] ? r.ckpt : "(none)", r.reason,
      r.deadline[0] ? r.deadline : "(none)", (double)ms_left(&r) / 1000.0);

  if (mr == 0)
    mr = marker_open(&r, done, sizeof(done));
  if (mr == 1) {
    relaunch_say("nothing to do: this preemption was relaunched already (%s)",
                 done);
    return SPOTCTL_EXIT_OK;
  }
  if (mr == -EBUSY || mr == -EINTR) {
    return spotctl_fail("relaunch: another relaunch of this preemption is "
                        "still running (marker %s)",
                        r.marker);
  }
  if (mr < 0)
    relaunch_say("warning: no idempotency marker (%s%s%s): a second call would "
                 "relaunch again",
                 r.marker[0] ? r.marker : "state folder",
                 mr == -EPERM ? ": not a private folder of ours: " : ": ",
                 strerror(-mr));

  if (r.backend == BACKEND_EXEC)
    rc = backend_exec(&r, what, sizeof(what));
  else
    rc = backend_slurm(&r, what, sizeof(what));
  if (rc == SPOTCTL_EXIT_OK) {
    marker_commit(&r, what);
    relaunch_say("relaunch done (%s)", what);
  }
  marker_close(&r);
  return rc;
}
