/* runjoin.c: the run id a multi-node job agrees through the store. */
#ifndef SPOTD_RUNJOIN_H
#define SPOTD_RUNJOIN_H

#include <stdbool.h>
#include <stdint.h>

#include "io/s3.h"

struct spotd;

/* The objects under ROOT/runs/G/. */
enum runjoin_mark {
  RUNJOIN_RANK, /* rank-K: rank K joined run G */
  RUNJOIN_LEFT, /* left-K: rank K's spotd left run G (any other exit) */
  RUNJOIN_OVER, /* over: a rank ended run G as a preemption (75, 76) */
  RUNJOIN_MARK_LAST
};

/* runjoin.c: the LIST of ROOT/runs/, reduced to its newest run. */
struct runjoin_scan {
  uint64_t newest;     /* the newest run with a marker, 0 none */
  bool mine_in_newest; /* ... and it has this rank's rank-K */
  bool mine_left;      /* ... and this rank's left-K */
  bool over;           /* ... and it is over */
  unsigned peers;      /* rank-J of other ranks in it */
  unsigned peers_left; /* left-J of other ranks in it */
};

enum runjoin_state {
  RUNJOIN_IDLE,
  RUNJOIN_LISTING,  /* LIST ROOT/runs/ */
  RUNJOIN_CLEARING, /* rejoining: DELETE our left-K of the run first */
  RUNJOIN_PUTTING,  /* PUT runs/G/rank-K */
  RUNJOIN_JOINED,
  RUNJOIN_LEAVING, /* closing: PUT runs/G/left-K or runs/G/over */
  RUNJOIN_LEFT_RUN,
  RUNJOIN_FAILED,
  RUNJOIN_STATE_LAST
};

struct run_join {
  enum runjoin_state state;
  struct spot_s3_op *op, *del_op;
  struct runjoin_scan scan;
  char *prefix; /* ROOT/runs/ while listing */
  unsigned pages;
  uint64_t run; /* the run joined (or being joined) */
  bool joined;
  char body[96]; /* the PUT's body: lives until its callback */
};

/* runjoin.c: the run id of a multi-node job outside Slurm. */
bool runjoin_needed(const struct spotd *d);
void runjoin_start(struct spotd *d); /* then restore_joined() */
/* Closing: cancels a join in progress; a rank that joined marks that it
 * left the run (the loop runs until that PUT ends). */
void runjoin_close(struct spotd *d);
int runjoin_parse_key(const char *rel, uint64_t *run, unsigned *rank,
                      enum runjoin_mark *mark);
void runjoin_decide_init(struct runjoin_scan *s);
void runjoin_decide_add(struct runjoin_scan *s, uint64_t run,
                        enum runjoin_mark mark, unsigned rank, unsigned mine);
uint64_t runjoin_decide(const struct runjoin_scan *s);

#endif
