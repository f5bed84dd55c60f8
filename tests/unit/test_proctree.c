/* lib/io/proctree.c: the /proc parsers on fixed texts, the tree rules
 * (re-parenting, a reused pid), a scan of a fake /proc larger than any
 * old cap, and real processes: a child that catches
 * a signal, one that does not, a grandchild in a session of its own. */
#include "cmocka-compat.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"
#include "io/proctree.h"

static void
test_parse_stat(void **state)
{
  struct spot_proc p;
  /* A command name with spaces and parentheses: the last ')' ends it. */
  const char *t = "4242 (a (b) c) S 17 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 "
                  "0 20 0 1 0 123456 1000 100 18446744073709551615\n";

  (void)state;
  assert_int_equal(spot_proc_parse_stat(t, &p), 0);
  assert_int_equal(p.pid, 4242);
  assert_int_equal(p.ppid, 17);
  assert_int_equal(p.state, 'S');
  assert_int_equal(p.start, 123456);
  assert_int_equal(spot_proc_parse_stat("", &p), -EINVAL);
  assert_int_equal(spot_proc_parse_stat("12 (x) S 1 2 3", &p), -EINVAL);
  assert_int_equal(spot_proc_parse_stat("x (y) S 1 2 3 4 5 6 7 8 9 10 11 12 "
                                        "13 14 15 16 17 18 19 20",
                                        &p),
                   -EINVAL);
}

static void
test_parse_sigmask(void **state)
{
  const char *status = "Name:\tpython3\nSigQ:\t0/95000\n"
                       "SigPnd:\t0000000000000000\nSigBlk:\t0000000000000000\n"
                       "SigIgn:\t0000000001001000\nSigCgt:\t0000002100000202\n";
  uint64_t m = 0;

  (void)state;
  assert_int_equal(spot_proc_parse_sigmask(status, "SigCgt", &m), 0);
  assert_true(spot_proc_mask_has(m, SIGUSR1)); /* bit 9 */
  assert_true(spot_proc_mask_has(m, SIGINT));  /* bit 1 */
  assert_true(spot_proc_mask_has(m, 38));      /* bit 37: RTMIN+4 */
  assert_false(spot_proc_mask_has(m, SIGUSR2));
  assert_false(spot_proc_mask_has(m, 0));
  assert_false(spot_proc_mask_has(m, 65));
  assert_int_equal(spot_proc_parse_sigmask(status, "SigIgn", &m), 0);
  assert_true(spot_proc_mask_has(m, SIGPIPE)); /* bit 12 */
  assert_false(spot_proc_mask_has(m, SIGUSR1));
  assert_int_equal(spot_proc_parse_sigmask(status, "SigFoo", &m), -EINVAL);
  assert_int_equal(spot_proc_parse_sigmask("SigCgt:\tzz\n", "SigCgt", &m),
                   -EINVAL);
  /* "SigCgtX" is another field */
  assert_int_equal(spot_proc_parse_sigmask("SigCgtX:\t1\n", "SigCgt", &m),
                   -EINVAL);
}

static bool
has(const struct spot_proc *v, size_t n, pid_t pid)
{
  for (size_t i = 0; i < n; i++)
    if (v[i].pid == pid)
      return true;
  return false;
}

/* NSpid: the pid in the innermost namespace is the last number. */
static void
test_parse_nspid(void **state)
{
  pid_t in = 0;

  (void)state;
  assert_int_equal(
      spot_proc_parse_nspid("Name:\tsh\nNSpid:\t81234\t2\nNSpgid:\t1\n", &in),
      0);
  assert_int_equal(in, 2);
  assert_int_equal(spot_proc_parse_nspid("NSpid:\t4711\n", &in), 0);
  assert_int_equal(in, 4711);
  assert_int_equal(spot_proc_parse_nspid("NSpid:\t4711", &in), 0);
  assert_int_equal(in, 4711);
  assert_int_equal(spot_proc_parse_nspid("Name:\tx\n", &in), -EINVAL);
  assert_int_equal(spot_proc_parse_nspid("NSpid:\t\n", &in), -EINVAL);
  assert_int_equal(spot_proc_parse_nspid("NSpid:\t12 x\n", &in), -EINVAL);
  assert_int_equal(spot_proc_parse_nspid("NSpid:\t-3\n", &in), -EINVAL);
}

