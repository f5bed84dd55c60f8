/* s3:// URL parsing and job id rules. Pure: no I/O, no globals. */
#include "core/s3url.h"
#include "core/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define set_err spot_set_err

/* fail(err, errlen, fmt, ...) writes the message and evaluates to -EINVAL.
 * A macro so that the -EINVAL shows at the call: the static analyzer does
 * not step into variadic functions, and would otherwise walk every failure
 * as a possible success (and warn about the outputs it did not set). */
#define fail(err, errlen, ...) (set_err((err), (errlen), __VA_ARGS__), -EINVAL)

static bool
is_lower_alnum(char c)
{
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

static bool
has_prefix(const char *s, const char *p)
{
  return strncmp(s, p, strlen(p)) == 0;
}

static bool
has_suffix(const char *s, const char *suf)
{
  size_t n = strlen(s), m = strlen(suf);

  return n >= m && memcmp(s + n - m, suf, m) == 0;
}

/* Four dot-separated groups of 1..3 digits. */
static bool
looks_like_ipv4(const char *s)
{
  int groups = 0, digits = 0;

  for (; *s != '\0'; s++) {
    if (*s >= '0' && *s <= '9') {
      if (++digits > 3)
        return false;
    } else if (*s == '.') {
      if (digits == 0)
        return false;
      groups++;
      digits = 0;
    } else {
      return false;
    }
  }
  return digits > 0 && groups == 3;
}

int
spot_s3_url_check_bucket(const char *b, char *err, size_t errlen)
{
  static const char *const bad_prefix[] = {"xn--", "sthree-", "amzn-s3-demo-"};
  static const char *const bad_suffix[] = {"-s3alias", "--ol-s3", ".mrap",
                                           "--x-s3"};
  size_t n = strlen(b);

  if (n < 3 || n > 63)
    return fail(err, errlen,
                "bucket name '%.80s' must be 3 to 63 characters long", b);
  for (size_t i = 0; i < n; i++) {
    char c = b[i];
    if (!is_lower_alnum(c) && c != '.' && c != '-')
      return fail(err, errlen,
                  "bucket name '%s' may only contain lowercase letters, "
                  "digits, '.' and '-'",
                  b);
  }
  if (!is_lower_alnum(b[0]) || !is_lower_alnum(b[n - 1]))
    return fail(err, errlen,
                "bucket name '%s' must begin and end with a letter or digit",
                b);
  if (strstr(b, "..") != NULL)
    return fail(err, errlen, "bucket name '%s' has two adjacent periods", b);
  if (looks_like_ipv4(b))
    return fail(err, errlen, "bucket name '%s' is formatted as an IP address",
                b);
  for (size_t i = 0; i < sizeof(bad_prefix) / sizeof(bad_prefix[0]); i++)
    if (has_prefix(b, bad_prefix[i]))
      return fail(err, errlen, "bucket name '%s' uses the reserved prefix '%s'",
                  b, bad_prefix[i]);
  for (size_t i = 0; i < sizeof(bad_suffix) / sizeof(bad_suffix[0]); i++)
    if (has_suffix(b, bad_suffix[i]))
      return fail(err, errlen, "bucket name '%s' uses the reserved suffix '%s'",
                  b, bad_suffix[i]);
  return 0;
}

int
spot_s3_url_check_job(const char *job, char *err, size_t errlen)
{
  size_t n = strlen(job);

  if (n == 0)
    return fail(err, errlen, "job id is empty");
  if (n > SPOT_JOB_ID_MAX)
    return fail(err, errlen, "job id is %zu characters long (max %d)", n,
                SPOT_JOB_ID_MAX);
  for (size_t i = 0; i < n; i++) {
    char c = job[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return fail(err, errlen,
                  "job id '%.*s' may only contain letters, digits, '.', '_' "
                  "and '-'",
                  SPOT_JOB_ID_MAX, job);
  }
  if (strcmp(job, ".") == 0 || strcmp(job, "..") == 0)
    return fail(err, errlen, "job id '%s' is not allowed", job);
  return 0;
}

/* Checks the prefix p[0..n) (no leading or trailing slash). */
static int
check_prefix(const char *url, const char *p, size_t n, char *err, size_t errlen)
{
  size_t start = 0;

  if (n == 0)
    return 0;
  if (n > SPOT_S3_URL_PREFIX_MAX)
    return fail(err, errlen, "%.80s...: prefix longer than %d bytes", url,
                SPOT_S3_URL_PREFIX_MAX);
  for (size_t i = 0; i <= n; i++) {
    if (i < n) {
      unsigned char c = (unsigned char)p[i];
      if (c < 0x20 || c == 0x7f)
        return fail(err, errlen, "%.200s: control character in the prefix",
                    url);
      if (c == '\\' || c == '?' || c == '#')
        return fail(err, errlen, "%.200s: '%c' is not allowed in the prefix",
                    url, c);
      if (c != '/')
        continue;
    }
    /* A component ends at i. */
    size_t len = i - start;
    if (len == 0)
      return fail(err, errlen, "%.200s: empty path component ('//')", url);
    if ((len == 1 && p[start] == '.') ||
        (len == 2 && p[start] == '.' && p[start + 1] == '.'))
      return fail(err, errlen,
                  "%.200s: '.' and '..' components are not "
                  "allowed",
                  url);
    start = i + 1;
  }
  return 0;
}

int
spot_s3_url_parse(const char *url, char **bucket, char **prefix, char *err,
                  size_t errlen)
{
  const char *b, *slash, *p;
  size_t blen, plen;
  char *bk, *px;
  char bbuf[64];
  int r;

  if (url == NULL || *url == '\0')
    return fail(err, errlen, "empty store URL (expected s3://BUCKET/PREFIX)");
  if (strncmp(url, "s3://", 5) != 0)
    return fail(err, errlen,
                "%.200s: not an s3:// URL (expected "
                "s3://BUCKET/PREFIX)",
                url);
  b = url + 5;
  slash = strchr(b, '/');
  blen = slash != NULL ? (size_t)(slash - b) : strlen(b);
  if (blen == 0)
    return fail(err, errlen, "%.200s: missing bucket name", url);
  if (blen >= sizeof(bbuf))
    return fail(err, errlen, "%.200s: bucket name longer than 63 characters",
                url);
  memcpy(bbuf, b, blen);
  bbuf[blen] = '\0';
  r = spot_s3_url_check_bucket(bbuf, err, errlen);
  if (r < 0)
    return r;
  p = slash != NULL ? slash + 1 : b + blen;
  plen = strlen(p);
  while (plen > 0 && p[plen - 1] == '/')
    plen--;
  if (plen > 0 && p[0] == '/')
    return fail(err, errlen, "%.200s: empty path component ('//')", url);
  r = check_prefix(url, p, plen, err, errlen);
  if (r < 0)
    return r;
  bk = strdup(bbuf);
  px = strndup(p, plen);
  if (bk == NULL || px == NULL) {
    free(bk);
    free(px);
    return -ENOMEM;
  }
  *bucket = bk;
  *prefix = px;
  return 0;
}

int
spot_s3_url_parse_job(const char *url, char **bucket, char **prefix, char **job,
                      char *err, size_t errlen)
{
  char *bk, *px, *jb, *last;
  int r;

  r = spot_s3_url_parse(url, &bk, &px, err, errlen);
  if (r < 0)
    return r;
  if (*px == '\0') {
    free(bk);
    free(px);
    return fail(err, errlen,
                "%.200s: no job in the URL (expected "
                "s3://BUCKET/PREFIX/JOB)",
                url);
  }
  last = strrchr(px, '/');
  jb = strdup(last != NULL ? last + 1 : px);
  if (jb == NULL) {
    free(bk);
    free(px);
    return -ENOMEM;
  }
  r = spot_s3_url_check_job(jb, err, errlen);
  if (r < 0) {
    free(bk);
    free(px);
    free(jb);
    return r;
  }
  if (last != NULL)
    *last = '\0';
  else
    *px = '\0';
  *bucket = bk;
  *prefix = px;
  *job = jb;
  return 0;
}
