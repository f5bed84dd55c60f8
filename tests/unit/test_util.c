#include "cmocka-compat.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"

static void
test_rfc3339(void **state)
{
  int64_t ms;
  char buf[32];

  assert_int_equal(spot_rfc3339_parse("1970-01-01T00:00:00Z", &ms), 0);
  assert_int_equal(ms, 0);
  assert_int_equal(spot_rfc3339_parse("2026-12-02T10:13:50Z", &ms), 0);
  assert_int_equal(ms, 1796206430000LL);
  assert_int_equal(spot_rfc3339_parse("2026-12-02T10:13:50.250Z", &ms), 0);
  assert_int_equal(ms, 1796206430250LL);
  assert_int_equal(spot_rfc3339_parse("2026-12-02T11:13:50+01:00", &ms), 0);
  assert_int_equal(ms, 1796206430000LL);
  assert_int_equal(spot_rfc3339_parse("2000-02-29T00:00:00Z", &ms), 0);
  assert_int_equal(ms, 951782400000LL);
  assert_int_equal(spot_rfc3339_parse("2026-13-02T10:13:50Z", &ms), -EINVAL);
  assert_int_equal(spot_rfc3339_parse("2026-12-02 10:13:50", &ms), -EINVAL);
  assert_int_equal(spot_rfc3339_parse("2026-12-02T10:13:50Zjunk", &ms),
                   -EINVAL);
  assert_int_equal(spot_rfc3339_parse("", &ms), -EINVAL);
  assert_int_equal(spot_rfc3339_format(1796206430250LL, buf, sizeof(buf)), 0);
  assert_string_equal(buf, "2026-12-02T10:13:50Z");
}

static void
test_parse_numbers(void **state)
{
  int64_t v;
  uint64_t u;

  assert_int_equal(spot_parse_int64("42", 0, 100, &v), 0);
  assert_int_equal(v, 42);
  assert_int_equal(spot_parse_int64("101", 0, 100, &v), -ERANGE);
  assert_int_equal(spot_parse_int64("4x", 0, 100, &v), -EINVAL);
  assert_int_equal(spot_parse_int64("", 0, 100, &v), -EINVAL);
  assert_int_equal(spot_parse_size("8M", &u), 0);
  assert_int_equal(u, 8u << 20);
  assert_int_equal(spot_parse_size("16MiB", &u), 0);
  assert_int_equal(u, 16u << 20);
  assert_int_equal(spot_parse_size("1g", &u), 0);
  assert_int_equal(u, 1u << 30);
  assert_int_equal(spot_parse_size("512", &u), 0);
  assert_int_equal(u, 512);
  assert_int_equal(spot_parse_size("-1", &u), -EINVAL);
  assert_int_equal(spot_parse_size("3X", &u), -EINVAL);
}

static void
test_backoff_bounds(void **state)
{
  /* rnd = 0 gives the floor, rnd = max the ceiling, and the ceiling is
   * capped. */
  assert_int_equal(spot_backoff_ms(0, 100, 10000, 0), 50);
  assert_int_equal(spot_backoff_ms(0, 100, 10000, UINT32_MAX), 100);
  assert_int_equal(spot_backoff_ms(3, 100, 10000, UINT32_MAX), 800);
  assert_int_equal(spot_backoff_ms(30, 100, 10000, UINT32_MAX), 10000);
  for (unsigned a = 0; a < 40; a++) {
    uint64_t d = spot_backoff_ms(a, 200, 5000, spot_random_u32());
    assert_true(d >= 100 && d <= 5000);
  }
}

static void
test_strlcpy_and_bytes(void **state)
{
  char b[4];
  char out[32];

  assert_int_equal(spot_strlcpy(b, "abcdef", sizeof(b)), 6);
  assert_string_equal(b, "abc");
  assert_string_equal(spot_fmt_bytes(512, out, sizeof(out)), "512 B");
  assert_string_equal(spot_fmt_bytes(1536, out, sizeof(out)), "1.5 KiB");
  assert_string_equal(spot_fmt_bytes(3ull << 30, out, sizeof(out)), "3.0 GiB");
}

/* Cuts fall between whole characters; what is valid stays valid. */
static void
test_utf8(void **state)
{
  char b[4];

  (void)state;
  assert_int_equal(spot_strlcpy_utf8(b, "ab\xd7\x9e", sizeof(b)), 4);
  assert_string_equal(b, "ab");
  assert_int_equal(spot_strlcpy_utf8(b, "a\xd7\x9e", sizeof(b)), 3);
  assert_string_equal(b, "a\xd7\x9e");
  spot_strlcpy_utf8(b, "\xf0\x9f\x9a\x80", sizeof(b));
  assert_string_equal(b, "");
  spot_strlcpy_utf8(b, "abcd", sizeof(b));
  assert_string_equal(b, "abc");
  spot_strlcpy_utf8(b, "\x9e\x9e\x9e\x9e\x9e", sizeof(b)); /* not UTF-8 */
  assert_string_equal(b, "\x9e\x9e\x9e");
  spot_strlcpy_utf8(b, "xyz", 1);
  assert_string_equal(b, "");

  assert_true(spot_utf8_valid(""));
  assert_true(spot_utf8_valid("caf\xc3\xa9 \xf0\x9f\x98\x80 \xe2\x82\xac"));
  assert_false(spot_utf8_valid("ab\xd7"));           /* cut short */
  assert_false(spot_utf8_valid("\x9e"));             /* lone continuation */
  assert_false(spot_utf8_valid("\xc0\xaf"));         /* overlong */
  assert_false(spot_utf8_valid("\xed\xa0\x80"));     /* surrogate */
  assert_false(spot_utf8_valid("\xf4\x90\x80\x80")); /* above U+10FFFF */
}

