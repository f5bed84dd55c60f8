/* relaunch.c: the relaunch step (enum relaunch_state, its own timer). */
#ifndef SPOTD_RELAUNCH_H
#define SPOTD_RELAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "io/child.h"
#include "core/notice.h"
#include "core/proto.h"

struct spotd;

enum relaunch_state {
  RELAUNCH_IDLE,
  RELAUNCH_RUNNING,
  RELAUNCH_SUCCEEDED,
  RELAUNCH_FAILED,
  RELAUNCH_CANCELLED,
  RELAUNCH_STATE_LAST,
};

struct relaunch_attempt {
  int64_t wall_ms;
  char reason[SPOT_NOTICE_REASON_MAX];
  int exit_status;
  bool ok;
};

struct relaunch_step {
  enum relaunch_state state;
  struct spot_child child;
  uv_timer_t timer; /* its own time limit */
  struct relaunch_attempt attempts[SPOT_PROTO_MAX_RELAUNCH];
  size_t n;
};

/* 0 when the step runs (spotd_relaunch_done() follows), <0 otherwise. */
int relaunch_start(struct spotd *d);
void relaunch_close(struct spotd *d);
const char *relaunch_state_name(enum relaunch_state s);

#endif
