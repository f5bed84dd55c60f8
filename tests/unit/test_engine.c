/* The daemon's engine in-process (libspotd): the state tables refuse
 * going backwards, closing only allows EXITING, the final-checkpoint rule
 * gives up when nothing can come any more. Then event sequences replayed
 * through the engine's event functions on a real libuv loop (no network;
 * one case starts a `sleep` as the trainer): a notice during the restore,
 * the lease lost while uploading, the relaunch claim against a peer's
 * notice, and a second SIGTERM in every state, each checked for the
 * states it leaves and the exit status. */
#include "cmocka-compat.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/util.h"
#include "engine.h"
#include "fanout.h"
#include "jlog.h"
#include "joblease.h"
#include "request.h"
#include "restarts.h"
#include "runjoin.h"
#include "spotd.h"
#include "trainer.h"
#include "upload.h"

static void
test_engine_forward_only(void **state)
{
  struct spotd d;

  (void)state;
  memset(&d, 0, sizeof(d));
  assert_true(spotd_set_state(&d, SPOTD_CONNECTING));
  assert_true(spotd_set_state(&d, SPOTD_RESTORING));
  assert_true(spotd_set_state(&d, SPOTD_RUNNING));
  assert_false(spotd_set_state(&d, SPOTD_RESTORING));
  assert_int_equal(d.state, SPOTD_RUNNING);
  assert_true(spotd_set_state(&d, SPOTD_DRAINING));
  assert_false(spotd_set_state(&d, SPOTD_RUNNING));
  assert_true(spotd_set_state(&d, SPOTD_RELAUNCHING));
  /* closing: EXITING only, never back to STOPPING */
  d.closing = true;
  assert_false(spotd_set_state(&d, SPOTD_STOPPING));
  assert_true(spotd_set_state(&d, SPOTD_EXITING));
  assert_false(spotd_set_state(&d, SPOTD_STOPPING));
  assert_int_equal(d.state, SPOTD_EXITING);
  assert_string_equal(spotd_state_name(d.state), "exiting");
}

/* A failed trainer's restart: RUNNING -> RESTARTING -> RUNNING, as often
 * as it takes; from RESTARTING a notice or a signal drains, nothing
 * else. */
static void
test_engine_restarting(void **state)
{
  struct spotd d;

  (void)state;
  memset(&d, 0, sizeof(d));
  assert_true(spotd_set_state(&d, SPOTD_CONNECTING));
  assert_true(spotd_set_state(&d, SPOTD_RUNNING));
  assert_true(spotd_set_state(&d, SPOTD_RESTARTING));
  assert_string_equal(spotd_state_name(d.state), "restarting");
  assert_false(spotd_set_state(&d, SPOTD_FINISHING));
  assert_false(spotd_set_state(&d, SPOTD_RESTORING));
  assert_true(spotd_set_state(&d, SPOTD_RUNNING));
  assert_true(spotd_set_state(&d, SPOTD_RESTARTING));
  assert_true(spotd_set_state(&d, SPOTD_DRAINING));
  assert_false(spotd_set_state(&d, SPOTD_RESTARTING));
  assert_int_equal(d.state, SPOTD_DRAINING);
  /* a lease lost while restarting or running: straight to STOPPING, and
   * never back */
  memset(&d, 0, sizeof(d));
  assert_true(spotd_set_state(&d, SPOTD_CONNECTING));
  assert_true(spotd_set_state(&d, SPOTD_RUNNING));
  assert_true(spotd_set_state(&d, SPOTD_RESTARTING));
  assert_true(spotd_set_state(&d, SPOTD_STOPPING));
  assert_false(spotd_set_state(&d, SPOTD_RUNNING));
  assert_false(spotd_set_state(&d, SPOTD_RESTARTING));
  memset(&d, 0, sizeof(d));
  assert_true(spotd_set_state(&d, SPOTD_CONNECTING));
  assert_true(spotd_set_state(&d, SPOTD_RUNNING));
  assert_true(spotd_set_state(&d, SPOTD_STOPPING));
  assert_false(spotd_set_state(&d, SPOTD_DRAINING));
}

