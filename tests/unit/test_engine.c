/* The daemon's engine in-process (libspotd): the state tables refuse
 * going backwards, closing only allows EXITING, the final-checkpoint rule
 * gives up when nothing can come any more. No loop, no network. */
#include "cmocka-compat.h"

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
  assert_false(spotd_set_state(&d, SPOTD_STOPPING));
  assert_false(spotd_set_state(&d, SPOTD_RESTORING));
  assert_true(spotd_set_state(&d, SPOTD_RUNNING));
  assert_true(spotd_set_state(&d, SPOTD_RESTARTING));
  assert_true(spotd_set_state(&d, SPOTD_DRAINING));
  assert_false(spotd_set_state(&d, SPOTD_RESTARTING));
  assert_int_equal(d.state, SPOTD_DRAINING);
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
  d.ckpt_requested = true;
  assert_true(final_wait(&d));
  d.ckpt_requested = false;
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

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_engine_forward_only),
      cmocka_unit_test(test_engine_restarting),
      cmocka_unit_test(test_final_rule),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