static void
test_descendants(void **state)
{
  /* 10 is the root (a guard). 11 its command, 12 a worker of 11, 13 an
   * orphan re-parented to 10 (started after 10), 20 outside, 21 a child
   * of 20, 14 names 12 as parent but started before 12 (12's pid was
   * reused): not a descendant. 15 a child of 13. */
  struct spot_proc v[] = {
      {20, 1, 50, 'S'},   {15, 13, 400, 'S'}, {13, 10, 300, 'S'},
      {21, 20, 60, 'S'},  {12, 11, 200, 'S'}, {14, 12, 150, 'S'},
      {11, 10, 110, 'S'}, {10, 5, 100, 'S'},
  };
  size_t n = spot_proc_descendants(v, SPOT_ARRAY_SIZE(v), 10);

  (void)state;
  assert_int_equal(n, 4);
  assert_true(has(v, n, 11));
  assert_true(has(v, n, 12));
  assert_true(has(v, n, 13));
  assert_true(has(v, n, 15));
  assert_false(has(v, n, 14));
  assert_false(has(v, n, 20));
  assert_false(has(v, n, 10));
  /* parents before their children */
  for (size_t i = 0; i < n; i++)
    for (size_t k = i + 1; k < n; k++)
      assert_true(v[k].pid != v[i].ppid);
  /* a root that is not there has no tree */
  {
    struct spot_proc w[] = {{30, 1, 10, 'S'}, {31, 30, 20, 'S'}};

    assert_int_equal(spot_proc_descendants(w, 2, 99), 0);
  }
}

static void
on_usr1(int s)
{
  (void)s;
}

static void
wait_until_file(const char *path)
{
  struct timespec ts = {0, 10 * 1000 * 1000};

  for (int i = 0; i < 3000 && access(path, F_OK) != 0; i++) /* 30 s */
    nanosleep(&ts, NULL);
  assert_int_equal(access(path, F_OK), 0);
}

/* The children of test_real_tree, killed by the teardown whatever
 * happened (a failed assert must not leave them behind). */
static pid_t kids[2];

static int
kill_kids(void **state)
{
  (void)state;
  for (size_t i = 0; i < 2; i++)
    if (kids[i] > 0)
      kill(kids[i], SIGKILL);
  if (kids[0] > 0)
    (void)waitpid(kids[0], NULL, 0);
  kids[0] = kids[1] = 0;
  return 0;
}

/* A real tree: this process -> A (catches USR1, maps a file) -> B (in a
 * session of its own, the default action). */
