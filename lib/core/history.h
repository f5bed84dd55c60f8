/* The job history: what happened to a job, one small JSON event at a time,
 * and the summary a user reads ("2 runs, 1 preemption, 7 min lost"). Pure:
 * encode, strict parse and the summary; lib/io/store/history_store.h writes the
 * events to the store and reads them back.
 *
 * An event is one JSON object (at most SPOT_HIST_EVENT_MAX bytes):
 *   {"v":1,"type":"checkpoint","time_ms":1764748800000,"owner":"node-a-1f3e",
 *    "seq":4,"checkpoint":"step-1200","reason":"periodic","save_s":2.5,
 *    "upload_s":9.1,"raw_bytes":..., "stored_bytes":..., "committed":true}
 * "owner" names one spotd process (one node, one rank: the writer picks it
 * once, e.g. host + pid + random); "seq" counts that owner's events from
 * 0. Fields equal to their default are left out; a parser ignores keys it
 * does not know (a newer writer), and rejects a known key of the wrong type,
 * out of range or too long, and an event over the size cap.
 *
 * Which fields each type carries (all optional but the header):
 *   run_start   host, instance_id, instance_type, zone, restart_count,
 *               run (the run id of a multi-node job), rank, nranks
 *   restore     checkpoint, raw_bytes, stored_bytes, seconds, step
 *   checkpoint  checkpoint, reason, save_s, upload_s, raw_bytes,
 *               stored_bytes, committed, step (time_ms = commit or failure)
 *   notice      kind, deadline_ms, step (time_ms = when seen)
 *   run_end     outcome, committed (final checkpoint), lost_s, step,
 *               exit_code, exit_signal; reason (outcome "refused": why
 *               spotd did not start the trainer, e.g. "lease-held";
 *               outcome "crashed": "restarts-used" when the trainer
 *               failed once more with all --max-restarts used)
 *   relaunch    backend, result, reason
 *   lease       action ("waiting", "acquired"/"held", "renewed", "lost",
 *               "released", "failed"), epoch
 *   restart     the trainer failed and is started again in place:
 *               restart_count (this restart, 1..), exit_code,
 *               exit_signal, checkpoint (resumed from), seconds (backoff),
 *               down_s (the trainer's exit -> started again: the backoff
 *               and the restore; time_ms = started again), step (the
 *               newest step the failed trainer reported)
 *   progress    step (the trainer's newest reported step, written now and
 *               then so that the step a killed node reached is known)
 * step is the trainer's step when it reports one (-1 unknown).
 *
 * Runs: a single-node job's run is one owner. The spotd processes of a
 * multi-node job (one per rank) share a run id: they are the nodes of one
 * run, and the summary counts the run once. */
#ifndef SPOT_HISTORY_H
#define SPOT_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPOT_HIST_VERSION 1
#define SPOT_HIST_EVENT_MAX 4096 /* bytes of one encoded event */
#define SPOT_HIST_OWNER_MAX 64   /* [A-Za-z0-9._-], it goes into a key */
#define SPOT_HIST_STR_MAX 64     /* host, instance id, zone, ... */
#define SPOT_HIST_WORD_MAX 32    /* reason, kind, outcome, ... */
#define SPOT_HIST_NAME_MAX 128   /* checkpoint names (store.c's limit) */

enum spot_hist_type {
  SPOT_HIST_RUN_START = 0,
  SPOT_HIST_RESTORE,
  SPOT_HIST_CHECKPOINT,
  SPOT_HIST_NOTICE,
  SPOT_HIST_RUN_END,
  SPOT_HIST_RELAUNCH,
  SPOT_HIST_LEASE,
  SPOT_HIST_RESTART,
  SPOT_HIST_PROGRESS,
  SPOT_HIST_LAST,
};

struct spot_hist_event {
  enum spot_hist_type type;
  int64_t time_ms; /* wall clock, ms since the epoch */
  char owner[SPOT_HIST_OWNER_MAX + 1];
  uint64_t seq;
  int64_t step; /* -1 unknown */
  /* run_start */
  char host[SPOT_HIST_STR_MAX + 1];
  char instance_id[SPOT_HIST_STR_MAX + 1];
  char instance_type[SPOT_HIST_STR_MAX + 1];
  char zone[SPOT_HIST_STR_MAX + 1];
  int64_t restart_count;
  char run[SPOT_HIST_OWNER_MAX + 1]; /* multi-node run id, "" none */
  int64_t rank, nranks;              /* -1 / 0 single node */
  /* restore, checkpoint */
  char checkpoint[SPOT_HIST_NAME_MAX + 1];
  uint64_t raw_bytes, stored_bytes;
  double seconds; /* restore: how long it took; restart: the backoff */
  double down_s;  /* restart: the trainer's exit -> started again */
  /* checkpoint: reason "periodic", "notice", "manual", "trainer", ... */
  char reason[SPOT_HIST_WORD_MAX + 1]; /* also relaunch: SPOTD_REASON */
  double save_s;                       /* trainer's signal -> folder complete */
  double upload_s; /* folder complete -> committed (or failed) */
  bool committed;  /* checkpoint; run_end: the final checkpoint */
  /* notice: kind "aws-spot-terminate", "gcp-preempted", ... */
  char kind[SPOT_HIST_WORD_MAX + 1];
  int64_t deadline_ms; /* -1 unknown */
  /* run_end: outcome "preempted", "exited", "crashed", "stopped",
   * "refused" */
  char outcome[SPOT_HIST_WORD_MAX + 1];
  double lost_s;                  /* as the engine measured it, -1 unknown */
  int64_t exit_code, exit_signal; /* -1 / 0 when none */
  /* relaunch */
  char backend[SPOT_HIST_WORD_MAX + 1];
  char result[SPOT_HIST_WORD_MAX + 1]; /* "ok", "failed", ... */
  /* lease */
  char action[SPOT_HIST_WORD_MAX + 1];
  int64_t epoch;
};

