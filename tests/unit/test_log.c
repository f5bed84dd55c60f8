#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

static char last[2048];
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

static void
test_levels_and_errno(void **state)
{
  spot_log_set_sink(sink, NULL);
  spot_log_set_level(SPOT_LOG_INFO);
  calls = 0;
  errno = EAGAIN;
  log_debug("hidden %d", 1);
  assert_int_equal(calls, 0);
  log_info("job=%s shown", "j1");
  assert_int_equal(calls, 1);
  assert_string_equal(last, "job=j1 shown");
  assert_int_equal(last_level, SPOT_LOG_INFO);
  assert_int_equal(errno, EAGAIN);
  assert_int_equal(log_err_errno(-ENOENT, "open %s", "x"), -ENOENT);
  assert_string_equal(last, "open x: No such file or directory");
  assert_int_equal(errno, EAGAIN);
  spot_log_set_sink(NULL, NULL);
}

static void
test_newlines_folded(void **state)
{
  spot_log_set_sink(sink, NULL);
  spot_log_set_level(SPOT_LOG_DEBUG);
  log_warn("a\nb\rc");
  assert_string_equal(last, "a b c");
  spot_log_set_sink(NULL, NULL);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_levels_and_errno),
      cmocka_unit_test(test_newlines_folded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
