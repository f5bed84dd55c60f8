/* restarts.c: the store's RESTARTS counter (SPOTD_RESTART_COUNT), and the
 * restart of a failed trainer (--max-restarts, enum crash_step). */
#ifndef SPOTD_RESTARTS_H
#define SPOTD_RESTARTS_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "core/buf.h"
#include "core/manifest.h"
#include "io/s3.h"
#include "io/store/store.h"

struct spotd;

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
  enum crash_step state;  /* only crash_set_state() changes it */
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

/* The job's relaunch count (d->restarts.count, SPOTD_RESTART_COUNT): the
 * one writer. fetched: whether it is the store's RESTARTS (+1), to be
 * written back at the trainer's start; a run join's count is not. */
void restarts_set_count(struct spotd *d, int64_t count, bool fetched);
/* GET RESTARTS, then restore_counted(). */
void restarts_fetch(struct spotd *d);
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

#endif
