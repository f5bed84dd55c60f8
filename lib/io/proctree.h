/* The processes of a job as a tree, read from /proc.
 *
 * A launcher may put each worker in a session and process group of its
 * own (torch 2.x's torchrun does), so a job is not a process group: it is
 * every descendant of one root process, in any session. spotd's guard
 * (child.c) is that root and a child subreaper, so an orphan of the job
 * is re-parented to it and stays in the tree.
 *
 * A process is named by its pid and its start time (field 22 of
 * /proc/PID/stat, in clock ticks since boot): a pid that was reused is
 * another process, and spot_proc_kill() never signals it.
 *
 * The parsers take text and do no I/O (unit-tested on fixed strings);
 * the rest reads /proc. */
#ifndef SPOT_PROCTREE_H
#define SPOT_PROCTREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct spot_proc {
  pid_t pid;
  pid_t ppid;
  uint64_t start; /* clock ticks since boot */
  char state;     /* R, S, D, Z, T, ... */
};

/* Hard cap on the processes one scan keeps: the kernel's own limit on
 * pids (PID_MAX_LIMIT, 2^22), so a scan never stops short of a process. */
#define SPOT_PROCTREE_MAX 4194304

/* ------------------------------------------------------------- parsers */

/* One /proc/PID/stat text: "pid (comm) S ppid pgrp session ... start ...".
 * The command name may hold spaces and parentheses: the last ')' ends it.
 * 0, or -EINVAL. */
int spot_proc_parse_stat(const char *text, struct spot_proc *out);
/* The hex mask of one field of a /proc/PID/status text ("SigCgt",
 * "SigIgn", "SigBlk"). Bit N-1 is signal N. 0, or -EINVAL when the field
 * is missing or malformed. */
int spot_proc_parse_sigmask(const char *status, const char *field,
                            uint64_t *mask);
/* The NSpid field of a /proc/PID/status text: the process's pid in the
 * innermost pid namespace it is in (its last number). 0, or -EINVAL. */
int spot_proc_parse_nspid(const char *status, pid_t *inner);
/* Whether mask has signal signum (1..64). */
bool spot_proc_mask_has(uint64_t mask, int signum);
/* Keeps in procs[] only the descendants of root (root excluded), in
 * place, parents before their children; returns how many. A process
 * whose parent started after it is not a child of that parent (its real
 * parent's pid was reused): it is left out. */
size_t spot_proc_descendants(struct spot_proc *procs, size_t n, pid_t root);

/* ------------------------------------------------------------- /proc */

/* Every process on this machine (zombies included), allocated in *out
 * (free() it). 0, or negative errno. */
int spot_proc_scan(struct spot_proc **out, size_t *n);
/* The same of the /proc at proc (tests), keeping at most max processes:
 * -E2BIG when there are more. */
int spot_proc_scan_at(const char *proc, size_t max, struct spot_proc **out,
                      size_t *n);
/* The descendants of root that run (zombies left out), parents first. */
int spot_proc_tree(pid_t root, struct spot_proc **out, size_t *n);
/* The process as /proc says now: 0, -ESRCH when it is gone. */
int spot_proc_read(pid_t pid, struct spot_proc *out);
/* What signum does to p (still the same process). */
enum spot_proc_sig {
  SPOT_PROC_SIG_DEFAULT, /* its default action: it may die of it */
  SPOT_PROC_SIG_IGNORED, /* ignored: harmless; a process in sigwait() or
                          * sigtimedwait() for a signal left ignored shows
                          * so while it waits, and still gets it */
  SPOT_PROC_SIG_CAUGHT,  /* a handler */
  SPOT_PROC_SIG_LAST,
};
/* An enum spot_proc_sig, or negative errno (-ESRCH: gone). */
int spot_proc_sigstate(const struct spot_proc *p, int signum);
/* 1 when p maps the file at the absolute path (a line of
 * /proc/PID/maps ends with it), 0 when not, negative errno. */
int spot_proc_maps_file(const struct spot_proc *p, const char *path);
/* The mapping's identity as /proc/PID/maps writes it, "DEV INODE" (e.g.
 * "08:01 1234"): of this process's mapping that starts at addr into id.
 * The device maps shows is the file's own (on overlayfs the layer's, not
 * what stat() says), so a file is matched by what its own mapping shows.
 * 0, -ENOENT (no mapping there), or negative errno. */
int spot_proc_self_map_id(const void *addr, char *id, size_t n);
/* 1 when p maps a file of that identity, 0 when not, negative errno. */
int spot_proc_maps_id(const struct spot_proc *p, const char *id);
/* Sends signum to p if it is still that process (same start time),
 * through a pidfd so that a pid reused in between is never hit. 0,
 * -ESRCH when it is gone, or negative errno. */
int spot_proc_kill(const struct spot_proc *p, int signum);
/* p's pid in its innermost pid namespace (NSpid), while it is still p.
 * 0, -ESRCH (gone) or negative errno. */
int spot_proc_inner_pid(const struct spot_proc *p, pid_t *inner);
/* Whether /proc is this process's own: the pid namespace that mounted it
 * is ours (a namespace that kept its parent's /proc names other
 * processes under our pids: pids from it and kill() disagree). 0,
 * -EXDEV when it is another namespace's, -ENOENT without /proc. */
int spot_proc_own(void);
/* Sends signum to every running descendant of root; returns how many
 * got it (0 when none runs), or negative errno. */
int spot_proc_kill_tree(pid_t root, int signum);

#endif