static void
test_final_rule(void **state)
{
  struct spotd d;

  (void)state;
  memset(&d, 0, sizeof(d));
  /* no trainer: nothing to ask, nothing to wait for */
  final_begin(&d, "test");
  assert_int_equal(d.final.state, FINAL_NONE);
  assert_false(final_wait(&d));
  /* asked, but the trainer is gone and no request is pending */
  d.final.state = FINAL_REQUESTED;
  d.req.state = REQ_PENDING;
  assert_true(final_wait(&d));
  d.req.state = REQ_IDLE;
  assert_false(final_wait(&d));
  assert_int_equal(d.final.state, FINAL_ABANDONED);
  assert_int_equal(d.nwarnings, 1);
  /* abandoned is final: a deadline does nothing more */
  final_deadline(&d);
  final_give_up(&d, "again");
  assert_int_equal(d.final.state, FINAL_ABANDONED);
  assert_int_equal(d.nwarnings, 1);
  /* uploading waits; committed does not */
  d.final.state = FINAL_UPLOADING;
  assert_true(final_wait(&d));
  d.final.state = FINAL_COMMITTED;
  assert_false(final_wait(&d));
  final_give_up(&d, "late");
  assert_int_equal(d.final.state, FINAL_COMMITTED);
}

/* The run a rank joins, from the markers the LIST shows. */
static uint64_t
join_of(const char *const *keys, size_t n, unsigned mine)
{
  struct runjoin_scan s;
  enum runjoin_mark mark;
  uint64_t run;
  unsigned rank;

  runjoin_decide_init(&s);
  for (size_t i = 0; i < n; i++)
    if (runjoin_parse_key(keys[i], &run, &rank, &mark) == 0)
      runjoin_decide_add(&s, run, mark, rank, mine);
  return runjoin_decide(&s);
}

/* A store of run markers the way the ranks write them. */
struct runs {
  char keys[64][32];
  const char *ptrs[64];
  size_t n;
};

static void
runs_add(struct runs *r, uint64_t run, const char *what, int rank)
{
  assert_true(r->n < 64);
  if (rank < 0)
    snprintf(r->keys[r->n], sizeof(r->keys[r->n]), "%010llu/%s",
             (unsigned long long)run, what);
  else
    snprintf(r->keys[r->n], sizeof(r->keys[r->n]), "%010llu/%s-%d",
             (unsigned long long)run, what, rank);
  for (size_t i = 0; i < r->n; i++)
    if (strcmp(r->keys[i], r->keys[r->n]) == 0)
      return; /* one object per key */
  r->ptrs[r->n] = r->keys[r->n];
  r->n++;
}

/* Deletes the object, as a rank rejoining its run deletes its left-K. */
static void
runs_del(struct runs *r, uint64_t run, const char *what, int rank)
{
  char key[32];
  size_t k = 0;

  snprintf(key, sizeof(key), "%010llu/%s-%d", (unsigned long long)run, what,
           rank);
  for (size_t i = 0; i < r->n; i++)
    if (strcmp(r->keys[i], key) != 0) {
      memmove(r->keys[k], r->keys[i], sizeof(r->keys[k]));
      r->ptrs[k] = r->keys[k];
      k++;
    }
  r->n = k;
}

/* Rank `rank` starts: the run it joins, and its marker in the store. */
static uint64_t
runs_join(struct runs *r, unsigned rank)
{
  uint64_t g = join_of(r->ptrs, r->n, rank);

  runs_del(r, g, "left", (int)rank);
  runs_add(r, g, "rank", (int)rank);
  return g;
}

