/* startup.c: the startup: credentials, journal resume, restore
 * (enum restore_state). */
#ifndef SPOTD_STARTUP_H
#define SPOTD_STARTUP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/buf.h"
#include "io/s3.h"
#include "io/store/store.h"

struct spotd;

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

struct restore_op {
  enum restore_state state;
  struct spot_store_op *op; /* the restore or the journal resume */
  struct spot_s3_op *s3op;  /* a probe request */
  char *probe_key;
  struct spot_buf probe_body;
};

/* startup.c: what this rank downloaded (multi-node: only its files). */
struct restored {
  uint64_t files, raw_bytes, stored_bytes;    /* downloaded by this rank */
  uint64_t ckpt_raw_bytes, ckpt_stored_bytes; /* the whole checkpoint */
  bool done;
};

int restore_start(struct spotd *d);
/* The store check ended (0, or negative errno: already logged). */
void restore_probed(struct spotd *d, int err);
const char *restore_state_name(enum restore_state s);

/* The job lease is held (or skipped): journal resume, restore. */
void restore_leased(struct spotd *d);
/* The restart count was read (restarts_fetch(), restarts.c). */
void restore_counted(struct spotd *d);
/* The run join ended (runjoin_start(), runjoin.c): 0 or negative errno. */
void restore_joined(struct spotd *d, int err);

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

#endif
