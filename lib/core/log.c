#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *log_progname = "spot";
static int log_max = SPOT_LOG_INFO;
static spot_log_sink_fn log_sink;
static void *log_sink_data;

void
spot_log_init(const char *progname, int max_level)
{
  const char *env;

  if (progname != NULL)
    log_progname = progname;
  log_max = max_level;
  env = getenv("SPOTD_LOG_LEVEL");
  if (env != NULL && env[0] >= '0' && env[0] <= '7' && env[1] == '\0')
    log_max = env[0] - '0';
}

void
spot_log_set_level(int max_level)
{
  log_max = max_level;
}

int
spot_log_get_level(void)
{
  return log_max;
}

void
spot_log_set_sink(spot_log_sink_fn fn, void *data)
{
  log_sink = fn;
  log_sink_data = data;
}

static const char *
level_name(int level)
{
  switch (level) {
  case SPOT_LOG_ERR:
    return "error";
  case SPOT_LOG_WARNING:
    return "warning";
  case SPOT_LOG_NOTICE:
    return "notice";
  case SPOT_LOG_INFO:
    return "info";
  default:
    return "debug";
  }
}

/* "2026-12-03T08:05:20.123Z": UTC with milliseconds, so lines of spotd,
 * spotctl and the relaunch step sort and compare across machines. */
static void
timestamp(char *buf, size_t size)
{
  struct timespec ts;
  struct tm tm;
  char sec[32];

  if (clock_gettime(CLOCK_REALTIME, &ts) < 0 ||
      gmtime_r(&ts.tv_sec, &tm) == NULL ||
      strftime(sec, sizeof(sec), "%Y-%m-%dT%H:%M:%S", &tm) == 0) {
    buf[0] = '\0';
    return;
  }
  snprintf(buf, size, "%s.%03ldZ ", sec, ts.tv_nsec / 1000000);
}

void
spot_logv(int level, const char *fmt, va_list ap)
{
  char line[2048];
  char when[64];
  int saved = errno;
  int n;

  if (level > log_max) {
    errno = saved;
    return;
  }
  n = vsnprintf(line, sizeof(line), fmt, ap);
  if (n < 0)
    line[0] = '\0';
  /* One event, one line: fold embedded newlines. */
  for (char *p = line; *p != '\0'; p++)
    if (*p == '\n' || *p == '\r')
      *p = ' ';
  if (log_sink != NULL) {
    log_sink(level, line, log_sink_data);
  } else if (getenv("JOURNAL_STREAM") != NULL) {
    fprintf(stderr, "<%d>%s\n", level, line); /* journald adds the time */
  } else {
    timestamp(when, sizeof(when));
    fprintf(stderr, "%s%s: %s: %s\n", when, log_progname, level_name(level),
            line);
  }
  errno = saved;
}

void
spot_log(int level, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  spot_logv(level, fmt, ap);
  va_end(ap);
}

int
spot_log_errno(int level, int err, const char *fmt, ...)
{
  char msg[1536];
  va_list ap;
  int saved = errno;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  spot_log(level, "%s: %s", msg, strerror(err < 0 ? -err : err));
  errno = saved;
  return err;
}