static void
test_real_tree(void **state)
{
  char dir[] = "/tmp/test-proctree-XXXXXX", ready[300], mapped[300];
  struct spot_proc *v, me, a_now;
  size_t n;
  pid_t a, b = 0;
  int p[2], st;
  bool vg = getenv("SPOT_UNDER_VALGRIND") != NULL;

  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(ready, sizeof(ready), "%s/ready", dir);
  snprintf(mapped, sizeof(mapped), "%s/req", dir);
  assert_int_equal(pipe(p), 0);
  a = fork();
  assert_true(a >= 0);
  if (a == 0) {
    struct sigaction sa;
    int fd;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    fd = open(mapped, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, 4096) < 0 ||
        mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED)
      _exit(2);
    b = fork();
    if (b == 0) {
      struct sigaction dfl, ign;
      sigset_t blk;

      memset(&dfl, 0, sizeof(dfl));
      dfl.sa_handler = SIG_DFL;
      sigaction(SIGUSR1, &dfl, NULL);
      setsid();
      /* USR2 blocked at its default, HUP blocked and ignored */
      sigemptyset(&blk);
      sigaddset(&blk, SIGUSR2);
      sigaddset(&blk, SIGHUP);
      sigprocmask(SIG_BLOCK, &blk, NULL);
      memset(&ign, 0, sizeof(ign));
      ign.sa_handler = SIG_IGN;
      sigaction(SIGHUP, &ign, NULL);
      /* B, not A, says ready: A's state is set before B exists, and B
       * may not have run at all when A returns from fork() (a loaded
       * machine: B still had A's USR1 handler and no session of its own) */
      close(open(ready, O_WRONLY | O_CREAT, 0600));
      pause();
      _exit(0);
    }
    if (write(p[1], &b, sizeof(b)) != (ssize_t)sizeof(b))
      _exit(3);
    pause();
    _exit(0);
  }
  kids[0] = a;
  close(p[1]); /* a child that failed closes the pipe: no hang */
  p[1] = -1;
  assert_int_equal(read(p[0], &b, sizeof(b)), (ssize_t)sizeof(b));
  kids[1] = b;
  wait_until_file(ready);
  assert_int_equal(spot_proc_tree(getpid(), &v, &n), 0);
  assert_true(has(v, n, a));
  assert_true(has(v, n, b)); /* another session, still in the tree */
  free(v);
  assert_int_equal(spot_proc_read(a, &a_now), 0);
  /* valgrind catches every signal itself: the kernel's view of the
   * dispositions is its own there */
  if (!vg)
    assert_int_equal(spot_proc_sigstate(&a_now, SIGUSR1), SPOT_PROC_SIG_CAUGHT);
  assert_int_equal(spot_proc_maps_file(&a_now, mapped), 1);
  {
    struct spot_proc b_now;

    assert_int_equal(spot_proc_read(b, &b_now), 0);
    if (!vg) {
      assert_int_equal(spot_proc_sigstate(&b_now, SIGUSR1),
                       SPOT_PROC_SIG_DEFAULT);
      /* blocked at the default action: it would die once it unblocks */
      assert_int_equal(spot_proc_sigstate(&b_now, SIGUSR2),
                       SPOT_PROC_SIG_DEFAULT);
      /* blocked and ignored: a sigwait loop gets it */
      assert_int_equal(spot_proc_sigstate(&b_now, SIGHUP),
                       SPOT_PROC_SIG_IGNORED);
    }
    assert_int_equal(spot_proc_maps_file(&b_now, "/nonexistent/x"), 0);
    /* a stale start time is another process: never signalled */
    b_now.start--;
    assert_int_equal(spot_proc_kill(&b_now, SIGKILL), -ESRCH);
    assert_int_equal(spot_proc_sigstate(&b_now, SIGUSR1), -ESRCH);
  }
  /* the whole tree, both sessions */
  assert_int_equal(spot_proc_kill_tree(getpid(), SIGKILL), 2);
  assert_int_equal(waitpid(a, &st, 0), a);
  kids[0] = kids[1] = 0;
  assert_true(WIFSIGNALED(st));
  assert_int_equal(spot_proc_read(getpid(), &me), 0);
  assert_int_equal(me.pid, getpid());
  close(p[0]);
  unlink(ready);
  unlink(mapped);
  rmdir(dir);
}

/* A /proc of n processes under dir: pid 1 the parent of all but the
 * last, which is the child of pid n - 1 (so it sorts after the others). */
static void
fake_proc(const char *dir, unsigned n)
{
  char path[256];

  for (unsigned pid = 1; pid <= n; pid++) {
    FILE *f;

    snprintf(path, sizeof(path), "%s/%u", dir, pid);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/%u/stat", dir, pid);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%u (p) S %u %u %u 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %u 0 0 0\n",
            pid,
            pid == n   ? n - 1
            : pid == 1 ? 0
                       : 1,
            pid, pid, 100 + pid);
    fclose(f);
  }
}

