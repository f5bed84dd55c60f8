/* spotd internals: one struct spotd owns every libuv handle of the
 * daemon (docs/design.md describes the state machines). Files (all but
 * main.c build libspotd, so tests can link the engine in-process):
 *   main.c     arguments, config, signals, sd_notify, the loop
 *   engine.c   the engine's state machine (enum spotd_state): start,
 *              notices, drain, stop, exit status, close
 *   upload.c   checkpoint requests, uploads, the final checkpoint
 *              (enum final_state)
 *   restore.c  the startup: credentials, journal resume, restore
 *              (enum restore_state)
 *   probe.c    the store check of the startup (PUT, GET, DELETE a probe)
 *   lease.c    the job lease around the engine (enum job_lease_state)
 *   fallback.c an older committed checkpoint when the newest is damaged
 *   journal.c  the journal scan: an upload a killed spotd left
 *   restarts.c the store's RESTARTS counter (SPOTD_RESTART_COUNT), and the
 *              restart of a failed trainer (--max-restarts): backoff,
 *              the newest commit (its local copy when it verifies), start
 *              (enum crash_step)
 *   runjoin.c  the run id a multi-node job agrees through the store
 *   fanout.c   multi-node: the job-wide notice, the relaunch claim, peer
 *              loss (enum fanout_state, enum fanout_claim)
 *   relaunch.c the relaunch step (enum relaunch_state, its own timer)
 *   trainer.c  the training command on lib/io/child.c
 *   request.c  the checkpoint request: the request file, the signal to the
 *              processes of the trainer's tree that catch it
 *              (enum req_state)
 *   watch.c    SPOTD_CKPT_DIR with inotify (uv_fs_event): complete
 *              checkpoint folders
 *   control.c  the control socket (JSON lines, SO_PEERCRED)
 *   status.c   `spotctl status`
 *   history.c  the job history and the metrics, fed by the engine
 *   jlog.c     log lines to journald with structured fields
 *
 * Handle lifecycle: every handle is embedded in struct spotd (or a struct
 * it owns); spotd_close() closes them all; uv_run() then returns, the
 * loop then ends and main() requires uv_loop_close() == 0. Once closing,
 * the engine's state only moves to EXITING and every callback that can
 * still arrive (a cancelled store operation, a timer) does nothing. */
#ifndef SPOTD_H
#define SPOTD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "aws.h"
#include "child.h"
#include "config.h"
#include "http.h"
#include "lease.h"
#include "meta.h"
#include "notice.h"
#include "proto.h"
#include "s3.h"
#include "store.h"

#define SPOTD_NAMES_MAX 64 /* checkpoint folders remembered */
#define SPOTD_WATCH_MAX 64 /* subfolders watched for SPOTD_COMPLETE */
#define SPOTD_COMPLETE "SPOTD_COMPLETE"

/* Exit statuses (README "Exit status"). Apart from the trainer's own
 * status (mirrored) and a signal's 128+N, spotd's statuses lie in the
 * sysexits range, so a trainer's usual 1 or 2 is never taken for one. */
/* A bad command line: an unknown option, no training command (EX_USAGE). */
#define SPOTD_EXIT_USAGE 64
/* The store's data cannot be used: no committed checkpoint verifies, or
 * it was written by another rank count (EX_DATAERR). */
#define SPOTD_EXIT_DATAERR 65
/* The store or the job lease is not available: the lease held elsewhere
 * (--no-lease-wait, --lease-wait), the store unusable at start, or the
 * trainer's last checkpoint not committed (EX_UNAVAILABLE). */
#define SPOTD_EXIT_UNAVAILABLE 69
/* The trainer kept failing: --max-restarts used up (EX_SOFTWARE). */
#define SPOTD_EXIT_SOFTWARE 70
/* Any other failure of spotd itself (EX_OSERR). */
#define SPOTD_EXIT_ERROR 71
/* The job lease was lost while running (another node took it over):
 * nothing more was committed, the trainer was stopped (README). */
#define SPOTD_EXIT_LEASE_LOST 73
/* A local I/O error while restoring into the checkpoint folder: no space,
 * quota, read-only, permission, EIO (EX_IOERR). */
#define SPOTD_EXIT_IOERR 74
/* A preemption handled: the final checkpoint (or, said in the last line,
 * an earlier one) is committed: resume later (EX_TEMPFAIL). */
