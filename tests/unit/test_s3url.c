#include "cmocka-compat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/s3url.h"

static void
test_good_urls(void **state)
{
  static const struct {
    const char *url, *bucket, *prefix;
  } cases[] = {
      {"s3://my-bucket", "my-bucket", ""},
      {"s3://my-bucket/", "my-bucket", ""},
      {"s3://my-bucket///", "my-bucket", ""},
      {"s3://my-bucket/spotd", "my-bucket", "spotd"},
      {"s3://my-bucket/spotd/", "my-bucket", "spotd"},
      {"s3://my.bucket.1/a/b/c//", "my.bucket.1", "a/b/c"},
      {"s3://abc/x y/z_Q.-", "abc", "x y/z_Q.-"},
      {"s3://1bc/..x/.y", "1bc", "..x/.y"},
  };
  char err[256];

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char *b = NULL, *p = NULL;
    assert_int_equal(spot_s3_url_parse(cases[i].url, &b, &p, err, sizeof(err)),
                     0);
    assert_string_equal(b, cases[i].bucket);
    assert_string_equal(p, cases[i].prefix);
    free(b);
    free(p);
  }
}

static void
test_bad_urls(void **state)
{
  static const struct {
    const char *url, *msg; /* msg: a substring of the error */
  } cases[] = {
      {"", "empty"},
      {"s3:/bucket/p", "not an s3:// URL"},
      {"http://bucket/p", "not an s3:// URL"},
      {"S3://bucket/p", "not an s3:// URL"},
      {"s3://", "missing bucket"},
      {"s3:///prefix", "missing bucket"},
      {"s3://ab/p", "3 to 63"},
      {"s3://aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/"
       "p",
       "63"},
      {"s3://Bucket/p", "lowercase"},
      {"s3://my_bucket/p", "lowercase"},
      {"s3://-bucket/p", "begin and end"},
      {"s3://bucket-/p", "begin and end"},
      {"s3://a..b/p", "adjacent periods"},
      {"s3://192.168.1.10/p", "IP address"},
      {"s3://xn--bucket/p", "reserved prefix"},
      {"s3://sthree-bucket/p", "reserved prefix"},
      {"s3://bucket-s3alias/p", "reserved suffix"},
      {"s3://bucket--ol-s3/p", "reserved suffix"},
      {"s3://bucket//p", "empty path component"},
      {"s3://bucket/a//b", "empty path component"},
      {"s3://bucket/./a", "'.' and '..'"},
      {"s3://bucket/a/../b", "'.' and '..'"},
      {"s3://bucket/a/..", "'.' and '..'"},
      {"s3://bucket/a?x=1", "'?'"},
      {"s3://bucket/a#frag", "'#'"},
      {"s3://bucket/a\\b", "'\\'"},
      {"s3://bucket/a\tb", "control character"},
  };
  char err[256];

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char *b = (char *)"untouched", *p = (char *)"untouched";
    err[0] = '\0';
    assert_int_equal(spot_s3_url_parse(cases[i].url, &b, &p, err, sizeof(err)),
                     -EINVAL);
    if (strstr(err, cases[i].msg) == NULL)
      fail_msg("%s: error '%s' lacks '%s'", cases[i].url, err, cases[i].msg);
    /* Out-parameters are only set on success. */
    assert_string_equal(b, "untouched");
    assert_string_equal(p, "untouched");
  }
}

static void
test_long_prefix(void **state)
{
  char url[SPOT_S3_URL_PREFIX_MAX + 64];
  char err[256], *b, *p;
  size_t n;

  n = (size_t)snprintf(url, sizeof(url), "s3://bucket/");
  memset(url + n, 'a', SPOT_S3_URL_PREFIX_MAX);
  url[n + SPOT_S3_URL_PREFIX_MAX] = '\0';
  assert_int_equal(spot_s3_url_parse(url, &b, &p, err, sizeof(err)), 0);
  assert_int_equal(strlen(p), SPOT_S3_URL_PREFIX_MAX);
  free(b);
  free(p);
  url[n + SPOT_S3_URL_PREFIX_MAX] = 'a';
  url[n + SPOT_S3_URL_PREFIX_MAX + 1] = '\0';
  assert_int_equal(spot_s3_url_parse(url, &b, &p, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "prefix longer than"));
}

static void
test_parse_job(void **state)
{
  char err[256], *b, *p, *j;

  assert_int_equal(spot_s3_url_parse_job("s3://bkt/team/runs/job-1.a_b/", &b,
                                         &p, &j, err, sizeof(err)),
                   0);
  assert_string_equal(b, "bkt");
  assert_string_equal(p, "team/runs");
  assert_string_equal(j, "job-1.a_b");
  free(b);
  free(p);
  free(j);
  assert_int_equal(
      spot_s3_url_parse_job("s3://bkt/job", &b, &p, &j, err, sizeof(err)), 0);
  assert_string_equal(p, "");
  assert_string_equal(j, "job");
  free(b);
  free(p);
  free(j);
  assert_int_equal(
      spot_s3_url_parse_job("s3://bkt/", &b, &p, &j, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "no job"));
  assert_int_equal(
      spot_s3_url_parse_job("s3://bkt/p/bad$job", &b, &p, &j, err, sizeof(err)),
      -EINVAL);
  assert_non_null(strstr(err, "job id"));
}

static void
test_job_ids(void **state)
{
  char err[256], big[SPOT_JOB_ID_MAX + 2];

  assert_int_equal(spot_s3_url_check_job("Resnet50_run-2.b", err, sizeof(err)),
                   0);
  assert_int_equal(spot_s3_url_check_job("", err, sizeof(err)), -EINVAL);
  assert_int_equal(spot_s3_url_check_job(".", err, sizeof(err)), -EINVAL);
  assert_int_equal(spot_s3_url_check_job("..", err, sizeof(err)), -EINVAL);
  assert_int_equal(spot_s3_url_check_job("a/b", err, sizeof(err)), -EINVAL);
  assert_int_equal(spot_s3_url_check_job("a b", err, sizeof(err)), -EINVAL);
  memset(big, 'j', SPOT_JOB_ID_MAX);
  big[SPOT_JOB_ID_MAX] = '\0';
  assert_int_equal(spot_s3_url_check_job(big, err, sizeof(err)), 0);
  big[SPOT_JOB_ID_MAX] = 'j';
  big[SPOT_JOB_ID_MAX + 1] = '\0';
  assert_int_equal(spot_s3_url_check_job(big, err, sizeof(err)), -EINVAL);
  assert_non_null(strstr(err, "max 128"));
  /* A tiny error buffer is still terminated. */
  assert_int_equal(spot_s3_url_check_job("", err, 4), -EINVAL);
  assert_int_equal(strlen(err), 3);
}

int
main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_urls),   cmocka_unit_test(test_bad_urls),
      cmocka_unit_test(test_long_prefix), cmocka_unit_test(test_parse_job),
      cmocka_unit_test(test_job_ids),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
