/* lib/io/lease.c without a store: the owner id of this process and the
 * rule that takes over a lease whose holder on this machine is gone.
 * Real child processes stand in for holders; no network but a loopback
 * S3 stand-in in this process. */
#include "cmocka-compat.h"

#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "io/lease.h"
#include "s3_stand_in.h"

static void owner_of(char *buf, size_t size, long pid, const char *boot,
                     const char *host);

/* The instance part of every owner id this test makes, its own per run:
 * a lock file is named by a hash of the whole id, and the files a killed
 * holder (a child here, a spotd of another test) leaves behind would
 * otherwise be found under a pid used again (pid_max is 32768 here). */
static char instance[48];

/* A child that names itself comm, holds its lock (spot_lease_lock_hold
 * under the owner id of its pid) when asked, and sleeps until killed. */
static pid_t
holder(const char *comm, bool lock)
{
  int p[2];
  char c;
  pid_t pid;

  assert_int_equal(pipe(p), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char owner[300];

    close(p[0]);
    (void)prctl(PR_SET_NAME, comm, 0, 0, 0);
    owner_of(owner, sizeof(owner), (long)getpid(), NULL, NULL);
    if (lock && spot_lease_lock_hold(owner) < 0)
      _exit(1);
    (void)write(p[1], "x", 1);
    for (;;)
      pause();
  }
  close(p[1]);
  assert_int_equal(read(p[0], &c, 1), 1); /* named and locked by now */
  close(p[0]);
  return pid;
}

static void
reap(pid_t pid)
{
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* Our owner id with another pid (or the same with other fields). */
static void
owner_of(char *buf, size_t size, long pid, const char *boot, const char *host)
{
  struct spot_lease_owner o;
  char mine[300];

  assert_int_equal(spot_lease_local_owner(NULL, mine, sizeof(mine)), 0);
  assert_int_equal(spot_lease_owner_parse(mine, &o), 0);
  o.pid = pid;
  if (boot != NULL)
    snprintf(o.boot, sizeof(o.boot), "%s", boot);
  if (host != NULL)
    snprintf(o.host, sizeof(o.host), "%s", host);
  assert_int_equal(spot_lease_owner_format(
                       instance[0] != '\0' ? instance : NULL, &o, buf, size),
                   0);
}

static void
test_local_owner(void **state)
{
  struct spot_lease_owner o;
  char buf[300];

  (void)state;
  assert_int_equal(spot_lease_local_owner("i-0abc", buf, sizeof(buf)), 0);
  assert_int_equal(strncmp(buf, "i-0abc/", 7), 0);
  assert_int_equal(spot_lease_owner_parse(buf, &o), 0);
  assert_int_equal(o.pid, (long)getpid());
  assert_true(o.pidns > 0);
  assert_true(strlen(o.boot) == 36); /* a UUID */
}

static void
test_holder_gone(void **state)
{
  char owner[300], why[96];
  pid_t live, other, dead, unlocked;

  (void)state;
  snprintf(instance, sizeof(instance), "unit-%ld-%ld", (long)getpid(),
           (long)time(NULL));
  live = holder("spotd", true);
  other = holder("spotd-1.2", true); /* a spotd under another name */
  dead = holder("spotd", true);
  unlocked = holder("python3", false);
  reap(dead);

  /* its lock free: gone, whatever has its pid now */
  owner_of(owner, sizeof(owner), dead, NULL, NULL);
  assert_true(spot_lease_holder_gone(owner, why, sizeof(why)));
  assert_non_null(strstr(why, "hold its lock no more"));

  /* live holders keep it, whatever their name */
  owner_of(owner, sizeof(owner), live, NULL, NULL);
  assert_false(spot_lease_holder_gone(owner, why, sizeof(why)));
  owner_of(owner, sizeof(owner), other, NULL, NULL);
  assert_false(spot_lease_holder_gone(owner, why, sizeof(why)));
  /* no lock file: nothing is proved (not even by a process that is not a
   * spotd having its pid), its expiry tells */
  owner_of(owner, sizeof(owner), unlocked, NULL, NULL);
  assert_false(spot_lease_holder_gone(owner, why, sizeof(why)));
  reap(unlocked);
  assert_false(spot_lease_holder_gone(owner, why, sizeof(why)));

  /* a process before us had our pid: once we hold our lock, it and its
   * guard are gone */
  owner_of(owner, sizeof(owner), (long)getpid(), NULL, NULL);
  assert_true(spot_lease_lock_hold(owner) > 0);
  assert_true(spot_lease_holder_gone(owner, why, sizeof(why)));
  /* dropped at the end: no file, nothing proved any more */
  spot_lease_lock_drop();
  assert_false(spot_lease_holder_gone(owner, why, sizeof(why)));

  /* another boot, host or form: nothing can be told from here */
  owner_of(owner, sizeof(owner), dead, "00000000-0000-0000-0000-000000000000",
           NULL);
  assert_false(spot_lease_holder_gone(owner, why, sizeof(why)));
  owner_of(owner, sizeof(owner), dead, NULL, "another-host");
  assert_false(spot_lease_holder_gone(owner, why, sizeof(why)));
  assert_false(spot_lease_holder_gone("spotctl@host:1", why, sizeof(why)));
  assert_false(spot_lease_holder_gone("me", NULL, 0));

  reap(live);
  reap(other);
}

static void
acquire_cb(const struct spot_lease_info *info, void *data)
{
  struct world *w = data;

  w->calls++;
  w->err = info->err;
}

static void
free_lease_on_put(struct stand_in *si)
{
  struct world *w = spot_container_of(si, struct world, si);

  spot_lease_free(w->lease);
  w->lease = NULL;
  w->calls_when_cancel_returned = w->calls;
  uv_stop(&w->loop);
}

/* A lease freed with its acquiring write on the wire: the write's
 * callback comes later, from the loop, and must find the lease still
 * allocated and change nothing (ASan and valgrind see it otherwise). */
static void
test_free_with_write_in_flight(void **state)
{
  struct spot_lease_config c;
  struct world w;

  (void)state;
  world_init(&w);
  w.si.on_put = free_lease_on_put;
  memset(&c, 0, sizeof(c));
  c.s3 = w.s3;
  c.bucket = "spotd-test";
  c.key = "job-1/LEASE";
  c.owner = "node-a";
  c.no_wait = true;
  assert_int_equal(spot_lease_new(&w.loop, &c, NULL, NULL, &w.lease), 0);
  assert_int_equal(spot_lease_acquire(w.lease, NULL, acquire_cb, &w), 0);
  uv_run(&w.loop, UV_RUN_DEFAULT); /* until free_lease_on_put stops it */
  assert_int_equal(w.si.puts, 1);
  /* the lease finishes its user operation inside free (lease.h) */
  assert_int_equal(w.calls_when_cancel_returned, 1);
  assert_int_equal(w.err, -ECANCELED);
  world_fini(&w);
  assert_int_equal(w.calls, 1);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_local_owner),
      cmocka_unit_test(test_holder_gone),
      cmocka_unit_test(test_free_with_write_in_flight),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