#define SPOTD_EXIT_PREEMPTED 75
/* A notice came and no checkpoint of the job is committed at all. */
#define SPOTD_EXIT_NOTHING_SAVED 76
/* A bad config file or option value (EX_CONFIG). */
#define SPOTD_EXIT_CONFIG 78
/* The training command could not be started. */
#define SPOTD_EXIT_NO_COMMAND 127

enum spotd_state {
  SPOTD_INIT,
  SPOTD_CONNECTING, /* credentials, metadata detection */
  SPOTD_RESTORING,  /* restoring the newest committed checkpoint */
  SPOTD_RUNNING,    /* trainer running, watching */
  SPOTD_RESTARTING, /* the trainer failed: backoff, restore, start again */
  SPOTD_DRAINING,   /* a notice (or SIGTERM): final checkpoint + upload */
  SPOTD_RELAUNCHING,
  SPOTD_STOPPING,  /* stopping the trainer */
  SPOTD_FINISHING, /* trainer gone: finishing the pending upload */
  SPOTD_EXITING,
  SPOTD_STATE_LAST,
};

/* The final checkpoint of a drain. */
enum final_state {
  FINAL_NONE,      /* no drain, or no trainer to ask */
  FINAL_REQUESTED, /* the trainer was asked; no complete folder yet */
  FINAL_UPLOADING, /* complete; uploading (or waiting for a cancel) */
  FINAL_COMMITTED,
  FINAL_ABANDONED, /* given up: the last commit stays */
  FINAL_STATE_LAST,
};

/* The startup: journal resume, restore, restart count, then launch. */
enum restore_state {
  RESTORE_NONE,
  RESTORE_CONNECTING, /* credentials */
  RESTORE_PROBING,    /* the store check: PUT, GET, DELETE a probe */
  RESTORE_LEASING,    /* the job lease (lease.c): wait for it, take it */
  RESTORE_RESUMING,   /* the upload a killed spotd left */
  RESTORE_RESTORING,
  RESTORE_COUNTING, /* GET RESTARTS */
  RESTORE_JOINING,  /* multi-node outside Slurm: agree the run (runjoin.c) */
  RESTORE_DONE,
  RESTORE_FAILED,
  RESTORE_CANCELLED,
  RESTORE_STATE_LAST,
};

enum relaunch_state {
  RELAUNCH_IDLE,
  RELAUNCH_RUNNING,
  RELAUNCH_SUCCEEDED,
  RELAUNCH_FAILED,
  RELAUNCH_CANCELLED,
  RELAUNCH_STATE_LAST,
};

struct watch_sub {
  uv_fs_event_t ev;
  char *name;
  bool used;
  struct spotd *d;
};

struct relaunch_attempt {
  int64_t wall_ms;
  char reason[SPOT_NOTICE_REASON_MAX];
  int exit_status;
  bool ok;
};

/* The push of checkpoint folders (upload.c), one at a time. */
enum upload_state {
  UPLOAD_IDLE,      /* no push runs */
  UPLOAD_FOLLOWING, /* pushing a folder the trainer still writes (overlap) */
  UPLOAD_CAUGHT_UP, /* ... all it wrote so far is uploaded: the push waits
                       for the trainer's SPOTD_COMPLETE marker */
  UPLOAD_PUSHING,   /* pushing a complete folder */
  UPLOAD_STATE_LAST,
};

/* Uploads: one at a time. Beside the running push, one slot (waiting)
 * holds the newest complete folder to push next; a newer one supersedes
 * it. The slot is not a state of the push: a push of either kind may be
 * running (or being cancelled) while it is filled. */
struct upload {
  enum upload_state state;
  struct spot_store_op *op; /* non-NULL unless UPLOAD_IDLE */
  char name[256];
  char waiting[256];
  uint64_t log_ms; /* last progress line, ms into the upload */
  /* UPLOAD_CAUGHT_UP since this many ms into the upload */
  uint64_t marker_wait_ms;
  uint64_t done_bytes, total_bytes;
  double rate;
  double last_bps; /* raw bytes/s of the last push */
  uint64_t last_raw;
  char failed[256]; /* the newest upload that failed after the last commit */
  /* the request (req.seq) a follow was started for: one per request */
  uint64_t follow_seq;
};

