/* fanout.c: multi-node: the job-wide notice, the relaunch claim, peer loss
 * (enum fanout_state, enum fanout_claim); no-ops on one node. */
#ifndef SPOTD_FANOUT_H
#define SPOTD_FANOUT_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "core/buf.h"
#include "core/notice.h"
#include "io/s3.h"

struct spotd;

/* fanout.c: a multi-node job's notice, relaunch and peer loss. */
enum fanout_state {
  FANOUT_IDLE,    /* single node, or not started */
  FANOUT_WAITING, /* between two GETs of the job-wide notice */
  FANOUT_POLLING, /* a GET in flight */
  FANOUT_SEEN,    /* the job-wide notice is there: draining on it */
  FANOUT_CLOSED,
  FANOUT_STATE_LAST,
};

enum fanout_claim {
  FANOUT_CLAIM_NONE,
  FANOUT_CLAIM_WAITING, /* rank > 0: rank 0 goes first */
  FANOUT_CLAIM_ASKING,  /* PUT If-None-Match: * of the relaunch marker */
  FANOUT_CLAIM_READING, /* a retried PUT said 412: is it ours? */
  FANOUT_CLAIM_WON,
  FANOUT_CLAIM_LOST,
};

struct fanout {
  enum fanout_state state;
  uv_timer_t timer;       /* the poll */
  uv_timer_t claim_timer; /* rank > 0: the relaunch claim's delay */
  char run[80];           /* this run's id */
  struct spot_s3_op *get_op, *put_op, *claim_op;
  struct spot_buf body;       /* GET notices/RUN */
  struct spot_buf claim_body; /* GET relaunched/... */
  char put_body[192];         /* PUT notices/RUN: lives until done */
  char claim_mine[64];        /* PUT relaunched/...: lives until done */
  struct spot_notice notice;  /* this node's own notice, to publish */
  int64_t notice_wall_ms;
  bool pending;                /* a notice of this node to publish */
  bool published;              /* its PUT was sent */
  bool warned;                 /* a failed GET was reported once */
  bool exit_check;             /* the trainer failed: the GET decides */
  bool exit_checked;           /* ... and it did: no notice */
  bool peer_lost;              /* the trainer failed after a peer's notice */
  int64_t peer_notice_wall_ms; /* when the peer's notice came, 0 none */
  enum fanout_claim claim_state;
};

/* fanout.c (multi-node, nranks > 1; no-ops on one node) */
void fanout_init(struct spotd *d);
void fanout_close(struct spotd *d);
void fanout_fini(struct spotd *d); /* after the loop ended */
/* The trainer runs: poll the job-wide notice, publish a pending one. */
void fanout_start(struct spotd *d);
/* This node's metadata showed notice n: tell the other ranks. */
void fanout_publish(struct spotd *d, const struct spot_notice *n);
/* The trainer failed while running: true when a GET of the job-wide
 * notice decides first (then spotd_job_notice() or, when there is none,
 * spotd_trainer_exited() again follows). */
bool fanout_exit_check(struct spotd *d);
/* 0: the relaunch marker's PUT runs and relaunch_start() or STOPPING
 * follows; 1: no claim needed (one node), go on. */
int fanout_claim_relaunch(struct spotd *d);
/* The run id the ranks of one run share (--run-id, Slurm, else r<count>). */
const char *fanout_run_id(struct spotd *d);

#endif