static void
test_escape(void **state)
{
  char out[SPOT_ESCAPE_SIZE(64)];
  char again[SPOT_ESCAPE_SIZE(sizeof(out))];
  char small[8];

  /* C0 controls, DEL, a forged log line, ESC sequences */
  assert_string_equal(spot_escape("a\nb\r\tc", out, sizeof(out)),
                      "a\\nb\\r\\tc");
  assert_string_equal(spot_escape("\x1b[31mred\x7f\x01", out, sizeof(out)),
                      "\\x1b[31mred\\x7f\\x01");
  /* C1 controls (U+0085 NEL, U+009B CSI) and bidi overrides */
  assert_string_equal(spot_escape("x\xc2\x85y\xc2\x9b", out, sizeof(out)),
                      "x\\u0085y\\u009b");
  assert_string_equal(spot_escape("\xe2\x80\xae\xe2\x80\xa8", out, sizeof(out)),
                      "\\u202e\\u2028");
  /* invalid UTF-8: a lone C1 byte, a truncated sequence, an overlong,
   * a surrogate */
  assert_string_equal(spot_escape("\x85\xc3", out, sizeof(out)), "\\x85\\xc3");
  assert_string_equal(spot_escape("\xc0\xaf\xed\xa0\x80", out, sizeof(out)),
                      "\\xc0\\xaf\\xed\\xa0\\x80");
  /* valid UTF-8 and printable ASCII pass; a backslash is kept */
  assert_string_equal(
      spot_escape("caf\xc3\xa9 \xf0\x9f\x98\x80 a\\b", out, sizeof(out)),
      "caf\xc3\xa9 \xf0\x9f\x98\x80 a\\b");
  /* idempotent */
  spot_escape("\x1b]0;x\x07\n\xc2\x9b", out, sizeof(out));
  assert_string_equal(spot_escape(out, again, sizeof(again)), out);
  /* cut between whole escapes, always terminated */
  assert_string_equal(spot_escape("ab\ncd", small, 5), "ab\\n");
  assert_string_equal(spot_escape("abc\n", small, 5), "abc");
  assert_string_equal(spot_escape(NULL, small, sizeof(small)), "");
  /* the worst case fits SPOT_ESCAPE_SIZE */
  {
    char in[33];
    char big[SPOT_ESCAPE_SIZE(32)];

    memset(in, 0x01, 32);
    in[32] = '\0';
    assert_int_equal(strlen(spot_escape(in, big, sizeof(big))), 4 * 32);
  }
}

/* Big buffers: 2 MiB-aligned when big, zeroed, writable to the last byte
 * (valgrind and ASan see a mapping: an overrun past the rounded page
 * would fault), freed with their size. */
static void
test_big_alloc(void **state)
{
  static const size_t sizes[] = {
      1, 4095, 4096, (2 << 20) - 1, 2 << 20, (8 << 20) + 33000, 17 << 20};

  assert_null(spot_big_alloc(0, 0));
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    size_t n = sizes[i];
    unsigned char *p = spot_big_alloc(n, n / 4 * 3);

    assert_non_null(p);
    assert_int_equal((uintptr_t)p % (2u << 20), 0);
    assert_int_equal(p[0], 0);
    assert_int_equal(p[n - 1], 0);
    memset(p, 0xa5, n);
    assert_int_equal(p[n / 2], 0xa5);
    spot_big_free(p, n);
  }
  spot_big_free(NULL, 1 << 20);
}

/* What a restore's free space check reads: the disk a tree takes (every
 * file's blocks, the folders' too) and the free bytes of its file system;
 * an unreadable path is an error, never 0 bytes. */
static void
test_tree_usage(void **state)
{
  char dir[] = "/tmp/spot-usage-XXXXXX", sub[64], file[96];
  static char block[8192];
  uint64_t bytes = 0, dev = 0, avail = 0, bsize = 0, empty = 0;
  struct stat st;
  int fd;

  assert_non_null(mkdtemp(dir));
  assert_int_equal(spot_tree_usage(dir, &empty, &dev), 0);
  snprintf(sub, sizeof(sub), "%s/sub", dir);
  assert_int_equal(mkdir(sub, 0755), 0);
  snprintf(file, sizeof(file), "%s/f", sub);
  fd = open(file, O_WRONLY | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  memset(block, 0x5a, sizeof(block));
  for (int i = 0; i < 4; i++)
    assert_int_equal(write(fd, block, sizeof(block)), (ssize_t)sizeof(block));
  assert_int_equal(fsync(fd), 0);
  close(fd);
  assert_int_equal(spot_tree_usage(dir, &bytes, &dev), 0);
  assert_true(bytes >= empty + 4 * sizeof(block));
  assert_int_equal(stat(dir, &st), 0);
  assert_int_equal(dev, (uint64_t)st.st_dev);
  assert_int_equal(spot_fs_avail(dir, &avail, &bsize), 0);
  assert_true(bsize > 0);
  assert_int_equal(spot_tree_usage("/nonexistent/spot-usage", &bytes, &dev),
                   -ENOENT);
  assert_int_equal(spot_fs_avail("/nonexistent/spot-usage", &avail, &bsize),
                   -ENOENT);
  spot_rm_tree(dir);
  assert_int_not_equal(access(dir, F_OK), 0);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rfc3339),
      cmocka_unit_test(test_parse_numbers),
      cmocka_unit_test(test_backoff_bounds),
      cmocka_unit_test(test_strlcpy_and_bytes),
      cmocka_unit_test(test_utf8),
      cmocka_unit_test(test_escape),
      cmocka_unit_test(test_big_alloc),
      cmocka_unit_test(test_tree_usage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