struct final_ckpt {
  enum final_state state;
  char name[256];
};

struct restore_op {
  enum restore_state state;
  struct spot_store_op *op; /* the restore or the journal resume */
  struct spot_s3_op *s3op;  /* a probe request */
  char *probe_key;
  struct spot_buf probe_body;
};

struct restarts {
  int64_t count;        /* SPOTD_RESTART_COUNT */
  bool fetched;         /* count is the store's + 1: record it at launch */
  struct spot_buf body; /* GET ROOT/RESTARTS */
  char buf[32];         /* PUT ROOT/RESTARTS: lives until done */
};

/* restarts.c: the restart of a failed trainer (--max-restarts). */
enum crash_step {
  CRASH_NONE,
  CRASH_BACKOFF,   /* the backoff timer runs */
  CRASH_WAITING,   /* backoff over; an upload still runs: wait for it */
  CRASH_MANIFEST,  /* GET of the newest commit's manifest */
  CRASH_VERIFYING, /* the local copy checked on the thread pool */
  CRASH_DOWNLOAD,  /* the restore of the newest commit */
};

struct crash_restart {
  enum crash_step step;
  uv_timer_t timer;       /* the backoff */
  int64_t used;           /* restarts done */
  int last_status;        /* the trainer's last failure: exit status */
  int last_signal;        /* ... or the signal that killed it (0 none) */
  uint64_t wait_ms;       /* this backoff */
  bool exhausted;         /* failed with every restart used: exit 70 */
  bool interrupted;       /* a notice or a signal came while restarting */
  struct spot_s3_op *get; /* the manifest */
  struct spot_buf body;
  uv_work_t work;                /* the local copy's check */
  struct spot_manifest *m;       /* parsed manifest, for the check */
  char dir[4300];                /* the local copy checked */
  char why[300];                 /* why the local copy does not verify */
  struct spot_store_op *restore; /* the download when it does not */
};

/* runjoin.c: the LIST of ROOT/runs/, reduced. */
struct runjoin_scan {
  uint64_t newest;     /* the newest run with a marker, 0 none */
  bool mine_in_newest; /* ... and it has this rank's */
};

struct run_join {
  struct spot_s3_op *op, *del_op;
  struct runjoin_scan scan;
  char *prefix; /* ROOT/runs/ while listing */
  unsigned pages;
  uint64_t run; /* the run joined (or being joined) */
  bool joined;
  char body[64]; /* PUT runs/G/rank-K: lives until done */
};

struct relaunch_step {
  enum relaunch_state state;
  struct spot_child child;
  uv_timer_t timer; /* its own time limit */
  struct relaunch_attempt attempts[SPOT_PROTO_MAX_RELAUNCH];
  size_t n;
};

/* fanout.c: a multi-node job's notice, relaunch and peer loss. */
enum fanout_state {
  FANOUT_IDLE,    /* single node, or not started */
  FANOUT_WAITING, /* between two GETs of the job-wide notice */
  FANOUT_POLLING, /* a GET in flight */
  FANOUT_SEEN,    /* the job-wide notice is there: draining on it */
  FANOUT_CLOSED,
  FANOUT_STATE_LAST,
};

enum fanout_claim {
  FANOUT_CLAIM_NONE,
  FANOUT_CLAIM_WAITING, /* rank > 0: rank 0 goes first */
  FANOUT_CLAIM_ASKING,  /* PUT If-None-Match: * of the relaunch marker */
  FANOUT_CLAIM_READING, /* a retried PUT said 412: is it ours? */
  FANOUT_CLAIM_WON,
  FANOUT_CLAIM_LOST,
};

struct fanout {
  enum fanout_state state;
  uv_timer_t timer;       /* the poll */
  uv_timer_t claim_timer; /* rank > 0: the relaunch claim's delay */
  char run[80];           /* this run's id */
  struct spot_s3_op *get_op, *put_op, *claim_op;
  struct spot_buf body;       /* GET notices/RUN */
  struct spot_buf claim_body; /* GET relaunched/... */
  char put_body[192];         /* PUT notices/RUN: lives until done */
  char claim_mine[64];        /* PUT relaunched/...: lives until done */
  struct spot_notice notice;  /* this node's own notice, to publish */
  int64_t notice_wall_ms;
  bool pending;                /* a notice of this node to publish */
  bool published;              /* its PUT was sent */
  bool warned;                 /* a failed GET was reported once */
  bool exit_check;             /* the trainer failed: the GET decides */
  bool exit_checked;           /* ... and it did: no notice */
  bool peer_lost;              /* the trainer failed after a peer's notice */
  int64_t peer_notice_wall_ms; /* when the peer's notice came, 0 none */
  enum fanout_claim claim_state;
};

