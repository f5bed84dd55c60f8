/* The two non-RFC 3339 date layouts the metadata services use. Both are
 * normalised to RFC 3339 and parsed by spot_rfc3339_parse(), so there is
 * one calendar implementation in the tree. */
#include "core/notice.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "core/util.h"

static const char *const months[12] = {"Jan", "Feb", "Mar", "Apr",
                                       "May", "Jun", "Jul", "Aug",
                                       "Sep", "Oct", "Nov", "Dec"};
static const char *const wdays[7] = {"Sun", "Mon", "Tue", "Wed",
                                     "Thu", "Fri", "Sat"};

static int
num(const char **p, int min_digits, int max_digits, int *out)
{
  int v = 0, n = 0;

  while (n < max_digits && **p >= '0' && **p <= '9') {
    v = v * 10 + (**p - '0');
    (*p)++;
    n++;
  }
  if (n < min_digits)
    return -EINVAL;
  *out = v;
  return 0;
}

static int
month(const char **p, int *out)
{
  for (int i = 0; i < 12; i++) {
    if (strncmp(*p, months[i], 3) == 0) {
      *p += 3;
      *out = i + 1;
      return 0;
    }
  }
  return -EINVAL;
}

static int
expect(const char **p, const char *lit)
{
  size_t n = strlen(lit);

  if (strncmp(*p, lit, n) != 0)
    return -EINVAL;
  *p += n;
  return 0;
}

/* "D Mon YYYY HH:MM:SS GMT" from *p to the end of the string. */
static int
parse_dmy(const char *p, int64_t *out_ms)
{
  int d, mo, y, h, mi, s;
  char iso[32];

  if (num(&p, 1, 2, &d) || expect(&p, " ") || month(&p, &mo) ||
      expect(&p, " ") || num(&p, 4, 4, &y) || expect(&p, " ") ||
      num(&p, 2, 2, &h) || expect(&p, ":") || num(&p, 2, 2, &mi) ||
      expect(&p, ":") || num(&p, 2, 2, &s) || expect(&p, " GMT") || *p)
    return -EINVAL;
  if (d < 1 || d > 31)
    return -EINVAL;
  snprintf(iso, sizeof(iso), "%04d-%02d-%02dT%02d:%02d:%02dZ", y, mo, d, h, mi,
           s);
  return spot_rfc3339_parse(iso, out_ms);
}

int
spot_time_parse_aws_event(const char *s, int64_t *out_ms)
{
  if (s == NULL)
    return -EINVAL;
  return parse_dmy(s, out_ms);
}

int
spot_time_parse_rfc1123(const char *s, int64_t *out_ms)
{
  int found = 0;

  if (s == NULL)
    return -EINVAL;
  for (int i = 0; i < 7; i++)
    if (strncmp(s, wdays[i], 3) == 0)
      found = 1;
  if (!found || strncmp(s + 3, ", ", 2) != 0)
    return -EINVAL;
  /* RFC 1123 always has two day digits; parse_dmy accepts them. */
  if (s[5] < '0' || s[5] > '9' || s[6] < '0' || s[6] > '9')
    return -EINVAL;
  return parse_dmy(s + 5, out_ms);
}

static int
split(int64_t ms, struct tm *tm)
{
  time_t t = (time_t)(ms / 1000);

  if (ms < 0 || gmtime_r(&t, tm) == NULL)
    return -EINVAL;
  return 0;
}

int
spot_time_format_rfc1123(int64_t ms, char *buf, size_t size)
{
  struct tm tm;
  int n;

  if (split(ms, &tm))
    return -EINVAL;
  n = snprintf(buf, size, "%s, %02d %s %04d %02d:%02d:%02d GMT",
               wdays[tm.tm_wday], tm.tm_mday, months[tm.tm_mon],
               tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
  return n < 0 || (size_t)n >= size ? -ENOSPC : 0;
}

int
spot_time_format_aws_event(int64_t ms, char *buf, size_t size)
{
  struct tm tm;
  int n;

  if (split(ms, &tm))
    return -EINVAL;
  n = snprintf(buf, size, "%d %s %04d %02d:%02d:%02d GMT", tm.tm_mday,
               months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
               tm.tm_sec);
  return n < 0 || (size_t)n >= size ? -ENOSPC : 0;
}