static void
test_runjoin(void **state)
{
  static const char *const bad[] = {
      "",         "x/rank-0",   "0000000000/rank-0",
      "12/rank-", "12/rank-1x", "12/ranks-1",
      "12",       "-1/rank-0",  "12/rank-99999999999",
      "12/left-", "12/overs",   "12/over/x",
  };
  static const char *const r3[] = {
      "0000000002/rank-0", "0000000003/rank-1", "0000000002/rank-1", "junk",
      "0000000003/other",
  };
  enum runjoin_mark mark = RUNJOIN_MARK_LAST;
  uint64_t run = 0;
  unsigned rank = 0;

  (void)state;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(runjoin_parse_key(bad[i], &run, &rank, &mark), -1);
  assert_int_equal(runjoin_parse_key("0000000012/rank-3", &run, &rank, &mark),
                   0);
  assert_int_equal(run, 12);
  assert_int_equal(rank, 3);
  assert_int_equal(mark, RUNJOIN_RANK);
  assert_int_equal(runjoin_parse_key("0000000012/left-4", &run, &rank, &mark),
                   0);
  assert_int_equal(rank, 4);
  assert_int_equal(mark, RUNJOIN_LEFT);
  assert_int_equal(runjoin_parse_key("0000000013/over", &run, &rank, &mark), 0);
  assert_int_equal(run, 13);
  assert_int_equal(mark, RUNJOIN_OVER);
  /* nothing yet: run 1 */
  assert_int_equal(join_of(NULL, 0, 0), 1);
  /* rank 1 opened run 3 alone: rank 0 joins it; rank 1 again, with no
   * peer in run 3, means a new start */
  assert_int_equal(join_of(r3, 5, 0), 3);
  assert_int_equal(join_of(r3, 5, 1), 4);
  /* four restarts, the ranks starting in turn in either order, each run
   * ending as a preemption (over) or with both ranks leaving it: they
   * always agree */
  for (unsigned first = 0; first < 2; first++) {
    struct runs r = {.n = 0};

    for (int restart = 0; restart < 4; restart++) {
      unsigned order[2] = {first ^ (unsigned)(restart & 1),
                           1 ^ first ^ (unsigned)(restart & 1)};
      uint64_t got[2];

      for (int i = 0; i < 2; i++)
        got[i] = runs_join(&r, order[i]);
      assert_int_equal(got[0], got[1]);
      assert_int_equal(got[0], (uint64_t)restart + 1);
      if (restart & 1) {
        runs_add(&r, got[0], "over", -1);
      } else {
        runs_add(&r, got[0], "left", 0);
        runs_add(&r, got[0], "left", 1);
      }
    }
  }
  /* Rank 1 restarts alone (killed, or it left) while rank 0 still runs
   * run 1: it rejoins run 1. Then the job restarts: both agree on run 2,
   * whoever comes first, and on every start after. */
  for (unsigned killed = 0; killed < 2; killed++)
    for (unsigned first = 0; first < 2; first++) {
      struct runs r = {.n = 0};

      assert_int_equal(runs_join(&r, 0), 1);
      assert_int_equal(runs_join(&r, 1), 1);
      if (!killed)
        runs_add(&r, 1, "left", 1);
      assert_int_equal(runs_join(&r, 1), 1); /* alone */
      for (uint64_t g = 2; g < 5; g++) {
        runs_add(&r, g - 1, g & 1 ? "over" : "left", g & 1 ? -1 : 0);
        if (!(g & 1))
          runs_add(&r, g - 1, "left", 1);
        assert_int_equal(runs_join(&r, first), g);
        assert_int_equal(runs_join(&r, 1 - first), g);
      }
    }
  /* Rank 0 in run 5 (over), rank 1 behind in run 4 it left: both start,
   * both open run 6 */
  {
    static const char *const split[] = {
        "0000000004/rank-1",
        "0000000004/left-1",
        "0000000005/rank-0",
        "0000000005/over",
    };

    assert_int_equal(join_of(split, 4, 0), 6);
    assert_int_equal(join_of(split, 4, 1), 6);
  }
  /* Rank 0 joined run 7 and left it; rank 1 had not come: it joins 7,
   * and rank 0's next start finds rank 1 there */
  {
    static const char *const lone[] = {"0000000007/rank-0",
                                       "0000000007/left-0"};

    assert_int_equal(join_of(lone, 2, 1), 7);
  }
}