/* restore.c: what this rank downloaded (multi-node: only its files). */
struct restored {
  uint64_t files, raw_bytes, stored_bytes;    /* downloaded by this rank */
  uint64_t ckpt_raw_bytes, ckpt_stored_bytes; /* the whole checkpoint */
  bool done;
};

/* The job lease (lease.c). */
enum job_lease_state {
  JOB_LEASE_NONE,
  JOB_LEASE_SKIPPED, /* a multi-node rank other than 0 */
  JOB_LEASE_ACQUIRING,
  JOB_LEASE_WAITING, /* another node holds it */
  JOB_LEASE_HELD,
  JOB_LEASE_RELEASING,
  JOB_LEASE_RELEASED,
  JOB_LEASE_LOST,
  JOB_LEASE_FAILED,
  JOB_LEASE_STATE_LAST,
};

struct job_lease {
  enum job_lease_state state;
  struct spot_lease *lease;
  char owner[SPOT_LEASE_OWNER_MAX + 1];
  char instance_id[64];                  /* "" when the metadata did not say */
  char holder[SPOT_LEASE_OWNER_MAX + 1]; /* last seen holder */
  uint64_t holder_epoch;
  int64_t holder_expires_ms;
  uint64_t seq; /* commits in this epoch (LATEST's order) */
};

/* Restore fallback (fallback.c): checkpoints that failed verification
 * and the committed ones still to try, newest first. */
#define SPOTD_FALLBACK_MAX 16
struct fallback {
  bool listed;
  char bad[SPOTD_FALLBACK_MAX][256];
  size_t nbad;
  char cands[SPOTD_FALLBACK_MAX][256];
  size_t ncands, next;
};

/* The checkpoint request as the trainer sees it (request.c). */
enum req_state {
  REQ_IDLE,
  REQ_PENDING, /* seq asked, not served yet */
  REQ_STATE_LAST,
};

struct ckpt_req {
  enum req_state state;
  char path[4200];      /* the request file ("" none) */
  char maps_path[4200]; /* as /proc/PID/maps names it */
  int fd;
  volatile uint64_t *map; /* the file, shared with the trainer */
  uint64_t seq;
  uv_timer_t resend; /* while pending: processes that start catching */
  struct {
    struct spot_proc p;
    int state; /* enum spot_proc_sig when it got it */
  } sent[256]; /* got the signal for seq */
  size_t nsent;
};

struct ctl_conn;

struct spotd {
  uv_loop_t *loop;
  struct spot_config *cfg;
  char **argv; /* the training command */
  enum spotd_state state;
  int exit_code;   /* -1 until decided */
  int stop_signal; /* the SIGTERM/SIGINT that started a drain */

  /* S3 and the store */
  struct spot_http *http;
  struct spot_aws *aws;
  struct spot_s3 *s3;
  struct spot_store_config store;
  char store_url[1100];

  /* metadata */
  struct spot_meta *meta;
  bool have_notice;
  struct spot_notice notice;
  char reason[SPOT_NOTICE_REASON_MAX];
  uint64_t deadline_mono; /* 0 = none */
  int64_t deadline_wall;
  bool drain_sigterm; /* draining because of SIGTERM/SIGINT, no relaunch */
  /* SPOTD_TERMINATION_GRACE set: a SIGTERM ends as a preemption */
  bool sigterm_reclaim;
  uv_timer_t deadline_timer; /* the drain's deadline */

  /* the trainer and its checkpoints */
  struct spot_child trainer;
  bool trainer_started;
  /* The trainer's step reports (control "step"), for `spotctl status`:
   * the rate is measured over at least STEPS_RATE_MS between reports. */
  struct {
    int64_t step; /* -1: none reported */
    int64_t ref_step;
    uint64_t ref_ms;
    double rate; /* steps per second, -1 until measured */
  } steps;
  struct restore_op restore;
  struct restarts restarts;
  struct crash_restart crash;
  struct run_join run;
  char resume_dir[4200];
  char *ckpt_dir;    /* absolute */
  char *journal_dir; /* CKPT_DIR/.spotd-journal: uploads in progress */

