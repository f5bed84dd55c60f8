#include "cmocka-compat.h"

#include <stdio.h>
#include <string.h>

#include "core/fsm.h"
#include "core/log.h"

static char last[1024];
static int last_level;
static int calls;

static void
sink(int level, const char *line, void *data)
{
  (void)data;
  snprintf(last, sizeof(last), "%s", line);
  last_level = level;
  calls++;
}

enum { S_IDLE, S_RUN, S_DONE, S_CANCELLED, S_LAST };
static const char *const names[] = {"idle", "running", "done", "cancelled"};
static const uint32_t legal[S_LAST] = {
    [S_IDLE] = SPOT_FSM_BIT(S_RUN),
    [S_RUN] = SPOT_FSM_BIT(S_DONE) | SPOT_FSM_BIT(S_IDLE),
};
static const struct spot_fsm machine = {
    "job", names, S_LAST, legal, SPOT_FSM_BIT(S_CANCELLED), SPOT_LOG_DEBUG};

static void
setup_log(int level)
{
  spot_log_set_sink(sink, NULL);
  spot_log_set_level(level);
  calls = 0;
  last[0] = '\0';
}

static void
test_names(void **state)
{
  (void)state;
  assert_string_equal(spot_fsm_name(&machine, S_RUN), "running");
  assert_string_equal(spot_fsm_name(&machine, S_LAST), "?");
  assert_string_equal(spot_fsm_name(&machine, 1000), "?");
}

static void
test_legality(void **state)
{
  (void)state;
  assert_true(spot_fsm_legal(&machine, S_IDLE, S_RUN));
  assert_false(spot_fsm_legal(&machine, S_IDLE, S_DONE));
  assert_true(spot_fsm_legal(&machine, S_RUN, S_IDLE));
  /* from_any: every state may go there, even a final one */
  assert_true(spot_fsm_legal(&machine, S_DONE, S_CANCELLED));
  assert_false(spot_fsm_legal(&machine, S_DONE, S_RUN));
  /* a self-move is not a move; out of range never is legal */
  assert_false(spot_fsm_legal(&machine, S_RUN, S_RUN));
  assert_false(spot_fsm_legal(&machine, S_IDLE, S_LAST));
  assert_false(spot_fsm_legal(&machine, 77, S_RUN));
}

static void
test_move_logs_caller(void **state)
{
  (void)state;
  setup_log(SPOT_LOG_DEBUG);
  assert_int_equal(spot_fsm_move(&machine, S_IDLE, S_RUN, "x/lib/io/s3.c", 42),
                   1);
  assert_int_equal(calls, 1);
  assert_int_equal(last_level, SPOT_LOG_DEBUG);
  assert_string_equal(last, "job idle -> running (lib/io/s3.c:42)");
  assert_int_equal(spot_fsm_move_detail(&machine, S_RUN, S_DONE, "daemon/u.c",
                                        7, "name=%s", "step-000003"),
                   1);
  assert_string_equal(last, "job running -> done name=step-000003 "
                            "(daemon/u.c:7)");
  /* the same state: nothing to do, nothing said */
  assert_int_equal(spot_fsm_move(&machine, S_DONE, S_DONE, "a.c", 1), 0);
  assert_int_equal(calls, 2);
  spot_log_set_sink(NULL, NULL);
}

static void
test_refused(void **state)
{
  (void)state;
  setup_log(SPOT_LOG_INFO);
  assert_int_equal(spot_fsm_move(&machine, S_IDLE, S_DONE, "daemon/e.c", 9),
                   -1);
  assert_int_equal(calls, 1);
  assert_int_equal(last_level, SPOT_LOG_ERR);
  assert_string_equal(last,
                      "internal: job idle -> done refused (daemon/e.c:9)");
  assert_int_equal(spot_fsm_move(&machine, S_IDLE, 31, "daemon/e.c", 10), -1);
  assert_string_equal(last, "internal: job idle -> ? refused (daemon/e.c:10)");
  spot_log_set_sink(NULL, NULL);
}

static void
test_info_lines_and_quiet(void **state)
{
  static const struct spot_fsm loud = {"state", names, S_LAST,
                                       NULL,    0,     SPOT_LOG_INFO};
  (void)state;
  setup_log(SPOT_LOG_INFO);
  /* a debug machine at info level: legal, nothing printed */
  assert_int_equal(
      spot_fsm_move_detail(&machine, S_IDLE, S_RUN, "a.c", 1, "n=%d", 1), 1);
  assert_int_equal(calls, 0);
  /* info lines carry no location (the tests and operators match them) */
  assert_int_equal(spot_fsm_move(&loud, S_DONE, S_IDLE, "a.c", 1), 1);
  assert_int_equal(calls, 1);
  assert_string_equal(last, "state done -> idle");
  spot_log_set_sink(NULL, NULL);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_legality),
      cmocka_unit_test(test_move_logs_caller),
      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_info_lines_and_quiet),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