/* ------------------------------------------------- event sequences */

/* A spotd as spotd_start() leaves it before its first network step: the
 * loop, a config with the defaults, the handles the engine uses, a
 * checkpoint folder of its own. */
struct rig {
  uv_loop_t loop;
  struct spot_config *cfg;
  struct spotd d;
  char dir[64];
};

static void
rig_init(struct rig *r)
{
  struct spotd *d = &r->d;
  char err[256], sock[128];

  memset(r, 0, sizeof(*r));
  assert_int_equal(uv_loop_init(&r->loop), 0);
  r->cfg = spot_config_new();
  assert_non_null(r->cfg);
  assert_int_equal(
      spot_config_set(r->cfg, "job", "engine-test", err, sizeof(err)), 0);
  snprintf(r->dir, sizeof(r->dir), "/tmp/spotd-test-engine-XXXXXX");
  assert_non_null(mkdtemp(r->dir));
  snprintf(sock, sizeof(sock), "%s/ctl.sock", r->dir); /* never bound */
  assert_int_equal(spot_config_set(r->cfg, "socket", sock, err, sizeof(err)),
                   0);
  d->loop = &r->loop;
  d->cfg = r->cfg;
  d->exit_code = -1;
  d->steps.step = -1;
  d->ckpt_dir = r->dir;
  spotd_handles_init(d);
}

/* Runs the loop until spotd closed (or the time runs out). */
static void
rig_run(struct rig *r, int seconds)
{
  for (int i = 0; i < seconds * 20 && !r->d.closing; i++) {
    uv_run(&r->loop, UV_RUN_NOWAIT);
    usleep(50000);
  }
}

/* Closes what is still open; the loop must then be empty. */
static void
rig_fini(struct rig *r)
{
  spotd_close(&r->d);
  uv_run(&r->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&r->loop), 0);
  fanout_fini(&r->d);
  spot_buf_fini(&r->d.crash.body);
  rmdir(r->dir);
  spot_config_free(r->cfg);
}

/* Walks the engine to state s by legal moves only. */
static void
walk_to(struct spotd *d, enum spotd_state s)
{
  static const enum spotd_state path[SPOTD_STATE_LAST][4] = {
      [SPOTD_INIT] = {SPOTD_INIT},
      [SPOTD_CONNECTING] = {SPOTD_CONNECTING},
      [SPOTD_RESTORING] = {SPOTD_CONNECTING, SPOTD_RESTORING},
      [SPOTD_RUNNING] = {SPOTD_CONNECTING, SPOTD_RUNNING},
      [SPOTD_RESTARTING] = {SPOTD_CONNECTING, SPOTD_RUNNING, SPOTD_RESTARTING},
      [SPOTD_DRAINING] = {SPOTD_CONNECTING, SPOTD_RUNNING, SPOTD_DRAINING},
      [SPOTD_RELAUNCHING] = {SPOTD_CONNECTING, SPOTD_RUNNING, SPOTD_DRAINING,
                             SPOTD_RELAUNCHING},
      [SPOTD_STOPPING] = {SPOTD_CONNECTING, SPOTD_RUNNING, SPOTD_STOPPING},
      [SPOTD_FINISHING] = {SPOTD_CONNECTING, SPOTD_RUNNING, SPOTD_FINISHING},
      [SPOTD_EXITING] = {SPOTD_EXITING},
  };

  for (size_t i = 0; i < 4; i++) {
    if (path[s][i] == SPOTD_INIT)
      break;
    assert_true(spotd_set_state(d, path[s][i]));
  }
  assert_int_equal(d->state, s);
}

