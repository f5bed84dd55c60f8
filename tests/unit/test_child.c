/* lib/io/child.c in-process: the environment builder, and real children
 * spawned through the exec shim (this binary re-executed: main() hands
 * SPOT_CHILD_SHIM_ARG to spot_child_shim_main) on a real libuv loop. */
#include "cmocka-compat.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/child.h"

static const char *
env_get(const struct spot_env *e, const char *name)
{
  size_t len = strlen(name);

  for (size_t i = 0; i < e->n; i++)
    if (strncmp(e->v[i], name, len) == 0 && e->v[i][len] == '=')
      return e->v[i] + len + 1;
  return NULL;
}

static void
test_env(void **state)
{
  struct spot_env e;

  (void)state;
  setenv("NOTIFY_SOCKET", "/run/x", 1);
  setenv("WATCHDOG_USEC", "1", 1);
  setenv("LISTEN_FDS", "1", 1);
  setenv("INVOCATION_ID", "abc", 1);
  setenv("SPOTD_JOB", "inherited", 1);
  setenv("MY_VAR", "kept", 1);
  assert_int_equal(spot_env_init(&e, false), 0);
  assert_null(env_get(&e, "NOTIFY_SOCKET"));
  assert_null(env_get(&e, "WATCHDOG_USEC"));
  assert_null(env_get(&e, "LISTEN_FDS"));
  assert_null(env_get(&e, "INVOCATION_ID"));
  assert_null(env_get(&e, "SPOTD_JOB"));
  assert_string_equal(env_get(&e, "MY_VAR"), "kept");
  assert_int_equal(spot_env_set(&e, "SPOTD_JOB", "%s-%d", "j", 1), 0);
  assert_int_equal(spot_env_set(&e, "MY_VAR", "%s", "new"), 0);
  assert_string_equal(env_get(&e, "SPOTD_JOB"), "j-1");
  assert_string_equal(env_get(&e, "MY_VAR"), "new");
  assert_null(e.v[e.n]);
  spot_env_fini(&e);
  assert_int_equal(spot_env_init(&e, true), 0);
  assert_string_equal(env_get(&e, "SPOTD_JOB"), "inherited");
  assert_null(env_get(&e, "NOTIFY_SOCKET"));
  spot_env_fini(&e);
}

struct run {
  int calls;
  int status;
};

static void
exit_cb(struct spot_child *c, void *data)
{
  struct run *r = data;

  r->calls++;
  r->status = spot_child_status(c);
}

/* A loop, a child on it and its options: argv, grace, our exit_cb. */
static void
child_setup(uv_loop_t *loop, struct spot_child *c, struct spot_child_options *o,
            char **argv, uint64_t grace_ms, struct run *r)
{
  assert_int_equal(uv_loop_init(loop), 0);
  assert_int_equal(spot_child_init(c, loop), 0);
  memset(o, 0, sizeof(*o));
  o->name = "test";
  o->argv = argv;
  o->grace_ms = grace_ms;
  o->exit_cb = exit_cb;
  o->data = r;
}

/* The pid namespace of the last tree run_sh() started (its init's), 0
 * when it had none. */
static ino_t last_ns;

static ino_t
ns_of(pid_t pid)
{
  char path[64];
  struct stat st;

  snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
  return stat(path, &st) == 0 ? st.st_ino : 0;
}

/* Whether a process of pid namespace ns still runs. */
static bool
ns_has_procs(ino_t ns)
{
  struct spot_proc *v;
  size_t n;
  bool any = false;

  assert_int_equal(spot_proc_scan(&v, &n), 0);
  for (size_t i = 0; i < n; i++)
    if (v[i].state != 'Z' && ns_of(v[i].pid) == ns)
      any = true;
  free(v);
  return any;
}

/* The pid (as we see it) of the descendant of root whose pid is nspid in
 * its own pid namespace: a script's $$ in a tree with a pid namespace of
 * its own. 0 when none. */
