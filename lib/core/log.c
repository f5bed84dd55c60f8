#include "core/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *log_progname = "spot";
static int log_max = SPOT_LOG_INFO;
static spot_log_sink_fn log_sink;
static void *log_sink_data;
/* Lines come from the loop's thread and, rarely, from the S3 client's
 * I/O threads and the store's workers: a sink (the daemon's journald one
 * keeps static buffers) sees one line at a time. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

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
  pthread_mutex_lock(&log_mu);
  if (log_sink != NULL) {
    log_sink(level, line, log_sink_data);
  } else if (getenv("JOURNAL_STREAM") != NULL) {
    fprintf(stderr, "<%d>%s\n", level, line); /* journald adds the time */
  } else {
    timestamp(when, sizeof(when));
    fprintf(stderr, "%s%s: %s: %s\n", when, log_progname, level_name(level),
            line);
  }
  pthread_mutex_unlock(&log_mu);
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

/* ------------------------------------------------------------ fields */

/* Copies the word at p (up to a space, ')', ',' or the end; a trailing
 * ':' or '.' dropped) into out. */
static void
copy_word(const char *p, char *out, size_t size)
{
  size_t n = strcspn(p, " ),;\t");

  while (n > 0 && (p[n - 1] == ':' || p[n - 1] == '.'))
    n--;
  if (n >= size)
    n = size - 1;
  memcpy(out, p, n);
  out[n] = '\0';
}

/* The value of a " key=" token (or one at the start of the line). */
static bool
token(const char *line, const char *key, char *out, size_t size)
{
  size_t klen = strlen(key);

  for (const char *p = strstr(line, key); p != NULL; p = strstr(p + 1, key))
    if ((p == line || p[-1] == ' ' || p[-1] == '(') && p[klen] == '=') {
      copy_word(p + klen + 1, out, size);
      return out[0] != '\0';
    }
  return false;
}

static bool
is_verb(const char *w)
{
  static const char *const verbs[] = {
      "requested", "is", "of", "folder", "signal", "could", "needs",
      "name",      "in", "to", "from",   "left",   "the",   "with",
  };

  for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
    if (strcmp(w, verbs[i]) == 0)
      return true;
  return false;
}

bool
spot_log_fields(const char *line, struct spot_log_fields *f)
{
  const char *p;

  f->checkpoint[0] = f->reason[0] = '\0';
  if (!token(line, "name", f->checkpoint, sizeof(f->checkpoint)) &&
      !token(line, "checkpoint", f->checkpoint, sizeof(f->checkpoint))) {
    for (p = strstr(line, "checkpoint "); p != NULL;
         p = strstr(p + 1, "checkpoint ")) {
      copy_word(p + strlen("checkpoint "), f->checkpoint,
                sizeof(f->checkpoint));
      if (f->checkpoint[0] != '\0' && !is_verb(f->checkpoint) &&
          strspn(f->checkpoint,
                 "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopq"
                 "rstuvwxyz0123456789._-") == strlen(f->checkpoint))
        break;
      f->checkpoint[0] = '\0';
    }
  }
  if (!token(line, "reason", f->reason, sizeof(f->reason))) {
    if ((p = strstr(line, "checkpoint requested (")) != NULL) {
      size_t n;

      p += strlen("checkpoint requested (");
      n = strcspn(p, ")");
      if (n >= sizeof(f->reason))
        n = sizeof(f->reason) - 1;
      memcpy(f->reason, p, n);
      f->reason[n] = '\0';
    } else if ((p = strstr(line, "interruption notice: ")) != NULL) {
      copy_word(p + strlen("interruption notice: "), f->reason,
                sizeof(f->reason));
    }
  }
  return f->checkpoint[0] != '\0' || f->reason[0] != '\0';
}