static struct spot_notice
notice(const char *reason, uint64_t in_ms)
{
  struct spot_notice n;

  memset(&n, 0, sizeof(n));
  n.provider = SPOT_PROVIDER_AWS;
  n.kind = SPOT_NOTICE_TERMINATE;
  n.deadline_mono_ms = spot_now_mono_ms() + in_ms;
  n.deadline_wall_ms = spot_now_wall_ms() + (int64_t)in_ms;
  snprintf(n.reason, sizeof(n.reason), "%s", reason);
  snprintf(n.id, sizeof(n.id), "%s-1", reason);
  return n;
}

/* A push runs (its operation is not a real one: nothing completes it),
 * and a newer complete folder waits for it. */
static void
uploading(struct spotd *d)
{
  d->up.state = UPLOAD_PUSHING;
  snprintf(d->up.name, sizeof(d->up.name), "ckpt-5");
  snprintf(d->up.waiting, sizeof(d->up.waiting), "ckpt-6");
  assert_false(upload_idle(d));
}

/* A notice while the startup restores: the engine keeps restoring and
 * never starts the trainer; once the restore is done it drains and exits
 * as a preemption, 75 with a commit to resume from, 76 without. */
static void
test_seq_notice_during_restore(void **state)
{
  for (int committed = 0; committed < 2; committed++) {
    struct rig r;
    struct spotd *d = &r.d;
    struct spot_notice n = notice("aws-spot-terminate", 60000);

    (void)state;
    rig_init(&r);
    walk_to(d, SPOTD_RESTORING);
    spotd_job_notice(d, &n);
    assert_int_equal(d->state, SPOTD_RESTORING);
    assert_true(d->have_notice);
    if (committed) {
      snprintf(d->last_commit, sizeof(d->last_commit), "ckpt-10");
      snprintf(d->restored_name, sizeof(d->restored_name), "ckpt-10");
    }
    spotd_launch(d); /* the restore is done */
    assert_false(d->trainer_started);
    assert_int_equal(d->final.state, FINAL_NONE);
    assert_true(d->closing);
    assert_int_equal(d->state, SPOTD_EXITING);
    assert_int_equal(d->exit_code, committed ? SPOTD_EXIT_PREEMPTED
                                             : SPOTD_EXIT_NOTHING_SAVED);
    rig_fini(&r);
  }
}

/* The job lease lost while a push runs and another waits: the uploads are
 * dropped at once and the exit status is 73. With the trainer running
 * the engine goes straight to STOPPING (never stays RUNNING) and exits
 * once the trainer is gone; without one it exits at once. */
static void
test_seq_lease_lost_while_uploading(void **state)
{
  char sleep_cmd[] = "sleep", secs[] = "30";
  char *argv[] = {sleep_cmd, secs, NULL};

  (void)state;
  for (int with_trainer = 0; with_trainer < 2; with_trainer++) {
    struct rig r;
    struct spotd *d = &r.d;

    rig_init(&r);
    walk_to(d, SPOTD_RUNNING);
    if (with_trainer) {
      d->argv = argv;
      assert_int_equal(trainer_start(d), 0);
      assert_true(trainer_running(d));
    }
    uploading(d);
    d->jl.state = JOB_LEASE_LOST; /* what lease.c's lost callback sets */
    spotd_lease_lost(d);
    assert_string_equal(d->up.waiting, "");
    assert_int_equal(d->exit_code, SPOTD_EXIT_LEASE_LOST);
    if (with_trainer) {
      assert_int_equal(d->state, SPOTD_STOPPING);
      assert_false(d->closing);
      /* nothing moves it back while the trainer is killed */
      spotd_relaunch_ended(d);
      spotd_advance(d);
      assert_int_equal(d->state, SPOTD_STOPPING);
      rig_run(&r, 30);
    }
    assert_true(d->closing);
    assert_int_equal(d->state, SPOTD_EXITING);
    assert_int_equal(d->exit_code, SPOTD_EXIT_LEASE_LOST);
    rig_fini(&r);
  }
}