/* Sets the defaults (step -1, deadline_ms -1, lost_s -1, exit_code -1, the
 * rank -1, the rest zero/empty) and the header. Returns -EINVAL for a bad type
 * or an owner that is empty, too long or has a character outside
 * [A-Za-z0-9._-]. */
int spot_hist_event_init(struct spot_hist_event *ev, enum spot_hist_type type,
                         int64_t time_ms, const char *owner, uint64_t seq);
/* Copies src into a fixed field, -E2BIG when it does not fit (the field is
 * then left as it was). */
int spot_hist_set_str(char *field, size_t size, const char *src);
#define SPOT_HIST_SET(ev, field, src)                                          \
  spot_hist_set_str((ev)->field, sizeof((ev)->field), (src))

const char *spot_hist_type_name(enum spot_hist_type t);
bool spot_hist_owner_valid(const char *owner);

/* Encodes one event as compact JSON into a new string (free() it).
 * Returns 0, -EINVAL (invalid header) or -ENOMEM. */
int spot_hist_encode(const struct spot_hist_event *ev, char **out);
/* Strict parse of one event; err gets one line on failure. Returns 0 or
 * -EINVAL / -E2BIG (over SPOT_HIST_EVENT_MAX). */
int spot_hist_parse(const char *json, size_t len, struct spot_hist_event *out,
                    char *err, size_t errsize);

/* Sorts events by time, then owner, then seq. */
void spot_hist_sort(struct spot_hist_event *ev, size_t n);

/* The summary. */
enum spot_hist_outcome {
  SPOT_HIST_RUNNING = 0, /* no end recorded and the last run of the job */
  SPOT_HIST_EXITED,      /* the trainer finished (run_end "exited") */
  SPOT_HIST_PREEMPTED,   /* a notice, or run_end "preempted" */
  SPOT_HIST_CRASHED,     /* lost without a notice or a run_end */
  SPOT_HIST_STOPPED,     /* run_end "stopped" (SIGTERM, operator) */
  SPOT_HIST_REFUSED,     /* run_end "refused": the trainer never started */
  SPOT_HIST_OUTCOME_LAST,
};

/* One spotd process (one owner): a node of a run. */
struct spot_hist_node {
  const char *owner, *host, *instance_id, *instance_type, *zone;
  const char *run_id;      /* "" single node */
  int64_t rank;            /* -1 single node */
  size_t run;              /* index into the summary's runs */
  const char *restored;    /* checkpoint restored at start, or "" */
  double restore_s;        /* 0 when nothing was restored */
  int64_t start_ms;        /* run_start (or the first event of the owner) */
  int64_t lease_wait_ms;   /* lease "waiting" -> "held"/"failed", 0 none */
  int64_t lease_from_ms;   /* when that wait began (-1 none) */
  int64_t restore_from_ms; /* restore begun (-1 nothing restored) */
  int64_t train_start_ms;  /* after the restore (or the lease wait) */
  int64_t end_ms;          /* run_end, else the owner's last event */
  enum spot_hist_outcome outcome;
  const char *refused; /* outcome REFUSED: why, e.g. "lease-held" */
  bool noticed;
  int64_t notice_ms;
  const char *notice_kind;
  unsigned checkpoints, commits;
  double save_s, upload_s;
  bool final_committed;
  int64_t last_step; /* newest step the trainer reported, -1 none */
  /* Interrupted nodes only (preempted, crashed), else -1: the training
   * between the state the job resumed from (the next run's restore when
   * its checkpoint is known, else the newest checkpoint committed before
   * the end, else the state this node started from) and the notice, or the
   * end when no notice came (a killed node's end is its last progress
   * event). A final checkpoint committed after the notice saves
   * everything: 0. Steps when both ends reported one. */
  int64_t lost_ms, lost_steps;
  int64_t exit_code, exit_signal;
  /* Checkpoint commit times of this node (for the plot), borrowed. */
  const int64_t *commit_times;
  size_t ncommit_times;
  /* Restarts in place (the trainer failed, spotd started it again): how
   * many; the work they lost, each from the failure back to the state of
   * the checkpoint it resumed from (steps -1: not reported); the time the
   * trainer was down (backoff and restore: no training). lost_ms and
   * lost_steps above include restart_lost_*; a node that only restarted
   * has them too. restart_times: per restart 3 values (failed at, running
   * again at, state resumed), borrowed. */
  unsigned restarts;
  int64_t restart_lost_ms, restart_lost_steps, down_ms;
  const int64_t *restart_times;
  size_t nrestart_times;
  bool exhausted;  /* ended as the trainer failed with all restarts used */
  bool lost_bound; /* lost_ms is a lower bound: killed, and its trainer
                      never reported a step (its last event is all known) */
};

