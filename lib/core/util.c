#include "core/util.h"

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

uint64_t
spot_now_mono_ms(void)
{
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#if defined(SPOT_FAULT_POINTS) && SPOT_FAULT_POINTS
/* Test builds: $SPOTD_FAULT_CLOCK_MS shifts this process's wall clock, a
 * node whose clock is off (see spot_fault_point()). Read once, before
 * main, so no thread ever races on it. */
static int64_t clock_offset_ms;
/* $SPOTD_FAULT_CLOCK_STEP_MS=STEP@AFTER: the wall clock steps by STEP ms
 * once AFTER ms (monotonic) have passed since the start, a clock that
 * NTP steps while the process runs. */
static int64_t clock_step_ms;
static uint64_t clock_step_at_ms;

__attribute__((constructor)) static void
clock_offset_init(void)
{
  const char *v = getenv("SPOTD_FAULT_CLOCK_MS");
  const char *st = getenv("SPOTD_FAULT_CLOCK_STEP_MS");
  char *end = NULL;

  clock_offset_ms = v != NULL ? strtoll(v, NULL, 10) : 0;
  if (st != NULL) {
    clock_step_ms = strtoll(st, &end, 10);
    if (end != NULL && *end == '@')
      clock_step_at_ms = spot_now_mono_ms() + strtoull(end + 1, NULL, 10);
    else
      clock_step_ms = 0;
  }
}

static int64_t
clock_shift_ms(void)
{
  if (clock_step_ms != 0 && spot_now_mono_ms() >= clock_step_at_ms)
    return clock_offset_ms + clock_step_ms;
  return clock_offset_ms;
}
#else
static int64_t
clock_shift_ms(void)
{
  return 0;
}
#endif

int64_t
spot_now_wall_ms(void)
{
  struct timespec ts;

  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + clock_shift_ms();
}

size_t
spot_strlcpy(char *dst, const char *src, size_t size)
{
  size_t n = strlen(src);

  if (size > 0) {
    size_t c = n < size - 1 ? n : size - 1;
    memcpy(dst, src, c);
    dst[c] = '\0';
  }
  return n;
}

int
spot_parse_int64(const char *s, int64_t min, int64_t max, int64_t *out)
{
  char *end;
  long long v;

  if (s == NULL || *s == '\0')
    return -EINVAL;
  errno = 0;
  v = strtoll(s, &end, 10);
  if (errno == ERANGE)
    return -ERANGE;
  if (*end != '\0' || end == s)
    return -EINVAL;
  if (v < min || v > max)
    return -ERANGE;
  *out = v;
  return 0;
}

int
spot_parse_size(const char *s, uint64_t *out)
{
  char *end;
  unsigned long long v;
  uint64_t mult = 1;

  if (s == NULL || *s < '0' || *s > '9')
    return -EINVAL;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno == ERANGE)
    return -ERANGE;
  switch (*end) {
  case '\0':
    break;
  case 'k':
  case 'K':
    mult = 1024;
    end++;
    break;
  case 'm':
  case 'M':
    mult = 1024 * 1024;
    end++;
    break;
  case 'g':
  case 'G':
    mult = 1024ull * 1024 * 1024;
    end++;
    break;
  default:
    return -EINVAL;
  }
  if (*end == 'i' || *end == 'B')
    end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
  if (*end != '\0')
    return -EINVAL;
  if (v > UINT64_MAX / mult)
    return -ERANGE;
  *out = v * mult;
  return 0;
}

static int
digits(const char **p, int n, int *out)
{
  int v = 0;

  for (int i = 0; i < n; i++) {
    if ((*p)[i] < '0' || (*p)[i] > '9')
      return -EINVAL;
    v = v * 10 + ((*p)[i] - '0');
  }
  *p += n;
  *out = v;
  return 0;
}

/* Days since the epoch for a proleptic Gregorian date (Howard Hinnant's
 * days_from_civil), so no timegm()/TZ dependence. */