/* Multi-node, this rank waits for the job-wide relaunch claim when a
 * peer's notice arrives: the notice changes nothing, the claim (lost to
 * another rank) ends the relaunch step and spotd exits 75 on its
 * committed final checkpoint. The reverse: the peer's notice starts the
 * drain first, and a claim or a relaunch end arriving before the drain
 * reached RELAUNCHING is ignored until the drain is over. */
static void
test_seq_relaunch_vs_fanout(void **state)
{
  struct rig r;
  struct spotd *d = &r.d;
  struct spot_notice own = notice("aws-spot-terminate", 60000);
  struct spot_notice peer = notice("peer-preempted", 60000);

  (void)state;
  /* claim pending, then the peer's notice, then the claim */
  rig_init(&r);
  walk_to(d, SPOTD_RELAUNCHING);
  d->have_notice = true;
  d->notice = own;
  snprintf(d->reason, sizeof(d->reason), "%s", own.reason);
  snprintf(d->last_commit, sizeof(d->last_commit), "ckpt-7");
  snprintf(d->final.name, sizeof(d->final.name), "ckpt-7");
  d->final.state = FINAL_COMMITTED;
  spotd_job_notice(d, &peer);
  assert_int_equal(d->state, SPOTD_RELAUNCHING);
  assert_string_equal(d->reason, own.reason);
  assert_false(d->closing);
  spotd_relaunch_claimed(d, false); /* another rank runs the step */
  assert_true(d->closing);
  assert_int_equal(d->state, SPOTD_EXITING);
  assert_int_equal(d->exit_code, SPOTD_EXIT_PREEMPTED);
  rig_fini(&r);

  /* the peer's notice first: a claim or an end before RELAUNCHING is
   * not the engine's to act on */
  rig_init(&r);
  walk_to(d, SPOTD_RUNNING);
  snprintf(d->last_commit, sizeof(d->last_commit), "ckpt-3");
  uploading(d);
  spotd_job_notice(d, &peer);
  assert_int_equal(d->state, SPOTD_DRAINING);
  spotd_relaunch_claimed(d, true);
  assert_int_equal(d->state, SPOTD_DRAINING);
  spotd_relaunch_ended(d);
  assert_int_equal(d->state, SPOTD_DRAINING);
  assert_false(d->closing);
  /* the uploads end: the drain is over, no relaunch step is set */
  d->up.state = UPLOAD_IDLE;
  d->up.waiting[0] = '\0';
  spotd_advance(d);
  assert_int_equal(d->state, SPOTD_EXITING);
  assert_int_equal(d->exit_code, SPOTD_EXIT_PREEMPTED);
  rig_fini(&r);
}

/* A second SIGTERM (or SIGINT) stops spotd now, whatever it was doing:
 * 128 + the signal, once closing nothing more. The first one before the
 * trainer runs stops at once; from RUNNING or RESTARTING it drains;
 * during a notice's drain it finishes that drain. An upload runs
 * throughout, so no drain ends on its own. */
