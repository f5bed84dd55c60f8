/* upload.c: checkpoint requests, uploads (enum upload_state), the final
 * checkpoint (enum final_state). */
#ifndef SPOTD_UPLOAD_H
#define SPOTD_UPLOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "io/store/store.h"

struct spotd;

/* The final checkpoint of a drain: enum final_state is engine.h's (the
 * engine's rule reads it). */

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
  enum spot_store_phase phase; /* the running push's, from its progress */
  double rate;
  /* time spent UPLOAD_CAUGHT_UP (waiting for the trainer's save, not
   * uploading) in this push, and since when (spot_now_mono_ms, 0 none) */
  uint64_t wait_ms, wait_since;
  double last_bps; /* raw bytes/s of the last push, its waits left out */
  uint64_t last_raw;
  char failed[256]; /* the newest upload that failed after the last commit */
  /* the request (req.seq) a follow was started for: one per request */
  uint64_t follow_seq;
  /* a folder saved at the step already committed, removed once the
   * trainer is done with it (it exited, or a later commit): "" none */
  char drop[256];
};

struct final_ckpt {
  enum final_state state;
  char name[256];
  /* a final checkpoint given up in its commit phase: its manifest (and
   * LATEST) may be written after all; "" none */
  char cut[256];
};

/* upload.c: uploads, the final checkpoint rule */
/* A complete checkpoint folder appeared (watch.c or `spotctl done`).
 * Returns 0, or -EINVAL / -ENOENT with a reason for `done`. */
int spotd_checkpoint_complete(struct spotd *d, const char *name);
/* No push runs and none waits. */
bool upload_idle(const struct spotd *d);
/* The newest commit this spotd knows (d->last_commit and its step, when
 * it was made and since when this spotd has it): the one writer of that
 * fact, for a commit of its own (upload.c), a restore (startup.c) and a
 * restart's download (restarts.c). made_ms: when it was committed;
 * known_ms: when this spotd committed or restored it. */
void upload_set_last_commit(struct spotd *d, const char *name, int64_t step,
                            int64_t made_ms, int64_t known_ms);
/* Removes the local copy of a save that was no new commit (up.drop):
 * the trainer exited, or a later commit was made. */
void upload_drop_local(struct spotd *d);
/* The trainer's step of checkpoint folder name: the last commit's as
 * known, else what its SPOTD_COMPLETE marker states (spot_marker_parse),
 * else what its name states; -1 unknown. */
int64_t upload_ckpt_step(const struct spotd *d, const char *name);
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
/* The deadline (or the checkpoint timeout) passed. */
void final_give_up(struct spotd *d, const char *why);
void final_deadline(struct spotd *d);

#endif
