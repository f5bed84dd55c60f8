/* The daemon's modules in-process (libspotd), beside the engine's own
 * replays (test_engine): the run a rank joins from the store's markers,
 * and the journald sink's lines from other threads. */
#include "cmocka-compat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jlog.h"
#include "core/log.h"
#include "runjoin.h"
#include "spotd.h"
#include "core/util.h"

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

static void
log_off_loop(void *arg)
{
  (void)arg;
  for (int i = 0; i < 200; i++)
    log_warn("s3: PUT s3://b/k: SlowDown; retry 1/5 in 200 ms (test %d)", i);
}

/* The journald sink runs for lines of the S3 client's I/O threads too: a
 * retry's warning while the loop starts the drain again for a notice
 * after a SIGTERM (start_drain() rewrites d->eng.reason). Before, the sink
 * read the state and the reason from that thread while the loop wrote them
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
  d.eng.state = SPOTD_DRAINING;
  spot_strlcpy(d.eng.reason, "sigterm", sizeof(d.eng.reason));
  assert_int_equal(setenv("JOURNAL_STREAM", "0:0", 1), 0);
  jlog_start(&d);
  log_notice("signal 15: final checkpoint, then stop (test)");
  assert_int_equal(uv_thread_create(&t, log_off_loop, NULL), 0);
  for (int i = 0; i < 200; i++)
    spot_strlcpy(d.eng.reason, i % 2 ? "sigterm" : "spot-interruption",
                 sizeof(d.eng.reason));
  assert_int_equal(uv_thread_join(&t), 0);
  jlog_stop();
  assert_int_equal(unsetenv("JOURNAL_STREAM"), 0);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runjoin),
      cmocka_unit_test(test_jlog_lines_from_threads),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
