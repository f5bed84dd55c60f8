/* spotd internals: one struct spotd owns every libuv handle of the
 * daemon. Files:
 *   main.c     arguments, config, signals, sd_notify, the loop
 *   engine.c   the state machine: restore, launch, checkpoint requests,
 *              uploads, notices, relaunch, stop
 *   trainer.c  the training command: spawn in its own session, signal,
 *              SIGTERM then SIGKILL on a timer
 *   watch.c    SPOTD_CKPT_DIR with inotify (uv_fs_event): complete
 *              checkpoint folders
 *   control.c  the control socket (JSON lines, SO_PEERCRED)
 *
 * Handle lifecycle: every handle is embedded in struct spotd (or a struct
 * it owns); spotd_close() closes them all; uv_run() then returns, the
 * loop then ends and main() requires uv_loop_close() == 0. */
#ifndef SPOTD_H
#define SPOTD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "aws.h"
#include "config.h"
#include "http.h"
#include "meta.h"
#include "notice.h"
#include "proto.h"
#include "s3.h"
#include "store.h"

#define SPOTD_NAMES_MAX 64 /* checkpoint folders remembered */
#define SPOTD_WATCH_MAX 64 /* subfolders watched for SPOTD_COMPLETE */
#define SPOTD_COMPLETE "SPOTD_COMPLETE"

enum spotd_state {
  SPOTD_INIT,
  SPOTD_CONNECTING, /* credentials, metadata detection */
  SPOTD_RESTORING,  /* restoring the newest committed checkpoint */
  SPOTD_RUNNING,    /* trainer running, watching */
  SPOTD_DRAINING,   /* a notice (or SIGTERM): final checkpoint + upload */
  SPOTD_RELAUNCHING,
  SPOTD_STOPPING,  /* stopping the trainer */
  SPOTD_FINISHING, /* trainer gone: finishing the pending upload */
  SPOTD_EXITING,
  SPOTD_STATE_LAST,
};

struct trainer {
  struct spotd *d;
  uv_process_t proc;
  uv_timer_t kill_timer;
  bool running;
  bool proc_open; /* proc needs uv_close */
  bool stop_sent; /* SIGTERM sent */
  pid_t pid;
  uint64_t start_ms;
  int64_t exit_status; /* -1 while running */
  int term_signal;
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

struct ctl_conn;

struct spotd {
  uv_loop_t *loop;
  struct spot_config *cfg;
  char **argv; /* the training command */
  enum spotd_state state;
  int exit_code;

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

  /* the trainer and its checkpoints */
  struct trainer trainer;
  int64_t restart_count;
  struct spot_buf restart_body; /* GET ROOT/RESTARTS */
  char restart_buf[32];         /* PUT ROOT/RESTARTS: lives until done */
  char resume_dir[4200];
  char *ckpt_dir;
  char *journal_dir; /* CKPT_DIR/.spotd-journal: uploads in progress */

  /* checkpoint requests */
  bool ckpt_requested;
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

  /* uploads: one at a time, the newest waiting one supersedes others */
  struct spot_store_op *upload;
  char upload_name[256];
  uint64_t upload_log_ms; /* last progress line, ms into the upload */
  uint64_t upload_done_bytes, upload_total_bytes;
  double upload_rate;
  char waiting[256];
  bool final_pending; /* the drain's checkpoint is waited for or uploading */
  char final_name[256];
  bool final_committed;
  double last_upload_bps; /* raw bytes/s of the last push */
  uint64_t last_upload_raw;

  /* last commit */
  char last_commit[256];
  int64_t last_commit_wall;

  /* relaunch */
  uv_process_t relaunch_proc;
  bool relaunch_running;
  uv_timer_t relaunch_timer;
  struct relaunch_attempt relaunches[SPOT_PROTO_MAX_RELAUNCH];
  size_t nrelaunch;

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

  bool closing;
};

/* engine.c */
int spotd_start(struct spotd *d);
void spotd_set_state(struct spotd *d, enum spotd_state s);
const char *spotd_state_name(enum spotd_state s);
void spotd_warn(struct spotd *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void spotd_on_signal(struct spotd *d, int signum);
void spotd_request_checkpoint(struct spotd *d, const char *why);
/* A complete checkpoint folder appeared (watch.c or `spotctl done`).
 * Returns 0, or -EINVAL / -ENOENT with a reason for `done`. */
int spotd_checkpoint_complete(struct spotd *d, const char *name);
void spotd_trainer_exited(struct spotd *d);
void spotd_close(struct spotd *d);
json_t *spotd_status_json(struct spotd *d);
/* `checkpoint --wait` waiters are told when a commit lands or fails. */
void spotd_notify_commit(struct spotd *d, const char *name, int err,
                         const char *msg);

/* trainer.c */
int trainer_start(struct trainer *t, struct spotd *d);
int trainer_signal(struct trainer *t, int signum, bool group);
void trainer_stop(struct trainer *t, uint64_t grace_ms);
void trainer_close(struct trainer *t);

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

/* main.c */
void spotd_notify(struct spotd *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
