/* jlog.c: log lines to journald with structured fields. */
#ifndef SPOTD_JLOG_H
#define SPOTD_JLOG_H

struct spotd;

/* jlog.c: under journald, log lines with SPOTD_JOB, SPOTD_CHECKPOINT and
 * SPOTD_REASON fields (a log sink; jlog_stop() before d goes away). */
void jlog_start(struct spotd *d);
void jlog_stop(void);

#endif
