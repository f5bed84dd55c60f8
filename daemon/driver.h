/* driver.c: the engine's executor. Callbacks (timers, signals, the
 * trainer's exit, the other modules' completions) become events of the
 * pure engine (engine.h); the commands it returns are carried out through
 * the modules. The other modules of daemon/ report events with the
 * functions below. */
#ifndef SPOTD_DRIVER_H
#define SPOTD_DRIVER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "core/notice.h"

struct spotd;

/* Initialises the engine's timers and child handles on d->loop (the part
 * of spotd_start() a test of the daemon needs without starting). */
void spotd_handles_init(struct spotd *d);
/* Starts spotd; on failure (< 0) closes it, the exit status set. */
int spotd_start(struct spotd *d);
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
/* request.c: the pending request's --ckpt-timeout passed. */
void spotd_request_timed_out(struct spotd *d);
/* `spotctl checkpoint --final`: the operator preempts the job, as a
 * notice with SIGTERM's drain time, told to the other ranks. */
void spotd_operator_final(struct spotd *d);
/* A notice of the job from another rank (fanout.c): as the node's own. */
void spotd_job_notice(struct spotd *d, const struct spot_notice *n);
/* Closes with the exit status decided (71 when none is). */
void spotd_close(struct spotd *d);
/* Events of the startup and the restarts: the startup began restoring
 * (RESTORING); a failed trainer is restarted (RESTARTING, the exit status
 * undecided again): false when the engine refuses it. */
void spotd_restoring(struct spotd *d);
bool spotd_restart_begin(struct spotd *d);
/* After the loop ran dry once closing: frees the clients the start made
 * (S3, AWS credentials, HTTP), in dependency order. */
void spotd_free_clients(struct spotd *d);
/* After the loop is closed: frees what the start and its modules made
 * (the folders' paths, the probe's key, the fan-out's and the request
 * file's state), so the caller frees only what it made itself. */
void spotd_free(struct spotd *d);
/* The engine's deadlines, on the monotonic clock now. */
uint64_t spotd_ms_left(const struct spotd *d);
uint64_t spotd_final_ms_left(const struct spotd *d);
int64_t spotd_final_deadline_wall(const struct spotd *d);

/* sd_notify when NOTIFY_SOCKET is set */
void spotd_notify(struct spotd *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
