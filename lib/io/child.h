/* Child processes: the one way spotd (the trainer, the relaunch step) and
 * `spotctl relaunch --backend exec` start a command.
 *
 * Environment: one builder. A child gets spotd's environment minus the
 * service manager's variables (NOTIFY_SOCKET, WATCHDOG_*, LISTEN_*,
 * INVOCATION_ID, CREDENTIALS_DIRECTORY, ...) and (for spotd's children)
 * minus every inherited SPOTD_*; the caller then adds its own SPOTD_*
 * variables. The user's own
 * variables (AWS_* included) stay; credentials spotd fetched itself (IMDS
 * role, LoadCredential=) are never put in any environment.
 *
 * Exec: in the child, before the command runs: PR_SET_PDEATHSIG(SIGKILL)
 * (nothing outlives its parent), optionally one signal ignored (an ignored
 * disposition survives exec; a trainer that installs a handler overrides
 * it), every descriptor above 2 closed, then execvp. A command that cannot
 * be run exits 127 after one line on stderr. libuv's uv_spawn resets every
 * signal disposition in the child, so spotd spawns through a shim: its own
 * binary (/proc/self/exe) with SPOT_CHILD_SHIM_ARG as first argument, whose
 * main() calls spot_child_shim_main() first thing.
 *
 * struct spot_child (libuv): spawned in its own session, signalled as a
 * process group, stopped with SIGTERM then SIGKILL after a grace. When the
 * leader exits, whatever is left of its process group is stopped the same
 * way before the exit callback runs. After spot_child_close() no callback
 * runs. States: IDLE -> RUNNING -> (STOPPING) -> REAPING -> EXITED, any ->
 * CLOSED. */
#ifndef SPOT_CHILD_H
#define SPOT_CHILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#define SPOT_CHILD_SHIM_ARG "--spot-exec-shim--"

/* ---------------------------------------------------------- environment */

struct spot_env {
  char **v; /* NULL-terminated, owned */
  size_t n, cap;
};

/* True for an environment entry ("NAME=value") a child never inherits:
 * the service manager's. */
bool spot_env_private(const char *entry);
/* environ minus the private entries, and minus SPOTD_* unless keep_spotd
 * (`spotctl relaunch` passes those it got on to its command). */
int spot_env_init(struct spot_env *e, bool keep_spotd);
/* Adds NAME=value (formatted), replacing an entry of that name. */
int spot_env_set(struct spot_env *e, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void spot_env_fini(struct spot_env *e);

/* ----------------------------------------------------------------- exec */

struct spot_child_exec {
  pid_t parent;      /* the process that forked: checked after PDEATHSIG */
  int pdeath_signal; /* 0: none */
  int ignore_signal; /* 0: none */
  bool guard;        /* a watcher that kills the group if parent dies */
};

/* In a forked child: never returns (exit 127 when the command cannot be
 * run). envp NULL keeps environ. */
__attribute__((noreturn)) void spot_child_exec(char *const argv[],
                                               char *const envp[],
                                               const struct spot_child_exec *x);
/* main() of the shim: argv[1] is SPOT_CHILD_SHIM_ARG. Never returns. */
__attribute__((noreturn)) void spot_child_shim_main(int argc, char **argv);

/* True while a process of group pgid runs (zombies do not count). */
bool spot_child_group_alive(pid_t pgid);

/* ---------------------------------------------------------- spot_child */

enum spot_child_state {
  SPOT_CHILD_IDLE,
  SPOT_CHILD_RUNNING,
  SPOT_CHILD_STOPPING, /* SIGTERM sent, SIGKILL on the timer */
  SPOT_CHILD_REAPING,  /* the leader exited; its group is being stopped */
  SPOT_CHILD_EXITED,
  SPOT_CHILD_CLOSED,
  SPOT_CHILD_STATE_LAST,
};

struct spot_child;
typedef void (*spot_child_exit_cb)(struct spot_child *c, void *data);

struct spot_child_options {
  const char *name;  /* for log lines: "trainer", "relaunch step" */
  char *const *argv; /* argv[0] is looked up in PATH */
  char *const *env;  /* built with spot_env */
  int ignore_signal; /* start with this signal ignored (0: none) */
  uint64_t grace_ms; /* group left after the leader: TERM..KILL */
  spot_child_exit_cb exit_cb;
  void *data;
};

struct spot_child {
  uv_loop_t *loop;
  uv_process_t proc;
  uv_timer_t timer; /* SIGKILL after the grace; group polling */
  enum spot_child_state state;
  char name[32];
  pid_t pid;
  uint64_t start_ms;
  int64_t exit_status; /* the leader's */
  int term_signal;
  uint64_t grace_ms, reap_start_ms;
  bool group_term_sent, group_kill_sent;
  bool proc_open;
  spot_child_exit_cb exit_cb;
  void *data;
};

const char *spot_child_state_name(enum spot_child_state s);
int spot_child_init(struct spot_child *c, uv_loop_t *loop);
/* 0, or negative errno (logged) when it could not be started. */
int spot_child_spawn(struct spot_child *c, const struct spot_child_options *o);
/* To the group (or the leader only); -ESRCH when nothing runs. */
int spot_child_signal(struct spot_child *c, int signum, bool group);
/* SIGTERM to the group, SIGKILL grace_ms later. */
void spot_child_stop(struct spot_child *c, uint64_t grace_ms);
/* SIGKILL to what runs, no callback any more, handles closed. */
void spot_child_close(struct spot_child *c);
/* The leader or its group still runs. */
bool spot_child_running(const struct spot_child *c);
/* The leader's status: exit status, or 128 + signal. */
int spot_child_status(const struct spot_child *c);

#endif