static void
rm_fake_proc(const char *dir, unsigned n)
{
  char path[256];

  for (unsigned pid = 1; pid <= n; pid++) {
    snprintf(path, sizeof(path), "%s/%u/stat", dir, pid);
    unlink(path);
    snprintf(path, sizeof(path), "%s/%u", dir, pid);
    rmdir(path);
  }
  rmdir(dir);
}

/* A scan reads every entry of /proc: the child of the last process is in
 * its tree; past the scan's cap it fails instead of returning a part (a
 * scan once stopped at 8192 entries, missing whatever sorted after). The
 * real cap is the kernel's own limit on pids. */
static void
test_scan_all(void **state)
{
  enum { N = 600 };
  char dir[] = "/tmp/spot-fakeproc-XXXXXX";
  struct spot_proc *v = NULL;
  size_t n = 0;

  (void)state;
  assert_true(SPOT_PROCTREE_MAX >= 4194304);
  assert_non_null(mkdtemp(dir));
  fake_proc(dir, N);
  assert_int_equal(spot_proc_scan_at(dir, N, &v, &n), 0);
  assert_int_equal(n, N);
  n = spot_proc_descendants(v, n, N - 1);
  assert_int_equal(n, 1);
  assert_int_equal(v[0].pid, N);
  free(v);
  v = NULL;
  assert_int_equal(spot_proc_scan_at(dir, N - 1, &v, &n), -E2BIG);
  assert_null(v);
  assert_int_equal(spot_proc_scan_at(dir, 100, &v, &n), -E2BIG);
  assert_null(v);
  rm_fake_proc(dir, N);
}

/* A file is known by what its mapping shows in /proc/PID/maps (device
 * and inode), not by its path: another file renamed over the path is
 * another file. */
static void
test_map_id(void **state)
{
  char dir[] = "/tmp/test-proctree-XXXXXX", a[300], b[300];
  char id_a[64], id_b[64];
  struct spot_proc me;
  void *ma, *mb;
  int fa, fb;

  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(a, sizeof(a), "%s/a", dir);
  snprintf(b, sizeof(b), "%s/b", dir);
  fa = open(a, O_RDWR | O_CREAT, 0600);
  fb = open(b, O_RDWR | O_CREAT, 0600);
  assert_true(fa >= 0 && fb >= 0);
  assert_int_equal(ftruncate(fa, 4096), 0);
  assert_int_equal(ftruncate(fb, 4096), 0);
  ma = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fa, 0);
  assert_true(ma != MAP_FAILED);
  assert_int_equal(spot_proc_self_map_id(ma, id_a, sizeof(id_a)), 0);
  assert_non_null(strchr(id_a, ' '));
  assert_int_equal(spot_proc_read(getpid(), &me), 0);
  assert_int_equal(spot_proc_maps_id(&me, id_a), 1);
  /* b renamed over a's path: mapping the path now maps another file */
  assert_int_equal(rename(b, a), 0);
  mb = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fb, 0);
  assert_true(mb != MAP_FAILED);
  assert_int_equal(spot_proc_self_map_id(mb, id_b, sizeof(id_b)), 0);
  assert_string_not_equal(id_a, id_b);
  assert_int_equal(munmap(ma, 4096), 0);
  assert_int_equal(spot_proc_maps_id(&me, id_a), 0);
  assert_int_equal(spot_proc_maps_id(&me, id_b), 1);
  assert_int_equal(spot_proc_self_map_id(ma, id_a, sizeof(id_a)), -ENOENT);
  munmap(mb, 4096);
  close(fa);
  close(fb);
  unlink(a);
  rmdir(dir);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_stat),
      cmocka_unit_test(test_parse_sigmask),
      cmocka_unit_test(test_parse_nspid),
      cmocka_unit_test(test_descendants),
      cmocka_unit_test(test_scan_all),
      cmocka_unit_test(test_map_id),
      cmocka_unit_test_teardown(test_real_tree, kill_kids),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
