/* The daemon's engine in-process (libspotd): the state tables refuse
 * going backwards, closing only allows EXITING, the final-checkpoint rule
 * gives up when nothing can come any more. No loop, no network. */
#include "cmocka-compat.h"

#include <stdio.h>
#include <string.h>

#include "spotd.h"

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
  uint64_t run;
  unsigned rank;

  runjoin_decide_init(&s);
  for (size_t i = 0; i < n; i++)
    if (runjoin_parse_key(keys[i], &run, &rank) == 0)
      runjoin_decide_add(&s, run, rank, mine);
  return runjoin_decide(&s);
}

static void
test_runjoin(void **state)
{
  static const char *const bad[] = {
      "",         "x/rank-0",   "0000000000/rank-0",
      "12/rank-", "12/rank-1x", "12/ranks-1",
      "12",       "-1/rank-0",  "12/rank-99999999999",
  };
  static const char *const r3[] = {
      "0000000002/rank-0", "0000000003/rank-1", "0000000002/rank-1", "junk",
      "0000000003/other",
  };
  uint64_t run = 0;
  unsigned rank = 0;

  (void)state;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(runjoin_parse_key(bad[i], &run, &rank), -1);
  assert_int_equal(runjoin_parse_key("0000000012/rank-3", &run, &rank), 0);
  assert_int_equal(run, 12);
  assert_int_equal(rank, 3);
  /* nothing yet: run 1 */
  assert_int_equal(join_of(NULL, 0, 0), 1);
  /* rank 1 opened run 3: rank 0 joins it; rank 1 again means a new start */
  assert_int_equal(join_of(r3, 5, 0), 3);
  assert_int_equal(join_of(r3, 5, 1), 4);
  /* three restarts, the ranks starting in turn in either order: they
   * always agree */
  for (unsigned first = 0; first < 2; first++) {
    char keys[16][32];
    const char *ptrs[16];
    size_t n = 0;

    for (int restart = 0; restart < 4; restart++) {
      unsigned order[2] = {first ^ (unsigned)(restart & 1),
                           1 ^ first ^ (unsigned)(restart & 1)};
      uint64_t got[2];

      for (int i = 0; i < 2; i++) {
        got[i] = join_of(ptrs, n, order[i]);
        snprintf(keys[n], sizeof(keys[n]), "%010llu/rank-%u",
                 (unsigned long long)got[i], order[i]);
        ptrs[n] = keys[n];
        n++;
      }
      assert_int_equal(got[0], got[1]);
      assert_int_equal(got[0], (uint64_t)restart + 1);
    }
  }
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_forward_only),
      cmocka_unit_test(test_engine_restarting),
      cmocka_unit_test(test_final_rule),
      cmocka_unit_test(test_runjoin),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
