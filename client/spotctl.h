/* spotctl: one file per command group, one table in main.c. */
#ifndef SPOTCTL_H
#define SPOTCTL_H

#include <stddef.h>

struct spotctl_cmd {
  const char *name;
  const char *args;    /* synopsis after the name */
  const char *summary; /* one line for `spotctl --help` */
  /* argv[0] is the command name. Returns the process exit status. */
  int (*run)(int argc, char **argv);
};

/* Exit statuses shared by all commands. */
enum {
  SPOTCTL_EXIT_OK = 0,
  SPOTCTL_EXIT_FAIL = 1,  /* the operation failed */
  SPOTCTL_EXIT_USAGE = 2, /* bad command line */
};

/* Prints "spotctl: " + message + newline on stderr, returns
 * SPOTCTL_EXIT_FAIL. */
int spotctl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int spotctl_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int spotctl_cmd_emulate(int argc, char **argv);       /* emulate.c */
int spotctl_cmd_status(int argc, char **argv);        /* ctl_cmds.c */
int spotctl_cmd_checkpoint(int argc, char **argv);    /* ctl_cmds.c */
int spotctl_cmd_done(int argc, char **argv);          /* ctl_cmds.c */
int spotctl_cmd_metrics(int argc, char **argv);       /* ctl_cmds.c */
int spotctl_cmd_push(int argc, char **argv);          /* store_cmds.c */
int spotctl_cmd_list(int argc, char **argv);          /* store_cmds.c */
int spotctl_cmd_restore(int argc, char **argv);       /* store_cmds.c */
int spotctl_cmd_relaunch(int argc, char **argv);      /* relaunch.c */
int spotctl_cmd_history(int argc, char **argv);       /* history_cmds.c */
int spotctl_cmd_history_event(int argc, char **argv); /* history_cmds.c */
int spotctl_cmd_lease(int argc, char **argv);         /* lease_cmds.c */

/* history_plot.c: the timeline of a job into a .png or .svg file. Returns
 * 0 or negative errno with one line in err. Each run is drawn as one
 * solid block of this colour (tests count them). */
#define SPOTCTL_PLOT_RUN_R 47
#define SPOTCTL_PLOT_RUN_G 111
#define SPOTCTL_PLOT_RUN_B 189
struct spot_hist_summary;
/* history_cmds.c: "3h05m", "6m55s", "12.5s"; "-" when ms < 0. */
const char *spotctl_fmt_dur(long long ms, char *buf, size_t size);
int spotctl_history_plot(const char *path, const char *job,
                         const struct spot_hist_summary *s, char *err,
                         size_t errsize);

#endif
