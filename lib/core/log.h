/* Logging: one line per event on stderr, <N> prefixes under journald
 * (which adds its own time), else "2026-12-03T08:05:20.123Z spotd: info:
 * message" (UTC, milliseconds). */
#ifndef SPOT_LOG_H
#define SPOT_LOG_H

#include <stdarg.h>
#include <stdbool.h>

enum spot_log_level {
  SPOT_LOG_ERR = 3,
  SPOT_LOG_WARNING = 4,
  SPOT_LOG_NOTICE = 5,
  SPOT_LOG_INFO = 6,
  SPOT_LOG_DEBUG = 7,
};

/* Sets the maximum level printed (default SPOT_LOG_INFO) and the program
 * name shown on each line when not under journald. */
void spot_log_init(const char *progname, int max_level);
void spot_log_set_level(int max_level);
int spot_log_get_level(void);

/* Captures log lines instead of printing them (unit tests). NULL restores
 * stderr. The callback gets the formatted line without a newline. */
typedef void (*spot_log_sink_fn)(int level, const char *line, void *data);
void spot_log_set_sink(spot_log_sink_fn fn, void *data);

/* Structured fields of one log line, for journald (the daemon's sink
 * sends them with sd_journal_send so `journalctl SPOTD_CHECKPOINT=NAME`
 * finds the line). Pure: read from the line's text only.
 *   checkpoint  a "name=X" or "checkpoint=X" token, else the word after
 *               "checkpoint " when it is a checkpoint name (not a verb:
 *               "checkpoint requested" names none)
 *   reason      a "reason=X" token, else "(X)" right after "checkpoint
 *               requested ", else the reason after "interruption notice: "
 * Empty strings when absent. Returns true when any field was found. */
#define SPOT_LOG_FIELD_MAX 128
struct spot_log_fields {
  char checkpoint[SPOT_LOG_FIELD_MAX + 1];
  char reason[SPOT_LOG_FIELD_MAX + 1];
};
bool spot_log_fields(const char *line, struct spot_log_fields *out);

/* All of these preserve errno. */
void spot_log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void spot_logv(int level, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
/* Appends ": strerror(-err)". Returns err, so callers can
 * `return log_err_errno(r, ...)`. */
int spot_log_errno(int level, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_err(...) spot_log(SPOT_LOG_ERR, __VA_ARGS__)
#define log_warn(...) spot_log(SPOT_LOG_WARNING, __VA_ARGS__)
#define log_notice(...) spot_log(SPOT_LOG_NOTICE, __VA_ARGS__)
#define log_info(...) spot_log(SPOT_LOG_INFO, __VA_ARGS__)
#define log_debug(...) spot_log(SPOT_LOG_DEBUG, __VA_ARGS__)
#define log_err_errno(r, ...) spot_log_errno(SPOT_LOG_ERR, (r), __VA_ARGS__)
#define log_warn_errno(r, ...)                                                 \
  spot_log_errno(SPOT_LOG_WARNING, (r), __VA_ARGS__)
#define log_info_errno(r, ...) spot_log_errno(SPOT_LOG_INFO, (r), __VA_ARGS__)
#define log_debug_errno(r, ...) spot_log_errno(SPOT_LOG_DEBUG, (r), __VA_ARGS__)

#endif