static int64_t
days_from_civil(int y, int m, int d)
{
  int64_t era, yoe, doy, doe;

  y -= m <= 2;
  era = (y >= 0 ? y : y - 399) / 400;
  yoe = y - era * 400;
  doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

int
spot_rfc3339_parse(const char *s, int64_t *out_ms)
{
  int y, mo, d, h, mi, sec, ms = 0, off = 0;
  const char *p = s;
  int64_t t;

  if (s == NULL)
    return -EINVAL;
  if (digits(&p, 4, &y) || *p++ != '-' || digits(&p, 2, &mo) || *p++ != '-' ||
      digits(&p, 2, &d) || (*p != 'T' && *p != 't' && *p != ' '))
    return -EINVAL;
  p++;
  if (digits(&p, 2, &h) || *p++ != ':' || digits(&p, 2, &mi) || *p++ != ':' ||
      digits(&p, 2, &sec))
    return -EINVAL;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
    return -EINVAL;
  if (*p == '.') {
    int scale = 100;
    p++;
    if (*p < '0' || *p > '9')
      return -EINVAL;
    while (*p >= '0' && *p <= '9') {
      ms += (*p - '0') * scale;
      scale /= 10;
      p++;
    }
  }
  if (*p == 'Z' || *p == 'z') {
    p++;
  } else if (*p == '+' || *p == '-') {
    int oh, om, sign = *p == '-' ? -1 : 1;
    p++;
    if (digits(&p, 2, &oh) || *p++ != ':' || digits(&p, 2, &om) || oh > 23 ||
        om > 59)
      return -EINVAL;
    off = sign * (oh * 60 + om);
  } else {
    return -EINVAL;
  }
  if (*p != '\0')
    return -EINVAL;
  t = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec;
  t -= (int64_t)off * 60;
  *out_ms = t * 1000 + ms;
  return 0;
}

int
spot_rfc3339_format(int64_t ms, char *buf, size_t size)
{
  time_t t = (time_t)(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
  struct tm tm;

  if (gmtime_r(&t, &tm) == NULL)
    return -EINVAL;
  if (strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
    return -ENOSPC;
  return 0;
}

uint64_t
spot_backoff_ms(unsigned attempt, uint64_t base_ms, uint64_t cap_ms,
                uint32_t rnd)
{
  uint64_t hi = base_ms, lo;

  for (unsigned i = 0; i < attempt && hi < cap_ms; i++)
    hi *= 2;
  if (hi > cap_ms)
    hi = cap_ms;
  lo = base_ms / 2;
  if (lo > hi)
    lo = hi;
  return lo + (uint64_t)(((hi - lo) * (uint64_t)rnd) / UINT32_MAX);
}

uint32_t
spot_random_u32(void)
{
  uint32_t v;

  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
    v = (uint32_t)spot_now_mono_ms() * 2654435761u;
  return v;
}

const char *
spot_fmt_bytes(uint64_t n, char *buf, size_t size)
{
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)n;
  size_t u = 0;

  while (v >= 1024.0 && u + 1 < SPOT_ARRAY_SIZE(units)) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, size, "%" PRIu64 " B", n);
  else
    snprintf(buf, size, "%.1f %s", v, units[u]);
  return buf;
}

/* Length of the valid UTF-8 sequence at s (2..4 bytes; overlongs,
 * surrogates and code points above U+10FFFF are invalid) and its code
 * point in *cp, or 0. */
static size_t
utf8_seq(const unsigned char *s, uint32_t *cp)
{
  size_t n, i;
  uint32_t c, min;

  if (s[0] >= 0xc2 && s[0] <= 0xdf) {
    n = 2, c = s[0] & 0x1f, min = 0x80;
  } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
    n = 3, c = s[0] & 0x0f, min = 0x800;
  } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
    n = 4, c = s[0] & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  for (i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) /* also stops at the terminating NUL */
      return 0;
    c = (c << 6) | (s[i] & 0x3f);
  }
  if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
    return 0;
  *cp = c;
  return n;
}

