/* The job history in the store (lib/core/history.h has the event format
 * and the summary), and the metrics file for node_exporter.
 *
 * Layout, under the job root ROOT = PREFIX/JOB (README "Store layout"):
 *   ROOT/history/<time_ms, 13 digits>-<owner>-<seq, 6 digits>.json
 * one small object per event (S3 has no append), so keys sort by time and
 * writers never collide: each spotd run has its own owner.
 *
 * The writer (struct spot_history) is fire-and-forget: emit() encodes the
 * event and queues it; one PUT at a time drains the queue in order. A
 * failed write is a warning (logged, and passed to the report callback),
 * never an error of the caller; a full queue drops its oldest waiting
 * event. Nothing waits for it: it never delays a checkpoint. Every
 * SPOT_HISTORY_PRUNE_EVERY writes (once the queue is empty, also while
 * closing) it lists ROOT/history/ and deletes the oldest events beyond
 * `keep`.
 *
 * Engine API (the lead wires this into daemon/engine.c; h is the
 * engine's writer, made at start next to the store config):
 *
 *   start:      spot_history_new(loop, &store_cfg, &opts, report, data, &h)
 *               then emit RUN_START (host, instance_id/type, zone from the
 *               metadata poller when known, restart_count = RESTART_COUNT)
 *   restore:    RESTORE when the restore before launch ends (checkpoint,
 *               raw/stored bytes, seconds; step if the manifest has one)
 *   checkpoint: CHECKPOINT when an upload ends, committed or not (reason,
 *               save_s = signal -> SPOTD_COMPLETE, upload_s = complete ->
 *               commit, raw/stored bytes, committed; step when reported)
 *   notice:     NOTICE when the poller reports one (kind, deadline_ms)
 *   end:        RUN_END when the trainer is gone and the final checkpoint
 *               is settled (outcome "preempted" | "exited" | "crashed" |
 *               "stopped", committed = the final checkpoint committed,
 *               lost_s = seconds since the last commit's state if known,
 *               exit_code / exit_signal)
 *   relaunch:   RELAUNCH when the relaunch command ends (backend, result
 *               "ok" | "failed", reason = SPOTD_REASON)
 *   lease:      LEASE on each lease change (action, epoch)
 *   exit:       spot_history_close(h, 5000, cb, data) after the relaunch:
 *               waits at most 5 s for queued events, then cancels them.
 * Each emit is: struct spot_hist_event ev;
 *               spot_history_event_init(h, &ev, SPOT_HIST_CHECKPOINT);
 *               ...fill fields (SPOT_HIST_SET for strings)...
 *               spot_history_emit(h, &ev);   (a return < 0 is a warning)
 *
 * Callback contract: if a function taking a callback returns < 0 the
 * callback never runs. The report callback runs once per emitted event
 * that was queued, with 0 (written) or a negative errno (-ECANCELED when
 * dropped by close or a full queue): from the loop, or before emit()
 * returns when the request cannot even start (no credentials). */
#ifndef SPOT_HISTORY_STORE_H
#define SPOT_HISTORY_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/history.h"
#include "io/store/store.h"

#define SPOT_HISTORY_QUEUE_DEFAULT 64
#define SPOT_HISTORY_KEEP_DEFAULT 5000
#define SPOT_HISTORY_PRUNE_EVERY 64
#define SPOT_HISTORY_READ_MAX 10000  /* events a reader returns, newest */
#define SPOT_HISTORY_LIST_MAX 100000 /* keys a reader or pruner lists */

struct spot_history_options {
  const char *owner;  /* NULL: spot_history_default_owner() */
  unsigned queue_max; /* events waiting, 0 = SPOT_HISTORY_QUEUE_DEFAULT */
  unsigned keep;      /* events kept in the store, 0 = default */
  /* spotd: once a PROGRESS event is written, delete the previous one this
   * writer wrote (only the newest counts; frequent ones would crowd the
   * other events out of the `keep` newest). */
  bool replace_progress;
};

struct spot_history;

/* One report per queued event: err 0 written, < 0 failed (a warning);
 * key is the object's key, message one line ("" on success). */
typedef void (*spot_history_report_cb)(int err, const char *key,
                                       const char *message, void *data);
typedef void (*spot_history_close_cb)(void *data);

/* cfg->s3, bucket, prefix and job are used (copied; s3 must outlive the
 * writer). report may be NULL. */
int spot_history_new(uv_loop_t *loop, const struct spot_store_config *cfg,
                     const struct spot_history_options *opt,
                     spot_history_report_cb report, void *data,
                     struct spot_history **out);
/* The owner of this writer's events. */
const char *spot_history_owner(const struct spot_history *h);
/* Initializes ev for this writer: type, time now, owner, next seq. */
int spot_history_event_init(struct spot_history *h, struct spot_hist_event *ev,
                            enum spot_hist_type type);
/* Queues ev (any owner/seq/time: spotctl history-event writes events it
 * parsed). Returns 0 (queued: report runs later), -EINVAL (ev does not
 * encode), -ESHUTDOWN (closing) or -ENOMEM. */
int spot_history_emit(struct spot_history *h, const struct spot_hist_event *ev);
/* Stops taking events, writes what is queued for at most drain_ms (0: not
 * at all, cancel now), then frees the writer and runs cb (may be NULL)
 * from the loop. Returns 0, or -EALREADY when already closing. */
int spot_history_close(struct spot_history *h, uint64_t drain_ms,
                       spot_history_close_cb cb, void *data);

/* "host-pid-xxxx" with only [A-Za-z0-9._-], at most SPOT_HIST_OWNER_MAX. */
void spot_history_default_owner(char *buf, size_t size);
/* ROOT/history/<time>-<owner>-<seq>.json into out. */
int spot_history_key(const struct spot_store_config *cfg,
                     const struct spot_hist_event *ev, struct spot_buf *out);

/* Reading a job's history: list ROOT/history/, GET each event (8 at a
 * time, SPOT_HIST_EVENT_MAX bytes each), parse, sort. Events that do not
 * parse are counted in `skipped` and left out. */
struct spot_history_read_result {
  int err;                              /* 0 or negative errno */
  const char *message;                  /* one line when err < 0, else "" */
  const struct spot_hist_event *events; /* sorted (spot_hist_sort) */
  size_t n;
  unsigned skipped; /* objects that were not valid events */
  size_t truncated; /* older events left out beyond READ_MAX */
};
typedef void (*spot_history_read_cb)(const struct spot_history_read_result *r,
                                     void *data);
struct spot_history_read;

int spot_history_read(uv_loop_t *loop, const struct spot_store_config *cfg,
                      spot_history_read_cb cb, void *data,
                      struct spot_history_read **op);
/* Legal until the callback has run; the callback runs later, from the
 * loop, with -ECANCELED (never before this returns). */
void spot_history_read_cancel(struct spot_history_read *op);

/* Metrics file for node_exporter's textfile collector: writes text to a
 * temporary file next to path, fsyncs it, renames it over path (so a
 * reader sees the old or the new file, never half of one) and fsyncs the
 * folder. Blocking but small (a few KiB). Returns 0 or negative errno. */
int spot_metrics_write_file(const char *path, const char *text);

#endif
