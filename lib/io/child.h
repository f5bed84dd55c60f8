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
 * Exec: in the child, before the command runs: PR_SET_PDEATHSIG(SIGKILL),
 * optionally one signal ignored (an ignored disposition survives exec; a
 * trainer that installs a handler overrides it), every descriptor above 2
 * closed, then execvp. A command that cannot be run exits 127 after one
 * line on stderr.
 *
 * The guard: spotd does not start the command itself. It starts its own
 * binary (/proc/self/exe, SPOT_CHILD_SHIM_ARG first: main() hands it to
 * spot_child_shim_main()) in a session of its own, and that process, the
 * guard, starts the command in another session of its own (so the
 * command's pid is its session and process group id, as a command spotd
 * started itself would be) and reports the command's pid on a pipe. The guard
 * is a child subreaper: whatever the command starts, in whatever session or
 * process group (torch 2.x's torchrun gives each worker its own), stays a
 * descendant of the guard, orphans included. So the job is the guard's process
 * tree (proctree.h).
 *
 * Contained (the usual case): the guard first unshares a pid namespace
 * (inside a user namespace of its own when unprivileged) and its one child
 * is that namespace's init, which starts the command and reaps; the tree
 * is then the init's descendants, and the kernel ends all of it when the
 * init ends, which it does with the guard (PR_SET_PDEATHSIG), even when
 * spotd and the guard are SIGKILLed together. The trainer sees the
 * namespace's pids and a /proc of its own; spotd names the machine's.
 * spotd reports the exit only once the init has ended. Without
 * namespaces, the guard and spotd are child subreapers: a killed guard's
 * orphans come back to spotd, which kills them before it reports the
 * exit; spotd and the guard killed together let them escape.
 *  - spotd signals and stops the tree, never a process outside it;
 *  - when spotd dies (even by SIGKILL) the guard SIGKILLs the tree;
 *  - the job lease's local deadline passed (spot_child_set_deadline):
 *    the guard stops the tree itself (SIGSTOP), spotd's loop may be
 *    stopped;
 *  - when the command exits, the guard stops what it left (SIGTERM, then
 *    SIGKILL after the grace) and then exits the way the command did (its
 *    status, or its signal), which is what spotd's exit callback sees.
 * The guard blocks every signal.
 *
 * struct spot_child (libuv): one guard and its tree, stopped with SIGTERM
 * to every process of the tree then SIGKILL after a grace. After
 * spot_child_close() no callback runs. States: IDLE -> RUNNING ->
 * (STOPPING) -> EXITED, any -> CLOSED. */
#ifndef SPOT_CHILD_H
#define SPOT_CHILD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "io/proctree.h"

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
};

/* In a forked child: never returns (exit 127 when the command cannot be
 * run). envp NULL keeps environ. */
__attribute__((noreturn)) void spot_child_exec(char *const argv[],
                                               char *const envp[],
                                               const struct spot_child_exec *x);
/* What the guard reports to spotd on fd 3 once the command runs (the
 * wire between guard.c and child.c: one write, one read). */
struct spot_guard_report {
  pid_t cmd;     /* the command, as spotd sees it */
  pid_t reaper;  /* the parent of the command: the init, or the guard */
  int contained; /* enum spot_child_contain */
};

/* Closes every descriptor from lowfd up (close_range, else one by one). */
void spot_child_close_from(int lowfd);
/* main() of the guard (guard.c): argv[1] is SPOT_CHILD_SHIM_ARG. Never
 * returns. */
__attribute__((noreturn)) void spot_child_shim_main(int argc, char **argv);

/* ---------------------------------------------------------- spot_child */

enum spot_child_state {
  SPOT_CHILD_IDLE,
  SPOT_CHILD_RUNNING,
  SPOT_CHILD_STOPPING, /* SIGTERM sent, SIGKILL on the timer */
  SPOT_CHILD_EXITED,
  SPOT_CHILD_CLOSED,
  SPOT_CHILD_STATE_LAST,
};

/* How the tree is kept together (the guard says, at each start). */
enum spot_child_contain {
  SPOT_CHILD_CONTAIN_NONE,   /* the guard and spotd as subreapers only */
  SPOT_CHILD_CONTAIN_PIDNS,  /* a pid namespace of its own */
  SPOT_CHILD_CONTAIN_USERNS, /* the same, in a user namespace (unprivileged) */
};

struct spot_child;
typedef void (*spot_child_exit_cb)(struct spot_child *c, void *data);

struct spot_child_options {
  const char *name;  /* for log lines: "trainer", "relaunch step" */
  char *const *argv; /* argv[0] is looked up in PATH */
  char *const *env;  /* built with spot_env */
  int ignore_signal; /* start with this signal ignored (0: none) */
  uint64_t grace_ms; /* what the command left at its exit: TERM..KILL */
  int hold_fd;       /* > 0: the guard keeps it open (a lock) till it ends */
  spot_child_exit_cb exit_cb;
  void *data;
};

struct spot_child {
  uv_loop_t *loop;
  uv_process_t proc;
  uv_timer_t timer; /* SIGKILL after the grace */
  enum spot_child_state state;
  char name[32];
  pid_t pid;        /* the command's (it leads its own session and group) */
  pid_t guard_pid;  /* the guard's */
  pid_t reaper_pid; /* the command's parent: the init of the tree's pid
                     * namespace, or the guard; the tree is its descendants */
  enum spot_child_contain contained;
  int init_fd; /* a pidfd of the init, until it ended */
  uint64_t start_ms;
  int64_t exit_status; /* the command's */
  int term_signal;
  bool proc_open;
  int deadline_fd;      /* the guard's deadline pipe (write end) */
  uint64_t deadline_ms; /* the last one handed over; 0: none */
  uint64_t orphans_since_ms;
  spot_child_exit_cb exit_cb;
  void *data;
};

const char *spot_child_state_name(enum spot_child_state s);
int spot_child_init(struct spot_child *c, uv_loop_t *loop);
/* 0, or negative errno (logged) when it could not be started. */
int spot_child_spawn(struct spot_child *c, const struct spot_child_options *o);
/* The job lease's local deadline (monotonic ms, 0: none), now and for
 * every guard spawned after: the guard stops the tree itself once it
 * passes unless a later one came (spotd's loop may be stopped). */
void spot_child_set_deadline(struct spot_child *c, uint64_t deadline_mono_ms);
/* Whether a trainer's tree can get a pid namespace of its own here (tried
 * in a child process, as the guard does): spotd says so at its start. */
enum spot_child_contain spot_child_contain_probe(void);
/* signum to every process of the tree (the guard left out): how many got
 * it, or -ESRCH when the child does not run. */
int spot_child_kill(struct spot_child *c, int signum);
/* The running processes of the tree, parents first (free() *out). */
int spot_child_tree(const struct spot_child *c, struct spot_proc **out,
                    size_t *n);
/* Whether p of such a list is the command itself. */
bool spot_child_is_leader(const struct spot_child *c,
                          const struct spot_proc *p);
/* SIGTERM to the tree, SIGKILL grace_ms later. */
void spot_child_stop(struct spot_child *c, uint64_t grace_ms);
/* SIGKILL to what runs, no callback any more, handles closed. */
void spot_child_close(struct spot_child *c);
/* The guard (so the command or what it started) still runs. */
bool spot_child_running(const struct spot_child *c);
/* The command's status: exit status, or 128 + signal. */
int spot_child_status(const struct spot_child *c);

#endif
