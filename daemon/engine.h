/* engine.c: the engine's state machine (enum spotd_state): start, notices,
 * drain, stop, exit status, close; and the events the sub-operations
 * report to it. */
#ifndef SPOTD_ENGINE_H
#define SPOTD_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/notice.h"

struct spotd;

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

/* Initialises the engine's timers and child handles on d->loop (the part
 * of spotd_start() a test of the engine needs without starting). */
void spotd_handles_init(struct spotd *d);
/* Starts spotd; on failure (< 0) closes it, the exit status set. */
int spotd_start(struct spotd *d);
/* The only way the engine's state changes: logs it, tells systemd, and
 * refuses (false, logged) a transition the table does not allow; once
 * closing only EXITING is allowed. engine.c's own: the other modules of
 * daemon/ report events (spotd_restoring(), spotd_restart_begin(), ...)
 * and the lint suite's fsm check fails one that calls it or writes the
 * state or the exit status; exported for test_engine only. */
bool spotd_set_state_at(struct spotd *d, enum spotd_state s, const char *file,
                        int line);
#define spotd_set_state(d, s) spotd_set_state_at((d), (s), __FILE__, __LINE__)
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
/* `spotctl checkpoint --final`: the operator preempts the job, as a
 * notice with SIGTERM's drain time, told to the other ranks. */
void spotd_operator_final(struct spotd *d);
/* A notice of the job from another rank (fanout.c): as the node's own. */
void spotd_job_notice(struct spotd *d, const struct spot_notice *n);
void spotd_close(struct spotd *d);
/* Events of the startup and the restarts: the startup began restoring
 * (RESTORING); a failed trainer is restarted (RESTARTING, the exit status
 * undecided again): false when the engine refuses it. */
void spotd_restoring(struct spotd *d);
bool spotd_restart_begin(struct spotd *d);
/* After the loop ran dry once closing: frees the clients the start made
 * (S3, AWS credentials, HTTP), in dependency order. */
void spotd_free_clients(struct spotd *d);
/* Milliseconds to the drain's deadline (UINT64_MAX: none). */
uint64_t spotd_ms_left(const struct spotd *d);
/* Milliseconds until the drain gives the final checkpoint up: the
 * deadline less a margin for stopping the trainer (UINT64_MAX: none). */
uint64_t spotd_final_ms_left(const struct spotd *d);
/* The same instant on the wall clock, in unix ms (0: no deadline). */
int64_t spotd_final_deadline_wall(const struct spotd *d);

/* sd_notify when NOTIFY_SOCKET is set */
void spotd_notify(struct spotd *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