/* One run: one run id (multi-node), else one node. */
struct spot_hist_run {
  const char *run_id; /* "" single node */
  size_t nnodes;      /* nodes with node.run == this run's index */
  const char *owner, *host, *restored, *notice_kind; /* its first node's */
  int64_t start_ms;                                  /* the earliest node's */
  int64_t train_start_ms;         /* the last node ready to train (ranks train
                                     together) */
  int64_t end_ms;                 /* the latest node's */
  enum spot_hist_outcome outcome; /* preempted > crashed > running >
                                     stopped > exited > refused */
  const char *refused;
  bool noticed;
  int64_t notice_ms;
  unsigned checkpoints, commits, failed; /* the node with the most */
  double save_s, upload_s;               /* the nodes in parallel: most */
  double restore_s;
  int64_t lease_wait_ms;
  bool final_committed;        /* every node that ended committed its final */
  int64_t lost_ms, lost_steps; /* the most any node lost, -1 none */
  int64_t gap_before_ms;       /* previous trained run's end -> this
                                  run training; -1 */
  int64_t exit_code, exit_signal; /* the first node's that has one */
  unsigned restarts;              /* the node with the most */
  int64_t down_ms;                /* the most any node was down */
  bool exhausted, lost_bound;     /* any node's */
};

struct spot_hist_summary {
  struct spot_hist_run *runs; /* by start time */
  size_t nruns;
  struct spot_hist_node *nodes; /* by start time */
  size_t nnodes;
  unsigned trained_runs; /* runs that were not refused */
  unsigned preemptions, crashes, refused, notices, checkpoints, commits, failed;
  unsigned relaunches, relaunch_failures, lease_changes;
  unsigned restarts;  /* a failed trainer started again in place */
  unsigned exhausted; /* runs that ended with all restarts used */
  int64_t down_ms;    /* sum of runs' restart downtime (not training) */
  bool lost_bound;    /* lost_ms is a lower bound (lost_bound runs) */
  int64_t first_ms, last_ms;
  int64_t wall_ms;       /* first event -> last event */
  int64_t node_ms;       /* sum of nodes' start -> end: what the nodes cost */
  int64_t train_ms;      /* sum of runs' training time (job time) */
  int64_t lost_ms;       /* sum over interrupted runs */
  int64_t lost_steps;    /* -1 when no run reported steps */
  int64_t lease_wait_ms; /* sum over runs */
  int64_t gap_ms;        /* sum of resume gaps */
  int64_t max_gap_ms;
  double save_s, upload_s; /* over all runs' checkpoints */
  double overhead;         /* save_s / training seconds (0..) */
  /* Prices per hour, when both were given (> 0): */
  bool priced;
  double price_spot, price_on_demand;
  double cost_spot;      /* node time at the spot price */
  double cost_on_demand; /* the useful training (train - lost) on demand,
                            one node per rank */
  double saving;         /* cost_on_demand - cost_spot */
  int64_t *times_;       /* storage behind commit_times */
  int64_t *rtimes_;      /* storage behind restart_times */
};

/* Computes the summary of events sorted with spot_hist_sort(). The
 * summary borrows strings from ev, which must outlive it. price_* <= 0:
 * no cost figures. Returns 0 or -ENOMEM. */
int spot_hist_summarize(const struct spot_hist_event *ev, size_t n,
                        double price_spot, double price_on_demand,
                        struct spot_hist_summary *out);
void spot_hist_summary_fini(struct spot_hist_summary *s);
const char *spot_hist_outcome_name(enum spot_hist_outcome o);

/* The summary (and the events when ev != NULL) as one JSON document for
 * scripts: {"job":..., "summary":{...}, "runs":[...], "events":[...]}.
 * Durations in seconds. Returns 0 or -ENOMEM; free() *out. */
int spot_hist_summary_json(const struct spot_hist_summary *s, const char *job,
                           const struct spot_hist_event *ev, size_t n,
                           char **out);

#endif