  /* checkpoint requests */
  struct ckpt_req req;
  uint64_t ckpt_signal_mono; /* when the trainer got the signal */
  uv_timer_t interval_timer;
  uv_timer_t ckpt_timer; /* request timeout */
  uint64_t last_save_ms; /* signal -> complete, for the estimate */

  /* watch */
  uv_fs_event_t dir_ev;
  bool dir_ev_active;
  struct watch_sub subs[SPOTD_WATCH_MAX];
  char *known[SPOTD_NAMES_MAX]; /* folders already handled */
  size_t nknown;
  uint64_t start_wall_ms;

  struct upload up;
  struct final_ckpt final;

  /* the folder noted complete last ("" none) */
  char last_complete[256];

  /* last commit */
  char last_commit[256];
  int64_t last_commit_wall; /* committed, or restored, by this spotd */
  int64_t last_commit_made; /* when last_commit was committed (a restored
                               one: its manifest's time) */
  /* the checkpoint restored at startup ("" none) */
  char restored_name[256];

  struct relaunch_step relaunch;
  struct fanout fan;
  struct restored restored;

  struct job_lease jl;
  struct fallback fb;

  /* warnings for status */
  char warnings[SPOT_PROTO_MAX_WARNINGS][256];
  size_t nwarnings;

  /* control socket */
  uv_pipe_t ctl;
  bool ctl_open;
  struct ctl_conn *conns;
  unsigned nconns;
  bool ctl_bound;   /* we created the socket file */
  bool ctl_has_gid; /* socket-group, resolved once at start */
  gid_t ctl_gid;
  dev_t ctl_dev; /* the socket file bound: removed on exit only if ours */
  ino_t ctl_ino;

  /* signals, watchdog */
  uv_signal_t sigterm, sigint, sighup;
  uv_timer_t watchdog;
  uint64_t watchdog_usec;
  unsigned signals_seen;

  struct spotd_hist *hist; /* history.c: job history and metrics */

  bool closing;
};

/* engine.c */
int spotd_start(struct spotd *d);
/* The only way the engine's state changes: logs it, tells systemd, and
 * refuses (false, logged) a transition the table does not allow; once
 * closing only EXITING is allowed. */
