#include "cmocka-compat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"

static void
test_append_and_cap(void **state)
{
  struct spot_buf b;

  spot_buf_init(&b, 8);
  assert_string_equal(spot_buf_str(&b), "");
  assert_int_equal(spot_buf_appends(&b, "abcd"), 0);
  assert_int_equal(spot_buf_printf(&b, "%d", 123), 0);
  assert_string_equal(spot_buf_str(&b), "abcd123");
  /* 7 + 2 > 8: refused, unchanged */
  assert_int_equal(spot_buf_appends(&b, "xy"), -E2BIG);
  assert_int_equal(b.len, 7);
  assert_int_equal(spot_buf_appends(&b, "x"), 0);
  assert_int_equal(b.len, 8);
  assert_int_equal(spot_buf_printf(&b, "%s", "z"), -E2BIG);
  spot_buf_fini(&b);
}

static void
test_consume_steal(void **state)
{
  struct spot_buf b;
  char *s;

  spot_buf_init(&b, 1024);
  assert_int_equal(spot_buf_appends(&b, "line1\nline2"), 0);
  spot_buf_consume(&b, 6);
  assert_string_equal(spot_buf_str(&b), "line2");
  spot_buf_consume(&b, 100);
  assert_int_equal(b.len, 0);
  assert_int_equal(spot_buf_appends(&b, "kept"), 0);
  s = spot_buf_steal(&b);
  assert_string_equal(s, "kept");
  assert_null(b.data);
  free(s);
  s = spot_buf_steal(&b);
  assert_string_equal(s, "");
  free(s);
  spot_buf_fini(&b);
}

static void
test_growth(void **state)
{
  struct spot_buf b;
  char chunk[100];

  memset(chunk, 'a', sizeof(chunk));
  spot_buf_init(&b, 100000);
  for (int i = 0; i < 1000; i++)
    assert_int_equal(spot_buf_append(&b, chunk, sizeof(chunk)), 0);
  assert_int_equal(b.len, 100000);
  assert_int_equal(spot_buf_append(&b, chunk, 1), -E2BIG);
  assert_int_equal(b.data[b.len], '\0');
  spot_buf_fini(&b);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_append_and_cap),
      cmocka_unit_test(test_consume_steal),
      cmocka_unit_test(test_growth),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
