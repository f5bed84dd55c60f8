/* runjoin.c: the run id a multi-node job agrees through the store. */
#ifndef SPOTD_RUNJOIN_H
#define SPOTD_RUNJOIN_H

#include <stdbool.h>
#include <stdint.h>

#include "s3.h"

struct spotd;

/* runjoin.c: the LIST of ROOT/runs/, reduced. */
struct runjoin_scan {
  uint64_t newest;     /* the newest run with a marker, 0 none */
  bool mine_in_newest; /* ... and it has this rank's */
};

struct run_join {
  struct spot_s3_op *op, *del_op;
  struct runjoin_scan scan;
  char *prefix; /* ROOT/runs/ while listing */
  unsigned pages;
  uint64_t run; /* the run joined (or being joined) */
  bool joined;
  char body[64]; /* PUT runs/G/rank-K: lives until done */
};

/* runjoin.c: the run id of a multi-node job outside Slurm. */
bool runjoin_needed(const struct spotd *d);
void runjoin_start(struct spotd *d); /* then restore_joined() */
void runjoin_close(struct spotd *d);
void restore_joined(struct spotd *d, int err);
int runjoin_parse_key(const char *rel, uint64_t *run, unsigned *rank);
void runjoin_decide_init(struct runjoin_scan *s);
void runjoin_decide_add(struct runjoin_scan *s, uint64_t run, unsigned rank,
                        unsigned mine);
uint64_t runjoin_decide(const struct runjoin_scan *s);

#endif
