/* Metrics for monitoring: a small registry of counters, gauges and
 * histograms with labels, rendered in the Prometheus text exposition
 * format (version 0.0.4, what node_exporter's textfile collector and
 * Prometheus scrape). Pure: no I/O; lib/io/store/history_store.h has
 * spot_metrics_write_file() for the textfile collector.
 *
 * Bounded: at most SPOT_METRICS_FAMILIES families, SPOT_METRICS_SERIES
 * label sets per family (an update beyond that returns -ENOSPC and is
 * dropped), SPOT_METRICS_BUCKETS buckets, label values of 128 bytes.
 *
 * spotd's metrics (spot_metrics_new_spotd() registers them all) and the
 * engine events that update them (the lead wires these into
 * daemon/engine.c; L = the label list):
 *
 *   spotd_checkpoints_total{reason,outcome}   counter
 *       a checkpoint ends: spot_metrics_add(m, SPOT_M_CHECKPOINTS,
 *       L("reason", "periodic|notice|manual|trainer", "outcome",
 *       "committed|failed"), 1)
 *   spotd_checkpoint_save_seconds             histogram
 *       the trainer's folder is complete: observe(signal -> marker seconds)
 *   spotd_checkpoint_upload_seconds           histogram
 *       the upload ends (committed or not): observe(marker -> end seconds)
 *   spotd_uploaded_bytes_total{kind}          counter
 *       a commit: add(kind="raw", raw_bytes), add(kind="stored", stored)
 *   spotd_last_commit_timestamp_seconds       gauge
 *       a commit: set(wall clock seconds)
 *   spotd_work_at_risk_seconds                gauge
 *       before each render: set(now - last commit, or - trainer start
 *       when nothing is committed yet)
 *   spotd_notices_total{kind}                 counter
 *       a notice is seen: add(kind="aws-spot-terminate"..., 1)
 *   spotd_metadata_poll_errors_total          counter
 *       a metadata poll fails: add(1)
 *   spotd_relaunches_total{outcome}           counter
 *       the relaunch command ends: add(outcome="ok|failed", 1)
 *   spotd_restore_duration_seconds            gauge
 *       the restore at start ends: set(seconds)
 *   spotd_trainer_restarts_total              counter
 *       the trainer is started again (SPOTD_RESTART_COUNT > 0 at start:
 *       add(restart count); a restart in place: add(1))
 *
 * Every family whose samples all carry labels of their own (checkpoints,
 * uploaded bytes, notices, relaunches) has no sample until its first
 * update: a family starts with a 0 sample only when it has no labels. And
 * spot_metrics_common_labels() gives every sample spotd renders its job
 * and rank (job="llm-7b",rank="0"), so the files of several jobs or ranks
 * on one node_exporter stay apart.
 *
 * Then spot_metrics_render() for `spotctl metrics` (control socket) and
 * spot_metrics_write_file() for --metrics-file, on a timer and after each
 * change worth seeing (a commit, a notice). */
#ifndef SPOT_METRICS_H
#define SPOT_METRICS_H

#include <stddef.h>

#include "core/buf.h"

#define SPOT_METRICS_FAMILIES 32
#define SPOT_METRICS_SERIES 64
#define SPOT_METRICS_BUCKETS 16
#define SPOT_METRICS_LABEL_MAX 128

#define SPOT_M_CHECKPOINTS "spotd_checkpoints_total"
#define SPOT_M_SAVE_SECONDS "spotd_checkpoint_save_seconds"
#define SPOT_M_UPLOAD_SECONDS "spotd_checkpoint_upload_seconds"
#define SPOT_M_UPLOADED_BYTES "spotd_uploaded_bytes_total"
#define SPOT_M_LAST_COMMIT "spotd_last_commit_timestamp_seconds"
#define SPOT_M_WORK_AT_RISK "spotd_work_at_risk_seconds"
#define SPOT_M_NOTICES "spotd_notices_total"
#define SPOT_M_META_ERRORS "spotd_metadata_poll_errors_total"
#define SPOT_M_RELAUNCHES "spotd_relaunches_total"
#define SPOT_M_RESTORE_SECONDS "spotd_restore_duration_seconds"
#define SPOT_M_TRAINER_RESTARTS "spotd_trainer_restarts_total"

enum spot_metric_type {
  SPOT_METRIC_COUNTER = 0,
  SPOT_METRIC_GAUGE,
  SPOT_METRIC_HISTOGRAM,
  SPOT_METRIC_LAST,
};

struct spot_metrics;

/* A label list: name, value, name, value, ..., NULL. NULL = no labels. */
#define SPOT_LABELS(...) ((const char *const[]){__VA_ARGS__, NULL})

int spot_metrics_new(struct spot_metrics **out);
void spot_metrics_free(struct spot_metrics *m);
/* An empty registry with spotd's metrics above registered. */
int spot_metrics_new_spotd(struct spot_metrics **out);

/* name: [a-zA-Z_:][a-zA-Z0-9_:]*; counters should end in _total. help is
 * one line. Histograms take strictly increasing finite bounds (copied;
 * +Inf is implicit). A family without labels starts at 0 and is always
 * rendered; a labelled series appears on its first update. Returns 0,
 * -EINVAL, -EEXIST, -ENOSPC or -ENOMEM. */
int spot_metrics_register(struct spot_metrics *m, const char *name,
                          enum spot_metric_type type, const char *help,
                          const double *bounds, size_t nbounds);
/* The same for a family whose every sample has labels: no sample until
 * the first update (no stray unlabelled 0). */
int spot_metrics_register_labelled(struct spot_metrics *m, const char *name,
                                   enum spot_metric_type type, const char *help,
                                   const double *bounds, size_t nbounds);
/* Labels every rendered sample carries first (name, value, ..., NULL;
 * copied; NULL clears them), e.g. the job and rank. Returns 0, -EINVAL
 * or -ENOMEM. */
int spot_metrics_common_labels(struct spot_metrics *m,
                               const char *const *labels);
/* Counter: adds v >= 0. Gauge: adds v (any sign). */
int spot_metrics_add(struct spot_metrics *m, const char *name,
                     const char *const *labels, double v);
/* Gauge only. */
int spot_metrics_set(struct spot_metrics *m, const char *name,
                     const char *const *labels, double v);
/* Histogram only. */
int spot_metrics_observe(struct spot_metrics *m, const char *name,
                         const char *const *labels, double v);
/* The current value of a counter or gauge series (-ENOENT when absent). */
int spot_metrics_get(const struct spot_metrics *m, const char *name,
                     const char *const *labels, double *out);

/* Appends the whole registry in the text format to out. Returns 0, or
 * -E2BIG / -ENOMEM from the buffer. */
int spot_metrics_render(const struct spot_metrics *m, struct spot_buf *out);

/* Helpers, exported for tests: a label value escaped (\\, \", \n), and a
 * sample value as Prometheus writes it ("+Inf", "NaN", integers without a
 * fraction). */
int spot_metrics_escape(const char *in, struct spot_buf *out);
const char *spot_metrics_fmt(double v, char *buf, size_t size);

#endif
