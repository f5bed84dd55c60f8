/* Log lines to journald with structured fields: under systemd
 * (JOURNAL_STREAM set) each line goes through sd_journal_sendv() with
 * SPOTD_JOB, and SPOTD_CHECKPOINT / SPOTD_REASON when the line names one
 * (spot_log_fields(), lib/core/log.c), so `journalctl SPOTD_JOB=ID` or
 * `journalctl SPOTD_CHECKPOINT=NAME` finds them. The reason falls back to
 * the drain's (d->eng.reason) while one runs. When the journal refuses a line
 * it goes to stderr with its <N> prefix, as without this sink. lib/core
 * stays free of libsystemd: this is a sink (spot_log_set_sink). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>
#include <uv.h>

#include "engine.h"
#include "jlog.h"
#include "core/log.h"
#include "spotd.h"

#define JLOG_FIELDS 6
#define JLOG_FIELD_SIZE 2200

/* Lines also come from the S3 client's I/O threads and the store's
 * workers (a retry's warning during a drain), which must not read struct
 * spotd while the loop writes it (a notice after a SIGTERM rewrites
 * d->eng.reason mid-drain). The sink runs under the log's lock, one line at a
 * time: lines from the loop's thread refresh this copy of the drain's
 * reason, and every line reads the copy. */
static uv_thread_t loop_thread;
static char drain_reason[SPOT_NOTICE_REASON_MAX];

static void
add(struct iovec *iov, size_t *n, char buf[][JLOG_FIELD_SIZE], const char *key,
    const char *value)
{
  int len = snprintf(buf[*n], JLOG_FIELD_SIZE, "%s=%s", key, value);

  if (len < 0)
    return;
  iov[*n].iov_base = buf[*n];
  iov[*n].iov_len =
      (size_t)len < JLOG_FIELD_SIZE ? (size_t)len : JLOG_FIELD_SIZE - 1;
  (*n)++;
}

static void
sink(int level, const char *line, void *data)
{
  const struct spotd *d = data;
  static char buf[JLOG_FIELDS][JLOG_FIELD_SIZE];
  struct iovec iov[JLOG_FIELDS];
  struct spot_log_fields f;
  char prio[4];
  size_t n = 0;
  uv_thread_t self = uv_thread_self();

  if (uv_thread_equal(&self, &loop_thread))
    snprintf(drain_reason, sizeof(drain_reason), "%s",
             d->eng.state >= SPOTD_DRAINING ? d->eng.reason : "");
  spot_log_fields(line, &f);
  if (f.reason[0] == '\0' && drain_reason[0] != '\0')
    snprintf(f.reason, sizeof(f.reason), "%s", drain_reason);
  snprintf(prio, sizeof(prio), "%d", level);
  add(iov, &n, buf, "MESSAGE", line);
  add(iov, &n, buf, "PRIORITY", prio);
  add(iov, &n, buf, "SYSLOG_IDENTIFIER", "spotd");
  add(iov, &n, buf, "SPOTD_JOB", d->cfg->job);
  if (f.checkpoint[0] != '\0')
    add(iov, &n, buf, "SPOTD_CHECKPOINT", f.checkpoint);
  if (f.reason[0] != '\0')
    add(iov, &n, buf, "SPOTD_REASON", f.reason);
  if (sd_journal_sendv(iov, (int)n) < 0)
    fprintf(stderr, "<%d>%s\n", level, line);
}

void
jlog_start(struct spotd *d)
{
  const char *js = getenv("JOURNAL_STREAM");

  if (js != NULL && *js != '\0' && d->cfg->job != NULL) {
    loop_thread = uv_thread_self(); /* spotd starts it from its loop */
    drain_reason[0] = '\0';
    spot_log_set_sink(sink, d);
  }
}

void
jlog_stop(void)
{
  spot_log_set_sink(NULL, NULL);
}
