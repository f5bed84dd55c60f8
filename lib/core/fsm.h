/* fsm.h: the one helper every state machine of spotd goes through (the
 * daemon's and lib/io's alike): the states' names, which moves are legal,
 * and one log line per move, with the caller's file and line in debug
 * lines. A machine is a constant description; its state stays a field of
 * its owner, changed only by the owner's setter, which asks
 * spot_fsm_move() and stores the new state when told to:
 *
 *   static const struct spot_fsm restore_fsm = {
 *       "startup", names, RESTORE_STATE_LAST, legal, B(RESTORE_CANCELLED),
 *       SPOT_LOG_DEBUG};
 *   #define set_state(d, s) set_state_at((d), (s), __FILE__, __LINE__)
 *   static bool set_state_at(struct spotd *d, enum restore_state s,
 *                            const char *file, int line) {
 *     int r = spot_fsm_move(&restore_fsm, d->restore.state, s, file, line);
 *     if (r > 0)
 *       d->restore.state = s;
 *     return r >= 0;
 *   }
 *
 * The lint suite's `fsm` check fails a setter (a function whose name ends
 * in set_state or set_state_at) that does not call spot_fsm_move(). */
#ifndef SPOT_FSM_H
#define SPOT_FSM_H

#include <stdbool.h>
#include <stdint.h>

/* Up to 32 states: a legal table holds one bit per state. */
#define SPOT_FSM_MAX_STATES 32
#define SPOT_FSM_BIT(s) (UINT32_C(1) << (unsigned)(s))

struct spot_fsm {
  const char *what;          /* the line's first words: "startup", "lease" */
  const char *const *names;  /* the states' names, indexed by state */
  unsigned n;                /* how many states (<= SPOT_FSM_MAX_STATES) */
  const uint32_t *legal;     /* legal[from]: the states from may move to, one
                                bit each; NULL: every move is legal */
  uint32_t from_any;         /* states every state may move to (closing) */
  int level;                 /* SPOT_LOG_DEBUG or SPOT_LOG_INFO */
};

/* The name of state s of m, "?" when out of range. */
const char *spot_fsm_name(const struct spot_fsm *m, unsigned s);

/* Whether from -> to is a legal move of m (from != to). */
bool spot_fsm_legal(const struct spot_fsm *m, unsigned from, unsigned to);

/* Judges the move from -> to asked at file:line and logs it:
 *   1   a legal move: logged at m->level as "WHAT FROM -> TO", debug lines
 *       ending with " (FILE:LINE)"; the caller stores to;
 *   0   from == to: nothing to do, nothing logged;
 *  -1   refused (out of range or not in the table): logged as an error,
 *       "internal: WHAT FROM -> TO refused (FILE:LINE)"; the caller keeps
 *       its state. */
int spot_fsm_move(const struct spot_fsm *m, unsigned from, unsigned to,
                  const char *file, int line);

/* A move a caller's own rule refuses (beyond the table): logged as
 * "internal: WHAT FROM -> TO refused: WHY (FILE:LINE)"; returns -1. */
int spot_fsm_refuse(const struct spot_fsm *m, unsigned from, unsigned to,
                    const char *file, int line, const char *why);

/* The same with a detail after the move on the line (printf): the
 * checkpoint's name, an op's identity; formatted only when the line is
 * printed. */
int spot_fsm_move_detail(const struct spot_fsm *m, unsigned from,
                         unsigned to, const char *file, int line,
                         const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#endif