static void
test_seq_second_sigterm(void **state)
{
  (void)state;
  for (int s = SPOTD_INIT; s < SPOTD_STATE_LAST; s++) {
    for (int with_notice = 0; with_notice < 2; with_notice++) {
      struct rig r;
      struct spotd *d = &r.d;
      bool noticed = with_notice && s >= SPOTD_DRAINING && s <= SPOTD_STOPPING;

      print_message("# state %s%s\n", spotd_state_name((enum spotd_state)s),
                    noticed ? " (notice)" : "");
      rig_init(&r);
      if (s == SPOTD_EXITING) {
        spotd_close(d);
      } else {
        walk_to(d, (enum spotd_state)s);
        if (s == SPOTD_RESTARTING)
          d->crash.state = CRASH_BACKOFF;
      }
      if (noticed) {
        d->have_notice = true;
        d->notice = notice("aws-spot-terminate", 60000);
      }
      uploading(d);

      spotd_on_signal(d, SIGTERM);
      if (s == SPOTD_EXITING) {
        assert_int_equal(d->exit_code, SPOTD_EXIT_ERROR);
      } else if (s < SPOTD_RUNNING) {
        assert_int_equal(d->state, SPOTD_EXITING);
        assert_int_equal(d->exit_code, 128 + SIGTERM);
      } else if (s == SPOTD_RUNNING || s == SPOTD_RESTARTING) {
        assert_int_equal(d->state, SPOTD_DRAINING);
        assert_true(d->drain_sigterm);
        assert_false(d->closing);
      } else {
        assert_int_equal(d->state, s);
        assert_int_equal(d->drain_sigterm, !noticed);
        assert_false(d->closing);
      }
      if (s == SPOTD_RESTARTING) {
        assert_true(d->crash.interrupted);
        assert_int_equal(d->crash.state, CRASH_NONE);
      }

      spotd_on_signal(d, SIGTERM);
      assert_true(d->closing);
      assert_int_equal(d->state, SPOTD_EXITING);
      assert_int_equal(d->exit_code,
                       s == SPOTD_EXITING ? SPOTD_EXIT_ERROR : 128 + SIGTERM);
      rig_fini(&r);
    }
  }
}

static void
log_off_loop(void *arg)
{
  (void)arg;
  for (int i = 0; i < 200; i++)
    log_warn("s3: PUT s3://b/k: SlowDown; retry 1/5 in 200 ms (test %d)", i);
}

/* The journald sink runs for lines of the S3 client's I/O threads too: a
 * retry's warning while the loop starts the drain again for a notice
 * after a SIGTERM (start_drain() rewrites d->reason). Before, the sink
 * read d->state and d->reason from that thread while the loop wrote them
 * (ThreadSanitizer: a data race; a torn SPOTD_REASON). No journald here:
 * the lines go to stderr. */
static void
test_jlog_lines_from_threads(void **state)
{
  char job[] = "job-1";
  struct spot_config cfg;
  struct spotd d;
  uv_thread_t t;

  (void)state;
  memset(&cfg, 0, sizeof(cfg));
  memset(&d, 0, sizeof(d));
  cfg.job = job;
  d.cfg = &cfg;
  d.state = SPOTD_DRAINING;
  spot_strlcpy(d.reason, "sigterm", sizeof(d.reason));
  assert_int_equal(setenv("JOURNAL_STREAM", "0:0", 1), 0);
  jlog_start(&d);
  log_notice("signal 15: final checkpoint, then stop (test)");
  assert_int_equal(uv_thread_create(&t, log_off_loop, NULL), 0);
  for (int i = 0; i < 200; i++)
    spot_strlcpy(d.reason, i % 2 ? "sigterm" : "spot-interruption",
                 sizeof(d.reason));
  assert_int_equal(uv_thread_join(&t), 0);
  jlog_stop();
  assert_int_equal(unsetenv("JOURNAL_STREAM"), 0);
}

int
main(int argc, char **argv)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_forward_only),
      cmocka_unit_test(test_engine_restarting),
      cmocka_unit_test(test_final_rule),
      cmocka_unit_test(test_runjoin),
      cmocka_unit_test(test_seq_notice_during_restore),
      cmocka_unit_test(test_seq_lease_lost_while_uploading),
      cmocka_unit_test(test_seq_relaunch_vs_fanout),
      cmocka_unit_test(test_seq_second_sigterm),
      cmocka_unit_test(test_jlog_lines_from_threads),
  };

  /* The trainer's guard is this binary again (lib/io/child.h). */
  if (argc > 1 && strcmp(argv[1], SPOT_CHILD_SHIM_ARG) == 0)
    spot_child_shim_main(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
