/* engine.c: the engine's state machine (enum spotd_state) as a pure step
 * function: an event in (with the time and what the other modules report
 * as facts), commands out. No libuv, no clock, no system call: driver.c
 * turns callbacks into events and carries the commands out (the lint
 * suite's `pure` check reads the object's undefined symbols). */
#ifndef SPOTD_ENGINE_H
#define SPOTD_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/notice.h"

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

/* The final checkpoint of a drain (upload.c moves it; the engine's rule
 * reads it). */
enum final_state {
  FINAL_NONE,      /* no drain, or no trainer to ask */
  FINAL_REQUESTED, /* the trainer was asked; no complete folder yet */
  FINAL_UPLOADING, /* complete; uploading (or waiting for a cancel) */
  FINAL_COMMITTED,
  FINAL_ABANDONED, /* given up: the last commit stays */
  FINAL_STATE_LAST,
};

/* Set once, at spotd_engine_init(). */
struct spotd_engine_config {
  const char *job;
  bool relaunch;        /* --relaunch is set */
  int64_t max_restarts; /* --max-restarts */
  uint64_t grace_ms;    /* --grace: SIGTERM to SIGKILL of the trainer */
  unsigned nranks;
  /* SPOTD_TERMINATION_GRACE as the environment has it (NULL: unset) */
  const char *termination_grace;
};

/* What the other modules hold, read by the driver for each event. */
struct spotd_facts {
  bool trainer_running;
  bool trainer_started; /* ever, by this spotd */
  bool upload_idle;
  bool request_pending;
  bool lease_lost;
  enum final_state final;
  bool final_is_restored;  /* the final commit is the restored checkpoint */
  const char *final_cut;   /* given up in its commit phase ("" none) */
  const char *last_commit; /* "" none */
  int64_t last_commit_made;
  const char *upload_failed; /* "" none */
  /* the restarts of a failed trainer (restarts.c) */
  bool crash_exhausted;
  bool crash_interrupted;
  int crash_last_signal;
  int crash_last_status;
  int64_t crash_used;
};

enum spotd_event_kind {
  SPOTD_EV_STARTED,          /* the start's local part is done */
  SPOTD_EV_RESTORING,        /* the startup restores */
  SPOTD_EV_LAUNCH,           /* the startup is done: start the trainer */
  SPOTD_EV_TRAINER_STARTED,  /* START_TRAINER succeeded */
  SPOTD_EV_RESTART_BEGIN,    /* restarts.c restarts the failed trainer */
  SPOTD_EV_RELAUNCH_TRAINER, /* restarts.c: the checkpoint is in place */
  SPOTD_EV_NOTICE,           /* the node's own notice (metadata) */
  SPOTD_EV_JOB_NOTICE,       /* a notice of the job from another rank */
  SPOTD_EV_OPERATOR_FINAL,   /* spotctl checkpoint --final */
  SPOTD_EV_SIGNAL,           /* SIGTERM, SIGINT */
  SPOTD_EV_ADVANCE,          /* something the engine waits on changed */
  SPOTD_EV_DEADLINE,         /* ARM_DEADLINE's time came */
  SPOTD_EV_TRAINER_EXITED,
  SPOTD_EV_PEER_CHECKED, /* PEER_CHECK found no peer's notice */
  SPOTD_EV_NO_RESTART,   /* TRY_RESTART did not restart */
  SPOTD_EV_CLAIM,        /* the relaunch claim is decided (run_it) */
  SPOTD_EV_RELAUNCH_ENDED,
  SPOTD_EV_LEASE_RELEASED, /* RELEASE_LEASE is done (or had nothing to do) */
  SPOTD_EV_LEASE_LOST,
  SPOTD_EV_FAIL,  /* a fatal error, code: the exit status */
  SPOTD_EV_CLOSE, /* close with the status decided (else 71) */
  SPOTD_EV_LAST,
};

struct spotd_event {
  enum spotd_event_kind kind;
  uint64_t now_mono; /* ms */
  int64_t now_wall;  /* unix ms */
  int code;          /* FAIL: exit status; SIGNAL: signum; TRAINER_EXITED:
                        the trainer's status */
  bool run_it;       /* CLAIM: this rank runs the relaunch step */
  const struct spot_notice *notice; /* NOTICE, JOB_NOTICE */
  struct spotd_facts facts;
};