static int
host_pid_under(pid_t root, int nspid)
{
  struct spot_proc *v;
  size_t n;
  int found = 0;

  assert_int_equal(spot_proc_tree(root, &v, &n), 0);
  for (size_t i = 0; i < n && found == 0; i++) {
    pid_t in;

    if (spot_proc_inner_pid(&v[i], &in) == 0 && in == nspid)
      found = v[i].pid;
  }
  free(v);
  return found;
}

/* Runs /bin/sh -c script to its end; returns the callback's record. */
static struct run
run_sh(const char *script, int ignore, uint64_t grace_ms)
{
  char *argv[] = {(char *)"/bin/sh", (char *)"-c", (char *)script, NULL};
  struct spot_child_options o;
  struct spot_child c;
  struct run r = {0, -1};
  uv_loop_t loop;

  child_setup(&loop, &c, &o, argv, grace_ms, &r);
  o.ignore_signal = ignore;
  assert_int_equal(spot_child_spawn(&c, &o), 0);
  last_ns = c.contained != SPOT_CHILD_CONTAIN_NONE ? ns_of(c.reaper_pid) : 0;
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(c.state, SPOT_CHILD_EXITED);
  spot_child_close(&c);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  return r;
}

static void
test_status_and_signal(void **state)
{
  struct run r;

  (void)state;
  r = run_sh("exit 3", 0, 1000);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, 3);
  /* the checkpoint signal ignored from the start survives exec */
  r = run_sh("kill -USR1 $$; exit 4", SIGUSR1, 1000);
  assert_int_equal(r.status, 4);
  r = run_sh("kill -USR1 $$; exit 4", 0, 1000);
  assert_int_equal(r.status, 128 + SIGUSR1);
  /* not found: one line and 127 */
  r = run_sh("exec /nonexistent/x", 0, 1000);
  assert_int_equal(r.status, 127);
}

/* A child that exited is spawned again (spotd restarts a failed trainer
 * with the same struct): each run reports its own status, and the loop
 * ends with no handle left over. */
static void
test_respawn(void **state)
{
  char *a1[] = {(char *)"/bin/sh", (char *)"-c", (char *)"exit 5", NULL};
  char *a2[] = {(char *)"/bin/sh", (char *)"-c", (char *)"exit 6", NULL};
  struct spot_child_options o;
  struct spot_child c;
  struct run r = {0, -1};
  uv_loop_t loop;

  (void)state;
  child_setup(&loop, &c, &o, a1, 1000, &r);
  assert_int_equal(spot_child_spawn(&c, &o), 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, 5);
  o.argv = a2;
  assert_int_equal(spot_child_spawn(&c, &o), 0);
  assert_true(spot_child_running(&c));
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(r.calls, 2);
  assert_int_equal(r.status, 6);
  spot_child_close(&c);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void
test_no_leaked_fds(void **state)
{
  char script[128];
  int p[2];
  struct run r;

  (void)state;
  assert_int_equal(pipe(p), 0); /* no O_CLOEXEC: the shim closes it */
  snprintf(script, sizeof(script),
           "test -e /proc/self/fd/%d && exit 1; test -e /proc/self/fd/%d "
           "&& exit 1; exit 0",
           p[0], p[1]);
  r = run_sh(script, 0, 1000);
  assert_int_equal(r.status, 0);
  close(p[0]);
  close(p[1]);
}

/* pid no longer runs (a zombie nobody reaped counts as gone) */
static bool
gone(int pid)
{
  char path[64], buf[256], *p;
  ssize_t n;
  int fd;

  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  fd = open(path, O_RDONLY);
  if (fd < 0)
    return true;
  n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0)
    return true;
  buf[n] = '\0';
  p = strrchr(buf, ')');
  return p == NULL || p[2] == 'Z' || p[2] == 'X';
}