bool spotd_set_state(struct spotd *d, enum spotd_state s);
const char *spotd_state_name(enum spotd_state s);
void spotd_warn(struct spotd *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void spotd_on_signal(struct spotd *d, int signum);
/* Something the engine waits on changed: move on if it can. */
void spotd_advance(struct spotd *d);
/* Events of the sub-operations; the engine decides what follows.
 * fanout.c: the job-wide relaunch claim is decided (run_it: this rank
 * runs the step). relaunch.c: the relaunch step ended (or never started).
 * lease.c: the job lease is lost: uploads are cancelled, the trainer is
 * frozen and killed, and spotd exits 73. */
void spotd_relaunch_claimed(struct spotd *d, bool run_it);
void spotd_relaunch_ended(struct spotd *d);
void spotd_lease_lost(struct spotd *d);
/* The startup is done: start the trainer (or not, after a notice). */
void spotd_launch(struct spotd *d);
/* RESTARTING, the checkpoint in place: start the trainer again. */
void spotd_relaunch_trainer(struct spotd *d);
/* A fatal error: exit status, one line already logged, close. */
void spotd_fail(struct spotd *d, int exit_code);
void spotd_trainer_exited(struct spotd *d);
/* A notice of the job from another rank (fanout.c): as the node's own. */
void spotd_job_notice(struct spotd *d, const struct spot_notice *n);
void spotd_close(struct spotd *d);
/* Milliseconds to the drain's deadline (UINT64_MAX: none). */
uint64_t spotd_ms_left(const struct spotd *d);
json_t *spotd_status_json(struct spotd *d);
/* status.c: a step the trainer reported. */
void status_step(struct spotd *d, int64_t step);

/* upload.c: checkpoint requests, uploads, the final checkpoint rule */
void spotd_request_checkpoint(struct spotd *d, const char *why);
/* A complete checkpoint folder appeared (watch.c or `spotctl done`).
 * Returns 0, or -EINVAL / -ENOENT with a reason for `done`. */
int spotd_checkpoint_complete(struct spotd *d, const char *name);
/* No push runs and none waits. */
bool upload_idle(const struct spotd *d);
const char *upload_state_name(enum upload_state s);
/* An incomplete checkpoint folder appeared (watch.c): with overlap, its
 * upload starts now when it answers the pending request. */
void upload_follow_maybe(struct spotd *d, const char *name);
/* The request the follow answers is over (trainer gone, timeout): a
 * followed folder still not complete is not uploaded; why for the log. */
void upload_follow_drop(struct spotd *d, const char *why);
void upload_cancel_all(struct spotd *d);
const char *final_state_name(enum final_state s);
/* The drain starts: ask the running trainer for its final checkpoint. */
void final_begin(struct spotd *d, const char *reason);
/* The drain must still wait (for the final checkpoint or an upload). */
bool final_wait(struct spotd *d);
/* The deadline (or the checkpoint timeout) passed. */
void final_give_up(struct spotd *d, const char *why);
void final_deadline(struct spotd *d);

/* restore.c */
int restore_start(struct spotd *d);
/* The store check ended (0, or negative errno: already logged). */
void restore_probed(struct spotd *d, int err);

/* The job lease is held (or skipped): journal resume, restore. */
void restore_leased(struct spotd *d);

/* The store's settings for a restore into CKPT_DIR (the startup's, a
 * fallback's, a restart's): d->store, the old local copy replaceable,
 * many transfers at once from the start. */
void restore_store_config(const struct spotd *d, struct spot_store_config *sc);
/* A restore's folder into CKPT_DIR/NAME, SPOTD_RESUME_DIR set (0 or
 * negative errno, logged). */
int restore_place(struct spotd *d, const struct spot_store_result *res);
/* A restore (the newest, or a fallback's) ended. */
void restore_finished(struct spotd *d, const struct spot_store_result *res);
void restore_failed(struct spotd *d, int exit_code);
/* fallback.c: the restore failed: true when an older checkpoint is being
 * tried (restore_finished() follows), false to fail. Only for damage in
 * the store (fallback_damage()). */
bool fallback_next(struct spotd *d, const struct spot_store_result *res);
/* Whether the restore failed on damage in the store itself, the only
 * failure an older checkpoint is tried for. */
bool fallback_damage(const struct spot_store_result *res);

/* lease.c */
/* 0: acquiring, restore_leased() follows (or spotd fails); 1: this node
 * takes no lease (a rank other than 0). */
int lease_begin(struct spotd *d);
/* Whether this node may commit now (a check only: nothing changes). */
bool lease_may_commit(const struct spotd *d);
/* A push that may commit is started: its order among this epoch's
 * commits (the store's lease_seq), counted here. */
uint64_t lease_next_seq(struct spotd *d);
/* At the end: starts releasing a held job lease; true while the release
 * runs (spotd_advance() follows its end). */
bool lease_release(struct spotd *d);
void lease_close(struct spotd *d);
void lease_status(struct spotd *d, json_t *st);
const char *job_lease_state_name(enum job_lease_state s);

/* probe.c: the store check; restore_probed() follows. */
void probe_start(struct spotd *d);
const char *restore_state_name(enum restore_state s);

/* journal.c: the newest complete checkpoint a killed spotd was uploading
 * (its journal), into name; false when there is none. */
bool journal_find(struct spotd *d, char *name, size_t size);

/* restarts.c */
/* GET RESTARTS, then restore_counted(). */
void restarts_fetch(struct spotd *d);
void restore_counted(struct spotd *d);
/* The trainer started: PUT the count. */
void restarts_record(struct spotd *d);
void restarts_init(struct spotd *d);
/* The trainer failed on its own while running: true when it is restarted
 * (state RESTARTING, spotd_advance() moves on); false when no restart is
 * left (crash.exhausted once some were allowed). */
bool restart_after_crash(struct spotd *d);
/* RESTARTING: the backoff is over and no upload runs: restore, start. */
void restart_advance(struct spotd *d);
/* A notice or SIGTERM while RESTARTING: no restart; what runs stops. */
void restart_abandon(struct spotd *d);
void restart_close(struct spotd *d);

/* runjoin.c: the run id of a multi-node job outside Slurm. */
bool runjoin_needed(const struct spotd *d);
void runjoin_start(struct spotd *d); /* then restore_joined() */
void runjoin_close(struct spotd *d);
void restore_joined(struct spotd *d, int err);
int runjoin_parse_key(const char *rel, uint64_t *run, unsigned *rank);
void runjoin_decide_init(struct runjoin_scan *s);
void runjoin_decide_add(struct runjoin_scan *s, uint64_t run, unsigned rank,
                        unsigned mine);
uint64_t runjoin_decide(const struct runjoin_scan *s);

/* fanout.c (multi-node, nranks > 1; no-ops on one node) */
void fanout_init(struct spotd *d);
void fanout_close(struct spotd *d);
void fanout_fini(struct spotd *d); /* after the loop ended */
/* The trainer runs: poll the job-wide notice, publish a pending one. */
void fanout_start(struct spotd *d);
/* This node's metadata showed notice n: tell the other ranks. */
void fanout_publish(struct spotd *d, const struct spot_notice *n);
/* The trainer failed while running: true when a GET of the job-wide
 * notice decides first (then spotd_job_notice() or, when there is none,
 * spotd_trainer_exited() again follows). */
bool fanout_exit_check(struct spotd *d);
/* 0: the relaunch marker's PUT runs and relaunch_start() or STOPPING
 * follows; 1: no claim needed (one node), go on. */
int fanout_claim_relaunch(struct spotd *d);
/* The run id the ranks of one run share (--run-id, Slurm, else r<count>). */
const char *fanout_run_id(struct spotd *d);

/* relaunch.c */
/* 0 when the step runs (spotd_relaunch_done() follows), <0 otherwise. */
int relaunch_start(struct spotd *d);
void relaunch_close(struct spotd *d);
const char *relaunch_state_name(enum relaunch_state s);

/* trainer.c */
int trainer_start(struct spotd *d);
bool trainer_running(const struct spotd *d);
void trainer_stop(struct spotd *d, uint64_t grace_ms);

/* request.c: the request file and the checkpoint signal */
/* Creates and maps the request file (a failure is a warning: signals
 * only). 0, or negative errno for the timer. */
int request_open(struct spotd *d);
void request_close(struct spotd *d); /* its handle */
void request_fini(struct spotd *d);  /* after the loop: unmap, remove */
/* The trainer starts: no request, no poll yet. */
void request_trainer_starts(struct spotd *d);
/* The path for SPOTD_REQUEST_FILE, or NULL. */
const char *request_file(const struct spotd *d);
/* A new request: in the file, and the signal to the processes that catch
 * or ignore it. *helpers: how many processes the helper serves; *caught:
 * how many catch the signal; *sent: how many got it. */
void request_begin(struct spotd *d, unsigned *helpers, unsigned *caught,
                   unsigned *sent);
/* The request is over (served, dropped): back to REQ_IDLE. */
void request_end(struct spotd *d);
/* A request was made and is not over yet (REQ_PENDING). */
bool request_pending(const struct spotd *d);
const char *req_state_name(enum req_state s);
/* The helper is in use, no process it does not serve catches the signal,
 * and no helper has polled since the trainer started: the trainer has made
 * no step. */
bool request_no_step(struct spotd *d);

/* watch.c */
int watch_start(struct spotd *d);
void watch_scan(struct spotd *d);
void watch_close(struct spotd *d);
bool watch_is_known(struct spotd *d, const char *name);
void watch_mark_known(struct spotd *d, const char *name);

/* control.c */
int control_start(struct spotd *d);
void control_close(struct spotd *d);
void control_commit_event(struct spotd *d, const char *name, int err,
                          const char *msg);

/* history.c: the job history and the metrics (no-ops without them) */
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
/* The trainer failed and restarts (RESTART); then started again. */
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

/* jlog.c: under journald, log lines with SPOTD_JOB, SPOTD_CHECKPOINT and
 * SPOTD_REASON fields (a log sink; jlog_stop() before d goes away). */
void jlog_start(struct spotd *d);
void jlog_stop(void);

/* engine.c: sd_notify when NOTIFY_SOCKET is set */
void spotd_notify(struct spotd *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
