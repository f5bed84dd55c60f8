/* spotctl: one file per command group, one table in main.c. */
#ifndef SPOTCTL_H
#define SPOTCTL_H

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
int spotctl_cmd_emulate(int argc, char **argv);    /* emulate.c */
int spotctl_cmd_status(int argc, char **argv);     /* ctl_cmds.c */
int spotctl_cmd_checkpoint(int argc, char **argv); /* ctl_cmds.c */
int spotctl_cmd_done(int argc, char **argv);       /* ctl_cmds.c */
int spotctl_cmd_push(int argc, char **argv);       /* store_cmds.c */
int spotctl_cmd_list(int argc, char **argv);       /* store_cmds.c */
int spotctl_cmd_restore(int argc, char **argv);    /* store_cmds.c */
int spotctl_cmd_relaunch(int argc, char **argv);   /* relaunch.c */
int spotctl_cmd_lease(int argc, char **argv);      /* lease_cmds.c */

#endif