/* Code points that act on a terminal or on how a line reads. */
static bool
cp_unsafe(uint32_t c)
{
  return (c >= 0x80 && c <= 0x9f) || c == 0x2028 || c == 0x2029 ||
         (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

const char *
spot_escape(const char *src, char *dst, size_t size)
{
  const unsigned char *s = (const unsigned char *)(src != NULL ? src : "");
  size_t o = 0;

  if (size == 0)
    return dst;
  while (*s != '\0') {
    char esc[8];
    const char *piece = esc;
    size_t len, adv = 1;
    uint32_t cp;

    if (*s == '\n' || *s == '\r' || *s == '\t') {
      esc[0] = '\\';
      esc[1] = *s == '\n' ? 'n' : *s == '\r' ? 'r' : 't';
      len = 2;
    } else if (*s < 0x20 || *s == 0x7f) {
      len = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", *s);
    } else if (*s < 0x80) {
      piece = (const char *)s;
      len = 1;
    } else if ((adv = utf8_seq(s, &cp)) == 0) {
      len = (size_t)snprintf(esc, sizeof(esc), "\\x%02x", *s);
      adv = 1;
    } else if (cp_unsafe(cp)) {
      len = (size_t)snprintf(esc, sizeof(esc), "\\u%04x", (unsigned)cp);
    } else {
      piece = (const char *)s;
      len = adv;
    }
    if (o + len >= size)
      break; /* only whole characters */
    memcpy(dst + o, piece, len);
    o += len;
    s += adv;
  }
  dst[o] = '\0';
  return dst;
}

size_t
spot_strlcpy_utf8(char *dst, const char *src, size_t size)
{
  size_t n = spot_strlcpy(dst, src, size);

  if (n >= size && size > 0) {
    size_t c = size - 1;

    /* src[c] is the first byte left out: while it continues a character,
     * that character's first bytes go too (at most 3) */
    for (unsigned k = 0;
         k < 4 && c > 0 && ((unsigned char)src[c] & 0xc0) == 0x80; k++)
      c--;
    if (((unsigned char)src[c] & 0xc0) == 0x80)
      c = size - 1; /* not UTF-8 anyway: a plain byte cut */
    dst[c] = '\0';
  }
  return n;
}

bool
spot_utf8_valid(const char *s)
{
  const unsigned char *p = (const unsigned char *)s;
  uint32_t cp;

  while (*p != '\0') {
    size_t adv = *p < 0x80 ? 1 : utf8_seq(p, &cp);

    if (adv == 0)
      return false;
    p += adv;
  }
  return true;
}

static int
rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st;
  (void)ftw;
  if (flag == FTW_DP)
    rmdir(path);
  else
    unlink(path);
  return 0;
}

int
spot_abs_path(const char *path, char *out, size_t size)
{
  char cwd[4096];
  int n;

  if (path[0] == '/')
    n = snprintf(out, size, "%s", path);
  else if (getcwd(cwd, sizeof(cwd)) == NULL)
    return -errno;
  else
    n = snprintf(out, size, "%s/%s", strcmp(cwd, "/") == 0 ? "" : cwd,
                 strncmp(path, "./", 2) == 0 ? path + 2 : path);
  return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

void
spot_rm_tree(const char *path)
{
  nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* nftw's callback has no argument of its own: the sum lives per thread
 * (restore measures on the thread pool). */
static _Thread_local uint64_t usage_bytes;

static int
usage_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)path;
  (void)ftw;
  if (flag != FTW_NS)
    usage_bytes += (uint64_t)st->st_blocks * 512;
  return 0;
}

int
spot_tree_usage(const char *path, uint64_t *bytes, uint64_t *dev)
{
  struct stat st;

  if (lstat(path, &st) < 0)
    return -errno;
  usage_bytes = 0;
  if (nftw(path, usage_cb, 16, FTW_PHYS | FTW_MOUNT) != 0)
    return errno != 0 ? -errno : -EIO;
  *bytes = usage_bytes;
  *dev = (uint64_t)st.st_dev;
  return 0;
}

int
spot_fs_avail(const char *path, uint64_t *avail, uint64_t *block)
{
  struct statvfs sv;

  if (statvfs(path, &sv) < 0)
    return -errno;
  if (sv.f_blocks == 0 || sv.f_frsize == 0)
    return -ENOTSUP;
  *avail = (uint64_t)sv.f_bavail * sv.f_frsize;
  *block = sv.f_frsize;
  return 0;
}

void
spot_set_err(char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  spot_vset_err(err, errlen, fmt, ap);
  va_end(ap);
}

void
spot_vset_err(char *err, size_t errlen, const char *fmt, va_list ap)
{
  if (err != NULL && errlen > 0)
    vsnprintf(err, errlen, fmt, ap);
}

int
spot_default_path(const char *env, const char *leaf, const char *fallback,
                  char **out)
{
  const char *dir = getenv(env);
  char *v;

  if (dir != NULL && *dir != '\0') {
    size_t n = strcspn(dir, ":");

    if (asprintf(&v, "%.*s/%s", (int)n, dir, leaf) < 0)
      return -ENOMEM;
  } else {
    v = strdup(fallback);
    if (v == NULL)
      return -ENOMEM;
  }
  *out = v;
  return 0;
}

int
spot_default_socket(char **out)
{
  return spot_default_path(SPOT_SOCKET_ENV, SPOT_SOCKET_LEAF,
                           SPOT_SOCKET_FALLBACK, out);
}

#define HUGE_PAGE ((size_t)2 << 20)

void *
spot_big_alloc(size_t n, size_t huge)
{
  size_t len = (n + 4095) & ~(size_t)4095, head;
  char *p;

  if (n == 0 || len < n || len + HUGE_PAGE < len)
    return NULL;
  /* a mapping of its own, aligned to 2 MiB: head and tail trimmed */
  p = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  head = (HUGE_PAGE - ((uintptr_t)p & (HUGE_PAGE - 1))) & (HUGE_PAGE - 1);
  if (head > 0)
    munmap(p, head);
  if (HUGE_PAGE - head > 0)
    munmap(p + head + len, HUGE_PAGE - head);
  p += head;
  huge &= ~(HUGE_PAGE - 1);
  if (huge > len)
    huge = len & ~(HUGE_PAGE - 1);
  /* advice only: a kernel without THP says EINVAL, and that is fine */
  if (huge > 0)
    (void)madvise(p, huge, MADV_HUGEPAGE);
  return p;
}

void
spot_big_free(void *p, size_t n)
{
  if (p != NULL)
    munmap(p, (n + 4095) & ~(size_t)4095);
}

void
spot_fault_point(const char *name)
{
#if defined(SPOT_FAULT_POINTS) && SPOT_FAULT_POINTS
  const char *want = getenv("SPOTD_FAULT");
  size_t n = strlen(name);
  bool stop;

  if (want == NULL || strncmp(want, name, n) != 0 ||
      (want[n] != '\0' && strcmp(want + n, ":stop") != 0))
    return;
  stop = want[n] != '\0';
  fprintf(stderr, "fault point %s: %s pid %d\n", name,
          stop ? "stopping" : "killing", (int)getpid());
  fflush(stderr);
  kill(getpid(), stop ? SIGSTOP : SIGKILL);
#else
  (void)name;
#endif
}