static void
test_group_left_is_stopped(void **state)
{
  struct run r;
  char pidfile[] = "/tmp/test-child-XXXXXX";
  char script[200], buf[32] = "";
  int fd = mkstemp(pidfile), pid;

  (void)state;
  assert_true(fd >= 0);
  snprintf(script, sizeof(script), "sleep 30 & echo $! > %s; exit 0", pidfile);
  r = run_sh(script, 0, 300);
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, 0);
  assert_true(read(fd, buf, sizeof(buf) - 1) > 0);
  pid = (int)strtol(buf, NULL, 10);
  assert_true(pid > 0);
  if (last_ns != 0) /* $! is a pid of the tree's namespace: all gone */
    assert_false(ns_has_procs(last_ns));
  else
    assert_true(gone(pid));
  close(fd);
  unlink(pidfile);
}

static void
test_close_suppresses_callback(void **state)
{
  char *argv[] = {(char *)"/bin/sleep", (char *)"30", NULL};
  struct spot_child_options o;
  struct spot_child c;
  struct run r = {0, -1};
  uv_loop_t loop;

  (void)state;
  child_setup(&loop, &c, &o, argv, 0, &r);
  assert_int_equal(spot_child_spawn(&c, &o), 0);
  spot_child_close(&c);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(r.calls, 0);
  assert_int_equal(c.state, SPOT_CHILD_CLOSED);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* pid from the file a script wrote, once it is there (5 s at most). */
static int
read_pid_file(const char *path)
{
  char buf[32] = "";
  int fd = -1;

  /* up to 30 s: a loaded machine can take seconds to start a shell */
  for (int i = 0; i < 3000; i++) {
    fd = open(path, O_RDONLY);
    if (fd >= 0 && read(fd, buf, sizeof(buf) - 1) > 0 && strchr(buf, '\n'))
      break;
    if (fd >= 0)
      close(fd);
    fd = -1;
    usleep(10000);
  }
  if (fd >= 0)
    close(fd);
  return (int)strtol(buf, NULL, 10);
}

static bool
gone_within(int pid, int ms)
{
  for (int i = 0; i < ms / 10; i++) {
    if (gone(pid))
      return true;
    usleep(10000);
  }
  return gone(pid);
}

static void
stop_cb(uv_timer_t *t)
{
  spot_child_stop(t->data, 300);
  uv_close((uv_handle_t *)t, NULL);
}

static bool
in_tree(const struct spot_child *c, int pid)
{
  struct spot_proc *v;
  size_t n;
  bool in = false;

  assert_int_equal(spot_child_tree(c, &v, &n), 0);
  for (size_t i = 0; i < n; i++)
    in = in || v[i].pid == pid;
  free(v);
  return in;
}

/* Runs `sh -c body` with the pid file's name in $F (the worker writes
 * its pid there); once the worker runs, checks it is in the tree
 * (and re-parented to the guard if orphan), stops the child and checks
 * the worker is gone. */
static void
stop_tree_case(const char *body, bool orphan)
{
  char pidfile[] = "/tmp/test-child-XXXXXX", script[300];
  int fd = mkstemp(pidfile), worker;
  struct spot_child_options o;
  struct spot_child c;
  struct run r = {0, -1};
  struct spot_proc p;
  uv_loop_t loop;
  uv_timer_t t;
  char *argv[] = {(char *)"/bin/sh", (char *)"-c", script, NULL};

  assert_true(fd >= 0);
  close(fd);
  unlink(pidfile);
  snprintf(script, sizeof(script), "export F=%s; %s", pidfile, body);
  child_setup(&loop, &c, &o, argv, 300, &r);
  assert_int_equal(spot_child_spawn(&c, &o), 0);
  worker = host_pid_under(c.guard_pid, read_pid_file(pidfile));
  assert_true(worker > 0);
  for (int i = 0; orphan && i < 1000; i++) { /* the parent's exit */
    assert_int_equal(spot_proc_read(worker, &p), 0);
    if (p.ppid == c.reaper_pid)
      break;
    usleep(10000);
  }
  if (orphan) /* the guard, or the init of the tree's namespace, not PID 1 */
    assert_int_equal(p.ppid, c.reaper_pid);
  assert_true(in_tree(&c, worker));
  uv_timer_init(&loop, &t);
  t.data = &c;
  uv_timer_start(&t, stop_cb, 10, 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(r.calls, 1);
  assert_true(gone(worker));
  spot_child_close(&c);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  unlink(pidfile);
}

/* A worker in a session of its own (torch 2.x's torchrun starts each
 * worker so) that ignores SIGTERM: stopping still reaches it (SIGTERM
 * to the tree, then SIGKILL after the grace). */
static void
test_stop_reaches_other_sessions(void **state)
{
  (void)state;
  stop_tree_case("setsid /bin/sh -c 'trap \"\" TERM; echo $$ > $F.tmp; "
                 "mv $F.tmp $F; exec sleep 60' & wait",
                 false);
}

/* A worker whose parent exited (an orphan) is re-parented to the guard,
 * a child subreaper, and so stays in the tree, not under PID 1. */
static void
test_orphan_stays_in_tree(void **state)
{
  (void)state;
  /* the subshell exits at once: its setsid'd child is an orphan */
  stop_tree_case("(setsid /bin/sh -c 'echo $$ > $F.tmp; mv $F.tmp $F; "
                 "exec sleep 60' &); sleep 60",
                 true);
}

/* spotd SIGKILLed: its guard kills the job, in every session. Here a
 * forked process plays spotd. */
static void
test_parent_killed(void **state)
{
  char pidfile[] = "/tmp/test-child-XXXXXX", script[300];
  int fd = mkstemp(pidfile), worker, st;
  pid_t spotd;

  (void)state;
  assert_true(fd >= 0);
  close(fd);
  unlink(pidfile);
  snprintf(script, sizeof(script),
           "setsid /bin/sh -c 'trap \"\" TERM HUP; echo $$ > %s.tmp; "
           "mv %s.tmp %s; exec sleep 60' & wait",
           pidfile, pidfile, pidfile);
  spotd = fork();
  assert_true(spotd >= 0);
  if (spotd == 0) {
    char *argv[] = {(char *)"/bin/sh", (char *)"-c", script, NULL};
    struct spot_child_options o;
    struct spot_child c;
    uv_loop_t loop;

    if (uv_loop_init(&loop) != 0 || spot_child_init(&c, &loop) != 0)
      _exit(2);
    memset(&o, 0, sizeof(o));
    o.name = "test";
    o.argv = argv;
    o.grace_ms = 300;
    if (spot_child_spawn(&c, &o) != 0)
      _exit(3);
    uv_run(&loop, UV_RUN_DEFAULT);
    _exit(4);
  }
  worker = host_pid_under(spotd, read_pid_file(pidfile));
  assert_true(worker > 0);
  assert_false(gone(worker));
  kill(spotd, SIGKILL);
  assert_int_equal(waitpid(spotd, &st, 0), spotd);
  assert_true(gone_within(worker, 20000));
  unlink(pidfile);
}

int
main(int argc, char **argv)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_env),
      cmocka_unit_test(test_status_and_signal),
      cmocka_unit_test(test_respawn),
      cmocka_unit_test(test_no_leaked_fds),
      cmocka_unit_test(test_group_left_is_stopped),
      cmocka_unit_test(test_close_suppresses_callback),
      cmocka_unit_test(test_stop_reaches_other_sessions),
      cmocka_unit_test(test_orphan_stays_in_tree),
      cmocka_unit_test(test_parent_killed),
  };

  if (argc > 1 && strcmp(argv[1], SPOT_CHILD_SHIM_ARG) == 0)
    spot_child_shim_main(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