enum spotd_cmd_kind {
  SPOTD_CMD_NOTIFY,             /* sd_notify text */
  SPOTD_CMD_WARN,               /* a warning for the log and `spotctl status` */
  SPOTD_CMD_HIST_NOTICE,        /* the history records notice */
  SPOTD_CMD_PUBLISH,            /* multi-node: tell the other ranks notice */
  SPOTD_CMD_REQUEST_CHECKPOINT, /* an early checkpoint (text: why) */
  SPOTD_CMD_FANOUT_START,
  SPOTD_CMD_START_TRAINER, /* arg 1: a restart; TRAINER_STARTED or FAIL */
  SPOTD_CMD_RUNNING,       /* tell systemd the trainer runs (arg: restart) */
  SPOTD_CMD_STOP_INTERVAL, /* no more periodic checkpoints */
  SPOTD_CMD_ABANDON_RESTART,
  SPOTD_CMD_REQUEST_FINAL, /* ask the trainer for its final checkpoint */
  SPOTD_CMD_ARM_DEADLINE,  /* DEADLINE in ms */
  SPOTD_CMD_DISARM_DEADLINE,
  SPOTD_CMD_FINAL_DEADLINE, /* the drain's deadline passed */
  SPOTD_CMD_FINAL_GIVE_UP,  /* text: why */
  SPOTD_CMD_ACK,            /* ack the notice (Azure) */
  SPOTD_CMD_CLAIM_RELAUNCH, /* CLAIM follows */
  SPOTD_CMD_RUN_RELAUNCH,   /* RELAUNCH_ENDED follows */
  SPOTD_CMD_STOP_TRAINER,   /* SIGTERM, SIGKILL after ms */
  SPOTD_CMD_FREEZE,         /* SIGSTOP to the trainer's tree */
  SPOTD_CMD_CANCEL_UPLOADS,
  SPOTD_CMD_TRAINER_GONE, /* the trainer exited: end its requests */
  SPOTD_CMD_PEER_CHECK,   /* PEER_CHECKED follows, or a JOB_NOTICE */
  SPOTD_CMD_TRY_RESTART,  /* RESTART_BEGIN, or NO_RESTART */
  SPOTD_CMD_RESTART_ADVANCE,
  SPOTD_CMD_RELEASE_LEASE, /* LEASE_RELEASED follows */
  SPOTD_CMD_ADVANCE,       /* feed ADVANCE with the facts as they are now */
  SPOTD_CMD_HIST_END,      /* the job history's last record */
  SPOTD_CMD_EXIT,          /* close everything; arg: the exit status */
  SPOTD_CMD_LOG,           /* a line for the log: arg its level, text */
  SPOTD_CMD_LAST,
};

struct spotd_cmd {
  enum spotd_cmd_kind kind;
  int arg;
  uint64_t ms;
  const struct spot_notice *notice; /* the engine's, valid until its next
                                       step */
  char text[512];
};

#define SPOTD_CMDS_MAX 32

struct spotd_cmds {
  struct spotd_cmd c[SPOTD_CMDS_MAX];
  unsigned n;
  unsigned dropped; /* commands past SPOTD_CMDS_MAX (a bug: the driver
                       says so) */
  bool refused;     /* the event asked for a move the table does not allow */
};

/* The engine's state: moved only by spotd_engine_step(). */
struct spotd_engine {
  struct spotd_engine_config cfg;
  enum spotd_state state;
  enum spotd_state ended_in; /* the state EXITING was entered from */
  int exit_code;             /* -1 until decided */
  int stop_signal;           /* the SIGTERM/SIGINT that started a drain */
  unsigned signals_seen;
  bool have_notice;
  struct spot_notice notice;
  char reason[SPOT_NOTICE_REASON_MAX];
  uint64_t deadline_mono; /* 0 = none */
  int64_t deadline_wall;
  bool drain_sigterm; /* draining because of SIGTERM/SIGINT, no relaunch */
  /* SPOTD_TERMINATION_GRACE set: a SIGTERM ends as a preemption */
  bool sigterm_reclaim;
  struct spot_notice made; /* a notice the engine made (signal, operator) */
};

void spotd_engine_init(struct spotd_engine *e,
                       const struct spotd_engine_config *cfg);
/* One event: the commands (appended to out, cleared first) say what the
 * driver does, in order. */
void spotd_engine_step(struct spotd_engine *e, const struct spotd_event *ev,
                       struct spotd_cmds *out);
const char *spotd_state_name(enum spotd_state s);
const char *spotd_event_name(enum spotd_event_kind k);
const char *spotd_cmd_name(enum spotd_cmd_kind k);
/* Milliseconds from now to the drain's deadline (UINT64_MAX: none). */
uint64_t spotd_engine_ms_left(const struct spotd_engine *e, uint64_t now);
/* Milliseconds until the drain gives the final checkpoint up: the
 * deadline less a margin for stopping the trainer (UINT64_MAX: none). */
uint64_t spotd_engine_final_ms_left(const struct spotd_engine *e, uint64_t now);
/* The same instant on the wall clock, in unix ms (0: no deadline). */
int64_t spotd_engine_final_deadline_wall(const struct spotd_engine *e);

#endif
