/* lease.c: the job lease around the engine (lease.c, enum job_lease_state). */
#ifndef SPOTD_JOBLEASE_H
#define SPOTD_JOBLEASE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "io/lease.h"

struct spotd;

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
  int lock_fd;  /* > 0: our lock (spot_lease_lock_hold), held by the guard */
};

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

#endif
