#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "core/util.h"

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

/* What reaches stderr: a UTC timestamp and the program name, or only the
 * <N> prefix under journald (which stamps lines itself). */
static void
test_stderr_format(void **state)
{
  FILE *f = tmpfile();
  char a[512], b[512], stamp[32];
  int saved;
  int64_t when, now = spot_now_wall_ms();

  assert_non_null(f);
  spot_log_set_sink(NULL, NULL);
  spot_log_init("tlog", SPOT_LOG_INFO);
  fflush(stderr);
  saved = dup(2);
  assert_true(saved >= 0 && dup2(fileno(f), 2) == 2);
  unsetenv("JOURNAL_STREAM");
  log_warn("plain %d", 1);
  setenv("JOURNAL_STREAM", "8:1", 1);
  log_warn("journal %d", 2);
  unsetenv("JOURNAL_STREAM");
  fflush(stderr);
  assert_true(dup2(saved, 2) == 2);
  close(saved);
  rewind(f);
  assert_non_null(fgets(a, sizeof(a), f));
  assert_non_null(fgets(b, sizeof(b), f));
  fclose(f);

  /* "2026-12-03T08:05:20.123Z tlog: warning: plain 1" */
  assert_true(strlen(a) > 25 && a[10] == 'T' && a[19] == '.' && a[23] == 'Z' &&
              a[24] == ' ');
  assert_string_equal(a + 25, "tlog: warning: plain 1\n");
  memcpy(stamp, a, 24);
  stamp[24] = '\0';
  assert_int_equal(spot_rfc3339_parse(stamp, &when), 0);
  assert_true(when >= now - 2000 && when <= now + 60000);
  assert_string_equal(b, "<4>journal 2\n");
}

static void
expect_fields(const char *line, const char *ckpt, const char *reason)
{
  struct spot_log_fields f;

  assert_int_equal(spot_log_fields(line, &f), ckpt[0] || reason[0]);
  assert_string_equal(f.checkpoint, ckpt);
  assert_string_equal(f.reason, reason);
}

static void
test_fields(void **state)
{
  (void)state;
  expect_fields("committed checkpoint name=step-000015 files=3 raw=10",
                "step-000015", "");
  expect_fields("uploading checkpoint step-000015", "step-000015", "");
  expect_fields("checkpoint step-1 is complete (final)", "step-1", "");
  expect_fields("checkpoint requested (aws-spot-terminate): SIGUSR1 sent", "",
                "aws-spot-terminate");
  expect_fields("checkpoint requested (spotctl checkpoint): SIGUSR1 sent", "",
                "spotctl checkpoint");
  expect_fields("the final checkpoint needs about 3.0 s", "", "");
  expect_fields("preempted: the final checkpoint step-9 is committed; the "
                "job resumes from it",
                "step-9", "");
  expect_fields("interruption notice: gcp-preempted (terminate) deadline x", "",
                "gcp-preempted");
  expect_fields("relaunch: running 'x' (checkpoint=a.b, reason=manual)", "a.b",
                "manual");
  expect_fields("state running -> draining", "", "");
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_levels_and_errno),
      cmocka_unit_test(test_newlines_folded),
      cmocka_unit_test(test_stderr_format),
      cmocka_unit_test(test_fields),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
