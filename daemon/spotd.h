/* spotd internals: one struct spotd owns every libuv handle of the
 * daemon (docs/design.md describes the state machines), and this header
 * holds it, the exit statuses and what every module shares. Each module
 * X.c declares its own types and functions in X.h (lease.c in joblease.h
 * and history.c in hist.h, as lib/ has a lease.h and a history.h); a
 * module includes spotd.h and the headers of the modules it calls. struct
 * spotd embeds the state of most modules, so spotd.h includes their
 * headers for those types. Files (all but main.c build libspotd, so
 * tests can link the engine in-process):
 *   main.c     arguments, config, signals, sd_notify, the loop
 *   engine.c   the engine's state machine (enum spotd_state) as a pure
 *              step function: event in, commands out (no libuv, no
 *              system call); notices, drain, stop, exit status
 *   driver.c   the engine's executor: callbacks become events, commands
 *              are carried out through the modules; start, close
 *   upload.c   checkpoint requests, uploads (enum upload_state), the
 *              final checkpoint (enum final_state)
 *   startup.c  the startup: credentials, journal resume, restore
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

#include "core/config.h"
#include "core/notice.h"
#include "core/proto.h"
#include "io/child.h"
#include "io/s3.h"
#include "io/store/store.h"

/* Held by pointer only: the files that call them include their headers. */
struct spot_aws;
struct spot_http;
struct spot_meta;

/* The modules whose state struct spotd embeds: their types. */
#include "driver.h"
#include "engine.h"
#include "fanout.h"
#include "fallback.h"
#include "joblease.h"
#include "relaunch.h"
#include "request.h"
#include "restarts.h"
#include "startup.h"
#include "runjoin.h"
#include "upload.h"
#include "watch.h"

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

struct ctl_conn;

struct spotd {
  uv_loop_t *loop;
  struct spot_config *cfg;
  char **argv; /* the training command */
  /* the engine's state, exit status, notice and deadline: engine.c's,
   * moved by driver.c's events only */
  struct spotd_engine eng;

  /* S3 and the store */
  struct spot_http *http;
  struct spot_aws *aws;
  struct spot_s3 *s3;
  struct spot_store_config store;
  char store_url[1100];

  /* metadata */
  struct spot_meta *meta;
  uv_timer_t deadline_timer; /* the drain's deadline (ARM_DEADLINE) */

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
  uv_timer_t interval_timer;

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
  int64_t last_commit_step; /* the trainer's step it holds, -1 unknown */
  /* the checkpoint restored at startup ("" none), and when it was put in
   * place (0 none): a folder complete before then is an earlier run's */
  char restored_name[256];
  int64_t restored_at_wall;

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
  uint64_t ctl_said_ms; /* the last refusal logged (loop time), 0 none */
  unsigned ctl_unsaid;  /* refusals not logged since */
  bool ctl_bound;       /* we created the socket file */
  bool ctl_has_gid;     /* socket-group, resolved once at start */
  gid_t ctl_gid;
  dev_t ctl_dev; /* the socket file bound: removed on exit only if ours */
  ino_t ctl_ino;

  /* signals, watchdog */
  uv_signal_t sigterm, sigint, sighup;
  uv_timer_t watchdog;
  uint64_t watchdog_usec;

  struct spotd_hist *hist; /* history.c: job history and metrics */

  bool closing;
};

#endif
