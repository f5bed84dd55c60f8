/* history.c: the job history and the metrics, fed by the engine (history.c;
 * no-ops without them). */
#ifndef SPOTD_HIST_H
#define SPOTD_HIST_H

#include <stdbool.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/notice.h"
#include "io/store/store.h"

struct spotd;

struct spotd_hist;
void hist_init(struct spotd *d);
void hist_open(struct spotd *d);
void hist_launched(struct spotd *d);
void hist_restored(struct spotd *d, const struct spot_store_result *res);
void hist_requested(struct spotd *d, const char *why);
void hist_complete(struct spotd *d, const char *name);
void hist_pushed(struct spotd *d, const char *name,
                 const struct spot_store_result *res);
void hist_notice(struct spotd *d, const struct spot_notice *n);
void hist_meta_error(struct spotd *d);
void hist_relaunched(struct spotd *d, bool ok);
/* The trainer exited (the start of a restart's downtime). */
void hist_exited(struct spotd *d);
/* The failed trainer starts again (RESTART); then it runs again. */
void hist_restart(struct spotd *d);
void hist_restarted(struct spotd *d);
void hist_step(struct spotd *d, int64_t step);
/* A lease change: action "acquired", "renewed", "lost" or "released". */
void hist_lease(struct spotd *d, const char *action, int64_t epoch);
/* Why spotd is not starting the trainer ("lease-held", ...): the run ends
 * as a refused start, not a crash. */
void hist_refused(struct spotd *d, const char *why);
void hist_end(struct spotd *d);
int spotd_metrics_text(struct spotd *d, struct spot_buf *out);

#endif
