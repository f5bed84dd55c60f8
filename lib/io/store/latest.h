/* LATEST only moves forward: a compare-and-swap of ROOT/LATEST on its
 * ETag that refuses to point it at a commit older than the one it names.
 *
 * The order of a commit is (lease epoch, sequence within the epoch)
 * (lease_doc.h, struct spot_latest_order). It travels as user metadata,
 * x-amz-meta-spotd-order: "E.S", so the body stays the plain checkpoint
 * name: readers that GET LATEST as a name (store_restore.c, store_list.c,
 * older spotd) keep working unchanged. A LATEST without the header (written
 * by an older spotd) counts as order 0.0, which any ordered update passes.
 *
 * Why the ETag is a sound compare-and-swap token even though it is the
 * MD5 of the body (the name) and ignores the metadata: LATEST only ever
 * moves to a newer commit and a commit's name is committed once
 * (If-None-Match on its manifest), so LATEST never holds the same name
 * twice with different orders; an If-Match on the name we read therefore
 * fails whenever anyone moved LATEST since (no ABA). The If-Match form
 * (quoted or bare, Ceph vs AWS) is learned as in lease.h: on a 412, GET
 * again; if the ETag is unchanged, send the other form once.
 *
 * Fencing (when lease_key is given): before reading LATEST, the lease is
 * read and the update refused (-ESTALE) unless it is held, unexpired, by
 * lease_owner at order.epoch. A writer that lost its lease can therefore
 * move LATEST only inside the window between that read and its PUT; and
 * since a new holder's first commit carries a higher epoch, it can never
 * move LATEST back past the new holder's commits.
 *
 * Training progress: a checkpoint never replaces one that is older by the
 * trainer's step. The step of ours is the one given, else what the name
 * states (spot_ckpt_name_step); the step of what LATEST names is its
 * x-amz-meta-spotd-step, else what its name states. When either is
 * unknown, the order alone decides. The step is checked after the order,
 * so fencing comes first; a newer epoch does not let an older step in.
 *
 * Order 0.0 means an unordered writer (spotctl push without a lease): the
 * order is neither compared nor written (LATEST then reads as 0.0, as a
 * plain PUT leaves it), only the step rule applies.
 *
 * Callback contract as in s3.h: returns < 0 and never calls back, or 0
 * and calls back exactly once, from the loop, also after
 * spot_latest_cancel() (then with -ECANCELED). */
#ifndef SPOT_LATEST_H
#define SPOT_LATEST_H

#include <stdbool.h>
#include <stdint.h>

#include "core/lease_doc.h"
#include "io/s3.h"

#define SPOT_LATEST_KEY "LATEST"
#define SPOT_LATEST_ROUNDS_MAX 64 /* compare-and-swap attempts */
#define SPOT_LATEST_STEP_META "spotd-step"

struct spot_latest_result {
  /* 0: LATEST names ours (moved, or already did); -ESTALE: refused (LATEST
   * is at or past ours, or our lease is gone or older); -EAGAIN: lost the
   * race SPOT_LATEST_ROUNDS_MAX times; -ECANCELED; or an S3 error. */
  int err;
  const char *message; /* one line when err < 0 */
  bool moved;          /* we wrote it */
  const char *name;    /* what LATEST named when we last read it ("" none) */
  struct spot_latest_order order; /* its order */
  int64_t step;                   /* its step, -1 unknown */
  unsigned rounds;                /* PUTs tried */
  unsigned retries;               /* S3 retries, all requests together */
};

struct spot_latest_op;
typedef void (*spot_latest_cb)(const struct spot_latest_result *res,
                               void *data);

/* root is "PREFIX/JOB" (or "JOB"); name a spot_ckpt_name_valid() name;
 * step the trainer's step of the checkpoint, < 0: what its name states.
 * lease_owner NULL: no lease check. Strings are copied. */
int spot_latest_update(struct spot_s3 *s3, const char *bucket, const char *root,
                       const char *name, struct spot_latest_order order,
                       int64_t step, const char *lease_owner, spot_latest_cb cb,
                       void *data, struct spot_latest_op **op);
/* Also refuse (-ESTALE) when LATEST's epoch is past epoch: for publishing
 * a manifest an earlier run wrote at that epoch, which must not replace
 * anything committed since. Call right after spot_latest_update(). */
void spot_latest_set_max_epoch(struct spot_latest_op *op, uint64_t epoch);
/* A checkpoint found damaged (restore fallback): the step rule does not
 * keep LATEST on it. Call right after spot_latest_update(). */
void spot_latest_set_damaged(struct spot_latest_op *op, const char *name);
/* The checks of spot_latest_update() without the write, before a
 * manifest is written (a refused commit leaves no manifest behind): the
 * lease (when lease_owner is given: held, unexpired, by it at
 * order.epoch), then LATEST's order and step as the update judges them.
 * Calls back with 0 when the update would be taken, else -ESTALE with one
 * line (or an S3 error). The setters below apply to it too. */
int spot_latest_fence(struct spot_s3 *s3, const char *bucket, const char *root,
                      const char *name, struct spot_latest_order order,
                      int64_t step, const char *lease_owner, spot_latest_cb cb,
                      void *data, struct spot_latest_op **op);
/* Legal until the callback has run; the callback runs later, from the
 * loop, with -ECANCELED (never before this returns). */
void spot_latest_cancel(struct spot_latest_op *op);

#endif
